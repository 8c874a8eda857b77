"""The web console in the host's Chromium, driven by Playwright, against a live space server.

The driver (crates/space/tests/console.rs) starts `space up` and sets SPACE_URL,
SPACE_API_KEY (an admin key), SPACE_TENANT_KEY and SPACE_OTHER_KEY (keys of two tenants),
SPACE_BIN (the CLI) and SPACE_ARTIFACTS (where screenshots go).
"""

import json
import os
import pathlib
import subprocess
import time
import urllib.request

import pytest
from playwright.sync_api import sync_playwright

URL = os.environ["SPACE_URL"]
ARTIFACTS = pathlib.Path(os.environ.get("SPACE_ARTIFACTS", "/tmp/space-console-artifacts"))


def api(method, path, key, body=None):
    """One call of the API (outside the browser), answering the parsed JSON."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(URL + path, data=data, method=method)
    req.add_header("Authorization", f"Bearer {key}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=300) as r:
        text = r.read()
    return json.loads(text) if text else None


def cli(key, *args, stdin=None):
    """The space CLI with `key`; answers its stdout, failing the test unless it exits 0."""
    env = {k: v for k, v in os.environ.items() if k != "SPACE_API_KEY"}
    env.update({"SPACE_URL": URL, "SPACE_API_KEY": key})
    out = subprocess.run(
        [os.environ["SPACE_BIN"], *args],
        input=stdin,
        capture_output=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, f"space {args}: {out.stderr.decode(errors='replace')}"
    return out.stdout.decode(errors="replace")


@pytest.fixture(scope="session")
def browser():
    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=os.environ.get("SPACE_CHROMIUM", "/usr/bin/chromium"),
            headless=True,
            args=["--no-sandbox"],
        )
        try:
            yield b
        finally:
            b.close()


class Watched:
    """A page whose dialogs (an `alert` a hostile name or output would run) and uncaught
    errors are recorded; a dialog is dismissed so the page goes on."""

    def __init__(self, page):
        self.page = page
        self.dialogs = []
        self.errors = []
        page.on("dialog", self._dialog)
        page.on("pageerror", lambda e: self.errors.append(str(e)))

    def _dialog(self, d):
        self.dialogs.append(d.message)
        d.dismiss()

    def shot(self, name):
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


@pytest.fixture
def console(browser):
    ctx = browser.new_context(viewport={"width": 1400, "height": 900})
    page = ctx.new_page()
    page.set_default_timeout(60_000)
    w = Watched(page)
    try:
        yield w
    finally:
        ctx.close()
    assert not w.dialogs, f"the page opened dialogs: {w.dialogs}"
    assert not w.errors, f"the page threw: {w.errors}"


def wait_until(page, expression, arg=None, timeout=60, what=None):
    """Polls `expression` (a JavaScript function of `arg`) with `page.evaluate` until it is
    truthy; answers its value. (Playwright's own `wait_for_function` evaluates strings in the
    page, which the console's policy forbids, as it should.)"""
    deadline = time.time() + timeout
    while True:
        value = page.evaluate(expression, arg)
        if value:
            return value
        assert time.time() < deadline, f"timed out waiting for {what or expression}"
        time.sleep(0.25)


def no_injected_markup(page):
    """Markup a sandbox controls never became elements: the policy would stop its scripts
    from running, so the elements themselves are looked for."""
    found = page.evaluate(
        "() => [...document.querySelectorAll('img, script:not([src]), iframe, object')]"
        ".map(e => e.outerHTML)"
    )
    assert not found, f"markup from the API became elements: {found}"


def login(w, key):
    page = w.page
    page.goto(URL + "/")
    wait_until(page, "() => window.spaceConsole && window.spaceConsole.ready")
    page.fill("[data-test=login-key]", key)
    page.click("[data-test=login-submit]")
    page.wait_for_selector("[data-test=nav-sandboxes]")
