"""The typed models match the OpenAPI document, and the SDK wraps every operation of it that
is not left out on purpose (no server needed)."""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
from pathlib import Path
from typing import Any

import pytest

from space_sdk import aio, client, models

DOCUMENT = Path(__file__).resolve().parents[3] / "crates" / "space-control" / "openapi.json"


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    if not DOCUMENT.is_file():
        pytest.fail(f"{DOCUMENT} is missing: these tests run in the repository")
    value: dict[str, Any] = json.loads(DOCUMENT.read_text(encoding="utf-8"))
    return value


def resolve(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """Follows ``$ref`` and merges ``allOf`` into one object schema."""
    while "$ref" in schema:
        ref = schema["$ref"]
        assert ref.startswith("#/"), ref
        node: Any = doc
        for part in ref[2:].split("/"):
            node = node[part]
        schema = node
    if "allOf" in schema:
        merged: dict[str, Any] = {"type": "object", "properties": {}, "required": []}
        for part in schema["allOf"]:
            part = resolve(doc, part)
            merged["properties"].update(part.get("properties", {}))
            merged["required"] += part.get("required", [])
        return merged
    return schema


def schema_of(doc: dict[str, Any], name: str) -> dict[str, Any]:
    """``Name`` (under components/schemas) or ``Name.property`` (an object defined inline)."""
    base, _, prop = name.partition(".")
    schema = resolve(doc, doc["components"]["schemas"][base])
    if prop:
        schema = resolve(doc, schema["properties"][prop])
    return schema


def record_classes() -> list[type]:
    """The models that stand for an object of the API."""
    return [
        getattr(models, name)
        for name in models.__all__
        if getattr(getattr(models, name), "SCHEMA", None) is not None
    ]


def test_every_model_names_its_schema() -> None:
    for name in models.__all__:
        cls: Any = getattr(models, name)
        assert isinstance(cls, type) and dataclasses.is_dataclass(cls), cls
        assert hasattr(cls, "SCHEMA"), f"{cls.__name__} names no SCHEMA"
        if cls.SCHEMA is None:
            # Only what the SDK adds up itself is no object of the API.
            assert cls is models.ExecResult, cls


@pytest.mark.parametrize("cls", record_classes(), ids=lambda c: c.__name__)
def test_model_fields_are_the_schema_properties(doc: dict[str, Any], cls: type) -> None:
    schema = schema_of(doc, cls.SCHEMA)  # type: ignore[attr-defined]
    props = set(schema.get("properties", {}))
    required = set(schema.get("required", []))
    fields = {f.name: f for f in dataclasses.fields(cls)}
    mandatory = {
        n
        for n, f in fields.items()
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    assert set(fields) == props, (
        f"{cls.__name__} vs {cls.SCHEMA}: "  # type: ignore[attr-defined]
        f"not in the schema {sorted(set(fields) - props)}, "
        f"not in the model {sorted(props - set(fields))}"
    )
    assert mandatory == required, (
        f"{cls.__name__} vs {cls.SCHEMA}: "  # type: ignore[attr-defined]
        f"required in the schema but with a default {sorted(required - mandatory)}, "
        f"optional in the schema but without one {sorted(mandatory - required)}"
    )


@pytest.mark.parametrize("cls", record_classes(), ids=lambda c: c.__name__)
def test_every_field_is_read_from_the_answer(cls: type) -> None:
    # A field the generator added to the model and ``from_json`` does not read fails every
    # answer at run time; the reader names each field's key.
    reader = getattr(cls, "from_json", None)
    if reader is None:
        return
    source = inspect.getsource(reader)
    # A reader that hands the work to a helper of the module (``_key_fields``) reads there.
    for helper in set(re.findall(r"\b(_\w+_fields)\(", source)):
        if callable(getattr(models, helper, None)):
            source += inspect.getsource(getattr(models, helper))
    missing = [
        f.name
        for f in dataclasses.fields(cls)
        if f'"{f.name}"' not in source and f"{f.name}=" not in source
    ]
    assert not missing, f"{cls.__name__}.from_json does not read {missing}"


# The list answers the SDK unwraps: schema -> (its one property, the model of the items).
LISTS: dict[str, tuple[str, type]] = {
    "TemplateList": ("templates", models.Template),
    "BuildList": ("builds", models.Build),
    "SandboxList": ("sandboxes", models.SandboxInfo),
    "SnapshotList": ("snapshots", models.Snapshot),
    "MetricList": ("samples", models.MetricSample),
    "VolumeList": ("volumes", models.VolumeInfo),
    "DirListing": ("entries", models.DirEntry),
    "AuditList": ("events", models.AuditEvent),
    "TenantList": ("tenants", models.Tenant),
    "KeyList": ("keys", models.Key),
    "SecretList": ("secrets", models.Secret),
    "PortList": ("ports", models.Port),
}


@pytest.mark.parametrize("name", sorted(LISTS))
def test_list_answers_hold_the_modelled_items(doc: dict[str, Any], name: str) -> None:
    key, cls = LISTS[name]
    schema = schema_of(doc, name)
    assert set(schema["properties"]) == {key}
    assert schema["required"] == [key]
    items = schema["properties"][key]["items"]
    assert items == {"$ref": f"#/components/schemas/{cls.SCHEMA}"}  # type: ignore[attr-defined]


def test_nested_models_point_at_their_schemas(doc: dict[str, Any]) -> None:
    # A model's field holding another model refers to that model's schema.
    nested = [
        ("Sandbox", "timeouts", models.Timeouts),
        ("Sandbox", "egress", models.EgressPolicy),
        ("Sandbox", "forked_from", models.ForkedFrom),
        ("Sandbox", "secrets", models.SecretBinding),
        ("Sandbox", "volumes", models.VolumeMount),
        ("Tenant", "quotas", models.Quotas),
        ("TenantCreated", "tenant", models.Tenant),
        ("TenantCreated", "key", models.KeyCreated),
        ("DirEntry", "stat", models.FileStat),
        ("Build", "template", models.Template),
        ("NodeList", "nodes", models.Node),
    ]
    for parent, prop, cls in nested:
        text = json.dumps(doc["components"]["schemas"][parent]["properties"][prop])
        assert f'"#/components/schemas/{cls.SCHEMA}"' in text, (parent, prop)  # type: ignore[attr-defined]


# Every operation of the document, and what wraps it (a method of the synchronous classes;
# the asynchronous ones have the same, checked in test_generated.py), or why nothing does.
WRAPPED: dict[str, str] = {
    "health": "Space.health",
    "openapi": "Space.openapi",
    "metrics": "Space.metrics",
    "template.list": "Space.templates",
    "template.build": "Space.build_template",
    "template.upload": "Space.upload",
    "template.builds": "Space.builds",
    "template.build_get": "Space.build",
    "template.build_log": "Space.build_log",
    "template.save": "Sandbox.save_as_template",
    "template.delete": "Space.delete_template",
    "sandbox.create": "Sandbox.create",
    "sandbox.list": "Sandbox.list",
    "sandbox.get": "Sandbox.info",
    "sandbox.kill": "Sandbox.kill",
    "sandbox.pause": "Sandbox.pause",
    "sandbox.resume": "Sandbox.resume",
    "sandbox.suspend": "Sandbox.suspend",
    "sandbox.restore": "Sandbox.restore",
    "sandbox.fork": "Sandbox.fork",
    "sandbox.set_timeouts": "Sandbox.set_timeouts",
    "sandbox.logs": "Sandbox.logs",
    "sandbox.metrics": "Sandbox.metrics",
    "volume.list": "Space.volumes",
    "volume.create": "Space.create_volume",
    "volume.get": "Space.volume",
    "volume.delete": "Space.delete_volume",
    "volume_files.download": "Volume.read",
    "volume_files.upload": "Volume.write",
    "volume_files.remove": "Volume.remove",
    "volume_files.list": "Volume.list",
    "volume_files.stat": "Volume.stat",
    "volume_files.mkdir": "Volume.mkdir",
    "volume_files.rename": "Volume.rename",
    "sandbox.exec": "Sandbox.exec",
    "files.download": "Files.read",
    "files.upload": "Files.write",
    "files.remove": "Files.remove",
    "files.list": "Files.list",
    "files.stat": "Files.stat",
    "files.mkdir": "Files.mkdir",
    "files.rename": "Files.rename",
    "files.watch": "Files.watch",
    "snapshot.list": "Sandbox.snapshots",
    "snapshot.create": "Sandbox.snapshot",
    "snapshot.rollback": "Sandbox.rollback",
    "audit.list": "Space.audit",
    "tenant.list": "Space.tenants",
    "tenant.create": "Space.create_tenant",
    "tenant.update": "Space.update_tenant",
    "tenant.master_key.get": "Space.master_key",
    "tenant.master_key.set": "Space.set_master_key",
    "key.list": "Space.keys",
    "key.create": "Space.create_key",
    "key.revoke": "Space.revoke_key",
    "secret.list": "Space.secrets",
    "secret.set": "Space.set_secret",
    "secret.delete": "Space.delete_secret",
    "egress.get": "Sandbox.egress",
    "egress.update": "Sandbox.set_egress",
    "port.expose": "Sandbox.expose",
    "browser.start": "Sandbox.browser",
    "browser.fill": "Sandbox.fill_credential",
    "port.list": "Sandbox.ports",
    "port.unexpose": "Sandbox.unexpose",
    "port.proxy_get": "Sandbox.proxy",
    "port.proxy_post": "Sandbox.proxy",
    "port.proxy_put": "Sandbox.proxy",
    "port.proxy_patch": "Sandbox.proxy",
    "port.proxy_delete": "Sandbox.proxy",
    "node.token": "Space.create_join_token",
    "node.list": "Space.nodes",
    "node.drain": "Space.drain_node",
    "node.remove": "Space.remove_node",
}

NOT_WRAPPED: dict[str, str] = {
    "sandbox.exec_ws": "a WebSocket; exec over NDJSON (Sandbox.exec) does the same but stdin",
    "browser.cdp": "a WebSocket for CDP clients (Playwright, Puppeteer): BrowserSession.cdp_url",
    "browser.live": "a page for people: BrowserSession.live_url",
    "tls.ca": "a PEM file for browsers and TLS clients to trust, not an SDK call",
    "console.page": "the web console, for people in a browser (docs/console.md)",
    "console.file": "the web console's scripts and styles, for the browser",
    "sandbox.pty": "a WebSocket terminal",
    "node.join": "called by nodes, with a join token",
    "node.rejoin": "called by nodes, with their secret",
    "node.heartbeat": "called by nodes, with their secret",
    "node.claim": "called by nodes, with their secret",
    "node.audit": "called by nodes, with their secret",
    "ingress.get": "a public URL for any HTTP client (PortExposed.url)",
    "ingress.post": "a public URL for any HTTP client (PortExposed.url)",
    "ingress.put": "a public URL for any HTTP client (PortExposed.url)",
    "ingress.patch": "a public URL for any HTTP client (PortExposed.url)",
    "ingress.delete": "a public URL for any HTTP client (PortExposed.url)",
    "mcp.post": "the MCP server, for MCP clients (docs/mcp.md)",
    "mcp.get": "the MCP server, for MCP clients (docs/mcp.md)",
    "mcp.delete": "the MCP server, for MCP clients (docs/mcp.md)",
}


def operations(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out = {}
    for item in doc["paths"].values():
        for method, op in item.items():
            if method in ("get", "put", "post", "delete", "patch"):
                out[op["operationId"]] = op
    return out


def test_every_operation_is_wrapped_or_left_out_on_purpose(doc: dict[str, Any]) -> None:
    ids = set(operations(doc))
    assert not set(WRAPPED) & set(NOT_WRAPPED)
    assert ids == set(WRAPPED) | set(NOT_WRAPPED), (
        f"not wrapped: {sorted(ids - set(WRAPPED) - set(NOT_WRAPPED))}, "
        f"gone from the document: {sorted((set(WRAPPED) | set(NOT_WRAPPED)) - ids)}"
    )
    for op, where in WRAPPED.items():
        cls_name, method = where.split(".")
        assert callable(getattr(getattr(client, cls_name), method, None)), (op, where)
        assert callable(getattr(getattr(aio, "Async" + cls_name), method, None)), (op, where)


def test_answers_of_wrapped_operations_are_modelled(doc: dict[str, Any]) -> None:
    modelled = {c.SCHEMA for c in record_classes()} | set(LISTS)  # type: ignore[attr-defined]
    missing = []
    for op_id, op in operations(doc).items():
        if op_id not in WRAPPED:
            continue
        for status, resp in op["responses"].items():
            if not status.startswith("2"):
                continue
            for content in resp.get("content", {}).values():
                ref = content.get("schema", {}).get("$ref")
                if ref is None:
                    continue  # text, bytes or the app's own answer
                name = ref.rsplit("/", 1)[1]
                if name not in modelled and name != "ExecEvent":
                    missing.append(f"{op_id}: {name}")
    assert not missing, missing
