//! A volume outlives its node: on a cluster of real processes (two `space control` replicas
//! over PostgreSQL, three `space node` processes, Garage), a volume written through the file
//! API and by a guest that mounts it is copied to the object store; its node is killed with
//! SIGKILL; the sandbox that mounted it comes back on another node and the volume follows it
//! there from its copy, with everything that was written before the copy's moment. The file
//! API and new mounts find it on its new node.

mod common;
#[path = "../../space-control/tests/common/postgres.rs"]
mod postgres;
mod processes;

use std::time::{Duration, Instant};

use common::{json, ok};
use processes::{now_ms, sha, Cluster};

/// The volume's `synced_unix_ms` as the API reports it.
fn synced(c: &Cluster, r: usize, name: &str) -> Option<u64> {
    let list = json(&c.cli(r, &["--json", "volume", "ls"]));
    list.as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == name)
        .and_then(|v| v["synced_unix_ms"].as_u64())
}

#[test]
fn a_volume_outlives_its_node() {
    let c = Cluster::start();
    let dir = tempfile::tempdir().unwrap();
    let blob = space_archive::testing::noise(11, 2 << 20);
    let local = dir.path().join("blob");
    std::fs::write(&local, &blob).unwrap();

    ok(&c.cli(0, &["volume", "create", "keep", "--size", "256"]));
    ok(&c.cli(1, &["volume", "cp", local.to_str().unwrap(), "keep:/blob"]));
    let id = ok(&c.cli(
        0,
        &["create", "--template", "minimal", "--volume", "keep:/data"],
    ))
    .trim()
    .to_owned();
    let on = c.running_on(&id);
    assert_eq!(on.len(), 1, "{id} runs on {on:?}");
    let v = on[0];
    let got = ok(&c.exec(1, &id, "sha256sum /data/blob | cut -d' ' -f1"));
    assert_eq!(got.trim(), sha(&blob), "the guest reads what the API wrote");
    ok(&c.exec(
        0,
        &id,
        "echo from the guest > /data/g && mkdir -p /data/d && ln -s ../g /data/d/l",
    ));

    // Acknowledged, then copied: every write before the copy's moment must survive.
    let written = now_ms();
    let until = Instant::now() + Duration::from_secs(120);
    while synced(&c, 0, "keep").is_none_or(|s| s <= written) {
        assert!(
            Instant::now() < until,
            "no copy of the volume after {written}\n{}",
            c.logs()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    c.wait_uploaded(&id, written);

    let mut c = c;
    c.nodes[v].proc.kill();
    let w = c.wait_elsewhere(0, &id, v);

    // The sandbox came back on node w and its volume followed it there.
    let got = ok(&c.exec(
        1,
        &id,
        "cat /data/g /data/d/l && sha256sum /data/blob | cut -d' ' -f1",
    ));
    assert_eq!(
        got,
        format!("from the guest\nfrom the guest\n{}\n", sha(&blob)),
        "the volume on node {w}"
    );
    ok(&c.exec(0, &id, "echo after > /data/after && cat /data/after"));
    let back = dir.path().join("back");
    ok(&c.cli(0, &["volume", "cp", "keep:/g", back.to_str().unwrap()]));
    assert_eq!(std::fs::read(&back).unwrap(), b"from the guest\n");
    // A new mount goes to the volume's node, and sees what the moved sandbox wrote.
    let second = ok(&c.cli(
        1,
        &["create", "--template", "minimal", "--volume", "keep:/v"],
    ))
    .trim()
    .to_owned();
    assert_eq!(
        c.running_on(&second),
        vec![w],
        "a new mount follows the volume"
    );
    assert_eq!(ok(&c.exec(0, &second, "cat /v/after")), "after\n");
    let moves = ok(&c.cli(0, &["node", "ls"]));
    assert!(moves.contains(&c.nodes[w].id), "{moves}");
}
