"""The E2B SDK, unmodified, against a live space server.

The driver (crates/space/tests/e2b.rs) starts `space up` and sets E2B_API_URL,
E2B_SANDBOX_URL and E2B_API_KEY for the SDK, plus SPACE_OTHER_KEY (a key of another tenant)
and SPACE_TEMPLATE (the template sandboxes are made from).
"""

import os

import pytest
from e2b import Sandbox

TEMPLATE = os.environ.get("SPACE_TEMPLATE", "base")


@pytest.fixture
def sandbox():
    sbx = Sandbox.create(TEMPLATE, timeout=600, metadata={"suite": "e2b-sync"})
    try:
        yield sbx
    finally:
        sbx.kill()


@pytest.fixture
def other_key():
    return os.environ["SPACE_OTHER_KEY"]
