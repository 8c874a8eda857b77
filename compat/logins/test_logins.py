"""Logging in to a real HTTPS site from sandboxes without the password entering the VM.

The site runs here on the host (its certificate from a test CA the deployment trusts as an
operator CA). A password and a TOTP seed are put in the vault, bound to the site's
host:port. Then:

* ``curl`` in a ``base`` sandbox posts the placeholder in a form, JSON, multipart and a
  chunked body; the site gets the real password, the guest sees only the placeholder in the
  echoes (plain, gzip), the one-time code passes, and the same form to another host is
  refused and audited;
* Chromium in a ``desktop`` sandbox, driven from here by Playwright over CDP, types the
  placeholder into the login form, logs in, has its session cookie, passes the TOTP form;
  ``POST .../browser/fill`` types the placeholder for it; neither the page's DOM, a
  screenshot, nor (after a suspend) the sandbox's memory and disk files and the object store
  hold the password in any encoding; the session survives the suspend; the value mode types
  the real value only on the bound https origin.

Environment: SPACE_URL, SPACE_API_KEY, SPACE_DATA_DIR, SITE_ADDR, SITE_CERT, SITE_KEY.
"""

from __future__ import annotations

import base64
import gzip
import html
import http.server
import json
import os
import secrets
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import pyotp
import pytest
from playwright.sync_api import sync_playwright

URL = os.environ["SPACE_URL"].rstrip("/")
KEY = os.environ["SPACE_API_KEY"]
DATA_DIR = os.environ["SPACE_DATA_DIR"]
ADDR = os.environ["SITE_ADDR"]

#: Generous: Chromium under TCG starts in tens of seconds.
SLOW = 600

#: Every character a body encoding changes is in it.
PASSWORD = f"Sw0rd {secrets.token_hex(5)} &+\"é<>'=%/"
SEED = pyotp.random_base32()
SESSION = secrets.token_hex(16)

#: What the site received: (route, password or code).
SEEN: list[tuple[str, str]] = []


def encodings(value: str) -> list[bytes]:
    """The password as each encoding writes it, in UTF-8; and as a browser engine keeps text
    in memory (Latin-1 or UTF-16)."""
    forms = {
        value,
        urllib.parse.quote_plus(value),
        urllib.parse.quote(value, safe=""),
        json.dumps(value)[1:-1],
        json.dumps(value, ensure_ascii=False)[1:-1],
        html.escape(value),
        html.escape(value, quote=False),
    }
    return [f.encode() for f in forms] + [value.encode("latin-1"), value.encode("utf-16-le")]


def assert_clean(data: bytes, what: str) -> None:
    for form in encodings(PASSWORD):
        assert form not in data, f"{what} holds the password as {form!r}"


def api(method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(URL + path, data=data, method=method)
    req.add_header("Authorization", f"Bearer {KEY}")
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


def run(sid: str, line: str) -> tuple[int, bytes, bytes]:
    """Runs ``line`` with ``sh -c`` in the sandbox: (exit code, stdout, stderr)."""
    req = urllib.request.Request(
        f"{URL}/v1/sandboxes/{sid}/exec",
        data=json.dumps({"cmd": ["sh", "-c", line], "timeout_ms": SLOW * 1000}).encode(),
        method="POST",
    )
    req.add_header("Authorization", f"Bearer {KEY}")
    req.add_header("Content-Type", "application/json")
    out, err, code = b"", b"", None
    with urllib.request.urlopen(req, timeout=SLOW) as r:
        for raw in r:
            if not raw.strip():
                continue
            ev = json.loads(raw)
            if ev["type"] == "stdout":
                out += base64.b64decode(ev["data"])
            elif ev["type"] == "stderr":
                err += base64.b64decode(ev["data"])
            elif ev["type"] == "exit":
                code = ev["exit_code"]
            elif ev["type"] == "error":
                raise AssertionError(f"exec failed: {ev}")
    return (code if code is not None else -1), out, err


def audit(sid: str, operation: str) -> list[dict[str, Any]]:
    status, v = api("GET", f"/v1/audit?sandbox={sid}&operation={operation}&limit=1000")
    assert status == 200, v
    return v["events"]


def wait_audit(sid: str, operation: str, needle: str) -> dict[str, Any]:
    deadline = time.time() + 60
    while True:
        for e in audit(sid, operation):
            if needle in (e.get("detail") or ""):
                return e
        assert time.time() < deadline, f"no {operation} event with {needle!r}"
        time.sleep(0.5)


# ---- the site ---------------------------------------------------------------------------

LOGIN_PAGE = b"""<!doctype html><html><head><title>sign in</title></head><body>
<form method="post" action="/login">
<input id="user" name="user"><input id="password" name="password" type="password">
<button id="go" type="submit">Sign in</button></form>
<form method="post" action="/echo-html"><input id="echo" name="password">
<button id="say" type="submit">Echo</button></form>
</body></html>"""

TOTP_PAGE = b"""<!doctype html><html><head><title>second factor</title></head><body>
<form method="post" action="/totp"><input id="code" name="code">
<button id="check" type="submit">Check</button></form></body></html>"""


def multipart_field(body: bytes, content_type: str, name: str) -> str:
    boundary = content_type.split("boundary=", 1)[1].strip().strip('"').encode()
    for part in body.split(b"--" + boundary):
        head, _, value = part.partition(b"\r\n\r\n")
        if f'name="{name}"'.encode() in head:
            return value.rsplit(b"\r\n", 1)[0].decode()
    return ""


class Site(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def reply(
        self, status: int, body: bytes, kind: str = "text/html", headers: dict[str, str] | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def body(self) -> bytes:
        assert "chunked" not in self.headers.get("Transfer-Encoding", ""), "a chunked body arrived"
        return self.rfile.read(int(self.headers.get("Content-Length", "0")))

    def signed_in(self) -> bool:
        return f"session={SESSION}" in self.headers.get("Cookie", "")

    def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
        if self.path == "/login":
            self.reply(200, LOGIN_PAGE)
        elif self.path == "/totp":
            self.reply(200, TOTP_PAGE)
        elif self.path == "/home":
            if self.signed_in():
                self.reply(200, b"<html><head><title>home</title></head><body>welcome me</body></html>")
            else:
                self.reply(401, b"<html><head><title>out</title></head><body>not signed in</body></html>")
        else:
            self.reply(404, b"no")

    def do_POST(self) -> None:  # noqa: N802
        raw = self.body()
        kind = self.headers.get("Content-Type", "")
        cookie = {"Set-Cookie": f"session={SESSION}; HttpOnly; Secure; Path=/; Max-Age=86400"}
        if self.path in ("/login", "/login-multipart"):
            if kind.startswith("multipart/form-data"):
                pw = multipart_field(raw, kind, "password")
            else:
                pw = urllib.parse.parse_qs(raw.decode()).get("password", [""])[0]
            SEEN.append((self.path, pw))
            if pw == PASSWORD:
                self.reply(303, b"", headers={**cookie, "Location": "/home"})
            else:
                self.reply(401, b"<p>wrong password: " + html.escape(pw).encode() + b"</p>")
        elif self.path == "/api/login":
            pw = json.loads(raw).get("password", "")
            SEEN.append((self.path, pw))
            ok = pw == PASSWORD
            body = json.dumps({"ok": ok, "echo": pw}).encode()
            self.reply(200 if ok else 401, body, "application/json", cookie if ok else None)
        elif self.path == "/echo":
            self.reply(200, b"you sent: " + raw, "text/plain")
        elif self.path == "/echo-gzip":
            # Compressed whatever the request accepts.
            self.reply(200, gzip.compress(b"you sent: " + raw), "text/plain", {"Content-Encoding": "gzip"})
        elif self.path == "/echo-html":
            pw = urllib.parse.parse_qs(raw.decode()).get("password", [""])[0]
            SEEN.append((self.path, pw))
            page = "<html><head><title>echo</title></head><body><p id=said>" + html.escape(pw) + "</p></body></html>"
            self.reply(200, page.encode())
        elif self.path == "/totp":
            code = urllib.parse.parse_qs(raw.decode()).get("code", [""])[0]
            SEEN.append((self.path, code))
            if pyotp.TOTP(SEED).verify(code, valid_window=1):
                self.reply(200, b"<html><head><title>code ok</title></head><body>code ok</body></html>")
            else:
                self.reply(401, b"<html><head><title>code wrong</title></head><body>code wrong</body></html>")
        else:
            self.reply(404, b"no")

    def log_message(self, *args: Any) -> None:
        pass


class TlsServer(http.server.ThreadingHTTPServer):
    """Each connection's TLS handshake runs in that connection's own thread: a client that
    connects and says nothing (a browser's preconnect, held by the gateway) cannot hold up
    the accept loop, and so every other connection, the way a handshake in `accept` would."""

    def __init__(self, addr: Any, ctx: ssl.SSLContext) -> None:
        super().__init__(addr, Site)
        self.ctx = ctx

    def finish_request(self, request: Any, client_address: Any) -> None:
        request.settimeout(60)
        tls = self.ctx.wrap_socket(request, server_side=True)
        try:
            self.RequestHandlerClass(tls, client_address, self)
        finally:
            tls.close()


@pytest.fixture(scope="module")
def site() -> Any:
    # Every address: the same site is "another host" when reached as 127.0.0.1.
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(os.environ["SITE_CERT"], os.environ["SITE_KEY"])
    server = TlsServer(("0.0.0.0", 0), ctx)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    hostport = f"{ADDR}:{port}"
    for name, value, kind in (("SITE_PASSWORD", PASSWORD, "value"), ("SITE_OTP", SEED, "totp")):
        status, v = api("PUT", f"/v1/secrets/{name}", {"value": value, "hosts": [hostport], "kind": kind})
        assert status in (200, 201), v
        assert v["kind"] == kind, v
    yield hostport
    server.shutdown()


def wait_template(name: str) -> None:
    deadline = time.time() + SLOW
    while True:
        status, v = api("GET", "/v1/templates")
        if status == 200 and name in [t["name"] for t in v["templates"]]:
            return
        assert time.time() < deadline, f"no {name} template: {status} {v}"
        time.sleep(2)


def create(template: str, allow: list[str]) -> dict[str, Any]:
    wait_template(template)
    status, sb = api(
        "POST",
        "/v1/sandboxes",
        {
            "template": template,
            "secrets": ["SITE_PASSWORD", "SITE_OTP"],
            "egress": {"default": "deny", "allow": allow},
        },
    )
    assert status == 201, sb
    return sb


def placeholder(sb: dict[str, Any], name: str) -> str:
    return next(s["placeholder"] for s in sb["secrets"] if s["name"] == name)


# ---- curl in base -----------------------------------------------------------------------


def test_curl_posts_placeholders_and_sees_only_placeholders(site: str) -> None:
    port = site.rsplit(":", 1)[1]
    other = f"127.0.0.1:{port}"
    sb = create("base", [site, other])
    sid, ph = sb["id"], placeholder(sb, "SITE_PASSWORD")
    base = f"https://{site}"
    curl = "unset NO_PROXY no_proxy; curl -sS -m 120 --suppress-connect-headers"

    # A form: the site signs in and sets its cookie.
    SEEN.clear()
    code, out, err = run(sid, f'{curl} -D - -o /dev/null -d "user=me&password=$SITE_PASSWORD" {base}/login')
    assert code == 0, err
    assert SEEN == [("/login", PASSWORD)], SEEN
    assert out.startswith(b"HTTP/1.1 303"), out
    assert f"session={SESSION}".encode() in out

    # JSON, and the site's JSON echo of it comes back as the placeholder.
    body = '{"user": "me", "password": "\'"$SITE_PASSWORD"\'"}'
    code, out, err = run(sid, f"{curl} -H 'Content-Type: application/json' -d '{body}' {base}/api/login")
    assert code == 0, err
    assert SEEN[-1] == ("/api/login", PASSWORD), SEEN
    assert json.loads(out) == {"ok": True, "echo": ph}, out

    # Multipart, and a chunked form body.
    code, out, err = run(sid, f'{curl} -o /dev/null -w "%{{http_code}}" -F user=me -F "password=$SITE_PASSWORD" {base}/login-multipart')
    assert (code, out) == (0, b"303"), err
    assert SEEN[-1] == ("/login-multipart", PASSWORD)
    code, out, err = run(
        sid,
        f'printf "user=me&password=%s" "$SITE_PASSWORD" > /tmp/form; '
        f'{curl} -o /dev/null -w "%{{http_code}}" -H "Transfer-Encoding: chunked" '
        f"-H 'Content-Type: application/x-www-form-urlencoded' --data-binary @/tmp/form {base}/login",
    )
    assert (code, out) == (0, b"303"), err
    assert SEEN[-1] == ("/login", PASSWORD)

    # Echoes, plain and compressed (asked for or not): the placeholder, never the value.
    for path, extra in (("/echo", ""), ("/echo-gzip", ""), ("/echo-gzip", "--compressed")):
        code, out, err = run(sid, f'{curl} {extra} -d "password=$SITE_PASSWORD" {base}{path}')
        assert code == 0, err
        assert out == f"you sent: password={ph}".encode(), (path, extra, out)
        assert_clean(out, f"the echo of {path}")

    # The one-time code of the moment.
    code, out, err = run(sid, f'{curl} -d "code=$SITE_OTP" {base}/totp')
    assert code == 0, err
    assert b"code ok" in out, out
    assert SEEN[-1][0] == "/totp" and len(SEEN[-1][1]) == 6 and SEEN[-1][1].isdigit(), SEEN

    # The same form to another host: refused, audited, nothing sent.
    before = len(SEEN)
    code, out, err = run(sid, f'{curl} -D - -d "user=me&password=$SITE_PASSWORD" https://{other}/login')
    assert code == 0, err
    assert out.startswith(b"HTTP/1.1 403"), out
    assert b"credential SITE_PASSWORD may not be sent to 127.0.0.1" in out, out
    assert len(SEEN) == before
    wait_audit(sid, "credential.exfiltration", "secret=SITE_PASSWORD host=127.0.0.1")
    wait_audit(sid, "credential.use", "secret=SITE_PASSWORD")

    # Nothing the guest can read holds the value.
    code, out, _ = run(sid, "cat /proc/self/environ /tmp/form 2>/dev/null; env")
    assert_clean(out, "the guest's environment")
    api("DELETE", f"/v1/sandboxes/{sid}")


# ---- Chromium in desktop ----------------------------------------------------------------


def files_with_password() -> list[str]:
    """The files of the deployment (the sandbox's memory file and disk, snapshots, the
    object store, the databases, logs) that hold the password in any encoding."""
    # One pass, every form as bytes (hex escapes, byte semantics: UTF-16 has NULs).
    pattern = "|".join("".join(f"\\x{b:02x}" for b in form) for form in encodings(PASSWORD))
    r = subprocess.run(
        ["grep", "-rlaP", "-e", pattern, "--", DATA_DIR],
        capture_output=True,
        env={**os.environ, "LC_ALL": "C"},
    )
    assert r.returncode in (0, 1), r.stderr
    return sorted(set(r.stdout.decode(errors="replace").splitlines()))


def test_chromium_logs_in_with_the_placeholder(site: str) -> None:
    sb = create("desktop", [site])
    sid = sb["id"]
    ph, otp = placeholder(sb, "SITE_PASSWORD"), placeholder(sb, "SITE_OTP")
    base = f"https://{site}"
    status, s = api("POST", f"/v1/sandboxes/{sid}/browser")
    assert status == 200, s

    with sync_playwright() as p:
        b = p.chromium.connect_over_cdp(s["cdp_url"], timeout=SLOW * 1000)
        ctx = b.contexts[0]
        page = ctx.pages[0] if ctx.pages else ctx.new_page()
        page.set_default_timeout(SLOW * 1000)

        # The agent types the placeholder; the site signs in with the password.
        SEEN.clear()
        page.goto(base + "/login")
        page.fill("#user", "me")
        page.fill("#password", ph)
        page.click("#go")
        page.wait_for_url(base + "/home")
        assert "welcome me" in page.content()
        assert SEEN == [("/login", PASSWORD)], SEEN
        cookies = [c for c in ctx.cookies(base) if c["name"] == "session"]
        assert cookies and cookies[0]["value"] == SESSION, cookies

        # An echoing page shows the placeholder.
        page.goto(base + "/login")
        page.fill("#echo", ph)
        page.click("#say")
        page.wait_for_url(base + "/echo-html")
        assert page.text_content("#said") == ph
        assert SEEN[-1] == ("/echo-html", PASSWORD)
        assert_clean(page.content().encode(), "the echo page's DOM")
        assert_clean(page.screenshot(), "a screenshot")

        # A JSON login from page script: its echo is the placeholder too.
        reply = page.evaluate(
            "async (pw) => { const r = await fetch('/api/login', {method: 'POST', "
            "headers: {'Content-Type': 'application/json'}, body: JSON.stringify({password: pw})}); "
            "return await r.text(); }",
            ph,
        )
        assert json.loads(reply) == {"ok": True, "echo": ph}, reply

        # The second factor: the placeholder of the TOTP secret becomes the current code.
        page.goto(base + "/totp")
        page.fill("#code", otp)
        page.click("#check")
        page.wait_for_load_state()
        assert page.title() == "code ok", page.content()

        # The fill call types the placeholder for the agent.
        page.goto(base + "/login")
        status, v = api(
            "POST", f"/v1/sandboxes/{sid}/browser/fill", {"secret": "SITE_PASSWORD", "selector": "#password"}
        )
        assert status == 200, v
        assert v == {"secret": "SITE_PASSWORD", "mode": "placeholder", "origin": base, "field": "input[type=password]"}, v
        assert page.input_value("#password") == ph
        page.fill("#user", "me")
        page.click("#go")
        page.wait_for_url(base + "/home")
        assert SEEN[-1] == ("/login", PASSWORD)
        assert_clean(page.content().encode(), "the DOM")
        status, v = api("POST", f"/v1/sandboxes/{sid}/browser/fill", {"secret": "SITE_PASSWORD", "selector": "#nothing"})
        assert status == 409 and "matches" in v["error"]["message"], v
        b.close()
    wait_audit(sid, "credential.fill", "secret=SITE_PASSWORD mode=placeholder")

    # Suspended: the memory file, the disk, the snapshot in the object store: no password.
    status, v = api("POST", f"/v1/sandboxes/{sid}/suspend", {})
    assert status == 200 and v["state"] == "suspended", v
    assert files_with_password() == []

    # Woken: still signed in. Then the value mode types the value, on the bound origin only.
    status, s = api("POST", f"/v1/sandboxes/{sid}/browser")
    assert status == 200, s
    with sync_playwright() as p:
        b = p.chromium.connect_over_cdp(s["cdp_url"], timeout=SLOW * 1000)
        ctx = b.contexts[0]
        page = ctx.pages[0] if ctx.pages else ctx.new_page()
        page.set_default_timeout(SLOW * 1000)
        page.goto(base + "/home")
        assert "welcome me" in page.content()
        page.goto(base + "/login")
        status, v = api(
            "POST",
            f"/v1/sandboxes/{sid}/browser/fill",
            {"secret": "SITE_PASSWORD", "selector": "#password", "mode": "value"},
        )
        assert status == 200 and v["mode"] == "value", v
        assert page.input_value("#password") == PASSWORD
        page.goto("data:text/html,<input id=password type=password>")
        status, v = api(
            "POST",
            f"/v1/sandboxes/{sid}/browser/fill",
            {"secret": "SITE_PASSWORD", "selector": "#password", "mode": "value"},
        )
        assert status == 403, v
        assert page.input_value("#password") == ""
        b.close()
    wait_audit(sid, "credential.fill", "mode=value origin=" + base)

    # The same scan finds the value once it did enter the VM (the value mode typed it): the
    # scan above could have seen it.
    status, v = api("POST", f"/v1/sandboxes/{sid}/suspend", {})
    assert status == 200 and v["state"] == "suspended", v
    assert files_with_password() != [], "the scan finds nothing even where the value is"
    api("DELETE", f"/v1/sandboxes/{sid}")
