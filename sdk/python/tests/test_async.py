"""The asyncio client: the same essentials as the synchronous tests, on one sandbox."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import secrets
import time

import httpx
import pytest
from conftest import HTTPD_PAGE, HTTPD_PORT, START_HTTPD

from space_sdk import (
    NEVER,
    AsyncSandbox,
    AsyncSpace,
    EgressPolicy,
    Forbidden,
    GuestError,
    Health,
    IllegalState,
    NotFound,
    QuotaExceeded,
    Unauthorized,
)


@pytest.mark.asyncio
async def test_async_lifecycle(server: tuple[str, str], run_id: str) -> None:
    url, key = server
    async with AsyncSpace(url, key) as space:
        secret = f"SDK_ASYNC_{secrets.token_hex(4).upper()}"
        await space.set_secret(secret, "async-value", ["127.0.0.1"])
        sb = await AsyncSandbox.create(
            template="minimal",
            metadata={"suite": run_id, "client": "async"},
            secrets=[secret],
            auto_resume=True,
            idempotency_key=f"sdk-async-{run_id}",
            client=space,
        )
        async with sb:
            assert sb.state == "running"
            assert sb.last_info.auto_resume is True
            [binding] = sb.last_info.secrets
            assert binding.name == secret
            env = (await sb.exec(["env"])).text.splitlines()
            assert f"{secret}={binding.placeholder}" in env
            again = await AsyncSandbox.create(
                template="minimal",
                metadata={"suite": run_id, "client": "async"},
                secrets=[secret],
                auto_resume=True,
                idempotency_key=f"sdk-async-{run_id}",
                client=space,
            )
            assert again.id == sb.id
            found = await AsyncSandbox.list(
                metadata={"suite": run_id, "client": "async"}, client=space
            )
            assert [s.id for s in found] == [sb.id]

            # exec with a coroutine callback, streamed
            chunks: list[tuple[float, bytes]] = []

            async def on_out(data: bytes) -> None:
                await asyncio.sleep(0)
                chunks.append((time.monotonic(), data))

            result = await sb.exec("echo a; sleep 2; echo b; exit 5", on_stdout=on_out)
            done = time.monotonic()
            assert result.exit_code == 5
            assert result.stdout == b"a\nb\n"
            assert b"".join(c for _, c in chunks) == b"a\nb\n"
            assert done - chunks[0][0] >= 1.0

            # several execs at once on one sandbox
            outs = await asyncio.gather(*(sb.exec(["echo", str(i)]) for i in range(4)))
            assert [o.stdout for o in outs] == [f"{i}\n".encode() for i in range(4)]

            # files, 5 MB both ways
            data = os.urandom(5 * 1024 * 1024)
            digest = hashlib.sha256(data).hexdigest()
            assert (await sb.files.write("/root/a.bin", io.BytesIO(data))).size == len(data)
            assert hashlib.sha256(await sb.files.read("/root/a.bin")).hexdigest() == digest
            guest = await sb.exec(["sha256sum", "/root/a.bin"])
            assert guest.stdout.split()[0].decode() == digest
            assert "a.bin" in [e.name for e in await sb.files.list("/root")]
            await sb.files.remove("/root/a.bin")
            assert not await sb.files.exists("/root/a.bin")

            # watch
            await sb.files.mkdir("/root/w")
            async with sb.files.watch("/root/w", recursive=True, timeout=60) as w:
                await sb.files.write("/root/w/a.txt", b"1")
                seen = []
                async for event in w:
                    seen.append(event)
                    if event.path == "/root/w/a.txt":
                        break
            assert seen[-1].path == "/root/w/a.txt" and not seen[-1].is_dir
            assert [e async for e in w] == []

            # egress
            assert await sb.egress() == EgressPolicy()  # allow all unless told otherwise
            applied = await sb.set_egress(default="deny", allow=["pypi.org"])
            assert applied.default == "deny" and len(applied.allow) == 1
            assert "pypi.org" in applied.allow[0]
            assert (await sb.info()).egress == applied == await sb.egress()

            # the port proxy and exposed ports
            assert (await sb.exec(START_HTTPD)).ok
            deadline = time.monotonic() + 30
            while True:
                try:
                    page = await sb.proxy(HTTPD_PORT, "/index.html")
                    break
                except GuestError:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.3)
            assert page.status_code == 200 and page.text == HTTPD_PAGE
            assert (await sb.proxy(HTTPD_PORT, "/nope")).status_code == 404
            with pytest.raises(GuestError):
                await sb.proxy(HTTPD_PORT + 1, "/")
            exposed = await sb.expose(HTTPD_PORT)
            async with httpx.AsyncClient(timeout=60) as anyone:
                assert (await anyone.get(exposed.url)).text == HTTPD_PAGE
                assert [p.port for p in await sb.ports()] == [HTTPD_PORT]
                await sb.unexpose(HTTPD_PORT)
                assert await sb.ports() == []
                assert (await anyone.get(exposed.url)).status_code == 404
            with pytest.raises(NotFound):
                await sb.unexpose(HTTPD_PORT)

            # pause / resume
            assert (await sb.pause()).state == "paused"
            with pytest.raises(IllegalState):
                await sb.pause()
            assert (await sb.resume()).state == "running"
            # Using a paused sandbox resumes it.
            assert (await sb.pause()).state == "paused"
            assert (await sb.exec(["true"])).exit_code == 0
            assert (await sb.info()).state == "running"

            # snapshot / rollback
            await sb.files.write("/root/v", b"1")
            snap = await sb.snapshot()
            await sb.files.write("/root/v", b"2")
            assert snap.id in [s.id for s in await sb.snapshots()]
            assert (await sb.rollback(snap.id)).state == "running"
            assert await sb.files.read("/root/v") == b"1"

            # suspend / restore
            assert (await sb.suspend()).state == "suspended"
            assert (await sb.restore()).state == "running"
            assert await sb.files.read("/root/v") == b"1"

            # fork / kill
            child = await sb.fork()
            async with child:
                assert await child.files.read("/root/v") == b"1"
                assert child.last_info.forked_from is not None
            assert (await child.info()).state == "terminated"

            assert (await sb.kill()).state == "terminated"
        assert (await sb.info()).state == "terminated"


@pytest.mark.asyncio
async def test_async_errors(server: tuple[str, str]) -> None:
    url, key = server
    async with AsyncSpace(url, key) as space:
        with pytest.raises(NotFound) as info:
            await AsyncSandbox.create(template="no-such-template", client=space)
        assert info.value.code == "template_not_found"
        with pytest.raises(NotFound):
            await AsyncSandbox.connect("sbx-" + "1" * 16, client=space)
        assert (await space.health())["status"] == "ok"
    async with AsyncSpace(url, "space_k000000000000000_wrong") as bad:
        with pytest.raises(Unauthorized):
            await bad.templates()


@pytest.mark.asyncio
async def test_async_vault_tenants_keys_and_cluster(server: tuple[str, str]) -> None:
    url, key = server
    async with AsyncSpace(url, key) as space:
        health = await space.health()
        assert isinstance(health, Health) and health.status == "ok"
        assert "space_api_requests_total" in await space.metrics()
        assert "/v1/secrets" in (await space.openapi())["paths"]

        # the vault
        name = f"SDK_ASYNC_{secrets.token_hex(4).upper()}"
        made = await space.set_secret(name, "v1", ["api.example.com"])
        assert made.hosts == ["api.example.com"]
        assert name in [s.name for s in await space.secrets()]
        await space.delete_secret(name)
        assert name not in [s.name for s in await space.secrets()]
        with pytest.raises(NotFound):
            await space.delete_secret(name)

        # tenants and keys
        tenant = f"sdk-{secrets.token_hex(5)}"
        created = await space.create_tenant(tenant, max_sandboxes=0, max_suspended=NEVER)
        assert created.tenant.quotas.max_sandboxes == 0
        assert created.tenant.quotas.max_suspended_ms is None
        assert tenant in [t.name for t in await space.tenants()]
        updated = await space.update_tenant(tenant, max_vcpus=2)
        assert (updated.quotas.max_sandboxes, updated.quotas.max_vcpus) == (0, 2)
        extra = await space.create_key(tenant, label="async")
        assert {k.id for k in await space.keys(tenant)} == {created.key.id, extra.id}
        async with AsyncSpace(url, extra.key) as as_tenant:
            assert await as_tenant.secrets() == []
            with pytest.raises(QuotaExceeded):
                await AsyncSandbox.create(template="minimal", client=as_tenant)
            with pytest.raises(Forbidden):
                await as_tenant.nodes()
            await space.revoke_key(extra)
            with pytest.raises(Unauthorized):
                await as_tenant.secrets()
        assert [k.revoked for k in await space.keys(tenant) if k.id == extra.id] == [True]

        # master key and cluster routes
        mk = await space.master_key(tenant)
        assert mk.provider == "deployment" and mk.id
        assert await space.set_master_key(tenant) == mk
        for call in (
            space.nodes(),
            space.drain_node("node-1"),
            space.remove_node("node-1"),
            space.create_join_token(),
        ):
            with pytest.raises(NotFound) as info:
                await call
            assert info.value.code == "not_a_cluster"
