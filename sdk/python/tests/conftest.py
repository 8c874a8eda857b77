"""Fixtures for the SDK's tests. They run against a live server named by SPACE_URL, with an
admin key in SPACE_API_KEY (crates/space/tests/sdk_python.rs starts one and sets both)."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

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
