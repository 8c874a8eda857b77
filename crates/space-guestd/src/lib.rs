//! `space-guestd`: the daemon inside every sandbox.
//!
//! In a VM it is PID 1: it mounts the pseudo filesystems, brings up loopback, reaps orphans,
//! and serves the host over the `space.ctl` virtio-serial port. Outside a VM (`--listen`) it
//! serves the same HTTP/2 API on a Unix socket and leaves the machine alone, which is how the
//! tests drive it. The binary in `main.rs` only parses arguments; everything lives here.

pub mod body;
pub mod ca;
pub mod daemon;
pub mod egress;
pub mod exec;
pub mod files;
pub mod grow;
pub mod identity;
pub mod init;
pub mod processes;
pub mod proxy;
pub mod pty;
pub mod ratelimit;
pub mod reaper;
pub mod server;
pub mod stats;
pub mod sys;
pub mod tcp;
pub mod transport;
pub mod users;
pub mod volumes;
pub mod watch;
pub mod watchers;
pub mod xattrs;

pub use daemon::{Daemon, Options};
