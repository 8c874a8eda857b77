"""Errors raised by the client.

Every error the server answers with is a JSON envelope
``{"error": {"code": "...", "message": "..."}}``; the client turns it into an instance of the
:class:`SpaceError` subclass that matches the ``code`` (or, for a code this version does not
know, the HTTP status). ``code`` is stable and meant for programs; ``message`` is for people.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = [
    "ConfigError",
    "Conflict",
    "Forbidden",
    "GuestError",
    "IllegalState",
    "InternalError",
    "InvalidRequest",
    "InvalidResponse",
    "MethodNotAllowed",
    "NotFound",
    "PayloadTooLarge",
    "QuotaExceeded",
    "SpaceConnectionError",
    "SpaceError",
    "Unauthorized",
    "Unavailable",
    "UnsupportedMediaType",
    "error_from_response",
]

# How much of a non-JSON error body is kept in the message.
_MAX_BODY_IN_MESSAGE = 512


class SpaceError(Exception):
    """An error from the space API or from talking to it.

    ``code`` is the stable error code (``sandbox_not_found``, ``illegal_state``, ...),
    ``message`` the human-readable text and ``status`` the HTTP status, or ``None`` when no
    HTTP answer was involved (connection failures, configuration problems).
    """

    def __init__(self, code: str, message: str, status: int | None = None) -> None:
        super().__init__(f"{code}: {message}" if status is None else f"{status} {code}: {message}")
        self.code = code
        self.message = message
        self.status = status

    def __repr__(self) -> str:
        name = type(self).__name__
        return f"{name}(code={self.code!r}, message={self.message!r}, status={self.status!r})"


class SpaceConnectionError(SpaceError):
    """The server could not be reached, or the connection broke or timed out mid-request."""

    def __init__(self, message: str) -> None:
        super().__init__("connection_error", message, None)


class ConfigError(SpaceError):
    """The client has no usable URL or API key (see ``Space`` for where they come from)."""

    def __init__(self, message: str) -> None:
        super().__init__("config_error", message, None)


class InvalidResponse(SpaceError):
    """The server answered with something that does not follow the API contract."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__("invalid_response", message, status)


class InvalidRequest(SpaceError):
    """400: a field is missing, malformed or out of range (``invalid_request``,
    ``invalid_json``, ``invalid_id``). The client raises it too, with ``status`` ``None``,
    for arguments it can tell are wrong before sending anything."""


class Unauthorized(SpaceError):
    """401: no API key, or a wrong or revoked one."""


class Forbidden(SpaceError):
    """403: an admin route called with a tenant key, a guest permission error, or a key the
    archive needs that does not open (``key_unavailable``)."""


class NotFound(SpaceError):
    """404: the sandbox, snapshot, template, tenant, key, file, secret, port, node or route
    does not exist (or belongs to another tenant); ``not_found`` for an unknown or revoked
    ingress URL, ``not_a_cluster`` for a cluster route on a single-node server."""


class MethodNotAllowed(SpaceError):
    """405: the route exists but not with this method."""


class IllegalState(SpaceError):
    """409 ``illegal_state``: the operation is not legal in the sandbox's current state."""


class Conflict(SpaceError):
    """409 ``conflict``: the thing exists already, or is still in use; also a create under an
    ``Idempotency-Key`` that is still running (``create_in_progress``) or that was used for
    another request (``idempotency_key_reused``, 409 or 422)."""


class PayloadTooLarge(SpaceError):
    """413: the request body or upload is over the server's limit."""


class UnsupportedMediaType(SpaceError):
    """415: a JSON route called without a JSON content type."""


class QuotaExceeded(SpaceError):
    """429: the tenant's sandbox, vCPU or memory quota would be passed."""


class GuestError(SpaceError):
    """502: the sandbox's guest daemon failed the request."""


class Unavailable(SpaceError):
    """503: the node has no room for another VM now (``capacity``) or its disk is full
    (``disk_full``), the server is stopping
    (``shutting_down``), the node holding the sandbox cannot be reached (``node_unavailable``)
    or another replica holds the tenant's quota (``quota_busy``); also 502
    ``archive_unavailable``, the object store failing. Retrying later may succeed."""


class InternalError(SpaceError):
    """500: a failure of the server's machinery."""


_BY_CODE: dict[str, type[SpaceError]] = {
    "invalid_request": InvalidRequest,
    "invalid_json": InvalidRequest,
    "invalid_id": InvalidRequest,
    "unauthorized": Unauthorized,
    "forbidden": Forbidden,
    "method_not_allowed": MethodNotAllowed,
    "illegal_state": IllegalState,
    "conflict": Conflict,
    "payload_too_large": PayloadTooLarge,
    "unsupported_media_type": UnsupportedMediaType,
    "quota_exceeded": QuotaExceeded,
    "guest_error": GuestError,
    "capacity": Unavailable,
    "disk_full": Unavailable,
    "shutting_down": Unavailable,
    "node_unavailable": Unavailable,
    "quota_busy": Unavailable,
    "archive_unavailable": Unavailable,
    "key_unavailable": Forbidden,
    "create_in_progress": Conflict,
    "idempotency_key_reused": Conflict,
    "stale_incarnation": Conflict,
    "volume_exists": Conflict,
    "volume_in_use": Conflict,
    "not_found": NotFound,
    "not_a_cluster": NotFound,
    "internal": InternalError,
}

_BY_STATUS: dict[int, type[SpaceError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: MethodNotAllowed,
    409: Conflict,
    413: PayloadTooLarge,
    415: UnsupportedMediaType,
    422: Conflict,
    429: QuotaExceeded,
    500: InternalError,
    502: GuestError,
    503: Unavailable,
}


def error_class(code: str, status: int | None) -> type[SpaceError]:
    """The exception class for an error ``code`` (falling back on the HTTP ``status``)."""
    if code in _BY_CODE:
        return _BY_CODE[code]
    if code.endswith("_not_found"):
        return NotFound
    if status is not None and status in _BY_STATUS:
        return _BY_STATUS[status]
    return SpaceError


def make_error(code: str, message: str, status: int | None) -> SpaceError:
    """Builds the matching :class:`SpaceError` subclass for ``code``."""
    return error_class(code, status)(code, message, status)


def _printable(body: bytes) -> str:
    text = body[:_MAX_BODY_IN_MESSAGE].decode("utf-8", errors="replace").strip()
    if len(body) > _MAX_BODY_IN_MESSAGE:
        text += " ..."
    return text or "(empty body)"


def error_from_response(status: int, body: bytes) -> SpaceError:
    """Turns an error answer (status >= 400) into the matching :class:`SpaceError`.

    A body that is not the JSON error envelope (a proxy's HTML page, say) still gives an
    error of the class the status implies, with code ``http_<status>``.
    """
    try:
        parsed: Any = json.loads(body)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        err = parsed["error"]
        code = err.get("code")
        message = err.get("message")
        if isinstance(code, str) and code:
            return make_error(code, message if isinstance(message, str) else "", status)
    code = f"http_{status}"
    cls = _BY_STATUS.get(status, SpaceError)
    return cls(code, _printable(body), status)
