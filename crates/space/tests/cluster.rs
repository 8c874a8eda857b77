//! A cluster of real processes on one machine: two `space control` replicas over one
//! throwaway PostgreSQL, three `space node` processes (each its own data directory and loop
//! image, joined with one-time tokens), Garage as the object store, real guests.
//!
//! Every guest runs a counter that it bumps every 100 ms, and a sampler in this process looks
//! at every QEMU process of every node all through the test: at no moment may two
//! unstopped VMs run for one sandbox. Then:
//!
//! - creates spread over the nodes; each sandbox answers exec and a 2 MiB upload and
//!   download (by SHA-256) through either replica;
//! - SIGSTOP of a node past its lease: its watchdog stopped its guests before its running
//!   sandboxes came back on the other nodes from their last uploaded snapshot (the audit says
//!   how old) with memory (the counter runs on) and files intact; SIGCONT: it finds its
//!   incarnation stale, discards what moved and rejoins;
//! - SIGKILL of a node: its running sandboxes come back on the others, once each, while
//!   clients retry execs on them through both replicas at once;
//! - a sandbox suspended on one node is restored on another, and a drain empties a node
//!   without losing a byte;
//! - a replica killed in the middle of a request fails that request cleanly, and the other
//!   one keeps serving.

mod common;
#[path = "../../space-control/tests/common/postgres.rs"]
mod postgres;

use std::collections::HashMap;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{env_path, json, kill_qemus_under, ok, run, space_bin, stderr, unmount};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use sha2::{Digest, Sha256};
use space_archive::testing::Garage;

/// How long a node process may take to be ready (the first one builds the template).
const NODE_READY: Duration = Duration::from_secs(300);
/// How long a lost node's sandboxes may take to answer elsewhere: lease, grace, a restore
/// from the store under TCG, with room for a loaded host.
const FAILOVER: Duration = Duration::from_secs(180);

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn sha(b: &[u8]) -> String {
    hex(&Sha256::digest(b))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A child process with its output in a log file; killed (and continued first, if stopped)
/// on drop.
struct Proc {
    name: String,
    child: Option<Child>,
    log: PathBuf,
}

impl Proc {
    fn spawn(name: &str, mut cmd: Command, log: PathBuf) -> Proc {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"));
        Proc {
            name: name.into(),
            child: Some(child),
            log,
        }
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(self.child.as_ref().expect("running").id() as i32)
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.log).unwrap_or_default()).into_owned()
    }

    fn tail(&self) -> String {
        let t = self.text();
        let start = t.len().saturating_sub(6000);
        let start = (start..t.len())
            .find(|i| t.is_char_boundary(*i))
            .unwrap_or(0);
        format!("---- {} ----\n{}", self.name, &t[start..])
    }

    /// Waits until the log contains `needle`, panicking with the log if the process exits
    /// first or `wait` passes.
    fn wait_for(&mut self, needle: &str, wait: Duration) {
        let until = Instant::now() + wait;
        loop {
            if self.text().contains(needle) {
                return;
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "{} exited ({status}) before {needle:?}\n{}",
                    self.name,
                    self.tail()
                );
            }
            assert!(
                Instant::now() < until,
                "{} did not log {needle:?} within {wait:?}\n{}",
                self.name,
                self.tail()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn signal(&self, s: Signal) {
        kill(self.pid(), s).unwrap();
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = kill(Pid::from_raw(c.id() as i32), Signal::SIGCONT);
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

struct NodeProc {
    proc: Proc,
    id: String,
    data: PathBuf,
}

/// Whether a process can run no more code: stopped (`T`), exiting (`PF_EXITING` in the flags
/// of `/proc/<pid>/stat`), or with SIGKILL pending (a VM being killed is woken from its stop
/// only to die). `rest` is the part of `stat` after the command name.
fn halted(proc: &std::path::Path, rest: &str) -> bool {
    const PF_EXITING: u64 = 0x4;
    const SIGKILL_BIT: u64 = 1 << (9 - 1);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    if fields.first() == Some(&"T") {
        return true;
    }
    if fields
        .get(6)
        .and_then(|f| f.parse::<u64>().ok())
        .is_some_and(|f| f & PF_EXITING != 0)
    {
        return true;
    }
    let status = std::fs::read_to_string(proc.join("status")).unwrap_or_default();
    status.lines().any(|l| {
        let Some((k, v)) = l.split_once(':') else {
            return false;
        };
        matches!(k, "SigPnd" | "ShdPnd")
            && u64::from_str_radix(v.trim(), 16).is_ok_and(|m| m & SIGKILL_BIT != 0)
    })
}

/// Which sandboxes each node's QEMU processes belong to, and whether they are halted (see
/// [`halted`]): (node index, sandbox id, pid, halted). A VM is the process its sandbox
/// directory's pidfile names, if that process is QEMU and has the directory as its root or
/// working directory (a jailed QEMU sees it under another path, so by device and inode).
fn vms(nodes: &[PathBuf]) -> Vec<(usize, String, u32, bool)> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        for e in std::fs::read_dir(n.join("sandboxes"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let dir = e.path();
            let Ok(m) = std::fs::metadata(&dir) else {
                continue;
            };
            let Some(pid) = std::fs::read_to_string(dir.join("qemu.pid"))
                .ok()
                .and_then(|p| p.trim().parse::<u32>().ok())
            else {
                continue;
            };
            let proc = PathBuf::from(format!("/proc/{pid}"));
            let comm = std::fs::read_to_string(proc.join("comm")).unwrap_or_default();
            if !comm.starts_with("qemu") {
                continue;
            }
            let stat = std::fs::read_to_string(proc.join("stat")).unwrap_or_default();
            let rest = stat.rsplit_once(") ").map(|(_, r)| r).unwrap_or("");
            let state = rest.chars().next().unwrap_or('?');
            if state == 'Z' || state == '?' {
                continue;
            }
            let stopped = halted(&proc, rest);
            let here = ["root", "cwd"].iter().any(|l| {
                std::fs::metadata(proc.join(l))
                    .is_ok_and(|p| (p.dev(), p.ino()) == (m.dev(), m.ino()))
            });
            if here {
                let id = e.file_name().to_string_lossy().into_owned();
                out.push((i, id, pid, stopped));
            }
        }
    }
    out
}

/// Samples [`vms`] every 50 ms: any moment with two unstopped VMs of one sandbox is kept.
struct Sampler {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<String>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sampler {
    fn start(nodes: Vec<PathBuf>) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (s, v) = (stop.clone(), seen.clone());
        let started = Instant::now();
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                let mut running: HashMap<String, Vec<(usize, u32)>> = HashMap::new();
                for (node, id, pid, stopped) in vms(&nodes) {
                    if !stopped {
                        running.entry(id).or_default().push((node, pid));
                    }
                }
                for (id, on) in running {
                    if on.len() > 1 {
                        v.lock().unwrap().push(format!(
                            "{id} ran on (node, pid) {on:?} at once, {:.1} s in",
                            started.elapsed().as_secs_f64()
                        ));
                    }
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Sampler {
            stop,
            seen,
            thread: Some(thread),
        }
    }

    fn violations(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Cluster {
    tmp: PathBuf,
    garage: Garage,
    database: String,
    vault_key: String,
    replicas: Vec<(Proc, String)>,
    nodes: Vec<NodeProc>,
    admin: String,
}

impl Cluster {
    fn start() -> Cluster {
        env_path("SPACE_KERNEL");
        env_path("SPACE_ROOTFS_MINIMAL");
        let tmp = tempfile::Builder::new()
            .prefix("space-cluster")
            .tempdir_in("/var/tmp")
            .unwrap()
            .keep();
        let garage = Garage::start();
        let database = postgres::database();
        let vault_key = hex(&space_archive::testing::noise(7, 32));
        let mut c = Cluster {
            tmp,
            garage,
            database,
            vault_key,
            replicas: Vec::new(),
            nodes: Vec::new(),
            admin: String::new(),
        };
        for i in 0..2 {
            c.start_replica(i);
        }
        let log = c.replicas[0].0.text();
        c.admin = log
            .lines()
            .map(str::trim)
            .find(|l| l.starts_with("space_"))
            .unwrap_or_else(|| panic!("no admin key in the first replica's log:\n{log}"))
            .to_owned();
        for i in 0..3 {
            c.start_node(i);
        }
        for n in &mut c.nodes {
            n.proc.wait_for("space node: ready", NODE_READY);
        }
        // Placement goes by the nodes' reports: wait until every node reported the template.
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            let nodes = json(&c.cli(0, &["--json", "node", "ls"]));
            let ready = nodes.as_array().unwrap().iter().filter(|n| {
                n["live"] == true && n["templates"].as_array().is_some_and(|t| !t.is_empty())
            });
            if ready.count() == 3 {
                break;
            }
            assert!(
                Instant::now() < until,
                "the nodes did not report templates: {nodes}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        c
    }

    fn start_replica(&mut self, i: usize) {
        let port = free_port();
        let mut cmd = Command::new(space_bin());
        cmd.args(["control", "--database", &self.database])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args([
                "--object-store",
                &format!("s3://{}/cluster", self.garage.bucket),
            ])
            .args(["--upload-interval", "4"])
            .env("SPACE_VAULT_KEY", &self.vault_key)
            .env("AWS_ACCESS_KEY_ID", &self.garage.key_id)
            .env("AWS_SECRET_ACCESS_KEY", &self.garage.secret)
            .env("AWS_REGION", "garage")
            .env("AWS_ENDPOINT_URL", &self.garage.endpoint)
            .env("RUST_LOG", "info")
            .env_remove("SPACE_URL")
            .env_remove("SPACE_API_KEY");
        let mut p = Proc::spawn(
            &format!("replica {i}"),
            cmd,
            self.tmp.join(format!("replica-{i}.log")),
        );
        p.wait_for("Add nodes with a token", Duration::from_secs(60));
        let url = format!("http://127.0.0.1:{port}");
        if i < self.replicas.len() {
            self.replicas[i] = (p, url);
        } else {
            self.replicas.push((p, url));
        }
    }

    fn start_node(&mut self, i: usize) {
        let token = ok(&self.cli(i % 2, &["node", "token"])).trim().to_owned();
        let id = format!("node-{}", i + 1);
        let data = self.tmp.join(&id);
        let port = free_port();
        let mut cmd = Command::new(space_bin());
        cmd.arg("node")
            .args(["--control", &self.replicas[i % 2].1])
            .args(["--join-token", &token, "--node-id", &id])
            .args(["--advertise", &format!("127.0.0.1:{port}")])
            .arg("--data-dir")
            .arg(&data)
            .arg("--kernel")
            .arg(env_path("SPACE_KERNEL"))
            .arg("--image")
            .arg(format!(
                "minimal={}",
                env_path("SPACE_ROOTFS_MINIMAL").display()
            ))
            .args(["--pool-size", "0", "--pool-max", "0"])
            .env("RUST_LOG", "info")
            .env_remove("AWS_ACCESS_KEY_ID")
            .env_remove("AWS_SECRET_ACCESS_KEY")
            .env_remove("SPACE_OBJECT_STORE");
        let proc = Proc::spawn(&id, cmd, self.tmp.join(format!("{id}.log")));
        self.nodes.push(NodeProc { proc, id, data });
    }

    /// The CLI through replica `r` as the admin.
    fn cli(&self, r: usize, args: &[&str]) -> Output {
        let mut cmd = Command::new(space_bin());
        cmd.args(args)
            .env("SPACE_URL", &self.replicas[r].1)
            .env("SPACE_API_KEY", &self.admin)
            .env("SPACE_CONFIG", self.tmp.join("cli.json"));
        run(cmd, None)
    }

    fn data_dirs(&self) -> Vec<PathBuf> {
        self.nodes.iter().map(|n| n.data.clone()).collect()
    }

    /// The nodes (indices) with an unstopped VM of `id`.
    fn running_on(&self, id: &str) -> Vec<usize> {
        vms(&self.data_dirs())
            .into_iter()
            .filter(|(_, s, _, stopped)| s == id && !stopped)
            .map(|(n, _, _, _)| n)
            .collect()
    }

    fn exec(&self, r: usize, id: &str, script: &str) -> Output {
        self.cli(r, &["exec", "-n", id, "--", "sh", "-c", script])
    }

    fn counter(&self, r: usize, id: &str) -> u64 {
        let out = ok(&self.exec(r, id, "cat /root/counter"));
        out.trim()
            .parse()
            .unwrap_or_else(|e| panic!("counter of {id}: {out:?}: {e}"))
    }

    /// Waits until `id` answers exec through replica `r` from a node other than `not`.
    fn wait_elsewhere(&self, r: usize, id: &str, not: usize) -> usize {
        let until = Instant::now() + FAILOVER;
        loop {
            let on = self.running_on(id);
            if let [n] = on[..] {
                if n != not && self.exec(r, id, "true").status.success() {
                    return n;
                }
            }
            assert!(
                Instant::now() < until,
                "{id} did not come back on another node than {} within {FAILOVER:?} \
                 (running on {on:?})\n{}",
                self.nodes[not].id,
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// Waits until a full snapshot of `id` taken after `after_ms` is in the store.
    fn wait_uploaded(&self, id: &str, after_ms: u64) {
        let until = Instant::now() + Duration::from_secs(120);
        loop {
            let snaps = json(&self.cli(0, &["--json", "snapshots", id]));
            let done = snaps.as_array().into_iter().flatten().any(|s| {
                s["kind"] == "full"
                    && s["created_unix_ms"].as_u64().unwrap_or(0) > after_ms
                    && s["remote"].is_object()
            });
            if done {
                return;
            }
            assert!(
                Instant::now() < until,
                "no snapshot of {id} after {after_ms} reached the store: {snaps}\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    fn node_row(&self, id: &str) -> serde_json::Value {
        let nodes = json(&self.cli(1, &["--json", "node", "ls"]));
        nodes
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["id"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("node {id} is not listed: {nodes}"))
    }

    fn logs(&self) -> String {
        let mut s = String::new();
        for (p, _) in &self.replicas {
            s.push_str(&p.tail());
            s.push('\n');
        }
        for n in &self.nodes {
            s.push_str(&n.proc.tail());
            s.push('\n');
        }
        s
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
        }
        for n in &mut self.nodes {
            n.proc.kill();
        }
        for n in &self.nodes {
            kill_qemus_under(&n.data);
            unmount(&n.data);
        }
        for (p, _) in &mut self.replicas {
            p.kill();
        }
        let _ = std::fs::remove_dir_all(&self.tmp);
    }
}

/// The counter each guest runs; each value replaces the file whole (a reader never sees it
/// half written).
const COUNTER: &str = "setsid sh -c 'n=0; while true; do n=$((n+1)); echo $n > /root/counter.new; \
                       mv /root/counter.new /root/counter; sleep 0.1; done' </dev/null >/dev/null 2>&1 &";

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[test]
fn failover_fencing_drain_and_replicas() {
    let mut c = Cluster::start();
    let sampler = Sampler::start(c.data_dirs());
    let dir = tempfile::tempdir().unwrap();

    // Creates through both replicas spread over the nodes.
    let mut ids: Vec<String> = Vec::new();
    for i in 0..4 {
        let id = ok(&c.cli(i % 2, &["create", "--template", "minimal"]))
            .trim()
            .to_owned();
        ok(&c.exec(i % 2, &id, COUNTER));
        ids.push(id);
    }
    let mut homes: HashMap<String, usize> = HashMap::new();
    for id in &ids {
        let on = c.running_on(id);
        assert_eq!(on.len(), 1, "{id} runs on {on:?}");
        homes.insert(id.clone(), on[0]);
    }
    let used: std::collections::HashSet<_> = homes.values().collect();
    assert!(used.len() >= 2, "creates did not spread: {homes:?}");

    // Each answers exec and file transfer through either replica.
    let mut blobs: HashMap<String, String> = HashMap::new();
    for (i, id) in ids.iter().enumerate() {
        let data = space_archive::testing::noise(i as u64 + 1, 2 << 20);
        let local = dir.path().join(format!("up-{i}"));
        std::fs::write(&local, &data).unwrap();
        ok(&c.cli(
            1,
            &["cp", local.to_str().unwrap(), &format!("{id}:/root/blob")],
        ));
        let back = dir.path().join(format!("down-{i}"));
        ok(&c.cli(
            0,
            &["cp", &format!("{id}:/root/blob"), back.to_str().unwrap()],
        ));
        assert_eq!(sha(&std::fs::read(&back).unwrap()), sha(&data));
        ok(&c.exec(0, id, "sync"));
        blobs.insert(id.clone(), sha(&data));
    }
    // What each counter had reached before this moment: a snapshot taken after it has more.
    let reached: HashMap<String, u64> = ids
        .iter()
        .map(|id| (id.clone(), c.counter(0, id)))
        .collect();
    let written = now_ms();

    // SIGSTOP of a node past its lease.
    let x = homes[&ids[0]];
    let on_x: Vec<String> = ids.iter().filter(|i| homes[*i] == x).cloned().collect();
    for id in &on_x {
        c.wait_uploaded(id, written);
    }
    c.nodes[x].proc.signal(Signal::SIGSTOP);
    let stopped_at = Instant::now();
    // Its watchdog stops its guests before the lease can run out (deadline: lease - 3 s).
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let mine: Vec<_> = vms(&c.data_dirs())
            .into_iter()
            .filter(|(n, _, _, _)| *n == x)
            .collect();
        if !mine.is_empty() && mine.iter().all(|(_, _, _, stopped)| *stopped) {
            break;
        }
        assert!(
            Instant::now() < until,
            "node {x}'s guests were not stopped: {mine:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let fenced_after = stopped_at.elapsed();
    assert!(
        fenced_after < Duration::from_secs(10),
        "the guests were stopped {fenced_after:?} after the node, past its lease"
    );
    for id in &on_x {
        let now_on = c.wait_elsewhere(1, id, x);
        homes.insert(id.clone(), now_on);
        // Still stopped on the node that lost it, which cannot run it.
        assert!(
            vms(&c.data_dirs())
                .iter()
                .filter(|(n, s, _, _)| *n == x && s == id)
                .all(|(_, _, _, stopped)| *stopped),
            "{id} runs on the stopped node too"
        );
        // Memory and files came back: the counter process runs on from the snapshot.
        let after = c.counter(0, id);
        std::thread::sleep(Duration::from_millis(800));
        let later = c.counter(1, id);
        assert!(
            later > after,
            "{id}'s counter does not run: {after} then {later}"
        );
        assert!(
            after >= reached[id],
            "{id} came back from a state older than its last upload: {after} < {}",
            reached[id]
        );
        let got = ok(&c.exec(0, id, "sha256sum /root/blob | cut -d' ' -f1"));
        assert_eq!(got.trim(), blobs[id], "{id}'s file");
    }
    let audit = json(&c.cli(0, &["--json", "audit", "--operation", "sandbox.failover"]));
    for id in &on_x {
        let e = audit
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["sandbox"] == id.as_str() && e["result"] == "ok")
            .unwrap_or_else(|| panic!("no failover of {id} audited: {audit}"));
        let detail = e["detail"].as_str().unwrap();
        assert!(
            detail.contains("taken") && detail.contains("s before"),
            "{detail}"
        );
    }
    // SIGCONT: the node finds its incarnation stale, discards what moved and rejoins.
    let incarnation = c.node_row(&c.nodes[x].id)["incarnation"].as_i64().unwrap();
    c.nodes[x].proc.signal(Signal::SIGCONT);
    c.nodes[x]
        .proc
        .wait_for("rejoined the cluster", Duration::from_secs(60));
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let row = c.node_row(&c.nodes[x].id);
        let gone = on_x
            .iter()
            .all(|id| !c.nodes[x].data.join("sandboxes").join(id).exists());
        if row["live"] == true && row["incarnation"].as_i64() > Some(incarnation) && gone {
            break;
        }
        assert!(
            Instant::now() < until,
            "node {x} did not rejoin clean: {row}\n{}",
            c.logs()
        );
        std::thread::sleep(Duration::from_millis(300));
    }

    // SIGKILL of a node: its running sandboxes come back on the others.
    let y = (0..3)
        .filter(|n| *n != x)
        .max_by_key(|n| homes.values().filter(|h| *h == n).count())
        .unwrap();
    let on_y: Vec<String> = ids.iter().filter(|i| homes[*i] == y).cloned().collect();
    assert!(!on_y.is_empty(), "no sandbox on node {y}: {homes:?}");
    for id in &on_y {
        c.wait_uploaded(id, written);
    }
    c.nodes[y].proc.kill();
    // Clients retry at once, three to a sandbox, through both replicas (the
    // `node_unavailable` answer tells them to): each move happens once, and every client
    // ends with the sandbox's file as it was.
    std::thread::scope(|s| {
        let c = &c;
        for id in &on_y {
            for k in 0..3 {
                let want = blobs[id].clone();
                s.spawn(move || {
                    let until = Instant::now() + FAILOVER + Duration::from_secs(60);
                    loop {
                        let out = c.exec(k % 2, id, "sha256sum /root/blob | cut -d' ' -f1");
                        if out.status.success() {
                            let got = String::from_utf8_lossy(&out.stdout);
                            assert_eq!(got.trim(), want, "{id}'s file, client {k}");
                            return;
                        }
                        assert!(
                            Instant::now() < until,
                            "client {k} of {id} never got an answer: {}",
                            String::from_utf8_lossy(&out.stderr)
                        );
                        std::thread::sleep(Duration::from_millis(300));
                    }
                });
            }
        }
    });
    for id in &on_y {
        let now_on = c.wait_elsewhere(0, id, y);
        homes.insert(id.clone(), now_on);
        let a = c.counter(1, id);
        std::thread::sleep(Duration::from_millis(800));
        assert!(c.counter(0, id) > a, "{id}'s counter does not run");
        let got = ok(&c.exec(1, id, "sha256sum /root/blob | cut -d' ' -f1"));
        assert_eq!(got.trim(), blobs[id], "{id}'s file");
    }
    let failovers = json(&c.cli(1, &["--json", "audit", "--operation", "sandbox.failover"]));
    let later = failovers
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| on_y.iter().any(|id| e["sandbox"] == id.as_str()))
        .count();
    assert!(later >= on_y.len(), "{failovers}");

    // Suspended on one node, restored on another; then a drain empties a node.
    let live: Vec<usize> = (0..3).filter(|n| *n != y).collect();
    let z = *live
        .iter()
        .max_by_key(|n| homes.values().filter(|h| h == n).count())
        .unwrap();
    let other = *live.iter().find(|n| **n != z).unwrap();
    let on_z: Vec<String> = ids.iter().filter(|i| homes[*i] == z).cloned().collect();
    assert!(!on_z.is_empty(), "no sandbox on node {z}: {homes:?}");
    let sleeping = on_z[0].clone();
    let before_suspend = c.counter(0, &sleeping);
    ok(&c.cli(0, &["suspend", &sleeping]));
    ok(&c.cli(1, &["node", "drain", &c.nodes[z].id]));
    let until = Instant::now() + FAILOVER;
    loop {
        let left: Vec<_> = vms(&c.data_dirs())
            .into_iter()
            .filter(|(n, _, _, _)| *n == z)
            .collect();
        let moved_files = on_z
            .iter()
            .all(|id| !c.nodes[z].data.join("sandboxes").join(id).exists());
        if left.is_empty() && moved_files {
            break;
        }
        assert!(
            Instant::now() < until,
            "node {z} was not drained: {left:?}\n{}",
            c.logs()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    for id in &on_z {
        if *id == sleeping {
            continue;
        }
        // The drain restores it on the other node right after moving it.
        let until = Instant::now() + Duration::from_secs(120);
        while c.running_on(id) != vec![other] || !c.exec(0, id, "true").status.success() {
            assert!(
                Instant::now() < until,
                "{id} does not run on node {other} after the drain: {:?}\n{}",
                c.running_on(id),
                c.logs()
            );
            std::thread::sleep(Duration::from_millis(300));
        }
        let got = ok(&c.exec(0, id, "sha256sum /root/blob | cut -d' ' -f1"));
        assert_eq!(got.trim(), blobs[id], "{id}'s file after the drain");
    }
    ok(&c.cli(1, &["restore", &sleeping]));
    assert_eq!(c.running_on(&sleeping), vec![other], "restored elsewhere");
    let after = c.counter(0, &sleeping);
    assert!(after >= before_suspend, "{before_suspend} then {after}");
    let got = ok(&c.exec(1, &sleeping, "sha256sum /root/blob | cut -d' ' -f1"));
    assert_eq!(got.trim(), blobs[&sleeping]);

    // A replica killed mid-request fails that request; the other one serves.
    let target = ids
        .iter()
        .find(|id| c.running_on(id).len() == 1)
        .unwrap()
        .clone();
    let mut slow = Command::new(space_bin());
    slow.args(["exec", "-n", &target, "--", "sleep", "20"])
        .env("SPACE_URL", &c.replicas[0].1)
        .env("SPACE_API_KEY", &c.admin)
        .env("SPACE_CONFIG", c.tmp.join("cli.json"));
    let pending = std::thread::spawn(move || run(slow, None));
    std::thread::sleep(Duration::from_secs(2));
    c.replicas[0].0.kill();
    let t0 = Instant::now();
    let out = pending.join().unwrap();
    assert!(
        !out.status.success(),
        "a request through a killed replica succeeded"
    );
    assert!(
        t0.elapsed() < Duration::from_secs(15),
        "the failed request hung"
    );
    assert!(!stderr(&out).is_empty(), "no error message");
    ok(&c.exec(1, &target, "true"));
    assert!(c.counter(1, &target) > 0);

    assert!(
        sampler.violations().is_empty(),
        "two VMs ran for one sandbox: {:?}",
        sampler.violations()
    );
    drop(sampler);
}
