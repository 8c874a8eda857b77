//! The operations every front end of the API offers, as one trait. The server implements it
//! in process over its service layer; [`crate::client::Client`] implements it over HTTP. The
//! MCP server's tools are written against it, so `space mcp` (over the network with the CLI's
//! key) and `/mcp` (in process, with the key the MCP request carried) run the same code.

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use http::HeaderValue;

use crate::error::Failure;
use crate::exec::{EventStream, ExecRequest};
use crate::model::{
    BrowserSession, CreateSandbox, DirEntry, FileStat, Lifecycle, PortExposed, Sandbox,
    SandboxFilter, Snapshot, Template, Volume,
};

/// Who an operation is for, as the front end that took the request knows them.
#[derive(Debug, Clone, Default)]
pub struct Caller {
    /// The `Authorization` of the request that carried the operation (an implementation with
    /// a key of its own ignores it).
    pub authorization: Option<HeaderValue>,
    /// The `Host` it came to, so URLs made for the caller (exposed ports) name the host the
    /// client used.
    pub host: Option<HeaderValue>,
}

/// A streamed body.
pub type ByteStream = BoxStream<'static, std::result::Result<Bytes, Failure>>;

/// Shorthand for operation results.
pub type Result<T> = std::result::Result<T, Failure>;

/// The sandbox operations of the API (`docs/api.md`), each with the same meaning, checks,
/// audit and errors whichever front end calls it.
#[async_trait]
pub trait Operations: Send + Sync + 'static {
    /// The caller's sandboxes that `filter` lets through, newest first.
    async fn list_sandboxes(&self, who: &Caller, filter: &SandboxFilter) -> Result<Vec<Sandbox>>;
    /// One sandbox.
    async fn get_sandbox(&self, who: &Caller, id: &str) -> Result<Sandbox>;
    /// Creates a sandbox.
    async fn create_sandbox(&self, who: &Caller, req: &CreateSandbox) -> Result<Sandbox>;
    /// Pauses, resumes, suspends, restores or kills a sandbox; answers it as it is afterwards.
    async fn lifecycle(&self, who: &Caller, id: &str, change: Lifecycle) -> Result<Sandbox>;
    /// Forks a sandbox; answers the child.
    async fn fork(&self, who: &Caller, id: &str) -> Result<Sandbox>;
    /// Takes a snapshot (`full`: memory too).
    async fn snapshot(&self, who: &Caller, id: &str, full: bool) -> Result<Snapshot>;
    /// A sandbox's snapshots, oldest first.
    async fn snapshots(&self, who: &Caller, id: &str) -> Result<Vec<Snapshot>>;
    /// Rolls a sandbox back to one of its snapshots.
    async fn rollback(&self, who: &Caller, id: &str, snapshot: &str) -> Result<Sandbox>;
    /// Runs a command; the stream ends with its `exit` (or an `error`). Dropping the stream
    /// kills the command.
    async fn exec(&self, who: &Caller, id: &str, req: &ExecRequest) -> Result<EventStream>;
    /// A file's bytes.
    async fn read_file(&self, who: &Caller, id: &str, path: &str) -> Result<ByteStream>;
    /// Writes a file whole (made in a temporary file and renamed into place), making its
    /// parent directories; `mode` defaults to 0644.
    async fn write_file(
        &self,
        who: &Caller,
        id: &str,
        path: &str,
        mode: Option<u32>,
        data: Bytes,
    ) -> Result<FileStat>;
    /// What a path is.
    async fn stat(&self, who: &Caller, id: &str, path: &str) -> Result<FileStat>;
    /// A directory's entries, sorted by name.
    async fn list_dir(&self, who: &Caller, id: &str, path: &str) -> Result<Vec<DirEntry>>;
    /// Makes a port reachable at a new URL.
    async fn expose_port(&self, who: &Caller, id: &str, port: u16) -> Result<PortExposed>;
    /// The templates the caller may create from.
    /// The caller's volumes, by name.
    async fn volumes(&self, who: &Caller) -> Result<Vec<Volume>>;
    /// Makes a volume of the caller's tenant (`size_mib`: 10 GiB when `None`).
    async fn create_volume(
        &self,
        who: &Caller,
        name: &str,
        size_mib: Option<u64>,
    ) -> Result<Volume>;
    async fn templates(&self, who: &Caller) -> Result<Vec<Template>>;
    /// Starts the sandbox's browser unless it runs; its DevTools and live-view URLs.
    async fn browser(&self, who: &Caller, id: &str) -> Result<BrowserSession>;
}
