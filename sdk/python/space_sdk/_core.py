"""What the synchronous and the asynchronous clients share: configuration, request bodies and
their checks, and decoding of the exec and watch streams. Nothing here does I/O on the
network."""

from __future__ import annotations

import base64
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote

from .errors import (
    ConfigError,
    InvalidRequest,
    InvalidResponse,
    SpaceConnectionError,
    SpaceError,
    make_error,
)
from .models import EgressPolicy, ExecResult, WatchEvent

DEFAULT_URL: Final = "http://127.0.0.1:7070"
"""Where ``space up`` listens by default."""

DEFAULT_TIMEOUT: Final = 120.0
"""Seconds one API call may take (creates and restores under software emulation are slow)."""

# Largest single line accepted from an exec stream: an output record carries at most 64 KiB of
# data (about 88 KiB as base64); anything far beyond is a broken or hostile server.
MAX_STREAM_LINE: Final = 4 * 1024 * 1024

# Chunk size for uploads read from file-like objects.
UPLOAD_CHUNK: Final = 256 * 1024


def invalid(message: str) -> InvalidRequest:
    """The error for an argument the client refuses before sending anything (``status``
    ``None``, code ``invalid_request``)."""
    return InvalidRequest("invalid_request", message, None)


def _take_lines(buf: bytearray, what: str) -> list[bytes]:
    """Removes the complete lines of an NDJSON stream from ``buf`` and returns them (without
    their newlines); what is left is the start of the next line, which must stay under
    :data:`MAX_STREAM_LINE`."""
    lines = []
    while (nl := buf.find(b"\n")) >= 0:
        lines.append(bytes(buf[:nl]))
        del buf[: nl + 1]
    if len(buf) > MAX_STREAM_LINE:
        raise InvalidResponse(f"{what} stream line longer than {MAX_STREAM_LINE} bytes")
    return lines


class _Never:
    """The type of :data:`NEVER`."""

    _instance: _Never | None = None

    def __new__(cls) -> _Never:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NEVER"


NEVER: Final = _Never()
"""A timeout value meaning "never" (sent as JSON ``null``); ``None`` means "leave as is"."""

Timeout = float | int | _Never | None
"""A timeout in seconds, :data:`NEVER`, or ``None`` for the server's default/current value."""


def config_path() -> Path:
    """The CLI's configuration file: ``$SPACE_CONFIG``, else
    ``$XDG_CONFIG_HOME/space/config.json``, else ``~/.config/space/config.json``."""
    explicit = os.environ.get("SPACE_CONFIG")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CONFIG_HOME")
    base = Path(xdg) if xdg else Path.home() / ".config"
    return base / "space" / "config.json"


def _read_config(path: Path) -> dict[str, Any]:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror or e}") from None
    if len(raw) > 1024 * 1024:
        raise ConfigError(f"{path} is larger than 1 MiB; it is not a space configuration")
    try:
        parsed = json.loads(raw)
    except ValueError as e:
        raise ConfigError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(parsed, dict):
        raise ConfigError(f"{path} should hold a JSON object with 'url' and 'api_key'")
    return parsed


def _profile(path: Path, cfg: dict[str, Any]) -> dict[str, Any]:
    """The profile of the CLI's configuration to use: ``$SPACE_PROFILE``, else the file's
    ``current``, else ``default`` (the file's top-level ``url`` and ``api_key``)."""
    name = os.environ.get("SPACE_PROFILE") or cfg.get("current") or "default"
    if not isinstance(name, str):
        raise ConfigError(f"{path}: 'current' should be a string")
    if name == "default":
        return cfg
    profiles = cfg.get("profiles")
    profile = profiles.get(name) if isinstance(profiles, dict) else None
    if not isinstance(profile, dict):
        known = sorted(profiles) if isinstance(profiles, dict) else []
        raise ConfigError(f"{path} has no profile {name!r} (profiles: {', '.join(known) or 'none'})")
    return profile


def resolve_config(url: str | None, api_key: str | None) -> tuple[str, str | None]:
    """Finds the server URL and API key: arguments first, then ``SPACE_URL`` /
    ``SPACE_API_KEY``, then the CLI's configuration file (its profile ``$SPACE_PROFILE``, else
    its current one); the URL defaults to :data:`DEFAULT_URL`."""
    url = url or os.environ.get("SPACE_URL") or None
    api_key = api_key or os.environ.get("SPACE_API_KEY") or None
    if url is None or api_key is None:
        path = config_path()
        cfg = _profile(path, _read_config(path))
        if url is None:
            value = cfg.get("url")
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"{path}: 'url' should be a string")
            url = value or None
        if api_key is None:
            value = cfg.get("api_key")
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"{path}: 'api_key' should be a string")
            api_key = value or None
    url = (url or DEFAULT_URL).rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"server URL {url!r} should start with http:// or https://")
    return url, api_key


def seg(value: str) -> str:
    """Quotes one path segment (an id or a name), so that no value can change the route."""
    if not isinstance(value, str) or not value:
        raise InvalidRequest("invalid_id", f"expected a non-empty id, got {value!r}")
    return quote(value, safe="")


def sandbox_path(sandbox_id: str, *rest: str) -> str:
    """The API path of a sandbox, or of one of its sub-resources."""
    return "/".join(["/v1/sandboxes", seg(sandbox_id), *rest])


def timeout_ms(value: Timeout, what: str) -> int | None:
    """Converts seconds to whole milliseconds for the API (``NEVER`` becomes ``None``)."""
    if value is None or isinstance(value, _Never):
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} should be a number of seconds or NEVER, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{what} should be a positive number of seconds, got {value!r}")
    return max(1, round(value * 1000))


def timeouts_body(idle: Timeout, max_lifetime: Timeout, action: str | None) -> dict[str, Any]:
    """The ``timeouts`` object: fields given as ``None`` are left out."""
    body: dict[str, Any] = {}
    if idle is not None:
        body["idle_ms"] = timeout_ms(idle, "idle_timeout")
    if max_lifetime is not None:
        body["max_lifetime_ms"] = timeout_ms(max_lifetime, "max_lifetime")
    if action is not None:
        body["action"] = action
    return body


def _str_map(value: Mapping[str, str] | None, what: str) -> dict[str, str] | None:
    if value is None:
        return None
    out: dict[str, str] = {}
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(f"{what} should map strings to strings, got {k!r}: {v!r}")
        out[k] = v
    return out


def create_body(
    template: str,
    version: str | None,
    vcpus: int | None,
    memory_mib: int | None,
    disk_mib: int | None,
    env: Mapping[str, str] | None,
    metadata: Mapping[str, str] | None,
    idle_timeout: Timeout,
    max_lifetime: Timeout,
    timeout_action: str | None,
    *,
    egress: EgressPolicy | Mapping[str, Any] | None = None,
    secrets: Sequence[str] | None = None,
    auto_resume: bool | None = None,
    volumes: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The body of ``POST /v1/sandboxes``."""
    body: dict[str, Any] = {"template": template}
    if version is not None:
        body["version"] = str(version)
    for key, value in (("vcpus", vcpus), ("memory_mib", memory_mib), ("disk_mib", disk_mib)):
        if value is not None:
            body[key] = value
    if env is not None:
        body["env"] = _str_map(env, "env")
    if metadata is not None:
        body["metadata"] = _str_map(metadata, "metadata")
    timeouts = timeouts_body(idle_timeout, max_lifetime, timeout_action)
    if timeouts:
        body["timeouts"] = timeouts
    if egress is not None:
        body["egress"] = egress_body(egress)
    if secrets is not None:
        body["secrets"] = str_list(secrets, "secrets")
    if auto_resume is not None:
        if not isinstance(auto_resume, bool):
            raise invalid(f"auto_resume should be True or False, not {auto_resume!r}")
        body["auto_resume"] = auto_resume
    if volumes is not None:
        body["volumes"] = volume_mounts(volumes)
    return body


def volume_mounts(volumes: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``{"/path": "name"}`` or ``{"/path": ("name", "ro")}`` (or a volume handle) as the
    create's ``volumes``."""
    if not isinstance(volumes, Mapping):
        raise invalid("volumes should map mount paths to volume names")
    out = []
    for path, spec in volumes.items():
        read_only = False
        if isinstance(spec, tuple):
            if len(spec) != 2 or spec[1] not in ("ro", "rw"):
                raise invalid(f"volume at {path!r}: use (name, 'ro') or (name, 'rw')")
            spec, read_only = spec[0], spec[1] == "ro"
        name = getattr(spec, "name", spec)
        if not isinstance(path, str) or not isinstance(name, str):
            raise invalid("volumes should map mount paths (str) to volume names (str)")
        out.append({"name": name, "path": path, "read_only": read_only})
    return out


def idempotency_headers(key: str | None) -> dict[str, str]:
    """The ``Idempotency-Key`` header of a create: 1 to 255 visible ASCII characters."""
    if key is None:
        return {}
    if (
        not isinstance(key, str)
        or not 1 <= len(key) <= 255
        or not all("!" <= c <= "~" for c in key)
    ):
        raise invalid(f"an idempotency key is 1 to 255 visible ASCII characters, not {key!r}"[:300])
    return {"Idempotency-Key": key}


def str_list(value: Any, what: str) -> list[str]:
    """A list of strings from any iterable of them; a lone string is refused (it would
    otherwise be taken character by character)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise invalid(f"{what} should be a list of strings, not {value!r}")
    out = list(value)
    for item in out:
        if not isinstance(item, str):
            raise invalid(f"{what} should be a list of strings; {item!r} is not a string")
    return out


def egress_body(value: EgressPolicy | Mapping[str, Any]) -> dict[str, Any]:
    """The JSON of an ``EgressPolicy`` from one or from a mapping with its fields."""
    if isinstance(value, EgressPolicy):
        fields = value.to_json()
    elif isinstance(value, Mapping):
        unknown = sorted(str(k) for k in value if k not in ("default", "allow", "deny"))
        if unknown:
            raise invalid(
                f"an egress policy has no field {unknown[0]!r} (only default, allow, deny)"
            )
        fields = dict(value)
    else:
        raise invalid(
            f"an egress policy is an EgressPolicy or a mapping, not {type(value).__name__}"
        )
    default = fields.get("default", "allow")
    if default not in ("allow", "deny"):
        raise invalid(f"an egress policy's default is 'allow' or 'deny', not {default!r}")
    body: dict[str, Any] = {"default": default}
    for key in ("allow", "deny"):
        rules = fields.get(key)
        body[key] = [] if rules is None else str_list(rules, f"the egress {key} rules")
    return body


def egress_update(
    policy: EgressPolicy | Mapping[str, Any] | None,
    default: str | None,
    allow: Sequence[str] | None,
    deny: Sequence[str] | None,
) -> dict[str, Any]:
    """The body of ``PUT .../egress``: a whole policy, or its parts (the rest as a fresh
    policy has them: default allow, no rules)."""
    parts = (default, allow, deny)
    if policy is not None:
        if any(p is not None for p in parts):
            raise invalid("give a policy, or default/allow/deny, not both")
        return egress_body(policy)
    return egress_body(
        {
            "default": "allow" if default is None else default,
            "allow": [] if allow is None else allow,
            "deny": [] if deny is None else deny,
        }
    )


def secret_body(value: str | bytes, hosts: Sequence[str], kind: str = "value") -> dict[str, Any]:
    """The body of ``PUT /v1/secrets/{name}``."""
    if kind not in ("value", "totp"):
        raise invalid("a secret's kind is 'value' or 'totp'")
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            raise invalid("a secret's value must be UTF-8 text") from None
    if not isinstance(value, str) or not value:
        raise invalid("a secret's value is a non-empty string")
    names = str_list(hosts, "hosts")
    if not names:
        raise invalid("a secret needs at least one host it may be sent to")
    return {"value": value, "hosts": names, "kind": kind}


def count(value: Any, what: str) -> int:
    """``value`` if it is a non-negative whole number (``what`` names it in the error)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise invalid(f"{what} should be a non-negative whole number, not {value!r}")
    return value


def quotas_body(
    max_sandboxes: int | None,
    max_vcpus: int | None,
    max_memory_mib: int | None,
    max_suspended: Timeout,
    max_volume_mib: int | None = None,
) -> dict[str, Any]:
    """The ``quotas`` of a tenant create or update: fields given as ``None`` are left out;
    ``max_suspended`` is seconds, or :data:`NEVER` for no limit."""
    body: dict[str, Any] = {}
    for key, value in (
        ("max_sandboxes", max_sandboxes),
        ("max_vcpus", max_vcpus),
        ("max_memory_mib", max_memory_mib),
        ("max_volume_mib", max_volume_mib),
    ):
        if value is not None:
            body[key] = count(value, key)
    if isinstance(max_suspended, _Never):
        body["max_suspended_ms"] = None
    elif max_suspended is not None:
        if (
            isinstance(max_suspended, bool)
            or not isinstance(max_suspended, (int, float))
            or not math.isfinite(max_suspended)
            or max_suspended < 0
        ):
            raise invalid(
                f"max_suspended should be seconds (0 or more) or NEVER, not {max_suspended!r}"
            )
        body["max_suspended_ms"] = round(max_suspended * 1000)
    return body


def master_key_body(
    provider: str, key_id: str | None, region: str | None, endpoint: str | None
) -> dict[str, Any]:
    """The body of ``PUT /v1/tenants/{name}/master-key``."""
    if provider == "deployment":
        if key_id is not None or region is not None or endpoint is not None:
            raise invalid("the deployment master key takes no key_id, region or endpoint")
        return {"provider": "deployment"}
    if provider == "kms":
        if not key_id or not region:
            raise invalid("a KMS master key needs key_id and region")
        body: dict[str, Any] = {"provider": "kms", "key_id": key_id, "region": region}
        if endpoint is not None:
            body["endpoint"] = endpoint
        return body
    raise invalid(f"a master key's provider is 'deployment' or 'kms', not {provider!r}")


def port_number(port: Any) -> int:
    """A TCP port, 1 to 65535."""
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise invalid(f"a port is a whole number from 1 to 65535, not {port!r}")
    return port


# Characters left as they are in a proxied path (RFC 3986 pchar, and '%' for what the
# caller encoded already).
_PCHAR: Final = "!$&'()*+,;=:@-._~%"


def proxy_path(sandbox_id: str, port: int, path: str) -> str:
    """The API path of ``path`` on ``port`` of a sandbox, through the port proxy."""
    if not isinstance(path, str):
        raise invalid(f"a proxied path is a string, not {path!r}")
    if "?" in path or "#" in path:
        raise invalid("a proxied path has no query or fragment: pass the query as params=")
    segments = path.lstrip("/").split("/")
    if any(s in (".", "..") for s in segments):
        raise invalid(f"a proxied path may not have '.' or '..' segments: {path!r}")
    rest = "/".join(quote(s, safe=_PCHAR) for s in segments)
    return sandbox_path(sandbox_id, "ports", str(port_number(port)), "proxy") + "/" + rest


def proxy_error(status: int, body: bytes) -> SpaceError | None:
    """The error of a proxied request that the server answered itself (the error envelope:
    no such sandbox, a state that refuses it, nothing listening on the port); ``None`` for an
    answer of the app inside, whatever its status."""
    if status < 400:
        return None
    try:
        parsed = json.loads(body)
    except ValueError:
        return None
    if not isinstance(parsed, dict) or set(parsed) != {"error"}:
        return None
    err = parsed["error"]
    if (
        not isinstance(err, dict)
        or set(err) != {"code", "message"}
        or not isinstance(err["code"], str)
        or not isinstance(err["message"], str)
    ):
        return None
    return make_error(err["code"], err["message"], status)


def audit_params(
    sandbox: str | None,
    operation: str | None,
    since_unix_ms: int | None,
    limit: int | None,
    tenant: str | None,
) -> dict[str, str]:
    """The query of ``GET /v1/audit``."""
    params: dict[str, str] = {}
    if sandbox is not None:
        params["sandbox"] = sandbox
    if operation is not None:
        params["operation"] = operation
    if since_unix_ms is not None:
        params["since_unix_ms"] = str(count(since_unix_ms, "since_unix_ms"))
    if limit is not None:
        params["limit"] = str(count(limit, "limit"))
    if tenant is not None:
        params["tenant"] = tenant
    return params


def list_params(
    state: str | None, template: str | None, metadata: Mapping[str, str] | None
) -> dict[str, str]:
    """The query of ``GET /v1/sandboxes``."""
    params: dict[str, str] = {}
    if state is not None:
        params["state"] = state
    if template is not None:
        params["template"] = template
    for k, v in (_str_map(metadata, "metadata") or {}).items():
        params[f"metadata.{k}"] = v
    return params


def exec_body(
    cmd: str | Sequence[str] | None,
    shell: str | None,
    env: Mapping[str, str] | None,
    cwd: str | None,
    stdin: bytes | str | None,
    timeout: float | None,
) -> dict[str, Any]:
    """The ``ExecRequest``: a string ``cmd`` is a shell line, a sequence is an argv."""
    if isinstance(cmd, str):
        if shell is not None:
            raise ValueError("give either cmd or shell, not both")
        cmd, shell = None, cmd
    if (cmd is None) == (shell is None):
        raise ValueError("give exactly one of cmd (a list of arguments) or shell (a line)")
    body: dict[str, Any] = {}
    if cmd is not None:
        argv = list(cmd)
        if not argv or not all(isinstance(a, str) for a in argv):
            raise ValueError("cmd should be a non-empty list of strings")
        body["cmd"] = argv
    else:
        if not isinstance(shell, str):
            raise TypeError("shell should be a string")
        body["shell"] = shell
    if env:
        body["env"] = _str_map(env, "env")
    if cwd is not None:
        body["cwd"] = cwd
    if stdin is not None:
        data = stdin.encode() if isinstance(stdin, str) else bytes(stdin)
        body["stdin"] = base64.b64encode(data).decode("ascii")
    if timeout is not None:
        body["timeout_ms"] = timeout_ms(timeout, "timeout")
    return body


def upload_params(path: str, mode: int | str | None) -> dict[str, str]:
    """The query of ``PUT .../files``; ``mode`` as an int (``0o644``) or octal text."""
    params = {"path": path}
    if mode is not None:
        if isinstance(mode, bool):
            raise TypeError("mode should be an int such as 0o644 or a string such as '0644'")
        if isinstance(mode, int):
            if not 0 <= mode <= 0o7777:
                raise ValueError(f"mode {mode:o} is out of range")
            params["mode"] = format(mode, "04o")
        else:
            params["mode"] = mode
    return params


def json_body(status: int, body: bytes) -> Any:
    """Parses a successful JSON answer."""
    try:
        return json.loads(body)
    except ValueError:
        snippet = body[:200].decode("utf-8", errors="replace")
        raise InvalidResponse(f"expected JSON, got {snippet!r}", status) from None


def list_field(value: Any, key: str) -> list[Any]:
    """``value[key]``, which should be a JSON array (as in ``{"sandboxes": [...]}``)."""
    if not isinstance(value, dict) or not isinstance(value.get(key), list):
        raise InvalidResponse(f"expected an object with a {key!r} array")
    items: list[Any] = value[key]
    return items


class ExecDecoder:
    """Decodes the NDJSON exec stream as bytes arrive.

    :meth:`feed` returns the output records of the bytes fed so far as ``(stream, data)``
    pairs, ``stream`` being ``"stdout"`` or ``"stderr"``; :meth:`finish` returns the result
    once the stream has ended, or raises the error the stream reported.
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self._stdout = bytearray()
        self._stderr = bytearray()
        self._pid: int | None = None
        self._exit: tuple[int, int | None] | None = None
        self._error: SpaceError | None = None

    @property
    def done(self) -> bool:
        """Whether the last record (exit or error) has been seen."""
        return self._exit is not None or self._error is not None

    def feed(self, chunk: bytes) -> list[tuple[str, bytes]]:
        """Takes the next bytes of the stream; returns the output they complete."""
        out: list[tuple[str, bytes]] = []
        self._buf += chunk
        for line in _take_lines(self._buf, "exec"):
            item = self._line(line)
            if item is not None:
                out.append(item)
        return out

    def _line(self, line: bytes) -> tuple[str, bytes] | None:
        line = line.strip()
        if not line or self.done:
            return None
        try:
            rec = json.loads(line)
        except ValueError:
            raise InvalidResponse(f"exec stream: a line is not JSON: {line[:200]!r}") from None
        if not isinstance(rec, dict):
            raise InvalidResponse("exec stream: a record is not a JSON object")
        kind = rec.get("type")
        if kind in ("stdout", "stderr"):
            data = rec.get("data")
            if not isinstance(data, str):
                raise InvalidResponse(f"exec stream: {kind} record without data")
            try:
                raw = base64.b64decode(data, validate=True)
            except ValueError:
                raise InvalidResponse(f"exec stream: {kind} data is not base64") from None
            (self._stdout if kind == "stdout" else self._stderr).extend(raw)
            return kind, raw
        if kind == "started":
            pid = rec.get("pid")
            self._pid = pid if isinstance(pid, int) and not isinstance(pid, bool) else None
        elif kind == "exit":
            if "exit_code" not in rec:
                raise InvalidResponse("exec stream: exit record without an exit_code")
            code = rec["exit_code"]
            signal = rec.get("signal")
            if code is None:
                code = -1  # the guest could not learn how the process ended
            if not isinstance(code, int) or isinstance(code, bool):
                raise InvalidResponse("exec stream: exit record with a malformed exit_code")
            if signal is not None and (not isinstance(signal, int) or isinstance(signal, bool)):
                raise InvalidResponse("exec stream: exit record with a malformed signal")
            self._exit = (code, signal)
        elif kind == "error":
            code = rec.get("code")
            message = rec.get("message")
            self._error = make_error(
                code if isinstance(code, str) and code else "stream_error",
                message if isinstance(message, str) else "the exec stream broke",
                200,
            )
        # Unknown record types are skipped: a newer server may add some.
        return None

    def result(self) -> ExecResult:
        """What has been collected so far, with the exit status if it is known."""
        code, signal = self._exit if self._exit is not None else (-1, None)
        return ExecResult(code, signal, bytes(self._stdout), bytes(self._stderr), self._pid)

    def finish(self) -> ExecResult:
        """The result after the stream ended; raises when it ended without an exit record."""
        if self._buf.strip() and not self.done:
            self._line(bytes(self._buf))
            self._buf.clear()
        if self._error is not None:
            raise self._error
        if self._exit is None:
            raise SpaceConnectionError("the exec stream ended before the process's exit record")
        return self.result()


class WatchDecoder:
    """Decodes the NDJSON watch stream as bytes arrive: :meth:`feed` returns the events the
    bytes complete and raises the error a stream's ``error`` record reports."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, chunk: bytes) -> list[WatchEvent]:
        """Takes the next bytes of the stream; returns the events they complete."""
        self._buf += chunk
        out: list[WatchEvent] = []
        for line in _take_lines(self._buf, "watch"):
            event = self._line(line)
            if event is not None:
                out.append(event)
        return out

    def finish(self) -> list[WatchEvent]:
        """The event of what is left once the stream ended (a last line without newline)."""
        rest = bytes(self._buf)
        self._buf.clear()
        event = self._line(rest)
        return [] if event is None else [event]

    @staticmethod
    def _line(line: bytes) -> WatchEvent | None:
        line = line.strip()
        if not line:
            return None
        try:
            rec = json.loads(line)
        except ValueError:
            raise InvalidResponse(f"watch stream: a line is not JSON: {line[:200]!r}") from None
        if isinstance(rec, dict) and rec.get("type") == "error":
            code = rec.get("code")
            message = rec.get("message")
            raise make_error(
                code if isinstance(code, str) and code else "stream_error",
                message if isinstance(message, str) else "the watch stream broke",
                200,
            )
        return WatchEvent.from_json(rec)


def template_build_body(
    name: str,
    *,
    version: str | None,
    image: str | None,
    from_image: str | None,
    registry_username: str | None,
    registry_password: str | None,
    plain_http: bool,
    dockerfile_text: str | None,
    build_args: Mapping[str, str] | None,
    archive_tag: str | None,
    start: str | None,
    ready_command: str | None,
    ready_port: int | None,
    vcpus: int | None,
    memory_mib: int | None,
    disk_mib: int | None,
    start_timeout: float | None = None,
    egress: EgressPolicy | Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON of ``POST /v1/templates`` (the uploads' ids are added by the caller)."""
    if ready_command is not None and ready_port is not None:
        raise invalid("name one ready check: ready_command or ready_port")
    if (ready_command is not None or ready_port is not None) and start is None:
        raise invalid("a ready check needs a start command")
    if (registry_username is None) != (registry_password is None):
        raise invalid("registry credentials need both a username and a password")
    body: dict[str, Any] = {"name": name}
    registry: dict[str, Any] = {}
    if registry_username is not None:
        registry["username"] = registry_username
        registry["password"] = registry_password
    if plain_http:
        registry["plain_http"] = True
    if image is not None:
        body["image"] = image
    if from_image is not None:
        body["from_image"] = {"reference": from_image, **registry}
    if dockerfile_text is not None:
        body["dockerfile"] = dockerfile_text
        if registry:
            body["registry"] = registry
        args = _str_map(build_args, "build_args")
        if args:
            body["build_args"] = args
    if archive_tag is not None:
        body["archive_tag"] = archive_tag
    if start_timeout is not None:
        if start is None:
            raise invalid("a start timeout needs a start command")
        body["start_timeout_ms"] = timeout_ms(start_timeout, "start_timeout")
    if egress is not None:
        if dockerfile_text is None:
            raise invalid("an egress policy applies to a Dockerfile's steps only")
        body["egress"] = egress_body(egress)
    for key, value in (
        ("version", version),
        ("start", start),
        ("ready_command", ready_command),
        ("ready_port", ready_port),
        ("vcpus", vcpus),
        ("memory_mib", memory_mib),
        ("disk_mib", disk_mib),
    ):
        if value is not None:
            body[key] = value
    return body


def context_tar(directory: str | os.PathLike[str]) -> bytes:
    """A tar of a build context directory (the server applies its ``.dockerignore``)."""
    import io
    import tarfile

    root = Path(directory)
    if not root.is_dir():
        raise invalid(f"the build context {root} is not a directory")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path in sorted(root.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(root)), recursive=False)
    return buf.getvalue()


def sources_given(**sources: Any) -> None:
    """Refuses a build that names no source or several."""
    given = [k for k, v in sources.items() if v is not None]
    if len(given) != 1:
        raise invalid(
            "name exactly one source: " + ", ".join(sources) + f" (got {given or 'none'})"
        )


def build_request(
    name: str,
    *,
    dockerfile: str | os.PathLike[str] | None,
    context: str | os.PathLike[str] | None,
    from_archive: str | os.PathLike[str] | None,
    **fields: Any,
) -> tuple[dict[str, Any], bytes | None, str | os.PathLike[str] | None]:
    """What ``build_template`` sends: the JSON body (without upload ids), the context tar to
    upload for a Dockerfile, and the archive file to upload."""
    sources_given(
        image=fields["image"],
        dockerfile=dockerfile,
        from_image=fields["from_image"],
        from_archive=from_archive,
    )
    text = None
    if dockerfile is not None:
        with open(dockerfile, encoding="utf-8") as f:
            text = f.read()
    body = template_build_body(name, dockerfile_text=text, **fields)
    tar = None
    if dockerfile is not None:
        ctx = context if context is not None else os.path.dirname(os.fspath(dockerfile)) or "."
        tar = context_tar(ctx)
    return body, tar, from_archive
