"""The e2b-desktop SDK, unmodified, against a live space server.

The driver (crates/space/tests/e2b_desktop.rs) starts `space up` with the `desktop` template
and sets E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY for the SDK, plus SPACE_OTHER_KEY (a key
of another tenant), SPACE_CA (the path of the deployment CA's certificate, which signs the
https ingress hosts the SDK's stream URLs name) and SPACE_CHROMIUM (the host's Chromium, which
opens the live view).
"""

import json
import os
import re
import time
import urllib.request

import pytest
from e2b_desktop import Sandbox

# What a create hands every later process (the SDK adds DISPLAY itself).
MARK = "made-at-create"


def wait_for_desktop_template(limit=1800.0):
    """`space up` prepares `desktop` in the background after it starts (a create before then
    is a 503 with the progress): wait until the template is listed."""
    url = os.environ["E2B_API_URL"].rstrip("/") + "/v1/templates"
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {os.environ['E2B_API_KEY']}"})
    deadline = time.monotonic() + limit
    while True:
        with urllib.request.urlopen(req, timeout=60) as r:
            if "desktop" in {t["name"] for t in json.load(r)["templates"]}:
                return
        assert time.monotonic() < deadline, "the desktop template was not ready in time"
        time.sleep(2)


@pytest.fixture(scope="session")
def desktop():
    wait_for_desktop_template()
    sbx = Sandbox.create(
        timeout=1800,
        envs={"SPACE_MARK": MARK},
        metadata={"suite": "e2b-desktop"},
    )
    try:
        yield sbx
    finally:
        sbx.kill()


@pytest.fixture
def other_key():
    return os.environ["SPACE_OTHER_KEY"]


def until(what, check, timeout=60.0, interval=0.5):
    """Calls `check` until it returns something truthy, and returns that; fails after
    `timeout` seconds, naming `what`."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"{what}: not within {timeout} s (last: {last!r})")


def until_equal(what, get, want, timeout=60.0, interval=0.5):
    """Calls `get` until it returns `want`; fails after `timeout` seconds, naming `what` and
    showing what `get` last returned."""
    seen = [None]

    def check():
        seen[0] = get()
        return seen[0] == want

    try:
        until(what, check, timeout, interval)
    except AssertionError:
        raise AssertionError(
            f"{what}: not within {timeout} s (wanted {want!r}, last {seen[0]!r})"
        ) from None


class EventLog:
    """An `xev` window on the desktop: what the X server delivered to it, parsed.

    The window is put at a known place; clicks and keys aimed at it show up in its log as
    the events X delivered, so a test checks what the SDK's call did, not that it returned.

    The SDK's create returns once Xfce's processes run; under TCG the window manager takes
    charge of windows some seconds later (tens under load), and when it does it frames the
    windows already open, and a click sent in that moment can be lost. So the log waits
    until the window manager has made its window the active one, and measures it then.
    """

    def __init__(self, sbx, name, x=100, y=100, width=400, height=300):
        self.sbx = sbx
        self.path = f"/tmp/{name}.xev"
        self.title = f"space-{name}"
        sbx.commands.run(
            f"xev -name {self.title} -geometry {width}x{height}+{x}+{y} "
            f"-event button -event keyboard -event mouse > {self.path} 2>&1",
            background=True,
            timeout=0,
        ).disconnect()
        self.window = until(
            "the xev window shows",
            lambda: self._find(),
            timeout=60,
        )
        until("the window manager takes the xev window", self._active, timeout=180, interval=1)
        geo = sbx.commands.run(f"xdotool getwindowgeometry {self.window}").stdout
        px, py = re.search(r"Position: (\d+),(\d+)", geo).groups()
        w, h = re.search(r"Geometry: (\d+)x(\d+)", geo).groups()
        self.center = (int(px) + int(w) // 2, int(py) + int(h) // 2)
        self.box = (int(px), int(py), int(w), int(h))

    def _find(self):
        r = self.sbx.commands.run(
            f"xdotool search --onlyvisible --name '^{self.title}$' || true"
        )
        ids = r.stdout.split()
        return ids[0] if ids else None

    def _active(self):
        r = self.sbx.commands.run(
            f"timeout 10 xdotool windowactivate --sync {self.window} >/dev/null 2>&1; "
            "xdotool getactivewindow 2>/dev/null || true"
        )
        return r.stdout.strip() == self.window

    def text(self):
        return self.sbx.files.read(self.path)

    def _fields(self, kind, pattern):
        """`pattern`'s first group in each `kind` event logged so far that has it, in order."""
        out = []
        for block in self.text().split("\n\n"):
            if block.startswith(kind + " event"):
                m = re.search(pattern, block)
                if m:
                    out.append(m.group(1))
        return out

    def buttons(self, kind="ButtonPress"):
        """The buttons of the `kind` events so far, in order."""
        return [int(b) for b in self._fields(kind, r"button (\d+)")]

    def keys(self, kind="KeyPress"):
        """The key symbol names of the `kind` events so far, in order."""
        return self._fields(kind, r"\(keysym 0x[0-9a-f]+, ([^)]+)\)")

    def close(self):
        self.sbx.commands.run(f"xdotool windowkill {self.window} || true")
