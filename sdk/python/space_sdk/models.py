"""Typed records for what the API returns.

Each record names the schema of the OpenAPI document it stands for in ``SCHEMA`` (a name
under ``components/schemas``, or ``Schema.property`` for an object defined inside another);
a test checks that the fields are exactly that schema's properties, those without a default
being the required ones. ``from_json`` checks the types of the fields it reads and raises
:class:`~space_sdk.errors.InvalidResponse` when the server's answer does not fit; fields this
version does not know are ignored, so a newer server stays readable.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from .errors import InvalidResponse

__all__ = [
    "AuditEvent",
    "BrowserFill",
    "BrowserSession",
    "Build",
    "DirEntry",
    "EgressPolicy",
    "ExecResult",
    "FileStat",
    "ForkedFrom",
    "Health",
    "JoinToken",
    "Key",
    "KeyCreated",
    "MasterKey",
    "MetricSample",
    "Node",
    "NodeList",
    "Port",
    "PortExposed",
    "Quotas",
    "RemoteCopy",
    "RestorePoint",
    "SandboxInfo",
    "Secret",
    "SecretBinding",
    "Snapshot",
    "Template",
    "Tenant",
    "TenantCreated",
    "Timeouts",
    "Upload",
    "VolumeInfo",
    "VolumeMount",
    "WatchEvent",
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


def _list(d: dict[str, Any], key: str, typ: type[T], what: str) -> list[T]:
    value = d.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(
        isinstance(v, typ) and not (isinstance(v, bool) and typ is int) for v in value
    ):
        raise InvalidResponse(f"{what}: field {key!r} should be a list of {typ.__name__}")
    return list(value)


def _objects(d: dict[str, Any], key: str, what: str) -> list[Any]:
    value = d.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidResponse(f"{what}: field {key!r} should be a list")
    return value


@dataclass(frozen=True)
class Health:
    """What ``GET /v1/health`` says: ``status`` is ``ok``, ``accelerator`` ``kvm`` or
    ``tcg``. Also readable as a mapping (``health["status"]``), as version 0.1 answered."""

    SCHEMA: ClassVar[str] = "Health"

    # <generated fields: scripts/gen_models.py>
    status: str
    version: str
    accelerator: str
    # </generated fields>

    def __getitem__(self, key: str) -> str:
        if key not in ("status", "version", "accelerator"):
            raise KeyError(key)
        value: str = getattr(self, key)
        return value

    @classmethod
    def from_json(cls, value: Any) -> Health:
        """Reads the health answer."""
        d = _obj(value, "health")
        return cls(
            status=_get(d, "status", str, "health"),
            version=_opt(d, "version", str, "health") or "",
            accelerator=_opt(d, "accelerator", str, "health") or "",
        )


@dataclass(frozen=True)
class Timeouts:
    """A sandbox's timeouts. ``None`` means never."""

    SCHEMA: ClassVar[str] = "Timeouts"

    # <generated fields: scripts/gen_models.py>
    idle_ms: int | None
    max_lifetime_ms: int | None
    action: str
    # </generated fields>

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

    SCHEMA: ClassVar[str] = "ForkedFrom"

    # <generated fields: scripts/gen_models.py>
    #: `sbx-` and 16 hex digits when the node makes one; any id the node accepts is at most 64
    #: lowercase letters, digits, `.`, `_` and `-`, starting with a letter or digit.
    sandbox: str
    snapshot: str
    # </generated fields>

    @classmethod
    def from_json(cls, value: Any) -> ForkedFrom:
        """Reads the ``forked_from`` object of a sandbox."""
        d = _obj(value, "forked_from")
        return cls(
            sandbox=_get(d, "sandbox", str, "forked_from"),
            snapshot=_get(d, "snapshot", str, "forked_from"),
        )


@dataclass(frozen=True)
class EgressPolicy:
    """Where a sandbox may connect: ``deny`` rules win, then ``allow`` rules, then
    ``default`` (``"allow"`` or ``"deny"``). Rules are ``HOST[:PORT]``, ``*.suffix``, ``*``
    or IP literals; a private address needs an allow rule naming it exactly."""

    SCHEMA: ClassVar[str] = "EgressPolicy"

    # <generated fields: scripts/gen_models.py>
    default: str = "allow"
    allow: list[str] = field(default_factory=list)
    deny: list[str] = field(default_factory=list)
    #: Headers the gateway sets on requests to some destinations (docs/egress.md, *Headers*). They
    #: do not allow a destination.
    headers: list[dict[str, Any]] = field(default_factory=list)
    # </generated fields>

    def to_json(self) -> dict[str, Any]:
        """The JSON object the API takes."""
        out: dict[str, Any] = {
            "default": self.default,
            "allow": list(self.allow),
            "deny": list(self.deny),
        }
        if self.headers:
            out["headers"] = [
                {"host": h["host"], "name": h["name"], "value": h["value"]} for h in self.headers
            ]
        return out

    @classmethod
    def from_json(cls, value: Any) -> EgressPolicy:
        """Reads an ``EgressPolicy`` object."""
        d = _obj(value, "egress policy")
        w = "egress policy"
        headers = []
        for h in _objects(d, "headers", w):
            h = _obj(h, "header rule")
            headers.append(
                {k: _get(h, k, str, "header rule") for k in ("host", "name", "value")}
            )
        return cls(
            default=_opt(d, "default", str, w) or "allow",
            allow=_list(d, "allow", str, w),
            deny=_list(d, "deny", str, w),
            headers=headers,
        )


@dataclass(frozen=True)
class SecretBinding:
    """A secret a sandbox is bound to: the environment variable ``name`` holds
    ``placeholder``, which the egress gateway replaces by the value on the secret's hosts."""

    SCHEMA: ClassVar[str] = "SecretBindingInfo"

    # <generated fields: scripts/gen_models.py>
    name: str
    #: What the sandbox sees in the environment variable `name`; not secret.
    placeholder: str
    # </generated fields>

    @classmethod
    def from_json(cls, value: Any) -> SecretBinding:
        """Reads one entry of a sandbox's ``secrets``."""
        d = _obj(value, "secret binding")
        return cls(
            name=_get(d, "name", str, "secret binding"),
            placeholder=_get(d, "placeholder", str, "secret binding"),
        )


@dataclass(frozen=True)
class VolumeMount:
    """A volume a sandbox mounts: the tenant's volume ``name`` at ``path``."""

    SCHEMA: ClassVar[str] = "VolumeMount"

    # <generated fields: scripts/gen_models.py>
    #: Unique in the tenant.
    name: str
    #: Where it appears in the guest: absolute, not `/`, `/proc`, `/sys`, `/dev` or `/run`; no `.`
    #: or `..` parts.
    path: str
    read_only: bool = False
    # </generated fields>

    @classmethod
    def from_json(cls, value: Any) -> VolumeMount:
        """Reads one entry of a sandbox's ``volumes``."""
        d = _obj(value, "volume mount")
        w = "volume mount"
        return cls(
            name=_get(d, "name", str, w),
            path=_get(d, "path", str, w),
            read_only=bool(_opt(d, "read_only", bool, w)),
        )


@dataclass(frozen=True)
class VolumeInfo:
    """A volume: a file system of the tenant's that outlives sandboxes. ``used_bytes`` is
    ``None`` when its node did not answer."""

    SCHEMA: ClassVar[str] = "Volume"

    # <generated fields: scripts/gen_models.py>
    created_unix_ms: int
    id: str
    #: Unique in the tenant.
    name: str
    #: Writes past it are refused.
    size_bytes: int
    #: Bytes in use; null when its node did not answer.
    used_bytes: int | None
    #: Every write acknowledged before this moment is in the volume's copy in the object store and
    #: survives the loss of its node; null: no copy since its node started, or no object store.
    synced_unix_ms: int | None
    # </generated fields>

    @classmethod
    def from_json(cls, value: Any) -> VolumeInfo:
        """Reads a ``Volume`` object."""
        d = _obj(value, "volume")
        w = "volume"
        return cls(
            id=_get(d, "id", str, w),
            name=_get(d, "name", str, w),
            size_bytes=_get(d, "size_bytes", int, w),
            used_bytes=_opt(d, "used_bytes", int, w),
            synced_unix_ms=_opt(d, "synced_unix_ms", int, w),
            created_unix_ms=_get(d, "created_unix_ms", int, w),
        )


@dataclass(frozen=True)
class RestorePoint:
    """For a suspended sandbox: the snapshot a restore starts from and where it is
    (``local``, ``remote``, ``local+remote`` or ``lost``)."""

    SCHEMA: ClassVar[str] = "Sandbox.restore_point"

    # <generated fields: scripts/gen_models.py>
    snapshot: str
    location: str
    # </generated fields>

    @classmethod
    def from_json(cls, value: Any) -> RestorePoint:
        """Reads the ``restore_point`` object of a sandbox."""
        d = _obj(value, "restore point")
        return cls(
            snapshot=_get(d, "snapshot", str, "restore point"),
            location=_get(d, "location", str, "restore point"),
        )


@dataclass(frozen=True)
class SandboxInfo:
    """A sandbox as the API describes it at one moment."""

    SCHEMA: ClassVar[str] = "Sandbox"

    # <generated fields: scripts/gen_models.py>
    #: `sbx-` and 16 hex digits when the node makes one; any id the node accepts is at most 64
    #: lowercase letters, digits, `.`, `_` and `-`, starting with a letter or digit.
    id: str
    #: A tenant or template name.
    tenant: str
    #: A tenant or template name.
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
    failure: str | None
    created_unix_ms: int
    state_since_unix_ms: int
    last_activity_unix_ms: int
    #: Deny rules win, then allow rules, then `default`. Private destinations need an allow rule
    #: naming the host exactly.
    egress: EgressPolicy
    secrets: list[SecretBinding]
    #: Whether guest access (exec, files, terminals, watch, ports, ingress) to a paused sandbox
    #: resumes it and to a suspended one restores it.
    auto_resume: bool
    #: For a suspended sandbox: the snapshot a restore starts from, and where it lives (`local`,
    #: `remote` (the object store only), `local+remote`).
    restore_point: RestorePoint | None
    #: The cluster node that holds the sandbox; only in answers to admin keys, and only in a
    #: cluster.
    node: str | None = None
    #: The volumes it mounts.
    volumes: list[VolumeMount] = field(default_factory=list)
    # </generated fields>

    @classmethod
    def from_json(cls, value: Any) -> SandboxInfo:
        """Reads a ``Sandbox`` object."""
        d = _obj(value, "sandbox")
        w = "sandbox"
        forked = d.get("forked_from")
        point = d.get("restore_point")
        auto_resume = _opt(d, "auto_resume", bool, w)
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
            failure=_opt(d, "failure", str, w),
            created_unix_ms=_get(d, "created_unix_ms", int, w),
            state_since_unix_ms=_opt(d, "state_since_unix_ms", int, w) or 0,
            last_activity_unix_ms=_opt(d, "last_activity_unix_ms", int, w) or 0,
            egress=EgressPolicy.from_json(d.get("egress") or {}),
            secrets=[SecretBinding.from_json(s) for s in _objects(d, "secrets", w)],
            volumes=[VolumeMount.from_json(v) for v in _objects(d, "volumes", w)],
            auto_resume=True if auto_resume is None else auto_resume,
            restore_point=RestorePoint.from_json(point) if point is not None else None,
            node=_opt(d, "node", str, w),
        )


@dataclass(frozen=True)
class RemoteCopy:
    """A snapshot's copy in the object store."""

    SCHEMA: ClassVar[str] = "Snapshot.remote"

    # <generated fields: scripts/gen_models.py>
    #: BLAKE3 of the manifest object, checked before the manifest is used.
    manifest_hash: str
    uploaded_unix_ms: int
    #: Bytes the upload wrote: new chunks and the manifest.
    uploaded_bytes: int
    new_chunks: int
    #: Bytes of every chunk the manifest references, shared or not.
    stored_bytes: int
    # </generated fields>

    @classmethod
    def from_json(cls, value: Any) -> RemoteCopy:
        """Reads the ``remote`` object of a snapshot."""
        d = _obj(value, "snapshot copy")
        w = "snapshot copy"
        return cls(
            manifest_hash=_get(d, "manifest_hash", str, w),
            uploaded_unix_ms=_get(d, "uploaded_unix_ms", int, w),
            uploaded_bytes=_get(d, "uploaded_bytes", int, w),
            new_chunks=_opt(d, "new_chunks", int, w) or 0,
            stored_bytes=_get(d, "stored_bytes", int, w),
        )


@dataclass(frozen=True)
class Snapshot:
    """A snapshot of a sandbox: ``kind`` is ``disk`` or ``full``."""

    SCHEMA: ClassVar[str] = "Snapshot"

    # <generated fields: scripts/gen_models.py>
    id: str
    kind: str
    reason: str
    created_unix_ms: int
    size_bytes: int
    paused_for_us: int
    #: Whether the snapshot's files are on the node's disk (false once the local copy was evicted,
    #: or for a snapshot known only from the object store).
    local: bool
    #: The snapshot's copy in the object store, once uploaded.
    remote: RemoteCopy | None = None
    # </generated fields>

    @classmethod
    def from_json(cls, value: Any) -> Snapshot:
        """Reads a ``Snapshot`` object."""
        d = _obj(value, "snapshot")
        w = "snapshot"
        remote = d.get("remote")
        local = _opt(d, "local", bool, w)
        return cls(
            id=_get(d, "id", str, w),
            kind=_get(d, "kind", str, w),
            reason=_opt(d, "reason", str, w) or "",
            created_unix_ms=_get(d, "created_unix_ms", int, w),
            size_bytes=_opt(d, "size_bytes", int, w) or 0,
            paused_for_us=_opt(d, "paused_for_us", int, w) or 0,
            local=True if local is None else local,
            remote=RemoteCopy.from_json(remote) if remote is not None else None,
        )


@dataclass(frozen=True)
class MetricSample:
    """What a sandbox used over one span of ``span_ms`` ending at ``timestamp_unix_ms``: CPU
    shares averaged over the span, memory and disk as of its end, traffic through the gateway
    during it."""

    SCHEMA: ClassVar[str] = "MetricSample"

    # <generated fields: scripts/gen_models.py>
    #: The end of the span.
    timestamp_unix_ms: int
    span_ms: int
    cpu_count: int
    #: Share of all vCPUs the guest kept busy.
    cpu_used_pct: float
    #: CPU the VM took on the host, percent of one core (emulation included).
    host_cpu_pct: float
    mem_total_bytes: int
    mem_used_bytes: int
    mem_cache_bytes: int
    #: Host memory charged to the VM.
    host_mem_bytes: int
    disk_total_bytes: int
    disk_used_bytes: int
    #: Through the gateway, during the span.
    net_sent_bytes: int
    net_received_bytes: int
    # </generated fields>

    @classmethod
    def from_json(cls, value: Any) -> MetricSample:
        """Reads a ``MetricSample`` object."""
        d = _obj(value, "metric sample")
        w = "metric sample"
        num = (int, float)
        return cls(
            timestamp_unix_ms=_get(d, "timestamp_unix_ms", int, w),
            span_ms=_get(d, "span_ms", int, w),
            cpu_count=_get(d, "cpu_count", int, w),
            cpu_used_pct=float(_get(d, "cpu_used_pct", num, w)),
            host_cpu_pct=float(_get(d, "host_cpu_pct", num, w)),
            mem_total_bytes=_get(d, "mem_total_bytes", int, w),
            mem_used_bytes=_get(d, "mem_used_bytes", int, w),
            mem_cache_bytes=_get(d, "mem_cache_bytes", int, w),
            host_mem_bytes=_get(d, "host_mem_bytes", int, w),
            disk_total_bytes=_get(d, "disk_total_bytes", int, w),
            disk_used_bytes=_get(d, "disk_used_bytes", int, w),
            net_sent_bytes=_get(d, "net_sent_bytes", int, w),
            net_received_bytes=_get(d, "net_received_bytes", int, w),
        )


@dataclass(frozen=True)
class FileStat:
    """What ``lstat`` says about a path in the guest. ``file_type`` is ``file``, ``dir``,
    ``symlink`` or ``other``."""

    SCHEMA: ClassVar[str] = "FileStat"

    # <generated fields: scripts/gen_models.py>
    path: str
    file_type: str
    size: int
    #: Permission bits (0o7777 mask).
    mode: int
    uid: int
    gid: int
    mtime_unix_ns: int
    symlink_target: str | None
    #: Extended attributes in the user. namespace with UTF-8 values (at most 32); absent when there
    #: are none.
    xattrs: dict[str, str] = field(default_factory=dict)
    # </generated fields>

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
            xattrs=_str_map(d, "xattrs", w),
        )


@dataclass(frozen=True)
class DirEntry:
    """One entry of a directory listing."""

    SCHEMA: ClassVar[str] = "DirEntry"

    # <generated fields: scripts/gen_models.py>
    name: str
    stat: FileStat
    # </generated fields>

    @classmethod
    def from_json(cls, value: Any) -> DirEntry:
        """Reads a ``DirEntry`` object."""
        d = _obj(value, "directory entry")
        return cls(
            name=_get(d, "name", str, "directory entry"),
            stat=FileStat.from_json(d.get("stat")),
        )


@dataclass(frozen=True)
class WatchEvent:
    """A change under a watched path. ``kind`` is ``created``, ``modified``,
    ``closed_write`` (a file opened for writing was closed), ``removed``, ``moved_from``,
    ``moved_to``, ``attrib`` or ``overflow`` (events were dropped: rescan)."""

    SCHEMA: ClassVar[str] = "WatchEvent"

    # <generated fields: scripts/gen_models.py>
    path: str
    kind: str
    is_dir: bool
    # </generated fields>

    @classmethod
    def from_json(cls, value: Any) -> WatchEvent:
        """Reads one line of a watch stream."""
        d = _obj(value, "watch event")
        return cls(
            path=_get(d, "path", str, "watch event"),
            kind=_get(d, "kind", str, "watch event"),
            is_dir=_get(d, "is_dir", bool, "watch event"),
        )


@dataclass(frozen=True)
class AuditEvent:
    """One audit record: who did what to which sandbox, and how it ended (``result`` is
    ``ok`` or the error code)."""

    SCHEMA: ClassVar[str] = "AuditEvent"

    # <generated fields: scripts/gen_models.py>
    id: int
    at_unix_ms: int
    tenant: str | None
    key_id: str | None
    sandbox: str | None
    operation: str
    #: `ok` or the error code.
    result: str
    detail: str | None
    # </generated fields>

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

    SCHEMA: ClassVar[str] = "Template"

    # <generated fields: scripts/gen_models.py>
    #: A tenant or template name.
    name: str
    version: str
    vcpus: int
    memory_mib: int
    image_mib: int
    image: str
    created_unix_ms: int
    #: Where its root image came from.
    source: str
    #: The tenant a private template belongs to; null for public ones.
    owner: str | None
    #: Environment of its sandboxes' commands (an image's ENV).
    env: dict[str, str]
    #: Who commands run as by default (an image's USER).
    user: str | None
    #: Their default working directory (an image's WORKDIR).
    workdir: str | None
    #: The image's entrypoint and command (kept, not run).
    command: list[str]
    #: Ports the image exposes.
    ports: list[int]
    #: The process its snapshot holds and its ready check.
    start: dict[str, Any] | None
    # </generated fields>

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
            command=_list(d, "command", str, w),
            ports=_list(d, "ports", int, w),
            start=_opt(d, "start", dict, w),
        )


@dataclass
class Build:
    """A template build: ``state`` is ``running``, ``succeeded`` or ``failed`` (``waiting``: an
    E2B template request whose steps have not come)."""

    SCHEMA: ClassVar[str] = "Build"

    # <generated fields: scripts/gen_models.py>
    id: str
    tenant: str
    name: str
    version: str
    source: str
    #: `waiting`: an E2B template request whose steps have not come (docs/e2b.md).
    state: str
    error: str | None
    created_unix_ms: int
    finished_unix_ms: int | None
    template: Template | None = None
    # </generated fields>

    @classmethod
    def from_json(cls, value: Any) -> Build:
        """Reads a ``Build`` object."""
        d = _obj(value, "build")
        w = "build"
        t = d.get("template")
        return cls(
            id=_get(d, "id", str, w),
            tenant=_opt(d, "tenant", str, w) or "",
            name=_get(d, "name", str, w),
            version=str(_get(d, "version", (str, int), w)),
            source=_opt(d, "source", str, w) or "",
            state=_get(d, "state", str, w),
            error=_opt(d, "error", str, w),
            created_unix_ms=_opt(d, "created_unix_ms", int, w) or 0,
            finished_unix_ms=_opt(d, "finished_unix_ms", int, w),
            template=Template.from_json(t) if t is not None else None,
        )


@dataclass(frozen=True)
class Upload:
    """A stored build input: its id (for ``context`` or ``from_archive``) and size."""

    SCHEMA: ClassVar[str] = "Upload"

    # <generated fields: scripts/gen_models.py>
    upload: str
    bytes: int
    # </generated fields>

    @classmethod
    def from_json(cls, value: Any) -> Upload:
        """Reads the answer of an upload."""
        d = _obj(value, "upload")
        return cls(upload=_get(d, "upload", str, "upload"), bytes=_get(d, "bytes", int, "upload"))


@dataclass(frozen=True)
class Secret:
    """A secret of the tenant's vault (never its value) and the hosts it may be sent to."""

    SCHEMA: ClassVar[str] = "Secret"

    # <generated fields: scripts/gen_models.py>
    name: str
    hosts: list[str]
    created_unix_ms: int
    updated_unix_ms: int
    #: `value`: sent as it is; `totp`: a one-time password seed whose current code is sent.
    kind: str
    # </generated fields>

    @classmethod
    def from_json(cls, value: Any) -> Secret:
        """Reads a ``Secret`` object."""
        d = _obj(value, "secret")
        w = "secret"
        return cls(
            name=_get(d, "name", str, w),
            kind=_get(d, "kind", str, w),
            hosts=_list(d, "hosts", str, w),
            created_unix_ms=_get(d, "created_unix_ms", int, w),
            updated_unix_ms=_get(d, "updated_unix_ms", int, w),
        )


@dataclass(frozen=True)
class PortExposed:
    """A port just exposed, with its ingress URL (shown only this once)."""

    SCHEMA: ClassVar[str] = "PortExposed"

    # <generated fields: scripts/gen_models.py>
    port: int
    #: http(s)://<server>/ingress/<32-character token>/; shown only this once.
    url: str
    created_unix_ms: int
    # </generated fields>

    @classmethod
    def from_json(cls, value: Any) -> PortExposed:
        """Reads the answer of an expose."""
        d = _obj(value, "exposed port")
        w = "exposed port"
        return cls(
            port=_get(d, "port", int, w),
            url=_get(d, "url", str, w),
            created_unix_ms=_get(d, "created_unix_ms", int, w),
        )


@dataclass(frozen=True)
class BrowserSession:
    """The URLs of a sandbox's browser: DevTools for automation clients, the live view for
    people."""

    SCHEMA: ClassVar[str] = "BrowserSession"

    # <generated fields: scripts/gen_models.py>
    #: ws(s)://<server>/v1/sandboxes/{id}/browser/cdp?token=<token>: for Playwright's
    #: connect_over_cdp and Puppeteer's connect.
    cdp_url: str
    #: When the tokens of both URLs stop working; POST again for new ones.
    expires_unix_ms: int
    headful: bool
    #: http(s)://<server>/v1/sandboxes/{id}/browser/live/<token>/vnc.html?...: the display in a
    #: browser tab; null for a headless browser.
    live_url: str | None
    # </generated fields>

    @classmethod
    def from_json(cls, value: Any) -> BrowserSession:
        """Reads the answer of a browser start."""
        w = "browser session"
        d = _obj(value, w)
        return cls(
            cdp_url=_get(d, "cdp_url", str, w),
            live_url=_opt(d, "live_url", str, w),
            headful=_get(d, "headful", bool, w),
            expires_unix_ms=_get(d, "expires_unix_ms", int, w),
        )


@dataclass(frozen=True)
class BrowserFill:
    """What a fill of a credential into the sandbox's browser did (never the value)."""

    SCHEMA: ClassVar[str] = "BrowserFill"

    # <generated fields: scripts/gen_models.py>
    #: The field filled, as `tag[type=...]`.
    field: str
    mode: str
    #: The origin of the page filled.
    origin: str
    secret: str
    # </generated fields>

    @classmethod
    def from_json(cls, value: Any) -> BrowserFill:
        """Reads the answer of a fill."""
        w = "browser fill"
        d = _obj(value, w)
        return cls(
            secret=_get(d, "secret", str, w),
            mode=_get(d, "mode", str, w),
            origin=_get(d, "origin", str, w),
            field=_get(d, "field", str, w),
        )


@dataclass(frozen=True)
class Port:
    """An exposed port as listed (the URL is not: it is shown only when exposed)."""

    SCHEMA: ClassVar[str] = "Port"

    # <generated fields: scripts/gen_models.py>
    port: int
    created_unix_ms: int
    # </generated fields>

    @classmethod
    def from_json(cls, value: Any) -> Port:
        """Reads one entry of a port listing."""
        d = _obj(value, "port")
        return cls(
            port=_get(d, "port", int, "port"),
            created_unix_ms=_get(d, "created_unix_ms", int, "port"),
        )


@dataclass(frozen=True)
class Quotas:
    """A tenant's limits: sandboxes that are not terminated, vCPUs and memory of those with
    a VM, and how long one may stay suspended (``None``: forever)."""

    SCHEMA: ClassVar[str] = "Quotas"

    # <generated fields: scripts/gen_models.py>
    max_sandboxes: int
    max_vcpus: int
    max_memory_mib: int
    #: How long a sandbox of the tenant may stay suspended before it is killed (audited as
    #: sandbox.expire), in ms; null: forever. In an update, null lifts the limit and leaving it out
    #: keeps it.
    max_suspended_ms: int | None
    #: The sizes of the tenant's volumes together, MiB.
    max_volume_mib: int
    # </generated fields>

    @classmethod
    def from_json(cls, value: Any) -> Quotas:
        """Reads a ``Quotas`` object."""
        d = _obj(value, "quotas")
        w = "quotas"
        return cls(
            max_sandboxes=_get(d, "max_sandboxes", int, w),
            max_vcpus=_get(d, "max_vcpus", int, w),
            max_memory_mib=_get(d, "max_memory_mib", int, w),
            max_suspended_ms=_opt(d, "max_suspended_ms", int, w),
            max_volume_mib=_opt(d, "max_volume_mib", int, w) or 0,
        )


@dataclass(frozen=True)
class Tenant:
    """A tenant and its quotas."""

    SCHEMA: ClassVar[str] = "Tenant"

    # <generated fields: scripts/gen_models.py>
    #: A tenant or template name.
    name: str
    created_unix_ms: int
    quotas: Quotas
    # </generated fields>

    @classmethod
    def from_json(cls, value: Any) -> Tenant:
        """Reads a ``Tenant`` object."""
        d = _obj(value, "tenant")
        return cls(
            name=_get(d, "name", str, "tenant"),
            created_unix_ms=_get(d, "created_unix_ms", int, "tenant"),
            quotas=Quotas.from_json(d.get("quotas")),
        )


def _key_fields(d: dict[str, Any], w: str) -> dict[str, Any]:
    return {
        "id": _get(d, "id", str, w),
        "tenant": _get(d, "tenant", str, w),
        "admin": _get(d, "admin", bool, w),
        "label": _opt(d, "label", str, w),
        "created_unix_ms": _get(d, "created_unix_ms", int, w),
        "revoked_unix_ms": _opt(d, "revoked_unix_ms", int, w),
    }


@dataclass(frozen=True)
class Key:
    """An API key as listed (never its secret)."""

    SCHEMA: ClassVar[str] = "Key"

    # <generated fields: scripts/gen_models.py>
    id: str
    #: A tenant or template name.
    tenant: str
    admin: bool
    label: str | None
    created_unix_ms: int
    revoked_unix_ms: int | None
    # </generated fields>

    @property
    def revoked(self) -> bool:
        """Whether the key has been revoked."""
        return self.revoked_unix_ms is not None

    @classmethod
    def from_json(cls, value: Any) -> Key:
        """Reads a ``Key`` object."""
        return cls(**_key_fields(_obj(value, "key"), "key"))


@dataclass(frozen=True)
class KeyCreated(Key):
    """A key just made: a :class:`Key` plus ``key``, the whole key (``space_...``), shown
    only this once."""

    SCHEMA: ClassVar[str] = "KeyCreated"

    # <generated fields: scripts/gen_models.py>
    key: str
    # </generated fields>

    @classmethod
    def from_json(cls, value: Any) -> KeyCreated:
        """Reads a ``KeyCreated`` object."""
        d = _obj(value, "new key")
        return cls(**_key_fields(d, "new key"), key=_get(d, "key", str, "new key"))


@dataclass(frozen=True)
class TenantCreated:
    """A new tenant and its first (non-admin) key."""

    SCHEMA: ClassVar[str] = "TenantCreated"

    # <generated fields: scripts/gen_models.py>
    tenant: Tenant
    #: A Key plus the whole key, shown only this once.
    key: KeyCreated
    # </generated fields>

    @classmethod
    def from_json(cls, value: Any) -> TenantCreated:
        """Reads the answer of a tenant create."""
        d = _obj(value, "new tenant")
        return cls(tenant=Tenant.from_json(d.get("tenant")), key=KeyCreated.from_json(d.get("key")))


@dataclass(frozen=True)
class MasterKey:
    """Which master key wraps a tenant's archive key: ``provider`` ``deployment`` (the
    deployment's key file) or ``kms`` (with ``key_id``, ``region`` and maybe ``endpoint``).
    ``id`` is the key's id as the archive records it (``None`` when it cannot be built)."""

    SCHEMA: ClassVar[str] = "MasterKey"

    # <generated fields: scripts/gen_models.py>
    provider: str
    id: str | None
    #: KMS key id, ARN or alias (kms only).
    key_id: str | None = None
    #: KMS region (kms only).
    region: str | None = None
    #: Endpoint URL of a KMS-compatible service (kms only; default AWS's).
    endpoint: str | None = None
    # </generated fields>

    @classmethod
    def from_json(cls, value: Any) -> MasterKey:
        """Reads a ``MasterKey`` object."""
        d = _obj(value, "master key")
        w = "master key"
        return cls(
            provider=_get(d, "provider", str, w),
            id=_opt(d, "id", str, w),
            key_id=_opt(d, "key_id", str, w),
            region=_opt(d, "region", str, w),
            endpoint=_opt(d, "endpoint", str, w),
        )


@dataclass(frozen=True)
class JoinToken:
    """A one-time token a node joins a cluster with (``token`` is shown only this once)."""

    SCHEMA: ClassVar[str] = "JoinToken"

    # <generated fields: scripts/gen_models.py>
    #: `spacejoin_<id>_<secret>`, shown once; works for one join.
    token: str
    id: str
    expires_unix_ms: int
    # </generated fields>

    @classmethod
    def from_json(cls, value: Any) -> JoinToken:
        """Reads a ``JoinToken`` object."""
        d = _obj(value, "join token")
        w = "join token"
        return cls(
            token=_get(d, "token", str, w),
            id=_get(d, "id", str, w),
            expires_unix_ms=_get(d, "expires_unix_ms", int, w),
        )


@dataclass(frozen=True)
class Node:
    """A node of a cluster: ``state`` is ``active``, ``draining``, ``lost`` or
    ``removed``; the rest is from its last report."""

    SCHEMA: ClassVar[str] = "Node"

    # <generated fields: scripts/gen_models.py>
    id: str
    address: str
    incarnation: int
    state: str
    live: bool
    lease_expires_ms: int
    joined_unix_ms: int
    accelerator: str
    qemu: str
    memory_total_mib: int
    memory_free_mib: int
    cpus: int
    sandboxes: int
    templates: list[str]
    # </generated fields>

    @classmethod
    def from_json(cls, value: Any) -> Node:
        """Reads a ``Node`` object."""
        d = _obj(value, "node")
        w = "node"
        return cls(
            id=_get(d, "id", str, w),
            address=_get(d, "address", str, w),
            incarnation=_get(d, "incarnation", int, w),
            state=_get(d, "state", str, w),
            live=_get(d, "live", bool, w),
            lease_expires_ms=_get(d, "lease_expires_ms", int, w),
            joined_unix_ms=_opt(d, "joined_unix_ms", int, w) or 0,
            accelerator=_opt(d, "accelerator", str, w) or "",
            qemu=_opt(d, "qemu", str, w) or "",
            memory_total_mib=_opt(d, "memory_total_mib", int, w) or 0,
            memory_free_mib=_opt(d, "memory_free_mib", int, w) or 0,
            cpus=_opt(d, "cpus", int, w) or 0,
            sandboxes=_opt(d, "sandboxes", int, w) or 0,
            templates=_list(d, "templates", str, w),
        )


@dataclass(frozen=True)
class NodeList:
    """The nodes of a cluster, with the lease a node's heartbeat buys and the grace after
    it before the node counts as lost."""

    SCHEMA: ClassVar[str] = "NodeList"

    # <generated fields: scripts/gen_models.py>
    nodes: list[Node]
    lease_ms: int
    grace_ms: int
    # </generated fields>

    @classmethod
    def from_json(cls, value: Any) -> NodeList:
        """Reads the answer of a node listing."""
        d = _obj(value, "node list")
        w = "node list"
        return cls(
            nodes=[Node.from_json(n) for n in _objects(d, "nodes", w)],
            lease_ms=_get(d, "lease_ms", int, w),
            grace_ms=_get(d, "grace_ms", int, w),
        )


@dataclass
class ExecResult:
    """How a process ended and everything it wrote.

    ``exit_code`` is the status (``128 + n`` for a death by signal ``n``, which ``signal``
    then names; ``-1`` when the guest could not learn it); ``stdout`` and ``stderr`` are the
    raw bytes.
    """

    #: Not an object of the API: what the records of an exec stream add up to.
    SCHEMA: ClassVar[str | None] = None

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
