"""E2B's template builder, unmodified, onto space's Dockerfile builds (docs/e2b.md)."""

import os

import pytest
from e2b import Sandbox, Template, wait_for_port
from e2b.exceptions import BuildException


def _template(ctx, marker):
    return (
        Template(file_context_path=str(ctx))
        .from_base_image()
        .copy("app.txt", "/home/user/app.txt")
        .copy("web", "/srv/web/", user="user", mode=0o755)
        .run_cmd(f"echo $((6*7)) {marker} > /home/user/answer")
        .run_cmd("id -un > /home/user/builder", user="root")
        .set_envs({"GREETING": "hello $USER", "PLAIN": "a \\ b"})
        .set_workdir("/home/user")
        .set_start_cmd("cd /srv/web && python3 -m http.server 8000", wait_for_port(8000))
    )


def test_a_template_built_by_the_sdk_starts_its_sandboxes(tmp_path, other_key):
    (tmp_path / "app.txt").write_text("from the context")
    (tmp_path / "web").mkdir()
    (tmp_path / "web" / "index.html").write_text("served by the start command")
    name = f"sdk-built-{os.getpid()}"
    marker = os.urandom(4).hex()
    logs = []
    info = Template.build(_template(tmp_path, marker), name, on_build_logs=logs.append)
    assert info.template_id == name and info.build_id.startswith("bld-")
    messages = [entry.message for entry in logs]
    assert any("ready" in m for m in messages), messages
    assert Template.exists(name)

    sbx = Sandbox.create(name, timeout=300)
    try:
        assert sbx.files.read("/home/user/app.txt") == "from the context"
        assert sbx.files.read("/srv/web/index.html") == "served by the start command"
        assert sbx.files.read("/home/user/answer") == f"42 {marker}\n"
        assert sbx.files.read("/home/user/builder") == "root\n"
        out = sbx.commands.run("echo \"$GREETING|$PLAIN\"; pwd")
        assert out.stdout == "hello $USER|a \\ b\n/home/user\n"
        # The start command was serving when the snapshot was taken.
        page = sbx.commands.run("curl -s localhost:8000/index.html")
        assert page.stdout == "served by the start command"
    finally:
        sbx.kill()

    # The same steps again come from the step cache; the files were uploaded once.
    logs2 = []
    Template.build(_template(tmp_path, marker), name, on_build_logs=logs2.append)
    messages2 = [entry.message for entry in logs2]
    assert any("already cached" in m for m in messages2), messages2
    assert any("from the cache" in m for m in messages2), messages2

    # skip_cache: every step runs again.
    logs3 = []
    Template.build(_template(tmp_path, marker), name, skip_cache=True, on_build_logs=logs3.append)
    assert any(", 0 from the cache" in entry.message for entry in logs3), logs3

    # Another tenant cannot build versions of the name (the suite's key is an admin's, whose
    # builds are public: docs/images.md).
    with pytest.raises(Exception) as e:
        Template.build(_template(tmp_path, marker), name, api_key=other_key)
    assert "only an admin builds its versions" in str(e.value) or "taken" in str(e.value)

    assert Sandbox.delete_snapshot(name) is True
    assert not Template.exists(name)


def test_a_failing_step_fails_the_build_with_its_output():
    name = f"sdk-fails-{os.getpid()}"
    template = Template().from_template("base").run_cmd("echo about-to-fail; exit 3")
    with pytest.raises(BuildException) as e:
        Template.build(template, name)
    assert "code 3" in str(e.value), str(e.value)
    assert not Template.exists(name)


def test_a_missing_base_is_named_in_the_error():
    bad = Template().from_template("no-such-template-at-all").run_cmd("true")
    with pytest.raises(Exception) as e:
        Template.build(bad, f"sdk-bad-{os.getpid()}")
    assert "no-such-template-at-all" in str(e.value)
