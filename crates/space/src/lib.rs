//! The `space` command's library part: [`host`] assembles `space up`, a node run in process
//! behind the control plane's API. The command line itself is the `space` binary.

pub mod host;

pub use host::{Host, HostConfig};
