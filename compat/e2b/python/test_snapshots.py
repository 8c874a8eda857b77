"""Snapshots, forks and network updates through the unmodified E2B SDK.

A snapshot is a template of the caller's tenant (docs/e2b.md): a full one keeps the
processes, a filesystem-only one is the disk booted afresh.
"""

import http.server
import os
import threading

import pytest
from e2b import Sandbox
from e2b.exceptions import SandboxException

from conftest import TEMPLATE


def _running(sbx, needle):
    out = sbx.commands.run("ps -eo args", user="root")
    return any(needle in line for line in out.stdout.splitlines())


def _snapshot_ids(**kw):
    paginator = Sandbox.list_snapshots(**kw)
    ids = []
    while paginator.has_next:
        ids += [s.snapshot_id for s in paginator.next_items()]
    return ids


def test_a_full_snapshot_makes_sandboxes_with_its_files_and_processes(sandbox, other_key):
    sandbox.files.write("/home/user/state.txt", "before the snapshot")
    sandbox.commands.run("sleep 7771", background=True)
    snap = sandbox.create_snapshot()
    assert snap.snapshot_id.startswith("snap-") and snap.names == []
    # The source runs on, unchanged.
    assert sandbox.is_running()
    sandbox.files.write("/home/user/state.txt", "after the snapshot")

    assert snap.snapshot_id in _snapshot_ids(sandbox_id=sandbox.sandbox_id)
    assert snap.snapshot_id in [s.snapshot_id for s in sandbox.list_snapshots().next_items()]
    assert snap.snapshot_id not in _snapshot_ids(sandbox_id="sbx-0000000000000000")
    assert snap.snapshot_id not in _snapshot_ids(api_key=other_key)

    restored = Sandbox.create(snap.snapshot_id, timeout=300)
    try:
        assert restored.files.read("/home/user/state.txt") == "before the snapshot"
        assert _running(restored, "sleep 7771")
    finally:
        restored.kill()

    # Another tenant can neither create from it nor delete it.
    with pytest.raises(Exception):
        Sandbox.create(snap.snapshot_id, api_key=other_key)
    assert Sandbox.delete_snapshot(snap.snapshot_id, api_key=other_key) is False
    assert Sandbox.delete_snapshot(snap.snapshot_id) is True
    assert Sandbox.delete_snapshot(snap.snapshot_id) is False
    assert snap.snapshot_id not in _snapshot_ids()


def test_a_named_filesystem_snapshot_boots_its_disk_afresh(sandbox):
    name = f"fs-snap-{os.getpid()}"
    sandbox.files.write("/home/user/fs.txt", "on the disk")
    sandbox.commands.run("sleep 7772", background=True)
    snap = sandbox.create_snapshot(name, mode="filesystem")
    assert snap.snapshot_id == name and snap.names == [name]
    assert sandbox.is_running()
    fresh = Sandbox.create(name, timeout=300)
    try:
        assert fresh.files.read("/home/user/fs.txt") == "on the disk"
        assert not _running(fresh, "sleep 7772")
    finally:
        fresh.kill()
    assert [s.snapshot_id for s in Sandbox.list_snapshots(name=name).next_items()] == [name]
    assert Sandbox.delete_snapshot(name) is True


def test_fork_makes_running_copies_and_leaves_the_source(sandbox):
    sandbox.files.write("/home/user/fork.txt", "shared past")
    sandbox.commands.run("sleep 7773", background=True)
    forks = sandbox.fork(count=2, timeout=120)
    assert len(forks) == 2
    try:
        for f in forks:
            assert isinstance(f, Sandbox), f
            assert f.sandbox_id != sandbox.sandbox_id
            assert f.files.read("/home/user/fork.txt") == "shared past"
            assert _running(f, "sleep 7773")
        forks[0].files.write("/home/user/fork.txt", "the first fork's")
        assert forks[1].files.read("/home/user/fork.txt") == "shared past"
        assert sandbox.files.read("/home/user/fork.txt") == "shared past"
        assert sandbox.is_running()
    finally:
        for f in forks:
            if isinstance(f, Sandbox):
                f.kill()
    with pytest.raises(Exception):
        Sandbox.fork("sbx-0000000000000000")


class _Quiet(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"reached"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def upstream():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()


def _reaches(sbx, url):
    # Through the gateway's proxy even for 127.0.0.1, which NO_PROXY keeps in the guest: the
    # test's upstream listens on the host's loopback.
    out = sbx.commands.run(f"curl -sS -m 20 --noproxy '' {url} 2>&1 || true", timeout=60)
    return out.stdout == "reached"


def test_network_updates_replace_the_egress_policy(upstream):
    url = f"http://127.0.0.1:{upstream}/"
    sbx = Sandbox.create(
        TEMPLATE, timeout=300, network={"allow_out": ["127.0.0.1"], "deny_out": ["0.0.0.0/0"]}
    )
    try:
        # Allowed exactly, all else denied.
        assert _reaches(sbx, url)
        assert not _reaches(sbx, f"http://localhost:{upstream}/")
        # Denied whole.
        sbx.update_network({"deny_out": ["0.0.0.0/0"]})
        assert not _reaches(sbx, url)
        # And allowed again: an update replaces, it does not add.
        sbx.update_network({"allow_out": ["127.0.0.1"]})
        assert _reaches(sbx, url)
        sbx.update_network({"allow_internet_access": False})
        assert not _reaches(sbx, url)
        # What space's gateway does not do is refused, and changes nothing.
        with pytest.raises(SandboxException) as e:
            sbx.update_network({"allow_out": ["10.0.0.0/8"]})
        assert "address range" in str(e.value)
        assert not _reaches(sbx, url)
    finally:
        sbx.kill()
    with pytest.raises(Exception) as e:
        Sandbox.create(TEMPLATE, network={"dns_servers": ["1.1.1.1"]})
    assert "dnsServers is not served" in str(e.value)


def test_an_mcp_gateway_is_refused_clearly():
    with pytest.raises(Exception) as e:
        Sandbox.create(TEMPLATE, mcp={"exa": {"apiKey": "x"}})
    assert "space serves MCP itself" in str(e.value)
