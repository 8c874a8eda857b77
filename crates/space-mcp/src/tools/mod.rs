//! The tools: the catalog (names, descriptions, schemas) and what each one does through the
//! public API; their arguments are in [`args`].

mod args;
pub mod computer;
pub mod volumes;

pub use args::*;

use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use space_api::{CreateSandbox, EgressPolicy, Lifecycle, Sandbox, SandboxFilter, TimeoutsUpdate};

use crate::api::{Conn, Failure};
use crate::progress::Status;

/// Output kept of each of stdout and stderr when the caller names no cap.
pub const DEFAULT_MAX_OUTPUT: usize = 32 << 10;
/// The largest output cap a caller may ask for.
pub const MAX_OUTPUT: usize = 1 << 20;
/// A command's timeout when the caller names none.
pub const DEFAULT_TIMEOUT_SECS: u64 = 120;
/// The longest timeout a caller may ask for.
pub const MAX_TIMEOUT_SECS: u64 = 3600;
/// The most of a file `read_file` returns.
pub const MAX_READ: usize = 1 << 20;
/// The longest `read_process_output` waits.
pub const MAX_WAIT_SECS: u64 = 60;

/// A tool's result: text for the model, and the same as data.
#[derive(Debug)]
pub struct Done {
    /// What the model reads.
    pub text: String,
    /// The structured result.
    pub data: Value,
    /// An image for the model (base64, MIME type), beside the text.
    pub image: Option<(String, &'static str)>,
}

impl Done {
    fn json(data: Value) -> Done {
        Done {
            text: serde_json::to_string_pretty(&data).unwrap_or_default(),
            data,
            image: None,
        }
    }
}

/// Every tool: the sandbox tools, then the computer-use ones.
pub fn all() -> impl Iterator<Item = &'static Spec> {
    TOOLS
        .iter()
        .chain(volumes::TOOLS.iter())
        .chain(computer::TOOLS.iter())
}

/// A tool that went wrong, said so that the model can act on it.
#[derive(Debug)]
pub struct ToolError(pub String);

impl From<Failure> for ToolError {
    fn from(f: Failure) -> ToolError {
        let hint = match f.code.as_str() {
            "sandbox_not_found" => " Call list_sandboxes to see the sandboxes you have.",
            "snapshot_not_found" => " Call list_snapshots to see the sandbox's snapshots.",
            "template_not_found" => " Call list_templates to see the templates there are.",
            "illegal_state" => {
                " Call get_sandbox to see its state; resume_sandbox wakes a paused or \
                 suspended sandbox."
            }
            "file_not_found" => " Call list_directory on its parent to see what is there.",
            "quota_exceeded" => " Kill sandboxes you no longer need (kill_sandbox) and retry.",
            "capacity" => " The node is full: retry later or ask for less memory.",
            "disk_full" => " The node's disk is full: retry once its operator has made room.",
            "unauthorized" | "forbidden" => " The API key of this MCP connection may not do it.",
            _ => "",
        };
        ToolError(format!(
            "{} [{}].{hint}",
            f.message.trim_end_matches('.'),
            f.code
        ))
    }
}

type Result<T> = std::result::Result<T, ToolError>;

/// One tool: its name, its description and its argument type's schema.
pub struct Spec {
    /// The tool's name.
    pub name: &'static str,
    /// Its title, for people.
    pub title: &'static str,
    /// What it does, for the model.
    pub description: &'static str,
    /// Its input schema.
    pub schema: fn() -> std::sync::Arc<rmcp::model::JsonObject>,
    /// Whether it only reads.
    pub read_only: bool,
    /// Whether it may destroy something.
    pub destructive: bool,
}

fn schema<T: JsonSchema + 'static>() -> std::sync::Arc<rmcp::model::JsonObject> {
    rmcp::handler::server::common::schema_for_type::<T>()
}

macro_rules! spec {
    ($name:literal, $title:literal, $args:ty, $ro:expr, $destructive:expr, $desc:expr) => {
        Spec {
            name: $name,
            title: $title,
            description: $desc,
            schema: schema::<$args>,
            read_only: $ro,
            destructive: $destructive,
        }
    };
}

/// Every tool, in the order they are listed.
pub const TOOLS: &[Spec] = &[
    spec!(
        "create_sandbox",
        "Create a sandbox",
        CreateArgs,
        false,
        false,
        "Create a new sandbox: an isolated Linux microVM with its own kernel, file system and \
         network, for running code safely. Returns its id (sbx-...), needed by every other \
         tool. The `base` template is Debian with python3, curl and git; `minimal` is a tiny \
         BusyBox system. Outbound network is open unless `egress_allow` lists the only hosts \
         it may reach. Secrets from the tenant's vault are never put in the VM: the sandbox \
         gets a placeholder in an environment variable of the secret's name, and the gateway \
         swaps in the real value on the way out to the secret's hosts."
    ),
    spec!(
        "list_sandboxes",
        "List sandboxes",
        ListArgs,
        true,
        false,
        "List your sandboxes, newest first, with their state (running, paused, suspended, \
         failed; terminated ones only with state=terminated)."
    ),
    spec!(
        "get_sandbox",
        "Describe a sandbox",
        SandboxArgs,
        true,
        false,
        "Show one sandbox: state, template, size, timeouts, egress policy, secrets bound."
    ),
    spec!(
        "list_templates",
        "List templates",
        NoArgs,
        true,
        false,
        "List the templates sandboxes can be created from (name, version, description)."
    ),
    spec!(
        "run_command",
        "Run a command",
        RunArgs,
        false,
        false,
        "Run a shell command (/bin/sh -c) in a sandbox and wait for it to end. Returns its \
         exit code, stdout and stderr; a non-zero exit code is a normal result, not an error. \
         Output beyond `max_output_bytes` per stream keeps its first and last halves with a \
         `[... truncated: ...]` marker between them. The command is killed after \
         `timeout_seconds`. For servers and other long-running programs use start_process \
         instead. A paused or suspended sandbox is woken first."
    ),
    spec!(
        "start_process",
        "Start a background process",
        StartArgs,
        false,
        false,
        "Start a long-running command (a server, a watcher, a long build) in the background \
         and return at once with a process_id. Its output goes to files in the sandbox; read \
         it with read_process_output, end it with stop_process. It keeps running after this \
         call and after the MCP connection closes."
    ),
    spec!(
        "read_process_output",
        "Read a background process's output",
        ReadProcessArgs,
        true,
        false,
        "Read what a background process wrote since the offsets given (start at 0 and pass \
         the returned next offsets on the next call), whether it is still running, and its \
         exit code once it ended. `wait_seconds` waits for new output or the end."
    ),
    spec!(
        "stop_process",
        "Stop a background process",
        StopArgs,
        false,
        true,
        "Send a signal (TERM by default) to a background process and everything it started."
    ),
    spec!(
        "read_file",
        "Read a file",
        ReadFileArgs,
        true,
        false,
        "Read a file from a sandbox, as UTF-8 text (encoding=text, the default) or as base64 \
         (encoding=base64, for binary files). At most `max_bytes` (1 MiB) are returned; the \
         result says when the file is longer."
    ),
    spec!(
        "write_file",
        "Write a file",
        WriteFileArgs,
        false,
        true,
        "Write a file in a sandbox, replacing it atomically if it exists; missing parent \
         directories are created. `content` is text, or base64 with encoding=base64."
    ),
    spec!(
        "list_directory",
        "List a directory",
        PathArgs,
        true,
        false,
        "List a directory of a sandbox: each entry's name, type (file, dir, symlink), size \
         and mode."
    ),
    spec!(
        "snapshot_sandbox",
        "Snapshot a sandbox",
        SnapshotArgs,
        false,
        false,
        "Take a snapshot of a sandbox's disk (or, with full=true, of its memory and running \
         processes too), to roll back to later. Returns the snapshot's id."
    ),
    spec!(
        "list_snapshots",
        "List snapshots",
        SandboxArgs,
        true,
        false,
        "List a sandbox's snapshots, oldest first (id, kind, reason, time)."
    ),
    spec!(
        "rollback_sandbox",
        "Roll back to a snapshot",
        RollbackArgs,
        false,
        true,
        "Roll a sandbox back to one of its snapshots: every change to its files since then is \
         lost (and, for a full snapshot, its processes are back where they were)."
    ),
    spec!(
        "fork_sandbox",
        "Fork a sandbox",
        SandboxArgs,
        false,
        false,
        "Make a copy of a running sandbox (files, memory and processes) as a new sandbox, in \
         milliseconds; both go on independently. Returns the new sandbox."
    ),
    spec!(
        "pause_sandbox",
        "Pause a sandbox",
        SandboxArgs,
        false,
        false,
        "Freeze a sandbox's CPUs: it uses no CPU until resumed, and keeps its memory."
    ),
    spec!(
        "suspend_sandbox",
        "Suspend a sandbox",
        SandboxArgs,
        false,
        false,
        "Save a sandbox's memory and disk and stop its VM: it then costs no memory or CPU. \
         Its processes carry on where they were when it is resumed, even days later."
    ),
    spec!(
        "resume_sandbox",
        "Resume a sandbox",
        SandboxArgs,
        false,
        false,
        "Wake a paused or suspended sandbox (a running one is left as it is)."
    ),
    spec!(
        "kill_sandbox",
        "Kill a sandbox",
        SandboxArgs,
        false,
        true,
        "Stop a sandbox for good. Its files are gone for running commands; its record and \
         snapshots stay."
    ),
    spec!(
        "expose_port",
        "Expose a port",
        PortArgs,
        false,
        false,
        "Make a TCP port that a program in the sandbox listens on (on 127.0.0.1 or 0.0.0.0) \
         reachable from outside at a public URL, returned here. Anyone with the URL can reach \
         it; exposing the port again makes a new URL and revokes the old one."
    ),
];

fn args<T: DeserializeOwned>(tool: &str, raw: Value) -> Result<T> {
    serde_json::from_value(raw).map_err(|e| {
        ToolError(format!(
            "bad arguments for {tool}: {e}. See the tool's input schema."
        ))
    })
}

/// A sandbox, summed up for the model.
fn sandbox_done(sb: &Sandbox, lead: &str) -> Done {
    let data = serde_json::to_value(sb).unwrap_or_default();
    let text = format!(
        "{lead}sandbox {} is {} (template {} {}, {} vCPU, {} MiB)\n{}",
        sb.id,
        sb.state,
        sb.template,
        sb.template_version,
        sb.vcpus,
        sb.memory_mib,
        serde_json::to_string_pretty(&data).unwrap_or_default()
    );
    Done {
        text,
        data,
        image: None,
    }
}

fn data<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or_default()
}

/// Wakes sandbox `id` when it is paused or suspended; says what it did.
async fn wake(conn: &Conn, id: &str) -> std::result::Result<Option<&'static str>, Failure> {
    let sb = conn.ops.get_sandbox(&conn.who, id).await?;
    let (change, done) = match sb.state.as_str() {
        "paused" => (Lifecycle::Resume, "resumed"),
        "suspended" => (Lifecycle::Restore, "restored"),
        _ => return Ok(None),
    };
    conn.ops.lifecycle(&conn.who, id, change).await?;
    Ok(Some(done))
}

/// Runs `op`; when the sandbox was paused or suspended (and so refused it), wakes it and runs
/// `op` again.
async fn awake<T, F, Fut>(conn: &Conn, id: &str, op: F) -> std::result::Result<T, Failure>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = std::result::Result<T, Failure>>,
{
    match op().await {
        Err(f) if f.code == "illegal_state" => match wake(conn, id).await? {
            Some(_) => op().await,
            None => Err(f),
        },
        other => other,
    }
}

/// Calls tool `name` with `raw` arguments.
pub async fn call(conn: &Conn, name: &str, raw: Value, status: &Status) -> Result<Done> {
    let (ops, who) = (&conn.ops, &conn.who);
    match name {
        "create_sandbox" => create(conn, args(name, raw)?, status).await,
        "list_sandboxes" => {
            let a: ListArgs = args(name, raw)?;
            let filter = SandboxFilter {
                state: a.state,
                template: a.template,
                metadata: Vec::new(),
            };
            let list = ops.list_sandboxes(who, &filter).await?;
            let brief: Vec<Value> = list
                .iter()
                .map(|s| {
                    json!({"id": s.id, "state": s.state, "template": s.template,
                           "metadata": s.metadata, "created_unix_ms": s.created_unix_ms})
                })
                .collect();
            Ok(Done::json(json!({"sandboxes": brief})))
        }
        "get_sandbox" => {
            let a: SandboxArgs = args(name, raw)?;
            let sb = ops.get_sandbox(who, &a.sandbox_id).await?;
            Ok(sandbox_done(&sb, ""))
        }
        "list_templates" => {
            let _: NoArgs = args(name, raw)?;
            let list = ops.templates(who).await?;
            let brief: Vec<Value> = list
                .iter()
                .map(|t| {
                    json!({"name": t.name, "version": t.version, "source": t.source,
                           "vcpus": t.vcpus, "memory_mib": t.memory_mib})
                })
                .collect();
            Ok(Done::json(json!({"templates": brief})))
        }
        "run_command" => run_command(conn, args(name, raw)?, status).await,
        "start_process" => {
            let a: StartArgs = args(name, raw)?;
            status.set("starting".into());
            let started =
                crate::procs::start(conn, &a.sandbox_id, &a.command, a.cwd, a.env).await?;
            Ok(Done::json(data(&started)))
        }
        "read_process_output" => {
            let a: ReadProcessArgs = args(name, raw)?;
            let wait = Duration::from_secs(a.wait_seconds.unwrap_or(0).min(MAX_WAIT_SECS));
            let max = a.max_bytes.unwrap_or(64 << 10).clamp(1, MAX_OUTPUT);
            let out = crate::procs::read(
                conn,
                &a.sandbox_id,
                &a.process_id,
                (a.stdout_offset, a.stderr_offset),
                max,
                wait,
            )
            .await?;
            let state = match (out.running, out.exit_code) {
                (true, _) => "running".to_owned(),
                (false, Some(c)) => format!("exited with code {c}"),
                (false, None) => "ended, its exit code lost (the sandbox restarted)".to_owned(),
            };
            let text = format!(
                "process {} is {state}\nstdout (next offset {}{}):\n{}\nstderr (next offset {}):\n{}",
                a.process_id,
                out.stdout_next_offset,
                if out.more { "; more to read" } else { "" },
                out.stdout,
                out.stderr_next_offset,
                out.stderr
            );
            Ok(Done {
                image: None,
                text,
                data: data(&out),
            })
        }
        "stop_process" => {
            let a: StopArgs = args(name, raw)?;
            let signal = a.signal.as_deref().unwrap_or("TERM").to_ascii_uppercase();
            let signal = signal.trim_start_matches("SIG").to_owned();
            let stopped = crate::procs::stop(conn, &a.sandbox_id, &a.process_id, &signal).await?;
            let text = match (stopped.signalled, stopped.exit_code) {
                (false, _) => format!("process {} had already ended", a.process_id),
                (true, Some(c)) => {
                    format!("SIG{signal} sent; process {} ended with {c}", a.process_id)
                }
                (true, None) => format!(
                    "SIG{signal} sent; process {} is still running 5 s later (signal=KILL ends it)",
                    a.process_id
                ),
            };
            Ok(Done {
                image: None,
                text,
                data: data(&stopped),
            })
        }
        "read_file" => read_file(conn, args(name, raw)?).await,
        "write_file" => write_file(conn, args(name, raw)?).await,
        "list_directory" => {
            let a: PathArgs = args(name, raw)?;
            let list = awake(conn, &a.sandbox_id, || {
                ops.list_dir(who, &a.sandbox_id, &a.path)
            })
            .await?;
            let entries: Vec<Value> = list
                .iter()
                .map(|e| {
                    json!({"name": e.name, "type": e.stat.file_type, "size": e.stat.size,
                           "mode": format!("{:o}", e.stat.mode)})
                })
                .collect();
            Ok(Done::json(json!({"path": a.path, "entries": entries})))
        }
        "snapshot_sandbox" => {
            let a: SnapshotArgs = args(name, raw)?;
            status.set("taking the snapshot".into());
            let snap = awake(conn, &a.sandbox_id, || {
                ops.snapshot(who, &a.sandbox_id, a.full)
            })
            .await?;
            Ok(Done::json(data(&snap)))
        }
        "list_snapshots" => {
            let a: SandboxArgs = args(name, raw)?;
            let snapshots = ops.snapshots(who, &a.sandbox_id).await?;
            Ok(Done::json(json!({ "snapshots": snapshots })))
        }
        "rollback_sandbox" => {
            let a: RollbackArgs = args(name, raw)?;
            status.set("rolling back".into());
            let sb = awake(conn, &a.sandbox_id, || {
                ops.rollback(who, &a.sandbox_id, &a.snapshot_id)
            })
            .await?;
            Ok(sandbox_done(
                &sb,
                &format!("rolled back to {}: ", a.snapshot_id),
            ))
        }
        "fork_sandbox" => {
            let a: SandboxArgs = args(name, raw)?;
            status.set("forking".into());
            let sb = awake(conn, &a.sandbox_id, || ops.fork(who, &a.sandbox_id)).await?;
            Ok(sandbox_done(
                &sb,
                &format!("forked from {}: ", a.sandbox_id),
            ))
        }
        "pause_sandbox" | "suspend_sandbox" | "kill_sandbox" => {
            let a: SandboxArgs = args(name, raw)?;
            let (change, done) = match name {
                "pause_sandbox" => (Lifecycle::Pause, "paused: "),
                "suspend_sandbox" => (Lifecycle::Suspend, "suspended: "),
                _ => (Lifecycle::Kill, "killed: "),
            };
            status.set(done.trim_end_matches(": ").to_owned());
            let sb = ops.lifecycle(who, &a.sandbox_id, change).await?;
            Ok(sandbox_done(&sb, done))
        }
        "resume_sandbox" => {
            let a: SandboxArgs = args(name, raw)?;
            status.set("waking".into());
            let woke = wake(conn, &a.sandbox_id).await?;
            let sb = ops.get_sandbox(who, &a.sandbox_id).await?;
            let lead = match woke {
                Some(w) => format!("{w}: "),
                None => "was not paused or suspended: ".to_owned(),
            };
            Ok(sandbox_done(&sb, &lead))
        }
        "expose_port" => {
            let a: PortArgs = args(name, raw)?;
            let exposed = awake(conn, &a.sandbox_id, || {
                ops.expose_port(who, &a.sandbox_id, a.port)
            })
            .await?;
            Ok(Done {
                image: None,
                text: format!(
                    "port {} of {} is at {}\n(anyone with this URL can reach it)",
                    a.port, a.sandbox_id, exposed.url
                ),
                data: data(&exposed),
            })
        }
        other => {
            if let Some(done) = volumes::call(conn, other, raw.clone()).await {
                return done;
            }
            match computer::call(conn, other, raw).await {
                Some(done) => done,
                None => Err(ToolError(format!(
                    "there is no tool {other:?}; call tools/list for the tools there are"
                ))),
            }
        }
    }
}

async fn create(conn: &Conn, a: CreateArgs, status: &Status) -> Result<Done> {
    let req = CreateSandbox {
        template: a.template.unwrap_or_else(|| "base".to_owned()),
        version: a.version,
        vcpus: a.vcpus,
        memory_mib: a.memory_mib,
        disk_mib: a.disk_mib,
        env: a.env,
        metadata: a.metadata,
        secrets: a.secrets,
        egress: a.egress_allow.map(|allow| EgressPolicy {
            default: "deny".to_owned(),
            allow,
            deny: Vec::new(),
            headers: Vec::new(),
        }),
        timeouts: a.idle_timeout_seconds.map(|secs| TimeoutsUpdate {
            idle_ms: Some(secs.saturating_mul(1000)),
            ..TimeoutsUpdate::default()
        }),
        auto_resume: None,
        volumes: a
            .volumes
            .into_iter()
            .map(|v| space_api::VolumeMountSpec {
                name: v.name,
                path: v.path,
                read_only: v.read_only,
            })
            .collect(),
    };
    status.set("creating the sandbox".into());
    let sb = conn.ops.create_sandbox(&conn.who, &req).await?;
    Ok(sandbox_done(&sb, "created: "))
}

async fn run_command(conn: &Conn, a: RunArgs, status: &Status) -> Result<Done> {
    let timeout = a
        .timeout_seconds
        .unwrap_or(DEFAULT_TIMEOUT_SECS)
        .clamp(1, MAX_TIMEOUT_SECS);
    let run = || {
        crate::exec::run(
            conn,
            &a.sandbox_id,
            crate::exec::Run {
                command: a.command.clone(),
                cwd: a.cwd.clone(),
                env: a.env.clone(),
                stdin: a.stdin.clone(),
                timeout: Duration::from_secs(timeout),
                max_output: a
                    .max_output_bytes
                    .unwrap_or(DEFAULT_MAX_OUTPUT)
                    .clamp(1, MAX_OUTPUT),
            },
            status,
        )
    };
    status.set("starting".into());
    let ran = awake(conn, &a.sandbox_id, run).await?;
    let how = match (ran.exit_code, ran.signal) {
        (_, Some(9)) if ran.timed_out => format!("killed after its timeout of {timeout} s"),
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("killed by signal {s}"),
        (None, None) => "ended".to_owned(),
    };
    let text = format!(
        "{how} ({} ms){}\nstdout:\n{}\nstderr:\n{}",
        ran.duration_ms,
        if ran.truncated {
            "; output truncated"
        } else {
            ""
        },
        ran.stdout,
        ran.stderr
    );
    Ok(Done {
        image: None,
        text,
        data: data(&ran),
    })
}

async fn read_file(conn: &Conn, a: ReadFileArgs) -> Result<Done> {
    let max = a.max_bytes.unwrap_or(MAX_READ).clamp(1, MAX_READ);
    let body = awake(conn, &a.sandbox_id, || {
        conn.ops.read_file(&conn.who, &a.sandbox_id, &a.path)
    })
    .await
    .map_err(|f| name_the_path(f, &a.path))?;
    let (bytes, total) = crate::api::read_capped(body, max).await;
    let truncated = total > bytes.len() as u64;
    let content = match a.encoding {
        Encoding::Text => String::from_utf8_lossy(&bytes).into_owned(),
        Encoding::Base64 => B64.encode(&bytes),
    };
    let note = if truncated {
        format!(
            "\n[... truncated: the file has {total} bytes, the first {} shown]",
            bytes.len()
        )
    } else {
        String::new()
    };
    Ok(Done {
        image: None,
        text: format!("{content}{note}"),
        data: json!({
            "path": a.path, "size": total, "truncated": truncated,
            "encoding": if a.encoding == Encoding::Text { "text" } else { "base64" },
            "content": content,
        }),
    })
}

/// A missing file's error names its path.
fn name_the_path(f: Failure, path: &str) -> Failure {
    if f.code == "file_not_found" && !f.message.contains(path) {
        return Failure {
            message: format!("no such file: {path} ({})", f.message),
            ..f
        };
    }
    f
}

async fn write_file(conn: &Conn, a: WriteFileArgs) -> Result<Done> {
    let bytes = match a.encoding {
        Encoding::Text => a.content.into_bytes(),
        Encoding::Base64 => B64
            .decode(a.content.trim().as_bytes())
            .map_err(|e| ToolError(format!("content is not valid base64: {e}")))?,
    };
    let mode = match &a.mode {
        None => None,
        Some(mode) => {
            let digits = mode.trim_start_matches("0o");
            let ok = !digits.is_empty()
                && digits.len() <= 4
                && digits.bytes().all(|b| (b'0'..=b'7').contains(&b));
            if !ok {
                return Err(ToolError(format!(
                    "mode {mode:?} is not octal permission bits like \"644\" or \"755\""
                )));
            }
            u32::from_str_radix(digits, 8).ok()
        }
    };
    let body = bytes::Bytes::from(bytes);
    let stat = awake(conn, &a.sandbox_id, || {
        conn.ops
            .write_file(&conn.who, &a.sandbox_id, &a.path, mode, body.clone())
    })
    .await
    .map_err(|f| name_the_path(f, &a.path))?;
    Ok(Done {
        image: None,
        text: format!("wrote {} bytes to {}", stat.size, a.path),
        data: data(&stat),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tool_has_an_object_schema_with_described_properties() {
        let mut names = std::collections::HashSet::new();
        for t in all() {
            assert!(names.insert(t.name), "{} twice", t.name);
            let s = (t.schema)();
            assert_eq!(s["type"], "object", "{}", t.name);
            let props = s.get("properties").and_then(Value::as_object);
            for (k, p) in props.into_iter().flatten() {
                let described = p.get("description").is_some() || p.get("$ref").is_some();
                assert!(described, "{}.{k} has no description: {p}", t.name);
            }
            assert!(t.description.len() > 40, "{} is not described", t.name);
        }
        let run = (TOOLS
            .iter()
            .find(|t| t.name == "run_command")
            .unwrap()
            .schema)();
        let required: Vec<&str> = run["required"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(required, ["sandbox_id", "command"]);
    }

    #[test]
    fn bad_arguments_say_what_is_wrong() {
        let e = args::<RunArgs>("run_command", json!({"sandbox_id": "sbx-1"})).unwrap_err();
        assert!(e.0.contains("command"), "{}", e.0);
        let e = args::<RunArgs>(
            "run_command",
            json!({"sandbox_id": "x", "command": "ls", "cmd": 1}),
        )
        .unwrap_err();
        assert!(e.0.contains("cmd"), "{}", e.0);
    }

    #[test]
    fn failures_become_advice() {
        let f = Failure::from_body(
            409,
            br#"{"error": {"code": "illegal_state", "message": "sandbox is suspended"}}"#,
        );
        let ToolError(text) = f.into();
        assert!(
            text.starts_with("sandbox is suspended [illegal_state]."),
            "{text}"
        );
        assert!(text.contains("resume_sandbox"), "{text}");
    }
}
