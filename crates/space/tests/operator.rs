//! What an operator runs by hand: `space up` on its own (no Makefile, no environment), and
//! `space purge`, which must leave no VM, control group, mount, loop device or file behind.

mod common;

use std::path::PathBuf;

use common::{json, ok, stderr, TestServer};

/// The cgroup directories a process is in (beyond the root), as `/proc/PID/cgroup` names them.
fn cgroup_dirs(pid: u32) -> Vec<PathBuf> {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            if path == "/" {
                return None;
            }
            let mount = if controllers.is_empty() {
                "/sys/fs/cgroup".to_owned()
            } else {
                let first = controllers.split(',').next()?;
                std::fs::read_dir("/sys/fs/cgroup")
                    .ok()?
                    .flatten()
                    .map(|e| e.path())
                    .find(|p| {
                        p.file_name()
                            .and_then(|n| n.to_str())
                            .is_some_and(|n| n.split(',').any(|c| c == first))
                    })?
                    .display()
                    .to_string()
            };
            Some(PathBuf::from(mount).join(path.trim_start_matches('/')))
        })
        .collect()
}

#[test]
fn space_up_stands_alone_and_purge_leaves_nothing_behind() {
    // Only --data-dir and --listen (and a small pool): the kernel, the images and guestd come
    // from the artifacts record `scripts/artifacts.sh` wrote into the cache.
    let mut server = TestServer::start_bare(
        ["--templates", "minimal", "--pool-size", "1"]
            .map(String::from)
            .to_vec(),
    );
    let made = json(&server.cli(["create", "--template", "minimal", "--json"]));
    let id = made["id"].as_str().expect("an id").to_owned();
    assert_eq!(
        ok(&server.cli(["exec", &id, "--", "echo", "alone"])).trim(),
        "alone"
    );
    let templates = ok(&server.cli(["template", "ls"]));
    assert!(templates.contains("minimal"), "{templates}");

    let data = server.data_dir.clone();
    let image = {
        let mut name = data.file_name().unwrap().to_owned();
        name.push(".btrfs.img");
        data.with_file_name(name)
    };
    assert!(
        image.is_file(),
        "the loop image {} is missing",
        image.display()
    );
    assert!(!space_node::teardown::loops_of(&image).is_empty());

    // The server stops; its VMs (the sandbox and the pool's) run on, as they do on Ctrl-C.
    server.stop();
    let vms = space_node::teardown::vms_of(&data);
    assert!(
        !vms.is_empty(),
        "no VM runs from {} after the stop",
        data.display()
    );
    let groups: Vec<PathBuf> = vms.iter().flat_map(|p| cgroup_dirs(*p)).collect();
    assert!(
        !groups.is_empty() && groups.iter().all(|g| g.is_dir()),
        "{groups:?}"
    );

    // Without --yes and without a terminal it refuses, and deletes nothing.
    let mut refuse = server.command(None);
    refuse.args(["purge", "--data-dir"]).arg(&data);
    let out = common::run(refuse, None);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--yes"), "{}", stderr(&out));
    assert!(data.join("sandboxes").exists());

    // A directory that is not space's is refused too.
    let stranger = tempfile::tempdir().unwrap();
    std::fs::write(stranger.path().join("precious.txt"), b"keep").unwrap();
    let mut wrong = server.command(None);
    wrong
        .args(["purge", "--yes", "--data-dir"])
        .arg(stranger.path());
    let out = common::run(wrong, None);
    assert!(!out.status.success(), "{}", stderr(&out));
    assert!(stranger.path().join("precious.txt").exists());

    let mut purge = server.command(None);
    purge.args(["purge", "--yes", "--data-dir"]).arg(&data);
    let out = common::run(purge, None);
    assert!(out.status.success(), "purge failed: {}", stderr(&out));
    assert!(space_node::teardown::vms_of(&data).is_empty());
    for g in &groups {
        assert!(!g.exists(), "cgroup {} is left", g.display());
    }
    assert!(!data.exists(), "{} is left", data.display());
    assert!(!image.exists(), "{} is left", image.display());
    assert!(space_node::teardown::loops_of(&image).is_empty());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(&*data.to_string_lossy()),
        "still mounted: {}",
        data.display()
    );
}
