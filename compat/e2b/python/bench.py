"""E2B's Python SDK against space's own, in one run on one server: create to first command,
and a command round trip on a running sandbox (what the E2B facade adds).

    make bench ARGS=e2b     (or: python bench.py --runs 20, with SPACE_URL, SPACE_API_KEY set)

Both run the command E2B's commands.run sends (bash -l -c true), and a stat (get_info against
the /v1 stat) shows what the facade adds without a shell's start-up in the way. Prints a table
(p50/p90/p99 in ms) and the ratios E2B / space at p50. The two SDKs alternate,
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


def e2b_env():
    """The server's URL and key (SPACE_URL, SPACE_API_KEY), given to the E2B SDK unless its
    own variables say otherwise."""
    url, key = os.environ["SPACE_URL"], os.environ["SPACE_API_KEY"]
    os.environ.setdefault("E2B_API_URL", url)
    os.environ.setdefault("E2B_SANDBOX_URL", url)
    os.environ.setdefault("E2B_API_KEY", key)
    return url, key


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--round-trips", type=int, default=200)
    ap.add_argument("--template", default="base")
    a = ap.parse_args()
    url, key = e2b_env()
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
        # The command E2B's commands.run sends.
        sb.exec(["/bin/bash", "-l", "-c", "true"])
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
    s.files.write("/tmp/bench-stat.txt", "x")
    rt = {"e2b": [], "space": []}
    st = {"e2b": [], "space": []}
    calls = [
        (rt, "e2b", lambda: s.commands.run("true", user="root")),
        (rt, "space", lambda: sb.exec(["/bin/bash", "-l", "-c", "true"])),
        (st, "e2b", lambda: s.files.get_info("/tmp/bench-stat.txt", user="root")),
        (st, "space", lambda: sb.files.stat("/tmp/bench-stat.txt")),
    ]
    for i in range(a.round_trips + 10):
        # Each pair in alternating order, so neither side always follows a command's exit.
        order = calls if i % 2 == 0 else [calls[1], calls[0], calls[3], calls[2]]
        for table, name, call in order:
            t = time.perf_counter()
            call()
            took = (time.perf_counter() - t) * 1000
            if i >= 10:  # the first ones warm connections up
                table[name].append(took)
    s.kill()

    print("| operation                                    |   n |  p50 ms  |  p90 ms  |  p99 ms  |  mean ms |")
    print("|----------------------------------------------|-----|----------|----------|----------|----------|")
    print(row("create -> first command, E2B SDK", create["e2b"]))
    print(row("create -> first command, space SDK", create["space"]))
    print(row('commands.run("true"), E2B SDK (envd facade)', rt["e2b"]))
    print(row("exec bash -l -c true, space SDK (/v1)", rt["space"]))
    print(row("files.get_info, E2B SDK (envd Stat)", st["e2b"]))
    print(row("files.stat, space SDK (/v1)", st["space"]))
    print()
    for name, xs in [
        ("create -> first command", create),
        ("command round trip", rt),
        ("stat round trip", st),
    ]:
        e, sp = pct(xs["e2b"], 50), pct(xs["space"], 50)
        print(f"{name}, E2B / space (p50): {e / sp:.2f}x ({e - sp:+.2f} ms)")


if __name__ == "__main__":
    main()
