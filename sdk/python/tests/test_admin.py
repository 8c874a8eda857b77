"""Tenants, keys, master keys and the cluster routes, with the admin key, and the calls that
need no key; no sandbox is started (quotas refuse before a VM is made)."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest

from space_sdk import (
    NEVER,
    Conflict,
    Forbidden,
    Health,
    InvalidRequest,
    KeyCreated,
    NotFound,
    QuotaExceeded,
    Sandbox,
    Space,
    Unauthorized,
)


def tenant_name() -> str:
    return f"sdk-{secrets.token_hex(5)}"


def test_tenant_create_update_and_quotas_enforced(space: Space, server: tuple[str, str]) -> None:
    url, _ = server
    name = tenant_name()
    made = space.create_tenant(
        name, max_sandboxes=5, max_vcpus=4, max_memory_mib=1024, max_suspended=NEVER
    )
    assert made.tenant.name == name
    q = made.tenant.quotas
    assert (q.max_sandboxes, q.max_vcpus, q.max_memory_mib, q.max_suspended_ms) == (
        5,
        4,
        1024,
        None,
    )
    assert isinstance(made.key, KeyCreated)
    assert made.key.tenant == name and made.key.admin is False
    assert made.key.key.startswith(f"space_{made.key.id}_")
    assert name in [t.name for t in space.tenants()]

    updated = space.update_tenant(name, max_sandboxes=0, max_suspended=3600)
    assert updated.quotas.max_sandboxes == 0
    assert updated.quotas.max_vcpus == 4  # left out: kept
    assert updated.quotas.max_suspended_ms == 3_600_000
    assert {t.name: t for t in space.tenants()}[name] == updated

    with Space(url, made.key.key) as tenant:
        assert tenant.secrets() == []
        with pytest.raises(QuotaExceeded) as over:
            Sandbox.create(template="minimal", client=tenant)
        assert over.value.code == "quota_exceeded"
        # A tenant key is no admin key.
        with pytest.raises(Forbidden):
            tenant.tenants()
        with pytest.raises(Forbidden):
            tenant.create_tenant(tenant_name())

    assert space.update_tenant(name, max_suspended=NEVER).quotas.max_suspended_ms is None
    with pytest.raises(Conflict):
        space.create_tenant(name)
    with pytest.raises(NotFound) as missing:
        space.update_tenant("no-such-tenant-sdk", max_sandboxes=1)
    assert missing.value.code == "tenant_not_found"
    with pytest.raises(InvalidRequest) as bad:
        space.create_tenant("Not A Name")
    assert bad.value.status == 400

    # One tenant's audit, as the admin sees it: the refused create is there.
    events = space.audit(tenant=name)
    assert events and all(e.tenant == name for e in events)
    assert any(e.operation == "sandbox.create" and e.result == "quota_exceeded" for e in events)


def test_keys_create_use_and_revoke(space: Space, server: tuple[str, str]) -> None:
    url, _ = server
    name = tenant_name()
    first = space.create_tenant(name).key
    assert [(k.id, k.label, k.revoked) for k in space.keys(name)] == [(first.id, "first", False)]

    made = space.create_key(name, label="ci")
    assert made.label == "ci" and made.admin is False and made.tenant == name
    admin = space.create_key(name, admin=True)
    assert admin.admin is True
    assert {k.id for k in space.keys(name)} == {first.id, made.id, admin.id}
    assert all(not hasattr(k, "key") for k in space.keys(name))

    with Space(url, made.key) as as_ci:
        as_ci.set_secret("SDK_KEY_TEST", "v", ["api.example.com"])
        assert [s.name for s in as_ci.secrets()] == ["SDK_KEY_TEST"]
        with pytest.raises(Forbidden):
            as_ci.keys(name)
    with Space(url, admin.key) as as_admin:
        assert name in [t.name for t in as_admin.tenants()]

    space.revoke_key(made)
    [listed] = [k for k in space.keys(name) if k.id == made.id]
    assert listed.revoked and listed.revoked_unix_ms is not None
    with Space(url, made.key) as revoked, pytest.raises(Unauthorized):
        revoked.secrets()
    space.revoke_key(admin.id)
    with Space(url, admin.key) as revoked, pytest.raises(Unauthorized):
        revoked.tenants()
    # The first key still works.
    with Space(url, first.key) as still:
        assert [s.name for s in still.secrets()] == ["SDK_KEY_TEST"]

    with pytest.raises(NotFound) as unknown:
        space.revoke_key("k" + "0" * 15)
    assert unknown.value.code == "key_not_found"
    with pytest.raises(InvalidRequest) as malformed:
        space.revoke_key("not-a-key-id")
    assert malformed.value.code == "invalid_id"
    with pytest.raises(NotFound):
        space.keys("no-such-tenant-sdk")


def test_master_key(space: Space) -> None:
    name = tenant_name()
    space.create_tenant(name)
    mk = space.master_key(name)
    assert mk.provider == "deployment"
    assert mk.id
    assert space.set_master_key(name, "deployment") == mk
    # A KMS key that cannot be reached refuses; nothing changes.
    with pytest.raises(Forbidden) as refused:
        space.set_master_key(
            name, "kms", key_id="alias/sdk-test", region="us-east-1", endpoint="http://127.0.0.1:9"
        )
    assert refused.value.code == "key_unavailable"
    assert space.master_key(name) == mk
    with pytest.raises(NotFound) as missing:
        space.master_key("no-such-tenant-sdk")
    assert missing.value.code == "tenant_not_found"


def test_cluster_routes_on_a_single_node_server(space: Space, server: tuple[str, str]) -> None:
    url, _ = server
    for call in (
        space.nodes,
        lambda: space.drain_node("node-1"),
        lambda: space.remove_node("node-1"),
        lambda: space.create_join_token(ttl=60),
    ):
        with pytest.raises(NotFound) as info:
            call()
        assert info.value.code == "not_a_cluster"
    made = space.create_tenant(tenant_name())
    with Space(url, made.key.key) as tenant, pytest.raises(Forbidden):
        tenant.nodes()


def test_health_metrics_and_document(space: Space, server: tuple[str, str]) -> None:
    url, _ = server
    space.secrets()
    # These need no key.
    with Space(url, "space_k000000000000000_no-key-needed") as anyone:
        health = anyone.health()
        assert isinstance(health, Health) and health.status == "ok"
        assert health.accelerator in ("kvm", "tcg")
        metrics = anyone.metrics()
        assert "space_api_requests_total" in metrics
        assert 'operation="secret.list"' in metrics
        document = anyone.openapi()
    checked_in = json.loads(
        (Path(__file__).resolve().parents[3] / "crates/space-control/openapi.json").read_text()
    )
    assert document == checked_in
