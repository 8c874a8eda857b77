//! Restores one full snapshot many times and checks that the guest daemon answers on a new
//! `space.ctl` connection every time.
//!
//! ```text
//! source target/space/env.sh
//! cargo run --release -p space-runtime --example restore_stress -- [N] [MODE] [ROUNDS]
//! ```
//!
//! Snapshots are taken from a booted `minimal` guest while a host client is connected; each
//! of `ROUNDS` snapshots (default 1) is restored `N` times (default 40).
//! `MODE` picks what that client is doing at the time:
//!
//! - `idle` (default): it answered a health check and sits idle;
//! - `inflight`: several tasks keep health checks, execs and file writes going on it;
//! - `finished`: an exec with some output has just completed on it.
//!
//! Each restore waits for a ready health check with a 10 s bound, then runs one exec. A
//! restore that does not answer is recorded with the tail of its console. The program exits
//! with status 1 if any restore failed. Sandboxes go under `$SPACE_MEASURE_DIR` (default: a
//! temporary directory).

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use space_proto::{ExecSpec, WriteOptions};
use space_runtime::{RestoreSpec, Runtime, Vm};

const READY_TIMEOUT: Duration = Duration::from_secs(10);

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(40);
    let mode = args.next().unwrap_or_else(|| "idle".into());
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1);
    let base = match std::env::var_os("SPACE_MEASURE_DIR") {
        Some(d) => tempfile::tempdir_in(d).unwrap(),
        None => tempfile::tempdir().unwrap(),
    };
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let rt = common::runtime().await;
    let image = common::env_path("SPACE_ROOTFS_MINIMAL");

    let dir = base.path().join("boot");
    std::fs::create_dir(&dir).unwrap();
    let vm = rt.boot(common::boot_spec(&dir, &image)).await.unwrap();
    let client = vm.wait_ready(common::BOOT_TIMEOUT).await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let mut load = Vec::new();
    match mode.as_str() {
        "idle" => {
            client.health().await.unwrap();
        }
        "finished" => {
            let out = client
                .run(ExecSpec::shell("seq 1 2000"))
                .await
                .expect("exec");
            assert!(out.status.success());
        }
        "inflight" => {
            for k in 0..4 {
                let c = client.clone();
                let stop = stop.clone();
                load.push(tokio::spawn(async move {
                    let mut i = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        // Errors are expected once the VM is gone; only keep traffic going.
                        let _ = match k {
                            0 => c.health().await.map(drop),
                            1 => c.run(ExecSpec::shell("seq 1 500")).await.map(drop),
                            _ => c
                                .write_file(
                                    &format!("/tmp/load{k}"),
                                    vec![i as u8; 64 * 1024],
                                    WriteOptions::default(),
                                )
                                .await
                                .map(drop),
                        };
                        i += 1;
                    }
                }));
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        other => panic!("unknown mode {other}: idle, inflight or finished"),
    }
    let mut failures = Vec::new();
    let mut times = Vec::new();
    for round in 0..rounds {
        // The original VM keeps running (and, in `inflight` mode, busy) between snapshots.
        let snap = base.path().join(format!("snap{round}"));
        let info = vm.snapshot(&snap).await.unwrap();
        println!(
            "snapshot {round} ({mode}) paused for {:?}; restoring {n} times",
            info.paused_for
        );
        for i in 0..n {
            let dir = base.path().join(format!("restore{round}-{i}"));
            std::fs::create_dir(&dir).unwrap();
            let spec = RestoreSpec {
                snapshot: info.dir.clone(),
                dir: dir.clone(),
                paused: false,
                kernel: None,
                files_in_place: false,
                priority: Default::default(),
                splice: None,
            };
            let t = Instant::now();
            let restored = rt.restore(spec).await.unwrap();
            let outcome = match restored.wait_ready(READY_TIMEOUT).await {
                Ok(c) => c
                    .run(ExecSpec::argv(["true"]))
                    .await
                    .map(|o| o.status.success())
                    .map_err(|e| format!("exec after ready: {e}")),
                Err(e) => Err(e.to_string()),
            };
            let took = t.elapsed();
            let name = format!("{round}/{i}");
            match outcome {
                Ok(true) => {
                    times.push(took);
                    println!("restore {name}: ready in {took:?}");
                }
                other => {
                    println!("restore {name}: FAILED after {took:?}");
                    failures.push((name, format!("{other:?}"), restored.console_tail(3000)));
                }
            }
            drop(restored);
            std::fs::remove_dir_all(&dir).unwrap();
        }
        std::fs::remove_dir_all(&snap).unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    drop(client);
    drop(vm);
    for task in load {
        let _ = task.await;
    }
    times.sort();
    for (i, err, console) in &failures {
        println!("=== restore {i} failed: {err}\n--- console ---\n{console}");
    }
    println!(
        "{} restores, {} failures; ready p50 {:?} max {:?}",
        n * rounds,
        failures.len(),
        times.get(times.len() / 2),
        times.last()
    );
    if !failures.is_empty() {
        std::process::exit(1);
    }
}
