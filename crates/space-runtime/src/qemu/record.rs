//! What the runtime records about a VMM it started, and how it recognises that process later.

use super::*;

/// What the runtime records about a VMM it started (`qemu.json`), to recognise it later.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(super) struct VmRecord {
    pub(super) pid: u32,
    /// Start time in clock ticks after boot (`/proc/<pid>/stat` field 22): with the pid, it
    /// identifies one process for the life of the host.
    pub(super) start_ticks: u64,
    /// The QEMU binary (absolute).
    pub(super) qemu: PathBuf,
    /// The machine (its command line is rebuilt from this and compared).
    pub(super) config: QemuConfig,
    /// The kernel as snapshots must record it.
    pub(super) kernel: KernelInfo,
    /// The jail, if any.
    pub(super) jail: Option<JailRecord>,
}

/// Largest `qemu.json` accepted.
const MAX_RECORD_BYTES: u64 = 64 << 10;

impl VmRecord {
    /// Writes `qemu.json`, then `qemu.pid`, each atomically and durably.
    /// Owned by root with mode 0600: a jailed VMM can neither read nor, thanks to the sticky
    /// directory, replace them.
    pub(super) fn write(&self, dir: &Path) -> Result<()> {
        let json = serde_json::to_vec_pretty(self).expect("record serializes");
        write_atomic(&dir.join(cmdline::RECORD_FILE), &json)?;
        write_atomic(
            &dir.join(cmdline::PID_FILE),
            format!("{}\n", self.pid).as_bytes(),
        )
    }

    pub(super) fn read(dir: &Path) -> std::result::Result<VmRecord, String> {
        let path = dir.join(cmdline::RECORD_FILE);
        let f = File::open(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        use std::io::Read;
        let mut bytes = Vec::new();
        f.take(MAX_RECORD_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        if bytes.len() as u64 > MAX_RECORD_BYTES {
            return Err(format!("{} is too large", path.display()));
        }
        serde_json::from_slice(&bytes).map_err(|e| format!("parsing {}: {e}", path.display()))
    }
}

/// Writes a root-only (0600) file durably ([`space_fs::write_atomic`]).
pub(super) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    space_fs::write_atomic(path, bytes, 0o600).map_err(|e| Error::Io {
        op: e.op,
        path: e.path,
        source: e.source,
    })
}

/// Field 22 of `/proc/<pid>/stat`, and the state (field 3).
pub(crate) fn proc_stat(pid: u32) -> Option<(char, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may contain anything.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((state, start))
}

pub(crate) fn proc_start_ticks(pid: u32) -> Option<u64> {
    proc_stat(pid).map(|(_, t)| t)
}

/// Checks that `pid` is the VMM `record` describes, running for `dir`.
pub(super) fn verify_process(
    pid: u32,
    record: &VmRecord,
    dir: &Path,
) -> std::result::Result<(), String> {
    let (state, start) = proc_stat(pid).ok_or_else(|| format!("process {pid} is gone"))?;
    if matches!(state, 'Z' | 'X') {
        return Err(format!("process {pid} has exited"));
    }
    if start != record.start_ticks {
        return Err(format!(
            "pid {pid} now belongs to another process (started at tick {start}, \
             the VMM at {})",
            record.start_ticks
        ));
    }
    let same = |a: &Path, b: &Path| match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    };
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    if !same(&proc_dir.join("exe"), &record.qemu) {
        return Err(format!(
            "process {pid} does not run {}",
            record.qemu.display()
        ));
    }
    let place = if record.jail.is_some() { "root" } else { "cwd" };
    if !same(&proc_dir.join(place), dir) {
        return Err(format!(
            "process {pid} runs elsewhere (its {place} is not {})",
            dir.display()
        ));
    }
    let cmdline = std::fs::read(proc_dir.join("cmdline"))
        .map_err(|e| format!("reading the command line of {pid}: {e}"))?;
    let mut expected: Vec<u8> = Vec::new();
    for arg in
        std::iter::once(record.qemu.clone().into_os_string()).chain(cmdline::build(&record.config))
    {
        use std::os::unix::ffi::OsStrExt;
        expected.extend_from_slice(arg.as_bytes());
        expected.push(0);
    }
    if cmdline != expected {
        return Err(format!(
            "process {pid} has another command line than the one recorded"
        ));
    }
    Ok(())
}
