"""The synchronous client is generated from the asynchronous one (no server needed)."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

import space_sdk
from space_sdk import aio, client

SDK = Path(__file__).resolve().parent.parent


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_sync", SDK / "scripts" / "gen_sync.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_sync"] = module
    spec.loader.exec_module(module)
    return module


gen_sync = _script()


def test_client_py_is_what_the_script_makes_of_aio_py() -> None:
    wanted = gen_sync.generate((SDK / "space_sdk" / "aio.py").read_text(encoding="utf-8"))
    current = (SDK / "space_sdk" / "client.py").read_text(encoding="utf-8")
    assert current == wanted, (
        "space_sdk/client.py is out of date: run `python scripts/gen_sync.py` in sdk/python"
    )
    assert gen_sync.main(["--check"]) == 0


def test_generated_file_says_so() -> None:
    head = (SDK / "space_sdk" / "client.py").read_text(encoding="utf-8").splitlines()[:2]
    assert "Generated from space_sdk/aio.py by scripts/gen_sync.py" in head[0]
    assert "do not edit" in head[0]


def test_the_rewrite() -> None:
    src = (
        "# [async]\n"
        '"""Async."""\n'
        "# [sync]\n"
        '# """Sync."""\n'
        "# [end]\n"
        "class AsyncThing:\n"
        "    async def __aenter__(self) -> AsyncThing:\n"
        "        await asyncio.sleep(1)\n"
        "        async with x as y:\n"
        "            async for z in resp.aiter_bytes():\n"
        "                await resp.aclose()\n"
        "        # [async]\n"
        "        only_async()\n"
        "        # [sync]\n"
        "        # if only_sync:\n"
        "        #     go()\n"
        "        # [end]\n"
        "        raise StopAsyncIteration\n"
    )
    out = gen_sync.generate(src).split("\n", 2)[2]
    assert out == (
        '"""Sync."""\n'
        "class Thing:\n"
        "    def __enter__(self) -> Thing:\n"
        "        time.sleep(1)\n"
        "        with x as y:\n"
        "            for z in resp.iter_bytes():\n"
        "                resp.close()\n"
        "        if only_sync:\n"
        "            go()\n"
        "        raise StopIteration\n"
    )


@pytest.mark.parametrize(
    "src",
    [
        "# [sync]\n# x\n# [end]\n# [end]\n",
        "# [async]\nx\n",
        "# [async]\n# [sync]\nnot_a_comment()\n# [end]\n",
        "# [end]\n",
    ],
)
def test_unbalanced_markers_are_refused(src: str) -> None:
    with pytest.raises(gen_sync.MarkerError):
        gen_sync.generate(src)


_DUNDERS = ("__enter__", "__exit__", "__iter__", "__next__")


def _calls(cls: type) -> dict[str, object]:
    """The public calls of a class (and the protocol methods), by their synchronous name."""
    out = {}
    for name, member in inspect.getmembers(cls):
        sync_name = gen_sync.rename(name)
        if callable(member) and (not name.startswith("_") or sync_name in _DUNDERS):
            out[sync_name] = member
    return out


@pytest.mark.parametrize(
    ("sync_cls", "async_cls"),
    [
        (client.Space, aio.AsyncSpace),
        (client.Sandbox, aio.AsyncSandbox),
        (client.Files, aio.AsyncFiles),
        (client.Watch, aio.AsyncWatch),
    ],
)
def test_both_clients_have_the_same_calls(sync_cls: type, async_cls: type) -> None:
    sync_calls = _calls(sync_cls)
    async_calls = _calls(async_cls)
    assert set(sync_calls) == set(async_calls)
    for name, member in sync_calls.items():
        other = async_calls[name]
        assert list(inspect.signature(member).parameters) == list(  # type: ignore[arg-type]
            inspect.signature(other).parameters  # type: ignore[arg-type]
        ), name
        assert not inspect.iscoroutinefunction(member), name
    # What does I/O is a coroutine in the asynchronous client.
    for name in ("request", "health", "secrets", "create", "exec", "expose", "proxy", "read"):
        if name in async_calls:
            assert inspect.iscoroutinefunction(async_calls[name]), name


def test_the_package_exports_both() -> None:
    for name in ("Space", "Sandbox", "Files", "Watch"):
        assert getattr(space_sdk, name).__module__ == "space_sdk.client"
        assert getattr(space_sdk, "Async" + name).__module__ == "space_sdk.aio"


def _models_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_models", SDK / "scripts" / "gen_models.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_models"] = module
    spec.loader.exec_module(module)
    return module


def test_models_py_fields_are_what_the_script_makes_of_the_document() -> None:
    gen_models = _models_script()
    doc = json.loads(gen_models.DOCUMENT.read_text(encoding="utf-8"))
    current = (SDK / "space_sdk" / "models.py").read_text(encoding="utf-8")
    assert current == gen_models.generate(current, doc), (
        "space_sdk/models.py is out of date with crates/space-control/openapi.json: run "
        "`python scripts/gen_models.py` in sdk/python"
    )
    # Every record's fields are generated.
    assert current.count(gen_models.BEGIN) == len(gen_models.Records(ast.parse(current)).by_schema)
