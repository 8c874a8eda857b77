"""E2B snapshots, forks and template builds through the E2B Python SDK, on one server in one
run (docs/benchmarks/e2b-builds.md):

    make bench ARGS="e2b --builds"   (or: python bench_builds.py --runs 10, with SPACE_URL,
                                      SPACE_API_KEY set)

1. Create to first command from the template (a warm pool), from a full snapshot (its
   memory restored) and from a filesystem snapshot (its disk booted afresh, then snapshotted
   as a template: restored too); the three alternate, run for run.
2. Taking a snapshot, full and filesystem-only, and a fork (count 1).
3. Template.build of the same steps, cold (skip_cache: every step runs) and cached (the steps
   from the step cache, the files already uploaded), alternating.

Prints tables (p50/p90/p99 in ms) and the ratios at p50.
"""

import argparse
import os
import sys
import tempfile
import time

from e2b import Sandbox, Template

from bench import e2b_env, pct, row, wait_pool_full

import httpx


def timed(f):
    t = time.perf_counter()
    out = f()
    return (time.perf_counter() - t) * 1000, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--build-runs", type=int, default=5)
    ap.add_argument("--template", default="base")
    a = ap.parse_args()
    url, _ = e2b_env()
    http = httpx.Client(base_url=url)

    # The sources: a sandbox with a file and a process, snapshotted both ways.
    src = Sandbox.create(a.template, timeout=3600)
    src.files.write("/home/user/state.txt", "x" * 4096)
    src.commands.run("sleep 86400", background=True)
    take = {"full snapshot": [], "filesystem snapshot": [], "fork (count 1)": []}
    full = fs = None
    for i in range(a.runs):
        ms, full_i = timed(lambda: src.create_snapshot())
        take["full snapshot"].append(ms)
        ms, fs_i = timed(lambda: src.create_snapshot(mode="filesystem"))
        take["filesystem snapshot"].append(ms)
        ms, forks = timed(lambda: src.fork(count=1))
        take["fork (count 1)"].append(ms)
        for f in forks:
            if isinstance(f, Sandbox):
                f.kill()
        if full is None:
            full, fs = full_i, fs_i
        else:
            Sandbox.delete_snapshot(full_i.snapshot_id)
            Sandbox.delete_snapshot(fs_i.snapshot_id)
        print(f"[bench] snapshots {i + 1}/{a.runs}", file=sys.stderr, flush=True)

    def create_from(template):
        def run():
            t = time.perf_counter()
            s = Sandbox.create(template)
            s.commands.run("true", user="root")
            took = (time.perf_counter() - t) * 1000
            s.kill()
            return took

        return run

    create = {"template (warm pool)": [], "full snapshot": [], "filesystem snapshot": []}
    sources = [
        ("template (warm pool)", create_from(a.template)),
        ("full snapshot", create_from(full.snapshot_id)),
        ("filesystem snapshot", create_from(fs.snapshot_id)),
    ]
    for i in range(a.runs + 1):
        order = sources[i % 3 :] + sources[: i % 3]
        for name, f in order:
            wait_pool_full(http, a.template)
            took = f()
            if i > 0:
                create[name].append(took)
        if i > 0:
            print(f"[bench] creates {i}/{a.runs}", file=sys.stderr, flush=True)
    src.kill()
    Sandbox.delete_snapshot(full.snapshot_id)
    Sandbox.delete_snapshot(fs.snapshot_id)

    # Template builds: the same steps, cold and cached.
    ctx = tempfile.mkdtemp(prefix="space-bench-e2b-")
    with open(os.path.join(ctx, "data.bin"), "wb") as f:
        f.write(os.urandom(1 << 20))
    name = f"bench-build-{os.getpid()}"

    def template():
        return (
            Template(file_context_path=ctx)
            .from_template(a.template)
            .copy("data.bin", "/opt/data.bin")
            .run_cmd("sha256sum /opt/data.bin > /opt/data.sum")
            # Work a real step does (a compile, an install), here hashing 256 MiB.
            .run_cmd("head -c 256M /dev/zero | sha256sum > /opt/work.sum")
            .set_envs({"BENCH": "1"})
        )

    builds = {"cold (skip_cache)": [], "cached": []}
    Template.build(template(), name)  # uploads the files once, fills the cache
    for i in range(a.build_runs):
        order = [("cold (skip_cache)", True), ("cached", False)]
        if i % 2:
            order.reverse()
        for label, cold in order:
            ms, _ = timed(lambda: Template.build(template(), name, skip_cache=cold))
            builds[label].append(ms)
        print(f"[bench] builds {i + 1}/{a.build_runs}", file=sys.stderr, flush=True)
    Sandbox.delete_snapshot(name)

    head = "| operation                                    |   n |  p50 ms  |  p90 ms  |  p99 ms  |  mean ms |"
    line = "|----------------------------------------------|-----|----------|----------|----------|----------|"
    print(head)
    print(line)
    for k, xs in create.items():
        print(row(f"create -> first command, {k}", xs))
    for k, xs in take.items():
        print(row(f"take a {k}" if k != "fork (count 1)" else k, xs))
    for k, xs in builds.items():
        print(row(f"Template.build, {k}", xs))
    print()
    base = pct(create["template (warm pool)"], 50)
    for k in ("full snapshot", "filesystem snapshot"):
        print(f"create from a {k} / from the template (p50): {pct(create[k], 50) / base:.2f}x")
    cold, cached = pct(builds["cold (skip_cache)"], 50), pct(builds["cached"], 50)
    print(f"Template.build cold / cached (p50): {cold / cached:.2f}x ({cold - cached:+.0f} ms)")


if __name__ == "__main__":
    main()
