"""The synchronous client against a live server: one sandbox goes through exec, files,
pause/resume, snapshot/rollback, suspend/restore, fork and kill (tests run in file order and
share it, to keep the number of VMs small)."""

from __future__ import annotations

import hashlib
import io
import itertools
import os
import time
from collections.abc import Iterator

import pytest
from conftest import kill_quietly

from space_sdk import (
    NEVER,
    IllegalState,
    NotFound,
    Sandbox,
    Space,
    SpaceError,
    WatchEvent,
)


@pytest.fixture(scope="module")
def sb(space: Space, run_id: str) -> Iterator[Sandbox]:
    sandbox = Sandbox.create(
        template="minimal",
        env={"SDK_TEST": "yes"},
        metadata={"suite": run_id, "client": "sync"},
        client=space,
    )
    try:
        yield sandbox
    finally:
        kill_quietly(sandbox)


def test_create_and_find(sb: Sandbox, space: Space, run_id: str) -> None:
    info = sb.last_info
    assert sb.id.startswith("sbx-")  # the node's form: sbx- and 16 hex digits
    assert info.state == "running"
    assert info.template == "minimal"
    assert info.metadata == {"suite": run_id, "client": "sync"}
    assert info.env == {"SDK_TEST": "yes"}
    assert info.timeouts.action in ("suspend", "kill")
    assert Sandbox.connect(sb.id, client=space).id == sb.id
    assert [
        s.id for s in Sandbox.list(metadata={"suite": run_id, "client": "sync"}, client=space)
    ] == [sb.id]
    assert Sandbox.list(metadata={"suite": run_id, "client": "none"}, client=space) == []
    # Without client= the client comes from SPACE_URL / SPACE_API_KEY.
    assert [
        s.id for s in Sandbox.list(state="running", metadata={"suite": run_id, "client": "sync"})
    ] == [sb.id]


def test_exec_streams_output(sb: Sandbox) -> None:
    chunks: list[tuple[float, bytes]] = []
    errs: list[bytes] = []
    start = time.monotonic()
    result = sb.exec(
        "echo one; sleep 2; echo two; echo oops >&2; exit 3",
        on_stdout=lambda b: chunks.append((time.monotonic(), b)),
        on_stderr=errs.append,
    )
    done = time.monotonic()
    assert result.exit_code == 3
    assert result.signal is None
    assert not result.ok
    assert result.stdout == b"one\ntwo\n"
    assert result.stderr == b"oops\n"
    assert b"".join(c for _, c in chunks) == result.stdout
    assert b"".join(errs) == b"oops\n"
    assert len(chunks) >= 2
    # The first line arrived while the process still slept: the output was streamed.
    assert chunks[0][1].startswith(b"one")
    assert done - chunks[0][0] >= 1.0, (start, chunks, done)


def test_exec_argv_env_cwd_stdin(sb: Sandbox) -> None:
    sb.files.mkdir("/srv/work/dir")
    data = bytes(range(256)) * 64
    result = sb.exec(
        ["sh", "-c", 'pwd; echo "$SDK_TEST $EXTRA"; cat'],
        env={"EXTRA": "more"},
        cwd="/srv/work/dir",
        stdin=data,
    )
    assert result.exit_code == 0, result
    assert result.stdout == b"/srv/work/dir\nyes more\n" + data


def test_exec_signal_and_timeout(sb: Sandbox) -> None:
    killed = sb.exec("kill -9 $$")
    assert killed.signal == 9
    assert killed.exit_code == 137
    start = time.monotonic()
    slow = sb.exec(["sleep", "30"], timeout=1)
    assert time.monotonic() - start < 20
    assert slow.signal is not None
    assert slow.exit_code == 128 + slow.signal


def test_files_round_trip(sb: Sandbox) -> None:
    data = os.urandom(5 * 1024 * 1024)
    digest = hashlib.sha256(data).hexdigest()
    stat = sb.files.write("/root/big.bin", data, mode=0o600)
    assert stat.size == len(data)
    assert stat.is_file
    assert stat.mode & 0o777 == 0o600
    assert hashlib.sha256(sb.files.read("/root/big.bin")).hexdigest() == digest
    guest = sb.exec(["sha256sum", "/root/big.bin"])
    assert guest.stdout.split()[0].decode() == digest

    # A file object is streamed up; download streams down.
    sb.files.write("/root/big2.bin", io.BytesIO(data))
    out = io.BytesIO()
    assert sb.files.download("/root/big2.bin", out) == len(data)
    assert hashlib.sha256(out.getvalue()).hexdigest() == digest

    entries = {e.name: e for e in sb.files.list("/root")}
    assert entries["big.bin"].stat.size == len(data)
    assert entries["big2.bin"].stat.is_file

    made = sb.files.mkdir("/root/d/e")
    assert made.is_dir
    moved = sb.files.rename("/root/big2.bin", "/root/d/e/moved.bin")
    assert moved.size == len(data)
    assert not sb.files.exists("/root/big2.bin")
    assert sb.files.stat("/root/d/e/moved.bin").size == len(data)

    with pytest.raises(SpaceError):
        sb.files.remove("/root/d")  # not empty
    assert sb.files.exists("/root/d/e/moved.bin")
    sb.files.remove("/root/d", recursive=True)
    assert not sb.files.exists("/root/d")
    sb.files.remove("/root/big.bin")
    with pytest.raises(NotFound) as info:
        sb.files.read("/root/big.bin")
    assert info.value.code == "file_not_found"

    sb.files.write("/root/hello.txt", "héllo\n")
    assert sb.files.read_text("/root/hello.txt") == "héllo\n"


def test_pause_resume(sb: Sandbox) -> None:
    assert sb.pause().state == "paused"
    assert sb.info().state == "paused"
    with pytest.raises(IllegalState) as info:
        sb.pause()
    assert info.value.code == "illegal_state"
    assert info.value.status == 409
    # Guest access wakes a paused sandbox.
    assert sb.exec(["true"]).exit_code == 0
    assert sb.info().state == "running"
    assert sb.pause().state == "paused"
    assert sb.resume().state == "running"
    assert sb.exec(["true"]).exit_code == 0


def test_snapshot_rollback(sb: Sandbox) -> None:
    sb.files.write("/root/state", b"one")
    snap = sb.snapshot()
    assert snap.kind == "disk"
    assert snap.id in [s.id for s in sb.snapshots()]
    sb.files.write("/root/state", b"two")
    sb.files.write("/root/extra", b"later")
    assert sb.rollback(snap).state == "running"
    assert sb.files.read("/root/state") == b"one"
    assert not sb.files.exists("/root/extra")

    full = sb.snapshot(full=True)
    assert full.kind == "full"
    ids = [s.id for s in sb.snapshots()]
    assert ids.index(snap.id) < ids.index(full.id)  # oldest first


def test_suspend_restore(sb: Sandbox) -> None:
    sb.files.write("/root/kept", b"kept")
    started = sb.exec("sleep 600 >/dev/null 2>&1 & echo $!")
    pid = started.stdout.strip().decode()
    assert pid.isdigit(), started
    assert sb.suspend().state == "suspended"
    with pytest.raises(IllegalState):
        sb.suspend()
    assert sb.restore().state == "running"
    assert sb.files.read("/root/kept") == b"kept"
    # Memory came back too: the process started before the suspend still runs.
    assert sb.exec(["kill", "-0", pid]).exit_code == 0
    # Using a suspended sandbox restores it: no explicit restore needed.
    assert sb.suspend().state == "suspended"
    assert sb.exec(["kill", "-0", pid]).exit_code == 0
    assert sb.info().state == "running"


def test_fork(sb: Sandbox, space: Space) -> None:
    sb.files.write("/root/forked", b"parent")
    with sb.fork() as child:
        assert child.id != sb.id
        assert child.state == "running"
        assert child.last_info.forked_from is not None
        assert child.last_info.forked_from.sandbox == sb.id
        assert child.files.read("/root/forked") == b"parent"
        child.files.write("/root/forked", b"child")
        assert sb.files.read("/root/forked") == b"parent"
        assert child.files.read("/root/forked") == b"child"
    # Leaving the block killed the child.
    assert Sandbox.connect(child.id, client=space).state == "terminated"
    assert child.id in [s.id for s in Sandbox.list(state="terminated", client=space)]


def test_timeouts_and_logs(sb: Sandbox) -> None:
    info = sb.set_timeouts(idle=600, max_lifetime=NEVER, action="kill")
    assert info.timeouts.idle_ms == 600_000
    assert info.timeouts.max_lifetime_ms is None
    assert info.timeouts.action == "kill"
    info = sb.set_timeouts(max_lifetime=3600)
    assert info.timeouts.idle_ms == 600_000  # left out: kept
    assert info.timeouts.max_lifetime_ms == 3_600_000
    info = sb.set_timeouts(idle=900, max_lifetime=NEVER, action="suspend")
    assert info.timeouts.idle_ms == 900_000

    marker = f"console-marker-{os.getpid()}-{time.monotonic_ns()}"
    sb.exec(f"echo {marker} > /dev/console")
    deadline = time.monotonic() + 10
    while marker not in sb.logs() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert marker in sb.logs()
    assert len(sb.logs(tail_bytes=8).encode()) <= 8


def test_watch(sb: Sandbox) -> None:
    sb.files.mkdir("/root/watched/deep")
    seen: list[WatchEvent] = []
    with sb.files.watch("/root/watched", recursive=True, timeout=60) as w:
        sb.files.write("/root/watched/new.txt", b"x")
        sb.files.write("/root/watched/deep/inner.txt", b"y")
        sb.files.remove("/root/watched/new.txt")
        for event in w:
            seen.append(event)
            if (event.path, event.kind) == ("/root/watched/new.txt", "removed"):
                break
    changes = {(e.path, e.kind) for e in seen}
    # Uploads land by rename: the new names show up as moved_to, the deeper one too.
    assert ("/root/watched/new.txt", "moved_to") in changes, seen
    assert ("/root/watched/deep/inner.txt", "moved_to") in changes, seen
    assert not any(e.is_dir for e in seen), seen
    # Leaving the block ended the watch.
    assert list(w) == []

    # Not recursive: a subdirectory's changes are not seen.
    before: list[WatchEvent] = []
    with sb.files.watch("/root/watched", timeout=60) as flat:
        sb.files.write("/root/watched/deep/quiet.txt", b"z")
        sb.files.write("/root/watched/top.txt", b"z")
        for event in flat:
            if event.path == "/root/watched/top.txt":
                break
            before.append(event)
    assert not [e for e in before if e.path.startswith("/root/watched/deep/")], before

    with pytest.raises(NotFound) as missing, sb.files.watch("/root/no-such-dir"):
        pass
    assert missing.value.code == "file_not_found"


def test_audit(sb: Sandbox, space: Space) -> None:
    events = space.audit(sandbox=sb.id)
    ops = [e.operation for e in events]
    assert "sandbox.create" in ops
    assert "sandbox.pause" in ops
    assert all(e.sandbox == sb.id for e in events)
    assert all(a.id > b.id for a, b in itertools.pairwise(events))  # newest first
    assert len(space.audit(sandbox=sb.id, limit=1)) == 1


def test_kill(sb: Sandbox) -> None:
    assert sb.kill().state == "terminated"
    assert sb.info().state == "terminated"
    with pytest.raises(IllegalState):
        sb.exec(["true"])
