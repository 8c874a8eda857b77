//! Chooses how guest code executes: KVM when the host really has hardware virtualization, TCG
//! (QEMU's software emulation) otherwise.
//!
//! A `/dev/kvm` that opens is not enough: on PVM hosts it is a software hypervisor without
//! VT-x/AMD-V, and a stock Linux guest dies on it. So KVM needs both the CPU flag (`vmx` or
//! `svm` in `/proc/cpuinfo`) and a read-write open of `/dev/kvm`. Operators can force either
//! with `SPACE_ACCEL=kvm|tcg`. The decision is a pure function of those three inputs, so it is
//! tested on synthetic inputs; [`detect`] only gathers them and logs the outcome once.

use std::fmt;
use std::fs::OpenOptions;

/// Environment variable that overrides detection.
pub const ACCEL_ENV: &str = "SPACE_ACCEL";

/// The execution engine QEMU uses for a guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Accel {
    /// Hardware virtualization through `/dev/kvm`.
    Kvm,
    /// QEMU's dynamic binary translator; runs anywhere, several times slower.
    Tcg,
}

impl Accel {
    /// The name QEMU uses in `-accel`.
    pub fn as_str(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }
}

impl fmt::Display for Accel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What opening `/dev/kvm` read-write did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvmDevice {
    /// The node does not exist.
    Missing,
    /// It exists but the open failed (permissions, a container without the device, ...).
    Unusable(String),
    /// It opened read-write.
    Usable,
}

/// An accelerator plus the reason it was picked, for the log line operators read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// The chosen accelerator.
    pub accel: Accel,
    /// Why, in words an operator can act on.
    pub reason: String,
}

/// Detection errors: only a malformed override can fail, everything else degrades to TCG.
#[derive(Debug, thiserror::Error)]
pub enum AccelError {
    /// `SPACE_ACCEL` holds something other than `kvm` or `tcg`.
    #[error("{ACCEL_ENV} must be `kvm` or `tcg`, not {0:?}")]
    BadOverride(String),
}

/// Whether `/proc/cpuinfo` text advertises hardware virtualization on any CPU.
pub fn cpu_has_virt(cpuinfo: &str) -> bool {
    cpuinfo.lines().any(|line| {
        let Some((key, value)) = line.split_once(':') else {
            return false;
        };
        key.trim() == "flags" && value.split_whitespace().any(|f| f == "vmx" || f == "svm")
    })
}

/// The decision itself: pure, so it can be tested without the host's devices.
pub fn decide(
    cpuinfo: &str,
    kvm: &KvmDevice,
    override_value: Option<&str>,
) -> Result<Decision, AccelError> {
    if let Some(value) = override_value {
        let accel = match value.trim().to_ascii_lowercase().as_str() {
            "kvm" => Accel::Kvm,
            "tcg" => Accel::Tcg,
            _ => return Err(AccelError::BadOverride(value.to_owned())),
        };
        return Ok(Decision {
            accel,
            reason: format!("forced by {ACCEL_ENV}={}", accel.as_str()),
        });
    }
    let has_virt = cpu_has_virt(cpuinfo);
    let (accel, reason) = match (has_virt, kvm) {
        (true, KvmDevice::Usable) => (Accel::Kvm, "cpu has vmx/svm and /dev/kvm opens".to_owned()),
        (true, KvmDevice::Missing) => (
            Accel::Tcg,
            "cpu has vmx/svm but /dev/kvm is missing".to_owned(),
        ),
        (true, KvmDevice::Unusable(e)) => (
            Accel::Tcg,
            format!("cpu has vmx/svm but /dev/kvm does not open read-write ({e})"),
        ),
        (false, KvmDevice::Missing) => (
            Accel::Tcg,
            "cpu has no vmx/svm flag and no /dev/kvm".to_owned(),
        ),
        (false, _) => (
            Accel::Tcg,
            "cpu has no vmx/svm flag (/dev/kvm exists but is not hardware-backed)".to_owned(),
        ),
    };
    Ok(Decision { accel, reason })
}

/// Probes the host and logs the choice. Called once per runtime, not per VM.
pub fn detect() -> Result<Decision, AccelError> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let kvm = match OpenOptions::new().read(true).write(true).open("/dev/kvm") {
        Ok(_) => KvmDevice::Usable,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => KvmDevice::Missing,
        Err(e) => KvmDevice::Unusable(e.to_string()),
    };
    let env = std::env::var(ACCEL_ENV).ok().filter(|v| !v.is_empty());
    let decision = decide(&cpuinfo, &kvm, env.as_deref())?;
    tracing::info!(accel = %decision.accel, "accelerator {}: {}", decision.accel, decision.reason);
    Ok(decision)
}

#[cfg(test)]
mod tests {
    use super::*;

    const INTEL_VMX: &str = "processor\t: 0\nvendor_id\t: GenuineIntel\n\
        flags\t\t: fpu vme de pse tsc msr pae vmx sse4_2 avx2\n\nprocessor\t: 1\n\
        flags\t\t: fpu vme de pse tsc msr pae vmx sse4_2 avx2\n";
    const AMD_SVM: &str = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu svm lm\n";
    const NO_VIRT: &str = "processor\t: 0\nflags\t\t: fpu vme de pse tsc msr pae hypervisor\n\
        vmx flags\t: vnmi preemption_timer\n";

    #[test]
    fn kvm_needs_flag_and_device() {
        let d = decide(INTEL_VMX, &KvmDevice::Usable, None).unwrap();
        assert_eq!(d.accel, Accel::Kvm);
        let d = decide(AMD_SVM, &KvmDevice::Usable, None).unwrap();
        assert_eq!(d.accel, Accel::Kvm);
    }

    #[test]
    fn pvm_device_without_flag_is_tcg() {
        let d = decide(NO_VIRT, &KvmDevice::Usable, None).unwrap();
        assert_eq!(d.accel, Accel::Tcg);
        assert!(d.reason.contains("not hardware-backed"), "{}", d.reason);
    }

    #[test]
    fn flag_without_device_is_tcg() {
        let d = decide(INTEL_VMX, &KvmDevice::Missing, None).unwrap();
        assert_eq!(d.accel, Accel::Tcg);
        let d = decide(
            INTEL_VMX,
            &KvmDevice::Unusable("Permission denied".into()),
            None,
        )
        .unwrap();
        assert_eq!(d.accel, Accel::Tcg);
        assert!(d.reason.contains("Permission denied"));
        let d = decide(NO_VIRT, &KvmDevice::Missing, None).unwrap();
        assert_eq!(d.accel, Accel::Tcg);
    }

    #[test]
    fn flag_names_must_match_whole_words_on_the_flags_line() {
        // "vmx flags" is a separate key on newer kernels; only the `flags` line counts.
        assert!(!cpu_has_virt(NO_VIRT));
        assert!(!cpu_has_virt("flags\t: vmxnet svmx\n"));
        assert!(!cpu_has_virt(""));
        assert!(cpu_has_virt("flags: svm\n"));
    }

    #[test]
    fn override_wins_and_is_validated() {
        let d = decide(NO_VIRT, &KvmDevice::Missing, Some("kvm")).unwrap();
        assert_eq!(d.accel, Accel::Kvm);
        assert!(d.reason.contains(ACCEL_ENV));
        let d = decide(INTEL_VMX, &KvmDevice::Usable, Some(" TCG ")).unwrap();
        assert_eq!(d.accel, Accel::Tcg);
        assert!(matches!(
            decide(INTEL_VMX, &KvmDevice::Usable, Some("hvf")),
            Err(AccelError::BadOverride(v)) if v == "hvf"
        ));
    }
}
