"""Playwright (unmodified, pinned) drives a sandbox's Chromium over the DevTools URL that
``POST /v1/sandboxes/{id}/browser`` answers, against a page served here on the host and
reached through the sandbox's gateway: a login sets a cookie, the cookie survives a suspend
and the wake on access after it, a fork of the logged-in sandbox is logged in too, and
another tenant's key (or a forged token) opens nothing.

Environment: SPACE_URL, SPACE_API_KEY (a tenant's key), SPACE_OTHER_KEY (another tenant's).
"""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import pytest
from playwright.sync_api import sync_playwright

URL = os.environ["SPACE_URL"].rstrip("/")
KEY = os.environ["SPACE_API_KEY"]
OTHER = os.environ["SPACE_OTHER_KEY"]

#: Generous: Chromium under TCG starts in tens of seconds.
SLOW = 600


def api(method: str, path: str, key: str = KEY, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(URL + path, data=data, method=method)
    req.add_header("Authorization", f"Bearer {key}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=SLOW) as r:
            raw = r.read()
            return r.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw)
        except ValueError:
            return e.code, raw.decode(errors="replace")


class Site(http.server.BaseHTTPRequestHandler):
    """/login sets a lasting session cookie; /whoami says whose session the request has."""

    def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
        if self.path.startswith("/login"):
            body = b"<html><title>in</title><body>welcome</body></html>"
            self.send_response(200)
            self.send_header("Set-Cookie", "session=s3cr3t-session; Max-Age=86400; Path=/")
        elif self.path.startswith("/whoami"):
            cookie = self.headers.get("Cookie", "")
            who = "s3cr3t-session" if "session=s3cr3t-session" in cookie else "nobody"
            body = f"<html><title>{who}</title><body>{who}</body></html>".encode()
            self.send_response(200)
        else:
            body = b"no"
            self.send_response(404)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def host_address() -> str:
    """This host's address on its default route: Chromium sends loopback addresses to its
    own loopback, never through a proxy, so the page is served on an address the gateway
    reaches for the guest."""
    import socket

    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the route
        return s.getsockname()[0]
    except OSError:
        return socket.gethostbyname(socket.gethostname())
    finally:
        s.close()


@pytest.fixture(scope="module")
def site() -> Any:
    addr = host_address()
    server = http.server.ThreadingHTTPServer((addr, 0), Site)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://{addr}:{server.server_address[1]}"
    server.shutdown()


def wait_desktop_template() -> None:
    """The desktop template is prepared in the background: wait until creates pass."""
    deadline = time.time() + SLOW
    while True:
        status, v = api("GET", "/v1/templates")
        names = [t["name"] for t in v["templates"]] if status == 200 else []
        if "desktop" in names:
            return
        assert time.time() < deadline, f"no desktop template: {status} {v}"
        time.sleep(2)


def create(site: str) -> str:
    wait_desktop_template()
    hostport = site.split("://", 1)[1]
    status, sb = api(
        "POST",
        "/v1/sandboxes",
        body={
            "template": "desktop",
            "egress": {"default": "deny", "allow": [hostport]},
        },
    )
    assert status == 201, sb
    return sb["id"]


def browser(sid: str, key: str = KEY) -> tuple[int, Any]:
    return api("POST", f"/v1/sandboxes/{sid}/browser", key=key)


#: Puppeteer's helper (compat/browser/js, installed by scripts/browser-env.sh).
PUPPETEER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "js", "title.mjs")


def title_with_puppeteer(cdp_url: str, url: str) -> str:
    """The title of `url` opened by Puppeteer, `puppeteer.connect` to `cdp_url` as is."""
    done = subprocess.run(
        ["node", PUPPETEER, cdp_url, url],
        capture_output=True,
        text=True,
        timeout=SLOW,
    )
    assert done.returncode == 0, f"puppeteer: {done.returncode}: {done.stderr}"
    return done.stdout.strip().splitlines()[-1]


def exec_sh(sid: str, script: str) -> int:
    """Runs `script` with /bin/sh in the sandbox; answers its exit code."""
    req = urllib.request.Request(
        f"{URL}/v1/sandboxes/{sid}/exec",
        data=json.dumps({"shell": script, "timeout_ms": SLOW * 1000}).encode(),
        method="POST",
    )
    req.add_header("Authorization", f"Bearer {KEY}")
    req.add_header("Content-Type", "application/json")
    code = None
    with urllib.request.urlopen(req, timeout=SLOW) as r:
        for raw in r:
            if raw.strip():
                ev = json.loads(raw)
                assert ev["type"] != "error", ev
                if ev["type"] == "exit":
                    code = ev["exit_code"]
    assert code is not None, "no exit event"
    return code


def title_at(cdp_url: str, url: str) -> str:
    with sync_playwright() as p:
        b = p.chromium.connect_over_cdp(cdp_url, timeout=SLOW * 1000)
        ctx = b.contexts[0] if b.contexts else b.new_context()
        page = ctx.new_page()
        page.goto(url, timeout=SLOW * 1000)
        title = page.title()
        page.close()
        b.close()
        return title


# How many colours noVNC's canvas shows once it is connected (0 before).
CANVAS_COLOURS = """() => {
    const c = document.querySelector('#noVNC_container canvas, canvas');
    if (!document.documentElement.classList.contains('noVNC_connected') || !c || !c.width) return 0;
    const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
    const seen = new Set();
    for (let i = 0; i < d.length && seen.size < 64; i += 4 * 97) seen.add((d[i] << 16) | (d[i + 1] << 8) | d[i + 2]);
    return seen.size;
}"""


def live_view_colours(live_url: str) -> int:
    """Opens `live_url` in the host's Chromium (headless) and waits for noVNC's canvas to
    show the sandbox's screen; answers how many colours it shows."""
    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=os.environ.get("SPACE_CHROMIUM", "/usr/bin/chromium"),
            headless=True,
            args=["--no-sandbox"],
        )
        try:
            page = b.new_page()
            page.goto(live_url, timeout=SLOW * 1000)
            deadline = time.time() + SLOW
            while (n := page.evaluate(CANVAS_COLOURS)) <= 4:
                assert time.time() < deadline, f"the live view shows nothing ({n} colours)"
                time.sleep(1)
            return n
        finally:
            b.close()


def test_cdp_login_survives_suspend_and_fork(site: str) -> None:
    sid = create(site)
    status, s = browser(sid)
    assert status == 200, s
    assert s["cdp_url"].startswith("ws") and "/browser/cdp?token=" in s["cdp_url"], s
    # The desktop template has an X server: the browser is headful, and its screen is in
    # the live view, which a browser on the host opens with the URL alone.
    assert s["headful"] is True and "/browser/live/" in s["live_url"], s
    assert live_view_colours(s["live_url"]) > 4
    # A made-up token opens nothing.
    sandbox_path = urllib.parse.urlsplit(s["live_url"]).path.split("/browser/live/")[0]
    status, v = api("GET", f"{sandbox_path}/browser/live/{'0' * 40}/vnc.html")
    assert status == 404, v
    assert title_at(s["cdp_url"], site + "/whoami") == "nobody"
    assert title_at(s["cdp_url"], site + "/login") == "in"
    assert title_at(s["cdp_url"], site + "/whoami") == "s3cr3t-session"
    # Puppeteer takes the same URL as is, and sees the same browser.
    assert title_with_puppeteer(s["cdp_url"], site + "/whoami") == "s3cr3t-session"

    # Another tenant: not its sandbox, with the key or with a forged token.
    status, v = browser(sid, key=OTHER)
    assert status == 404, v
    forged = s["cdp_url"].rsplit(".", 1)[0] + "." + "0" * 64
    with pytest.raises(Exception):
        title_at(forged, site + "/whoami")

    # Suspended, then woken by the DevTools URL itself (the one from before): still
    # logged in.
    status, v = api("POST", f"/v1/sandboxes/{sid}/suspend", body={})
    assert status == 200 and v["state"] == "suspended", v
    assert title_at(s["cdp_url"], site + "/whoami") == "s3cr3t-session"
    status, v = api("GET", f"/v1/sandboxes/{sid}")
    assert status == 200 and v["state"] == "running", v

    # Chromium ends and is started again: the URL from before reaches the new one.
    gone = "pkill -x chromium; for i in $(seq 150); do pgrep -x chromium >/dev/null || exit 0; sleep 0.2; done; exit 1"
    assert exec_sh(sid, gone) == 0, "chromium did not end"
    status, s2 = browser(sid)
    assert status == 200, s2
    assert title_at(s["cdp_url"], site + "/login") == "in"
    assert title_with_puppeteer(s["cdp_url"], site + "/login") == "in"

    # A fork of the logged-in sandbox is logged in.
    status, child = api("POST", f"/v1/sandboxes/{sid}/fork", body={})
    assert status == 201, child
    status, s3 = browser(child["id"])
    assert status == 200, s3
    assert title_at(s3["cdp_url"], site + "/whoami") == "s3cr3t-session"

    for x in (child["id"], sid):
        api("DELETE", f"/v1/sandboxes/{x}")


def test_a_template_without_chromium_is_refused() -> None:
    status, sb = api("POST", "/v1/sandboxes", body={"template": "base"})
    assert status == 201, sb
    status, v = browser(sb["id"])
    assert status == 409 and v["error"]["code"] == "illegal_state", v
    assert "chromium" in v["error"]["message"], v
    api("DELETE", f"/v1/sandboxes/{sb['id']}")
