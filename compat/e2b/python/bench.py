"""E2B's Python SDK against space's own, in one run on one server: create to first command,
and a command round trip on a running sandbox (what the E2B facade adds).

    make bench ARGS=e2b     (or: python bench.py --runs 20, with SPACE_URL, SPACE_API_KEY set)

Prints a table (p50/p90/p99 in ms) and the ratios E2B / space at p50. The two SDKs alternate,
run for run, so both see the same machine at the same moment.
"""

import argparse
import os
import statistics
import sys
import time

import e2b
import httpx
import space_sdk


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def row(name, xs):
    return f"| {name:<44} | {len(xs):>3} | {pct(xs, 50):>8.2f} | {pct(xs, 90):>8.2f} | {pct(xs, 99):>8.2f} | {statistics.mean(xs):>8.2f} |"


def wait_pool_full(http, template, limit=180.0):
    """Waits until the template's warm pool is full (from /metrics), so every create is
    measured from the same state."""
    start = time.monotonic()
    while time.monotonic() - start < limit:
        ready = size = None
        for line in http.get("/metrics").text.splitlines():
            if line.startswith(f'space_pool_ready{{template="{template}"}} '):
                ready = float(line.split()[-1])
            if line.startswith(f'space_pool_size{{template="{template}"}} '):
                size = float(line.split()[-1])
        if size and ready is not None and ready >= size:
            return
        time.sleep(0.02)
    raise SystemExit(f"the warm pool of {template} did not fill within {limit:.0f} s")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--round-trips", type=int, default=200)
    ap.add_argument("--template", default="base")
    a = ap.parse_args()
    url, key = os.environ["SPACE_URL"], os.environ["SPACE_API_KEY"]
    os.environ.setdefault("E2B_API_URL", url)
    os.environ.setdefault("E2B_SANDBOX_URL", url)
    os.environ.setdefault("E2B_API_KEY", key)
    client = space_sdk.Space(url=url, api_key=key)
    http = httpx.Client(base_url=url)

    def via_e2b():
        t = time.perf_counter()
        s = e2b.Sandbox.create(a.template)
        s.commands.run("true", user="root")
        took = (time.perf_counter() - t) * 1000
        s.kill()
        return took

    def via_space():
        t = time.perf_counter()
        sb = space_sdk.Sandbox.create(template=a.template, client=client)
        sb.exec(["true"])
        took = (time.perf_counter() - t) * 1000
        sb.kill()
        return took

    # Alternating which goes first; the pool full before each; one uncounted pair first.
    create = {"e2b": [], "space": []}
    for i in range(a.runs + 1):
        order = [("e2b", via_e2b), ("space", via_space)]
        if i % 2:
            order.reverse()
        for name, f in order:
            wait_pool_full(http, a.template)
            took = f()
            if i > 0:
                create[name].append(took)
        if i > 0:
            print(f"[bench] create -> first command {i}/{a.runs}", file=sys.stderr, flush=True)

    # One sandbox, reached through both APIs: the same guest, the same command.
    s = e2b.Sandbox.create(a.template)
    sb = space_sdk.Sandbox.connect(s.sandbox_id, client=client)
    rt = {"e2b": [], "space": []}
    for i in range(a.round_trips + 10):
        t = time.perf_counter()
        s.commands.run("true", user="root")
        d1 = (time.perf_counter() - t) * 1000
        t = time.perf_counter()
        sb.exec(["/bin/bash", "-l", "-c", "true"])
        d2 = (time.perf_counter() - t) * 1000
        if i >= 10:  # the first ones warm connections up
            rt["e2b"].append(d1)
            rt["space"].append(d2)
    s.kill()

    print("| operation                                    |   n |  p50 ms  |  p90 ms  |  p99 ms  |  mean ms |")
    print("|----------------------------------------------|-----|----------|----------|----------|----------|")
    print(row("create -> first command, E2B SDK", create["e2b"]))
    print(row("create -> first command, space SDK", create["space"]))
    print(row('commands.run("true"), E2B SDK (envd facade)', rt["e2b"]))
    print(row("exec bash -l -c true, space SDK (/v1)", rt["space"]))
    print()
    print(f"create -> first command, E2B / space (p50): {pct(create['e2b'], 50) / pct(create['space'], 50):.2f}x")
    diff = pct(rt["e2b"], 50) - pct(rt["space"], 50)
    print(f"round trip, E2B / space (p50): {pct(rt['e2b'], 50) / pct(rt['space'], 50):.2f}x ({diff:+.2f} ms)")


if __name__ == "__main__":
    main()
