//! Benchmarks of space: the measurements `space-bench` runs and the tables it prints.
//!
//! - [`bench`]: the measurement groups (boot, snapshot, restore, pause, exec, files);
//! - [`bare`]: the reference restore that drives QEMU with the least machinery;
//! - [`qmp`]: the small line-based QMP client the reference restore speaks;
//! - [`scratch`]: the loop-mounted btrfs (or plain) directory a run works in;
//! - [`stats`]: samples, percentiles and the printed tables.

pub mod bare;
pub mod bench;
pub mod qmp;
pub mod scratch;
pub mod stats;
