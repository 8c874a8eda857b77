use super::*;

#[test]
fn parses_qemu_version_lines() {
    let v = parse_version_output(
        "QEMU emulator version 7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b3)\nCopyright (c) 2003-2022\n",
    )
    .unwrap();
    assert_eq!((v.major, v.minor, v.micro), (7, 2, 22));
    assert_eq!(v.package, "Debian 1:7.2+dfsg-7+deb12u18+b3");
    let v = parse_version_output("QEMU emulator version 8.0.0\n").unwrap();
    assert_eq!(
        (v.major, v.minor, v.micro, v.package.as_str()),
        (8, 0, 0, "")
    );
    assert!(parse_version_output("something else").is_none());
    assert!(parse_version_output("").is_none());
}

#[test]
fn shapes_are_bounded() {
    assert!(validate_shape(1, 256).is_ok());
    assert!(validate_shape(0, 256).is_err());
    assert!(validate_shape(65, 256).is_err());
    assert!(validate_shape(1, 8).is_err());
    assert!(validate_shape(1, u64::MAX).is_err());
}

#[tokio::test]
async fn long_socket_paths_connect_through_proc() {
    let base = tempfile::tempdir().unwrap();
    let deep = base.path().join("d".repeat(60)).join("e".repeat(60));
    std::fs::create_dir_all(&deep).unwrap();
    assert!(deep.join("x.sock").as_os_str().len() > 108);
    // Bind through the same /proc indirection the client uses.
    let dir_fd = File::open(&deep).unwrap();
    use std::os::fd::AsRawFd;
    let listener =
        tokio::net::UnixListener::bind(format!("/proc/self/fd/{}/x.sock", dir_fd.as_raw_fd()))
            .unwrap();
    let (accepted, connected) = tokio::join!(listener.accept(), connect_in_dir(&deep, "x.sock"));
    accepted.unwrap();
    connected.unwrap();
    assert!(connect_in_dir(&deep, "missing.sock").await.is_err());
}

#[tokio::test]
async fn boot_refuses_bad_specs_without_leaving_files() {
    let rt = QemuRuntime::new(QemuRuntimeConfig {
        accel: Some(Accel::Tcg),
        ..Default::default()
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let spec = BootSpec {
        dir: dir.path().to_owned(),
        kernel: dir.path().join("no-kernel"),
        rootfs: dir.path().join("no-rootfs"),
        vcpus: 1,
        memory_mib: 128,
        kernel_cmdline: None,
    };
    let err = rt.boot(spec.clone()).await.unwrap_err();
    assert!(err.to_string().contains("no-kernel"), "{err}");

    std::fs::write(dir.path().join("kernel"), b"not really a kernel").unwrap();
    let spec = BootSpec {
        kernel: dir.path().join("kernel"),
        ..spec
    };
    let err = rt.boot(spec.clone()).await.unwrap_err();
    assert!(matches!(err, Error::Cow(_)), "{err}");
    assert!(!dir.path().join(cmdline::MEM_FILE).exists());

    let err = rt.boot(BootSpec { vcpus: 0, ..spec }).await.unwrap_err();
    assert!(matches!(err, Error::Invalid(_)), "{err}");
}

#[tokio::test]
async fn qemu_failing_at_start_reports_its_stderr() {
    let rt = QemuRuntime::new(QemuRuntimeConfig {
        accel: Some(Accel::Tcg),
        ..Default::default()
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("kernel"), b"not an ELF kernel").unwrap();
    std::fs::write(dir.path().join("disk"), vec![0u8; 1 << 20]).unwrap();
    let spec = BootSpec {
        dir: dir.path().to_owned(),
        kernel: dir.path().join("kernel"),
        rootfs: dir.path().join("disk"),
        vcpus: 1,
        memory_mib: 64,
        kernel_cmdline: None,
    };
    let err = rt.boot(spec).await.unwrap_err();
    match &err {
        Error::Exited { exit, vmm_log, .. } => {
            assert_eq!(exit.code, Some(1), "{err}");
            assert!(vmm_log.contains("kernel"), "{err}");
        }
        other => panic!("expected Exited, got {other}"),
    }
    // Files the runtime created for the failed boot are gone.
    assert!(!dir.path().join(cmdline::MEM_FILE).exists());
    assert!(!dir.path().join(cmdline::DISK_FILE).exists());
}

#[tokio::test]
async fn a_panic_in_blocking_file_work_is_an_error() {
    let r: Result<()> = blocking(|| -> Result<()> { panic!("no space left") }).await;
    match r {
        Err(Error::Internal(m)) => assert!(m.contains("no space left"), "{m}"),
        other => panic!("{other:?}"),
    }
}
