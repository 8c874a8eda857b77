"""Tenants are isolated: a second tenant's key sees nothing of the first's sandbox."""

from __future__ import annotations

import httpx
import pytest
from conftest import kill_quietly, new_tenant

from space_sdk import Forbidden, NotFound, Sandbox, Space


def test_other_tenant_cannot_see_sandbox(
    space: Space, admin_http: httpx.Client, server: tuple[str, str], run_id: str
) -> None:
    url, _ = server
    sb = Sandbox.create(
        template="minimal", metadata={"suite": run_id, "client": "tenant"}, client=space
    )
    try:
        name, key = new_tenant(admin_http)
        with Space(url, key) as other:
            assert sb.id not in [s.id for s in Sandbox.list(client=other)]
            with pytest.raises(NotFound) as info:
                Sandbox.connect(sb.id, client=other)
            assert info.value.code == "sandbox_not_found"
            foreign = Sandbox(other, sb.last_info)  # a handle made from a leaked id
            with pytest.raises(NotFound):
                foreign.exec(["true"])
            with pytest.raises(NotFound):
                foreign.files.read("/etc/hostname")
            with pytest.raises(NotFound):
                foreign.kill()
            # The other tenant's audit holds its own refused attempts, nothing of the owner's.
            events = other.audit()
            assert all(e.tenant == name for e in events), events
            assert not [e for e in events if e.sandbox == sb.id and e.result == "ok"], events
            assert any(e.operation == "sandbox.create" for e in space.audit(sandbox=sb.id))
            # A tenant key is not an admin key.
            with pytest.raises(Forbidden) as denied:
                other.request("GET", "/v1/tenants")
            assert denied.value.code == "forbidden"
        # The owner's sandbox is untouched.
        assert sb.info().state == "running"
        assert sb.exec(["true"]).exit_code == 0
    finally:
        kill_quietly(sb)
