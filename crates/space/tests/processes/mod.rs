//! A cluster of real processes on one machine, for the tests that drive one: `space control`
//! replicas over a throwaway PostgreSQL, `space node` processes (each its own data directory
//! and loop image, joined with one-time tokens), Garage as the object store; and a sampler
//! that watches every node's QEMU processes for two VMs of one sandbox at once.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use sha2::{Digest, Sha256};
use space_archive::testing::Garage;

use crate::common::{env_path, json, kill_qemus_under, ok, run, space_bin, unmount};
use crate::postgres;

/// How long a node process may take to be ready (the first one builds the template).
pub const NODE_READY: Duration = Duration::from_secs(300);
/// How long a lost node's sandboxes may take to answer elsewhere: lease, grace, a restore
/// from the store under TCG, with room for a loaded host.
pub const FAILOVER: Duration = Duration::from_secs(180);

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub fn sha(b: &[u8]) -> String {
    hex(&Sha256::digest(b))
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A child process with its output in a log file; killed (and continued first, if stopped)
/// on drop.
pub struct Proc {
    pub name: String,
    pub child: Option<Child>,
    pub log: PathBuf,
}

impl Proc {
    pub fn spawn(name: &str, mut cmd: Command, log: PathBuf) -> Proc {
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

    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.as_ref().expect("running").id() as i32)
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.log).unwrap_or_default()).into_owned()
    }

    pub fn tail(&self) -> String {
        let t = self.text();
        let start = t.len().saturating_sub(6000);
        let start = (start..t.len())
            .find(|i| t.is_char_boundary(*i))
            .unwrap_or(0);
        format!("---- {} ----\n{}", self.name, &t[start..])
    }

    /// Waits until the log contains `needle`, panicking with the log if the process exits
    /// first or `wait` passes.
    pub fn wait_for(&mut self, needle: &str, wait: Duration) {
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

    pub fn signal(&self, s: Signal) {
        kill(self.pid(), s).unwrap();
    }

    pub fn kill(&mut self) {
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

pub struct NodeProc {
    pub proc: Proc,
    pub id: String,
    pub data: PathBuf,
}

/// Whether a process can run no more code: stopped (`T`), exiting (`PF_EXITING` in the flags
/// of `/proc/<pid>/stat`), or with SIGKILL pending (a VM being killed is woken from its stop
/// only to die). `rest` is the part of `stat` after the command name.
pub fn halted(proc: &std::path::Path, rest: &str) -> bool {
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
pub fn vms(nodes: &[PathBuf]) -> Vec<(usize, String, u32, bool)> {
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
pub struct Sampler {
    pub stop: Arc<AtomicBool>,
    pub seen: Arc<Mutex<Vec<String>>>,
    pub thread: Option<std::thread::JoinHandle<()>>,
}

impl Sampler {
    pub fn start(nodes: Vec<PathBuf>) -> Sampler {
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

    pub fn violations(&self) -> Vec<String> {
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

pub struct Cluster {
    pub tmp: PathBuf,
    pub garage: Garage,
    pub database: String,
    pub vault_key: String,
    pub replicas: Vec<(Proc, String)>,
    pub nodes: Vec<NodeProc>,
    pub admin: String,
}

impl Cluster {
    pub fn start() -> Cluster {
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

    pub fn start_replica(&mut self, i: usize) {
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

    pub fn start_node(&mut self, i: usize) {
        let token = ok(&self.cli(i % 2, &["node", "token"])).trim().to_owned();
        let (id, proc) = self.node_proc(i, Some(&token), "");
        let data = self.tmp.join(&id);
        self.nodes.push(NodeProc { proc, id, data });
    }

    /// Starts node `i` again on its data directory (after a kill): it rejoins with the
    /// identity it saved, without a token. `round` names its log.
    pub fn restart_node(&mut self, i: usize, round: usize) {
        self.nodes[i].proc.kill();
        let (_, proc) = self.node_proc(i, None, &format!("-{round}"));
        self.nodes[i].proc = proc;
        self.nodes[i].proc.wait_for("space node: ready", NODE_READY);
    }

    fn node_proc(&self, i: usize, token: Option<&str>, log_suffix: &str) -> (String, Proc) {
        let id = format!("node-{}", i + 1);
        let data = self.tmp.join(&id);
        let port = free_port();
        let mut cmd = Command::new(space_bin());
        cmd.arg("node")
            .args(["--control", &self.replicas[i % 2].1])
            .args(["--node-id", &id])
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
        if let Some(t) = token {
            cmd.args(["--join-token", t]);
        }
        let proc = Proc::spawn(&id, cmd, self.tmp.join(format!("{id}{log_suffix}.log")));
        (id, proc)
    }

    /// The CLI through replica `r` as the admin.
    pub fn cli(&self, r: usize, args: &[&str]) -> Output {
        let mut cmd = Command::new(space_bin());
        cmd.args(args)
            .env("SPACE_URL", &self.replicas[r].1)
            .env("SPACE_API_KEY", &self.admin)
            .env("SPACE_CONFIG", self.tmp.join("cli.json"));
        run(cmd, None)
    }

    pub fn data_dirs(&self) -> Vec<PathBuf> {
        self.nodes.iter().map(|n| n.data.clone()).collect()
    }

    /// The nodes (indices) with an unstopped VM of `id`.
    pub fn running_on(&self, id: &str) -> Vec<usize> {
        vms(&self.data_dirs())
            .into_iter()
            .filter(|(_, s, _, stopped)| s == id && !stopped)
            .map(|(n, _, _, _)| n)
            .collect()
    }

    pub fn exec(&self, r: usize, id: &str, script: &str) -> Output {
        self.cli(r, &["exec", "-n", id, "--", "sh", "-c", script])
    }

    pub fn counter(&self, r: usize, id: &str) -> u64 {
        let out = ok(&self.exec(r, id, "cat /root/counter"));
        out.trim()
            .parse()
            .unwrap_or_else(|e| panic!("counter of {id}: {out:?}: {e}"))
    }

    /// Waits until `id` answers exec through replica `r` from a node other than `not`.
    pub fn wait_elsewhere(&self, r: usize, id: &str, not: usize) -> usize {
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

    /// Clients retry at once, three to a sandbox of `ids`, through both replicas (the
    /// `node_unavailable` answer tells them to): each ends with the sandbox's `/root/blob`
    /// as `blobs` has its SHA-256, within [`FAILOVER`] and a minute. `label` leads failures.
    pub fn retrying_clients(&self, ids: &[String], blobs: &HashMap<String, String>, label: &str) {
        std::thread::scope(|s| {
            for id in ids {
                for k in 0..3 {
                    let want = blobs[id].clone();
                    s.spawn(move || {
                        let until = Instant::now() + FAILOVER + Duration::from_secs(60);
                        loop {
                            let out = self.exec(k % 2, id, "sha256sum /root/blob | cut -d' ' -f1");
                            if out.status.success() {
                                let got = String::from_utf8_lossy(&out.stdout);
                                assert_eq!(got.trim(), want, "{label}{id}'s file, client {k}");
                                return;
                            }
                            assert!(
                                Instant::now() < until,
                                "{label}client {k} of {id} never got an answer: {}",
                                String::from_utf8_lossy(&out.stderr)
                            );
                            std::thread::sleep(Duration::from_millis(300));
                        }
                    });
                }
            }
        });
    }

    /// Waits until a full snapshot of `id` taken after `after_ms` is in the store.
    pub fn wait_uploaded(&self, id: &str, after_ms: u64) {
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

    /// Waits until at least `count` live nodes report template `name`.
    pub fn wait_template_on(&self, name: &str, count: usize) {
        let until = Instant::now() + Duration::from_secs(120);
        loop {
            let nodes = json(&self.cli(0, &["--json", "node", "ls"]));
            let having = nodes
                .as_array()
                .unwrap()
                .iter()
                .filter(|n| {
                    n["live"] == true
                        && n["templates"].as_array().is_some_and(|t| {
                            t.iter().any(|t| {
                                t.as_str()
                                    .is_some_and(|t| t.split(':').next() == Some(name))
                            })
                        })
                })
                .count();
            if having >= count {
                return;
            }
            assert!(
                Instant::now() < until,
                "template {name} is not on {count} nodes: {nodes}\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    pub fn node_row(&self, id: &str) -> serde_json::Value {
        let nodes = json(&self.cli(1, &["--json", "node", "ls"]));
        nodes
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["id"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("node {id} is not listed: {nodes}"))
    }

    pub fn logs(&self) -> String {
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
pub const COUNTER: &str = "setsid sh -c 'n=0; while true; do n=$((n+1)); echo $n > /root/counter.new; \
                       mv /root/counter.new /root/counter; sleep 0.1; done' </dev/null >/dev/null 2>&1 &";

pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}
