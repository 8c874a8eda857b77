"""A desktop sandbox measured through the clients an agent uses, on one server in one run:

    make bench ARGS=desktop     (or: python bench.py, with SPACE_URL, SPACE_API_KEY,
                                 SPACE_DATA_DIR set and E2B_* pointed at the server)

1. Create to first screenshot with the e2b-desktop SDK (its create starts Xvfb and Xfce;
   then `screenshot()`), from the pool (`desktop`, the pool full before each) and without a
   pool member (`desktop-cold`, the same image and shape with no pool: the template's
   snapshot restored into a new clone).
2. Per action on one desktop, the three clients alternating: screenshot, click, and typing 25
   characters (xdotool's per-key delay 20 ms in all three, which `type_text` uses) through
   e2b-desktop (envd's process API), the native API (`/v1` exec, and a file read for the
   screenshot) and the MCP tools over HTTP (`/mcp`).
3. The browser over CDP: `POST /v1/sandboxes/{id}/browser`, Playwright's
   `connect_over_cdp`, then `page.goto` of a small page and `page.evaluate("1")`.
4. Idle cost: a desktop (Xfce up, nothing open) beside a `base` sandbox, settled for 20 s:
   QEMU's PSS, and its CPU over 10 s. Then each one's first suspend: what it wrote for the
   guest's memory and device state (its root disk is a copy-on-write clone of the template's,
   so only changed blocks are its own).

Prints tables (p50/p90/p99 in ms) and ratios; nothing is asserted.
"""

import argparse
import itertools
import os
import statistics
import sys
import time

import anyio
import httpx
import httpx2
import space_sdk
from e2b_desktop import Sandbox as Desktop
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from playwright.sync_api import sync_playwright

TEXT = "abcdefghijklmnopqrstuvwxy"  # 25 characters
assert len(TEXT) == 25
DELAY_MS = 20
# Clicks alternate between two points: xdotool's `mousemove --sync` to where the pointer
# already is waits for a move that never comes (seconds), which no agent clicking around pays.
POINTS = itertools.cycle([(512, 384), (520, 392)])


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def row(name, xs):
    return (
        f"| {name:<52} | {len(xs):>3} | {pct(xs, 50):>9.1f} | {pct(xs, 90):>9.1f} | "
        f"{pct(xs, 99):>9.1f} | {statistics.mean(xs):>9.1f} |"
    )


def header():
    print(f"| {'operation (ms)':<52} |   n |       p50 |       p90 |       p99 |      mean |")
    print(f"|{'-' * 54}|-----|-----------|-----------|-----------|-----------|")


def progress(msg):
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def timed(f):
    t = time.perf_counter()
    f()
    return (time.perf_counter() - t) * 1000


def metric(http, name, template):
    for line in http.get("/metrics").text.splitlines():
        if line.startswith(f'{name}{{template="{template}"}} '):
            return float(line.split()[-1])
    return None


def wait_pool_full(http, template, limit=600.0):
    start = time.monotonic()
    while time.monotonic() - start < limit:
        size = metric(http, "space_pool_size", template)
        ready = metric(http, "space_pool_ready", template)
        if size and ready is not None and ready >= size:
            return
        time.sleep(0.1)
    raise SystemExit(f"the warm pool of {template} did not fill within {limit:.0f} s")


def wait_templates(http, names, limit=1800.0):
    """Waits until every template of `names` is built (the desktop ones are prepared in the
    background after the server starts)."""
    start = time.monotonic()
    while time.monotonic() - start < limit:
        have = {t["name"] for t in http.get("/v1/templates").json()["templates"]}
        if set(names) <= have:
            return
        time.sleep(1)
    raise SystemExit(f"templates {names} were not ready within {limit:.0f} s")


def create_to_screenshot(template):
    t = time.perf_counter()
    d = Desktop.create(template=template, timeout=600)
    d.screenshot()
    took = (time.perf_counter() - t) * 1000
    d.kill()
    return took


def qemu_pid(sandbox_id):
    """The QEMU process of `sandbox_id`: the one in the sandbox's cgroup."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cgroup") as f:
                groups = f.read()
            with open(f"/proc/{pid}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        if sandbox_id in groups and comm.startswith("qemu"):
            return int(pid)
    raise SystemExit(f"no QEMU process found for {sandbox_id}")


def pss_mib(pid):
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    raise SystemExit(f"no Pss in /proc/{pid}/smaps_rollup")


def cpu_percent(pid, seconds=10.0):
    def ticks():
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime

    hz = os.sysconf("SC_CLK_TCK")
    a, t = ticks(), time.monotonic()
    time.sleep(seconds)
    return (ticks() - a) / hz / (time.monotonic() - t) * 100


def suspend_written_mib(data_dir, sandbox_id):
    """What the sandbox's newest snapshot occupies for memory and device state (allocated
    blocks of `mem` and `state`; the root disk's clone is left out)."""
    root = os.path.join(data_dir, "snapshots", sandbox_id)
    newest = sorted(os.listdir(root))[-1]
    total = 0
    for name in ("mem", "state"):
        p = os.path.join(root, newest, name)
        if os.path.exists(p):
            total += os.stat(p).st_blocks * 512
    return total / (1 << 20)


async def mcp_actions(url, key, sid, rounds):
    auth = {"Authorization": f"Bearer {key}"}
    out = {"screenshot": [], "click": [], "type": []}
    async with (
        httpx2.AsyncClient(headers=auth, timeout=300) as h2,
        Client(streamable_http_client(f"{url}/mcp", http_client=h2), read_timeout_seconds=300) as c,
    ):
        calls = {
            "screenshot": lambda: ("screenshot", {"sandbox_id": sid}),
            "click": lambda: ("click", {"sandbox_id": sid, **dict(zip("xy", next(POINTS)))}),
            "type": lambda: ("type_text", {"sandbox_id": sid, "text": TEXT}),
        }
        for i in range(rounds + 2):
            for name, make in calls.items():
                tool, args = make()
                t = time.perf_counter()
                r = await c.call_tool(tool, args)
                ms = (time.perf_counter() - t) * 1000
                if r.is_error:
                    raise SystemExit(f"MCP {tool} failed: {r.content}")
                if i >= 2:
                    out[name].append(ms)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5, help="creates per way")
    ap.add_argument("--actions", type=int, default=20, help="rounds of actions per client")
    a = ap.parse_args()
    url, key = os.environ["SPACE_URL"].rstrip("/"), os.environ["SPACE_API_KEY"]
    data_dir = os.environ["SPACE_DATA_DIR"]
    http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=300)
    client = space_sdk.Space(url=url, api_key=key)
    progress("waiting for the desktop templates")
    wait_templates(http, ["desktop", "desktop-cold", "base"])

    # 1. Create to first screenshot, pool and cold alternating.
    creates = {"pool": [], "cold": []}
    for i in range(a.runs + 1):
        order = [("pool", "desktop"), ("cold", "desktop-cold")]
        if i % 2:
            order.reverse()
        for name, template in order:
            wait_pool_full(http, "desktop")
            took = create_to_screenshot(template)
            if i > 0:
                creates[name].append(took)
        progress(f"create -> first screenshot {i}/{a.runs}")

    # 2. Per action, one desktop, three clients.
    d = Desktop.create(template="desktop", timeout=3600)
    sid = d.sandbox_id
    sb = space_sdk.Sandbox.connect(sid, client=client)
    env = {"DISPLAY": ":0"}

    def native_screenshot():
        r = sb.exec(["scrot", "--overwrite", "/tmp/bench-shot.png"], env=env)
        assert r.exit_code == 0, r.stderr
        assert sb.files.read("/tmp/bench-shot.png")[:4] == b"\x89PNG"

    def native(cmd):
        def f():
            r = sb.exec(cmd(), env=env)
            assert r.exit_code == 0, r.stderr
        return f

    def native_click():
        x, y = next(POINTS)
        return ["xdotool", "mousemove", "--sync", str(x), str(y), "click", "1"]

    ways = {
        "e2b-desktop": {
            "screenshot": lambda: d.screenshot(),
            "click": lambda: d.left_click(*next(POINTS)),
            "type": lambda: d.write(TEXT, delay_in_ms=DELAY_MS),
        },
        "native API": {
            "screenshot": native_screenshot,
            "click": native(native_click),
            "type": native(lambda: ["xdotool", "type", "--delay", str(DELAY_MS), "--", TEXT]),
        },
    }
    actions = {w: {k: [] for k in ("screenshot", "click", "type")} for w in ways}
    for i in range(a.actions + 2):
        order = list(ways.items()) if i % 2 == 0 else list(reversed(list(ways.items())))
        for w, calls in order:
            for k, f in calls.items():
                ms = timed(f)
                if i >= 2:
                    actions[w][k].append(ms)
        if i % 5 == 0:
            progress(f"actions {i}/{a.actions + 2}")
    progress("actions through the MCP tools")
    actions["MCP tools"] = anyio.run(mcp_actions, url, key, sid, a.actions)

    # 3. The browser over CDP.
    progress("the browser over CDP")
    session = http.post(f"/v1/sandboxes/{sid}/browser").json()
    cdp = {"goto": [], "evaluate": []}
    page_url = "data:text/html,<title>bench</title><p>hello</p>"
    with sync_playwright() as p:
        b = p.chromium.connect_over_cdp(
            session["cdp_url"], headers={"Authorization": f"Bearer {key}"}, timeout=300_000
        )
        ctx = b.contexts[0] if b.contexts else b.new_context()
        page = ctx.new_page()
        for i in range(a.actions + 3):
            g = timed(lambda: page.goto(page_url, wait_until="load", timeout=120_000))
            e = timed(lambda: page.evaluate("1"))
            if i >= 3:
                cdp["goto"].append(g)
                cdp["evaluate"].append(e)
        page.close()
        b.close()
    d.kill()

    # 4. Idle cost and the first suspend, a fresh desktop beside a base sandbox.
    progress("idle memory and CPU, first suspend")
    idle = Desktop.create(template="desktop", timeout=3600)
    base = space_sdk.Sandbox.create(template="base", client=client)
    time.sleep(20)
    rows = []
    for name, sid_ in (("desktop (Xfce up, idle)", idle.sandbox_id), ("base", base.id)):
        pid = qemu_pid(sid_)
        rows.append([name, pss_mib(pid), cpu_percent(pid)])
    for r, sid_ in zip(rows, (idle.sandbox_id, base.id)):
        http.post(f"/v1/sandboxes/{sid_}/suspend").raise_for_status()
        r.append(suspend_written_mib(data_dir, sid_))
    idle.kill()
    base.kill()

    print("Create to first screenshot (e2b-desktop: create, Xvfb and Xfce up, screenshot()):")
    header()
    print(row("desktop from the pool", creates["pool"]))
    print(row("desktop without a pool member (snapshot restore)", creates["cold"]))
    print()
    print(f"Per action on one desktop (typing: 25 characters, {DELAY_MS} ms per key in all three):")
    header()
    for w in ("e2b-desktop", "native API", "MCP tools"):
        for k, label in (("screenshot", "screenshot"), ("click", "click"), ("type", "type 25 characters")):
            print(row(f"{label}, {w}", actions[w][k]))
    print()
    for k in ("screenshot", "click", "type"):
        n = pct(actions["native API"][k], 50)
        e = pct(actions["e2b-desktop"][k], 50)
        m = pct(actions["MCP tools"][k], 50)
        print(f"{k}: e2b-desktop / native {e / n:.2f}x, MCP / native {m / n:.2f}x (p50)")
    print()
    print("The browser over CDP (Playwright connect_over_cdp through the API's proxy):")
    header()
    print(row("page.goto(small data: page), load", cdp["goto"]))
    print(row('page.evaluate("1")', cdp["evaluate"]))
    print()
    print("Idle for 20 s, then CPU over 10 s; the first suspend's memory and device state:")
    print(f"| {'sandbox':<28} | {'QEMU PSS MiB':>12} | {'CPU %':>7} | {'suspend MiB':>11} |")
    print(f"|{'-' * 30}|{'-' * 14}|{'-' * 9}|{'-' * 13}|")
    for name, pss, cpu, sus in rows:
        print(f"| {name:<28} | {pss:>12.1f} | {cpu:>7.1f} | {sus:>11.1f} |")
    print()
    print(
        f"desktop / base: PSS {rows[0][1] / rows[1][1]:.2f}x, "
        f"first suspend {rows[0][3] / max(rows[1][3], 0.1):.2f}x"
    )
    print(
        "Anchors (published, other hardware): Kernel browser create p50 30 ms; a Firecracker "
        "browser restore 130 ms; Browser Use create p50 825 ms."
    )


if __name__ == "__main__":
    main()
