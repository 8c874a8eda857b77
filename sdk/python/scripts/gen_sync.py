#!/usr/bin/env python3
"""Writes the synchronous client, ``space_sdk/client.py``, from the asynchronous one,
``space_sdk/aio.py``, which is the only one edited by hand.

The rewrite is mechanical: ``async def`` becomes ``def``, ``await`` and the ``async`` of
``async with`` / ``async for`` go, the asynchronous names become their synchronous ones
(``AsyncSpace`` -> ``Space``, ``__aenter__`` -> ``__enter__``, ``aiter_bytes`` ->
``iter_bytes``, ``asyncio.sleep`` -> ``time.sleep``, ...; see ``RENAMES``). The few places
that really differ are marked in ``aio.py`` with comment lines::

    # [async]
    code only the asynchronous client has
    # [sync]
    # code only the synchronous client has, commented out
    # [end]

Lines between ``# [async]`` and ``# [sync]`` (or ``# [end]``) are dropped; lines between
``# [sync]`` and ``# [end]`` lose their first ``# `` and are kept as they are (no rename
applies to them). The markers must stand alone on their line, indented like the code.

Usage, from ``sdk/python``::

    python scripts/gen_sync.py           # rewrites space_sdk/client.py
    python scripts/gen_sync.py --check   # exits 1 if client.py is not what it would write
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "space_sdk" / "aio.py"
TARGET = ROOT / "space_sdk" / "client.py"

HEADER = (
    "# Generated from space_sdk/aio.py by scripts/gen_sync.py: do not edit by hand.\n"
    "# Change aio.py, then run `python scripts/gen_sync.py` in sdk/python.\n"
)

# Applied in order, to every line outside the [sync] blocks.
RENAMES: list[tuple[str, str]] = [
    (r"\basync def\b", "def"),
    (r"\basync with\b", "with"),
    (r"\basync for\b", "for"),
    (r"\bawait ", ""),
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"\b__aiter__\b", "__iter__"),
    (r"\b__anext__\b", "__next__"),
    (r"\bStopAsyncIteration\b", "StopIteration"),
    (r"\bAsyncIterator\b", "Iterator"),
    (r"\bAsyncIterable\b", "Iterable"),
    (r"\baclose\b", "close"),
    (r"\baiter_bytes\b", "iter_bytes"),
    (r"\baiter_lines\b", "iter_lines"),
    (r"\baread\b", "read"),
    (r"\basyncio\.sleep\b", "time.sleep"),
    (r"\bdefault_async_client\b", "default_client"),
    # AsyncSpace -> Space, AsyncSandbox -> Sandbox, httpx.AsyncClient -> httpx.Client, ...
    (r"\bAsync([A-Z]\w*)", r"\1"),
]

_COMPILED = [(re.compile(pattern), repl) for pattern, repl in RENAMES]
_MARKER = re.compile(r"^\s*# \[(async|sync|end)\]\s*$")
_COMMENTED = re.compile(r"^(\s*)# ?")


class MarkerError(ValueError):
    """The markers of the source are not balanced."""


def rename(line: str) -> str:
    """One line of the asynchronous client as the synchronous one has it."""
    for pattern, repl in _COMPILED:
        line = pattern.sub(repl, line)
    return line


def generate(source: str) -> str:
    """The synchronous module for the text of the asynchronous one."""
    out: list[str] = []
    block: str | None = None  # None, "async" or "sync"
    for number, line in enumerate(source.splitlines(), start=1):
        marker = _MARKER.match(line)
        if marker:
            kind = marker.group(1)
            if kind == "async" and block is None:
                block = "async"
            elif kind == "sync" and block == "async":
                block = "sync"
            elif kind == "end" and block is not None:
                block = None
            else:
                raise MarkerError(f"aio.py:{number}: '# [{kind}]' where it does not belong")
            continue
        if block == "async":
            continue
        if block == "sync":
            if line.strip() and not _COMMENTED.match(line):
                raise MarkerError(f"aio.py:{number}: a [sync] line that is not a comment")
            out.append(_COMMENTED.sub(r"\1", line, count=1).rstrip())
            continue
        out.append(rename(line).rstrip())
    if block is not None:
        raise MarkerError(f"aio.py: a '# [{block}]' block is not closed by '# [end]'")
    return HEADER + "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--check", action="store_true", help="only check that client.py is up to date"
    )
    args = parser.parse_args(argv)
    wanted = generate(SOURCE.read_text(encoding="utf-8"))
    if args.check:
        current = TARGET.read_text(encoding="utf-8") if TARGET.exists() else ""
        if current != wanted:
            print(
                f"{TARGET} is not what scripts/gen_sync.py makes of {SOURCE.name}: "
                "run python scripts/gen_sync.py",
                file=sys.stderr,
            )
            return 1
        return 0
    TARGET.write_text(wanted, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
