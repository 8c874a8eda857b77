//! `POST /v1/tcp?port=N`: a full-duplex byte stream to `127.0.0.1:N` inside the guest, for
//! ingress. The request body goes to the socket (its end half-closes the socket), the response
//! body carries what the socket sends until it closes. A connection that cannot be made is the
//! structured error `unreachable` (502), answered before any body.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use space_proto::query::parse_query;
use space_proto::{ErrorKind, ProtoError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::body::{ChannelBody, HandlerResult};
use crate::daemon::Daemon;

/// Longest a connect to a guest port may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest chunk sent to the host at once.
const CHUNK: usize = 64 * 1024;

/// The port of `port=N` (1 to 65535).
pub fn parse_port(query: Option<&str>) -> Result<u16, ProtoError> {
    let pairs = parse_query(query)?;
    let Some((_, raw)) = pairs.iter().find(|(k, _)| k == "port") else {
        return Err(ProtoError::invalid("missing query parameter port"));
    };
    match raw.parse::<u16>() {
        Ok(p) if p > 0 && raw.bytes().all(|b| b.is_ascii_digit()) => Ok(p),
        _ => Err(ProtoError::invalid(format!(
            "port {raw:?} is not a number from 1 to 65535"
        ))),
    }
}

pub async fn tcp(d: Arc<Daemon>, req: Request<Incoming>) -> HandlerResult {
    let port = parse_port(req.uri().query())?;
    let connect = TcpStream::connect(("127.0.0.1", port));
    let stream = match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            let kind = match ErrorKind::from_io(&e) {
                ErrorKind::Internal => ErrorKind::Unreachable,
                k => k,
            };
            return Err(ProtoError::new(
                kind,
                format!("connect to 127.0.0.1:{port} in the guest: {e}"),
            ));
        }
        Err(_) => {
            return Err(ProtoError::new(
                ErrorKind::Timeout,
                format!("connect to 127.0.0.1:{port} in the guest timed out"),
            ))
        }
    };
    let _ = stream.set_nodelay(true);
    let (mut rd, mut wr) = stream.into_split();
    let mut body = req.into_body();
    // Host -> guest socket. A reset stream or failed write ends the socket's write side.
    let d2 = d.clone();
    tokio::spawn(async move {
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(f) => {
                    if let Ok(data) = f.into_data() {
                        if let Err(e) = wr.write_all(&data).await {
                            d2.warn_limited("tcp tunnel write", &e);
                            return;
                        }
                    }
                }
                Err(_) => return,
            }
        }
        let _ = wr.shutdown().await;
    });
    // Guest socket -> host.
    let (tx, resp_body) = ChannelBody::new(4);
    tokio::spawn(async move {
        loop {
            let mut chunk = BytesMut::with_capacity(CHUNK);
            match rd.read_buf(&mut chunk).await {
                Ok(0) => return,
                Ok(_) => {
                    if tx
                        .send(Ok::<Bytes, io::Error>(chunk.freeze()))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                Err(e) => {
                    // Resets the stream: the host must not mistake a cut for an end.
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            }
        }
    });
    Ok(Response::new(resp_body.boxed()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports() {
        assert_eq!(parse_port(Some("port=8000")).unwrap(), 8000);
        assert_eq!(parse_port(Some("port=65535")).unwrap(), 65535);
        for q in ["port=0", "port=65536", "port=-1", "port=+80", "port=x", ""] {
            assert!(parse_port(Some(q)).is_err(), "{q}");
        }
        assert!(parse_port(None).is_err());
    }
}
