//! Shared pieces of the runtime's integration tests: locating the kernel and images the
//! Makefile provides, a throwaway busybox guest that runs shell lines sent over `space.ctl`,
//! and a client for it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use space_runtime::{BootSpec, QemuRuntime, QemuRuntimeConfig, Vm};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

/// A path from the environment, or a panic that says how to get it set.
pub fn env_path(var: &str) -> PathBuf {
    match std::env::var_os(var) {
        Some(v) if !v.is_empty() => {
            let p = PathBuf::from(v);
            assert!(p.exists(), "{var}={} does not exist", p.display());
            p
        }
        _ => panic!(
            "{var} is not set: these tests boot real guests; run them with `make test`, \
             which builds the kernel and images and sets SPACE_KERNEL, SPACE_ROOTFS_MINIMAL \
             and SPACE_ROOTFS_BASE"
        ),
    }
}

/// The guest kernel.
pub fn kernel() -> PathBuf {
    env_path("SPACE_KERNEL")
}

pub async fn runtime() -> QemuRuntime {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("space_runtime=debug")
        .with_test_writer()
        .try_init();
    // As root the runtime jails its VMMs by default. For comparisons: `SPACE_JAIL=off` (no
    // jail), `nocpu` (no CPU quota), `nocg` (no cgroups).
    let mut config = QemuRuntimeConfig::default();
    match std::env::var("SPACE_JAIL").as_deref() {
        Ok("off") => config.jail = None,
        Ok("nocpu") => config.jail.iter_mut().for_each(|j| j.limit_cpu = false),
        Ok("nocg") => config.jail.iter_mut().for_each(|j| j.cgroups = false),
        _ => {}
    }
    QemuRuntime::new(config).await.expect("QEMU runtime")
}

/// `/sbin/init` of the shell guest: mounts the basics, opens the `space.ctl` port once and
/// runs each line `<id> <command>` it receives with `sh -c`, answering with the output and
/// `__done <id> <status>` (the id lets a new connection skip answers meant for an old one).
/// `__exit` makes init exit (the kernel then panics and QEMU exits).
const SHELL_INIT: &str = r#"#!/bin/sh
mount -t devtmpfs dev /dev
mount -t proc proc /proc
mount -t sysfs sys /sys
mkdir -p /tmp && mount -t tmpfs tmp /tmp
port=
for p in /sys/class/virtio-ports/*; do
    [ "$(cat "$p/name")" = space.ctl ] && port=/dev/${p##*/}
done
echo "shell-guest: serving on $port"
exec 3<>"$port"
while true; do
    while IFS= read -r line <&3; do
        [ "$line" = __exit ] && exit 0
        id=${line%% *}
        sh -c "${line#* }" </dev/null >&3 2>&3
        echo "__done $id $?" >&3
    done
    # The host end is not connected: reads return end-of-file until it is.
    usleep 20000
done
"#;

/// Builds the shell guest's root image in `dir` (busybox-static and e2fsprogs must be
/// installed) and returns its path.
pub fn build_shell_image(dir: &Path) -> PathBuf {
    let stage = dir.join("stage");
    for d in [
        "bin", "sbin", "dev", "proc", "sys", "tmp", "data", "usr/bin", "usr/sbin",
    ] {
        std::fs::create_dir_all(stage.join(d)).unwrap();
    }
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .expect("busybox-static must be installed");
    std::fs::copy(&busybox, stage.join("bin/busybox")).unwrap();
    let listing = Command::new(&busybox).arg("--list").output().unwrap();
    for applet in String::from_utf8(listing.stdout).unwrap().lines() {
        let link = stage.join("bin").join(applet);
        if !link.exists() {
            std::os::unix::fs::symlink("busybox", link).unwrap();
        }
    }
    let init = stage.join("sbin/init");
    std::fs::write(&init, SHELL_INIT).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&init, std::fs::Permissions::from_mode(0o755)).unwrap();
    let image = dir.join("shell.ext4");
    let out = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-L", "shell", "-E", "root_owner=0:0", "-d"])
        .arg(&stage)
        .arg(&image)
        .arg("64M")
        .output()
        .expect("mkfs.ext4 must be installed");
    assert!(
        out.status.success(),
        "mkfs.ext4 failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_dir_all(&stage).unwrap();
    image
}

pub fn boot_spec(dir: &Path, rootfs: &Path) -> BootSpec {
    BootSpec {
        dir: dir.to_owned(),
        kernel: kernel(),
        rootfs: rootfs.to_owned(),
        vcpus: 1,
        memory_mib: 256,
        kernel_cmdline: None,
    }
}

/// A connection to the shell guest.
pub struct Shell {
    reader: BufReader<tokio::net::unix::OwnedReadHalf>,
    writer: tokio::net::unix::OwnedWriteHalf,
}

impl Shell {
    pub fn new(stream: UnixStream) -> Shell {
        let (r, w) = stream.into_split();
        Shell {
            reader: BufReader::new(r),
            writer: w,
        }
    }

    /// Runs `line` in the guest; returns (output, exit status).
    pub async fn run(&mut self, line: &str) -> std::io::Result<(String, i32)> {
        assert!(!line.contains('\n'));
        let id = rand::random::<u64>().to_string();
        self.writer
            .write_all(format!("{id} {line}\n").as_bytes())
            .await?;
        let mut output = String::new();
        loop {
            let mut l = String::new();
            if self.reader.read_line(&mut l).await? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            if let Some(rest) = l.strip_prefix("__done ") {
                let mut parts = rest.split_whitespace();
                if parts.next() == Some(id.as_str()) {
                    let code = parts.next().and_then(|c| c.parse().ok()).unwrap_or(-1);
                    return Ok((output, code));
                }
                // The end of an answer to a command sent on an earlier connection.
                output.clear();
                continue;
            }
            output.push_str(&l);
        }
    }

    /// Sends a line without waiting for an answer.
    pub async fn writer_line(&mut self, line: &str) {
        self.writer
            .write_all(format!("{line}\n").as_bytes())
            .await
            .unwrap();
    }

    /// Runs `line` and insists on success.
    pub async fn ok(&mut self, line: &str) -> String {
        let (out, code) = self.run(line).await.unwrap();
        assert_eq!(code, 0, "`{line}` failed: {out}");
        out
    }
}

/// Connects to the shell guest once it answers, reconnecting with growing per-attempt
/// deadlines (after a restore the first bytes may be lost to the guest's stale reader).
pub async fn wait_shell<V: Vm>(vm: &V, timeout: Duration) -> Shell {
    let deadline = Instant::now() + timeout;
    let mut attempt = Duration::from_millis(250);
    loop {
        if let Err(e) = vm.check_alive() {
            panic!("{e}");
        }
        assert!(
            Instant::now() < deadline,
            "shell guest did not answer in {timeout:?}; console:\n{}",
            vm.console_tail(4096)
        );
        if let Ok(stream) = vm.connect_ctl().await {
            let mut shell = Shell::new(stream);
            if let Ok(Ok((out, 0))) = tokio::time::timeout(attempt, shell.run("echo ping")).await {
                if out == "ping\n" {
                    return shell;
                }
            }
        }
        attempt = (attempt * 2).min(Duration::from_secs(2));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Generous bound for a cold boot under TCG on a loaded 2-core machine.
pub const BOOT_TIMEOUT: Duration = Duration::from_secs(120);
