//! Volume requests on a guest's uplink (`POST /v1/volumes/{mount}`, `docs/volumes.md`): the
//! mounts the node gave the sandbox, each a volume's [`Tree`] and whether the sandbox may
//! write it, answered by [`space_volume::serve`] off the async threads.

use std::io;
use std::sync::Arc;

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use space_proto::volume::{decode, encode, VolumeReply, VolumeRequest, MAX_HEADER, MAX_IO};
use space_volume::Tree;

use super::SandboxGateway;

/// One volume mounted in a sandbox.
#[derive(Clone)]
pub struct Mount {
    /// The volume's tree (shared by every sandbox that mounts it on this node).
    pub tree: Arc<Tree>,
    /// Whether requests that change it are refused.
    pub read_only: bool,
}

/// The longest body a volume request has: a write's bytes and its header.
const MAX_BODY: usize = MAX_IO as usize + MAX_HEADER + 4;

type Body = BoxBody<Bytes, io::Error>;

fn answer(status: StatusCode, body: Vec<u8>) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(body)).map_err(|n| match n {}).boxed());
    *r.status_mut() = status;
    r
}

/// Answers a volume request of the sandbox's guest for mount `index` (the path's last part).
pub(super) async fn handle(sb: Arc<SandboxGateway>, index: &str, body: Incoming) -> Response<Body> {
    let mount = index
        .parse::<usize>()
        .ok()
        .and_then(|i| sb.mounts().get(i).cloned());
    let Some(mount) = mount else {
        return answer(StatusCode::NOT_FOUND, b"no such mount".to_vec());
    };
    let bytes = match Limited::new(body, MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return answer(StatusCode::PAYLOAD_TOO_LARGE, e.to_string().into_bytes()),
    };
    let served = tokio::task::spawn_blocking(move || {
        let (req, data) = decode::<VolumeRequest>(&bytes).map_err(|e| e.to_string())?;
        let (reply, out): (VolumeReply, Vec<u8>) =
            space_volume::serve(&mount.tree, mount.read_only, req, data);
        Ok::<_, String>(encode(&reply, &out))
    })
    .await;
    match served {
        Ok(Ok(body)) => answer(StatusCode::OK, body),
        Ok(Err(e)) => answer(StatusCode::BAD_REQUEST, e.into_bytes()),
        Err(e) => answer(
            StatusCode::INTERNAL_SERVER_ERROR,
            e.to_string().into_bytes(),
        ),
    }
}
