#!/usr/bin/env python3
"""Writes the fields of the records in ``space_sdk/models.py`` from the OpenAPI document
(``crates/space-control/openapi.json``, which the server generates from its code).

Each record class names its schema in ``SCHEMA``; between the markers

    # <generated fields: scripts/gen_models.py>
    # </generated fields>

of its body, this script writes one field a property of that schema (required ones first, as
a dataclass needs), typed from the schema: a property that is not required gets its default
(the schema's ``default``, an empty list or mapping, or None). JSON objects have no order, so
fields keep the order they have in the file (the order of the constructor's arguments), and
new ones follow by name.
Everything else of the file (docstrings, ``from_json``, helpers) is written by hand.

    python3 sdk/python/scripts/gen_models.py           # rewrite models.py
    python3 sdk/python/scripts/gen_models.py --check   # exit 1 when models.py is not current

``tests/test_generated.py`` runs the check.
"""

from __future__ import annotations

import ast
import json
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MODELS = HERE.parent / "space_sdk" / "models.py"
DOCUMENT = HERE.parents[2] / "crates" / "space-control" / "openapi.json"

BEGIN = "# <generated fields: scripts/gen_models.py>"
END = "# </generated fields>"
INDENT = "    "
WIDTH = 100


def resolve(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        node: Any = doc
        for part in schema["$ref"][2:].split("/"):
            node = node[part]
        schema = node
    return schema


def schema_of(doc: dict[str, Any], name: str) -> dict[str, Any]:
    base, _, prop = name.partition(".")
    schema = resolve(doc, doc["components"]["schemas"][base])
    if "allOf" in schema:
        merged: dict[str, Any] = {"type": "object", "properties": {}, "required": []}
        for part in schema["allOf"]:
            part = resolve(doc, part)
            merged["properties"].update(part.get("properties", {}))
            merged["required"] += part.get("required", [])
        schema = merged
    if prop:
        schema = resolve(doc, schema["properties"][prop])
    return schema


class Records:
    """The record classes of models.py: schema name -> class name, and their bases."""

    def __init__(self, tree: ast.Module) -> None:
        self.by_schema: dict[str, str] = {}
        self.base: dict[str, str] = {}
        for node in tree.body:
            if not isinstance(node, ast.ClassDef):
                continue
            for stmt in node.body:
                if (
                    isinstance(stmt, ast.AnnAssign)
                    and isinstance(stmt.target, ast.Name)
                    and stmt.target.id == "SCHEMA"
                    and isinstance(stmt.value, ast.Constant)
                    and isinstance(stmt.value.value, str)
                ):
                    self.by_schema[stmt.value.value] = node.name
            for b in node.bases:
                if isinstance(b, ast.Name):
                    self.base[node.name] = b.id
        self.schema_of_class = {c: s for s, c in self.by_schema.items()}


def nullable(schema: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """The schema without its ``null`` alternative, and whether it had one."""
    t = schema.get("type")
    if isinstance(t, list) and "null" in t:
        rest = [x for x in t if x != "null"]
        out = dict(schema)
        out["type"] = rest[0] if len(rest) == 1 else rest
        return out, True
    for key in ("anyOf", "oneOf"):
        alts = schema.get(key)
        if isinstance(alts, list) and {"type": "null"} in alts:
            rest = [a for a in alts if a != {"type": "null"}]
            out = {k: v for k, v in schema.items() if k != key}
            if len(rest) == 1:
                out.update(rest[0])
            else:
                out[key] = rest
            return out, True
    return schema, False


def py_type(
    doc: dict[str, Any], records: Records, schema: dict[str, Any], where: str
) -> tuple[str, bool]:
    """The Python type of ``schema`` (at ``where``, ``Schema.property``), and whether null
    is allowed."""
    schema, null = nullable(schema)
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        if name in records.by_schema:
            return records.by_schema[name], null
        inner, inner_null = py_type(doc, records, resolve(doc, schema), name)
        return inner, null or inner_null
    if where in records.by_schema:
        return records.by_schema[where], null
    t = schema.get("type")
    if isinstance(t, list):
        return "Any", null
    if t == "string":
        return "str", null
    if t == "integer":
        return "int", null
    if t == "number":
        return "float", null
    if t == "boolean":
        return "bool", null
    if t == "array":
        item, item_null = py_type(doc, records, schema.get("items", {}), where + "[]")
        return f"list[{item}{' | None' if item_null else ''}]", null
    if t == "object" or "properties" in schema or "additionalProperties" in schema:
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict) and not schema.get("properties"):
            value, value_null = py_type(doc, records, extra, where + "{}")
            return f"dict[str, {value}{' | None' if value_null else ''}]", null
        return "dict[str, Any]", null
    if "enum" in schema and all(isinstance(v, str) for v in schema["enum"]):
        return "str", null
    return "Any", null


def comment(text: str) -> list[str]:
    text = " ".join(text.split())
    return [
        INDENT + "#: " + line
        for line in textwrap.wrap(text, WIDTH - len(INDENT) - 3, break_on_hyphens=False)
    ]


def fields(doc: dict[str, Any], records: Records, cls: str, before: list[str]) -> list[str]:
    name = records.schema_of_class[cls]
    schema = schema_of(doc, name)
    props: dict[str, Any] = schema.get("properties", {})
    required = set(schema.get("required", []))
    inherited: set[str] = set()
    base = records.base.get(cls)
    if base in records.schema_of_class:
        inherited = set(schema_of(doc, records.schema_of_class[base]).get("properties", {}))
    mandatory: list[list[str]] = []
    optional: list[list[str]] = []
    order = sorted(props, key=lambda p: (before.index(p) if p in before else len(before), p))
    for prop in order:
        sub = props[prop]
        if prop in inherited:
            continue
        typ, null = py_type(doc, records, sub, f"{name}.{prop}")
        described = resolve(doc, sub) if "$ref" in sub else sub
        lines = comment(sub.get("description") or described.get("description") or "")
        if prop in required:
            lines.append(f"{INDENT}{prop}: {typ}{' | None' if null else ''}")
            mandatory.append(lines)
            continue
        default = sub.get("default", described.get("default"))
        if typ.startswith("list["):
            value = "field(default_factory=list)"
        elif typ.startswith("dict["):
            value = "field(default_factory=dict)"
        elif default is not None and isinstance(default, (str, int, float, bool)):
            value = json.dumps(default) if isinstance(default, str) else repr(default)
        else:
            value, null = "None", True
        lines.append(f"{INDENT}{prop}: {typ}{' | None' if null else ''} = {value}")
        optional.append(lines)
    return [line for group in mandatory + optional for line in group]


def generate(text: str, doc: dict[str, Any]) -> str:
    records = Records(ast.parse(text))
    out: list[str] = []
    lines = text.splitlines()
    cls: str | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        m = re.match(r"class (\w+)", line)
        if m:
            cls = m.group(1)
        if line.strip() == BEGIN:
            if cls not in records.schema_of_class:
                raise SystemExit(f"models.py: generated fields in {cls}, which names no SCHEMA")
            out.append(line)
            before: list[str] = []
            while lines[i].strip() != END:
                i += 1
                if i == len(lines):
                    raise SystemExit(f"models.py: {cls}: no {END!r}")
                m = re.match(r"    (\w+):", lines[i])
                if m:
                    before.append(m.group(1))
            out.extend(fields(doc, records, cls, before))
            out.append(lines[i])
        else:
            out.append(line)
        i += 1
    return "\n".join(out) + "\n"


def main() -> int:
    doc = json.loads(DOCUMENT.read_text(encoding="utf-8"))
    text = MODELS.read_text(encoding="utf-8")
    new = generate(text, doc)
    if "--check" in sys.argv[1:]:
        if new != text:
            print(
                f"{MODELS} is not what scripts/gen_models.py makes from {DOCUMENT}: run\n"
                "  python3 sdk/python/scripts/gen_models.py",
                file=sys.stderr,
            )
            return 1
        return 0
    if new != text:
        MODELS.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
