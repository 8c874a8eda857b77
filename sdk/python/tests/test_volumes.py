"""Volumes and metrics through the client against a live server: a volume written through
its file API and mounted by a sandbox, which writes back; refusals; a sandbox's samples."""

from __future__ import annotations

import time

import pytest
from conftest import kill_quietly

from space_sdk import (
    Conflict,
    InvalidRequest,
    NotFound,
    QuotaExceeded,
    Sandbox,
    Space,
    Volume,
)


def test_a_volume_mounted_and_written_both_ways(space: Space, run_id: str) -> None:
    vol = space.create_volume(f"sdk-{run_id}", size_mib=64)
    assert isinstance(vol, Volume) and vol.info.size_bytes == 64 << 20
    assert vol.info.id.startswith("vol-")
    with pytest.raises(Conflict):
        space.create_volume(vol.name)
    with pytest.raises(InvalidRequest):
        space.create_volume("no spaces")
    assert vol.name in [v.name for v in space.volumes()]

    vol.write("/in/data.txt", "from the api\n", parents=True)
    assert vol.read_text("/in/data.txt") == "from the api\n"
    assert [e.name for e in vol.list("/in")] == ["data.txt"]
    assert vol.stat("/in/data.txt").size == 13
    vol.mkdir("/out/deep")
    vol.rename("/in/data.txt", "/in/moved.txt")
    with pytest.raises(NotFound):
        vol.stat("/in/data.txt")

    with pytest.raises(NotFound):
        Sandbox.create(template="minimal", volumes={"/x": "no-such-volume"}, client=space)
    sb = Sandbox.create(
        template="minimal", metadata={"suite": run_id}, volumes={"/data": vol}, client=space
    )
    try:
        assert [(m.name, m.path, m.read_only) for m in sb.info().volumes] == [(vol.name, "/data", False)]
        assert sb.exec("cat /data/in/moved.txt").stdout == b"from the api\n"
        sb.exec("echo from-the-sandbox > /data/out/deep/s.txt")
        assert vol.read("/out/deep/s.txt") == b"from-the-sandbox\n"
        with pytest.raises(Conflict):
            vol.delete()

        # Samples come every few seconds while it runs.
        deadline = time.monotonic() + 60
        samples = sb.metrics()
        while not samples and time.monotonic() < deadline:
            time.sleep(2)
            samples = sb.metrics()
        assert samples, "no sample within a minute"
        s = samples[-1]
        assert s.cpu_count >= 1 and 0 <= s.cpu_used_pct <= 100
        assert 0 < s.mem_used_bytes <= s.mem_total_bytes
        assert sb.metrics(start=s.timestamp_unix_ms + 1) == []
    finally:
        kill_quietly(sb)
    vol.remove("/out")
    assert [e.name for e in vol.list("/")] == ["in"]
    vol.delete()
    with pytest.raises(NotFound):
        space.volume(vol.name)


def test_the_volume_quota_bounds_the_sizes_together(space: Space, run_id: str) -> None:
    tenant = f"volq-{run_id}"
    made = space.create_tenant(tenant, max_volume_mib=100)
    assert made.tenant.quotas.max_volume_mib == 100
    theirs = Space(space.url, made.key.key)
    try:
        theirs.create_volume("a", size_mib=60)
        with pytest.raises(QuotaExceeded):
            theirs.create_volume("b", size_mib=60)
        assert space.update_tenant(tenant, max_volume_mib=200).quotas.max_volume_mib == 200
        theirs.create_volume("b", size_mib=60)
        assert sorted(v.name for v in theirs.volumes()) == ["a", "b"]
        # The admin's tenant has no volume of that name: names are the tenant's own.
        with pytest.raises(NotFound):
            space.volume("b")
    finally:
        for v in theirs.volumes():
            v.delete()
        theirs.close()
