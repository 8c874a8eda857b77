"""The web console in the host's Chromium, on one server in one run
(docs/benchmarks/console.md):

    make bench ARGS="console"   (or: python bench_console.py, with SPACE_URL, SPACE_API_KEY
                                 and SPACE_BIN set)

1. Time to interactive of the sandbox list with many sandboxes (most suspended, a few
   running, so the CPU sparklines are fetched too): from navigation to every row on the
   page, cold (a fresh browser profile: every file fetched) and warm (a reload: the files
   revalidated, 304s), alternating; and the page's weight.
2. Keystroke echo latency in one sandbox's terminal: a key into the console's xterm.js (over
   the PTY WebSocket) until its echo is parsed, against a key into `space shell` (the CLI on
   a local pseudo-terminal) until its echo is read; blocks of each alternate.

Prints tables (p50/p90/p99 in ms) and the ratios at p50.
"""

import argparse
import concurrent.futures
import json
import os
import pty
import select
import statistics
import sys
import time
import urllib.error
import urllib.request

from playwright.sync_api import sync_playwright

URL = os.environ["SPACE_URL"]
KEY = os.environ["SPACE_API_KEY"]


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def row(name, xs):
    return (
        f"| {name:<46} | {len(xs):>4} | {pct(xs, 50):>8.2f} | {pct(xs, 90):>8.2f} "
        f"| {pct(xs, 99):>8.2f} | {statistics.mean(xs):>8.2f} |"
    )


def table(title, rows):
    print(f"\n{title}\n")
    print(f"| {'what':<46} | {'n':>4} | {'p50':>8} | {'p90':>8} | {'p99':>8} | {'mean':>8} |")
    print(f"|{'-' * 48}|{'-' * 6}|{'-' * 10}|{'-' * 10}|{'-' * 10}|{'-' * 10}|")
    for name, xs in rows:
        print(row(name, xs))


def api(method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(URL + path, data=data, method=method)
    req.add_header("Authorization", f"Bearer {KEY}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            text = r.read()
    except urllib.error.HTTPError as e:
        raise SystemExit(f"{method} {path}: {e.code} {e.read().decode(errors='replace')}")
    return json.loads(text) if text else None


def progress(msg):
    print(f"[console] {msg}", file=sys.stderr, flush=True)


def make_sandboxes(template, count, running):
    """`count` sandboxes, all but the first `running` suspended as soon as they are made (a
    fleet that is mostly asleep; and so they never all hold memory at once)."""
    # The deployment's key is the `default` tenant's; its quota holds 100 sandboxes.
    tenant = api("GET", "/v1/tenants")["tenants"]
    quotas = next(t for t in tenant if t["name"] == "default")["quotas"]
    quotas["max_sandboxes"] = max(quotas["max_sandboxes"], count + 20)
    api("PATCH", "/v1/tenants/default", {"quotas": quotas})
    progress(f"creating {count} sandboxes of {template} ({running} stay running)")
    made = []

    def one(i):
        sid = api("POST", "/v1/sandboxes", {"template": template})["id"]
        if i >= running:
            api("POST", f"/v1/sandboxes/{sid}/suspend")
        made.append(sid)
        if len(made) % 20 == 0:
            progress(f"{len(made)} made")
        return sid

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        return list(pool.map(one, range(count)))


# Installed before the console's own scripts (through DevTools, which the page's policy does
# not govern): the key in the tab's session storage, and the moment the list first holds
# every row.
def init_script(rows):
    return f"""
sessionStorage.setItem('space.key', {json.dumps(KEY)});
window.__listReady = null;
new MutationObserver(() => {{
  if (window.__listReady === null &&
      document.querySelectorAll('[data-test=sandbox-row]').length >= {rows}) {{
    window.__listReady = performance.now();
  }}
}}).observe(document, {{childList: true, subtree: true}});
"""


WEIGHT = """() => {
  const all = [performance.getEntriesByType('navigation')[0],
               ...performance.getEntriesByType('resource')];
  const files = all.filter(e => !e.name.includes('/v1/'));
  return {transfer: files.reduce((s, e) => s + (e.transferSize || 0), 0),
          body: files.reduce((s, e) => s + (e.decodedBodySize || 0), 0),
          files: files.length};
}"""


def list_ready(page, rows, timeout=300):
    deadline = time.time() + timeout
    while True:
        t = page.evaluate("window.__listReady")
        if t is not None:
            return t
        if time.time() > deadline:
            raise SystemExit(f"the list never showed {rows} rows")
        time.sleep(0.02)


def time_to_interactive(browser, rows, loads):
    cold, warm, weights = [], [], []
    for i in range(loads):
        ctx = browser.new_context(viewport={"width": 1400, "height": 900})
        ctx.add_init_script(init_script(rows))
        page = ctx.new_page()
        page.goto(URL + "/#/sandboxes")
        cold.append(list_ready(page, rows))
        weights.append(page.evaluate(WEIGHT))
        page.reload()
        warm.append(list_ready(page, rows))
        if i == 0:
            weights.append(page.evaluate(WEIGHT) | {"warm": True})
        ctx.close()
        progress(f"load {i + 1}/{loads}: cold {cold[-1]:.0f} ms, warm {warm[-1]:.0f} ms")
    return cold, warm, weights


TYPE_IN_CONSOLE = """async ([n, pause]) => {
  const t = window.spaceConsole.terminal;
  const out = [];
  for (let i = 0; i < n; i++) {
    const ch = String.fromCharCode(97 + (i % 26));
    out.push(await new Promise((done) => {
      const start = performance.now();
      const d = t.onWriteParsed(() => { d.dispose(); done(performance.now() - start); });
      t.input(ch, true);
    }));
    await new Promise((r) => setTimeout(r, pause));
  }
  t.input('\\u0015', true);  // clear the line
  await new Promise((r) => setTimeout(r, 200));
  return out;
}"""


def console_terminal(browser, sid):
    ctx = browser.new_context(viewport={"width": 1400, "height": 900})
    ctx.add_init_script(init_script(10**9))
    page = ctx.new_page()
    page.goto(f"{URL}/#/sandboxes/{sid}/terminal")
    deadline = time.time() + 120
    while not page.evaluate(
        "() => { const t = window.spaceConsole && window.spaceConsole.terminal;"
        " if (!t) return false; const b = t.buffer.active;"
        " const l = b.getLine(b.cursorY + b.viewportY);"
        " return !!l && /[$#] $/.test(l.translateToString(false).trimEnd() + ' '); }"
    ):
        if time.time() > deadline:
            raise SystemExit("no prompt in the console's terminal")
        time.sleep(0.2)
    return ctx, page


class Shell:
    """`space shell ID` on a local pseudo-terminal."""

    def __init__(self, sid):
        env = dict(os.environ, SPACE_URL=URL, SPACE_API_KEY=KEY, TERM="xterm")
        pid, fd = pty.fork()
        if pid == 0:
            os.execve(os.environ["SPACE_BIN"], ["space", "shell", sid], env)
        self.pid, self.fd = pid, fd
        self.read_until(lambda b: b.rstrip().endswith((b"$", b"#")), 120)

    def read_until(self, done, timeout):
        buf = b""
        deadline = time.monotonic() + timeout
        while not done(buf):
            left = deadline - time.monotonic()
            if left <= 0:
                raise SystemExit(f"space shell: timed out; got {buf[-200:]!r}")
            r, _, _ = select.select([self.fd], [], [], left)
            if r:
                buf += os.read(self.fd, 65536)
        return buf

    def keystrokes(self, n, pause):
        out = []
        for i in range(n):
            ch = bytes([97 + i % 26])
            start = time.perf_counter()
            os.write(self.fd, ch)
            self.read_until(lambda b: ch in b, 30)
            out.append((time.perf_counter() - start) * 1000)
            time.sleep(pause / 1000)
        os.write(self.fd, b"\x15")
        time.sleep(0.2)
        try:
            os.read(self.fd, 65536)
        except OSError:
            pass
        return out

    def close(self):
        os.write(self.fd, b"exit\r")
        time.sleep(0.5)
        try:
            os.kill(self.pid, 9)
        except ProcessLookupError:
            pass
        os.waitpid(self.pid, 0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--template", default="base")
    ap.add_argument("--sandboxes", type=int, default=200)
    ap.add_argument("--running", type=int, default=5)
    ap.add_argument("--loads", type=int, default=10)
    ap.add_argument("--keystrokes", type=int, default=200)
    ap.add_argument("--block", type=int, default=20)
    ap.add_argument("--pause-ms", type=int, default=20)
    a = ap.parse_args()

    ids = make_sandboxes(a.template, a.sandboxes, a.running)
    rows = len(api("GET", "/v1/sandboxes")["sandboxes"])
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=os.environ.get("SPACE_CHROMIUM", "/usr/bin/chromium"),
            headless=True,
            args=["--no-sandbox"],
        )
        cold, warm, weights = time_to_interactive(browser, rows, a.loads)

        progress("keystroke echo: the console's terminal against space shell, alternating")
        ctx, page = console_terminal(browser, ids[0])
        shell = Shell(ids[0])
        in_console, in_shell = [], []
        while len(in_console) < a.keystrokes:
            n = min(a.block, a.keystrokes - len(in_console))
            in_console += page.evaluate(TYPE_IN_CONSOLE, [n, a.pause_ms])
            in_shell += shell.keystrokes(n, a.pause_ms)
        shell.close()
        ctx.close()
        browser.close()

    table(
        f"Time to interactive of the sandbox list with {rows} sandboxes "
        f"({a.running} running), ms from navigation to every row on the page",
        [("cold (fresh profile: every file fetched)", cold),
         ("warm (reload: files revalidated, 304)", warm)],
    )
    w_cold = weights[0]
    w_warm = next(w for w in weights if w.get("warm"))
    print(
        f"\npage weight: {w_cold['files']} files, {w_cold['body'] / 1024:.0f} KiB of files "
        f"({w_cold['transfer'] / 1024:.0f} KiB transferred cold, "
        f"{w_warm['transfer'] / 1024:.1f} KiB on a warm reload); API answers not counted"
    )
    table(
        "Keystroke echo latency in one sandbox's terminal, ms from key to echo",
        [("console (xterm.js, PTY WebSocket)", in_console),
         ("space shell (CLI on a local pty)", in_shell)],
    )
    print(
        f"\nratios at p50: warm/cold load {pct(warm, 50) / pct(cold, 50):.2f}x; "
        f"console/shell echo {pct(in_console, 50) / pct(in_shell, 50):.2f}x"
    )
    progress("killing the sandboxes")
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda i: api("DELETE", f"/v1/sandboxes/{i}"), ids))


if __name__ == "__main__":
    main()
