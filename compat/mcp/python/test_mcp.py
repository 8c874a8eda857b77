"""space's MCP tools driven by the official MCP client, over stdio and over HTTP."""

from __future__ import annotations

import base64
import time

import httpx
import pytest
from conftest import KEY, OTHER_KEY, URL, call, call_error, connect, sandbox

pytestmark = pytest.mark.anyio

TOOLS = {
    "create_sandbox",
    "list_sandboxes",
    "get_sandbox",
    "list_templates",
    "run_command",
    "start_process",
    "read_process_output",
    "stop_process",
    "read_file",
    "write_file",
    "list_directory",
    "snapshot_sandbox",
    "list_snapshots",
    "rollback_sandbox",
    "fork_sandbox",
    "pause_sandbox",
    "suspend_sandbox",
    "resume_sandbox",
    "kill_sandbox",
    "expose_port",
    "list_volumes",
    "create_volume",
    "screenshot",
    "click",
    "type_text",
    "press_key",
    "scroll",
    "navigate",
}


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_tools_are_listed_with_their_schemas(transport: str) -> None:
    async with connect(transport) as client:
        listed = await client.list_tools()
        by_name = {t.name: t for t in listed.tools}
        assert set(by_name) == TOOLS
        for tool in listed.tools:
            schema = tool.input_schema
            assert schema["type"] == "object", tool.name
            assert len(tool.description or "") > 40, tool.name
            for prop, spec in schema.get("properties", {}).items():
                assert spec.get("description") or "$ref" in spec, f"{tool.name}.{prop}"
        run = by_name["run_command"].input_schema
        assert set(run["required"]) == {"sandbox_id", "command"}
        assert run["properties"]["timeout_seconds"]["type"] in (["integer", "null"], "integer")
        assert run.get("additionalProperties") is False
        write = by_name["write_file"].input_schema
        assert set(write["required"]) == {"sandbox_id", "path", "content"}
        assert by_name["read_file"].annotations.read_only_hint is True
        assert by_name["kill_sandbox"].annotations.destructive_hint is True


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_write_run_read_fail_and_kill(transport: str) -> None:
    async with connect(transport) as client, sandbox(client, metadata={"suite": "mcp"}) as sid:
        listed = await call(client, "list_sandboxes")
        assert sid in [s["id"] for s in listed["sandboxes"]]

        script = "import sys\nprint('squares', [i * i for i in range(5)])\nprint('to stderr', file=sys.stderr)\n"
        wrote = await call(
            client, "write_file", sandbox_id=sid, path="/tmp/work/main.py", content=script
        )
        assert wrote["size"] == len(script)
        ran = await call(client, "run_command", sandbox_id=sid, command="python3 main.py", cwd="/tmp/work")
        assert ran["exit_code"] == 0, ran
        assert ran["stdout"] == "squares [0, 1, 4, 9, 16]\n"
        assert ran["stderr"] == "to stderr\n"
        assert ran["truncated"] is False

        # A failing command is a result with its exit code, not an error.
        failed = await client.call_tool(
            "run_command", {"sandbox_id": sid, "command": "echo no >&2; exit 3"}
        )
        assert not failed.is_error
        assert failed.structured_content["exit_code"] == 3
        assert failed.structured_content["stderr"] == "no\n"
        assert "exit code 3" in failed.content[0].text

        # Binary content round-trips through base64.
        blob = bytes(range(256))
        await call(
            client,
            "write_file",
            sandbox_id=sid,
            path="/tmp/work/blob.bin",
            content=base64.b64encode(blob).decode(),
            encoding="base64",
        )
        read = await call(
            client, "read_file", sandbox_id=sid, path="/tmp/work/blob.bin", encoding="base64"
        )
        assert base64.b64decode(read["content"]) == blob
        text = await call(client, "read_file", sandbox_id=sid, path="/tmp/work/main.py")
        assert text["content"] == script and text["truncated"] is False
        listing = await call(client, "list_directory", sandbox_id=sid, path="/tmp/work")
        names = {e["name"]: e for e in listing["entries"]}
        assert names["blob.bin"]["size"] == 256 and names["blob.bin"]["type"] == "file"

        # Errors name what is wrong.
        missing = await call_error(client, "read_file", sandbox_id=sid, path="/tmp/nope.txt")
        assert "/tmp/nope.txt" in missing and "file_not_found" in missing
        bad = await call_error(client, "run_command", sandbox_id=sid)
        assert "command" in bad

        killed = await call(client, "kill_sandbox", sandbox_id=sid)
        assert killed["state"] == "terminated"
        gone = await call_error(client, "run_command", sandbox_id=sid, command="true")
        assert "illegal_state" in gone or "terminated" in gone


async def test_ten_megabytes_of_output_come_back_truncated() -> None:
    async with connect("http") as client, sandbox(client) as sid:
        result = await client.call_tool(
            "run_command",
            {
                "sandbox_id": sid,
                "command": "head -c 10485760 /dev/zero | tr '\\0' x; echo; echo THE-END",
                "max_output_bytes": 4096,
            },
        )
        assert not result.is_error, result.content
        out = result.structured_content
        assert out["exit_code"] == 0
        assert out["truncated"] is True
        assert out["stdout_bytes"] == 10 * 1024 * 1024 + len("\nTHE-END\n")
        assert "[... truncated:" in out["stdout"]
        assert out["stdout"].startswith("x" * 100)
        assert out["stdout"].endswith("THE-END\n")
        assert len(out["stdout"]) < 8192


async def test_a_background_process_is_read_later_and_stopped() -> None:
    async with connect("stdio") as client, sandbox(client) as sid:
        started = await call(
            client,
            "start_process",
            sandbox_id=sid,
            command="echo begin; sleep 1; echo middle; echo oops >&2; sleep 600",
        )
        pid = started["process_id"]
        assert started["pid"] > 1
        # Output read in pieces, from the offsets of the last read.
        seen = ""
        offsets = {"stdout_offset": 0, "stderr_offset": 0}
        deadline = time.monotonic() + 60
        while "middle" not in seen and time.monotonic() < deadline:
            out = await call(
                client,
                "read_process_output",
                sandbox_id=sid,
                process_id=pid,
                wait_seconds=5,
                **offsets,
            )
            assert out["running"] is True
            seen += out["stdout"]
            offsets = {
                "stdout_offset": out["stdout_next_offset"],
                "stderr_offset": out["stderr_next_offset"],
            }
        assert seen == "begin\nmiddle\n"
        # A new connection reads the same process: it does not belong to the session.
        async with connect("http") as other:
            out = await call(other, "read_process_output", sandbox_id=sid, process_id=pid)
            assert out["stdout"] == "begin\nmiddle\n" and out["stderr"] == "oops\n"
        stopped = await call(client, "stop_process", sandbox_id=sid, process_id=pid)
        # The shell reports SIGTERM as 128 + 15.
        assert stopped == {"signalled": True, "ended": True, "exit_code": 143}, stopped
        out = await call(client, "read_process_output", sandbox_id=sid, process_id=pid)
        assert (out["running"], out["exit_code"]) == (False, 143), out
        again = await call(client, "stop_process", sandbox_id=sid, process_id=pid)
        assert again == {"signalled": False, "ended": True, "exit_code": 143}, again

        # SIGKILL ends it too, and the status says so.
        hard = await call(client, "start_process", sandbox_id=sid, command="trap '' TERM; sleep 600")
        stopped = await call(
            client, "stop_process", sandbox_id=sid, process_id=hard["process_id"], signal="KILL"
        )
        assert stopped == {"signalled": True, "ended": True, "exit_code": 137}, stopped
        out = await call(
            client, "read_process_output", sandbox_id=sid, process_id=hard["process_id"]
        )
        assert (out["running"], out["exit_code"]) == (False, 137), out

        # A quick process's exit code is kept.
        # A wait ends at new output or at the end, whichever comes first: read until the end.
        quick = await call(client, "start_process", sandbox_id=sid, command="echo done; exit 7")
        text, offset = "", 0
        deadline = time.monotonic() + 60
        while True:
            out = await call(
                client,
                "read_process_output",
                sandbox_id=sid,
                process_id=quick["process_id"],
                stdout_offset=offset,
                wait_seconds=10,
            )
            text += out["stdout"]
            offset = out["stdout_next_offset"]
            if not out["running"] or time.monotonic() > deadline:
                break
        assert (out["running"], out["exit_code"], text) == (False, 7, "done\n")
        bad = await call_error(
            client, "read_process_output", sandbox_id=sid, process_id="../../etc"
        )
        assert "not a process id" in bad


async def test_snapshot_change_rollback_and_fork() -> None:
    async with connect("http") as client, sandbox(client) as sid:
        await call(client, "write_file", sandbox_id=sid, path="/root/state.txt", content="v1\n")
        snap = await call(client, "snapshot_sandbox", sandbox_id=sid)
        await call(client, "write_file", sandbox_id=sid, path="/root/state.txt", content="v2\n")
        await call(client, "write_file", sandbox_id=sid, path="/root/new.txt", content="new\n")
        listed = await call(client, "list_snapshots", sandbox_id=sid)
        assert snap["id"] in [s["id"] for s in listed["snapshots"]]
        rolled = await call(client, "rollback_sandbox", sandbox_id=sid, snapshot_id=snap["id"])
        assert rolled["state"] == "running"
        ran = await call(
            client,
            "run_command",
            sandbox_id=sid,
            command="cat /root/state.txt; test -e /root/new.txt && echo still-there || echo gone",
        )
        assert ran["stdout"] == "v1\ngone\n", ran

        forked = await call(client, "fork_sandbox", sandbox_id=sid)
        child = forked["id"]
        try:
            assert child != sid and forked["state"] == "running"
            await call(client, "write_file", sandbox_id=child, path="/root/state.txt", content="child\n")
            parent = await call(client, "read_file", sandbox_id=sid, path="/root/state.txt")
            mine = await call(client, "read_file", sandbox_id=child, path="/root/state.txt")
            assert (parent["content"], mine["content"]) == ("v1\n", "child\n")
        finally:
            await call(client, "kill_sandbox", sandbox_id=child)
        bad = await call_error(client, "rollback_sandbox", sandbox_id=sid, snapshot_id="nope")
        assert "snapshot" in bad


async def test_an_exposed_port_is_fetched_from_outside() -> None:
    async with connect("stdio") as client, sandbox(client) as sid:
        await call(client, "write_file", sandbox_id=sid, path="/srv/www/index.html", content="hello from the sandbox\n")
        await call(
            client,
            "start_process",
            sandbox_id=sid,
            command="python3 -m http.server 8000 --bind 127.0.0.1",
            cwd="/srv/www",
        )
        exposed = await call(client, "expose_port", sandbox_id=sid, port=8000)
        url = exposed["url"]
        assert url.startswith("http://") and "/ingress/" in url
        body = None
        deadline = time.monotonic() + 60
        with httpx.Client(timeout=30) as http:
            while time.monotonic() < deadline:
                resp = http.get(url)  # no key: the URL is the credential
                if resp.status_code == 200:
                    body = resp.text
                    break
                time.sleep(0.5)
        assert body == "hello from the sandbox\n"


async def test_pause_suspend_and_waking() -> None:
    async with connect("http") as client, sandbox(client) as sid:
        await call(client, "start_process", sandbox_id=sid, command="sleep 1000")
        await call(client, "write_file", sandbox_id=sid, path="/root/kept.txt", content="kept\n")
        paused = await call(client, "pause_sandbox", sandbox_id=sid)
        assert paused["state"] == "paused"
        resumed = await call(client, "resume_sandbox", sandbox_id=sid)
        assert resumed["state"] == "running"
        suspended = await call(client, "suspend_sandbox", sandbox_id=sid)
        assert suspended["state"] == "suspended"
        # Using a suspended sandbox wakes it.
        ran = await call(client, "run_command", sandbox_id=sid, command="cat /root/kept.txt; pgrep -c sleep")
        assert ran["stdout"].startswith("kept\n") and int(ran["stdout"].split()[-1]) >= 1, ran
        info = await call(client, "get_sandbox", sandbox_id=sid)
        assert info["state"] == "running"


async def test_long_commands_report_progress() -> None:
    seen: list[tuple[float, str | None]] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        seen.append((value, message))

    async with connect("http") as client, sandbox(client) as sid:
        result = await client.call_tool(
            "run_command",
            {"sandbox_id": sid, "command": "for i in 1 2 3 4; do echo tick $i; sleep 1; done"},
            progress_callback=progress,
        )
        assert not result.is_error
        assert result.structured_content["stdout"].count("tick") == 4
    assert len(seen) >= 2, seen
    values = [v for v, _ in seen]
    assert values == sorted(values) and values[0] > 0
    assert any(m and m.startswith("run_command:") for _, m in seen), seen


async def test_http_needs_a_valid_key() -> None:
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "probe", "version": "0"},
        },
    }
    headers = {"Accept": "application/json, text/event-stream"}
    with httpx.Client(base_url=URL, timeout=30) as http:
        for auth in (None, "Bearer space_0000000000000000_wrong", "Basic Zm9vOmJhcg=="):
            h = dict(headers)
            if auth:
                h["Authorization"] = auth
            resp = http.post("/mcp", json=init, headers=h)
            assert resp.status_code == 401, (auth, resp.status_code, resp.text)
            assert resp.json()["error"]["code"] == "unauthorized"
        ok = http.post("/mcp", json=init, headers={**headers, "Authorization": f"Bearer {KEY}"})
        assert ok.status_code == 200, ok.text
    with pytest.raises(Exception):
        async with connect("http", key="space_0000000000000000_wrong") as client:
            await client.list_tools()


async def test_one_tenant_cannot_touch_anothers_sandbox() -> None:
    assert OTHER_KEY
    async with connect("http") as mine, sandbox(mine) as sid:
        for transport in ("http", "stdio"):
            async with connect(transport, key=OTHER_KEY) as theirs:
                listed = await call(theirs, "list_sandboxes")
                assert sid not in [s["id"] for s in listed["sandboxes"]]
                for tool, args in [
                    ("get_sandbox", {}),
                    ("run_command", {"command": "true"}),
                    ("read_file", {"path": "/etc/hostname"}),
                    ("write_file", {"path": "/tmp/x", "content": "x"}),
                    ("kill_sandbox", {}),
                    ("expose_port", {"port": 8000}),
                ]:
                    text = await call_error(theirs, tool, sandbox_id=sid, **args)
                    assert "sandbox_not_found" in text, (tool, text)
        # Still there, and still running, for its owner.
        info = await call(mine, "get_sandbox", sandbox_id=sid)
        assert info["state"] == "running"


async def test_create_takes_size_env_egress_and_secrets() -> None:
    with httpx.Client(base_url=URL, headers={"Authorization": f"Bearer {KEY}"}) as http:
        resp = http.put(
            "/v1/secrets/MCP_TOKEN", json={"value": "s3cret-value", "hosts": ["example.com"]}
        )
        assert resp.status_code in (200, 201), resp.text
    async with (
        connect("stdio") as client,
        sandbox(
            client,
            vcpus=1,
            memory_mib=512,
            env={"GREETING": "hello"},
            egress_allow=["example.com"],
            secrets=["MCP_TOKEN"],
            idle_timeout_seconds=600,
        ) as sid,
    ):
        info = await call(client, "get_sandbox", sandbox_id=sid)
        assert info["memory_mib"] == 512 and info["vcpus"] == 1
        assert info["egress"]["default"] == "deny" and info["egress"]["allow"] == ["example.com"]
        assert info["timeouts"]["idle_ms"] == 600_000
        [binding] = info["secrets"]
        assert binding["name"] == "MCP_TOKEN"
        ran = await call(client, "run_command", sandbox_id=sid, command='echo "$GREETING $MCP_TOKEN"')
        # The VM sees the placeholder, never the value.
        assert ran["stdout"] == f"hello {binding['placeholder']}\n"
        assert "s3cret-value" not in ran["stdout"]
        bad = await call_error(client, "create_sandbox", template="no-such-template")
        assert "template_not_found" in bad and "list_templates" in bad


async def test_a_volume_shared_by_two_sandboxes() -> None:
    name = f"mcp-{int(time.time() * 1000)}"
    async with connect("stdio") as client:
        made = await call(client, "create_volume", name=name, size_mib=64)
        assert made["created"]["name"] == name and made["created"]["size_bytes"] == 64 << 20
        listed = await call(client, "list_volumes")
        assert name in [v["name"] for v in listed["volumes"]]
        mount = [{"name": name, "path": "/shared"}]
        async with sandbox(client, volumes=mount) as a, sandbox(client, volumes=mount) as b:
            await call(client, "run_command", sandbox_id=a, command="echo from-a > /shared/note")
            got = await call(client, "read_file", sandbox_id=b, path="/shared/note")
            assert got["content"] == "from-a\n"
        bad = await call_error(client, "create_volume", name="no spaces allowed")
        assert "invalid_request" in bad or "volume name" in bad
