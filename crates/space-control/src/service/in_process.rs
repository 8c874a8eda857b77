//! The operations of [`space_api::Operations`] over the service layer, in process: what the
//! MCP server at `/mcp` calls. Each call is authenticated with the `Authorization` of the MCP
//! request that carried it, so a tool may do exactly what the key may; it is scoped,
//! audited, and counted in the metrics under the operation it performs, as the same call
//! over `/v1` would be.

use std::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;
use space_api::{self as api, Caller, Failure, Operations};
use space_node_api::SnapshotKind;
use space_proto::WriteOptions;

use super::{browser, create, exec, files, ports, sandboxes, templates, Shared};
use crate::error::{ApiError, ApiResult};
use crate::store::Principal;

/// The service layer as [`Operations`].
#[derive(Clone)]
pub struct InProcess {
    st: Shared,
}

impl InProcess {
    /// The operations over `st`.
    pub fn new(st: Shared) -> InProcess {
        InProcess { st }
    }

    async fn principal(&self, who: &Caller) -> ApiResult<Principal> {
        let header = match &who.authorization {
            Some(h) => Some(
                h.to_str()
                    .map_err(|_| ApiError::unauthorized("the Authorization header is malformed"))?,
            ),
            None => None,
        };
        Ok(self.st.store.authenticate(header).await?)
    }

    /// Runs `op` for the caller as `operation`, counted in the metrics.
    async fn run<T, F, Fut>(
        &self,
        who: &Caller,
        operation: &'static str,
        op: F,
    ) -> api::ops::Result<T>
    where
        F: FnOnce(Shared, Principal) -> Fut,
        Fut: std::future::Future<Output = ApiResult<T>>,
    {
        let started = Instant::now();
        let result = match self.principal(who).await {
            Ok(p) => op(self.st.clone(), p).await,
            Err(e) => Err(e),
        };
        let status = result.as_ref().map_or_else(|e| e.status.as_u16(), |_| 200);
        self.st
            .metrics
            .observe(operation, status, started.elapsed().as_secs_f64());
        result.map_err(failure)
    }
}

/// The API's error as clients of [`Operations`] see it.
pub fn failure(e: ApiError) -> Failure {
    Failure::new(e.status.as_u16(), e.code, e.message)
}

#[async_trait]
impl Operations for InProcess {
    async fn list_sandboxes(
        &self,
        who: &Caller,
        filter: &api::SandboxFilter,
    ) -> api::ops::Result<Vec<api::Sandbox>> {
        self.run(who, "sandbox.list", |st, p| async move {
            let filter = sandboxes::Filter::of(filter)?;
            sandboxes::list(&st, &p, &filter).await
        })
        .await
    }

    async fn get_sandbox(&self, who: &Caller, id: &str) -> api::ops::Result<api::Sandbox> {
        self.run(who, "sandbox.get", |st, p| async move {
            sandboxes::get(&st, &p, id).await
        })
        .await
    }

    async fn create_sandbox(
        &self,
        who: &Caller,
        req: &api::CreateSandbox,
    ) -> api::ops::Result<api::Sandbox> {
        self.run(who, "sandbox.create", |st, p| async move {
            // The body is read exactly as `POST /v1/sandboxes` reads it.
            let body = serde_json::to_value(req).map_err(|e| ApiError::invalid(e.to_string()))?;
            let body: crate::api::sandboxes::CreateBody = serde_json::from_value(body)
                .map_err(|e| ApiError::invalid(format!("the create request: {e}")))?;
            create::create(&st, &p, None, body.into_new()?).await
        })
        .await
    }

    async fn lifecycle(
        &self,
        who: &Caller,
        id: &str,
        change: api::Lifecycle,
    ) -> api::ops::Result<api::Sandbox> {
        self.run(who, change.operation(), |st, p| async move {
            sandboxes::lifecycle(&st, &p, id, change).await
        })
        .await
    }

    async fn fork(&self, who: &Caller, id: &str) -> api::ops::Result<api::Sandbox> {
        self.run(who, "sandbox.fork", |st, p| async move {
            sandboxes::fork(&st, &p, id).await
        })
        .await
    }

    async fn snapshot(
        &self,
        who: &Caller,
        id: &str,
        full: bool,
    ) -> api::ops::Result<api::Snapshot> {
        let kind = if full {
            SnapshotKind::Full
        } else {
            SnapshotKind::Disk
        };
        self.run(who, "snapshot.create", |st, p| async move {
            sandboxes::snapshot(&st, &p, id, kind).await
        })
        .await
    }

    async fn snapshots(&self, who: &Caller, id: &str) -> api::ops::Result<Vec<api::Snapshot>> {
        self.run(who, "snapshot.list", |st, p| async move {
            sandboxes::snapshots(&st, &p, id).await
        })
        .await
    }

    async fn rollback(
        &self,
        who: &Caller,
        id: &str,
        snapshot: &str,
    ) -> api::ops::Result<api::Sandbox> {
        self.run(who, "snapshot.rollback", |st, p| async move {
            sandboxes::rollback(&st, &p, id, snapshot).await
        })
        .await
    }

    async fn exec(
        &self,
        who: &Caller,
        id: &str,
        req: &api::ExecRequest,
    ) -> api::ops::Result<api::EventStream> {
        let req = req.clone();
        self.run(who, "sandbox.exec", |st, p| async move {
            exec::exec(&st, &p, id, req).await
        })
        .await
    }

    async fn read_file(
        &self,
        who: &Caller,
        id: &str,
        path: &str,
    ) -> api::ops::Result<api::ByteStream> {
        self.run(who, "files.download", |st, p| async move {
            files::read_stream(&st, &p, id, path).await
        })
        .await
    }

    async fn write_file(
        &self,
        who: &Caller,
        id: &str,
        path: &str,
        mode: Option<u32>,
        data: Bytes,
    ) -> api::ops::Result<api::FileStat> {
        if mode.is_some_and(|m| m > 0o7777) {
            return Err(Failure::new(
                400,
                "invalid_request",
                "mode is permission bits (0000 to 7777)",
            ));
        }
        self.run(who, "files.upload", |st, p| async move {
            if data.len() as u64 > st.max_upload_bytes {
                return Err(ApiError::too_large(format!(
                    "the file is over this server's limit of {} bytes; nothing was written",
                    st.max_upload_bytes
                )));
            }
            let options = WriteOptions {
                mode,
                create_parents: true,
                owner: None,
                xattrs: Default::default(),
                ..WriteOptions::default()
            };
            let body = futures::stream::iter([Ok::<_, std::io::Error>(data)]);
            files::write(&st, &p, id, path, options, body).await
        })
        .await
    }

    async fn stat(&self, who: &Caller, id: &str, path: &str) -> api::ops::Result<api::FileStat> {
        self.run(who, "files.stat", |st, p| async move {
            files::stat(&st, &p, id, path).await
        })
        .await
    }

    async fn list_dir(
        &self,
        who: &Caller,
        id: &str,
        path: &str,
    ) -> api::ops::Result<Vec<api::DirEntry>> {
        self.run(who, "files.list", |st, p| async move {
            files::list(&st, &p, id, path).await
        })
        .await
    }

    async fn expose_port(
        &self,
        who: &Caller,
        id: &str,
        port: u16,
    ) -> api::ops::Result<api::PortExposed> {
        let host = who.host.as_ref().and_then(|h| h.to_str().ok());
        self.run(who, "port.expose", |st, p| async move {
            ports::expose(&st, &p, id, port, host).await
        })
        .await
    }

    async fn browser(&self, who: &Caller, id: &str) -> api::ops::Result<api::BrowserSession> {
        let host = who.host.as_ref().and_then(|h| h.to_str().ok());
        self.run(who, "browser.start", |st, p| async move {
            let base = super::public_base(&st, host, false)?;
            browser::session(&st, &p, id, &base).await
        })
        .await
    }

    async fn volumes(&self, who: &Caller) -> api::ops::Result<Vec<api::Volume>> {
        self.run(who, "volume.list", |st, p| async move {
            super::volumes::list(&st, &p).await
        })
        .await
    }

    async fn create_volume(
        &self,
        who: &Caller,
        name: &str,
        size_mib: Option<u64>,
    ) -> api::ops::Result<api::Volume> {
        self.run(who, "volume.create", |st, p| async move {
            super::volumes::create(&st, &p, name, size_mib).await
        })
        .await
    }

    async fn templates(&self, who: &Caller) -> api::ops::Result<Vec<api::Template>> {
        self.run(who, "template.list", |st, p| async move {
            templates::list(&st, &p).await
        })
        .await
    }
}
