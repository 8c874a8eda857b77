//! The record of a new sandbox, and the checks its options pass first.

use super::*;

/// Limits on what a create may ask for.
const MAX_VCPUS: u32 = 64;
const MIN_MEMORY_MIB: u64 = 64;
const MAX_MEMORY_MIB: u64 = 1 << 20;
const MAX_METADATA_BYTES: usize = 64 * 1024;
const MAX_ENV_BYTES: usize = 256 * 1024;
/// vCPUs, memory and root disk size of a new sandbox's VM.
pub(crate) struct MachineShape {
    pub vcpus: u32,
    pub memory_mib: u64,
    pub disk_mib: u64,
}

pub(crate) fn new_record(
    id: SandboxId,
    template: crate::ids::TemplateRef,
    options: SandboxOptions,
    shape: MachineShape,
    origin: Origin,
    forked_from: Option<(SandboxId, SnapshotId)>,
    owner: Owner,
) -> SandboxRecord {
    let MachineShape {
        vcpus,
        memory_mib,
        disk_mib,
    } = shape;
    let now = now_ms();
    SandboxRecord {
        format: RECORD_FORMAT,
        id,
        template,
        options,
        vcpus,
        memory_mib,
        disk_mib,
        state: State::Creating,
        pending: Some(Pending {
            request: if forked_from.is_some() {
                Intent::Fork
            } else {
                Intent::Create
            },
            target: State::Running,
            snapshot: forked_from.as_ref().map(|(_, s)| s.clone()),
            started_unix_ms: now,
        }),
        origin,
        restore_point: None,
        forked_from,
        snapshots: Vec::new(),
        failure: None,
        created_unix_ms: now,
        state_since_unix_ms: now,
        started_unix_ms: now,
        last_activity_unix_ms: now,
        recoveries: Vec::new(),
        tenant: owner.tenant,
        lineage: owner.lineage,
        shredded_unix_ms: None,
        epoch: 0,
        guest: Default::default(),
        prefetch: Vec::new(),
    }
}

/// Who owns a new sandbox and which lineage its archive joins.
pub(crate) struct Owner {
    pub tenant: String,
    /// `None`: a lineage of its own (named by its id).
    pub lineage: Option<String>,
}

pub(super) fn validate_options(o: &SandboxOptions, t: &Template, max_disk_mib: u64) -> Result<()> {
    if let Some(v) = o.vcpus {
        if v == 0 || v > MAX_VCPUS {
            return Err(NodeError::Invalid(format!(
                "vcpus must be 1..={MAX_VCPUS}, not {v}"
            )));
        }
    }
    if let Some(m) = o.memory_mib {
        if !(MIN_MEMORY_MIB..=MAX_MEMORY_MIB).contains(&m) {
            return Err(NodeError::Invalid(format!(
                "memory must be {MIN_MEMORY_MIB}..={MAX_MEMORY_MIB} MiB, not {m}"
            )));
        }
    }
    if let Some(d) = o.disk_mib {
        let image_mib = t.image_mib();
        if d < image_mib {
            return Err(NodeError::Invalid(format!(
                "disk size {d} MiB is smaller than the {image_mib} MiB image of template {}: a \
                 disk cannot shrink (omit the disk size for the image's own)",
                t.template_ref()
            )));
        }
        if d > max_disk_mib {
            return Err(NodeError::Invalid(format!(
                "disk size {d} MiB is over this node's maximum of {max_disk_mib} MiB"
            )));
        }
    }
    let mut env_bytes = 0;
    for (k, v) in &o.env {
        if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
            return Err(NodeError::Invalid(format!(
                "environment variable {k:?}: names must be non-empty without '=' or NUL, values \
                 without NUL"
            )));
        }
        env_bytes += k.len() + v.len() + 2;
    }
    if env_bytes > MAX_ENV_BYTES {
        return Err(NodeError::Invalid(format!(
            "environment is {env_bytes} bytes; the limit is {MAX_ENV_BYTES}"
        )));
    }
    o.egress.validate().map_err(NodeError::Invalid)?;
    space_gateway::validate_bindings(&o.secrets).map_err(NodeError::Invalid)?;
    for b in &o.secrets {
        if o.env.get(&b.name).is_some_and(|v| v != &b.placeholder) {
            return Err(NodeError::Invalid(format!(
                "environment variable {} is a bound credential's name: the sandbox gets its \
                 placeholder there; remove it from the environment",
                b.name
            )));
        }
    }
    validate_mounts(&o.volumes)?;
    let meta: usize = o.metadata.iter().map(|(k, v)| k.len() + v.len()).sum();
    if meta > MAX_METADATA_BYTES {
        return Err(NodeError::Invalid(format!(
            "metadata is {meta} bytes; the limit is {MAX_METADATA_BYTES}"
        )));
    }
    validate_timeouts(&o.timeouts)
}

pub(super) fn validate_timeouts(t: &TimeoutPolicy) -> Result<()> {
    for (what, d) in [("idle timeout", t.idle), ("max lifetime", t.max_lifetime)] {
        if d == Some(Duration::ZERO) {
            return Err(NodeError::Invalid(format!(
                "{what} must be positive (omit it for none)"
            )));
        }
    }
    Ok(())
}

/// The volumes of a create: at most [`space_node_api::sandbox::MAX_MOUNTS`], volume ids,
/// mount points a guest takes, none twice, no volume twice.
pub(super) fn validate_mounts(mounts: &[space_node_api::VolumeMount]) -> Result<()> {
    use space_node_api::sandbox::{valid_volume_id, MAX_MOUNTS};
    if mounts.len() > MAX_MOUNTS {
        return Err(NodeError::Invalid(format!(
            "{} volumes; a sandbox mounts at most {MAX_MOUNTS}",
            mounts.len()
        )));
    }
    let mut paths = std::collections::HashSet::new();
    let mut ids = std::collections::HashSet::new();
    for m in mounts {
        if !valid_volume_id(&m.volume) {
            return Err(NodeError::Invalid(format!(
                "{:?} is not a volume id",
                m.volume
            )));
        }
        space_proto::volume::check_mount_path(&m.path).map_err(NodeError::Invalid)?;
        if !paths.insert(m.path.trim_end_matches('/')) {
            return Err(NodeError::Invalid(format!("two volumes at {}", m.path)));
        }
        if !ids.insert(m.volume.as_str()) {
            return Err(NodeError::Invalid(format!(
                "volume {} mounted twice",
                m.name
            )));
        }
        if m.name.is_empty() || m.name.len() > 64 || m.name.contains(['\0', ',', ' ']) {
            return Err(NodeError::Invalid(format!("volume name {:?}", m.name)));
        }
    }
    Ok(())
}
