//! The host <-> guest protocol of `space`.
//!
//! The host talks to `space-guestd` (PID 1 inside the sandbox) with HTTP/2 over a single byte
//! stream (a virtio-serial port in a VM, a Unix socket in tests). This crate owns everything both
//! ends must agree on: the protocol version, the routes, the JSON message types, the structured
//! error, the record framing used inside streamed bodies, the limits the daemon enforces, and
//! (with the `client` feature) the host-side client. `docs/protocol.md` is the prose version.

pub mod error;
pub mod frame;
pub mod limits;
pub mod query;
pub mod routes;
pub mod sync;
pub mod types;
pub mod volume;

#[cfg(feature = "client")]
pub mod client;

pub use error::{ErrorKind, ProtoError};
pub use frame::{Frame, FrameDecoder, FrameError, FrameKind, MAX_FRAME_PAYLOAD};
pub use types::*;

#[cfg(feature = "client")]
pub use client::{
    ClientConfig, ClientError, ExecHandle, ExecOutput, ExecStdin, FileReader, GuestBody,
    GuestClient, Output, PtyHandle, PtyInput, TcpTunnel, WatchStream,
};

/// Version of the wire protocol. Bumped on any incompatible change; the daemon reports it in
/// `GET /v1/health` so a host can refuse to drive a guest it does not understand.
pub const PROTO_VERSION: u32 = 1;
