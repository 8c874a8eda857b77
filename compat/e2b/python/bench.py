"""E2B's Python SDK against space's own, in one run on one server: create to first command,
and a command round trip on a running sandbox (what the E2B facade adds).

    make bench ARGS=e2b     (or: python bench.py --runs 20, with SPACE_URL, SPACE_API_KEY set)

Prints a table (p50/p90/p99 in ms) and the ratios E2B / space at p50. The two SDKs alternate,
run for run, so both see the same machine at the same moment.
"""

import argparse
import os
import statistics
import time

import e2b
import space_sdk


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def row(name, xs):
    return f"| {name:<44} | {len(xs):>3} | {pct(xs, 50):>8.2f} | {pct(xs, 90):>8.2f} | {pct(xs, 99):>8.2f} | {statistics.mean(xs):>8.2f} |"


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

    create = {"e2b": [], "space": []}
    for _ in range(a.runs):
        t = time.perf_counter()
        s = e2b.Sandbox.create(a.template)
        s.commands.run("true", user="root")
        create["e2b"].append((time.perf_counter() - t) * 1000)
        s.kill()
        t = time.perf_counter()
        sb = space_sdk.Sandbox.create(template=a.template, client=client)
        sb.exec(["true"])
        create["space"].append((time.perf_counter() - t) * 1000)
        sb.kill()

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
