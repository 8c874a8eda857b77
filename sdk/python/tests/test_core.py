"""What the client checks and decodes by itself, before or without a server (no server
needed: nothing here opens a connection that succeeds)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from space_sdk import (
    NEVER,
    Conflict,
    EgressPolicy,
    Forbidden,
    GuestError,
    Health,
    IllegalState,
    InvalidRequest,
    InvalidResponse,
    NotFound,
    Sandbox,
    SandboxInfo,
    Space,
    SpaceError,
    Unavailable,
    WatchEvent,
    __version__,
    _core,
)
from space_sdk.errors import error_from_response

# Nothing listens on port 9 (discard); a call that reached the network would fail with a
# connection error, not with the errors these tests expect.
NOWHERE = "http://127.0.0.1:9"


@pytest.fixture
def offline() -> Space:
    return Space(NOWHERE, "space_k000000000000000_x", timeout=5)


def _info(**over: object) -> SandboxInfo:
    base = {
        "id": "sbx-0123456789abcdef",
        "tenant": "default",
        "template": "minimal",
        "template_version": "1",
        "state": "running",
        "vcpus": 1,
        "memory_mib": 256,
        "disk_mib": 64,
        "env": {},
        "metadata": {},
        "timeouts": {"idle_ms": None, "max_lifetime_ms": None, "action": "suspend"},
        "forked_from": None,
        "failure": None,
        "created_unix_ms": 1,
        "state_since_unix_ms": 1,
        "last_activity_unix_ms": 1,
        "egress": {"default": "deny", "allow": ["pypi.org:443"], "deny": []},
        "secrets": [{"name": "TOKEN", "placeholder": "space-secret-" + "0" * 32}],
        "auto_resume": False,
        "restore_point": {"snapshot": "1-full-abcd", "location": "local"},
    }
    base.update(over)
    return SandboxInfo.from_json(base)


def test_sandbox_info_reads_every_field() -> None:
    info = _info()
    assert info.egress == EgressPolicy(default="deny", allow=["pypi.org:443"])
    assert info.secrets[0].name == "TOKEN"
    assert info.secrets[0].placeholder.startswith("space-secret-")
    assert info.auto_resume is False
    assert info.restore_point is not None and info.restore_point.location == "local"
    with pytest.raises(InvalidResponse):
        _info(auto_resume="yes")
    with pytest.raises(InvalidResponse):
        _info(secrets=[{"name": "TOKEN"}])


def test_health_reads_like_a_mapping_too() -> None:
    h = Health.from_json({"status": "ok", "version": "0.1.0", "accelerator": "tcg"})
    assert h.status == "ok" and h["status"] == "ok" and h["accelerator"] == "tcg"
    with pytest.raises(KeyError):
        h["nope"]


def test_create_body_carries_network_and_wake_settings() -> None:
    body = _core.create_body(
        "minimal",
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        egress={"default": "deny", "allow": ["pypi.org"]},
        secrets=["TOKEN"],
        auto_resume=False,
    )
    assert body == {
        "template": "minimal",
        "egress": {"default": "deny", "allow": ["pypi.org"], "deny": []},
        "secrets": ["TOKEN"],
        "auto_resume": False,
    }


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"secrets": "TOKEN"}, "list of strings"),
        ({"secrets": ["A", 1]}, "not a string"),
        ({"egress": {"default": "maybe"}}, "'allow' or 'deny'"),
        ({"egress": {"allow": "pypi.org"}}, "list of strings"),
        ({"egress": {"allowed": []}}, "no field 'allowed'"),
        ({"egress": ["pypi.org"]}, "EgressPolicy or a mapping"),
        ({"auto_resume": "no"}, "True or False"),
        ({"idempotency_key": "with space"}, "visible ASCII"),
        ({"idempotency_key": ""}, "visible ASCII"),
        ({"idempotency_key": "x" * 256}, "visible ASCII"),
    ],
)
def test_bad_create_arguments_are_refused_before_sending(
    offline: Space, kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidRequest) as info:
        Sandbox.create(client=offline, **kwargs)  # type: ignore[arg-type]
    assert info.value.code == "invalid_request"
    assert info.value.status is None
    assert message in info.value.message


def test_bad_arguments_of_the_other_calls(offline: Space) -> None:
    sb = Sandbox(offline, _info())
    cases: list[Callable[[], object]] = [
        lambda: offline.set_secret("TOKEN", "v", "api.github.com"),  # a string, not a list
        lambda: offline.set_secret("TOKEN", "v", []),
        lambda: offline.set_secret("TOKEN", "", ["h"]),
        lambda: offline.set_secret("TOKEN", b"\xff", ["h"]),
        lambda: offline.create_tenant("t", max_sandboxes=-1),
        lambda: offline.create_tenant("t", max_vcpus=True),
        lambda: offline.update_tenant("t", max_suspended=-5),
        lambda: offline.create_key("t", admin="yes"),  # type: ignore[arg-type]
        lambda: offline.set_master_key("t", "kms", key_id="k"),
        lambda: offline.set_master_key("t", "deployment", region="r"),
        lambda: offline.set_master_key("t", "vault"),
        lambda: offline.create_join_token(ttl=0),
        lambda: offline.audit(limit=-1),
        lambda: sb.expose(0),
        lambda: sb.expose(70000),
        lambda: sb.unexpose(True),
        lambda: sb.proxy(8000, "/../../secrets"),
        lambda: sb.proxy(8000, "/a/./b"),
        lambda: sb.proxy(8000, "/x?y=1"),
        lambda: sb.proxy(8000, "/", method="CONNECT"),
        lambda: sb.set_egress(EgressPolicy(), default="deny"),
        lambda: sb.set_egress(allow="pypi.org"),  # a string is a sequence, but not of hosts
        lambda: sb.files.watch("/tmp").__next__(),
        lambda: offline.build_template("t", image="minimal", ready_port=80, ready_command="x"),
        lambda: offline.build_template("t", image="minimal", ready_port=80),
        lambda: offline.build_template("t", image="minimal", start_timeout=5),
        lambda: offline.build_template("t", image="minimal", egress=EgressPolicy()),
        lambda: offline.build_template("t"),
    ]
    for i, case in enumerate(cases):
        with pytest.raises(InvalidRequest) as info:
            case()
        assert info.value.status is None, i
        assert info.value.message, i


def test_bodies() -> None:
    assert _core.quotas_body(1, None, 512, NEVER) == {
        "max_sandboxes": 1,
        "max_memory_mib": 512,
        "max_suspended_ms": None,
    }
    assert _core.quotas_body(None, None, None, 90) == {"max_suspended_ms": 90_000}
    assert _core.quotas_body(None, None, None, None) == {}
    assert _core.master_key_body("kms", "alias/x", "eu-west-1", None) == {
        "provider": "kms",
        "key_id": "alias/x",
        "region": "eu-west-1",
    }
    assert _core.egress_update(None, "deny", ["a.example"], None) == {
        "default": "deny",
        "allow": ["a.example"],
        "deny": [],
    }
    assert _core.egress_update(EgressPolicy(deny=["x"]), None, None, None)["deny"] == ["x"]
    assert _core.proxy_path("sbx-1", 8000, "/") == "/v1/sandboxes/sbx-1/ports/8000/proxy/"
    assert (
        _core.proxy_path("sbx-1", 80, "static/a b/ü.txt")
        == "/v1/sandboxes/sbx-1/ports/80/proxy/static/a%20b/%C3%BC.txt"
    )
    assert _core.idempotency_headers("job-42") == {"Idempotency-Key": "job-42"}


def test_proxy_errors_are_told_from_the_apps_answers() -> None:
    envelope = json.dumps({"error": {"code": "guest_error", "message": "no"}}).encode()
    assert isinstance(_core.proxy_error(502, envelope), GuestError)
    assert isinstance(
        _core.proxy_error(409, envelope.replace(b"guest_error", b"illegal_state")), IllegalState
    )
    assert _core.proxy_error(200, envelope) is None
    assert _core.proxy_error(404, b"<html>not here</html>") is None
    assert _core.proxy_error(500, b'{"error": "the app broke"}') is None
    assert _core.proxy_error(400, b'{"error": {"code": "x", "message": "y"}, "more": 1}') is None


def test_error_codes_of_the_api_map_to_classes() -> None:
    def err(status: int, code: str) -> SpaceError:
        body = json.dumps({"error": {"code": code, "message": "m"}}).encode()
        return error_from_response(status, body)

    assert isinstance(err(403, "key_unavailable"), Forbidden)
    assert isinstance(err(409, "create_in_progress"), Conflict)
    assert isinstance(err(422, "idempotency_key_reused"), Conflict)
    assert isinstance(err(409, "idempotency_key_reused"), Conflict)
    assert isinstance(err(502, "archive_unavailable"), Unavailable)
    assert isinstance(err(503, "node_unavailable"), Unavailable)
    assert isinstance(err(503, "quota_busy"), Unavailable)
    assert isinstance(err(404, "not_a_cluster"), NotFound)
    assert isinstance(err(404, "not_found"), NotFound)
    assert isinstance(err(404, "secret_not_found"), NotFound)
    assert isinstance(err(404, "port_not_found"), NotFound)


def test_watch_stream_decoding() -> None:
    d = _core.WatchDecoder()
    events = d.feed(b'{"path": "/a", "kind": "created", "is_dir": false}\n{"path": "/b", ')
    assert events == [WatchEvent("/a", "created", False)]
    assert d.feed(b'"kind": "removed", "is_dir": true}') == []
    assert d.finish() == [WatchEvent("/b", "removed", True)]
    with pytest.raises(GuestError) as info:
        d.feed(b'{"type": "error", "code": "guest_error", "message": "inotify broke"}\n')
    assert "inotify broke" in info.value.message
    with pytest.raises(InvalidResponse):
        d.feed(b"not json\n")


def test_exec_exit_without_a_known_status() -> None:
    d = _core.ExecDecoder()
    d.feed(b'{"type": "stdout", "data": "aGk="}\n{"type": "exit", "exit_code": null, ')
    d.feed(b'"signal": null}\n')
    result = d.finish()
    assert result.exit_code == -1 and not result.ok and result.stdout == b"hi"
    broken = _core.ExecDecoder()
    with pytest.raises(InvalidResponse):
        broken.feed(b'{"type": "exit", "signal": null}\n')
        broken.finish()


def test_version_is_the_packages() -> None:
    import tomllib
    from pathlib import Path

    project = tomllib.loads(
        (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text(encoding="utf-8")
    )["project"]
    assert project["version"] == __version__
