//! How the tools reach the API: through [`Operations`], with the caller of the tool call.
//! `space mcp` hands the server the API's HTTP client (over the network, with the CLI's
//! key); the server's `/mcp` route hands it its service layer in process, which
//! authenticates every call with the key the MCP request came with. Either way a tool can do
//! exactly what its caller's key may do, and every call is scoped and audited like any
//! other.

use std::sync::Arc;

use futures::StreamExt as _;
use http::HeaderValue;

pub use space_api::{enc, ByteStream, Caller, Failure, Operations};

/// The API as one tool call sees it: the operations and the caller.
#[derive(Clone)]
pub struct Conn {
    /// The operations.
    pub ops: Arc<dyn Operations>,
    /// Who calls them.
    pub who: Caller,
}

impl Conn {
    /// A connection through `ops` with the caller's `authorization` and `host` (HTTP only).
    pub fn new(
        ops: Arc<dyn Operations>,
        authorization: Option<HeaderValue>,
        host: Option<HeaderValue>,
    ) -> Conn {
        Conn {
            ops,
            who: Caller {
                authorization,
                host,
            },
        }
    }
}

/// Reads a body, keeping at most `cap` bytes and counting all of them; a broken stream ends
/// the read where it broke.
pub async fn read_capped(mut body: ByteStream, cap: usize) -> (Vec<u8>, u64) {
    let mut kept = Vec::new();
    let mut total = 0u64;
    while let Some(chunk) = body.next().await {
        let Ok(chunk) = chunk else { break };
        total += chunk.len() as u64;
        let room = cap.saturating_sub(kept.len());
        kept.extend_from_slice(&chunk[..chunk.len().min(room)]);
    }
    (kept, total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[tokio::test]
    async fn capped_reads_count_everything_and_keep_the_cap() {
        let chunks: Vec<Result<Bytes, Failure>> = vec![
            Ok(Bytes::from_static(b"hello ")),
            Ok(Bytes::from_static(b"world")),
        ];
        let (kept, total) = read_capped(futures::stream::iter(chunks).boxed(), 8).await;
        assert_eq!((kept.as_slice(), total), (&b"hello wo"[..], 11));
    }
}
