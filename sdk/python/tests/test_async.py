"""The asyncio client: the same essentials as the synchronous tests, on one sandbox."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import time

import pytest

from space_sdk import AsyncSandbox, AsyncSpace, IllegalState, NotFound, Unauthorized


@pytest.mark.asyncio
async def test_async_lifecycle(server: tuple[str, str], run_id: str) -> None:
    url, key = server
    async with AsyncSpace(url, key) as space:
        sb = await AsyncSandbox.create(
            template="minimal", metadata={"suite": run_id, "client": "async"}, client=space
        )
        async with sb:
            assert sb.state == "running"
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
