"""Python client for the space sandbox API.

>>> from space_sdk import Sandbox
>>> with Sandbox.create(template="minimal") as sb:
...     print(sb.exec(["uname", "-r"]).text)

The server and API key come from ``Space(url=..., api_key=...)``, else ``SPACE_URL`` and
``SPACE_API_KEY``, else the file the CLI writes (``space up`` makes one). ``AsyncSpace`` and
``AsyncSandbox`` are the asyncio forms.
"""

from ._core import NEVER, config_path
from .aio import AsyncFiles, AsyncSandbox, AsyncSpace, default_async_client
from .client import Files, Sandbox, Space, default_client
from .errors import (
    ConfigError,
    Conflict,
    Forbidden,
    GuestError,
    IllegalState,
    InternalError,
    InvalidRequest,
    InvalidResponse,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    QuotaExceeded,
    SpaceConnectionError,
    SpaceError,
    Unauthorized,
    Unavailable,
    UnsupportedMediaType,
)
from .models import (
    AuditEvent,
    Build,
    DirEntry,
    ExecResult,
    FileStat,
    ForkedFrom,
    SandboxInfo,
    Snapshot,
    Template,
    Timeouts,
)

__version__ = "0.1.0"

__all__ = [
    "NEVER",
    "AsyncFiles",
    "AsyncSandbox",
    "AsyncSpace",
    "AuditEvent",
    "Build",
    "ConfigError",
    "Conflict",
    "DirEntry",
    "ExecResult",
    "FileStat",
    "Files",
    "Forbidden",
    "ForkedFrom",
    "GuestError",
    "IllegalState",
    "InternalError",
    "InvalidRequest",
    "InvalidResponse",
    "MethodNotAllowed",
    "NotFound",
    "PayloadTooLarge",
    "QuotaExceeded",
    "Sandbox",
    "SandboxInfo",
    "Snapshot",
    "Space",
    "SpaceConnectionError",
    "SpaceError",
    "Template",
    "Timeouts",
    "Unauthorized",
    "Unavailable",
    "UnsupportedMediaType",
    "__version__",
    "config_path",
    "default_async_client",
    "default_client",
]
