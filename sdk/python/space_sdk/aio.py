"""The asynchronous client: :class:`AsyncSpace`, :class:`AsyncSandbox` and
:class:`AsyncFiles`, the same calls as the synchronous ones, as coroutines."""

from __future__ import annotations

import asyncio
import inspect
import os
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
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

__all__ = ["AsyncFiles", "AsyncSandbox", "AsyncSpace", "default_async_client"]

_List = list  # `AsyncSandbox.list` and `AsyncFiles.list` shadow the builtin in their classes.

_MAX_ERROR_BODY = 64 * 1024

AsyncOutputCallback = Callable[[bytes], "Awaitable[object] | object"]
"""Called with each chunk of output as it arrives; may be a plain function or a coroutine
function (which is awaited before the next chunk is read)."""


async def _read_error(resp: httpx.Response) -> SpaceError:
    body = bytearray()
    async for chunk in resp.aiter_bytes():
        body += chunk
        if len(body) >= _MAX_ERROR_BODY:
            break
    return error_from_response(resp.status_code, bytes(body[:_MAX_ERROR_BODY]))


async def _file_chunks(f: IO[bytes]) -> AsyncIterator[bytes]:
    while True:
        chunk = f.read(_core.UPLOAD_CHUNK)
        if inspect.isawaitable(chunk):  # an async file object (aiofiles and the like)
            chunk = await chunk
        if not chunk:
            return
        if isinstance(chunk, str):
            raise TypeError("files.write needs a binary file (opened with 'rb')")
        yield bytes(chunk)


class AsyncSpace:
    """A connection to a space server for asyncio code; configured like
    :class:`~space_sdk.Space`. Use ``async with``, or call :meth:`aclose`."""

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = _core.DEFAULT_TIMEOUT,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        self.url, self.api_key = _core.resolve_config(url, api_key)
        self.timeout = timeout
        self._own_http = http_client is None
        self._http = http_client or httpx.AsyncClient(
            timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0))
        )

    async def aclose(self) -> None:
        """Closes the connections this client opened."""
        if self._own_http:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncSpace:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"AsyncSpace(url={self.url!r})"

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
        content: bytes | AsyncIterator[bytes] | None = None,
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

    async def _send(self, request: httpx.Request, stream: bool = False) -> httpx.Response:
        try:
            resp = await self._http.send(request, stream=stream)
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
                if stream:
                    raise await _read_error(resp)
                raise error_from_response(resp.status_code, resp.content[:_MAX_ERROR_BODY])
            finally:
                await resp.aclose()
        return resp

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        json: Any = None,
        content: bytes | AsyncIterator[bytes] | None = None,
        headers: Mapping[str, str] | None = None,
        auth: bool = True,
    ) -> httpx.Response:
        """Sends one request to ``path`` and returns the answer; an error answer raises the
        matching :class:`~space_sdk.SpaceError`."""
        req = self._build(
            method, path, params=params, json=json, content=content, headers=headers, auth=auth
        )
        try:
            return await self._send(req)
        except httpx.StreamError as e:
            raise SpaceConnectionError(f"{method} {path}: {e}") from None

    async def _json(self, method: str, path: str, **kw: Any) -> Any:
        resp = await self.request(method, path, **kw)
        return _core.json_body(resp.status_code, resp.content)

    # -- server-wide calls ---------------------------------------------------------------

    async def health(self) -> dict[str, Any]:
        """``GET /v1/health``: ``{"status", "version", "accelerator"}``."""
        value = await self._json("GET", "/v1/health", auth=False)
        if not isinstance(value, dict):
            raise SpaceError("invalid_response", "health answer is not an object", 200)
        return value

    async def templates(self) -> _List[Template]:
        """The templates sandboxes can be created from."""
        value = await self._json("GET", "/v1/templates")
        return [Template.from_json(t) for t in _core.list_field(value, "templates")]

    async def upload(self, data: bytes) -> str:
        """Uploads a build input (a context tar, an image archive); answers its upload id."""
        resp = await self.request(
            "POST",
            "/v1/template-uploads",
            content=data,
            headers={"Content-Type": "application/octet-stream"},
        )
        value = _core.json_body(resp.status_code, resp.content)
        if not isinstance(value, dict) or not isinstance(value.get("upload"), str):
            raise SpaceError("invalid_response", "the upload answer has no id", resp.status_code)
        return value["upload"]

    async def build_template(
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
        """:meth:`space_sdk.Space.build_template`, awaited."""
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
            body["context"] = await self.upload(tar)
        if archive is not None:
            with open(archive, "rb") as f:
                body["from_archive"] = await self.upload(f.read())
        build = Build.from_json(await self._json("POST", "/v1/templates", json=body))
        if not wait:
            return build
        return await self.wait_build(build.id, on_log=on_log)

    async def wait_build(
        self, build_id: str, *, on_log: Callable[[str], None] | None = None
    ) -> Build:
        """:meth:`space_sdk.Space.wait_build`, awaited."""
        offset = 0
        while True:
            b = await self.build(build_id)
            text = await self.build_log(build_id, start=offset)
            offset += len(text.encode())
            if on_log is not None and text:
                on_log(text)
            if b.state != "running":
                break
            await asyncio.sleep(0.5)
        if b.state != "succeeded":
            raise SpaceError("build_failed", b.error or "the build failed", 200)
        return b

    async def build(self, build_id: str) -> Build:
        """One build."""
        return Build.from_json(await self._json("GET", f"/v1/builds/{_core.seg(build_id)}"))

    async def builds(self) -> _List[Build]:
        """The caller's builds, newest first."""
        value = await self._json("GET", "/v1/builds")
        return [Build.from_json(b) for b in _core.list_field(value, "builds")]

    async def build_log(self, build_id: str, *, start: int = 0) -> str:
        """A build's log from byte ``start`` on."""
        resp = await self.request(
            "GET", f"/v1/builds/{_core.seg(build_id)}/log", params={"from": str(int(start))}
        )
        return resp.content.decode("utf-8", errors="replace")

    async def delete_template(self, name: str, version: str) -> None:
        """Deletes a template version."""
        await self.request("DELETE", f"/v1/templates/{_core.seg(name)}/{_core.seg(version)}")

    async def audit(
        self,
        *,
        sandbox: str | None = None,
        operation: str | None = None,
        since_unix_ms: int | None = None,
        limit: int | None = None,
    ) -> _List[AuditEvent]:
        """Audit events, newest first (see :meth:`space_sdk.Space.audit`)."""
        params: dict[str, str] = {}
        if sandbox is not None:
            params["sandbox"] = sandbox
        if operation is not None:
            params["operation"] = operation
        if since_unix_ms is not None:
            params["since_unix_ms"] = str(int(since_unix_ms))
        if limit is not None:
            params["limit"] = str(int(limit))
        value = await self._json("GET", "/v1/audit", params=params)
        return [AuditEvent.from_json(e) for e in _core.list_field(value, "events")]


# One default client per event loop: an httpx.AsyncClient must not cross loops.
_defaults: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncSpace] = (
    weakref.WeakKeyDictionary()
)


def default_async_client() -> AsyncSpace:
    """The client used when an :class:`AsyncSandbox` call gets no ``client=``: one
    :class:`AsyncSpace` per running event loop, configured from the environment."""
    loop = asyncio.get_running_loop()
    client = _defaults.get(loop)
    if client is None:
        client = AsyncSpace()
        _defaults[loop] = client
    return client


async def _call(callback: AsyncOutputCallback | None, data: bytes) -> None:
    if callback is None:
        return
    ret = callback(data)
    if inspect.isawaitable(ret):
        await ret


class AsyncFiles:
    """The file system of one sandbox (``sandbox.files``), as coroutines."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sb = sandbox

    def _path(self, *rest: str) -> str:
        return _core.sandbox_path(self._sb.id, "files", *rest)

    async def read(self, path: str) -> bytes:
        """The whole contents of the file at ``path``."""
        resp = await self._sb.client.request("GET", self._path(), params={"path": path})
        return resp.content

    async def read_text(self, path: str, encoding: str = "utf-8") -> str:
        """The contents of the file at ``path`` as text."""
        return (await self.read(path)).decode(encoding)

    async def download(self, path: str, dest: IO[bytes]) -> int:
        """Streams the file at ``path`` into the binary file ``dest``; returns the byte count."""
        client = self._sb.client
        req = client._build("GET", self._path(), params={"path": path})
        resp = await client._send(req, stream=True)
        total = 0
        try:
            async for chunk in resp.aiter_bytes():
                dest.write(chunk)
                total += len(chunk)
        except httpx.TransportError as e:
            raise SpaceConnectionError(f"download of {path} broke off: {e}") from None
        finally:
            await resp.aclose()
        return total

    async def write(
        self, path: str, data: bytes | str | IO[bytes], mode: int | str | None = None
    ) -> FileStat:
        """Replaces the file at ``path`` (atomically) with ``data``: bytes, text (written as
        UTF-8) or a binary file object, which is streamed. ``mode`` is like ``0o644``."""
        content: bytes | AsyncIterator[bytes]
        if isinstance(data, str):
            content = data.encode("utf-8")
        elif isinstance(data, (bytes, bytearray, memoryview)):
            content = bytes(data)
        elif hasattr(data, "read"):
            content = _file_chunks(data)
        else:
            raise TypeError("data should be bytes, str or a binary file object")
        value = await self._sb.client._json(
            "PUT",
            self._path(),
            params=_core.upload_params(path, mode),
            content=content,
            headers={"Content-Type": "application/octet-stream"},
        )
        return FileStat.from_json(value)

    async def list(self, path: str) -> _List[DirEntry]:
        """The entries of the directory ``path``, sorted by name."""
        value = await self._sb.client._json("GET", self._path("list"), params={"path": path})
        return [DirEntry.from_json(e) for e in _core.list_field(value, "entries")]

    async def stat(self, path: str) -> FileStat:
        """What ``lstat`` says about ``path``."""
        return FileStat.from_json(
            await self._sb.client._json("GET", self._path("stat"), params={"path": path})
        )

    async def exists(self, path: str) -> bool:
        """Whether ``path`` exists (a dangling symlink counts)."""
        try:
            await self.stat(path)
        except NotFound:
            return False
        return True

    async def mkdir(self, path: str, parents: bool = True) -> FileStat:
        """Makes the directory ``path`` (and its missing parents, unless ``parents=False``)."""
        return FileStat.from_json(
            await self._sb.client._json(
                "POST", self._path("mkdir"), json={"path": path, "parents": parents}
            )
        )

    async def remove(self, path: str, recursive: bool = False) -> None:
        """Removes the file or empty directory ``path``; with ``recursive``, a whole tree."""
        params = {"path": path}
        if recursive:
            params["recursive"] = "true"
        await self._sb.client.request("DELETE", self._path(), params=params)

    async def rename(self, src: str, dst: str) -> FileStat:
        """Renames ``src`` to ``dst``; returns the stat of ``dst``."""
        return FileStat.from_json(
            await self._sb.client._json("POST", self._path("rename"), json={"from": src, "to": dst})
        )


class AsyncSandbox:
    """One sandbox, for asyncio code: the calls of :class:`~space_sdk.Sandbox` as
    coroutines. ``async with`` kills it when the block ends."""

    def __init__(self, client: AsyncSpace, info: SandboxInfo) -> None:
        self.client = client
        self._info = info
        self.files = AsyncFiles(self)

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
        return f"AsyncSandbox(id={self.id!r}, state={self._info.state!r})"

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._info.state == "terminated":
            return
        try:
            await self.kill()
        except (NotFound, IllegalState):
            pass
        except SpaceError:
            if exc_type is None:
                raise

    # -- finding and making sandboxes ----------------------------------------------------

    @classmethod
    async def create(
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
        client: AsyncSpace | None = None,
    ) -> AsyncSandbox:
        """Creates a running sandbox from ``template`` (see :meth:`space_sdk.Sandbox.create`)."""
        client = client or default_async_client()
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
        value = await client._json("POST", "/v1/sandboxes", json=body)
        return cls(client, SandboxInfo.from_json(value))

    @classmethod
    async def connect(cls, sandbox_id: str, *, client: AsyncSpace | None = None) -> AsyncSandbox:
        """The existing sandbox ``sandbox_id`` (``NotFound`` if the caller's tenant has none)."""
        client = client or default_async_client()
        value = await client._json("GET", _core.sandbox_path(sandbox_id))
        return cls(client, SandboxInfo.from_json(value))

    @classmethod
    async def list(
        cls,
        state: str | None = None,
        metadata: Mapping[str, str] | None = None,
        *,
        template: str | None = None,
        client: AsyncSpace | None = None,
    ) -> _List[AsyncSandbox]:
        """The caller's sandboxes, newest first, filtered by state, template and metadata."""
        client = client or default_async_client()
        value = await client._json(
            "GET", "/v1/sandboxes", params=_core.list_params(state, template, metadata)
        )
        return [cls(client, SandboxInfo.from_json(s)) for s in _core.list_field(value, "sandboxes")]

    # -- inspection ----------------------------------------------------------------------

    def _update(self, value: Any) -> SandboxInfo:
        self._info = SandboxInfo.from_json(value)
        return self._info

    async def _post(self, action: str, json: Any = None) -> SandboxInfo:
        return self._update(
            await self.client._json("POST", _core.sandbox_path(self.id, action), json=json)
        )

    async def info(self) -> SandboxInfo:
        """Asks the server for the sandbox's current description."""
        return self._update(await self.client._json("GET", _core.sandbox_path(self.id)))

    async def logs(self, tail_bytes: int | None = None) -> str:
        """The end of the serial console (64 KiB unless ``tail_bytes`` says otherwise)."""
        params = {} if tail_bytes is None else {"tail_bytes": str(int(tail_bytes))}
        resp = await self.client.request("GET", _core.sandbox_path(self.id, "logs"), params=params)
        return resp.content.decode("utf-8", errors="replace")

    # -- processes -----------------------------------------------------------------------

    async def exec(
        self,
        cmd: str | Sequence[str] | None = None,
        *,
        shell: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | str | None = None,
        timeout: float | None = None,
        on_stdout: AsyncOutputCallback | None = None,
        on_stderr: AsyncOutputCallback | None = None,
    ) -> ExecResult:
        """Runs a process and waits for it to end (see :meth:`space_sdk.Sandbox.exec`);
        callbacks may be coroutine functions."""
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
        resp = await self.client._send(req, stream=True)
        try:
            async for chunk in resp.aiter_bytes():
                for kind, data in decoder.feed(chunk):
                    await _call(on_stdout if kind == "stdout" else on_stderr, data)
                if decoder.done:
                    break
        except httpx.TimeoutException:
            raise SpaceConnectionError(f"exec in {self.id}: the stream timed out") from None
        except httpx.TransportError as e:
            raise SpaceConnectionError(f"exec in {self.id}: the stream broke: {e}") from None
        finally:
            await resp.aclose()
        return decoder.finish()

    # -- lifecycle -----------------------------------------------------------------------

    async def pause(self) -> SandboxInfo:
        """Stops the vCPUs; memory stays."""
        return await self._post("pause")

    async def resume(self) -> SandboxInfo:
        """Lets a paused sandbox run again."""
        return await self._post("resume")

    async def suspend(self) -> SandboxInfo:
        """Saves the whole VM (memory and disk) and frees its resources."""
        return await self._post("suspend")

    async def restore(self) -> SandboxInfo:
        """Brings a suspended sandbox back, running."""
        return await self._post("restore")

    async def fork(self) -> AsyncSandbox:
        """A new running sandbox that starts as a copy of this one (memory and disk)."""
        value = await self.client._json("POST", _core.sandbox_path(self.id, "fork"))
        return AsyncSandbox(self.client, SandboxInfo.from_json(value))

    async def save_as_template(self, name: str, version: str | None = None) -> Template:
        """:meth:`space_sdk.Sandbox.save_as_template`, awaited."""
        body: dict[str, Any] = {"name": name}
        if version is not None:
            body["version"] = version
        value = await self.client._json(
            "POST", _core.sandbox_path(self.id, "template"), json=body
        )
        return Template.from_json(value)

    async def kill(self) -> SandboxInfo:
        """Stops the VM for good; the record and snapshots stay."""
        return self._update(await self.client._json("DELETE", _core.sandbox_path(self.id)))

    async def snapshot(self, full: bool = False) -> Snapshot:
        """Takes a snapshot: of the disk, or with ``full=True`` of memory and disk."""
        value = await self.client._json(
            "POST",
            _core.sandbox_path(self.id, "snapshots"),
            json={"kind": "full" if full else "disk"},
        )
        return Snapshot.from_json(value)

    async def snapshots(self) -> _List[Snapshot]:
        """The sandbox's snapshots, oldest first."""
        value = await self.client._json("GET", _core.sandbox_path(self.id, "snapshots"))
        return [Snapshot.from_json(s) for s in _core.list_field(value, "snapshots")]

    async def rollback(self, snapshot: Snapshot | str) -> SandboxInfo:
        """Brings the sandbox back to ``snapshot`` (a :class:`Snapshot` or its id)."""
        snapshot_id = snapshot.id if isinstance(snapshot, Snapshot) else snapshot
        return await self._post("rollback", {"snapshot": snapshot_id})

    async def set_timeouts(
        self,
        idle: Timeout = None,
        max_lifetime: Timeout = None,
        action: str | None = None,
    ) -> SandboxInfo:
        """Changes the timeouts (see :meth:`space_sdk.Sandbox.set_timeouts`)."""
        body = _core.timeouts_body(idle, max_lifetime, action)
        return self._update(
            await self.client._json("PUT", _core.sandbox_path(self.id, "timeouts"), json=body)
        )
