"""The MCP computer tools (`/mcp`, the official MCP Python SDK over Streamable HTTP) on the
same desktop the e2b-desktop SDK made: a screenshot comes back as an image content block,
and clicks, typing, keys and scrolling reach the X server (an `xev` window logs them);
`navigate` drives the sandbox's Chromium, started on the desktop's display."""

import base64
import io
import os

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from PIL import Image

from conftest import EventLog, until, until_equal

URL = os.environ["E2B_API_URL"].rstrip("/")
KEY = os.environ["E2B_API_KEY"]


def tools(calls):
    """Runs `calls(client)` (async) in one MCP session over HTTP; returns what it returns."""

    async def go():
        headers = {"Authorization": f"Bearer {KEY}"}
        async with httpx2.AsyncClient(headers=headers, timeout=300) as http:
            transport = streamable_http_client(f"{URL}/mcp", http_client=http)
            async with Client(transport, read_timeout_seconds=300) as client:
                return await calls(client)

    return anyio.run(go)


async def call(client, tool, **args):
    result = await client.call_tool(tool, args)
    text = "".join(getattr(c, "text", "") for c in result.content)
    assert not result.is_error, f"{tool}({args}) failed: {text}"
    return result


def test_screenshot_is_an_image_block(desktop):
    async def shot(client):
        return await call(client, "screenshot", sandbox_id=desktop.sandbox_id)

    result = tools(shot)
    images = [c for c in result.content if c.type == "image"]
    assert len(images) == 1 and images[0].mime_type == "image/png"
    img = Image.open(io.BytesIO(base64.b64decode(images[0].data)))
    assert img.size == (1024, 768)
    assert result.structured_content["size"] == "1024x768"


def test_click_type_key_and_scroll_reach_the_window(desktop):
    log = EventLog(desktop, "mcp", x=260, y=180)
    x, y = log.center
    sid = desktop.sandbox_id

    async def act(client):
        await call(client, "click", sandbox_id=sid, x=x, y=y)
        await call(client, "click", sandbox_id=sid, x=x + 10, y=y, button="right")
        await call(client, "click", sandbox_id=sid, x=x + 20, y=y, double=True)
        await call(client, "scroll", sandbox_id=sid, direction="down", amount=2)
        await call(client, "scroll", sandbox_id=sid, direction="up")  # 3 steps by default
        await call(client, "type_text", sandbox_id=sid, text="mcp 7")
        await call(client, "press_key", sandbox_id=sid, keys="ctrl+a")

    try:
        tools(act)
        until_equal("every press logged", log.buttons, [1, 3, 1, 1, 5, 5, 4, 4, 4], timeout=30)
        until_equal(
            "every key logged",
            log.keys,
            ["m", "c", "p", "space", "7", "Control_L", "a"],
            timeout=30,
        )
    finally:
        log.close()


def test_navigate_opens_the_page_in_the_desktops_chromium(desktop):
    # A page served inside the sandbox (the browser reaches loopback without the egress
    # gateway); its title shows in Chromium's window name.
    desktop.files.write("/tmp/site/nav.html", "<title>space-navigated</title><p>here</p>")
    desktop.commands.run(
        "cd /tmp/site && python3 -m http.server 8123 --bind 127.0.0.1", background=True, timeout=0
    ).disconnect()
    until(
        "the page server listens",
        lambda: desktop.commands.run("netstat -tln | grep -c ':8123 ' || true").stdout.strip()
        != "0",
        timeout=60,
    )

    async def nav(client):
        return await call(
            client, "navigate", sandbox_id=desktop.sandbox_id, url="http://127.0.0.1:8123/nav.html"
        )

    tools(nav)

    def title():
        r = desktop.commands.run(
            "for w in $(xdotool search --onlyvisible --class chromium); do "
            "xdotool getwindowname $w; done || true"
        )
        return "space-navigated" in r.stdout

    until("Chromium shows the page", title, timeout=180, interval=2)
