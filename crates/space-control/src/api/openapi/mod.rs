//! The OpenAPI 3.1 document of the API, generated from the code: the routes of [`ROUTES`],
//! what each operation takes and answers (kept here, next to the routes, as [`Op`]s), and the
//! JSON Schemas (2020-12, which OpenAPI 3.1 uses) of the request and answer types, derived
//! with `schemars` where this crate has a type and written out in [`super::shapes`] where the
//! type belongs to another crate or the answer is built as JSON.
//!
//! `GET /v1/openapi.json` serves [`document`]; `crates/space-control/openapi.json` is its
//! checked-in copy (a test fails when they differ).

use std::sync::OnceLock;

use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, SchemaGenerator};
use serde_json::{json, Map, Value};

use super::shapes as sh;
use super::ROUTES;

mod operations;
use operations::operation;

/// The document as served: generated once.
pub fn served() -> &'static str {
    static TEXT: OnceLock<String> = OnceLock::new();
    TEXT.get_or_init(|| render(&document()))
}

/// The document as text: pretty JSON with a final newline (the checked-in file's form).
pub fn render(doc: &Value) -> String {
    let mut text = serde_json::to_string_pretty(doc).unwrap_or_default();
    text.push('\n');
    text
}

/// The path of a route as OpenAPI writes it: axum's wildcard `{*rest}` is `{rest}` (a
/// parameter that may be empty and may contain `/`).
pub fn doc_path(route: &str) -> String {
    route.replace("{*", "{")
}

/// The OpenAPI document of every route in [`ROUTES`].
pub fn document() -> Value {
    let mut g = SchemaSettings::draft2020_12()
        .with(|s| {
            s.definitions_path = "/components/schemas".into();
            s.meta_schema = None;
        })
        .into_generator();
    let mut paths = Map::new();
    let mut used_params: Vec<&'static str> = Vec::new();
    for r in ROUTES {
        let op = operation(r.operation, &mut g);
        for p in &op.params {
            if !used_params.contains(p) {
                used_params.push(p);
            }
        }
        let v = op.finish(r.operation);
        let item = paths
            .entry(doc_path(r.path))
            .or_insert_with(|| Value::Object(Map::new()));
        item[r.method.to_ascii_lowercase()] = v;
    }
    let mut parameters = Map::new();
    used_params.sort_unstable();
    for p in used_params {
        parameters.insert(p.to_owned(), parameter(p, &mut g));
    }
    let mut responses = Map::new();
    for (_, name, description) in ERRORS {
        responses.insert(
            (*name).to_owned(),
            json!({
                "description": description,
                "content": {"application/json": {"schema": s::<sh::Error>(&mut g)}},
            }),
        );
    }
    let schemas = g.take_definitions(true);
    let mut doc = json!({
        "openapi": "3.1.0",
        "info": {"title": "space", "version": "0.1.0", "description": "The public API of space: sandboxes (QEMU microVMs), exec, files, snapshots, templates, tenants, keys, audit, the credentials vault, egress policies and ingress. See docs/api.md.", "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"}},
        "servers": [{"url": "http://127.0.0.1:7070"}],
        "security": [{"bearerAuth": []}],
        "tags": [{"name": "server"}, {"name": "templates"}, {"name": "sandboxes"}, {"name": "exec"}, {"name": "files"}, {"name": "snapshots"}, {"name": "audit"}, {"name": "tenants"}, {"name": "secrets"}, {"name": "egress"}, {"name": "ingress"}, {"name": "browser", "description": "The sandbox's Chromium for automation clients, and the live view of its display."}, {"name": "cluster", "description": "Nodes of a cluster: join, heartbeats, drain and removal (docs/cluster.md)."}, {"name": "mcp", "description": "The MCP server (docs/mcp.md)."}],
        "paths": paths,
        "components": {
            "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer", "description": "An API key, `space_<key id>_<secret>`."}},
            "parameters": parameters,
            "responses": responses,
            "schemas": schemas,
        },
    });
    bound_integers(&mut doc);
    doc
}

/// Gives every integer schema with a Rust integer `format` (`uint32`, `int64`, ...) the
/// bounds of that type, so a client knows what fits: past them the server answers 400.
fn bound_integers(v: &mut Value) {
    match v {
        Value::Object(o) => {
            let bounds: Option<(i128, i128)> = match o.get("format").and_then(Value::as_str) {
                Some("uint8") => Some((0, u8::MAX.into())),
                Some("uint16") => Some((0, u16::MAX.into())),
                Some("uint32") => Some((0, u32::MAX.into())),
                Some("uint64" | "uint") => Some((0, u64::MAX.into())),
                Some("int8") => Some((i8::MIN.into(), i8::MAX.into())),
                Some("int16") => Some((i16::MIN.into(), i16::MAX.into())),
                Some("int32") => Some((i32::MIN.into(), i32::MAX.into())),
                Some("int64" | "int") => Some((i64::MIN.into(), i64::MAX.into())),
                _ => None,
            };
            let integer = match o.get("type") {
                Some(Value::String(t)) => t == "integer",
                Some(Value::Array(ts)) => ts.iter().any(|t| t == "integer"),
                _ => false,
            };
            if let (Some((min, max)), true) = (bounds, integer) {
                let number = |n: i128| -> Value {
                    u64::try_from(n).map_or_else(
                        |_| Value::from(i64::try_from(n).unwrap_or(i64::MIN)),
                        Value::from,
                    )
                };
                o.entry("minimum").or_insert_with(|| number(min));
                o.entry("maximum").or_insert_with(|| number(max));
            }
            for child in o.values_mut() {
                bound_integers(child);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(bound_integers),
        _ => {}
    }
}

/// The schema of `T` as used in place (a `$ref` for a named type).
fn s<T: JsonSchema>(g: &mut SchemaGenerator) -> Value {
    g.subschema_for::<T>().to_value()
}

/// The shared error responses: status, name under `components/responses`, description.
const ERRORS: &[(u16, &str, &str)] = &[
    (400, "BadRequest", "A malformed field, body or id (`invalid_request`, `invalid_json`, `invalid_id`)."),
    (409, "Conflict", "The sandbox is not in a state that allows this (`illegal_state`), or the thing exists or is in use (`conflict`)."),
    (403, "Forbidden", "An admin route called with a tenant key, or a guest permission error (`forbidden`)."),
    (502, "GuestError", "The sandbox's guest daemon failed the request (`guest_error`)."),
    (500, "Internal", "A failure of the machinery (`internal`)."),
    (404, "NotFound", "No such sandbox, snapshot, template, tenant, key or file in this tenant (`*_not_found`)."),
    (413, "PayloadTooLarge", "The body or upload is over the limit (`payload_too_large`)."),
    (429, "QuotaExceeded", "The tenant's sandbox, vCPU or memory quota would be passed (`quota_exceeded`)."),
    (401, "Unauthorized", "No key, or a wrong or revoked one (`unauthorized`)."),
    (503, "Unavailable", "The node has no room for another VM (`capacity`), its disk is under the space it keeps free (`disk_full`), the template is still being prepared (`template_not_ready`), or the server is stopping (`shutting_down`)."),
    (415, "UnsupportedMediaType", "A JSON route called without `Content-Type: application/json` (`unsupported_media_type`)."),
    (507, "SandboxDiskFull", "The sandbox's own disk is full (`no_space`); free room in it, or create it with a larger `disk_mib`."),
    (502, "BadGateway", "The object store failed, or what it holds is missing or corrupt (`archive_unavailable`)."),
];

/// One operation of the document, as its route answers it.
pub struct Op {
    v: Map<String, Value>,
    params: Vec<&'static str>,
}

impl Op {
    fn new(summary: &str, tag: &str) -> Op {
        let mut v = Map::new();
        v.insert("summary".into(), json!(summary));
        v.insert("tags".into(), json!([tag]));
        v.insert("responses".into(), json!({}));
        Op {
            v,
            params: Vec::new(),
        }
    }

    fn desc(mut self, text: &str) -> Op {
        self.v.insert("description".into(), json!(text));
        self
    }

    /// Needs no key.
    fn public(mut self) -> Op {
        self.v.insert("security".into(), json!([]));
        self
    }

    fn list(&mut self, key: &str) -> &mut Vec<Value> {
        let entry = self.v.entry(key).or_insert_with(|| json!([]));
        match entry {
            Value::Array(a) => a,
            _ => unreachable!("{key} is a list"),
        }
    }

    /// A parameter of `components/parameters`.
    fn param(mut self, name: &'static str) -> Op {
        self.params.push(name);
        self.list("parameters")
            .push(json!({"$ref": format!("#/components/parameters/{name}")}));
        self
    }

    /// The fields of `T` (a query struct) as query parameters.
    fn query<T: JsonSchema>(mut self, g: &mut SchemaGenerator) -> Op {
        let schema = T::json_schema(g).to_value();
        let required: Vec<&str> = schema["required"]
            .as_array()
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let Some(props) = schema["properties"].as_object() else {
            return self;
        };
        for (name, prop) in props {
            let mut prop = not_null(prop.clone());
            let description = prop.as_object_mut().and_then(|o| o.remove("description"));
            let mut p = json!({
                "name": name,
                "in": "query",
                "required": required.contains(&name.as_str()),
                "schema": prop,
            });
            if let Some(d) = description {
                p["description"] = d;
            }
            self.list("parameters").push(p);
        }
        self
    }

    fn param_inline(mut self, p: Value) -> Op {
        self.list("parameters").push(p);
        self
    }

    fn body(mut self, required: bool, content: Vec<(&str, Value)>) -> Op {
        let body = self.v.entry("requestBody").or_insert_with(|| json!({}));
        body["required"] = json!(required);
        body["content"] = content_map(content);
        self
    }

    fn response(&mut self, status: u16, v: Value) {
        self.v["responses"][status.to_string()] = v;
    }

    /// The success answer (content empty for none).
    fn ok(mut self, status: u16, description: &str, content: Vec<(&str, Value)>) -> Op {
        let mut v = json!({ "description": description });
        if !content.is_empty() {
            v["content"] = content_map(content);
        }
        self.response(status, v);
        self
    }

    /// Error answers with the shared descriptions.
    fn err(mut self, statuses: &[u16]) -> Op {
        for &status in statuses {
            let (_, name, _) = ERRORS
                .iter()
                .find(|(c, n, _)| *c == status && *n != "BadGateway")
                .unwrap_or_else(|| panic!("no shared error response {status}"));
            self.response(
                status,
                json!({"$ref": format!("#/components/responses/{name}")}),
            );
        }
        self
    }

    /// The refusals of the MCP transport itself, whose bodies are the transport's and not the
    /// API's error.
    fn mcp_transport_refusals(mut self) -> Op {
        self.response(
            400,
            json!({"description": "The MCP transport refused the request: a body that is not a JSON-RPC message, or a session header it does not know (the body is the transport's own, not the API's error)."}),
        );
        self.response(
            406,
            json!({"description": "The `Accept` header does not allow what the transport answers (`application/json` and `text/event-stream`)."}),
        );
        self
    }

    fn err_ref(mut self, status: u16, name: &str) -> Op {
        self.response(
            status,
            json!({"$ref": format!("#/components/responses/{name}")}),
        );
        self
    }

    /// An error answer with its own description.
    fn err_desc(mut self, status: u16, description: &str) -> Op {
        self.response(
            status,
            json!({
                "description": description,
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
            }),
        );
        self
    }

    fn ext(mut self, key: &str, v: Value) -> Op {
        self.v.insert(key.into(), v);
        self
    }

    fn finish(self, operation: &str) -> Value {
        let mut v = Map::new();
        v.insert("operationId".into(), json!(operation));
        v.extend(self.v);
        Value::Object(v)
    }
}

/// A query field's schema without the `null` an `Option` adds: a query string has no null,
/// only a parameter left out.
fn not_null(mut schema: Value) -> Value {
    if let Some(o) = schema.as_object_mut() {
        if o.get("default") == Some(&Value::Null) {
            o.remove("default");
        }
        if let Some(Value::Array(types)) = o.get_mut("type") {
            types.retain(|t| t != "null");
            if types.len() == 1 {
                let t = types[0].clone();
                o.insert("type".into(), t);
            }
        }
        if let Some(Value::Array(alts)) = o.get("anyOf") {
            let rest: Vec<Value> = alts
                .iter()
                .filter(|a| **a != json!({"type": "null"}))
                .cloned()
                .collect();
            if rest.len() == 1 {
                o.remove("anyOf");
                if let Some(inner) = rest[0].as_object() {
                    for (k, v) in inner {
                        o.insert(k.clone(), v.clone());
                    }
                }
            }
        }
    }
    schema
}

fn content_map(content: Vec<(&str, Value)>) -> Value {
    let mut m = Map::new();
    for (ct, schema) in content {
        m.insert(ct.to_owned(), json!({ "schema": schema }));
    }
    Value::Object(m)
}

/// A parameter of `components/parameters`.
fn parameter(name: &str, g: &mut SchemaGenerator) -> Value {
    match name {
        "SandboxId" => {
            json!({"name": "id", "in": "path", "required": true, "schema": s::<sh::SandboxId>(g), "description": "Sandbox id."})
        }
        "TemplateName" => {
            json!({"name": "name", "in": "path", "required": true, "schema": s::<sh::Name>(g), "description": "Template name."})
        }
        "TemplateVersion" => {
            json!({"name": "version", "in": "path", "required": true, "schema": s::<sh::TemplateVersion>(g), "description": "Template version."})
        }
        "TenantName" => {
            json!({"name": "name", "in": "path", "required": true, "schema": s::<sh::Name>(g), "description": "Tenant name."})
        }
        "KeyId" => {
            json!({"name": "key_id", "in": "path", "required": true, "schema": s::<sh::KeyId>(g), "description": "Key id."})
        }
        "FileTargetPath" => {
            json!({"name": "path", "in": "query", "required": true, "schema": {"type": "string", "pattern": "^(/[^/\\u0000]{0,255})*/[^/\\u0000]{1,255}$", "maxLength": 4096}, "description": "Absolute path in the guest, not `/` and without a trailing `/`; names of at most 255 bytes."})
        }
        "FilePath" => {
            json!({"name": "path", "in": "query", "required": true, "schema": {"type": "string", "pattern": "^(/[^/\\u0000]{0,255})+$", "maxLength": 4096}, "description": "Absolute path in the guest; names of at most 255 bytes."})
        }
        "VolumeName" => {
            json!({"name": "name", "in": "path", "required": true, "schema": s::<sh::VolumeName>(g), "description": "Volume name."})
        }
        "VolumeFilePath" => {
            json!({"name": "path", "in": "query", "required": true, "schema": {"type": "string", "pattern": "^/?((?:[^/\\u0000.][^/\\u0000]{0,254}|\\.[^/\\u0000.][^/\\u0000]{0,253}|\\.\\.[^/\\u0000]{1,253})(/(?:[^/\\u0000.][^/\\u0000]{0,254}|\\.[^/\\u0000.][^/\\u0000]{0,253}|\\.\\.[^/\\u0000]{1,253}))*)?/?$", "maxLength": 4096}, "description": "Path in the volume (`/` its root); no `.` or `..` parts."})
        }
        "VolumeTargetPath" => {
            json!({"name": "path", "in": "query", "required": true, "schema": {"type": "string", "pattern": "^/?(?:[^/\\u0000.][^/\\u0000]{0,254}|\\.[^/\\u0000.][^/\\u0000]{0,253}|\\.\\.[^/\\u0000]{1,253})(/(?:[^/\\u0000.][^/\\u0000]{0,254}|\\.[^/\\u0000.][^/\\u0000]{0,253}|\\.\\.[^/\\u0000]{1,253}))*/?$", "maxLength": 4096}, "description": "Path in the volume, not its root; no `.` or `..` parts."})
        }
        "SecretName" => {
            json!({"name": "name", "in": "path", "required": true, "schema": s::<sh::SecretName>(g), "description": "Secret name."})
        }
        "Port" => {
            json!({"name": "port", "in": "path", "required": true, "schema": {"type": "integer", "minimum": 1, "maximum": 65535}, "description": "A TCP port inside the sandbox."})
        }
        "IngressToken" => {
            json!({"name": "token", "in": "path", "required": true, "schema": {"type": "string", "pattern": "^[A-Za-z0-9]{32}$"}, "description": "The token of an exposed port's URL."})
        }
        "BrowserToken" => {
            json!({"name": "token", "in": "path", "required": true, "schema": {"type": "string", "pattern": "^[0-9]{1,20}\\.[0-9a-f]{64}$"}, "description": "The token of a live-view URL (`POST /v1/sandboxes/{id}/browser` makes them)."})
        }
        "BrowserQueryToken" => {
            json!({"name": "token", "in": "query", "required": false, "schema": {"type": "string", "pattern": "^[0-9]{1,20}\\.[0-9a-f]{64}$"}, "description": "The token of the DevTools URL, for clients that cannot send the key header; without it the key header is needed."})
        }
        "ConsolePath" => {
            json!({"name": "path", "in": "path", "required": true, "schema": {"type": "string", "maxLength": 1024}, "description": "A file of the console, under `/console/`."})
        }
        "ProxyPath" => {
            json!({"name": "path", "in": "path", "required": true, "schema": {"type": "string"}, "description": "The rest of the path (may be empty and may contain slashes), passed on with the query string."})
        }
        "NodeId" => {
            json!({"name": "id", "in": "path", "required": true, "description": "A node id: a DNS label, `[a-z0-9][a-z0-9-]{0,62}`.", "schema": {"type": "string", "maxLength": 63}})
        }
        "IdempotencyKey" => {
            json!({"name": "Idempotency-Key", "in": "header", "required": false, "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[!-~]+$"}, "description": "Makes the create happen at most once per key of the tenant for 24 hours: the same request sent again answers the sandbox the first one made."})
        }
        "BuildId" => {
            json!({"name": "id", "in": "path", "required": true, "schema": {"type": "string"}})
        }
        other => panic!("no parameter {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn walk<'a>(v: &'a Value, out: &mut Vec<&'a Map<String, Value>>) {
        match v {
            Value::Object(o) => {
                out.push(o);
                o.values().for_each(|c| walk(c, out));
            }
            Value::Array(a) => a.iter().for_each(|c| walk(c, out)),
            _ => {}
        }
    }

    #[test]
    fn integers_of_a_rust_type_are_bounded() {
        let doc = document();
        let mut all = Vec::new();
        walk(&doc, &mut all);
        for o in all {
            if o.get("format")
                .and_then(Value::as_str)
                .is_some_and(|f| f.contains("int"))
            {
                assert!(
                    o.contains_key("minimum") && o.contains_key("maximum"),
                    "{o:?}"
                );
            }
        }
    }

    #[test]
    fn query_parameters_are_never_null() {
        let doc = document();
        for item in doc["paths"].as_object().unwrap().values() {
            for op in item.as_object().unwrap().values() {
                for p in op["parameters"].as_array().into_iter().flatten() {
                    let text = p["schema"].to_string();
                    assert!(!text.contains("\"null\""), "{p}");
                }
            }
        }
    }

    #[test]
    fn secret_set_answers_created_and_replaced() {
        let doc = document();
        let responses = &doc["paths"]["/v1/secrets/{name}"]["put"]["responses"];
        assert!(responses["200"].is_object() && responses["201"].is_object());
    }

    #[test]
    fn catch_all_routes_are_openapi_paths() {
        let doc = document();
        let paths = doc["paths"].as_object().unwrap();
        assert!(paths.keys().all(|p| !p.contains("{*")));
        assert!(paths.contains_key("/ingress/{token}/{path}"));
    }
}
