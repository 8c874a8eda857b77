//! The OpenAPI document the code generates (`space_control::api::openapi::document`) is the
//! checked-in `openapi.json`, describes exactly the routes the server answers
//! (`space_control::api::ROUTES`), is well-formed OpenAPI 3.1, and lists the error responses
//! of every operation.
//!
//! `SPACE_WRITE_OPENAPI=1 cargo test -p space-control --test openapi` rewrites the checked-in
//! copy from the code.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;
use space_control::api::openapi;
use space_control::api::ROUTES;

const METHODS: &[&str] = &[
    "get", "put", "post", "delete", "patch", "head", "options", "trace",
];

/// Routes that need no key (docs/api.md, *Authentication*; an ingress URL's token is its
/// own credential).
const PUBLIC: &[&str] = &[
    "health",
    "openapi",
    "tls.ca",
    "browser.live",
    "metrics",
    "console.page",
    "console.file",
    "ingress.get",
    "ingress.post",
    "ingress.put",
    "ingress.patch",
    "ingress.delete",
    "node.join",
    "node.rejoin",
    "node.heartbeat",
    "node.claim",
    "node.audit",
];

/// Operations that need an admin key (docs/api.md, *Templates* and *Tenants and keys*).
const ADMIN: &[&str] = &[
    "template.build",
    "template.delete",
    "tenant.list",
    "tenant.create",
    "tenant.update",
    "key.list",
    "key.create",
    "key.revoke",
    "node.token",
    "node.list",
    "node.drain",
    "node.remove",
];

const CHECKED_IN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.json");

/// Operations that answer 201 for what they created and 200 for what they replaced.
const TWO_SUCCESSES: &[&str] = &["secret.set"];

fn document() -> Value {
    openapi::document()
}

#[test]
fn checked_in_document_is_the_generated_one() {
    let generated = openapi::render(&openapi::document());
    if std::env::var_os("SPACE_WRITE_OPENAPI").is_some_and(|v| v == "1") {
        std::fs::write(CHECKED_IN, &generated).expect("writing openapi.json");
        return;
    }
    let text = std::fs::read_to_string(CHECKED_IN).expect("read openapi.json");
    if text != generated {
        let first = text
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| text.lines().count().min(generated.lines().count()));
        panic!(
            "crates/space-control/openapi.json is not what the code generates (first \
             difference at line {}); regenerate it with\n  \
             SPACE_WRITE_OPENAPI=1 cargo test -p space-control --test openapi\n\
             (and then sdk/python/scripts/gen_models.py)",
            first + 1
        );
    }
    // The server serves the same text.
    assert_eq!(openapi::served(), generated);
}

/// Every operation of the document: (METHOD, path) -> operation object.
fn operations(doc: &Value) -> BTreeMap<(String, String), &Value> {
    let paths = doc["paths"].as_object().expect("paths is an object");
    let mut out = BTreeMap::new();
    for (path, item) in paths {
        let item = item.as_object().expect("path item is an object");
        for (key, op) in item {
            if METHODS.contains(&key.as_str()) {
                out.insert((key.to_uppercase(), path.clone()), op);
            }
        }
    }
    out
}

/// Follows a local `$ref` (possibly several in a row).
fn resolve<'a>(doc: &'a Value, mut v: &'a Value) -> &'a Value {
    for _ in 0..16 {
        match v.get("$ref").and_then(Value::as_str) {
            Some(r) => {
                let pointer = r.strip_prefix('#').expect("local $ref");
                v = doc
                    .pointer(pointer)
                    .unwrap_or_else(|| panic!("$ref {r} does not resolve"));
            }
            None => return v,
        }
    }
    panic!("$ref chain too long");
}

fn collect_refs<'a>(v: &'a Value, at: String, out: &mut Vec<(String, &'a str)>) {
    match v {
        Value::Object(map) => {
            for (k, child) in map {
                if k == "$ref" {
                    if let Some(s) = child.as_str() {
                        out.push((at.clone(), s));
                    }
                } else {
                    collect_refs(child, format!("{at}/{k}"), out);
                }
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                collect_refs(child, format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
}

#[test]
fn document_matches_the_router() {
    let doc = document();
    let in_doc: BTreeSet<(String, String, String)> = operations(&doc)
        .into_iter()
        .map(|((method, path), op)| {
            let id = op["operationId"]
                .as_str()
                .unwrap_or_else(|| panic!("{method} {path} has no operationId"));
            (method, path, id.to_owned())
        })
        .collect();
    let in_router: BTreeSet<(String, String, String)> = ROUTES
        .iter()
        .map(|r| {
            (
                r.method.to_owned(),
                openapi::doc_path(r.path),
                r.operation.to_owned(),
            )
        })
        .collect();
    assert_eq!(in_router.len(), ROUTES.len(), "ROUTES lists a route twice");

    let show = |set: BTreeSet<&(String, String, String)>| -> String {
        set.into_iter()
            .map(|(m, p, o)| format!("\n  {m} {p} ({o})"))
            .collect()
    };
    let missing_in_doc = show(in_router.difference(&in_doc).collect());
    let missing_in_router = show(in_doc.difference(&in_router).collect());
    assert!(
        missing_in_doc.is_empty() && missing_in_router.is_empty(),
        "openapi.json and api::ROUTES differ.\nserved but not documented:{missing_in_doc}\n\
         documented but not served:{missing_in_router}"
    );

    // Paths are OpenAPI paths: every `{...}` a whole segment naming a parameter (an axum
    // wildcard `{*rest}` is written `{rest}`).
    for (_, path, _) in &in_doc {
        for seg in path.split('/') {
            if seg.contains('{') || seg.contains('}') {
                let name = seg
                    .strip_prefix('{')
                    .and_then(|s| s.strip_suffix('}'))
                    .unwrap_or_else(|| panic!("{path}: segment {seg:?} is not a parameter"));
                assert!(
                    !name.is_empty()
                        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'),
                    "{path}: {seg:?} is no OpenAPI path parameter"
                );
            }
        }
    }

    let ids: Vec<&String> = in_doc.iter().map(|(_, _, o)| o).collect();
    let unique: BTreeSet<&String> = ids.iter().copied().collect();
    assert_eq!(ids.len(), unique.len(), "operationIds repeat");
}

#[test]
fn document_is_openapi_3_1() {
    let doc = document();
    let version = doc["openapi"].as_str().expect("openapi field");
    assert!(
        version.starts_with("3.1."),
        "openapi is {version:?}, want 3.1.x"
    );
    assert!(doc["info"]["title"].is_string(), "info.title");
    assert!(doc["info"]["version"].is_string(), "info.version");
    let scheme = &doc["components"]["securitySchemes"]["bearerAuth"];
    assert_eq!(scheme["type"], "http");
    assert_eq!(scheme["scheme"], "bearer");
    assert_eq!(
        doc["security"],
        serde_json::json!([{"bearerAuth": []}]),
        "every route needs a key unless it says otherwise"
    );
}

#[test]
fn every_ref_resolves() {
    let doc = document();
    let mut refs = Vec::new();
    collect_refs(&doc, String::new(), &mut refs);
    assert!(refs.len() > 50, "only {} $refs found", refs.len());
    let broken: Vec<String> = refs
        .iter()
        .filter(|(_, r)| r.strip_prefix('#').and_then(|p| doc.pointer(p)).is_none())
        .map(|(at, r)| format!("{at}: {r}"))
        .collect();
    assert!(
        broken.is_empty(),
        "unresolved $refs:\n{}",
        broken.join("\n")
    );

    // Every schema, response and parameter defined is used somewhere.
    let used: BTreeSet<&str> = refs.iter().map(|(_, r)| *r).collect();
    let mut unused = Vec::new();
    for section in ["schemas", "responses", "parameters"] {
        for name in doc["components"][section].as_object().unwrap().keys() {
            let r = format!("#/components/{section}/{name}");
            if !used.contains(r.as_str()) {
                unused.push(r);
            }
        }
    }
    assert!(unused.is_empty(), "defined but never used: {unused:?}");
}

#[test]
fn security_is_declared_per_route() {
    let doc = document();
    for ((method, path), op) in operations(&doc) {
        let id = op["operationId"].as_str().unwrap_or_default();
        let public = op.get("security") == Some(&serde_json::json!([]));
        assert_eq!(
            public,
            PUBLIC.contains(&id),
            "{method} {path} ({id}): security: [] must be set on exactly the unauthenticated routes"
        );
        if !public {
            assert!(
                op.get("security").is_none(),
                "{method} {path} ({id}) overrides the document's security"
            );
        }
    }
}

#[test]
fn every_operation_lists_its_responses() {
    let doc = document();
    let mut problems = Vec::new();
    for ((method, path), op) in operations(&doc) {
        let id = op["operationId"].as_str().unwrap_or_default().to_owned();
        let Some(responses) = op["responses"].as_object() else {
            problems.push(format!("{method} {path}: no responses"));
            continue;
        };
        let codes: BTreeSet<&str> = responses.keys().map(String::as_str).collect();
        let mut need = |code: &str, why: &str| {
            if !codes.contains(code) {
                problems.push(format!(
                    "{method} {path} ({id}): no {code} response ({why})"
                ));
            }
        };

        need("500", "every route can fail inside");
        let params: Vec<&Value> = op["parameters"]
            .as_array()
            .map(|a| a.iter().map(|p| resolve(&doc, p)).collect())
            .unwrap_or_default();
        let has_path_params = path.contains('{');
        if has_path_params {
            need("400", "a malformed id is invalid_id");
            need("404", "an unknown id");
        }
        if params.iter().any(|p| p["in"] == "query") {
            need("400", "query parameters are validated");
        }
        if !PUBLIC.contains(&id.as_str()) {
            need("401", "needs a key");
        }
        if ADMIN.contains(&id.as_str()) {
            need("403", "admin only");
        }
        let body = op.get("requestBody").map(|b| resolve(&doc, b));
        if let Some(body) = body {
            need("413", "bodies are bounded");
            if body["content"].get("application/json").is_some() {
                need("400", "a bad JSON body");
                need("415", "a JSON route without Content-Type: application/json");
            }
        }

        // One success status (two where the route answers a create and a replace apart),
        // with content unless it is 204 or a WebSocket upgrade.
        let successes: Vec<&str> = codes
            .iter()
            .copied()
            .filter(|c| c.starts_with('1') || c.starts_with('2'))
            .collect();
        let want = if TWO_SUCCESSES.contains(&id.as_str()) {
            2
        } else {
            1
        };
        if successes.len() != want {
            problems.push(format!(
                "{method} {path} ({id}): success statuses {successes:?}, want {want}"
            ));
        }
        for s in successes {
            let resp = resolve(&doc, &responses[s]);
            if s != "204" && s != "101" && resp.get("content").is_none() {
                problems.push(format!("{method} {path} ({id}): {s} has no content"));
            }
        }

        // Every error response is the error envelope, but the MCP transport's own refusals
        // (a malformed message, an `Accept` it cannot answer), whose bodies are its own.
        for (code, resp) in responses {
            let transport = path == "/mcp" && matches!(code.as_str(), "400" | "406");
            if (code.starts_with('4') || code.starts_with('5')) && !transport {
                let resp = resolve(&doc, resp);
                let schema = resolve(&doc, &resp["content"]["application/json"]["schema"]);
                if schema
                    != resolve(
                        &doc,
                        &serde_json::json!({"$ref": "#/components/schemas/Error"}),
                    )
                {
                    problems.push(format!(
                        "{method} {path} ({id}): {code} is not the error envelope"
                    ));
                }
            }
        }

        // Path parameters are declared, and only those.
        let in_path: BTreeSet<String> = path
            .split('/')
            .filter_map(|seg| seg.strip_prefix('{')?.strip_suffix('}'))
            .map(str::to_owned)
            .collect();
        let declared: BTreeSet<String> = params
            .iter()
            .filter(|p| p["in"] == "path")
            .map(|p| {
                assert_eq!(
                    p["required"], true,
                    "{method} {path}: path params are required"
                );
                p["name"].as_str().unwrap_or_default().to_owned()
            })
            .collect();
        if in_path != declared {
            problems.push(format!(
                "{method} {path} ({id}): path parameters {in_path:?}, declared {declared:?}"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn error_envelope_matches_the_api() {
    let doc = document();
    let error = &doc["components"]["schemas"]["Error"];
    assert_eq!(error["required"], serde_json::json!(["error"]));
    let inner = &error["properties"]["error"];
    assert_eq!(inner["required"], serde_json::json!(["code", "message"]));
    assert_eq!(inner["properties"]["code"]["type"], "string");
    assert_eq!(inner["properties"]["message"]["type"], "string");
}
