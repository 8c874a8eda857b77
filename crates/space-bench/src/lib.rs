//! Benchmarks of space: the measurements `space-bench` runs and the tables it prints.
//!
//! - [`bench`]: the measurement groups (boot, snapshot, restore, pause, exec, files);
//! - [`node`]: the node group (`space-bench node`): the lifecycle through `space_node::Node`;
//! - [`storage`]: the storage group (`space-bench storage`): the node's drivers without VMs;
//! - [`archive`]: the archive group (`space-bench archive`): sandboxes through the object store;
//! - [`egress`]: the egress group (`space-bench egress`): what the gateway adds to HTTPS;
//! - [`cluster`]: the cluster group (`space-bench cluster`): creates over several nodes;
//! - [`e2b`]: the E2B group (`space-bench e2b`): the E2B SDK against space's own, one server;
//! - [`mcp`]: the MCP group (`space-bench mcp`): `run_command` over MCP against the REST exec;
//! - [`script`]: a server in this process measured by a client SDK's script (E2B, MCP);
//! - [`failover`]: the failover group (`space-bench failover`): a node's loss, with processes;
//! - [`bare`]: the reference restore that drives QEMU with the least machinery;
//! - [`qmp`]: the small line-based QMP client the reference restore speaks;
//! - [`scratch`]: the loop-mounted btrfs (or plain) directory a run works in;
//! - [`stats`]: samples, percentiles and the printed tables;
//! - [`host`]: the host facts every header prints, and the signals that end a run;
//! - [`procmem`]: RSS and PSS of a process from `/proc`.

pub mod api;
pub mod archive;
pub mod bare;
pub mod bench;
pub mod cluster;
pub mod console;
pub mod desktop;
pub mod e2b;
pub mod egress;
pub mod failover;
pub mod host;
pub mod hostile;
pub mod idle;
pub mod mcp;
pub mod node;
pub mod procmem;
pub mod qmp;
pub mod rate;
pub mod restore;
pub mod scratch;
pub mod script;
pub mod stats;
pub mod storage;
pub mod store_latency;
pub mod templates;
pub mod volume_copies;
