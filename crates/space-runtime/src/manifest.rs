//! The manifest of a full snapshot: what a QEMU must look like to restore it.
//!
//! Migration state only loads into a machine of the same shape, built by the same QEMU, with
//! the same kernel image (its ROMs travel in the state, its code in the RAM file). A mismatch
//! would surface as an obscure migration failure or, worse, a guest that runs on wrong memory.
//! So every snapshot carries this small JSON file, written last (its presence marks a complete
//! snapshot), and a restore checks it before starting anything.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::accel::Accel;
use crate::qmp::QemuVersion;

/// Bumped whenever the snapshot layout or the machine shape changes incompatibly.
pub const FORMAT_VERSION: u32 = 1;

/// Manifests are a few hundred bytes; anything larger is not ours.
const MAX_MANIFEST: u64 = 64 * 1024;

/// Identity of the kernel image a snapshot was taken with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelInfo {
    /// Where it was; a restore uses it unless told otherwise.
    pub path: PathBuf,
    /// Size in bytes.
    pub size: u64,
    /// SHA-256 of the file, hex.
    pub sha256: String,
}

/// Everything a restore needs to rebuild the machine, and to refuse a snapshot it cannot load.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Layout version ([`FORMAT_VERSION`]).
    pub format: u32,
    /// The QEMU that wrote the state.
    pub qemu: QemuVersion,
    /// Accelerator the guest ran under (CPU models differ between them).
    pub accel: Accel,
    /// vCPU count.
    pub vcpus: u32,
    /// Guest RAM in MiB (the `mem` file's size).
    pub memory_mib: u64,
    /// Kernel image.
    pub kernel: KernelInfo,
    /// Kernel command line.
    pub kernel_cmdline: String,
    /// Size of the device-state file.
    pub state_bytes: u64,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
}

/// Errors reading, writing or checking a manifest.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// Reading or writing the file failed.
    #[error("{op} {path}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The file is larger than any manifest this code writes.
    #[error("{0} is larger than {MAX_MANIFEST} bytes; not a snapshot manifest")]
    TooLarge(PathBuf),
    /// The file is not a manifest.
    #[error("parsing {path}")]
    Parse {
        /// The file involved.
        path: PathBuf,
        /// The parser's complaint.
        source: serde_json::Error,
    },
    /// Written by an incompatible version of this code.
    #[error(
        "snapshot format {found} is not supported (this runtime reads format {FORMAT_VERSION})"
    )]
    Format {
        /// The snapshot's format.
        found: u32,
    },
    /// Written by a different QEMU build.
    #[error("snapshot was taken with QEMU {snapshot}, this host runs QEMU {host}")]
    QemuVersion {
        /// The snapshot's QEMU.
        snapshot: QemuVersion,
        /// This host's QEMU.
        host: QemuVersion,
    },
    /// Taken under the other accelerator.
    #[error("snapshot was taken under {snapshot}, this runtime uses {host}")]
    Accel {
        /// The snapshot's accelerator.
        snapshot: Accel,
        /// This runtime's accelerator.
        host: Accel,
    },
    /// A file of the snapshot does not match the manifest.
    #[error("snapshot file {path} is {found} bytes, the manifest says {expected}")]
    Size {
        /// The file involved.
        path: PathBuf,
        /// Its size.
        found: u64,
        /// The size the manifest implies.
        expected: u64,
    },
    /// The kernel to restore with is not the one the snapshot booted.
    #[error("kernel {path} does not match the snapshot's kernel (size {size}, sha256 {sha256})")]
    Kernel {
        /// The kernel offered for the restore.
        path: PathBuf,
        /// The snapshot's kernel size.
        size: u64,
        /// The snapshot's kernel hash.
        sha256: String,
    },
    /// The manifest is internally inconsistent.
    #[error("invalid manifest: {0}")]
    Invalid(String),
}

/// Why [`Manifest::parse`] refused some bytes.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// Not a manifest's JSON.
    #[error("not a snapshot manifest: {0}")]
    Json(#[source] serde_json::Error),
    /// A manifest this host cannot use.
    #[error(transparent)]
    Manifest(ManifestError),
}

impl Manifest {
    /// Reads and parses `dir/manifest.json`, bounded in size.
    pub fn read(path: &Path) -> Result<Self, ManifestError> {
        let io = |op| {
            move |source| ManifestError::Io {
                op,
                path: path.to_owned(),
                source,
            }
        };
        let meta = std::fs::metadata(path).map_err(io("reading"))?;
        if meta.len() > MAX_MANIFEST {
            return Err(ManifestError::TooLarge(path.to_owned()));
        }
        let bytes = std::fs::read(path).map_err(io("reading"))?;
        if bytes.len() as u64 > MAX_MANIFEST {
            return Err(ManifestError::TooLarge(path.to_owned()));
        }
        Self::parse(&bytes).map_err(|e| match e {
            ParseError::Json(source) => ManifestError::Parse {
                path: path.to_owned(),
                source,
            },
            ParseError::Manifest(e) => e,
        })
    }

    /// Parses and checks a manifest's bytes (what [`Manifest::read`] does after reading).
    pub fn parse(bytes: &[u8]) -> Result<Self, ParseError> {
        if bytes.len() as u64 > MAX_MANIFEST {
            return Err(ParseError::Manifest(ManifestError::Invalid(format!(
                "{} bytes is larger than a manifest can be",
                bytes.len()
            ))));
        }
        let manifest: Manifest = serde_json::from_slice(bytes).map_err(ParseError::Json)?;
        if manifest.format != FORMAT_VERSION {
            return Err(ParseError::Manifest(ManifestError::Format {
                found: manifest.format,
            }));
        }
        if manifest.vcpus == 0 || manifest.memory_mib == 0 || manifest.memory_mib > 1 << 30 {
            return Err(ParseError::Manifest(ManifestError::Invalid(
                "vcpus and memory must be positive".into(),
            )));
        }
        Ok(manifest)
    }

    /// Writes the manifest atomically and durably ([`space_fs::write_atomic`]), so a reader
    /// sees either no manifest or a whole one.
    pub fn write(&self, path: &Path) -> Result<(), ManifestError> {
        let bytes = serde_json::to_vec_pretty(self).expect("a manifest always serializes");
        space_fs::write_atomic(path, &bytes, 0o644).map_err(|e| ManifestError::Io {
            op: e.op,
            path: e.path,
            source: e.source,
        })
    }

    /// Refuses snapshots this host cannot load.
    pub fn check_host(&self, qemu: &QemuVersion, accel: Accel) -> Result<(), ManifestError> {
        if &self.qemu != qemu {
            return Err(ManifestError::QemuVersion {
                snapshot: self.qemu.clone(),
                host: qemu.clone(),
            });
        }
        if self.accel != accel {
            return Err(ManifestError::Accel {
                snapshot: self.accel,
                host: accel,
            });
        }
        Ok(())
    }

    /// The size the RAM file must have.
    pub fn memory_bytes(&self) -> u64 {
        self.memory_mib << 20
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Manifest {
        Manifest {
            format: FORMAT_VERSION,
            qemu: QemuVersion {
                major: 7,
                minor: 2,
                micro: 22,
                package: "Debian".into(),
            },
            accel: Accel::Tcg,
            vcpus: 1,
            memory_mib: 256,
            kernel: KernelInfo {
                path: "/k/vmlinux".into(),
                size: 10,
                sha256: "ab".into(),
            },
            kernel_cmdline: "console=ttyS0".into(),
            state_bytes: 58_000,
            created_unix_ms: 1,
        }
    }

    #[test]
    fn round_trip_and_checks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("manifest.json");
        let m = sample();
        m.write(&path).unwrap();
        let back = Manifest::read(&path).unwrap();
        assert_eq!(back, m);
        assert!(!dir.path().join("manifest.json.tmp").exists());

        m.check_host(&m.qemu, Accel::Tcg).unwrap();
        let other = QemuVersion {
            micro: 23,
            ..m.qemu.clone()
        };
        let err = m.check_host(&other, Accel::Tcg).unwrap_err();
        assert!(
            err.to_string().contains("7.2.22") && err.to_string().contains("7.2.23"),
            "{err}"
        );
        assert!(matches!(
            m.check_host(&m.qemu, Accel::Kvm),
            Err(ManifestError::Accel { .. })
        ));
        assert_eq!(m.memory_bytes(), 256 << 20);
    }

    #[test]
    fn rejects_other_formats_garbage_and_huge_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("manifest.json");
        let mut m = sample();
        m.format = FORMAT_VERSION + 1;
        m.write(&path).unwrap();
        assert!(matches!(
            Manifest::read(&path),
            Err(ManifestError::Format { .. })
        ));

        std::fs::write(&path, b"{\"format\": 1}").unwrap();
        assert!(matches!(
            Manifest::read(&path),
            Err(ManifestError::Parse { .. })
        ));

        std::fs::write(&path, vec![b' '; 100_000]).unwrap();
        assert!(matches!(
            Manifest::read(&path),
            Err(ManifestError::TooLarge(_))
        ));

        let mut m = sample();
        m.memory_mib = 0;
        m.write(&path).unwrap();
        assert!(matches!(
            Manifest::read(&path),
            Err(ManifestError::Invalid(_))
        ));
    }
}
