"""Templates through the SDK: a Dockerfile build with its log, a tenant's private template,
a failing build, a sandbox saved as a template."""

from __future__ import annotations

import secrets
from pathlib import Path

import httpx
import pytest
from conftest import kill_quietly, new_tenant

from space_sdk import EgressPolicy, NotFound, Sandbox, Space, SpaceError


def test_dockerfile_build_private_template_and_save(
    space: Space, admin_http: httpx.Client, server: tuple[str, str], tmp_path: Path
) -> None:
    url, _ = server
    tenant_name, key = new_tenant(admin_http)
    (tmp_path / "hello.txt").write_text("hello from the sdk\n")
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(
        "FROM minimal\nENV GREETING=hi\nCOPY hello.txt /srv/hello.txt\nWORKDIR /srv\n"
        "RUN echo sdk-build-output && cp hello.txt copy.txt\n"
    )
    name = f"sdk-{secrets.token_hex(4)}"
    with Space(url, key) as tenant:
        logs: list[str] = []
        # The steps need no network: refusing all of it changes nothing.
        build = tenant.build_template(
            name, dockerfile=dockerfile, on_log=logs.append, egress=EgressPolicy(default="deny")
        )
        assert build.state == "succeeded"
        assert build.name == name and build.version == "1"
        assert build.tenant == tenant_name
        assert "sdk-build-output" in "".join(logs)
        log = tenant.build_log(build.id)
        assert "sdk-build-output" in log
        # Following the log of a build that ended gives all of it, then returns.
        followed: list[str] = []
        assert tenant.build_log(build.id, follow=True, on_log=followed.append) == log
        assert "".join(followed) == log
        assert tenant.build_log(build.id, start=len(log.encode())) == ""
        assert [b.id for b in tenant.builds()] == [build.id]
        mine = [t for t in tenant.templates() if t.name == name]
        assert len(mine) == 1 and mine[0].owner is not None and mine[0].workdir == "/srv"
        assert mine[0].env.get("GREETING") == "hi"

        # Another tenant does not see it, and cannot use it.
        _, other_key = new_tenant(admin_http)
        with Space(url, other_key) as other:
            assert name not in [t.name for t in other.templates()]
            with pytest.raises(NotFound):
                Sandbox.create(template=name, client=other)

        sb = Sandbox.create(template=name, client=tenant)
        try:
            r = sb.exec(["sh", "-c", "cat copy.txt; echo $GREETING"])
            assert r.stdout == b"hello from the sdk\nhi\n"
            sb.files.write("/srv/marker", b"kept")
            saved = sb.save_as_template(f"{name}-saved")
            assert saved.name == f"{name}-saved"
        finally:
            kill_quietly(sb)
        copy = Sandbox.create(template=f"{name}-saved", client=tenant)
        try:
            assert copy.files.read("/srv/marker") == b"kept"
        finally:
            kill_quietly(copy)

        # A failing step raises with its output.
        dockerfile.write_text("FROM minimal\nRUN echo broken-step; exit 4\n")
        with pytest.raises(SpaceError) as info:
            tenant.build_template(f"{name}-bad", dockerfile=dockerfile)
        assert info.value.code == "build_failed"
        assert "broken-step" in str(info.value) and "code 4" in str(info.value)
