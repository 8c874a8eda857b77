"""The SDK's live view: `stream.start` / `get_url` / `stop`, with and without auth, opened
by a real Chromium on the host at the https URL the SDK builds, trusting the deployment's
CA from the API (`GET /v1/tls/ca.pem`), not skipping certificate checks."""

import os
import socket
import ssl
import subprocess
import tempfile
import urllib.parse

import pytest
from e2b import CommandExitException
from playwright.sync_api import sync_playwright

from conftest import until

# What the page says about noVNC's connection: the state the UI puts on <html>, the
# credentials dialog, and the colours the remote screen's canvas shows.
PAGE_STATE = """() => {
    const html = document.documentElement;
    const dlg = document.getElementById('noVNC_credentials_dlg');
    const canvas = document.querySelector('#noVNC_container canvas, canvas');
    let colours = 0, width = 0, height = 0;
    if (canvas && canvas.width > 0 && canvas.height > 0) {
        width = canvas.width; height = canvas.height;
        const data = canvas.getContext('2d').getImageData(0, 0, width, height).data;
        const seen = new Set();
        for (let i = 0; i < data.length && seen.size < 64; i += 4 * 97) {
            seen.add((data[i] << 16) | (data[i + 1] << 8) | data[i + 2]);
        }
        colours = seen.size;
    }
    return {
        connected: html.classList.contains('noVNC_connected'),
        asks_password: !!(dlg && dlg.classList.contains('noVNC_open')),
        width, height, colours,
    };
}"""


@pytest.fixture(scope="module")
def browser():
    """The host's Chromium, headless, with the deployment CA in its own NSS store."""
    ca = os.environ["SPACE_CA"]
    home = tempfile.mkdtemp(prefix="space-live-view-")
    nssdb = f"sql:{home}/.pki/nssdb"
    os.makedirs(f"{home}/.pki/nssdb")
    subprocess.run(["certutil", "-N", "-d", nssdb, "--empty-password"], check=True)
    subprocess.run(
        ["certutil", "-A", "-d", nssdb, "-n", "space-ca", "-t", "C,,", "-i", ca],
        check=True,
    )
    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=os.environ.get("SPACE_CHROMIUM", "/usr/bin/chromium"),
            headless=True,
            env={**os.environ, "HOME": home},
            args=["--no-sandbox"],
        )
        try:
            yield b
        finally:
            b.close()


def view(browser, url, until_state, timeout=120):
    """Opens `url` in a new page and waits for a page state `until_state` accepts."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    try:
        page.goto(url, wait_until="load", timeout=timeout * 1000)
        return until(
            f"the live view at {url}",
            lambda: (lambda s: s if until_state(s) else None)(page.evaluate(PAGE_STATE)),
            timeout=timeout,
            interval=1,
        )
    finally:
        page.close()


def fetch_status(url):
    """The HTTP status of GET `url`, verified against the deployment CA. The host is under
    `localhost`, which browsers resolve to loopback and glibc does not: connect there."""
    u = urllib.parse.urlsplit(url)
    ctx = ssl.create_default_context(cafile=os.environ["SPACE_CA"])
    path = u.path + (f"?{u.query}" if u.query else "")
    with socket.create_connection(("127.0.0.1", u.port or 443), timeout=60) as raw:
        with ctx.wrap_socket(raw, server_hostname=u.hostname) as s:
            s.sendall(
                f"GET {path} HTTP/1.1\r\nHost: {u.netloc}\r\nConnection: close\r\n\r\n".encode()
            )
            head = s.recv(64).decode("latin-1")
    return int(head.split(" ", 2)[1])


def shows_the_desktop(s):
    return s["connected"] and s["width"] == 1024 and s["height"] == 768 and s["colours"] > 4


def test_stream_without_auth_shows_the_desktop_in_a_browser(desktop, browser):
    desktop.stream.start()
    url = desktop.stream.get_url()
    assert url.startswith(f"https://6080-{desktop.sandbox_id}.")
    assert "autoconnect=true" in url and "resize=scale" in url
    assert "view_only=true" in desktop.stream.get_url(view_only=True)
    with pytest.raises(RuntimeError):
        desktop.stream.get_auth_key()
    state = view(browser, url, shows_the_desktop)
    assert not state["asks_password"]
    # One stream at a time, as the SDK says.
    with pytest.raises(RuntimeError):
        desktop.stream.start()


def test_stream_stop_ends_the_vnc_server_and_the_page(desktop):
    page_url = desktop.stream.get_url(auto_connect=False, resize="")
    assert fetch_status(page_url) == 200
    desktop.stream.stop()
    with pytest.raises(CommandExitException):
        desktop.commands.run("pgrep -x x11vnc")
    until("the stream's port closes", lambda: fetch_status(page_url) >= 500, timeout=60)


def test_stream_with_auth_needs_its_key(desktop, browser):
    desktop.stream.start(require_auth=True)
    key = desktop.stream.get_auth_key()
    assert len(key) == 16
    # Without the key noVNC asks for it and shows nothing.
    state = view(browser, desktop.stream.get_url(), lambda s: s["asks_password"])
    assert not state["connected"]
    # With it, the desktop.
    view(browser, desktop.stream.get_url(auth_key=key), shows_the_desktop)
    desktop.stream.stop()
