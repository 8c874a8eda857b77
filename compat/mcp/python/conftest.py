"""The official MCP Python SDK as the client of space's MCP server, over stdio (`space mcp`)
and over Streamable HTTP (`/mcp` on the API listener), against a live server.

The driver (crates/space/tests/mcp.rs) starts `space up` and sets SPACE_URL, SPACE_API_KEY
(the admin key of tenant `default`), SPACE_OTHER_KEY (a key of another tenant), SPACE_BIN
(the `space` binary) and SPACE_CONFIG (a CLI config of the server's).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

URL = os.environ.get("SPACE_URL", "").rstrip("/")
KEY = os.environ.get("SPACE_API_KEY", "")
OTHER_KEY = os.environ.get("SPACE_OTHER_KEY", "")
TEMPLATE = os.environ.get("SPACE_TEMPLATE", "base")

# Seconds one MCP request may take (creates and restores under software emulation).
TIMEOUT = 300.0


def pytest_configure(config: pytest.Config) -> None:
    if not URL or not KEY or not os.environ.get("SPACE_BIN"):
        raise pytest.UsageError(
            "SPACE_URL, SPACE_API_KEY and SPACE_BIN must name a live space server, its admin "
            "key and the space binary (cargo test -p space --test mcp sets them)"
        )


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def stdio_params(key: str = KEY) -> StdioServerParameters:
    """`space mcp` as a local agent starts it: the CLI's URL and key from the environment."""
    env = {
        "SPACE_URL": URL,
        "SPACE_API_KEY": key,
        "SPACE_CONFIG": os.environ.get("SPACE_CONFIG", "/nonexistent"),
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    }
    return StdioServerParameters(command=os.environ["SPACE_BIN"], args=["mcp"], env=env)


@contextlib.asynccontextmanager
async def connect(transport: str, key: str | None = KEY) -> AsyncIterator[Client]:
    """An MCP client session over `transport` ("stdio" or "http") with API key `key`."""
    if transport == "stdio":
        assert key is not None
        async with Client(stdio_params(key), read_timeout_seconds=TIMEOUT) as client:
            yield client
        return
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    async with httpx2.AsyncClient(headers=headers, timeout=TIMEOUT) as http:
        transport_cm = streamable_http_client(f"{URL}/mcp", http_client=http)
        async with Client(transport_cm, read_timeout_seconds=TIMEOUT) as client:
            yield client


async def call(client: Client, tool: str, **args: Any) -> Any:
    """Calls `tool`; fails the test when the tool reports an error; returns its structured
    result."""
    result = await client.call_tool(tool, args)
    text = "".join(getattr(c, "text", "") for c in result.content)
    assert not result.is_error, f"{tool}({args}) failed: {text}"
    assert isinstance(result.structured_content, dict), f"{tool}: no structured content: {text}"
    return result.structured_content


async def call_error(client: Client, tool: str, **args: Any) -> str:
    """Calls `tool`, which must report a tool error; returns its message."""
    result = await client.call_tool(tool, args)
    text = "".join(getattr(c, "text", "") for c in result.content)
    assert result.is_error, f"{tool}({args}) was expected to fail but answered: {text}"
    return text


@contextlib.asynccontextmanager
async def sandbox(client: Client, **args: Any) -> AsyncIterator[str]:
    """A sandbox made through the create_sandbox tool, killed (through the API) at the end."""
    made = await call(client, "create_sandbox", template=TEMPLATE, **args)
    sid = made["id"]
    assert sid.startswith("sbx-") and made["state"] == "running", made
    try:
        yield sid
    finally:
        with httpx.Client(base_url=URL, headers={"Authorization": f"Bearer {KEY}"}) as http:
            http.delete(f"/v1/sandboxes/{sid}")
