"""The vault, egress policies, exposed ports and the port proxy, and wake on access turned
off, through the synchronous client. One sandbox (bound to a secret, with an egress policy
and ``auto_resume=False``) serves the whole module; tests run in file order."""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from conftest import HTTPD_PAGE, HTTPD_PORT, START_HTTPD, Upstream, header, kill_quietly

from space_sdk import (
    Conflict,
    EgressPolicy,
    GuestError,
    IllegalState,
    InvalidRequest,
    NotFound,
    Sandbox,
    Space,
)

VALUE = f"sdk-secret-{secrets.token_hex(8)}"


@pytest.fixture(scope="module")
def secret_name(space: Space) -> Iterator[str]:
    """A secret of the admin's tenant that may go to 127.0.0.1 only."""
    name = f"SDK_TOKEN_{secrets.token_hex(4).upper()}"
    space.set_secret(name, VALUE, ["127.0.0.1"])
    try:
        yield name
    finally:
        with contextlib.suppress(NotFound):
            space.delete_secret(name)


def create_args(run_id: str, secret_name: str) -> dict[str, Any]:
    return {
        "template": "minimal",
        "metadata": {"suite": run_id, "client": "net"},
        "egress": EgressPolicy(default="allow", allow=["127.0.0.1"]),
        "secrets": [secret_name],
        "auto_resume": False,
        "idempotency_key": f"sdk-net-{run_id}",
    }


@pytest.fixture(scope="module")
def net(space: Space, run_id: str, secret_name: str) -> Iterator[Sandbox]:
    sandbox = Sandbox.create(**create_args(run_id, secret_name), client=space)
    try:
        yield sandbox
    finally:
        kill_quietly(sandbox)


def fetch(sb: Sandbox, upstream: Upstream, path: str, auth: str | None = None) -> tuple[int, str]:
    """``wget`` of the upstream's ``path`` from inside the sandbox, through the gateway."""
    header_arg = f'--header "Authorization: Bearer ${auth}" ' if auth else ""
    r = sb.exec(
        f"unset NO_PROXY no_proxy; wget -q -O - {header_arg}http://127.0.0.1:{upstream.port}{path}",
        timeout=60,
    )
    return r.exit_code, r.stdout.decode() + r.stderr.decode()


def test_vault_set_list_replace_delete(space: Space) -> None:
    name = f"SDK_OTHER_{secrets.token_hex(4).upper()}"
    first = space.set_secret(name, "one", ["api.example.com", "*.example.org:443"])
    assert first.name == name
    assert first.hosts == ["api.example.com", "*.example.org:443"]
    assert first.created_unix_ms == first.updated_unix_ms
    assert first.kind == "value"
    listed = {s.name: s for s in space.secrets()}
    assert listed[name] == first
    assert "one" not in repr(space.secrets())
    time.sleep(0.01)
    second = space.set_secret(name, b"two", ["api.example.com"])
    assert second.created_unix_ms == first.created_unix_ms
    assert second.updated_unix_ms > first.updated_unix_ms
    assert {s.name: s for s in space.secrets()}[name].hosts == ["api.example.com"]
    names = [s.name for s in space.secrets()]
    assert names == sorted(names)

    # The server's own checks.
    with pytest.raises(InvalidRequest) as bad_name:
        space.set_secret("lower_case", "v", ["api.example.com"])
    assert bad_name.value.status == 400
    with pytest.raises(InvalidRequest) as bad_host:
        space.set_secret(name, "v", ["a*b"])
    assert bad_host.value.status == 400
    assert {s.name: s for s in space.secrets()}[name].hosts == ["api.example.com"]
    # A one-time password seed: kept as kind totp; one that is not base32 is refused.
    otp = space.set_secret(name + "_OTP", "JBSWY3DPEHPK3PXP", ["api.example.com"], kind="totp")
    assert otp.kind == "totp"
    with pytest.raises(InvalidRequest) as bad_seed:
        space.set_secret(name + "_OTP", "not a seed!", ["api.example.com"], kind="totp")
    assert bad_seed.value.status == 400 and "base32" in str(bad_seed.value)
    space.delete_secret(name + "_OTP")

    space.delete_secret(name)
    assert name not in [s.name for s in space.secrets()]
    with pytest.raises(NotFound) as gone:
        space.delete_secret(name)
    assert gone.value.code == "secret_not_found"
    with pytest.raises(NotFound) as unbound:
        Sandbox.create(template="minimal", secrets=[name], client=space)
    assert unbound.value.code == "secret_not_found"


def test_create_with_egress_secrets_and_auto_resume(net: Sandbox, secret_name: str) -> None:
    info = net.info()
    assert info.auto_resume is False
    assert info.egress.default == "allow"
    assert len(info.egress.allow) == 1 and "127.0.0.1" in info.egress.allow[0]
    assert [b.name for b in info.secrets] == [secret_name]
    placeholder = info.secrets[0].placeholder
    assert placeholder.startswith("space-secret-") and len(placeholder) == 45
    env = net.exec(["env"]).text
    assert f"{secret_name}={placeholder}" in env.splitlines()
    assert VALUE not in env


def test_create_is_idempotent_per_key(
    net: Sandbox, space: Space, run_id: str, secret_name: str
) -> None:
    again = Sandbox.create(**create_args(run_id, secret_name), client=space)
    assert again.id == net.id
    changed = create_args(run_id, secret_name)
    changed["metadata"] = {"suite": run_id, "client": "other"}
    with pytest.raises(Conflict) as reused:
        Sandbox.create(**changed, client=space)
    assert reused.value.code == "idempotency_key_reused"
    assert reused.value.status == 422


def test_egress_policy_is_read_back_and_enforced(
    net: Sandbox, upstream: Upstream, secret_name: str, space: Space
) -> None:
    # Allowed exactly: the request goes out, with the secret's value in place of the
    # placeholder.
    code, out = fetch(net, upstream, "/sdk-1", auth=secret_name)
    assert code == 0, out
    assert out == "upstream saw /sdk-1\n"
    [head] = upstream.seen("/sdk-1")
    assert header(head, "Authorization") == f"Bearer {VALUE}"

    # Allow-all without a rule naming it: a private address is refused.
    applied = net.set_egress(default="allow")
    assert applied == EgressPolicy(default="allow", allow=[], deny=[])
    assert net.egress() == applied
    assert net.last_info.egress == applied
    code, out = fetch(net, upstream, "/sdk-2")
    assert code != 0, out
    assert upstream.seen("/sdk-2") == []

    # Deny by default, the host allowed: it goes out again.
    applied = net.set_egress(EgressPolicy(default="deny", allow=["127.0.0.1"]))
    assert applied.default == "deny" and "127.0.0.1" in applied.allow[0]
    assert net.info().egress == applied
    code, out = fetch(net, upstream, "/sdk-3")
    assert code == 0, out
    assert len(upstream.seen("/sdk-3")) == 1

    # Denied by a rule, whatever else says.
    net.set_egress({"default": "allow", "allow": ["127.0.0.1"], "deny": ["127.0.0.1"]})
    code, out = fetch(net, upstream, "/sdk-4")
    assert code != 0, out
    assert upstream.seen("/sdk-4") == []
    net.set_egress(default="deny", allow=["127.0.0.1"])

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        ops = {e.operation for e in space.audit(sandbox=net.id, limit=1000)}
        if {"egress.update", "egress.deny", "credential.use"} <= ops:
            break
        time.sleep(0.5)
    assert {"egress.update", "egress.deny", "credential.use"} <= ops, ops


def wait_for_httpd(sb: Sandbox) -> httpx.Response:
    deadline = time.monotonic() + 30
    while True:
        try:
            resp = sb.proxy(HTTPD_PORT, "/index.html")
            if resp.status_code == 200:
                return resp
        except GuestError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.3)


def test_port_proxy_and_exposed_ports(net: Sandbox) -> None:
    started = net.exec(START_HTTPD)
    assert started.ok, started
    resp = wait_for_httpd(net)
    assert resp.text == HTTPD_PAGE
    # The app's own answers come back whatever their status.
    missing = net.proxy(HTTPD_PORT, "/missing.html")
    assert missing.status_code == 404
    # Nothing listens there: the proxy's own error.
    with pytest.raises(GuestError) as nothing:
        net.proxy(HTTPD_PORT + 1, "/")
    assert nothing.value.code == "guest_error"

    assert net.ports() == []
    exposed = net.expose(HTTPD_PORT)
    assert exposed.port == HTTPD_PORT
    assert "/ingress/" in exposed.url and exposed.url.endswith("/")
    # The ingress URL needs no key.
    public = httpx.get(exposed.url + "index.html", timeout=60)
    assert public.status_code == 200 and public.text == HTTPD_PAGE
    [port] = net.ports()
    assert (port.port, port.created_unix_ms) == (HTTPD_PORT, exposed.created_unix_ms)

    # Exposing again makes a new URL and revokes the old one.
    again = net.expose(HTTPD_PORT)
    assert again.url != exposed.url
    assert httpx.get(exposed.url + "index.html", timeout=60).status_code == 404
    assert httpx.get(again.url + "index.html", timeout=60).text == HTTPD_PAGE

    net.unexpose(HTTPD_PORT)
    assert net.ports() == []
    assert httpx.get(again.url + "index.html", timeout=60).status_code == 404
    with pytest.raises(NotFound) as gone:
        net.unexpose(HTTPD_PORT)
    assert gone.value.code == "port_not_found"
    # The proxy reaches a port whether it is exposed or not.
    assert net.proxy(HTTPD_PORT, "/").text == HTTPD_PAGE


def test_no_wake_on_access_when_auto_resume_is_off(net: Sandbox) -> None:
    assert net.pause().state == "paused"
    with pytest.raises(IllegalState):
        net.exec(["true"])
    with pytest.raises(IllegalState):
        net.files.read("/srv/www/index.html")
    with pytest.raises(IllegalState):
        net.proxy(HTTPD_PORT, "/")
    assert net.info().state == "paused"
    assert net.resume().state == "running"
    assert net.exec(["true"]).ok
    assert net.proxy(HTTPD_PORT, "/").text == HTTPD_PAGE


def test_kill_revokes_ingress_urls(net: Sandbox) -> None:
    exposed = net.expose(HTTPD_PORT)
    assert httpx.get(exposed.url, timeout=60).status_code == 200
    assert net.kill().state == "terminated"
    assert httpx.get(exposed.url, timeout=60).status_code == 404
    assert net.ports() == []
    with pytest.raises(IllegalState):
        net.expose(HTTPD_PORT)
