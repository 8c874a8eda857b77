"""The synchronous client: :class:`Space` (a connection to a server), :class:`Sandbox` and
its :class:`Files`."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import IO, Any

import httpx

from . import _core
from ._core import Timeout
from .errors import (
    ConfigError,
    IllegalState,
    NotFound,
    SpaceConnectionError,
    SpaceError,
    error_from_response,
)
from .models import (
    AuditEvent,
    Build,
    DirEntry,
    ExecResult,
    FileStat,
    SandboxInfo,
    Snapshot,
    Template,
)

__all__ = ["Files", "Sandbox", "Space", "default_client"]

_List = list  # `Sandbox.list` and `Files.list` shadow the builtin inside their classes.

# How much of an error answer is read before giving up on the rest.
_MAX_ERROR_BODY = 64 * 1024

OutputCallback = Callable[[bytes], object]
"""Called with each chunk of output as it arrives."""


def _read_error(resp: httpx.Response) -> SpaceError:
    body = bytearray()
    for chunk in resp.iter_bytes():
        body += chunk
        if len(body) >= _MAX_ERROR_BODY:
            break
    return error_from_response(resp.status_code, bytes(body[:_MAX_ERROR_BODY]))


def _file_chunks(f: IO[bytes]) -> Iterator[bytes]:
    while True:
        chunk = f.read(_core.UPLOAD_CHUNK)
        if not chunk:
            return
        if isinstance(chunk, str):
            raise TypeError("files.write needs a binary file (opened with 'rb')")
        yield bytes(chunk)


class Space:
    """A connection to a space server.

    ``url`` and ``api_key`` come from the arguments, else from ``SPACE_URL`` and
    ``SPACE_API_KEY``, else from the CLI's configuration file (``$SPACE_CONFIG``, else
    ``$XDG_CONFIG_HOME/space/config.json``, else ``~/.config/space/config.json``, holding
    ``{"url": ..., "api_key": ...}``). ``timeout`` is in seconds per API call; exec streams
    wait as long as the process runs. Use it as a context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = _core.DEFAULT_TIMEOUT,
        http_client: httpx.Client | None = None,
    ) -> None:
        self.url, self.api_key = _core.resolve_config(url, api_key)
        self.timeout = timeout
        self._own_http = http_client is None
        self._http = http_client or httpx.Client(
            timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0))
        )

    def close(self) -> None:
        """Closes the connections this client opened."""
        if self._own_http:
            self._http.close()

    def __enter__(self) -> Space:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Space(url={self.url!r})"

    # -- plumbing ------------------------------------------------------------------------

    def _headers(self, auth: bool, extra: Mapping[str, str] | None) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "space-sdk-python/0.1"}
        if auth:
            if not self.api_key:
                raise ConfigError(
                    "no API key: pass api_key=, set SPACE_API_KEY, or run `space up` "
                    f"(it writes {_core.config_path()})"
                )
            headers["Authorization"] = f"Bearer {self.api_key}"
        if extra:
            headers.update(extra)
        return headers

    def _build(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        json: Any = None,
        content: bytes | Iterator[bytes] | None = None,
        headers: Mapping[str, str] | None = None,
        auth: bool = True,
        timeout: httpx.Timeout | None = None,
    ) -> httpx.Request:
        return self._http.build_request(
            method,
            self.url + path,
            params=params,
            json=json,
            content=content,
            headers=self._headers(auth, headers),
            timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
        )

    def _send(self, request: httpx.Request, stream: bool = False) -> httpx.Response:
        try:
            resp = self._http.send(request, stream=stream)
        except httpx.TimeoutException as e:
            raise SpaceConnectionError(
                f"{request.method} {request.url.path}: timed out talking to {self.url} ({e!r})"
            ) from None
        except httpx.TransportError as e:
            raise SpaceConnectionError(
                f"{request.method} {request.url.path}: cannot talk to {self.url}: {e}"
            ) from None
        if resp.status_code >= 400:
            try:
                raise (
                    _read_error(resp)
                    if stream
                    else error_from_response(resp.status_code, resp.content[:_MAX_ERROR_BODY])
                )
            finally:
                resp.close()
        return resp

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        json: Any = None,
        content: bytes | Iterator[bytes] | None = None,
        headers: Mapping[str, str] | None = None,
        auth: bool = True,
    ) -> httpx.Response:
        """Sends one request to ``path`` (such as ``/v1/templates``) and returns the answer;
        an error answer raises the matching :class:`~space_sdk.SpaceError`."""
        req = self._build(
            method, path, params=params, json=json, content=content, headers=headers, auth=auth
        )
        try:
            return self._send(req)
        except httpx.StreamError as e:  # an upload iterator that cannot be replayed, etc.
            raise SpaceConnectionError(f"{method} {path}: {e}") from None

    def _json(self, method: str, path: str, **kw: Any) -> Any:
        resp = self.request(method, path, **kw)
        return _core.json_body(resp.status_code, resp.content)

    # -- server-wide calls ---------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """``GET /v1/health``: ``{"status", "version", "accelerator"}``."""
        value = self._json("GET", "/v1/health", auth=False)
        if not isinstance(value, dict):
            raise SpaceError("invalid_response", "health answer is not an object", 200)
        return value

    def templates(self) -> _List[Template]:
        """The templates sandboxes can be created from."""
        value = self._json("GET", "/v1/templates")
        return [Template.from_json(t) for t in _core.list_field(value, "templates")]

    def upload(self, data: bytes) -> str:
        """Uploads a build input (a context tar, an image archive); answers its upload id."""
        resp = self.request(
            "POST",
            "/v1/template-uploads",
            content=data,
            headers={"Content-Type": "application/octet-stream"},
        )
        value = _core.json_body(resp.status_code, resp.content)
        if not isinstance(value, dict) or not isinstance(value.get("upload"), str):
            raise SpaceError("invalid_response", "the upload answer has no id", resp.status_code)
        return value["upload"]

    def build_template(
        self,
        name: str,
        *,
        image: str | None = None,
        dockerfile: str | os.PathLike[str] | None = None,
        context: str | os.PathLike[str] | None = None,
        from_image: str | None = None,
        from_archive: str | os.PathLike[str] | None = None,
        archive_tag: str | None = None,
        registry_username: str | None = None,
        registry_password: str | None = None,
        plain_http: bool = False,
        build_args: Mapping[str, str] | None = None,
        start: str | None = None,
        ready_command: str | None = None,
        ready_port: int | None = None,
        vcpus: int | None = None,
        memory_mib: int | None = None,
        disk_mib: int | None = None,
        version: str | None = None,
        wait: bool = True,
        on_log: Callable[[str], None] | None = None,
    ) -> Build:
        """Builds a template from one source: a stock ``image``, a ``dockerfile`` (a path; its
        ``context`` defaults to the file's directory), an image reference ``from_image``, or
        an OCI/Docker archive file ``from_archive``. With ``wait`` (the default) it returns
        when the build ended, passing the log to ``on_log`` as it comes, and raises
        :class:`~space_sdk.SpaceError` (``build_failed``) if it failed."""
        body, tar, archive = _core.build_request(
            name,
            dockerfile=dockerfile,
            context=context,
            from_archive=from_archive,
            version=version,
            image=image,
            from_image=from_image,
            registry_username=registry_username,
            registry_password=registry_password,
            plain_http=plain_http,
            build_args=build_args,
            archive_tag=archive_tag,
            start=start,
            ready_command=ready_command,
            ready_port=ready_port,
            vcpus=vcpus,
            memory_mib=memory_mib,
            disk_mib=disk_mib,
        )
        if tar is not None:
            body["context"] = self.upload(tar)
        if archive is not None:
            with open(archive, "rb") as f:
                body["from_archive"] = self.upload(f.read())
        build = Build.from_json(self._json("POST", "/v1/templates", json=body))
        if not wait:
            return build
        return self.wait_build(build.id, on_log=on_log)

    def wait_build(self, build_id: str, *, on_log: Callable[[str], None] | None = None) -> Build:
        """Waits for a build to end, passing its log to ``on_log`` as it comes; raises
        :class:`~space_sdk.SpaceError` (``build_failed``) if it failed."""
        offset = 0
        while True:
            b = self.build(build_id)
            text = self.build_log(build_id, start=offset)
            offset += len(text.encode())
            if on_log is not None and text:
                on_log(text)
            if b.state != "running":
                break
            time.sleep(0.5)
        if b.state != "succeeded":
            raise SpaceError("build_failed", b.error or "the build failed", 200)
        return b

    def build(self, build_id: str) -> Build:
        """One build."""
        return Build.from_json(self._json("GET", f"/v1/builds/{_core.seg(build_id)}"))

    def builds(self) -> _List[Build]:
        """The caller's builds, newest first."""
        value = self._json("GET", "/v1/builds")
        return [Build.from_json(b) for b in _core.list_field(value, "builds")]

    def build_log(self, build_id: str, *, start: int = 0) -> str:
        """A build's log from byte ``start`` on."""
        resp = self.request(
            "GET", f"/v1/builds/{_core.seg(build_id)}/log", params={"from": str(int(start))}
        )
        return resp.content.decode("utf-8", errors="replace")

    def delete_template(self, name: str, version: str) -> None:
        """Deletes a template version."""
        self.request("DELETE", f"/v1/templates/{_core.seg(name)}/{_core.seg(version)}")

    def audit(
        self,
        *,
        sandbox: str | None = None,
        operation: str | None = None,
        since_unix_ms: int | None = None,
        limit: int | None = None,
    ) -> _List[AuditEvent]:
        """Audit events, newest first: the caller's tenant's (every tenant's for an admin
        key), filtered by sandbox id, operation and time."""
        params: dict[str, str] = {}
        if sandbox is not None:
            params["sandbox"] = sandbox
        if operation is not None:
            params["operation"] = operation
        if since_unix_ms is not None:
            params["since_unix_ms"] = str(int(since_unix_ms))
        if limit is not None:
            params["limit"] = str(int(limit))
        value = self._json("GET", "/v1/audit", params=params)
        return [AuditEvent.from_json(e) for e in _core.list_field(value, "events")]


_default_lock = threading.Lock()
_default: Space | None = None


def default_client() -> Space:
    """The client used when a :class:`Sandbox` call gets no ``client=``: one :class:`Space`
    configured from the environment, made on first use."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Space()
        return _default


class Files:
    """The file system of one sandbox (``sandbox.files``). Paths are absolute guest paths."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox

    def _path(self, *rest: str) -> str:
        return _core.sandbox_path(self._sb.id, "files", *rest)

    def read(self, path: str) -> bytes:
        """The whole contents of the file at ``path``."""
        return self._sb.client.request("GET", self._path(), params={"path": path}).content

    def read_text(self, path: str, encoding: str = "utf-8") -> str:
        """The contents of the file at ``path`` as text."""
        return self.read(path).decode(encoding)

    def download(self, path: str, dest: IO[bytes]) -> int:
        """Streams the file at ``path`` into the binary file ``dest``; returns the byte count."""
        client = self._sb.client
        req = client._build("GET", self._path(), params={"path": path})
        resp = client._send(req, stream=True)
        total = 0
        try:
            for chunk in resp.iter_bytes():
                dest.write(chunk)
                total += len(chunk)
        except httpx.TransportError as e:
            raise SpaceConnectionError(f"download of {path} broke off: {e}") from None
        finally:
            resp.close()
        return total

    def write(
        self, path: str, data: bytes | str | IO[bytes], mode: int | str | None = None
    ) -> FileStat:
        """Replaces the file at ``path`` (atomically) with ``data``: bytes, text (written as
        UTF-8) or a binary file object, which is streamed. ``mode`` is like ``0o644``."""
        content: bytes | Iterator[bytes]
        if isinstance(data, str):
            content = data.encode("utf-8")
        elif isinstance(data, (bytes, bytearray, memoryview)):
            content = bytes(data)
        elif hasattr(data, "read"):
            content = _file_chunks(data)
        else:
            raise TypeError("data should be bytes, str or a binary file object")
        value = self._sb.client._json(
            "PUT",
            self._path(),
            params=_core.upload_params(path, mode),
            content=content,
            headers={"Content-Type": "application/octet-stream"},
        )
        return FileStat.from_json(value)

    def list(self, path: str) -> _List[DirEntry]:
        """The entries of the directory ``path``, sorted by name."""
        value = self._sb.client._json("GET", self._path("list"), params={"path": path})
        return [DirEntry.from_json(e) for e in _core.list_field(value, "entries")]

    def stat(self, path: str) -> FileStat:
        """What ``lstat`` says about ``path``."""
        return FileStat.from_json(
            self._sb.client._json("GET", self._path("stat"), params={"path": path})
        )

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists (a dangling symlink counts)."""
        try:
            self.stat(path)
        except NotFound:
            return False
        return True

    def mkdir(self, path: str, parents: bool = True) -> FileStat:
        """Makes the directory ``path`` (and its missing parents, unless ``parents=False``)."""
        return FileStat.from_json(
            self._sb.client._json(
                "POST", self._path("mkdir"), json={"path": path, "parents": parents}
            )
        )

    def remove(self, path: str, recursive: bool = False) -> None:
        """Removes the file or empty directory ``path``; with ``recursive``, a whole tree."""
        params = {"path": path}
        if recursive:
            params["recursive"] = "true"
        self._sb.client.request("DELETE", self._path(), params=params)

    def rename(self, src: str, dst: str) -> FileStat:
        """Renames ``src`` to ``dst``; returns the stat of ``dst``."""
        return FileStat.from_json(
            self._sb.client._json("POST", self._path("rename"), json={"from": src, "to": dst})
        )


class Sandbox:
    """One sandbox: a microVM with its own kernel, disk and processes.

    Make one with :meth:`create`, find one with :meth:`connect` or :meth:`list`. Used as a
    context manager, it is killed when the block ends.
    """

    def __init__(self, client: Space, info: SandboxInfo) -> None:
        self.client = client
        self._info = info
        self.files = Files(self)

    @property
    def id(self) -> str:
        """The sandbox id (``sbx-...``)."""
        return self._info.id

    @property
    def last_info(self) -> SandboxInfo:
        """The description from the last call that returned one (no request is made)."""
        return self._info

    @property
    def state(self) -> str:
        """The state from the last call that returned one; :meth:`info` asks the server."""
        return self._info.state

    def __repr__(self) -> str:
        return f"Sandbox(id={self.id!r}, state={self._info.state!r})"

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._info.state == "terminated":
            return
        try:
            self.kill()
        except (NotFound, IllegalState):
            pass  # gone already
        except SpaceError:
            if exc_type is None:
                raise
            # An error is already on its way out; it matters more than this one.

    # -- finding and making sandboxes ----------------------------------------------------

    @classmethod
    def create(
        cls,
        template: str = "minimal",
        *,
        version: str | None = None,
        vcpus: int | None = None,
        memory_mib: int | None = None,
        disk_mib: int | None = None,
        env: Mapping[str, str] | None = None,
        metadata: Mapping[str, str] | None = None,
        idle_timeout: Timeout = None,
        max_lifetime: Timeout = None,
        timeout_action: str | None = None,
        client: Space | None = None,
    ) -> Sandbox:
        """Creates a running sandbox from ``template``.

        ``idle_timeout`` and ``max_lifetime`` are seconds, or :data:`~space_sdk.NEVER`;
        ``None`` takes the server's default (idle 15 minutes, no lifetime limit).
        ``timeout_action`` is ``"suspend"`` (the default) or ``"kill"``.
        """
        client = client or default_client()
        body = _core.create_body(
            template,
            version,
            vcpus,
            memory_mib,
            disk_mib,
            env,
            metadata,
            idle_timeout,
            max_lifetime,
            timeout_action,
        )
        return cls(client, SandboxInfo.from_json(client._json("POST", "/v1/sandboxes", json=body)))

    @classmethod
    def connect(cls, sandbox_id: str, *, client: Space | None = None) -> Sandbox:
        """The existing sandbox ``sandbox_id`` (``NotFound`` if the caller's tenant has none)."""
        client = client or default_client()
        return cls(
            client, SandboxInfo.from_json(client._json("GET", _core.sandbox_path(sandbox_id)))
        )

    @classmethod
    def list(
        cls,
        state: str | None = None,
        metadata: Mapping[str, str] | None = None,
        *,
        template: str | None = None,
        client: Space | None = None,
    ) -> _List[Sandbox]:
        """The caller's sandboxes, newest first, filtered by state, template and metadata
        (all must match). Terminated ones are listed only with ``state="terminated"``."""
        client = client or default_client()
        value = client._json(
            "GET", "/v1/sandboxes", params=_core.list_params(state, template, metadata)
        )
        return [cls(client, SandboxInfo.from_json(s)) for s in _core.list_field(value, "sandboxes")]

    # -- inspection ----------------------------------------------------------------------

    def _update(self, value: Any) -> SandboxInfo:
        self._info = SandboxInfo.from_json(value)
        return self._info

    def _post(self, action: str, json: Any = None) -> SandboxInfo:
        return self._update(
            self.client._json("POST", _core.sandbox_path(self.id, action), json=json)
        )

    def info(self) -> SandboxInfo:
        """Asks the server for the sandbox's current description."""
        return self._update(self.client._json("GET", _core.sandbox_path(self.id)))

    def logs(self, tail_bytes: int | None = None) -> str:
        """The end of the serial console (64 KiB unless ``tail_bytes`` says otherwise)."""
        params = {} if tail_bytes is None else {"tail_bytes": str(int(tail_bytes))}
        resp = self.client.request("GET", _core.sandbox_path(self.id, "logs"), params=params)
        return resp.content.decode("utf-8", errors="replace")

    # -- processes -----------------------------------------------------------------------

    def exec(
        self,
        cmd: str | Sequence[str] | None = None,
        *,
        shell: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | str | None = None,
        timeout: float | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
    ) -> ExecResult:
        """Runs a process in the sandbox and waits for it to end.

        ``cmd`` is an argv list, or a string run as ``/bin/sh -c`` (as is ``shell=``).
        ``stdin`` is written to the process and then closed. ``timeout`` (seconds) kills the
        process group when it passes. ``on_stdout`` / ``on_stderr`` are called with each
        chunk of output as it arrives; the result holds all of it as well. A non-zero exit
        is not an error: check ``result.exit_code``.
        """
        body = _core.exec_body(cmd, shell, env, cwd, stdin, timeout)
        read = None if timeout is None else timeout + self.client.timeout
        req = self.client._build(
            "POST",
            _core.sandbox_path(self.id, "exec"),
            json=body,
            headers={"Accept": "application/x-ndjson"},
            timeout=httpx.Timeout(self.client.timeout, read=read),
        )
        decoder = _core.ExecDecoder()
        resp = self.client._send(req, stream=True)
        try:
            for chunk in resp.iter_bytes():
                for kind, data in decoder.feed(chunk):
                    callback = on_stdout if kind == "stdout" else on_stderr
                    if callback is not None:
                        callback(data)
                if decoder.done:
                    break
        except httpx.TimeoutException:
            raise SpaceConnectionError(f"exec in {self.id}: the stream timed out") from None
        except httpx.TransportError as e:
            raise SpaceConnectionError(f"exec in {self.id}: the stream broke: {e}") from None
        finally:
            resp.close()
        return decoder.finish()

    # -- lifecycle -----------------------------------------------------------------------

    def pause(self) -> SandboxInfo:
        """Stops the vCPUs; memory stays. Guest access is refused until :meth:`resume`."""
        return self._post("pause")

    def resume(self) -> SandboxInfo:
        """Lets a paused sandbox run again."""
        return self._post("resume")

    def suspend(self) -> SandboxInfo:
        """Saves the whole VM (memory and disk) and frees its resources."""
        return self._post("suspend")

    def restore(self) -> SandboxInfo:
        """Brings a suspended sandbox back, running, as it was when suspended."""
        return self._post("restore")

    def fork(self) -> Sandbox:
        """A new running sandbox that starts as a copy of this one (memory and disk)."""
        value = self.client._json("POST", _core.sandbox_path(self.id, "fork"))
        return Sandbox(self.client, SandboxInfo.from_json(value))

    def save_as_template(self, name: str, version: str | None = None) -> Template:
        """A template of this sandbox as it is now, its processes included (private to the
        caller's tenant)."""
        body: dict[str, Any] = {"name": name}
        if version is not None:
            body["version"] = version
        value = self.client._json("POST", _core.sandbox_path(self.id, "template"), json=body)
        return Template.from_json(value)

    def kill(self) -> SandboxInfo:
        """Stops the VM for good; the record and snapshots stay."""
        return self._update(self.client._json("DELETE", _core.sandbox_path(self.id)))

    def snapshot(self, full: bool = False) -> Snapshot:
        """Takes a snapshot: of the disk, or with ``full=True`` of memory and disk."""
        value = self.client._json(
            "POST",
            _core.sandbox_path(self.id, "snapshots"),
            json={"kind": "full" if full else "disk"},
        )
        return Snapshot.from_json(value)

    def snapshots(self) -> _List[Snapshot]:
        """The sandbox's snapshots, oldest first."""
        value = self.client._json("GET", _core.sandbox_path(self.id, "snapshots"))
        return [Snapshot.from_json(s) for s in _core.list_field(value, "snapshots")]

    def rollback(self, snapshot: Snapshot | str) -> SandboxInfo:
        """Brings the sandbox back to ``snapshot`` (a :class:`Snapshot` or its id)."""
        snapshot_id = snapshot.id if isinstance(snapshot, Snapshot) else snapshot
        return self._post("rollback", {"snapshot": snapshot_id})

    def set_timeouts(
        self,
        idle: Timeout = None,
        max_lifetime: Timeout = None,
        action: str | None = None,
    ) -> SandboxInfo:
        """Changes the timeouts: seconds, or :data:`~space_sdk.NEVER`; ``None`` keeps the
        current value. ``action`` is ``"suspend"`` or ``"kill"``."""
        body = _core.timeouts_body(idle, max_lifetime, action)
        return self._update(
            self.client._json("PUT", _core.sandbox_path(self.id, "timeouts"), json=body)
        )
