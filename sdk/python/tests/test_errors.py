"""Errors, configuration and the calls that need no sandbox."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from space_sdk import (
    InvalidRequest,
    NotFound,
    Sandbox,
    Space,
    SpaceConnectionError,
    SpaceError,
    Unauthorized,
)


def test_health_and_templates(space: Space) -> None:
    health = space.health()
    assert health["status"] == "ok"
    assert health["accelerator"] in ("kvm", "tcg")
    names = {t.name for t in space.templates()}
    assert "minimal" in names


def test_unknown_template_is_not_found(space: Space) -> None:
    with pytest.raises(NotFound) as info:
        Sandbox.create(template="no-such-template", client=space)
    assert info.value.code == "template_not_found"
    assert info.value.status == 404
    assert info.value.message


def test_bad_key_is_unauthorized(server: tuple[str, str]) -> None:
    url, _ = server
    with (
        Space(url, "space_k000000000000000_not-a-secret") as bad,
        pytest.raises(Unauthorized) as info,
    ):
        bad.templates()
    assert info.value.code == "unauthorized"
    assert info.value.status == 401
    with Space(url, "garbage") as bad, pytest.raises(Unauthorized):
        Sandbox.list(client=bad)


def test_ids_are_checked(space: Space) -> None:
    # Characters no id has: refused before any lookup.
    with pytest.raises(InvalidRequest) as info:
        Sandbox.connect("Not A Sandbox!", client=space)
    assert info.value.code == "invalid_id"
    assert info.value.status == 400
    # A path separator in an id is sent quoted, so it cannot reach another route.
    with pytest.raises(InvalidRequest) as odd:
        Sandbox.connect("../templates", client=space)
    assert odd.value.code == "invalid_id"
    # A well-formed id nobody has.
    with pytest.raises(NotFound) as missing:
        Sandbox.connect("sbx-" + "0" * 16, client=space)
    assert missing.value.code == "sandbox_not_found"


def test_out_of_range_field_is_invalid_request(space: Space) -> None:
    with pytest.raises(InvalidRequest) as info:
        Sandbox.create(template="minimal", vcpus=0, client=space)
    assert info.value.code == "invalid_request"


def test_unreachable_server_is_a_connection_error() -> None:
    with (
        Space("http://127.0.0.1:9", "space_k000000000000000_x", timeout=5) as nowhere,
        pytest.raises(SpaceConnectionError) as info,
    ):
        nowhere.templates()
    assert info.value.status is None
    assert "127.0.0.1:9" in str(info.value)


def test_configuration_profiles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(
        json.dumps(
            {
                "url": "http://default.example:1",
                "api_key": "k-default",
                "current": "b",
                "profiles": {"b": {"url": "http://b.example:2", "api_key": "k-b"}},
            }
        )
    )
    monkeypatch.setenv("SPACE_CONFIG", str(cfg))
    for var in ("SPACE_URL", "SPACE_API_KEY", "SPACE_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    with Space() as c:
        assert (c.url, c.api_key) == ("http://b.example:2", "k-b")
    monkeypatch.setenv("SPACE_PROFILE", "default")
    with Space() as c:
        assert (c.url, c.api_key) == ("http://default.example:1", "k-default")
    monkeypatch.setenv("SPACE_PROFILE", "nope")
    with pytest.raises(SpaceError) as info:
        Space()
    assert "no profile 'nope'" in str(info.value) and "b" in str(info.value)


def test_configuration_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"url": "http://file.example:1/", "api_key": "from-file"}))
    monkeypatch.setenv("SPACE_CONFIG", str(cfg))
    monkeypatch.delenv("SPACE_URL", raising=False)
    monkeypatch.delenv("SPACE_API_KEY", raising=False)
    with Space() as c:
        assert (c.url, c.api_key) == ("http://file.example:1", "from-file")
    monkeypatch.setenv("SPACE_API_KEY", "from-env")
    with Space() as c:
        assert (c.url, c.api_key) == ("http://file.example:1", "from-env")
    with Space(url="http://arg.example:2", api_key="from-arg") as c:
        assert (c.url, c.api_key) == ("http://arg.example:2", "from-arg")
    # XDG_CONFIG_HOME is the next place when SPACE_CONFIG is not set.
    monkeypatch.delenv("SPACE_CONFIG")
    monkeypatch.delenv("SPACE_API_KEY")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    (tmp_path / "xdg" / "space").mkdir(parents=True)
    (tmp_path / "xdg" / "space" / "config.json").write_text(
        json.dumps({"url": "http://xdg.example:3", "api_key": "from-xdg"})
    )
    with Space() as c:
        assert (c.url, c.api_key) == ("http://xdg.example:3", "from-xdg")
    # A broken file is a clear error, not a crash.
    (tmp_path / "xdg" / "space" / "config.json").write_text("{not json")
    with pytest.raises(SpaceError) as info:
        Space()
    assert info.value.code == "config_error"
    assert "not valid JSON" in info.value.message
