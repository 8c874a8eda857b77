"""Fixtures for the SDK's tests. They run against a live server named by SPACE_URL, with an
admin key in SPACE_API_KEY (crates/space/tests/sdk_python.rs starts one and sets both)."""

from __future__ import annotations

import os
import secrets
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from space_sdk import Sandbox, Space


@pytest.fixture(scope="session")
def server() -> tuple[str, str]:
    """The server's URL and admin key, from the environment."""
    url = os.environ.get("SPACE_URL")
    key = os.environ.get("SPACE_API_KEY")
    if not url or not key:
        pytest.fail(
            "SPACE_URL and SPACE_API_KEY must name a live space server and its admin key "
            "(cargo test -p space --test sdk_python starts one)"
        )
    return url.rstrip("/"), key


@pytest.fixture(scope="session")
def space(server: tuple[str, str]) -> Iterator[Space]:
    """A synchronous client with the admin key."""
    url, key = server
    with Space(url, key) as client:
        yield client


@pytest.fixture(scope="session")
def admin_http(server: tuple[str, str]) -> Iterator[httpx.Client]:
    """Plain HTTP with the admin key, for the admin routes the SDK does not wrap."""
    url, key = server
    with httpx.Client(
        base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120
    ) as client:
        yield client


@pytest.fixture(scope="session")
def run_id() -> str:
    """Marks the sandboxes of this run (as metadata) so filters find only them."""
    return secrets.token_hex(6)


def new_tenant(admin_http: httpx.Client) -> tuple[str, str]:
    """Creates a tenant through the admin API; returns its name and its first key."""
    name = f"sdk-{secrets.token_hex(5)}"
    resp = admin_http.post("/v1/tenants", json={"name": name})
    assert resp.status_code == 201, resp.text
    body = resp.json()
    assert body["tenant"]["name"] == name
    key = body["key"]["key"]
    assert key.startswith("space_")
    assert body["key"]["admin"] is False
    return name, key


def kill_quietly(sb: Sandbox) -> None:
    """Kills a sandbox at the end of a test whatever state it is in."""
    try:
        if sb.info().state != "terminated":
            sb.kill()
    except Exception:
        pass


class Upstream:
    """An HTTP server on 127.0.0.1 of this machine for sandboxes to reach through the egress
    gateway: it answers ``upstream saw <path>`` and keeps the head of every request."""

    def __init__(self) -> None:
        heads: list[str] = []
        self.heads = heads

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                heads.append(self.requestline + "\n" + str(self.headers))
                body = f"upstream saw {self.path}\n".encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def seen(self, path: str) -> list[str]:
        """The heads of the requests for ``path``."""
        return [h for h in self.heads if h.split(" ", 2)[1:2] == [path]]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture(scope="session")
def upstream() -> Iterator[Upstream]:
    """A plain HTTP upstream on 127.0.0.1 (see :class:`Upstream`)."""
    server = Upstream()
    try:
        yield server
    finally:
        server.close()


def header(head: str, name: str) -> str | None:
    """The value of header ``name`` in a request head."""
    for line in head.splitlines()[1:]:
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() == name.lower():
            return value.strip()
    return None


# A page busybox httpd serves in a sandbox of the minimal template, on port HTTPD_PORT.
HTTPD_PORT = 8080
HTTPD_PAGE = "served from the sandbox\n"
START_HTTPD = (
    "mkdir -p /srv/www && printf 'served from the sandbox\\n' > /srv/www/index.html && "
    f"httpd -p {HTTPD_PORT} -h /srv/www"
)
