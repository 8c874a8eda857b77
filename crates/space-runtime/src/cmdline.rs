//! The QEMU command line of a sandbox, as a pure function of [`QemuConfig`].
//!
//! Everything a sandbox owns lives in its directory under fixed names, and QEMU runs with that
//! directory as its working directory, so the command line names those files by *relative*
//! paths. Restoring a snapshot therefore needs only a directory holding clones of the snapshot's
//! files: the same command line finds that clone's disk, RAM file and sockets. (QEMU's migration
//! stream itself names devices, never host paths; relative paths keep the command line, and
//! later a chroot jail, equally location-free, and keep socket paths far below the 108-byte
//! `sockaddr_un` limit.) Boot and restore share this builder, which is what makes a restore's
//! machine identical to the one that was snapshotted.

use std::ffi::OsString;
use std::path::PathBuf;

use crate::accel::Accel;

/// TCG with a 64 MiB translation-block cache. QEMU's default (1 GiB of anonymous memory)
/// grows with every new guest process it translates and outgrows the memory a jailed VM may
/// use beyond its RAM ([`crate::jail::JailConfig::memory_overhead_mib`]); the memory cgroup
/// then evicts the guest's RAM (a file) instead, and the guest stalls re-reading it from disk.
/// A smaller cache only costs retranslations.
pub const TCG_ACCEL: &str = "tcg,tb-size=64";

/// Guest RAM, a file mapped shared so snapshots can clone it instead of streaming it.
pub const MEM_FILE: &str = "mem";
/// The guest's root disk (raw ext4).
pub const DISK_FILE: &str = "rootfs.ext4";
/// The block backend id of the root disk (what QMP's `block_resize` names).
pub const DISK_DRIVE_ID: &str = "root";
/// Serial console output.
pub const CONSOLE_LOG: &str = "console.log";
/// QEMU's own stderr.
pub const QEMU_LOG: &str = "qemu.log";
/// QMP control socket.
pub const QMP_SOCKET: &str = "qmp.sock";
/// Host end of the `space.ctl` virtio-serial port (host asks, guest answers).
pub const CTL_SOCKET: &str = "ctl.sock";
/// Host end of the `space.egress` virtio-serial port (guest opens connections out).
pub const EGRESS_SOCKET: &str = "egress.sock";
/// The VMM's pid, written by the runtime once QEMU runs (for adoption after a restart).
pub const PID_FILE: &str = "qemu.pid";
/// How the VMM was started (machine config, kernel, jail), written with the pidfile; adoption
/// checks the running process against it.
pub const RECORD_FILE: &str = "qemu.json";
/// The kernel, linked into the sandbox directory for a jailed VMM (which sees nothing else of
/// the host's files).
pub const KERNEL_FILE: &str = "vmlinux";
/// Device state written by a snapshot (inside the snapshot directory).
pub const STATE_FILE: &str = "state";
/// Snapshot description (inside the snapshot directory), written last.
pub const MANIFEST_FILE: &str = "manifest.json";

/// Name of the control port inside the guest (`/sys/class/virtio-ports/*/name`).
pub const CTL_PORT_NAME: &str = "space.ctl";
/// Name of the egress port inside the guest.
pub const EGRESS_PORT_NAME: &str = "space.egress";

/// Kernel arguments used when a boot does not name its own.
///
/// `console=ttyS0 quiet`: under emulation every console byte is a trap, so the boot log stays
/// short. `panic=-1` reboots on panic and `-no-reboot` turns that reboot into a QEMU exit the
/// runtime sees. `reboot=t` reboots through the triple-fault path, which needs no ACPI or
/// keyboard controller (microvm has neither). `no_timer_check`: the boot-time check that the
/// IO-APIC timer ticks is a timing test, and an emulated guest on a loaded host fails it and
/// panics ("IO-APIC + timer doesn't work!"); the timer works, the check is what's unreliable.
pub const DEFAULT_KERNEL_CMDLINE: &str =
    "console=ttyS0 root=/dev/vda rw quiet panic=-1 reboot=t no_timer_check";

/// Machine options: microvm without ACPI (the guest kernel has none; QEMU then announces the
/// virtio-mmio slots on the kernel command line) with RAM from the `mem` backend.
const MACHINE: &str = "microvm,acpi=off,memory-backend=mem";

/// QEMU's own seccomp policy: no spawning (nothing should run a shell), no privilege or
/// scheduling changes, no obsolete syscalls.
const SANDBOX: &str = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny";

/// Everything that decides the shape of a sandbox's machine. Two QEMUs built from equal
/// configs can migrate state between them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QemuConfig {
    /// How guest code executes.
    pub accel: Accel,
    /// Number of vCPUs.
    pub vcpus: u32,
    /// Guest RAM in MiB; also the size of the `mem` file.
    pub memory_mib: u64,
    /// Uncompressed ELF `vmlinux` with a PVH note: an absolute host path, or
    /// [`KERNEL_FILE`] (relative) for a jailed VMM.
    pub kernel: PathBuf,
    /// Kernel command line.
    pub kernel_cmdline: String,
    /// Start waiting for `migrate-incoming` instead of booting (restore).
    pub incoming: bool,
}

/// The arguments after the binary name. Starts the machine paused (`-S`): the runtime connects
/// QMP and configures migration before any guest instruction runs.
pub fn build(cfg: &QemuConfig) -> Vec<OsString> {
    let mut args: Vec<OsString> = Vec::with_capacity(64);
    let mut push = |parts: &[&str]| args.extend(parts.iter().map(OsString::from));

    push(&[
        "-nodefaults",
        "-no-user-config",
        "-nographic",
        "-no-reboot",
        "-S",
    ]);
    // Threads named after what they run (`CPU 0/TCG`, `worker`, ...), for top and the bench.
    push(&["-name", "space,debug-threads=on"]);
    push(&["-sandbox", SANDBOX]);
    push(&["-M", MACHINE]);
    match cfg.accel {
        Accel::Kvm => push(&["-accel", "kvm", "-cpu", "host"]),
        // `max` is fixed per QEMU version (unlike `host`), so it is reproducible on restore.
        Accel::Tcg => push(&["-accel", TCG_ACCEL, "-cpu", "max"]),
    }
    let vcpus = cfg.vcpus.to_string();
    let mem = format!("{}M", cfg.memory_mib);
    push(&["-smp", &vcpus, "-m", &mem]);
    let backend = format!("memory-backend-file,id=mem,size={mem},mem-path={MEM_FILE},share=on");
    push(&["-object", &backend]);

    let console = format!("file,id=console,path={CONSOLE_LOG},append=on");
    push(&["-chardev", &console, "-serial", "chardev:console"]);

    let drive = format!("file={DISK_FILE},format=raw,if=none,id={DISK_DRIVE_ID},discard=unmap");
    let blk = format!("virtio-blk-device,drive={DISK_DRIVE_ID}");
    push(&["-drive", &drive, "-device", &blk]);
    push(&["-device", "virtio-rng-device"]);

    // Port 0 of a virtio-serial bus is reserved for a console; ours are 1 and 2.
    push(&["-device", "virtio-serial-device,id=vser"]);
    for (id, path, name, nr) in [
        ("ctl", CTL_SOCKET, CTL_PORT_NAME, 1),
        ("egress", EGRESS_SOCKET, EGRESS_PORT_NAME, 2),
    ] {
        let chardev = format!("socket,id={id},path={path},server=on,wait=off");
        let port = format!("virtserialport,bus=vser.0,chardev={id},name={name},nr={nr}");
        push(&["-chardev", &chardev, "-device", &port]);
    }

    let qmp = format!("socket,id=qmp,path={QMP_SOCKET},server=on,wait=off");
    push(&["-chardev", &qmp, "-mon", "chardev=qmp,mode=control"]);

    args.push("-kernel".into());
    args.push(cfg.kernel.clone().into_os_string());
    args.push("-append".into());
    args.push(cfg.kernel_cmdline.clone().into());
    if cfg.incoming {
        args.push("-incoming".into());
        args.push("defer".into());
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(accel: Accel, incoming: bool) -> QemuConfig {
        QemuConfig {
            accel,
            vcpus: 2,
            memory_mib: 256,
            kernel: PathBuf::from("/cache/kernel/vmlinux"),
            kernel_cmdline: DEFAULT_KERNEL_CMDLINE.to_owned(),
            incoming,
        }
    }

    fn strings(args: &[OsString]) -> Vec<String> {
        args.iter()
            .map(|a| a.to_str().unwrap().to_owned())
            .collect()
    }

    /// The value following `flag`, for every occurrence.
    fn values<'a>(args: &'a [String], flag: &str) -> Vec<&'a str> {
        args.windows(2)
            .filter(|w| w[0] == flag)
            .map(|w| w[1].as_str())
            .collect()
    }

    #[test]
    fn full_command_line_for_tcg() {
        let args = strings(&build(&config(Accel::Tcg, false)));
        let expected =
            "-nodefaults -no-user-config -nographic -no-reboot -S -name space,debug-threads=on \
            -sandbox on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny \
            -M microvm,acpi=off,memory-backend=mem -accel tcg,tb-size=64 -cpu max -smp 2 -m 256M \
            -object memory-backend-file,id=mem,size=256M,mem-path=mem,share=on \
            -chardev file,id=console,path=console.log,append=on -serial chardev:console \
            -drive file=rootfs.ext4,format=raw,if=none,id=root,discard=unmap \
            -device virtio-blk-device,drive=root -device virtio-rng-device \
            -device virtio-serial-device,id=vser \
            -chardev socket,id=ctl,path=ctl.sock,server=on,wait=off \
            -device virtserialport,bus=vser.0,chardev=ctl,name=space.ctl,nr=1 \
            -chardev socket,id=egress,path=egress.sock,server=on,wait=off \
            -device virtserialport,bus=vser.0,chardev=egress,name=space.egress,nr=2 \
            -chardev socket,id=qmp,path=qmp.sock,server=on,wait=off -mon chardev=qmp,mode=control \
            -kernel /cache/kernel/vmlinux";
        let joined = args.join(" ");
        assert!(joined.starts_with(expected), "{joined}");
        assert_eq!(values(&args, "-append"), [DEFAULT_KERNEL_CMDLINE]);
        assert!(!args.iter().any(|a| a == "-incoming"));
    }

    #[test]
    fn kvm_uses_host_cpu() {
        let args = strings(&build(&config(Accel::Kvm, false)));
        assert_eq!(values(&args, "-accel"), ["kvm"]);
        assert_eq!(values(&args, "-cpu"), ["host"]);
    }

    #[test]
    fn restore_differs_only_by_incoming() {
        let boot = strings(&build(&config(Accel::Tcg, false)));
        let restore = strings(&build(&config(Accel::Tcg, true)));
        assert_eq!(&restore[..boot.len()], &boot[..]);
        assert_eq!(&restore[boot.len()..], ["-incoming", "defer"]);
    }

    #[test]
    fn sandbox_files_are_relative() {
        // Every path-valued option except the kernel must stay inside the working directory.
        let args = strings(&build(&config(Accel::Tcg, false)));
        for arg in &args {
            for part in arg.split(',') {
                if let Some(v) = part
                    .strip_prefix("path=")
                    .or(part.strip_prefix("mem-path="))
                {
                    assert!(!v.starts_with('/') && !v.contains(".."), "{arg}");
                }
                if let Some(v) = part.strip_prefix("file=") {
                    assert!(!v.starts_with('/') && !v.contains(".."), "{arg}");
                }
            }
        }
    }

    #[test]
    fn kernel_path_with_commas_is_passed_verbatim() {
        // `-kernel` and `-append` take whole arguments, so no QEMU option escaping applies.
        let mut cfg = config(Accel::Tcg, false);
        cfg.kernel = PathBuf::from("/odd,path/vmlinux");
        cfg.kernel_cmdline = "a=1,2 b".into();
        let args = strings(&build(&cfg));
        assert_eq!(values(&args, "-kernel"), ["/odd,path/vmlinux"]);
        assert_eq!(values(&args, "-append"), ["a=1,2 b"]);
    }
}
