"""The E2B SDK's volumes against space: the volume API, its content API (E2B_VOLUME_API_URL,
the volume's token) and volumes mounted by two sandboxes at once."""

import time

import pytest
from e2b import (
    NotFoundException,
    Sandbox,
    Volume,
    VolumeException,
)

from conftest import TEMPLATE


def test_a_volume_without_a_sandbox():
    name = f"compat-{time.time_ns()}"
    vol = Volume.create(name)
    try:
        assert vol.name == name and vol.volume_id.startswith("vol-") and vol.token
        assert name in [v.name for v in Volume.list()]
        info = Volume.get_info(vol.volume_id)
        assert (info.volume_id, info.name) == (vol.volume_id, name)

        with pytest.raises(NotFoundException):
            vol.write_file("/notes/a.txt", "no parent yet")
        d = vol.make_dir("/notes")
        assert d.type.value == "directory" and d.path == "/notes"
        with pytest.raises(VolumeException):
            vol.make_dir("/notes")
        assert vol.make_dir("/notes", force=True).name == "notes"
        assert vol.make_dir("/deep/er/est", force=True).path == "/deep/er/est"

        stat = vol.write_file("/notes/a.txt", "hello", mode=0o640)
        assert stat.type.value == "file" and stat.size == 5 and stat.mode & 0o777 == 0o640
        with pytest.raises(VolumeException):
            vol.write_file("/notes/a.txt", "again")
        vol.write_file("/notes/a.txt", "hello again", force=True)
        assert vol.read_file("/notes/a.txt") == "hello again"
        assert vol.read_file("/notes/a.txt", format="bytes") == b"hello again"
        big = bytes(range(256)) * 9000  # 2.2 MiB: more than one host request
        vol.write_file("/big.bin", big)
        assert vol.read_file("/big.bin", format="bytes") == big

        names = sorted(e.name for e in vol.list("/"))
        assert names == ["big.bin", "deep", "notes"]
        deep = sorted(e.path for e in vol.list("/", depth=3))
        assert "/deep/er/est" in deep and "/notes/a.txt" in deep
        assert vol.exists("/notes/a.txt") and not vol.exists("/nope")
        info = vol.get_info("/notes/a.txt")
        assert info.name == "a.txt" and info.mtime is not None
        changed = vol.update_metadata("/notes/a.txt", mode=0o600)
        assert changed.mode & 0o777 == 0o600

        vol.remove("/deep")
        assert not vol.exists("/deep/er")
        with pytest.raises(NotFoundException):
            vol.remove("/deep")

        # Another volume's token, or none, opens nothing here.
        other = Volume.create(name + "-other")
        try:
            with pytest.raises(Exception):
                Volume.connect(vol.volume_id).read_file("/notes/a.txt", token=other.token)
        finally:
            assert Volume.destroy(other.volume_id) is True
    finally:
        Volume.destroy(vol.volume_id)
    assert Volume.destroy(vol.volume_id) is False
    with pytest.raises(NotFoundException):
        Volume.get_info(vol.volume_id)


def test_two_sandboxes_share_a_volume(other_key):
    vol = Volume.create(f"shared-{time.time_ns()}")
    a = Sandbox.create(TEMPLATE, volume_mounts={"/mnt/data": vol})
    b = Sandbox.create(TEMPLATE, volume_mounts={"/data": vol.name})
    try:
        assert [m["path"] if isinstance(m, dict) else m.path for m in a.get_info().volume_mounts] == ["/mnt/data"]
        a.commands.run("echo from-a > /mnt/data/a.txt && mkdir -p /mnt/data/dir")
        assert b.commands.run("cat /data/a.txt").stdout == "from-a\n"
        b.commands.run("echo from-b > /data/dir/b.txt")
        assert a.files.read("/mnt/data/dir/b.txt") == "from-b\n"
        # What the sandboxes wrote, the content API reads; what it writes, they read.
        assert vol.read_file("/dir/b.txt") == "from-b\n"
        vol.write_file("/api.txt", "from-the-api")
        assert a.commands.run("cat /mnt/data/api.txt").stdout == "from-the-api"
        # A mounted volume is not deleted.
        with pytest.raises(Exception):
            Volume.destroy(vol.volume_id)
        # Another tenant sees no such volume, and cannot mount it by name.
        with pytest.raises(NotFoundException):
            Volume.get_info(vol.volume_id, api_key=other_key)
        with pytest.raises(Exception):
            Sandbox.create(TEMPLATE, volume_mounts={"/x": vol.name}, api_key=other_key)
    finally:
        a.kill()
        b.kill()
    assert Volume.destroy(vol.volume_id) is True
