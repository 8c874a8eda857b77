"""The synchronous E2B Python SDK: lifecycle and commands."""

import threading
import time

import pytest
from e2b import (
    AuthenticationException,
    CommandExitException,
    PtySize,
    Sandbox,
    SandboxException,
    SandboxQuery,
)

from conftest import TEMPLATE


def test_create_with_metadata_and_env_then_info_and_list(sandbox):
    info = sandbox.get_info()
    assert info.sandbox_id == sandbox.sandbox_id
    assert info.metadata == {"suite": "e2b-sync"}
    assert info.state.value == "running"
    assert info.cpu_count >= 1 and info.memory_mb >= 64
    assert info.end_at > info.started_at

    with_env = Sandbox.create(TEMPLATE, envs={"GREETING": "hej"}, metadata={"suite": "e2b-env", "k": "v 1/2"})
    try:
        out = with_env.commands.run("echo $GREETING")
        assert out.stdout == "hej\n"
        found = Sandbox.list(query=SandboxQuery(metadata={"k": "v 1/2"})).next_items()
        assert [s.sandbox_id for s in found] == [with_env.sandbox_id]
        assert found[0].metadata["suite"] == "e2b-env"
    finally:
        with_env.kill()


def test_commands_output_callbacks_and_exit_codes(sandbox):
    out = sandbox.commands.run("echo out; echo err >&2")
    assert (out.stdout, out.stderr, out.exit_code) == ("out\n", "err\n", 0)

    seen = []
    out = sandbox.commands.run(
        "for i in 1 2 3; do echo line$i; sleep 0.1; done",
        on_stdout=lambda line: seen.append(line),
    )
    assert "".join(seen) == "line1\nline2\nline3\n"

    with pytest.raises(CommandExitException) as e:
        sandbox.commands.run("echo bad >&2; exit 3")
    assert e.value.exit_code == 3
    assert e.value.stderr == "bad\n"

    out = sandbox.commands.run("pwd; echo $HOME", cwd="/tmp", envs={"HOME": "/tmp/h"})
    assert out.stdout == "/tmp\n/tmp/h\n"


def test_commands_run_as_user_by_default_with_sudo(sandbox):
    out = sandbox.commands.run("id -un; id -u; pwd; sudo -n id -un")
    assert out.stdout == "user\n1000\n/home/user\nroot\n"
    assert sandbox.commands.run("id -un", user="root").stdout == "root\n"


def test_background_commands_wait_kill_list_and_stdin(sandbox):
    h = sandbox.commands.run("sleep 0.3; echo done", background=True)
    assert h.wait().stdout == "done\n"

    long = sandbox.commands.run("sleep 600", background=True)
    pids = [p.pid for p in sandbox.commands.list()]
    assert long.pid in pids
    assert sandbox.commands.kill(long.pid) is True
    with pytest.raises(CommandExitException):
        long.wait()
    assert sandbox.commands.kill(long.pid) is False

    cat = sandbox.commands.run("cat", background=True, stdin=True)
    sandbox.commands.send_stdin(cat.pid, "fed through stdin\n")
    sandbox.commands.close_stdin(cat.pid)
    assert cat.wait().stdout == "fed through stdin\n"


def test_a_background_command_is_reached_again_after_disconnect(sandbox):
    h = sandbox.commands.run("for i in $(seq 1 40); do echo tick$i; sleep 0.1; done", background=True)
    h.disconnect()
    again = sandbox.commands.connect(h.pid)
    result = again.wait()
    assert "tick40\n" in result.stdout


def test_connect_by_id_set_timeout_pause_and_resume(sandbox):
    sandbox.commands.run("echo kept > $HOME/kept.txt")
    worker = sandbox.commands.run("sleep 1000", background=True)

    second = Sandbox.connect(sandbox.sandbox_id)
    assert second.commands.run("cat $HOME/kept.txt").stdout == "kept\n"

    before = sandbox.get_info().end_at
    sandbox.set_timeout(1200)
    assert sandbox.get_info().end_at > before

    assert sandbox.pause() is True
    assert sandbox.get_info().state.value == "paused"
    resumed = Sandbox.connect(sandbox.sandbox_id)
    assert resumed.get_info().state.value == "running"
    assert resumed.commands.run("cat $HOME/kept.txt").stdout == "kept\n"
    assert worker.pid in [p.pid for p in resumed.commands.list()]


def test_kill_then_connect_fails():
    # A create sent again under its idempotency key answers the same sandbox.
    key = f"kill-test-{time.time_ns()}"
    sbx = Sandbox.create(TEMPLATE, idempotency_key=key)
    assert Sandbox.create(TEMPLATE, idempotency_key=key).sandbox_id == sbx.sandbox_id
    with pytest.raises(SandboxException):
        Sandbox.create(TEMPLATE, idempotency_key=key, metadata={"other": "request"})
    assert sbx.kill() is True
    assert Sandbox.kill(sbx.sandbox_id) is False
    with pytest.raises(SandboxException):
        Sandbox.connect(sbx.sandbox_id)
    assert sbx.is_running() is False


def test_keys_and_tenants(sandbox, other_key):
    with pytest.raises(AuthenticationException):
        Sandbox.create(TEMPLATE, api_key="space_nonexistent_key_0000")
    # Another tenant sees nothing of the sandbox and cannot connect to it.
    ids = [s.sandbox_id for s in Sandbox.list(api_key=other_key).next_items()]
    assert sandbox.sandbox_id not in ids
    with pytest.raises(SandboxException):
        Sandbox.connect(sandbox.sandbox_id, api_key=other_key)


def test_pty_output_resize_and_kill(sandbox):
    seen = bytearray()
    term = sandbox.pty.create(PtySize(rows=24, cols=80))

    def read():
        try:
            term.wait(on_pty=lambda b: seen.extend(b))
        except CommandExitException:
            pass

    reader = threading.Thread(target=read, daemon=True)
    reader.start()

    def until(needle):
        deadline = time.time() + 20
        while needle not in seen and time.time() < deadline:
            time.sleep(0.05)
        assert needle in seen, bytes(seen)

    sandbox.pty.send_stdin(term.pid, b"stty size; echo pty-$((40+2))\n")
    until(b"pty-42")
    assert b"24 80" in seen
    sandbox.pty.resize(term.pid, PtySize(rows=30, cols=100))
    sandbox.pty.send_stdin(term.pid, b"stty size\n")
    until(b"30 100")
    assert sandbox.pty.kill(term.pid) is True
    reader.join(10)
    assert not reader.is_alive()


def test_files_round_trip_list_and_errors(sandbox):
    import hashlib
    import os as _os

    from e2b import FileType, NotFoundException

    info = sandbox.files.write("notes/hello.txt", "hello files\n")
    assert info.path == "/home/user/notes/hello.txt"
    assert sandbox.files.read("notes/hello.txt") == "hello files\n"
    # Written by the API, owned by the user: a command can append to it.
    sandbox.commands.run("echo more >> ~/notes/hello.txt")
    assert sandbox.files.read("/home/user/notes/hello.txt") == "hello files\nmore\n"

    blob = _os.urandom(5 * 1024 * 1024)
    sandbox.files.write("/tmp/blob.bin", blob)
    back = sandbox.files.read("/tmp/blob.bin", format="bytes")
    assert hashlib.sha256(bytes(back)).hexdigest() == hashlib.sha256(blob).hexdigest()
    out = sandbox.commands.run("sha256sum /tmp/blob.bin")
    assert out.stdout.split()[0] == hashlib.sha256(blob).hexdigest()

    assert sandbox.files.make_dir("/tmp/d/e") is True
    assert sandbox.files.make_dir("/tmp/d/e") is False
    sandbox.files.write("/tmp/d/e/f.txt", "f")
    entries = sandbox.files.list("/tmp/d", depth=2)
    assert sorted(e.path for e in entries) == ["/tmp/d/e", "/tmp/d/e/f.txt"]
    assert {e.path: e.type for e in entries}["/tmp/d/e"] == FileType.DIR

    got = sandbox.files.get_info("/tmp/d/e/f.txt")
    assert (got.name, got.size, got.type) == ("f.txt", 1, FileType.FILE)
    assert sandbox.files.exists("/tmp/d/e/f.txt") is True
    moved = sandbox.files.rename("/tmp/d/e/f.txt", "/tmp/d/g.txt")
    assert moved.path == "/tmp/d/g.txt"
    assert sandbox.files.exists("/tmp/d/e/f.txt") is False
    sandbox.files.remove("/tmp/d")
    assert sandbox.files.exists("/tmp/d") is False

    with pytest.raises(NotFoundException):
        sandbox.files.read("/tmp/no-such-file")
    with pytest.raises(NotFoundException):
        sandbox.files.get_info("/tmp/no-such-file")


def test_files_octet_stream_gzip_and_metadata(sandbox):
    import hashlib
    import io
    import os as _os

    from e2b import InvalidArgumentException

    blob = _os.urandom(1024 * 1024) + b"a" * (1024 * 1024)
    digest = hashlib.sha256(blob).hexdigest()
    # gzip implies the octet-stream upload; the metadata is kept as the file's attributes,
    # keys lowercased.
    info = sandbox.files.write(
        "/tmp/gz.bin", blob, gzip=True, metadata={"Team": "infra", "run-id": "42"}
    )
    assert info.path == "/tmp/gz.bin"
    assert info.metadata == {"team": "infra", "run-id": "42"}
    back = sandbox.files.read("/tmp/gz.bin", format="bytes", gzip=True)
    assert hashlib.sha256(bytes(back)).hexdigest() == digest
    # A file-like is streamed as octet-stream, uncompressed.
    sandbox.files.write("/tmp/streamed.bin", io.BytesIO(blob))
    out = sandbox.commands.run("sha256sum /tmp/streamed.bin")
    assert out.stdout.split()[0] == digest

    # A rewrite's metadata is the file's from then on (envd drops what it does not name);
    # the guest sees xattrs.
    sandbox.files.write("/tmp/gz.bin", "short", metadata={"team": "web"})
    assert sandbox.files.get_info("/tmp/gz.bin").metadata == {"team": "web"}
    out = sandbox.commands.run(
        "python3 -c \"import os; print(os.getxattr('/tmp/gz.bin', 'user.e2b.team').decode())\""
    )
    assert out.stdout.strip() == "web"
    moved = sandbox.files.rename("/tmp/gz.bin", "/tmp/gz2.bin")
    assert moved.metadata == {"team": "web"}
    listed = {e.name: e.metadata for e in sandbox.files.list("/tmp")}
    assert listed["gz2.bin"] == {"team": "web"}
    assert listed["streamed.bin"] is None

    # Several files at once (multipart): the same metadata on each.
    infos = sandbox.files.write_files(
        [{"path": "/tmp/m/a.txt", "data": "a"}, {"path": "/tmp/m/b.txt", "data": "b"}],
        metadata={"k": "v"},
    )
    assert sorted((i.path, i.metadata["k"]) for i in infos) == [
        ("/tmp/m/a.txt", "v"),
        ("/tmp/m/b.txt", "v"),
    ]
    # More keys than a file holds: refused, and the file is not written.
    with pytest.raises(InvalidArgumentException):
        sandbox.files.write("/tmp/m/c.txt", "c", metadata={f"k{i}": "v" for i in range(40)})
    assert sandbox.files.exists("/tmp/m/c.txt") is False


def test_signed_file_urls_work_on_the_sandbox_host(sandbox):
    import httpx

    sandbox.files.write("/tmp/signed.txt", "signed")
    # The SDK's URLs are on E2B_SANDBOX_URL, which names no sandbox: the sandbox's envd host
    # does, and there a URL needs nothing but its signature.
    host = sandbox.get_host(49983)
    url = sandbox.download_url("/tmp/signed.txt", use_signature_expiration=120)
    r = httpx.get(url, headers={"Host": host})
    assert (r.status_code, r.text) == (200, "signed")
    forged = httpx.get(url.replace("signed.txt", "other.txt"), headers={"Host": host})
    assert (forged.status_code, forged.json()) == (
        401,
        {"code": 401, "message": "invalid signature"},
    )
    # Expired, as envd says it.
    expired = sandbox.download_url("/tmp/signed.txt", use_signature_expiration=-10)
    r = httpx.get(expired, headers={"Host": host})
    assert (r.status_code, r.json()) == (
        401,
        {"code": 401, "message": "signature is already expired"},
    )
    up = sandbox.upload_url("/tmp/uploaded.txt")
    r = httpx.post(up, headers={"Host": host}, files={"file": ("uploaded.txt", b"via a URL")})
    assert r.status_code == 200, r.text
    assert sandbox.files.read("/tmp/uploaded.txt") == "via a URL"
    # A read URL does not write.
    r = httpx.post(url, headers={"Host": host}, files={"file": ("signed.txt", b"x")})
    assert r.status_code == 401


def test_get_host_reaches_a_server_in_the_sandbox(sandbox):
    import os as _os
    import urllib.error
    import urllib.request

    sandbox.commands.run("mkdir -p /tmp/site && echo served-by-guest > /tmp/site/index.html")
    server = sandbox.commands.run("cd /tmp/site && python3 -m http.server 8000", background=True)
    host = sandbox.get_host(8000)
    assert host == f"8000-{sandbox.sandbox_id}.{sandbox.sandbox_domain}"
    # The host names the sandbox and port; any client reaches it through the listener.
    api = _os.environ["E2B_API_URL"]
    body = None
    for _ in range(100):
        req = urllib.request.Request(api + "/index.html", headers={"Host": host})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                body = r.read().decode()
                break
        except Exception:
            time.sleep(0.2)
    assert body == "served-by-guest\n"
    sandbox.commands.kill(server.pid)

    # A sandbox whose create kept its traffic private answers on its host only with its
    # traffic token: 403 without it (or with another sandbox's), as E2B answers.
    assert sandbox.traffic_access_token is None
    private = Sandbox.create(TEMPLATE, network={"allow_public_traffic": False})
    try:
        token = private.traffic_access_token
        assert token and len(token) == 64
        private.commands.run("mkdir -p /tmp/p && echo private-page > /tmp/p/index.html")
        private.commands.run("cd /tmp/p && python3 -m http.server 8000", background=True)
        private.commands.run("for i in $(seq 50); do curl -s -o /dev/null localhost:8000 && break; sleep 0.1; done")
        for headers in [{}, {"e2b-traffic-access-token": "0" * 64}]:
            req = urllib.request.Request(
                api + "/index.html", headers={"Host": private.get_host(8000), **headers}
            )
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(req, timeout=10)
            assert e.value.code == 403
        req = urllib.request.Request(
            api + "/index.html",
            headers={"Host": private.get_host(8000), "e2b-traffic-access-token": token},
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.read().decode() == "private-page\n"
    finally:
        private.kill()


def test_watch_dir_polls_new_files(sandbox):
    from e2b import FilesystemEventType

    sandbox.files.make_dir("/tmp/polled")
    handle = sandbox.files.watch_dir("/tmp/polled", recursive=True)
    sandbox.files.write("/tmp/polled/seen.txt", "y")
    events = []
    for _ in range(100):
        events.extend(handle.get_new_events())
        if any(e.name == "seen.txt" and e.type == FilesystemEventType.CREATE for e in events):
            break
        time.sleep(0.1)
    handle.stop()
    assert any(e.name == "seen.txt" and e.type == FilesystemEventType.CREATE for e in events), events
