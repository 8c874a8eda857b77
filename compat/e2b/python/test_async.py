"""The asynchronous E2B Python SDK: lifecycle and commands."""

import asyncio

import pytest
import pytest_asyncio
from e2b import AsyncSandbox, CommandExitException

from conftest import TEMPLATE


@pytest_asyncio.fixture
async def asandbox():
    sbx = await AsyncSandbox.create(TEMPLATE, timeout=600, metadata={"suite": "e2b-async"})
    try:
        yield sbx
    finally:
        await sbx.kill()


@pytest.mark.asyncio
async def test_async_commands(asandbox):
    out = await asandbox.commands.run("echo async-out; echo async-err >&2")
    assert (out.stdout, out.stderr) == ("async-out\n", "async-err\n")

    lines = []
    await asandbox.commands.run(
        "for i in 1 2; do echo l$i; sleep 0.1; done", on_stdout=lines.append
    )
    assert "".join(lines) == "l1\nl2\n"

    with pytest.raises(CommandExitException) as e:
        await asandbox.commands.run("exit 7")
    assert e.value.exit_code == 7

    h = await asandbox.commands.run("sleep 600", background=True)
    assert await asandbox.commands.kill(h.pid) is True
    with pytest.raises(CommandExitException):
        await h.wait()


@pytest.mark.asyncio
async def test_async_connect_and_info(asandbox):
    again = await AsyncSandbox.connect(asandbox.sandbox_id)
    info = await again.get_info()
    assert info.metadata == {"suite": "e2b-async"}
    results = await asyncio.gather(*(again.commands.run(f"echo {i}") for i in range(4)))
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(4)]


@pytest.mark.asyncio
async def test_async_files_and_watch(asandbox):
    from e2b import FilesystemEventType

    await asandbox.files.make_dir("/tmp/watched")
    seen = []
    handle = await asandbox.files.watch_dir(
        "/tmp/watched",
        on_event=seen.append,
        recursive=True,
        include_entry=True,
        allow_network_mounts=True,
    )
    await asandbox.files.write("/tmp/watched/new.txt", "x", metadata={"origin": "watch"})
    for _ in range(100):
        if any(e.name == "new.txt" and e.type == FilesystemEventType.CREATE for e in seen):
            break
        await asyncio.sleep(0.1)
    await handle.stop()
    assert any(e.name == "new.txt" and e.type == FilesystemEventType.CREATE for e in seen), seen
    # With include_entry the events carry the entry as it was when the event was read.
    entries = [e.entry for e in seen if e.name == "new.txt" and e.entry is not None]
    assert entries and entries[-1].path == "/tmp/watched/new.txt", seen
    assert (await asandbox.files.get_info("/tmp/watched/new.txt")).metadata == {"origin": "watch"}
    assert await asandbox.files.read("/tmp/watched/new.txt") == "x"
