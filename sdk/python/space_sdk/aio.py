# [async]
"""The asynchronous client: :class:`AsyncSpace` (a connection to a server),
:class:`AsyncSandbox` and its :class:`AsyncFiles`, the calls of the synchronous client as
coroutines.

This module is the source of ``client.py``, the synchronous client:
``scripts/gen_sync.py`` writes that one from this one (see ``docs/sdk-python.md``).
"""
# [sync]
# """The synchronous client: :class:`Space` (a connection to a server), :class:`Sandbox` and
# its :class:`Files`."""
# [end]

from __future__ import annotations

# [async]
import asyncio
import codecs
import inspect
import os
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence

# [sync]
# import codecs
# import os
# import threading
# import time
# from collections.abc import Callable, Iterator, Mapping, Sequence
# [end]
from dataclasses import replace
from types import TracebackType
from typing import IO, Any

import httpx

from . import _core
from ._core import Timeout
from ._version import __version__
from .errors import (
    ConfigError,
    IllegalState,
    NotFound,
    SpaceConnectionError,
    SpaceError,
    error_from_response,
)
from .volumes import AsyncVolume
from .models import (
    AuditEvent,
    Build,
    DirEntry,
    EgressPolicy,
    ExecResult,
    FileStat,
    Health,
    JoinToken,
    Key,
    MetricSample,
    VolumeInfo,
    KeyCreated,
    MasterKey,
    Node,
    NodeList,
    Port,
    PortExposed,
    BrowserFill,
    BrowserSession,
    SandboxInfo,
    Secret,
    Snapshot,
    Template,
    Tenant,
    TenantCreated,
    Upload,
    WatchEvent,
)

__all__ = ["AsyncFiles", "AsyncSandbox", "AsyncSpace", "AsyncWatch", "default_async_client"]

_List = list  # `AsyncSandbox.list` and `AsyncFiles.list` shadow the builtin in their classes.

# How much of an error answer is read before giving up on the rest.
_MAX_ERROR_BODY = 64 * 1024

_USER_AGENT = f"space-sdk-python/{__version__}"

# [async]
AsyncOutputCallback = Callable[[bytes], "Awaitable[object] | object"]
"""Called with each chunk of output as it arrives; may be a plain function or a coroutine
function (which is awaited before the next chunk is read)."""
# [sync]
# OutputCallback = Callable[[bytes], object]
# """Called with each chunk of output as it arrives."""
# [end]


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
        # [async]
        if inspect.isawaitable(chunk):  # an async file object (aiofiles and the like)
            chunk = await chunk
        # [end]
        if not chunk:
            return
        if isinstance(chunk, str):
            raise TypeError("files.write needs a binary file (opened with 'rb')")
        yield bytes(chunk)


def _key_id(key: Key | str) -> str:
    return key.id if isinstance(key, Key) else key


class AsyncSpace:
    """A connection to a space server.

    ``url`` and ``api_key`` come from the arguments, else from ``SPACE_URL`` and
    ``SPACE_API_KEY``, else from the CLI's configuration file (``$SPACE_CONFIG``, else
    ``$XDG_CONFIG_HOME/space/config.json``, else ``~/.config/space/config.json``, holding
    ``{"url": ..., "api_key": ...}``). ``timeout`` is in seconds per API call; exec streams
    wait as long as the process runs. Close it with :meth:`aclose`, or use ``async with``.
    """

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
        headers = {"Accept": "application/json", "User-Agent": _USER_AGENT}
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

    async def _send(
        self, request: httpx.Request, stream: bool = False, check: bool = True
    ) -> httpx.Response:
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
        if check and resp.status_code >= 400:
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
        """Sends one request to ``path`` (such as ``/v1/templates``) and returns the answer;
        an error answer raises the matching :class:`~space_sdk.SpaceError`."""
        req = self._build(
            method, path, params=params, json=json, content=content, headers=headers, auth=auth
        )
        try:
            return await self._send(req)
        except httpx.StreamError as e:  # an upload iterator that cannot be replayed, etc.
            raise SpaceConnectionError(f"{method} {path}: {e}") from None

    async def _json(self, method: str, path: str, **kw: Any) -> Any:
        resp = await self.request(method, path, **kw)
        return _core.json_body(resp.status_code, resp.content)

    # -- server-wide calls ---------------------------------------------------------------

    async def health(self) -> Health:
        """``GET /v1/health`` (no key needed): ``status``, ``version``, ``accelerator``."""
        return Health.from_json(await self._json("GET", "/v1/health", auth=False))

    async def openapi(self) -> dict[str, Any]:
        """The server's OpenAPI document (no key needed)."""
        value = await self._json("GET", "/v1/openapi.json", auth=False)
        if not isinstance(value, dict):
            raise SpaceError("invalid_response", "the OpenAPI document is not an object", 200)
        return value

    async def metrics(self) -> str:
        """The server's Prometheus metrics, as text (no key needed)."""
        resp = await self.request("GET", "/metrics", auth=False, headers={"Accept": "text/plain"})
        return resp.content.decode("utf-8", errors="replace")

    async def templates(self) -> _List[Template]:
        """The templates sandboxes can be created from: the public ones and the caller's."""
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
        return Upload.from_json(_core.json_body(resp.status_code, resp.content)).upload

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
        start_timeout: float | None = None,
        egress: EgressPolicy | Mapping[str, Any] | None = None,
        vcpus: int | None = None,
        memory_mib: int | None = None,
        disk_mib: int | None = None,
        version: str | None = None,
        wait: bool = True,
        on_log: Callable[[str], None] | None = None,
    ) -> Build:
        """Builds a template from one source: a stock ``image``, a ``dockerfile`` (a path; its
        ``context`` defaults to the file's directory), an image reference ``from_image``, or
        an OCI/Docker archive file ``from_archive``. ``start_timeout`` (seconds) bounds how
        long the ``start`` command may take to be ready; ``egress`` is what a Dockerfile's
        steps may reach. With ``wait`` (the default) it returns when the build ended,
        passing the log to ``on_log`` as it comes, and raises
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
            start_timeout=start_timeout,
            egress=egress,
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
        """Waits for a build to end, passing its log to ``on_log`` as it comes; raises
        :class:`~space_sdk.SpaceError` (``build_failed``) if it failed."""
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
        """The caller's builds (an admin's: everyone's), newest first."""
        value = await self._json("GET", "/v1/builds")
        return [Build.from_json(b) for b in _core.list_field(value, "builds")]

    async def build_log(
        self,
        build_id: str,
        *,
        start: int = 0,
        follow: bool = False,
        on_log: Callable[[str], None] | None = None,
    ) -> str:
        """A build's log from byte ``start`` on. With ``follow``, the log is streamed until
        the build ends, each piece passed to ``on_log`` as it arrives; the whole is returned
        either way."""
        path = f"/v1/builds/{_core.seg(build_id)}/log"
        params = {"from": str(_core.count(start, "start"))}
        if not follow:
            resp = await self.request("GET", path, params=params)
            text = resp.content.decode("utf-8", errors="replace")
            if on_log is not None and text:
                on_log(text)
            return text
        params["follow"] = "true"
        req = self._build(
            "GET",
            path,
            params=params,
            headers={"Accept": "text/plain"},
            timeout=httpx.Timeout(self.timeout, read=None),
        )
        resp = await self._send(req, stream=True)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        parts: _List[str] = []
        try:
            async for chunk in resp.aiter_bytes():
                text = decoder.decode(chunk)
                if text:
                    parts.append(text)
                    if on_log is not None:
                        on_log(text)
        except httpx.TransportError as e:
            raise SpaceConnectionError(f"the log of build {build_id} broke off: {e}") from None
        finally:
            await resp.aclose()
        tail = decoder.decode(b"", final=True)
        if tail:
            parts.append(tail)
            if on_log is not None:
                on_log(tail)
        return "".join(parts)

    async def delete_template(self, name: str, version: str) -> None:
        """Deletes a template version (an admin's, or the owning tenant's)."""
        await self.request("DELETE", f"/v1/templates/{_core.seg(name)}/{_core.seg(version)}")

    async def audit(
        self,
        *,
        sandbox: str | None = None,
        operation: str | None = None,
        since_unix_ms: int | None = None,
        limit: int | None = None,
        tenant: str | None = None,
    ) -> _List[AuditEvent]:
        """Audit events, newest first: the caller's tenant's (every tenant's for an admin
        key, or one tenant's with ``tenant=``), filtered by sandbox id, operation and time."""
        params = _core.audit_params(sandbox, operation, since_unix_ms, limit, tenant)
        value = await self._json("GET", "/v1/audit", params=params)
        return [AuditEvent.from_json(e) for e in _core.list_field(value, "events")]

    # -- the credentials vault -----------------------------------------------------------

    async def secrets(self) -> _List[Secret]:
        """The secrets of the caller's tenant, by name (never their values)."""
        value = await self._json("GET", "/v1/secrets")
        return [Secret.from_json(s) for s in _core.list_field(value, "secrets")]

    async def set_secret(
        self, name: str, value: str | bytes, hosts: Sequence[str], *, kind: str = "value"
    ) -> Secret:
        """Stores the secret ``name`` (``[A-Z_][A-Z0-9_]*``) with ``value``, which the egress
        gateway may send to ``hosts`` (egress rules) only; replaces one of that name (its
        creation time stays). Sandboxes created with ``secrets=[name]`` see a placeholder.
        ``kind="totp"``: ``value`` is a one-time password seed (base32 or an otpauth URI) and
        the gateway sends the code of the moment."""
        body = _core.secret_body(value, hosts, kind)
        return Secret.from_json(
            await self._json("PUT", f"/v1/secrets/{_core.seg(name)}", json=body)
        )

    async def delete_secret(self, name: str) -> None:
        """Deletes a secret; sandboxes bound to it keep the placeholder, which no longer
        stands for anything."""
        await self.request("DELETE", f"/v1/secrets/{_core.seg(name)}")

    # -- volumes ----------------------------------------------------------------------

    async def create_volume(self, name: str, size_mib: int | None = None) -> AsyncVolume:
        """Makes a volume of the tenant (``size_mib`` defaults to 10 GiB)."""
        body: dict[str, Any] = {"name": name}
        if size_mib is not None:
            body["size_mib"] = int(size_mib)
        value = await self._json("POST", "/v1/volumes", json=body)
        return AsyncVolume(self, VolumeInfo.from_json(value))

    async def volumes(self) -> _List[AsyncVolume]:
        """The tenant's volumes, by name."""
        value = await self._json("GET", "/v1/volumes")
        return [AsyncVolume(self, VolumeInfo.from_json(v)) for v in _core.list_field(value, "volumes")]

    async def volume(self, name: str) -> AsyncVolume:
        """The tenant's volume ``name``."""
        value = await self._json("GET", f"/v1/volumes/{_core.seg(name)}")
        return AsyncVolume(self, VolumeInfo.from_json(value))

    async def delete_volume(self, name: str) -> None:
        """Deletes volume ``name`` and its files; refused while a sandbox mounts it."""
        await self.request("DELETE", f"/v1/volumes/{_core.seg(name)}")

    # -- tenants and keys (admin) --------------------------------------------------------

    async def tenants(self) -> _List[Tenant]:
        """Every tenant (admin)."""
        value = await self._json("GET", "/v1/tenants")
        return [Tenant.from_json(t) for t in _core.list_field(value, "tenants")]

    async def create_tenant(
        self,
        name: str,
        *,
        max_sandboxes: int | None = None,
        max_vcpus: int | None = None,
        max_memory_mib: int | None = None,
        max_suspended: Timeout = None,
        max_volume_mib: int | None = None,
    ) -> TenantCreated:
        """Creates a tenant (admin) and its first, non-admin key. Quotas left out take the
        server's defaults; ``max_suspended`` is seconds a sandbox may stay suspended, or
        :data:`~space_sdk.NEVER`; ``max_volume_mib`` bounds the sizes of its volumes together."""
        body: dict[str, Any] = {"name": name}
        quotas = _core.quotas_body(
            max_sandboxes, max_vcpus, max_memory_mib, max_suspended, max_volume_mib
        )
        if quotas:
            body["quotas"] = quotas
        return TenantCreated.from_json(await self._json("POST", "/v1/tenants", json=body))

    async def update_tenant(
        self,
        name: str,
        *,
        max_sandboxes: int | None = None,
        max_vcpus: int | None = None,
        max_memory_mib: int | None = None,
        max_suspended: Timeout = None,
        max_volume_mib: int | None = None,
    ) -> Tenant:
        """Changes a tenant's quotas (admin); those left out keep their value,
        ``max_suspended=NEVER`` lifts that limit."""
        quotas = _core.quotas_body(
            max_sandboxes, max_vcpus, max_memory_mib, max_suspended, max_volume_mib
        )
        return Tenant.from_json(
            await self._json("PATCH", f"/v1/tenants/{_core.seg(name)}", json={"quotas": quotas})
        )

    async def keys(self, tenant: str) -> _List[Key]:
        """The keys of ``tenant`` (admin), revoked ones included."""
        value = await self._json("GET", f"/v1/tenants/{_core.seg(tenant)}/keys")
        return [Key.from_json(k) for k in _core.list_field(value, "keys")]

    async def create_key(
        self, tenant: str, *, admin: bool = False, label: str | None = None
    ) -> KeyCreated:
        """Makes a key for ``tenant`` (admin); ``key`` of the answer is the whole key, shown
        only this once."""
        if not isinstance(admin, bool):
            raise _core.invalid(f"admin should be True or False, not {admin!r}")
        body: dict[str, Any] = {"admin": admin}
        if label is not None:
            body["label"] = label
        value = await self._json("POST", f"/v1/tenants/{_core.seg(tenant)}/keys", json=body)
        return KeyCreated.from_json(value)

    async def revoke_key(self, key: Key | str) -> None:
        """Revokes a key (a :class:`~space_sdk.Key` or its id) for good (admin)."""
        await self.request("DELETE", f"/v1/keys/{_core.seg(_key_id(key))}")

    async def master_key(self, tenant: str) -> MasterKey:
        """Which master key wraps the archive key of ``tenant`` (admin)."""
        value = await self._json("GET", f"/v1/tenants/{_core.seg(tenant)}/master-key")
        return MasterKey.from_json(value)

    async def set_master_key(
        self,
        tenant: str,
        provider: str = "deployment",
        *,
        key_id: str | None = None,
        region: str | None = None,
        endpoint: str | None = None,
    ) -> MasterKey:
        """Moves the archive key of ``tenant`` onto another master key (admin):
        ``"deployment"``, or ``"kms"`` with ``key_id`` and ``region`` (and ``endpoint`` for a
        KMS-compatible service). A KMS key that refuses raises
        :class:`~space_sdk.Forbidden` (``key_unavailable``)."""
        body = _core.master_key_body(provider, key_id, region, endpoint)
        value = await self._json("PUT", f"/v1/tenants/{_core.seg(tenant)}/master-key", json=body)
        return MasterKey.from_json(value)

    # -- cluster (admin; a single-node server answers NotFound, not_a_cluster) ------------

    async def nodes(self) -> NodeList:
        """The nodes of the cluster, with its lease and grace times."""
        return NodeList.from_json(await self._json("GET", "/v1/nodes"))

    async def drain_node(self, node_id: str) -> Node:
        """Places no new sandbox on the node and moves its sandboxes to other nodes."""
        return Node.from_json(await self._json("POST", f"/v1/nodes/{_core.seg(node_id)}/drain"))

    async def remove_node(self, node_id: str) -> Node:
        """Takes the node out of the cluster; its heartbeats and rejoins are refused."""
        return Node.from_json(await self._json("DELETE", f"/v1/nodes/{_core.seg(node_id)}"))

    async def create_join_token(self, ttl: int | None = None) -> JoinToken:
        """A one-time token a node joins the cluster with, valid ``ttl`` seconds (an hour
        by default, a week at most)."""
        body: dict[str, Any] = {}
        if ttl is not None:
            if isinstance(ttl, bool) or not isinstance(ttl, int) or ttl <= 0:
                raise _core.invalid(f"ttl is a positive whole number of seconds, not {ttl!r}")
            body["ttl_s"] = ttl
        return JoinToken.from_json(await self._json("POST", "/v1/cluster/join-tokens", json=body))


# [async]
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


# [sync]
# _default_lock = threading.Lock()
# _default: Space | None = None
#
#
# def default_client() -> Space:
#     """The client used when a :class:`Sandbox` call gets no ``client=``: one :class:`Space`
#     configured from the environment, made on first use."""
#     global _default
#     with _default_lock:
#         if _default is None:
#             _default = Space()
#         return _default
#
#
# def _call(callback: OutputCallback | None, data: bytes) -> None:
#     if callback is not None:
#         callback(data)
#
#
# [end]
class AsyncWatch:
    """The changes under a watched path, as they happen: ``async with
    sandbox.files.watch(path) as w:``, then ``async for event in w``. Leaving the block
    ends the watch. ``timeout`` (seconds) bounds the wait for each event
    (:class:`~space_sdk.SpaceConnectionError` when it passes); ``None`` waits for ever."""

    def __init__(
        self, files: AsyncFiles, path: str, recursive: bool, timeout: float | None
    ) -> None:
        self.path = path
        self.recursive = recursive
        self.timeout = timeout
        self._files = files
        self._resp: httpx.Response | None = None
        self._chunks: AsyncIterator[bytes] | None = None
        self._decoder = _core.WatchDecoder()
        self._pending: _List[WatchEvent] = []
        self._ended = False

    def __repr__(self) -> str:
        return f"AsyncWatch(path={self.path!r}, recursive={self.recursive!r})"

    async def start(self) -> AsyncWatch:
        """Starts the watch (``async with`` does): once this returns, changes are seen."""
        if self._resp is not None or self._ended:
            raise _core.invalid("this watch has been started already")
        client = self._files._sb.client
        params = {"path": self.path}
        if self.recursive:
            params["recursive"] = "true"
        req = client._build(
            "GET",
            self._files._path("watch"),
            params=params,
            headers={"Accept": "application/x-ndjson"},
            timeout=httpx.Timeout(client.timeout, read=self.timeout),
        )
        self._resp = await client._send(req, stream=True)
        self._chunks = self._resp.aiter_bytes()
        return self

    async def aclose(self) -> None:
        """Ends the watch."""
        self._ended = True
        if self._resp is not None:
            await self._resp.aclose()

    async def __aenter__(self) -> AsyncWatch:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __aiter__(self) -> AsyncWatch:
        return self

    async def __anext__(self) -> WatchEvent:
        while not self._pending:
            if self._ended:
                raise StopAsyncIteration
            if self._chunks is None:
                raise _core.invalid(
                    "start the watch first: call start(), or enter its async with block"
                )
            try:
                chunk = await self._chunks.__anext__()
            except StopAsyncIteration:
                self._ended = True
                self._pending.extend(self._decoder.finish())
                continue
            except httpx.TimeoutException:
                raise SpaceConnectionError(
                    f"no change under {self.path} within {self.timeout} s"
                ) from None
            except httpx.TransportError as e:
                raise SpaceConnectionError(f"the watch of {self.path} broke off: {e}") from None
            self._pending.extend(self._decoder.feed(chunk))
        return self._pending.pop(0)


class AsyncFiles:
    """The file system of one sandbox (``sandbox.files``). Paths are absolute guest paths."""

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

    def watch(
        self, path: str, recursive: bool = False, *, timeout: float | None = None
    ) -> AsyncWatch:
        """Watches ``path`` (a directory, and its subdirectories with ``recursive``): use the
        answer with ``async with`` and ``async for`` (see :class:`AsyncWatch`)."""
        return AsyncWatch(self, path, recursive, timeout)


class AsyncSandbox:
    """One sandbox: a microVM with its own kernel, disk and processes.

    Make one with :meth:`create`, find one with :meth:`connect` or :meth:`list`. Used as
    ``async with sandbox:``, it is killed when the block ends.
    """

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
            pass  # gone already
        except SpaceError:
            if exc_type is None:
                raise
            # An error is already on its way out; it matters more than this one.

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
        egress: EgressPolicy | Mapping[str, Any] | None = None,
        secrets: Sequence[str] | None = None,
        auto_resume: bool | None = None,
        volumes: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        client: AsyncSpace | None = None,
    ) -> AsyncSandbox:
        """Creates a running sandbox from ``template``.

        ``idle_timeout`` and ``max_lifetime`` are seconds, or :data:`~space_sdk.NEVER`;
        ``None`` takes the server's default (idle 15 minutes, no lifetime limit).
        ``timeout_action`` is ``"suspend"`` (the default) or ``"kill"``. ``egress`` is the
        policy of its connections (default: allow all), ``secrets`` names secrets of the
        vault to bind (each becomes an environment variable holding a placeholder), and
        ``auto_resume=False`` makes guest access to a paused or suspended sandbox an
        :class:`~space_sdk.IllegalState` instead of waking it. ``volumes`` mounts volumes of
        the tenant: ``{"/data": "name"}``, or ``{"/data": ("name", "ro")}`` read-only. With
        ``idempotency_key``
        the create happens at most once per key (for 24 hours): sent again, it answers the
        sandbox the first one made.
        """
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
            egress=egress,
            secrets=secrets,
            auto_resume=auto_resume,
            volumes=volumes,
        )
        headers = _core.idempotency_headers(idempotency_key)
        value = await client._json("POST", "/v1/sandboxes", json=body, headers=headers)
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
        """The caller's sandboxes, newest first, filtered by state, template and metadata
        (all must match). Terminated ones are listed only with ``state="terminated"``."""
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

    async def metrics(
        self, start: int | None = None, end: int | None = None
    ) -> _List[MetricSample]:
        """The sandbox's resource samples, oldest first: one every few seconds while it runs,
        older ones merged into longer spans. ``start`` and ``end`` (ms since the Unix epoch)
        bound when a sample's span ends."""
        params = {}
        if start is not None:
            params["start"] = str(int(start))
        if end is not None:
            params["end"] = str(int(end))
        value = await self.client._json("GET", _core.sandbox_path(self.id, "metrics"), params=params)
        return [MetricSample.from_json(s) for s in _core.list_field(value, "samples")]

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
        """Stops the vCPUs; memory stays. Guest access resumes it (unless created with
        ``auto_resume=False``), as does :meth:`resume`."""
        return await self._post("pause")

    async def resume(self) -> SandboxInfo:
        """Lets a paused sandbox run again."""
        return await self._post("resume")

    async def suspend(self) -> SandboxInfo:
        """Saves the whole VM (memory and disk) and frees its resources."""
        return await self._post("suspend")

    async def restore(self) -> SandboxInfo:
        """Brings a suspended sandbox back, running, as it was when suspended."""
        return await self._post("restore")

    async def fork(self) -> AsyncSandbox:
        """A new running sandbox that starts as a copy of this one (memory and disk), with
        its egress policy and secret bindings."""
        value = await self.client._json("POST", _core.sandbox_path(self.id, "fork"))
        return AsyncSandbox(self.client, SandboxInfo.from_json(value))

    async def save_as_template(
        self, name: str, version: str | None = None, memory: bool = True
    ) -> Template:
        """A template of this sandbox as it is now (private to the caller's tenant): with
        ``memory``, its processes included; with ``memory=False``, its disk alone, booted
        afresh by each new sandbox."""
        body: dict[str, Any] = {"name": name}
        if version is not None:
            body["version"] = version
        if not memory:
            body["memory"] = False
        value = await self.client._json("POST", _core.sandbox_path(self.id, "template"), json=body)
        return Template.from_json(value)

    async def kill(self) -> SandboxInfo:
        """Stops the VM for good and revokes its ingress URLs; the record and snapshots stay."""
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
        """Changes the timeouts: seconds, or :data:`~space_sdk.NEVER`; ``None`` keeps the
        current value. ``action`` is ``"suspend"`` or ``"kill"``."""
        body = _core.timeouts_body(idle, max_lifetime, action)
        return self._update(
            await self.client._json("PUT", _core.sandbox_path(self.id, "timeouts"), json=body)
        )

    # -- network -------------------------------------------------------------------------

    async def egress(self) -> EgressPolicy:
        """The sandbox's egress policy, its rules in canonical form."""
        value = await self.client._json("GET", _core.sandbox_path(self.id, "egress"))
        return EgressPolicy.from_json(value)

    async def set_egress(
        self,
        policy: EgressPolicy | Mapping[str, Any] | None = None,
        *,
        default: str | None = None,
        allow: Sequence[str] | None = None,
        deny: Sequence[str] | None = None,
    ) -> EgressPolicy:
        """Replaces the egress policy: ``policy`` whole, or built from ``default``
        (``"allow"`` unless given), ``allow`` and ``deny`` (none unless given). New
        connections follow it at once; returns the policy in effect."""
        body = _core.egress_update(policy, default, allow, deny)
        value = await self.client._json("PUT", _core.sandbox_path(self.id, "egress"), json=body)
        applied = EgressPolicy.from_json(value)
        self._info = replace(self._info, egress=applied)
        return applied

    async def browser(self) -> BrowserSession:
        """Starts the sandbox's Chromium (on the desktop's display in a template with X, headless
        otherwise) unless it runs, and answers its DevTools URL (``cdp_url``, for Playwright's
        ``connect_over_cdp``) and its live view (``live_url``); their tokens last an hour."""
        value = await self.client._json("POST", _core.sandbox_path(self.id, "browser"))
        return BrowserSession.from_json(value)

    async def fill_credential(
        self, secret: str, selector: str, *, mode: str = "placeholder"
    ) -> BrowserFill:
        """Types secret ``secret`` into the field ``selector`` of the page in front of the
        sandbox's browser: its placeholder by default (the gateway puts the value in when the
        form goes to a host the secret is bound to); ``mode="value"`` types the value itself,
        only on an https page of a bound host. Answers what was filled, never the value."""
        if mode not in ("placeholder", "value"):
            raise _core.invalid("mode is 'placeholder' or 'value'")
        body = {"secret": secret, "selector": selector, "mode": mode}
        value = await self.client._json(
            "POST", _core.sandbox_path(self.id, "browser") + "/fill", json=body
        )
        return BrowserFill.from_json(value)

    async def expose(self, port: int) -> PortExposed:
        """Exposes ``port`` at a public ingress URL (``url`` of the answer, which needs no
        key and is shown only now); exposing it again makes a new URL and revokes the old."""
        value = await self.client._json(
            "POST", _core.sandbox_path(self.id, "ports"), json={"port": _core.port_number(port)}
        )
        return PortExposed.from_json(value)

    async def ports(self) -> _List[Port]:
        """The exposed ports (without their URLs)."""
        value = await self.client._json("GET", _core.sandbox_path(self.id, "ports"))
        return [Port.from_json(p) for p in _core.list_field(value, "ports")]

    async def unexpose(self, port: int) -> None:
        """Revokes the ingress URL of ``port``."""
        await self.client.request(
            "DELETE", _core.sandbox_path(self.id, "ports", str(_core.port_number(port)))
        )

    async def proxy(
        self,
        port: int,
        path: str = "/",
        *,
        method: str = "GET",
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        content: bytes | str | None = None,
        json: Any = None,
    ) -> httpx.Response:
        """Sends an HTTP request to ``port`` inside the sandbox (exposed or not) through the
        authenticated port proxy, and returns the app's answer whatever its status. The API
        key is not passed on. Errors of the proxy itself raise: no such sandbox
        (:class:`~space_sdk.NotFound`), a state that refuses it
        (:class:`~space_sdk.IllegalState`), nothing listening
        (:class:`~space_sdk.GuestError`)."""
        if method.upper() not in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"):
            raise _core.invalid(f"the port proxy does not pass {method!r} requests")
        send_headers = {"Accept": "*/*"}
        send_headers.update(headers or {})
        req = self.client._build(
            method.upper(),
            _core.proxy_path(self.id, port, path),
            params=params,
            json=json,
            content=content.encode("utf-8") if isinstance(content, str) else content,
            headers=send_headers,
        )
        resp = await self.client._send(req, check=False)
        error = _core.proxy_error(resp.status_code, resp.content)
        if error is not None:
            raise error
        return resp
