"""E2B's secrets through the unmodified SDK: kept in space's vault, their values never
answered, and put into requests by the gateway where a sandbox's network rules say
(`Secret.fill` in `network.rules`), so the guest never holds them."""

import http.server
import os
import threading
import uuid

import httpx
import pytest
from e2b import Sandbox, Secret
from e2b.exceptions import SandboxException, SecretException, SecretNotFoundException

from conftest import TEMPLATE


def _unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_secrets_are_created_read_updated_listed_and_destroyed(other_key):
    name = _unique("OpenAI-Key")
    value = "sk-" + uuid.uuid4().hex
    info = Secret.create(name, value, metadata={"team": "ml"})
    try:
        assert info.secret_id.startswith("sec_")
        # E2B keeps names lower-cased.
        assert info.name == name.lower()
        assert info.version == 1
        assert info.metadata == {"team": "ml"}
        assert info.created_at == info.updated_at
        for key in (info.secret_id, name, name.lower()):
            assert Secret.get_info(key).secret_id == info.secret_id
        assert Secret.exists(name)

        # The value is write-only: no answer of the API carries it.
        api = os.environ["E2B_API_URL"]
        headers = {"X-API-KEY": os.environ["E2B_API_KEY"]}
        for path in ("/secrets", f"/secrets/{info.secret_id}"):
            r = httpx.get(api + path, headers=headers)
            assert r.status_code == 200, r.text
            assert value not in r.text

        # A name is unique in the tenant; a bad one is refused.
        with pytest.raises(SecretException):
            Secret.create(name.upper(), "other")
        with pytest.raises(SecretException):
            Secret.create("has{brace}", "v")
        with pytest.raises(SecretException):
            Secret.create("sec_reserved", "v")

        # An update is the next version; metadata stays unless given.
        second = Secret.create(_unique("second"), "v2")
        try:
            updated = Secret.update(info.secret_id, value + "-2")
            assert updated.version == 2
            assert updated.metadata == {"team": "ml"}
            updated = Secret.update(name, value + "-3", metadata={})
            assert (updated.version, updated.metadata) == (3, {})
            assert Secret.get_info(name).version == 3

            # Listing pages by nextToken, oldest first.
            paginator = Secret.list(limit=1)
            seen = []
            while paginator.has_next:
                seen.extend(s.secret_id for s in paginator.next_items())
            assert seen.index(info.secret_id) < seen.index(second.secret_id)
        finally:
            assert Secret.destroy(second.secret_id)

        # Another tenant sees nothing of it.
        assert not Secret.exists(info.secret_id, api_key=other_key)
        assert info.secret_id not in [
            s.secret_id for s in Secret.list(api_key=other_key).next_items()
        ]
        assert not Secret.destroy(info.secret_id, api_key=other_key)
    finally:
        assert Secret.destroy(info.secret_id)
    assert not Secret.destroy(info.secret_id)
    assert not Secret.exists(name)
    with pytest.raises(SecretNotFoundException):
        Secret.get_info(info.secret_id)
    with pytest.raises(SecretNotFoundException):
        Secret.update(name, "v")


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Records each request's Authorization and X-Team headers and echoes the first."""

    seen = []

    def do_GET(self):
        auth = self.headers.get_all("Authorization") or []
        _Recorder.seen.append((self.path, auth, self.headers.get("X-Team")))
        body = ("auth=" + ",".join(auth)).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def recorder():
    _Recorder.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()


def _get(sbx, url, extra=""):
    # Through the gateway's proxy even for 127.0.0.1, which NO_PROXY keeps in the guest.
    out = sbx.commands.run(
        f"curl -sS -m 20 --noproxy '' {extra} -w ' %{{http_code}}' {url} 2>&1 || true",
        timeout=60,
    )
    return out.stdout


def _last(path):
    hits = [s for s in _Recorder.seen if s[0] == path]
    assert hits, f"{path} never arrived: {_Recorder.seen}"
    return hits[-1]


def test_the_gateway_puts_a_secret_into_the_headers_its_rules_name(recorder):
    name = _unique("upstream-token")
    value = "tok-" + uuid.uuid4().hex
    Secret.create(name, value)
    base = f"http://127.0.0.1:{recorder}"
    rules = {
        "127.0.0.1": [
            {"transform": {"headers": {"Authorization": f"Bearer {Secret.fill(name)}"}}},
            {"transform": {"headers": {"X-Team": "ml"}}},
        ]
    }
    sbx = Sandbox.create(
        TEMPLATE,
        timeout=300,
        network={"allow_out": ["127.0.0.1"], "deny_out": ["0.0.0.0/0"], "rules": rules},
    )
    try:
        # The guest's own Authorization is replaced; the echo comes back without the value.
        out = _get(sbx, f"{base}/one", "-H 'Authorization: guest'")
        assert out.endswith(" 200"), out
        assert value not in out
        assert _last("/one")[1:] == ([f"Bearer {value}"], "ml")
        env = sbx.commands.run("env; cat /proc/1/environ | tr '\\0' '\\n'", user="root")
        assert value not in env.stdout

        # A new version is what the next request gets.
        Secret.update(name, value + "-v2")
        _get(sbx, f"{base}/two")
        assert _last("/two")[1] == [f"Bearer {value}-v2"]

        # Rules are replaced with the rest of the network options.
        sbx.update_network({"allow_out": ["127.0.0.1"], "deny_out": ["0.0.0.0/0"]})
        _get(sbx, f"{base}/three")
        assert _last("/three")[1:] == ([], None)
        sbx.update_network(
            {"allow_out": ["127.0.0.1"], "deny_out": ["0.0.0.0/0"], "rules": rules}
        )
        _get(sbx, f"{base}/four")
        assert _last("/four")[1] == [f"Bearer {value}-v2"]

        # A destroyed secret is never sent blank: the request is refused.
        assert Secret.destroy(name)
        out = _get(sbx, f"{base}/five")
        assert out.endswith(" 502"), out
        assert not [s for s in _Recorder.seen if s[0] == "/five"]

        # A rule naming a secret that does not exist is refused, and changes nothing.
        with pytest.raises(SandboxException) as e:
            sbx.update_network({"rules": rules})
        assert "does not exist" in str(e.value)
    finally:
        sbx.kill()
        Secret.destroy(name)
    with pytest.raises(Exception) as e:
        Sandbox.create(TEMPLATE, network={"rules": rules})
    assert "does not exist" in str(e.value)
