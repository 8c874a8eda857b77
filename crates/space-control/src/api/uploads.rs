//! `POST /v1/template-uploads`: a build context or an image archive, kept for a build to name
//! by its id, and what a build hands its node for that id.
//!
//! Where an upload is kept depends on who builds. `space up` runs its node in its own
//! process: the upload is a file under `<data>/uploads/<tenant>/`, and the build names its
//! path. A cluster's replica shares no disk with its nodes (nor with the other replicas): the
//! upload goes to the object store, sealed under the uploading tenant's key
//! (`space_archive::uploads`), and the node that builds fetches it from there. Either way an
//! upload is its tenant's: another tenant naming its id finds nothing.

use std::path::PathBuf;

use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::StreamExt;
use serde_json::json;
use space_archive::uploads::{self, UploadWriter, UploadsError};
use space_node_api::BuildInput;

use super::{Caller, Shared};
use crate::error::{ApiError, ApiResult};
use crate::store::{Principal, TenantName};

/// A new upload id: `upl-` and 16 hex digits.
pub(crate) fn new_id() -> String {
    use rand::RngCore;
    let mut b = [0u8; 8];
    rand::rngs::OsRng.fill_bytes(&mut b);
    format!("upl-{}", hex::encode(b))
}

fn too_large(limit: u64) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "too_large",
        format!("an upload may be {limit} bytes at most"),
    )
}

fn no_store() -> ApiError {
    ApiError::conflict(
        "this cluster has no object store, which is where its nodes read build uploads from \
         (start the replicas with --object-store; docs/cluster.md)",
    )
}

fn store_error(e: UploadsError) -> ApiError {
    match e {
        UploadsError::Missing(_) | UploadsError::BadId(_) => ApiError::invalid(e.to_string()),
        e => ApiError::internal(format!("the object store: {e}")),
    }
}

/// `POST /v1/template-uploads`: answers `{"upload": ID, "bytes": N}`.
pub async fn upload(
    State(st): State<Shared>,
    Caller(who): Caller,
    body: Body,
) -> ApiResult<Response> {
    let id = new_id();
    let bytes = store(&st, &who.tenant, &id, body).await?;
    Ok((
        StatusCode::CREATED,
        Json(json!({"upload": id, "bytes": bytes})),
    )
        .into_response())
}

/// Keeps `body` as `tenant`'s upload `id` (replacing one of that id), at most
/// [`Shared::max_template_upload_bytes`]; answers its size. A body that breaks off leaves no
/// upload of that id to read.
pub async fn store(st: &Shared, tenant: &TenantName, id: &str, body: Body) -> ApiResult<u64> {
    let limit = st.max_template_upload_bytes;
    let mut stream = body.into_data_stream();
    match &st.cluster {
        Some(cluster) => {
            let archive = cluster.archive().ok_or_else(no_store)?;
            archive
                .ensure_tenant_key(cluster.store(), cluster.holder(), tenant.as_str())
                .await
                .map_err(|e| ApiError::internal(format!("{e:#}")))?;
            let mut w = UploadWriter::start(archive.keyring(), tenant.as_str(), id)
                .await
                .map_err(store_error)?;
            // A part written before the upload broke off has no meta object: never read,
            // removed when it expires.
            while let Some(chunk) = stream.next().await {
                let chunk =
                    chunk.map_err(|e| ApiError::invalid(format!("the upload broke off: {e}")))?;
                if w.bytes() + chunk.len() as u64 > limit {
                    return Err(too_large(limit));
                }
                w.write(&chunk).await.map_err(store_error)?;
            }
            w.finish().await.map_err(store_error)
        }
        None => {
            use tokio::io::AsyncWriteExt;
            let dir = local_dir(st, tenant)?;
            std::fs::create_dir_all(&dir)
                .map_err(|e| ApiError::internal(format!("creating the upload directory: {e}")))?;
            let path = dir.join(id);
            // Written beside, renamed over: a reader never sees half of it.
            let part = dir.join(format!("{id}.part"));
            let mut f = tokio::fs::File::create(&part)
                .await
                .map_err(|e| ApiError::internal(format!("creating an upload: {e}")))?;
            let mut n = 0u64;
            let written = async {
                while let Some(chunk) = stream.next().await {
                    let chunk = chunk
                        .map_err(|e| ApiError::invalid(format!("the upload broke off: {e}")))?;
                    n += chunk.len() as u64;
                    if n > limit {
                        return Err(too_large(limit));
                    }
                    f.write_all(&chunk)
                        .await
                        .map_err(|e| ApiError::internal(format!("writing an upload: {e}")))?;
                }
                f.flush()
                    .await
                    .map_err(|e| ApiError::internal(format!("writing an upload: {e}")))?;
                tokio::fs::rename(&part, &path)
                    .await
                    .map_err(|e| ApiError::internal(format!("keeping an upload: {e}")))
            }
            .await;
            if let Err(e) = written {
                let _ = tokio::fs::remove_file(&part).await;
                return Err(e);
            }
            Ok(n)
        }
    }
}

/// Whether `tenant` has a complete upload `id`.
pub async fn exists(st: &Shared, tenant: &TenantName, id: &str) -> ApiResult<bool> {
    match &st.cluster {
        Some(cluster) => {
            let archive = cluster.archive().ok_or_else(no_store)?;
            match uploads::size(archive.keyring(), tenant.as_str(), id).await {
                Ok(_) => Ok(true),
                Err(UploadsError::Missing(_)) => Ok(false),
                Err(e) => Err(store_error(e)),
            }
        }
        None => Ok(local_dir(st, tenant)?.join(id).is_file()),
    }
}

/// Copies `tenant`'s upload `id` to the new file `dest`.
pub async fn fetch(
    st: &Shared,
    tenant: &TenantName,
    id: &str,
    dest: &std::path::Path,
) -> ApiResult<u64> {
    match &st.cluster {
        Some(cluster) => {
            let archive = cluster.archive().ok_or_else(no_store)?;
            uploads::fetch(archive.keyring(), tenant.as_str(), id, dest)
                .await
                .map_err(store_error)
        }
        None => {
            let src = local_dir(st, tenant)?.join(id);
            tokio::fs::copy(&src, dest)
                .await
                .map_err(|e| ApiError::invalid(format!("no upload {id}: {e}")))
        }
    }
}

/// The directory of `tenant`'s uploads on this server's disk.
fn local_dir(st: &Shared, tenant: &TenantName) -> ApiResult<PathBuf> {
    let dir = st.uploads_dir.as_ref().ok_or_else(no_store)?;
    Ok(dir.join(tenant.as_str()))
}

/// What a build of `who`'s reads for upload `id`, once it is known to exist.
pub async fn input(st: &Shared, who: &Principal, id: &str) -> ApiResult<BuildInput> {
    if !uploads::valid_id(id) {
        return Err(ApiError::invalid(format!(
            "no upload {:?}: an upload id is upl- and hex digits, as POST /v1/template-uploads \
             answers",
            id.chars().take(70).collect::<String>()
        )));
    }
    match &st.cluster {
        Some(cluster) => {
            let archive = cluster.archive().ok_or_else(no_store)?;
            uploads::size(archive.keyring(), who.tenant.as_str(), id)
                .await
                .map_err(store_error)?;
            Ok(BuildInput::Stored {
                tenant: who.tenant.as_str().to_owned(),
                upload: id.to_owned(),
            })
        }
        None => {
            let p = local_dir(st, &who.tenant)?.join(id);
            if !p.is_file() {
                return Err(ApiError::invalid(format!("no upload {id}")));
            }
            Ok(BuildInput::Path(p))
        }
    }
}
