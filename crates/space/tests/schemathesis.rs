//! The API against its own OpenAPI document: schemathesis (from the venv
//! `scripts/python-env.sh` makes, `target/space/venv`) runs every phase (examples, coverage,
//! fuzzing, stateful) and every check against a real `space up`, and must find nothing.
//!
//! Two runs share one server:
//!
//! - a tenant's key, for everything a tenant does (sandboxes, exec, files, snapshots,
//!   secrets, egress, ports, templates of its own); the tenant's quotas are small, so
//!   creates and forks end in `429 quota_exceeded` instead of filling the machine;
//! - an admin key, for the admin operations (tenants, keys, audit, nodes), with
//!   `key.revoke`, `template.delete` and `template.build` left out: revoking keys could lock
//!   the run out (the server only keeps the last admin key), deleting a public template
//!   would take the stock template away from the rest of the run, and admin builds of public
//!   names boot VMs for minutes; each of them is exercised with the tenant's key (where it
//!   is refused or scoped to the tenant) and by the API tests.
//!
//! `crates/space/tests/schemathesis.toml` holds the few per-operation exceptions, each with
//! its reason. `/mcp` is MCP's own protocol (tested by `crates/space/tests/mcp.rs`), and the ingress and
//! port proxy routes answer whatever the app in the sandbox answers; they are left out, and
//! so is `files.watch`, a stream that ends only when the client goes away.
//!
//! `SPACE_SCHEMATHESIS_EXAMPLES` sets the examples per operation (default 10; `make soak`
//! runs more), `SPACE_SCHEMATHESIS_SECONDS` the time budget of each run (default 150).

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::{env_number, json, repo_root, run_suite_unchecked, TestServer};

/// Operations no run sends (see the module's documentation).
const LEFT_OUT: &str = "^(mcp\\.|ingress\\.|port\\.proxy_|files\\.watch$)";

/// What the admin run leaves out besides [`LEFT_OUT`].
const ADMIN_LEFT_OUT: &[&str] = &["key.revoke", "template.delete", "template.build"];

/// The admin operations (docs/api.md, *Tenants and keys*, *Cluster*, *Audit*).
const ADMIN_OPS: &str = "^(tenant\\.|key\\.|node\\.token$|node\\.list$|node\\.drain$|\
                         node\\.remove$|audit\\.list$)";

fn schemathesis() -> PathBuf {
    let bin = repo_root().join("target/space/venv/bin/schemathesis");
    assert!(
        bin.exists(),
        "{} does not exist: run scripts/python-env.sh (make test does)",
        bin.display()
    );
    bin
}

/// One schemathesis run against `server` with `key`; `filters` select the operations.
/// Answers what it found wrong (`None`: nothing), in a few lines a reader sees first.
fn run(
    server: &TestServer,
    key: &str,
    filters: &[String],
    report: &std::path::Path,
) -> Option<String> {
    let examples = env_number("SPACE_SCHEMATHESIS_EXAMPLES", 10);
    let seconds = env_number("SPACE_SCHEMATHESIS_SECONDS", 150);
    let mut cmd = Command::new(schemathesis());
    cmd.arg("--config-file")
        .arg(repo_root().join("crates/space/tests/schemathesis.toml"))
        .arg("run")
        .arg(repo_root().join("crates/space-control/openapi.json"))
        .args(["--url", &server.url])
        .args(["--header", &format!("Authorization: Bearer {key}")])
        .args(["--phases", "examples,coverage,fuzzing,stateful"])
        .args(["--max-examples", &examples.to_string()])
        .args(["--max-time", &seconds.to_string()])
        .args(["--workers", "1"])
        .args(["--seed", "7"])
        .args(["--request-timeout", "60"])
        .args(["--suppress-health-check", "all"])
        .args(["--exclude-operation-id-regex", LEFT_OUT])
        .args(filters)
        .arg("--report-dir")
        .arg(report)
        .args(["--report", "junit"])
        .env("NO_COLOR", "1")
        .env("SCHEMATHESIS_HOOKS", "")
        .current_dir(report);
    // The runs' own budget plus the slowest requests (a create boots a VM under TCG).
    let timeout = Duration::from_secs(seconds * 2 + 600);
    let (status, output) = run_suite_unchecked(cmd, timeout);
    println!("{output}");
    match status {
        Some(s) if s.success() => None,
        Some(s) => Some(format!("schemathesis failed ({s}):\n{}", findings(&output))),
        None => Some(format!(
            "schemathesis did not finish within {timeout:?}:\n{}",
            findings(&output)
        )),
    }
}

/// The part of schemathesis's output that says what failed: its FAILURES and ERRORS
/// sections, its summary and its closing count, or the last lines when it printed none.
fn findings(output: &str) -> String {
    let lines: Vec<&str> = output.lines().collect();
    let mut kept = Vec::new();
    let mut keep = false;
    for line in &lines {
        if line.starts_with("===") {
            keep = ["FAILURES", "ERRORS", "SUMMARY"]
                .iter()
                .any(|name| line.contains(&format!(" {name} ")));
        }
        if keep {
            kept.push(*line);
        }
    }
    if kept.is_empty() {
        kept = lines[lines.len().saturating_sub(60)..].to_vec();
    } else if let Some(last) = lines.iter().rev().find(|l| l.starts_with("===")) {
        // The closing line counts the failures and warnings.
        kept.push(last);
    }
    kept.join("\n")
}

#[test]
fn the_api_keeps_its_contract() {
    schemathesis();
    let server = TestServer::start();
    let report = tempfile::tempdir().expect("a temporary directory");

    // The tenant of the first run: room for two small sandboxes, so a create past that is
    // 429, never a node out of room (503): the quotas are far below what the node holds.
    let tenant = json(&server.cli([
        "tenant",
        "create",
        "contract",
        "--max-sandboxes",
        "2",
        "--max-cpus",
        "4",
        "--max-memory",
        "2048",
        "--json",
    ]));
    let tenant_key = tenant["key"]["key"]
        .as_str()
        .expect("the tenant's key")
        .to_owned();
    let mut found = Vec::new();
    found.extend(run(&server, &tenant_key, &[], report.path()).map(|f| format!("tenant run: {f}")));

    let mut admin_filters = vec![
        "--include-operation-id-regex".to_owned(),
        ADMIN_OPS.to_owned(),
    ];
    for op in ADMIN_LEFT_OUT {
        admin_filters.push("--exclude-operation-id".to_owned());
        admin_filters.push((*op).to_owned());
    }
    found.extend(
        run(&server, &server.admin_key, &admin_filters, report.path())
            .map(|f| format!("admin run: {f}")),
    );

    // What was found goes last, after the server's log, where a reader of a long log looks.
    if !found.is_empty() {
        eprintln!("---- space up log (end) ----\n{}", server.log_tail());
        drop(server);
        panic!("{}", found.join("\n\n"));
    }

    // Nothing the runs did took the admin key away or broke the server.
    let health: serde_json::Value =
        serde_json::from_str(&server.get("/v1/health")).expect("health is JSON");
    assert_eq!(health["status"], "ok");
    server.get("/v1/tenants");
}
