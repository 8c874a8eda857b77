//! How to run a node.

use super::*;

/// How to run a node.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// The data directory (see `docs/lifecycle.md` for what goes where).
    pub data_dir: PathBuf,
    /// Driver choice and loop image.
    pub storage: StorageOptions,
    /// QEMU binary and accelerator.
    pub qemu: QemuRuntimeConfig,
    /// How long a started VM may take until its guest daemon answers (cold boots under TCG
    /// on a loaded host take seconds).
    pub ready_timeout: Duration,
    /// How often the timeout reconciler runs; `None` disables it (call
    /// [`Node::reconcile_timeouts`] yourself).
    pub timeout_tick: Option<Duration>,
    /// How often each running sandbox's resources are sampled ([`crate::metrics`]); `None`
    /// turns sampling off.
    pub metrics_tick: Option<Duration>,
    /// Restore a VM that dies while the node runs from its newest snapshot (see
    /// [`crate::recovery`]); off: the sandbox becomes Failed.
    pub auto_restore: bool,
    /// Memory, vCPU and sandbox-count limits of VMs on this node.
    pub admission: AdmissionConfig,
    /// Warm pools per template ([`crate::pool`]).
    pub pools: PoolConfig,
    /// Rolling snapshots and retention ([`crate::scheduler`]).
    pub rolling: RollingConfig,
    /// The largest root disk a create may ask for, in MiB.
    pub max_disk_mib: u64,
    /// The egress gateway: limits, extra upstream roots, the secret source and audit sink
    /// ([`space_gateway`]).
    pub gateway: GatewayConfig,
    /// The object store snapshots go to ([`crate::archive`]); `None`: snapshots stay on this
    /// node's disk only.
    pub archive: Option<ArchiveConfig>,
}

impl NodeConfig {
    /// Defaults for `data_dir`.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        NodeConfig {
            data_dir: data_dir.into(),
            storage: StorageOptions::default(),
            // VMs outlive the node process, so a node crash does not take them down: the
            // next node adopts them (crate::recovery).
            qemu: QemuRuntimeConfig {
                detached: true,
                ..QemuRuntimeConfig::default()
            },
            ready_timeout: Duration::from_secs(120),
            timeout_tick: Some(Duration::from_secs(1)),
            metrics_tick: Some(DEFAULT_METRICS_TICK),
            auto_restore: true,
            admission: AdmissionConfig::default(),
            pools: PoolConfig::default(),
            rolling: RollingConfig::default(),
            max_disk_mib: DEFAULT_MAX_DISK_MIB,
            gateway: GatewayConfig::default(),
            archive: None,
        }
    }
}

/// [`NodeConfig::max_disk_mib`] by default: 64 GiB.
pub const DEFAULT_MAX_DISK_MIB: u64 = 64 << 10;

/// [`NodeConfig::metrics_tick`] by default: 5 s.
pub const DEFAULT_METRICS_TICK: Duration = Duration::from_secs(5);
