"""space's MCP server against its REST API, in one run on one server: a run_command round
trip through the official MCP client over stdio (`space mcp`) and over Streamable HTTP
(`/mcp`), against the same command through POST /v1/sandboxes/{id}/exec.

    make bench ARGS=mcp     (or: python bench.py --round-trips 100, with SPACE_URL,
                             SPACE_API_KEY and SPACE_BIN set)

One sandbox serves all three; the three ways take turns, round for round, so each sees the
same machine at the same moment. Prints a table (p50/p90/p99 in ms) and the ratios MCP / REST
at p50.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import anyio
import httpx
import httpx2
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

COMMAND = "true"


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def row(name: str, xs: list[float]) -> str:
    return (
        f"| {name:<34} | {len(xs):>4} | {pct(xs, 50):>8.2f} | {pct(xs, 90):>8.2f} | "
        f"{pct(xs, 99):>8.2f} | {statistics.mean(xs):>8.2f} |"
    )


def rest_exec(http: httpx.Client, sid: str) -> None:
    with http.stream("POST", f"/v1/sandboxes/{sid}/exec", json={"shell": COMMAND}) as resp:
        resp.raise_for_status()
        last = ""
        for line in resp.iter_lines():
            if line:
                last = line
    if '"exit"' not in last or '"exit_code":0' not in last.replace(" ", ""):
        raise SystemExit(f"the REST exec did not end with exit 0: {last}")


async def mcp_exec(client: Client, sid: str) -> None:
    result = await client.call_tool("run_command", {"sandbox_id": sid, "command": COMMAND})
    if result.is_error or result.structured_content.get("exit_code") != 0:
        raise SystemExit(f"run_command failed: {result.content}")


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--round-trips", type=int, default=100)
    ap.add_argument("--template", default="base")
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    url = os.environ["SPACE_URL"].rstrip("/")
    key = os.environ["SPACE_API_KEY"]
    env = {"SPACE_URL": url, "SPACE_API_KEY": key, "PATH": os.environ.get("PATH", "")}
    stdio = StdioServerParameters(command=os.environ["SPACE_BIN"], args=["mcp"], env=env)
    auth = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=url, headers=auth, timeout=120) as http:
        resp = http.post("/v1/sandboxes", json={"template": args.template})
        resp.raise_for_status()
        sid = resp.json()["id"]
        try:
            async with (
                Client(stdio, read_timeout_seconds=120) as over_stdio,
                httpx2.AsyncClient(headers=auth, timeout=120) as h2,
                Client(streamable_http_client(f"{url}/mcp", http_client=h2), read_timeout_seconds=120) as over_http,
            ):
                ways = {
                    "REST exec (POST /v1/.../exec)": lambda: anyio.to_thread.run_sync(rest_exec, http, sid),
                    "MCP run_command over stdio": lambda: mcp_exec(over_stdio, sid),
                    "MCP run_command over HTTP": lambda: mcp_exec(over_http, sid),
                }
                samples: dict[str, list[float]] = {name: [] for name in ways}
                for i in range(args.warmup + args.round_trips):
                    order = list(ways.items())
                    order = order[i % 3 :] + order[: i % 3]
                    for name, way in order:
                        t = time.perf_counter()
                        await way()
                        ms = (time.perf_counter() - t) * 1000
                        if i >= args.warmup:
                            samples[name].append(ms)
        finally:
            http.delete(f"/v1/sandboxes/{sid}")
    print(f"| {'round trip of `' + COMMAND + '` (ms)':<34} | {'n':>4} | {'p50':>8} | {'p90':>8} | {'p99':>8} | {'mean':>8} |")
    print(f"|{'-' * 36}|{'-' * 6}|{'-' * 10}|{'-' * 10}|{'-' * 10}|{'-' * 10}|")
    for name, xs in samples.items():
        print(row(name, xs))
    rest = pct(samples["REST exec (POST /v1/.../exec)"], 50)
    print()
    for name in ("MCP run_command over stdio", "MCP run_command over HTTP"):
        print(f"{name} / REST exec at p50: {pct(samples[name], 50) / rest:.2f}x")
    sys.stdout.flush()


if __name__ == "__main__":
    anyio.run(main)
