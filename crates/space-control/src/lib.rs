//! Control plane of space: the public HTTP API (`docs/api.md`), tenants and API keys,
//! sandbox ownership, quotas, audit and metrics, in front of one node.
//!
//! - [`server`]: [`Server`], which opens the node and the state store and serves the API;
//! - [`api`]: the router, authentication, tenant scoping and the handlers;
//! - [`error`]: the API's error format and the mapping of every failure onto it;
//! - [`quota`]: tenant quotas; [`metrics`]: Prometheus text;
//! - [`store`], [`keys`]: the SQLite state store and API keys;
//! - [`vault`]: the credentials vault (secrets sealed with AES-256-GCM);
//! - [`egress`]: the secret source and audit sink the node's gateway uses;
//! - [`masters`]: each tenant's master key (the deployment's key file or a KMS key);
//! - [`e2b`]: E2B compatibility (its REST API, envd and sandbox-port hosts);
//! - [`mcp`]: the MCP server at `/mcp` (`space_mcp` over Streamable HTTP);
//! - [`console`]: the web console's page and files, embedded at build time;
//! - [`archive`]: the object store and master key, the audit of key unwraps, ownership of
//!   sandboxes found in the store.
//!
//! `docs/control.md` describes how the pieces fit.
// The API document's schemas are JSON literals (`api::shapes`), deeper than the default limit.
#![recursion_limit = "512"]

pub mod api;
pub mod archive;
pub mod cluster;
pub mod console;
pub mod e2b;
pub mod egress;
pub mod error;
pub mod keys;
pub mod listen;
pub mod masters;
pub mod mcp;
pub mod metrics;
pub mod quota;
pub mod replica;
pub mod server;
pub mod service;
pub mod store;
pub mod vault;

pub use error::ApiError;
pub use server::{Server, ServerConfig};
