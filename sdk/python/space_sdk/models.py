"""Typed records for what the API returns.

Each ``from_json`` checks the types of the fields it reads and raises
:class:`~space_sdk.errors.InvalidResponse` when the server's answer does not fit; fields this
version does not know are ignored, so a newer server stays readable.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar

from .errors import InvalidResponse

__all__ = [
    "AuditEvent",
    "DirEntry",
    "ExecResult",
    "FileStat",
    "ForkedFrom",
    "SandboxInfo",
    "Snapshot",
    "Template",
    "Timeouts",
]

T = TypeVar("T")


def _obj(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidResponse(f"{what}: expected a JSON object, got {type(value).__name__}")
    return value


def _get(d: dict[str, Any], key: str, typ: type[T] | tuple[type, ...], what: str) -> T:
    if key not in d:
        raise InvalidResponse(f"{what}: field {key!r} is missing")
    value = d[key]
    # bool is an int in Python; a JSON true is never a valid number here.
    if isinstance(value, bool) and typ in (int, float, (int, float)):
        raise InvalidResponse(f"{what}: field {key!r} should be a number, got a boolean")
    if not isinstance(value, typ):
        raise InvalidResponse(f"{what}: field {key!r} has the wrong type ({type(value).__name__})")
    return value  # type: ignore[return-value]


def _opt(d: dict[str, Any], key: str, typ: type[T] | tuple[type, ...], what: str) -> T | None:
    if d.get(key) is None:
        return None
    return _get(d, key, typ, what)


def _str_map(d: dict[str, Any], key: str, what: str) -> dict[str, str]:
    value = d.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise InvalidResponse(f"{what}: field {key!r} should map strings to strings")
    return dict(value)


@dataclass(frozen=True)
class Timeouts:
    """A sandbox's timeouts. ``None`` means never."""

    idle_ms: int | None
    max_lifetime_ms: int | None
    action: str

    @classmethod
    def from_json(cls, value: Any) -> Timeouts:
        """Reads the ``timeouts`` object of a sandbox."""
        d = _obj(value, "timeouts")
        return cls(
            idle_ms=_opt(d, "idle_ms", int, "timeouts"),
            max_lifetime_ms=_opt(d, "max_lifetime_ms", int, "timeouts"),
            action=_opt(d, "action", str, "timeouts") or "suspend",
        )


@dataclass(frozen=True)
class ForkedFrom:
    """Where a forked sandbox came from: the parent and the snapshot the fork was made from."""

    sandbox: str
    snapshot: str

    @classmethod
    def from_json(cls, value: Any) -> ForkedFrom:
        """Reads the ``forked_from`` object of a sandbox."""
        d = _obj(value, "forked_from")
        return cls(
            sandbox=_get(d, "sandbox", str, "forked_from"),
            snapshot=_get(d, "snapshot", str, "forked_from"),
        )


@dataclass(frozen=True)
class SandboxInfo:
    """A sandbox as the API describes it at one moment."""

    id: str
    tenant: str
    template: str
    template_version: str
    state: str
    vcpus: int
    memory_mib: int
    disk_mib: int
    env: dict[str, str]
    metadata: dict[str, str]
    timeouts: Timeouts
    forked_from: ForkedFrom | None
    failure: Any
    created_unix_ms: int
    state_since_unix_ms: int
    last_activity_unix_ms: int

    @classmethod
    def from_json(cls, value: Any) -> SandboxInfo:
        """Reads a ``Sandbox`` object."""
        d = _obj(value, "sandbox")
        w = "sandbox"
        forked = d.get("forked_from")
        return cls(
            id=_get(d, "id", str, w),
            tenant=_get(d, "tenant", str, w),
            template=_get(d, "template", str, w),
            template_version=str(_get(d, "template_version", (str, int), w)),
            state=_get(d, "state", str, w),
            vcpus=_get(d, "vcpus", int, w),
            memory_mib=_get(d, "memory_mib", int, w),
            disk_mib=_get(d, "disk_mib", int, w),
            env=_str_map(d, "env", w),
            metadata=_str_map(d, "metadata", w),
            timeouts=Timeouts.from_json(d.get("timeouts") or {}),
            forked_from=ForkedFrom.from_json(forked) if forked is not None else None,
            failure=d.get("failure"),
            created_unix_ms=_get(d, "created_unix_ms", int, w),
            state_since_unix_ms=_opt(d, "state_since_unix_ms", int, w) or 0,
            last_activity_unix_ms=_opt(d, "last_activity_unix_ms", int, w) or 0,
        )


@dataclass(frozen=True)
class Snapshot:
    """A snapshot of a sandbox: ``kind`` is ``disk`` or ``full``."""

    id: str
    kind: str
    reason: str
    created_unix_ms: int
    size_bytes: int
    paused_for_us: int | None

    @classmethod
    def from_json(cls, value: Any) -> Snapshot:
        """Reads a ``Snapshot`` object."""
        d = _obj(value, "snapshot")
        w = "snapshot"
        return cls(
            id=_get(d, "id", str, w),
            kind=_get(d, "kind", str, w),
            reason=_opt(d, "reason", str, w) or "",
            created_unix_ms=_get(d, "created_unix_ms", int, w),
            size_bytes=_opt(d, "size_bytes", int, w) or 0,
            paused_for_us=_opt(d, "paused_for_us", int, w),
        )


@dataclass(frozen=True)
class FileStat:
    """What ``lstat`` says about a path in the guest. ``file_type`` is ``file``, ``dir``,
    ``symlink`` or ``other``."""

    path: str
    file_type: str
    size: int
    mode: int
    uid: int
    gid: int
    mtime_unix_ns: int
    symlink_target: str | None

    @property
    def is_dir(self) -> bool:
        """Whether the path is a directory."""
        return self.file_type == "dir"

    @property
    def is_file(self) -> bool:
        """Whether the path is a regular file."""
        return self.file_type == "file"

    @classmethod
    def from_json(cls, value: Any) -> FileStat:
        """Reads a ``FileStat`` object."""
        d = _obj(value, "file stat")
        w = "file stat"
        return cls(
            path=_get(d, "path", str, w),
            file_type=_get(d, "file_type", str, w),
            size=_get(d, "size", int, w),
            mode=_get(d, "mode", int, w),
            uid=_opt(d, "uid", int, w) or 0,
            gid=_opt(d, "gid", int, w) or 0,
            mtime_unix_ns=_opt(d, "mtime_unix_ns", int, w) or 0,
            symlink_target=_opt(d, "symlink_target", str, w),
        )


@dataclass(frozen=True)
class DirEntry:
    """One entry of a directory listing."""

    name: str
    stat: FileStat

    @classmethod
    def from_json(cls, value: Any) -> DirEntry:
        """Reads a ``DirEntry`` object."""
        d = _obj(value, "directory entry")
        return cls(
            name=_get(d, "name", str, "directory entry"),
            stat=FileStat.from_json(d.get("stat")),
        )


@dataclass(frozen=True)
class AuditEvent:
    """One audit record: who did what to which sandbox, and how it ended (``result`` is
    ``ok`` or the error code)."""

    id: int
    at_unix_ms: int
    tenant: str | None
    key_id: str | None
    sandbox: str | None
    operation: str
    result: str
    detail: Any

    @classmethod
    def from_json(cls, value: Any) -> AuditEvent:
        """Reads an audit ``Event`` object."""
        d = _obj(value, "audit event")
        w = "audit event"
        return cls(
            id=_get(d, "id", int, w),
            at_unix_ms=_get(d, "at_unix_ms", int, w),
            tenant=_opt(d, "tenant", str, w),
            key_id=_opt(d, "key_id", str, w),
            sandbox=_opt(d, "sandbox", str, w),
            operation=_get(d, "operation", str, w),
            result=_get(d, "result", str, w),
            detail=d.get("detail"),
        )


@dataclass(frozen=True)
class Template:
    """A built template sandboxes are created from."""

    name: str
    version: str
    vcpus: int
    memory_mib: int
    image_mib: int
    image: str
    created_unix_ms: int
    #: Where its root image came from (a stock image, an image reference, a Dockerfile, a
    #: sandbox).
    source: str = ""
    #: The tenant a private template belongs to; ``None`` for public ones.
    owner: str | None = None
    #: Environment, user and working directory its sandboxes' commands start with.
    env: dict[str, str] = field(default_factory=dict)
    user: str | None = None
    workdir: str | None = None

    @classmethod
    def from_json(cls, value: Any) -> Template:
        """Reads a ``Template`` object."""
        d = _obj(value, "template")
        w = "template"
        return cls(
            name=_get(d, "name", str, w),
            version=str(_get(d, "version", (str, int), w)),
            vcpus=_get(d, "vcpus", int, w),
            memory_mib=_get(d, "memory_mib", int, w),
            image_mib=_opt(d, "image_mib", int, w) or 0,
            image=_opt(d, "image", str, w) or "",
            created_unix_ms=_opt(d, "created_unix_ms", int, w) or 0,
            source=_opt(d, "source", str, w) or "",
            owner=_opt(d, "owner", str, w),
            env=_str_map(d, "env", w),
            user=_opt(d, "user", str, w),
            workdir=_opt(d, "workdir", str, w),
        )


@dataclass
class Build:
    """A template build: ``state`` is ``running``, ``succeeded`` or ``failed``."""

    id: str
    name: str
    version: str
    state: str
    source: str
    error: str | None
    created_unix_ms: int
    finished_unix_ms: int | None
    #: The template, once a build waited for has succeeded.
    template: Template | None = None

    @classmethod
    def from_json(cls, value: Any) -> Build:
        """Reads a ``Build`` object."""
        d = _obj(value, "build")
        w = "build"
        t = d.get("template")
        return cls(
            id=_get(d, "id", str, w),
            name=_get(d, "name", str, w),
            version=str(_get(d, "version", (str, int), w)),
            state=_get(d, "state", str, w),
            source=_opt(d, "source", str, w) or "",
            error=_opt(d, "error", str, w),
            created_unix_ms=_opt(d, "created_unix_ms", int, w) or 0,
            finished_unix_ms=_opt(d, "finished_unix_ms", int, w),
            template=Template.from_json(t) if t is not None else None,
        )


@dataclass
class ExecResult:
    """How a process ended and everything it wrote.

    ``exit_code`` is the status (``128 + n`` for a death by signal ``n``, which ``signal``
    then names); ``stdout`` and ``stderr`` are the raw bytes.
    """

    exit_code: int
    signal: int | None
    stdout: bytes = b""
    stderr: bytes = b""
    pid: int | None = field(default=None, compare=False)

    @property
    def ok(self) -> bool:
        """Whether the process exited with status 0."""
        return self.exit_code == 0 and self.signal is None

    @property
    def text(self) -> str:
        """``stdout`` decoded as UTF-8 (undecodable bytes replaced)."""
        return self.stdout.decode("utf-8", errors="replace")
