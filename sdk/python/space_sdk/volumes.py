"""Volumes: a tenant's file systems that outlive sandboxes (``docs/volumes.md``).

``space.create_volume("data")`` makes one; ``Sandbox.create(..., volumes={"/data": "data"})``
mounts it, in several sandboxes at once. A :class:`Volume` (or :class:`AsyncVolume`) reads
and writes its files without any sandbox. Paths are absolute in the volume (``/`` its root).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import _core
from .models import DirEntry, FileStat, VolumeInfo

if TYPE_CHECKING:
    from .aio import AsyncSpace
    from .client import Space

_List = list


def _path(name: str, *rest: str) -> str:
    return "/".join(["/v1/volumes", _core.seg(name), *rest])


def _content(data: bytes | str) -> bytes:
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    raise TypeError("data should be bytes or str")


def _write_params(path: str, mode: int | str | None, parents: bool) -> dict[str, str]:
    params = _core.upload_params(path, mode)
    if parents:
        params["parents"] = "true"
    return params


class Volume:
    """One volume of the tenant, by name, and its files."""

    def __init__(self, client: Space, info: VolumeInfo) -> None:
        self.client = client
        self.info = info

    @property
    def name(self) -> str:
        return self.info.name

    def __repr__(self) -> str:
        return f"Volume({self.info.name!r}, {self.info.size_bytes} bytes)"

    def refresh(self) -> VolumeInfo:
        """Reads the volume again (its use changes as it is written)."""
        self.info = VolumeInfo.from_json(self.client._json("GET", _path(self.name)))
        return self.info

    def delete(self) -> None:
        """Deletes the volume and its files; refused while a sandbox mounts it."""
        self.client.request("DELETE", _path(self.name))

    def read(self, path: str) -> bytes:
        """The whole contents of the file at ``path``."""
        return self.client.request("GET", _path(self.name, "files"), params={"path": path}).content

    def read_text(self, path: str, encoding: str = "utf-8") -> str:
        """The contents of the file at ``path`` as text."""
        return self.read(path).decode(encoding)

    def write(
        self,
        path: str,
        data: bytes | str,
        mode: int | str | None = None,
        parents: bool = False,
    ) -> FileStat:
        """Replaces the file at ``path`` with ``data`` (text is written as UTF-8); a write that
        fails, as on a full volume, leaves the old file. ``parents`` makes missing directories."""
        value = self.client._json(
            "PUT",
            _path(self.name, "files"),
            params=_write_params(path, mode, parents),
            content=_content(data),
            headers={"Content-Type": "application/octet-stream"},
        )
        return FileStat.from_json(value)

    def list(self, path: str = "/") -> _List[DirEntry]:
        """The entries of the directory ``path``, by name."""
        value = self.client._json("GET", _path(self.name, "files", "list"), params={"path": path})
        return [DirEntry.from_json(e) for e in _core.list_field(value, "entries")]

    def stat(self, path: str) -> FileStat:
        """What ``path`` is (a symlink is described, not followed)."""
        value = self.client._json("GET", _path(self.name, "files", "stat"), params={"path": path})
        return FileStat.from_json(value)

    def mkdir(self, path: str, parents: bool = True) -> FileStat:
        """Makes the directory ``path`` (with ``parents``, its parents too)."""
        body: dict[str, Any] = {"path": path, "parents": parents}
        return FileStat.from_json(self.client._json("POST", _path(self.name, "files", "mkdir"), json=body))

    def rename(self, src: str, dst: str) -> FileStat:
        """Moves ``src`` to ``dst``."""
        body = {"from": src, "to": dst}
        return FileStat.from_json(self.client._json("POST", _path(self.name, "files", "rename"), json=body))

    def remove(self, path: str) -> None:
        """Removes a file, or a directory and everything in it."""
        self.client.request("DELETE", _path(self.name, "files"), params={"path": path})


class AsyncVolume:
    """:class:`Volume` for :class:`~space_sdk.AsyncSpace`."""

    def __init__(self, client: AsyncSpace, info: VolumeInfo) -> None:
        self.client = client
        self.info = info

    @property
    def name(self) -> str:
        return self.info.name

    def __repr__(self) -> str:
        return f"AsyncVolume({self.info.name!r}, {self.info.size_bytes} bytes)"

    async def refresh(self) -> VolumeInfo:
        """Reads the volume again."""
        self.info = VolumeInfo.from_json(await self.client._json("GET", _path(self.name)))
        return self.info

    async def delete(self) -> None:
        """Deletes the volume and its files; refused while a sandbox mounts it."""
        await self.client.request("DELETE", _path(self.name))

    async def read(self, path: str) -> bytes:
        """The whole contents of the file at ``path``."""
        resp = await self.client.request("GET", _path(self.name, "files"), params={"path": path})
        return resp.content

    async def read_text(self, path: str, encoding: str = "utf-8") -> str:
        """The contents of the file at ``path`` as text."""
        return (await self.read(path)).decode(encoding)

    async def write(
        self,
        path: str,
        data: bytes | str,
        mode: int | str | None = None,
        parents: bool = False,
    ) -> FileStat:
        """Replaces the file at ``path`` with ``data``."""
        value = await self.client._json(
            "PUT",
            _path(self.name, "files"),
            params=_write_params(path, mode, parents),
            content=_content(data),
            headers={"Content-Type": "application/octet-stream"},
        )
        return FileStat.from_json(value)

    async def list(self, path: str = "/") -> _List[DirEntry]:
        """The entries of the directory ``path``, by name."""
        value = await self.client._json(
            "GET", _path(self.name, "files", "list"), params={"path": path}
        )
        return [DirEntry.from_json(e) for e in _core.list_field(value, "entries")]

    async def stat(self, path: str) -> FileStat:
        """What ``path`` is."""
        value = await self.client._json(
            "GET", _path(self.name, "files", "stat"), params={"path": path}
        )
        return FileStat.from_json(value)

    async def mkdir(self, path: str, parents: bool = True) -> FileStat:
        """Makes the directory ``path``."""
        body: dict[str, Any] = {"path": path, "parents": parents}
        value = await self.client._json("POST", _path(self.name, "files", "mkdir"), json=body)
        return FileStat.from_json(value)

    async def rename(self, src: str, dst: str) -> FileStat:
        """Moves ``src`` to ``dst``."""
        body = {"from": src, "to": dst}
        value = await self.client._json("POST", _path(self.name, "files", "rename"), json=body)
        return FileStat.from_json(value)

    async def remove(self, path: str) -> None:
        """Removes a file, or a directory and everything in it."""
        await self.client.request("DELETE", _path(self.name, "files"), params={"path": path})
