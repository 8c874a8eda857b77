"""Where envd and E2B's API behave in a particular way the SDK relies on, space does the same:
list order and start filter, removing a missing path, permission bits in an entry's mode,
a relative working directory, a deep listing's order, a zero timeout, a command's deadline."""

import time
from datetime import datetime, timedelta, timezone

import pytest
from e2b import Sandbox, SandboxQuery, TimeoutException

from conftest import TEMPLATE


def test_list_orders_by_start_and_filters_by_start_time():
    first = Sandbox.create(TEMPLATE, timeout=300, metadata={"suite": "e2b-order"})
    try:
        time.sleep(1.1)
        cut = datetime.now(timezone.utc)
        second = Sandbox.create(TEMPLATE, timeout=300, metadata={"suite": "e2b-order"})
        try:
            q = SandboxQuery(metadata={"suite": "e2b-order"})
            ids = lambda order: [
                s.sandbox_id for s in Sandbox.list(query=q, order=order).next_items()
            ]
            assert ids("asc") == [first.sandbox_id, second.sandbox_id]
            assert ids("desc") == [second.sandbox_id, first.sandbox_id]
            later = SandboxQuery(metadata={"suite": "e2b-order"}, started_after=cut)
            assert [s.sandbox_id for s in Sandbox.list(query=later).next_items()] == [
                second.sandbox_id
            ]
            future = SandboxQuery(
                metadata={"suite": "e2b-order"}, started_after=cut + timedelta(hours=1)
            )
            assert Sandbox.list(query=future).next_items() == []
        finally:
            second.kill()
    finally:
        first.kill()


def test_files_behave_as_envd(sandbox):
    # Removing what is not there is done (envd's RemoveAll).
    sandbox.files.remove("/tmp/never-was")
    # An entry's mode is its permission bits; the type is separate.
    sandbox.files.make_dir("/tmp/walk/b/deep")
    sandbox.commands.run("chmod 750 /tmp/walk/b")
    info = sandbox.files.get_info("/tmp/walk/b")
    assert (info.type.value, info.mode) == ("dir", 0o750)
    sandbox.files.write("/tmp/walk/a.txt", "a")
    sandbox.files.write("/tmp/walk/b/deep/z.txt", "z")
    sandbox.files.write("/tmp/walk/b/c.txt", "c")
    # Depth first, each directory in name order.
    listed = [e.path for e in sandbox.files.list("/tmp/walk", depth=3)]
    assert listed == [
        "/tmp/walk/a.txt",
        "/tmp/walk/b",
        "/tmp/walk/b/c.txt",
        "/tmp/walk/b/deep",
        "/tmp/walk/b/deep/z.txt",
    ]


def test_a_relative_working_directory_is_under_the_home(sandbox):
    sandbox.files.make_dir("/home/user/proj")
    out = sandbox.commands.run("pwd", cwd="proj")
    assert out.stdout == "/home/user/proj\n"


def test_a_deadline_ends_the_command_as_a_timeout(sandbox):
    t0 = time.monotonic()
    with pytest.raises(TimeoutException):
        sandbox.commands.run("sleep 30", timeout=2)
    assert time.monotonic() - t0 < 20
    # The process is gone.
    out = sandbox.commands.run("pgrep -x sleep || echo none")
    assert out.stdout == "none\n"


def test_a_zero_timeout_ends_the_sandbox_now():
    sbx = Sandbox.create(TEMPLATE, timeout=300, metadata={"suite": "e2b-zero"})
    try:
        sbx.set_timeout(0)
        deadline = time.monotonic() + 30
        while sbx.is_running() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not sbx.is_running()
    finally:
        try:
            sbx.kill()
        except Exception:
            pass


def test_template_aliases_and_unserved_routes_answer_as_e2b():
    import os

    import httpx
    from e2b import Template

    assert Template.exists(TEMPLATE)
    assert not Template.exists("no-such-template-here")
    # A route space does not serve answers in E2B's error shape, which the SDKs parse.
    url = os.environ["E2B_API_URL"].rstrip("/")
    r = httpx.get(
        f"{url}/templates/no-such/builds/b1/status",
        headers={"X-API-KEY": os.environ["E2B_API_KEY"]},
    )
    body = r.json()
    assert r.status_code in (404, 501) and body["code"] == r.status_code, body
    assert isinstance(body["message"], str) and body["message"]


def test_an_overwrite_is_written_in_place_and_a_watch_sees_it(sandbox):
    from e2b import FilesystemEventType

    sandbox.files.make_dir("/tmp/ww")
    sandbox.files.write("/tmp/ww/f.txt", "one")
    inode = sandbox.commands.run("stat -c %i /tmp/ww/f.txt").stdout
    handle = sandbox.files.watch_dir("/tmp/ww")
    try:
        sandbox.files.write("/tmp/ww/f.txt", "two")
        events = []
        for _ in range(50):
            events += handle.get_new_events()
            if any(e.name == "f.txt" and e.type == FilesystemEventType.WRITE for e in events):
                break
            time.sleep(0.1)
    finally:
        handle.stop()
    assert any(e.name == "f.txt" and e.type == FilesystemEventType.WRITE for e in events), events
    assert sandbox.commands.run("stat -c %i /tmp/ww/f.txt").stdout == inode
    assert sandbox.files.read("/tmp/ww/f.txt") == "two"


def test_a_new_file_is_three_events_as_envd_sends(sandbox):
    from e2b import FilesystemEventType as T

    sandbox.files.make_dir("/home/user/three")
    handle = sandbox.files.watch_dir("/home/user/three")
    try:
        sandbox.files.write("/home/user/three/new.txt", "fresh")
        events = []
        for _ in range(30):
            events += handle.get_new_events()
            if len(events) >= 3:
                break
            time.sleep(0.1)
        time.sleep(0.5)
        events += handle.get_new_events()
    finally:
        handle.stop()
    assert [e.name for e in events] == ["new.txt"] * 3, events
    assert events[0].type == T.CREATE, events
    assert {e.type for e in events} == {T.CREATE, T.WRITE, T.CHMOD}, events


def test_python_is_python3_in_base(sandbox):
    out = sandbox.commands.run("python -c 'import sys; print(sys.version_info[0])'")
    assert out.stdout == "3\n"


def test_a_filesystem_only_pause_is_refused_not_done_with_memory(sandbox):
    sandbox.commands.run("echo kept > /tmp/kept")
    with pytest.raises(Exception) as e:
        sandbox.pause(mode="filesystem")
    assert "filesystem-only pause is not served" in str(e.value)
    # Nothing happened to the sandbox.
    assert sandbox.is_running()
    assert sandbox.files.read("/tmp/kept") == "kept\n"
