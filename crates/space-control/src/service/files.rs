//! File operations on a sandbox of the caller's: read, write, stat, list, mkdir, rename and
//! remove. Reads that only look are tried once more when the guest connection broke under
//! them (the sandbox was paused or suspended meanwhile, and access wakes it).

use bytes::Bytes;
use futures::{Stream, StreamExt as _, TryStreamExt as _};
use space_api::{self as api, DirEntry, FileStat};
use space_node_api::SandboxId;
use space_proto::{GuestClient, WriteOptions};

use super::Shared;
use crate::error::ApiResult;
use crate::store::Principal;

/// The sandbox and a client of its guest, woken when it sleeps and may be woken.
pub async fn guest(st: &Shared, who: &Principal, raw: &str) -> ApiResult<(SandboxId, GuestClient)> {
    let id = st.scope(who, raw).await?;
    let g = st.guest(Some(who), &id).await?;
    Ok((id, g))
}

/// A read-only guest call, tried once more when the connection broke under it.
async fn look<T, F, Fut>(st: &Shared, who: &Principal, raw: &str, call: F) -> ApiResult<T>
where
    F: Fn(GuestClient) -> Fut,
    Fut: std::future::Future<Output = Result<T, space_proto::ClientError>>,
{
    let (id, g) = guest(st, who, raw).await?;
    match call(g).await {
        Err(space_proto::ClientError::Closed | space_proto::ClientError::Transport(_)) => {
            let (id, g) = guest(st, who, raw).await?;
            st.guest_call(&id, call(g)).await
        }
        Err(e) => Err(st.guest_failure(&id, e).await),
        Ok(v) => Ok(v),
    }
}

/// A file's bytes, streamed.
pub async fn read(
    st: &Shared,
    who: &Principal,
    raw: &str,
    path: &str,
) -> ApiResult<impl Stream<Item = Result<Bytes, space_proto::ClientError>> + Send + 'static> {
    let (id, g) = guest(st, who, raw).await?;
    st.guest_call(&id, g.read_file(path)).await
}

/// A file's bytes as clients of [`api::Operations`] read them.
pub async fn read_stream(
    st: &Shared,
    who: &Principal,
    raw: &str,
    path: &str,
) -> ApiResult<api::ByteStream> {
    let reader = read(st, who, raw, path).await?;
    Ok(reader
        .map_err(|e| {
            let e = crate::error::ApiError::from(e);
            api::Failure::new(e.status.as_u16(), e.code, e.message)
        })
        .boxed())
}

/// Writes a file from a stream of its bytes; the guest renames it into place only when the
/// stream ended cleanly, so a stream that fails leaves the old file.
pub async fn write<S>(
    st: &Shared,
    who: &Principal,
    raw: &str,
    path: &str,
    options: WriteOptions,
    body: S,
) -> ApiResult<FileStat>
where
    S: Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static,
{
    let (id, g) = guest(st, who, raw).await?;
    match g.write_file_stream(path, body, options).await {
        Ok(stat) => Ok(stat),
        Err(e) => Err(st.guest_failure(&id, e).await),
    }
}

/// What a path is.
pub async fn stat(st: &Shared, who: &Principal, raw: &str, path: &str) -> ApiResult<FileStat> {
    look(st, who, raw, |g| {
        let path = path.to_owned();
        async move { g.stat(&path).await }
    })
    .await
}

/// A directory's entries, sorted by name.
pub async fn list(st: &Shared, who: &Principal, raw: &str, path: &str) -> ApiResult<Vec<DirEntry>> {
    look(st, who, raw, |g| {
        let path = path.to_owned();
        async move { g.list(&path).await }
    })
    .await
}

/// Makes a directory (and its parents, with `parents`).
pub async fn mkdir(
    st: &Shared,
    who: &Principal,
    raw: &str,
    path: &str,
    parents: bool,
) -> ApiResult<FileStat> {
    let (id, g) = guest(st, who, raw).await?;
    st.guest_call(&id, g.mkdir(path, parents)).await
}

/// Renames a path.
pub async fn rename(
    st: &Shared,
    who: &Principal,
    raw: &str,
    from: &str,
    to: &str,
) -> ApiResult<FileStat> {
    let (id, g) = guest(st, who, raw).await?;
    st.guest_call(&id, g.rename(from, to)).await
}

/// Removes a path (a directory with its contents, with `recursive`).
pub async fn remove(
    st: &Shared,
    who: &Principal,
    raw: &str,
    path: &str,
    recursive: bool,
) -> ApiResult<()> {
    let (id, g) = guest(st, who, raw).await?;
    st.guest_call(&id, g.remove(path, recursive)).await
}
