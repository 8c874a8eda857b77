"""The E2B SDK's get_metrics against samples of a real guest."""

import datetime
import time

import pytest
from e2b import Sandbox, SandboxException


def test_metrics_rise_while_the_sandbox_spins_and_holds_memory(sandbox, other_key):
    created = datetime.datetime.now(datetime.timezone.utc)
    # Every vCPU busy, and 96 MiB in a tmpfs (memory the guest cannot reclaim).
    sandbox.commands.run(
        "dd if=/dev/zero of=/dev/shm/hold bs=1M count=96 2>/dev/null; "
        "for i in $(seq $(nproc)); do (while :; do :; done) >/dev/null 2>&1 & done",
        timeout=120,
    )
    deadline = time.monotonic() + 120
    busy = None
    while time.monotonic() < deadline:
        samples = sandbox.get_metrics()
        busy = next((m for m in samples if m.cpu_used_pct > 80), None)
        if busy is not None:
            break
        time.sleep(2)
    assert busy is not None, f"no busy sample in two minutes: {samples}"
    assert busy.cpu_count >= 1
    assert 96 << 20 < busy.mem_used <= busy.mem_total
    assert busy.mem_cache >= 90 << 20
    assert 0 < busy.disk_used <= busy.disk_total
    assert busy.timestamp >= created - datetime.timedelta(seconds=1)

    # Oldest first, and the range bounds them (E2B's times are whole seconds).
    all_samples = Sandbox.get_metrics(sandbox.sandbox_id)
    stamps = [m.timestamp for m in all_samples]
    assert stamps == sorted(stamps) and len(stamps) >= 1
    assert sandbox.get_metrics(end=created - datetime.timedelta(hours=1)) == []
    last = stamps[-1]
    recent = sandbox.get_metrics(start=last - datetime.timedelta(seconds=1))
    assert recent and all(m.timestamp >= last - datetime.timedelta(seconds=2) for m in recent)

    # Another tenant's key: the sandbox does not exist for it.
    with pytest.raises(SandboxException):
        Sandbox.get_metrics(sandbox.sandbox_id, api_key=other_key)
