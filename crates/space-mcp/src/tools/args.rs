//! The tools' arguments: each a type whose JSON schema (schemars, doc comments as the
//! descriptions) is the tool's input schema, written for the model that fills it in.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::Deserialize;

/// No arguments.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoArgs {}

/// Arguments of create_sandbox.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateArgs {
    /// The template to start from (list_templates shows them); `base` when left out.
    #[serde(default)]
    pub template: Option<String>,
    /// The template's version; the newest when left out.
    #[serde(default)]
    pub version: Option<String>,
    /// Virtual CPUs (the template's default when left out).
    #[serde(default)]
    pub vcpus: Option<u32>,
    /// Memory in MiB (the template's default when left out).
    #[serde(default)]
    pub memory_mib: Option<u64>,
    /// Disk size in MiB (the template's default when left out).
    #[serde(default)]
    pub disk_mib: Option<u64>,
    /// Environment variables for every command run in the sandbox.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Labels to find the sandbox by later (list_sandboxes shows them).
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// When given, the only hosts the sandbox may reach (`pypi.org`, `*.github.com`,
    /// `example.com:443`); every other connection is refused. Left out: any host.
    #[serde(default)]
    pub egress_allow: Option<Vec<String>>,
    /// Names of the tenant's vault secrets to bind (each appears as an environment variable
    /// of its name holding a placeholder the gateway replaces with the real value).
    #[serde(default)]
    pub secrets: Vec<String>,
    /// Seconds without activity before the sandbox is suspended (the server's default, 15
    /// minutes, when left out).
    #[serde(default)]
    pub idle_timeout_seconds: Option<u64>,
    /// Your volumes to mount (list_volumes shows them; create_volume makes one).
    #[serde(default)]
    pub volumes: Vec<MountArg>,
}

/// A volume create_sandbox mounts.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MountArg {
    /// The volume's name.
    pub name: String,
    /// Where it appears in the sandbox (absolute, such as `/data`).
    pub path: String,
    /// Whether the sandbox may only read it.
    #[serde(default)]
    pub read_only: bool,
}

/// Arguments of list_sandboxes.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListArgs {
    /// Only sandboxes in this state (running, paused, suspended, failed, terminated).
    #[serde(default)]
    pub state: Option<String>,
    /// Only sandboxes of this template.
    #[serde(default)]
    pub template: Option<String>,
}

/// A sandbox.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SandboxArgs {
    /// The sandbox's id (sbx-...), as create_sandbox or list_sandboxes returned it.
    pub sandbox_id: String,
}

/// Arguments of run_command.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunArgs {
    /// The sandbox's id (sbx-...).
    pub sandbox_id: String,
    /// The command, a line for /bin/sh -c (pipes, redirections and && work).
    pub command: String,
    /// The working directory (the template's when left out).
    #[serde(default)]
    pub cwd: Option<String>,
    /// Extra environment variables for this command.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Text written to the command's stdin, which is then closed.
    #[serde(default)]
    pub stdin: Option<String>,
    /// Seconds before the command is killed (default 120, at most 3600).
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
    /// Bytes kept of each of stdout and stderr (default 32768, at most 1048576).
    #[serde(default)]
    pub max_output_bytes: Option<usize>,
}

/// Arguments of start_process.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StartArgs {
    /// The sandbox's id (sbx-...).
    pub sandbox_id: String,
    /// The command, a line for /bin/sh -c.
    pub command: String,
    /// The working directory (the template's when left out).
    #[serde(default)]
    pub cwd: Option<String>,
    /// Extra environment variables.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

/// Arguments of read_process_output.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadProcessArgs {
    /// The sandbox's id (sbx-...).
    pub sandbox_id: String,
    /// The process_id start_process returned.
    pub process_id: String,
    /// Where to read stdout from (0, or the stdout_next_offset of the last read).
    #[serde(default)]
    pub stdout_offset: u64,
    /// Where to read stderr from (0, or the stderr_next_offset of the last read).
    #[serde(default)]
    pub stderr_offset: u64,
    /// Seconds to wait for new output or for the process to end (default 0, at most 60).
    #[serde(default)]
    pub wait_seconds: Option<u64>,
    /// Bytes returned at most, stdout and stderr together (default 65536, at most 1048576).
    #[serde(default)]
    pub max_bytes: Option<usize>,
}

/// Arguments of stop_process.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StopArgs {
    /// The sandbox's id (sbx-...).
    pub sandbox_id: String,
    /// The process_id start_process returned.
    pub process_id: String,
    /// TERM (default), INT, HUP or KILL.
    #[serde(default)]
    pub signal: Option<String>,
}

/// How file content is written out.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// UTF-8 text.
    #[default]
    Text,
    /// Base64 of the bytes.
    Base64,
}

/// Arguments of read_file.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadFileArgs {
    /// The sandbox's id (sbx-...).
    pub sandbox_id: String,
    /// The file's absolute path (/home/user/main.py).
    pub path: String,
    /// text (default; invalid UTF-8 is replaced) or base64.
    #[serde(default)]
    pub encoding: Encoding,
    /// Bytes returned at most (default and limit 1048576).
    #[serde(default)]
    pub max_bytes: Option<usize>,
}

/// Arguments of write_file.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteFileArgs {
    /// The sandbox's id (sbx-...).
    pub sandbox_id: String,
    /// The file's absolute path.
    pub path: String,
    /// The content: text, or base64 with encoding=base64.
    pub content: String,
    /// text (default) or base64.
    #[serde(default)]
    pub encoding: Encoding,
    /// Permission bits in octal, like "755" for a script (default 644).
    #[serde(default)]
    pub mode: Option<String>,
}

/// A path in a sandbox.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PathArgs {
    /// The sandbox's id (sbx-...).
    pub sandbox_id: String,
    /// An absolute path.
    pub path: String,
}

/// Arguments of snapshot_sandbox.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotArgs {
    /// The sandbox's id (sbx-...).
    pub sandbox_id: String,
    /// Also keep memory and running processes (default false: the disk only).
    #[serde(default)]
    pub full: bool,
}

/// Arguments of rollback_sandbox.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RollbackArgs {
    /// The sandbox's id (sbx-...).
    pub sandbox_id: String,
    /// The snapshot's id, from snapshot_sandbox or list_snapshots.
    pub snapshot_id: String,
}

/// Arguments of expose_port.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PortArgs {
    /// The sandbox's id (sbx-...).
    pub sandbox_id: String,
    /// The TCP port a program in the sandbox listens on.
    pub port: u16,
}
