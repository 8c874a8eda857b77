//! Chaos: `space up` killed with SIGKILL at random moments while 20 clients send it mixed
//! requests (create, file writes, execs that read files back, snapshots, pause and resume,
//! kills), then started again on the same data directory, round after round.
//!
//! Every answer a client got is a promise the restarted server must keep: a sandbox whose
//! create was answered `201` and whose kill was never sent is there and alive, every file
//! write answered `200` reads back byte for byte (a SHA-256 ledger), and nothing is left
//! over: each QEMU process belongs to a live sandbox or a warm-pool member, each record
//! to a sandbox the clients created or were creating, no cgroup of a sandbox stays without
//! its VM, and the only mount and loop device under the test's directory are the data
//! image's own. The restarted server's own work in hand (a rolling snapshot, a pool member
//! being made) is not a leftover: one is what is still there after 20 s.
//!
//! No answer may be a 5xx: a request cut short by another (a kill under a write) is a 4xx
//! saying so, and nothing here is an internal fault.
//!
//! `SPACE_CHAOS_ROUNDS` sets the rounds (default 2, as `make test` runs it; `make soak`
//! runs 20) and `SPACE_CHAOS_SEED` the seed of the moments and the mix (printed, so a
//! failure can be run again).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{env_number, TestServer};
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use sha2::{Digest, Sha256};

/// Concurrent clients.
const CLIENTS: usize = 20;
/// Sandboxes alive at once (the clients create more as they kill some).
const MAX_LIVE: usize = 4;

/// One HTTP/1.0 exchange (so the answer is never chunked): the status and the body, or
/// `None` when the connection failed (the server is down or died under the request).
fn request(
    addr: SocketAddr,
    key: &str,
    method: &str,
    path: &str,
    body: &[u8],
) -> Option<(u16, Vec<u8>)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(180))).ok()?;
    let head = format!(
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nAuthorization: Bearer {key}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).ok()?;
    s.write_all(body).ok()?;
    let mut buf = Vec::new();
    Read::by_ref(&mut s)
        .take(64 << 20)
        .read_to_end(&mut buf)
        .ok()?;
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&buf[..end]);
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, buf[end + 4..].to_vec()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What the clients were told, and what they were still waiting for when the server died.
#[derive(Default)]
struct Ledger {
    /// Created (`201`), not killed: must be alive after every restart.
    live: BTreeSet<String>,
    /// A kill was sent (answered or not): may be anything but absent.
    killing: BTreeSet<String>,
    /// Every id any answer named.
    seen: BTreeSet<String>,
    /// Creates sent and not answered.
    creating: u64,
    /// `(sandbox, path)` → the SHA-256 of what a `200` write put there.
    files: BTreeMap<(String, String), String>,
    /// Answers by operation and status class.
    counts: BTreeMap<String, u64>,
    /// The first answers of 5xx, for the report.
    server_errors: Vec<String>,
    /// Execs that read a written file back and found other bytes.
    mismatches: Vec<String>,
}

impl Ledger {
    fn count(&mut self, op: &str, got: &Option<(u16, Vec<u8>)>) {
        let status = got.as_ref().map(|g| g.0);
        if let Some((code @ 500.., body)) = got {
            if self.server_errors.len() < 20 {
                let body = String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
                self.server_errors.push(format!("{op}: {code} {body}"));
            }
        }
        let class = match status {
            Some(s) => format!("{}xx", s / 100),
            None => "cut".to_owned(),
        };
        *self.counts.entry(format!("{op} {class}")).or_default() += 1;
    }
}

fn sandbox_id(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    v["id"].as_str().map(str::to_owned)
}

/// One client: mixed requests until `stop`.
fn client(
    addr: SocketAddr,
    key: String,
    seed: u64,
    stop: Arc<AtomicBool>,
    ledger: Arc<Mutex<Ledger>>,
    files: Arc<AtomicU64>,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let lock = || ledger.lock().unwrap_or_else(|e| e.into_inner());
    while !stop.load(Ordering::Relaxed) {
        if TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err() {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        let pick = {
            let l = lock();
            let live: Vec<String> = l.live.difference(&l.killing).cloned().collect();
            let room = live.len() + l.creating as usize;
            (live, room)
        };
        let (live, room) = pick;
        let roll = rng.gen_range(0..100u64);
        if live.is_empty() || (room < MAX_LIVE && roll < 15) {
            if room >= MAX_LIVE {
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
            lock().creating += 1;
            let got = request(
                addr,
                &key,
                "POST",
                "/v1/sandboxes",
                br#"{"template":"minimal"}"#,
            );
            let mut l = lock();
            l.creating -= 1;
            l.count("create", &got);
            if let Some((201, body)) = &got {
                let id = sandbox_id(body).expect("a create's answer names the sandbox");
                l.seen.insert(id.clone());
                l.live.insert(id);
            }
            continue;
        }
        let id = live[rng.gen_range(0..live.len())].clone();
        match roll {
            0..=39 => {
                let n = files.fetch_add(1, Ordering::Relaxed);
                let path = format!("/root/chaos-{n}");
                let len = rng.gen_range(1..=64usize << 10);
                let data: Vec<u8> = {
                    let mut d = vec![0; len];
                    rng.fill_bytes(&mut d);
                    d
                };
                let sum = hex(&Sha256::digest(&data));
                let got = request(
                    addr,
                    &key,
                    "PUT",
                    &format!("/v1/sandboxes/{id}/files?path={path}"),
                    &data,
                );
                let mut l = lock();
                l.count("write", &got);
                if matches!(got, Some((200, _))) {
                    l.files.insert((id, path), sum);
                }
            }
            40..=64 => {
                // Read a written file back through the guest.
                let known = {
                    let l = lock();
                    l.files
                        .iter()
                        .rev()
                        .find(|((s, _), _)| *s == id)
                        .map(|((_, p), h)| (p.clone(), h.clone()))
                };
                let Some((path, sum)) = known else {
                    continue;
                };
                let body = serde_json::json!({"cmd": ["sha256sum", path], "timeout_ms": 60000});
                let got = request(
                    addr,
                    &key,
                    "POST",
                    &format!("/v1/sandboxes/{id}/exec"),
                    body.to_string().as_bytes(),
                );
                let mut l = lock();
                l.count("exec", &got);
                if let Some((200, out)) = got {
                    let text = String::from_utf8_lossy(&out);
                    let exited = text.contains("\"exit\"") || text.contains("\"exited\"");
                    let read = stdout_of(&text);
                    if exited && !read.starts_with(&sum) && l.live.contains(&id) {
                        l.mismatches
                            .push(format!("{id}:{path}: wrote {sum}, read {read:?}"));
                    }
                }
            }
            65..=77 => {
                let got = request(
                    addr,
                    &key,
                    "POST",
                    &format!("/v1/sandboxes/{id}/snapshots"),
                    b"{}",
                );
                lock().count("snapshot", &got);
            }
            78..=93 => {
                let got = request(
                    addr,
                    &key,
                    "POST",
                    &format!("/v1/sandboxes/{id}/pause"),
                    b"",
                );
                lock().count("pause", &got);
                let got = request(
                    addr,
                    &key,
                    "POST",
                    &format!("/v1/sandboxes/{id}/resume"),
                    b"",
                );
                lock().count("resume", &got);
            }
            // Kills only while every slot is taken, so the restarted server always has
            // sandboxes (and files) it promised to keep.
            _ if live.len() >= MAX_LIVE => {
                lock().killing.insert(id.clone());
                let got = request(addr, &key, "DELETE", &format!("/v1/sandboxes/{id}"), b"");
                let mut l = lock();
                l.count("kill", &got);
                if matches!(got, Some((200, _))) {
                    l.live.remove(&id);
                    l.files.retain(|(s, _), _| *s != id);
                }
            }
            _ => {}
        }
    }
}

/// The stdout an exec's NDJSON answer carried (base64 in `stdout` events).
fn stdout_of(ndjson: &str) -> String {
    use base64::Engine as _;
    let mut out = Vec::new();
    for line in ndjson.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if v["type"] == "stdout" {
            if let Some(d) = v["data"].as_str() {
                if let Ok(b) = base64::engine::general_purpose::STANDARD.decode(d) {
                    out.extend(b);
                }
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The sandboxes the API lists with their state (all states).
fn states_of(server: &TestServer) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for path in ["/v1/sandboxes", "/v1/sandboxes?state=terminated"] {
        let v: serde_json::Value =
            serde_json::from_str(&server.get(path)).expect("the list is JSON");
        for s in v["sandboxes"].as_array().expect("a list of sandboxes") {
            out.insert(
                s["id"].as_str().expect("an id").to_owned(),
                s["state"].as_str().expect("a state").to_owned(),
            );
        }
    }
    out
}

/// Checks everything the ledger promises against the restarted server; answers what is
/// wrong.
fn check(server: &TestServer, ledger: &Ledger, unanswered_creates: u64) -> Vec<String> {
    let mut wrong = ledger.mismatches.clone();
    let states = states_of(server);
    for id in ledger.live.difference(&ledger.killing) {
        match states.get(id).map(String::as_str) {
            Some("running" | "paused" | "suspended") => {}
            other => wrong.push(format!("{id}: created (201), never killed, now {other:?}")),
        }
    }
    for id in &ledger.killing {
        if !states.contains_key(id) {
            wrong.push(format!(
                "{id}: a kill was sent and the sandbox is gone from the list"
            ));
        }
    }
    let unknown: Vec<&String> = states
        .iter()
        .filter(|(id, state)| *state != "terminated" && !ledger.seen.contains(*id))
        .map(|(id, _)| id)
        .collect();
    if unknown.len() as u64 > unanswered_creates {
        wrong.push(format!(
            "{} sandboxes nobody was told of ({unknown:?}), {unanswered_creates} creates were \
             unanswered",
            unknown.len()
        ));
    }
    // The ledger: every acknowledged write reads back.
    let addr = server.addr;
    for ((id, path), sum) in &ledger.files {
        if ledger.killing.contains(id) {
            continue;
        }
        let got = request(
            addr,
            &server.admin_key,
            "GET",
            &format!("/v1/sandboxes/{id}/files?path={path}"),
            b"",
        );
        match got {
            Some((200, body)) if hex(&Sha256::digest(&body)) == *sum => {}
            Some((200, body)) => wrong.push(format!(
                "{id}:{path}: wrote {sum}, reads {} ({} bytes)",
                hex(&Sha256::digest(&body)),
                body.len()
            )),
            other => wrong.push(format!(
                "{id}:{path}: an acknowledged write is unreadable: {:?}",
                other.map(|(s, b)| (s, String::from_utf8_lossy(&b).into_owned()))
            )),
        }
    }
    // The restarted server works as well (a rolling snapshot, a pool member being made):
    // what it has in hand passes; a leftover is what stays, here for 20 s.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let left = leftovers(server, &states_of(server));
        if left.is_empty() || std::time::Instant::now() >= deadline {
            wrong.extend(left);
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    wrong
}

/// QEMU processes, records, cgroups, mounts and loop devices that belong to nothing.
fn leftovers(server: &TestServer, states: &BTreeMap<String, String>) -> Vec<String> {
    let mut wrong = Vec::new();
    let data = &server.data_dir;
    let records = space_node::record::RecordStore::open(data.join("state").join("sandboxes"))
        .expect("the record directory")
        .list()
        .expect("the records read");
    let pooled: BTreeSet<String> = records
        .iter()
        .filter(|r| r.is_pooled())
        .map(|r| r.id.to_string())
        .collect();
    for r in &records {
        let id = r.id.to_string();
        if !pooled.contains(&id) && !states.contains_key(&id) {
            wrong.push(format!(
                "record {id} ({:?}) is not listed by the API",
                r.state
            ));
        }
        if r.pending.is_some() && !pooled.contains(&id) {
            wrong.push(format!("record {id} still has a pending {:?}", r.pending));
        }
    }
    // Each VM belongs to a live sandbox or a pool member, and each live sandbox has its VM.
    let with_vm: BTreeSet<String> = states
        .iter()
        .filter(|(_, s)| matches!(s.as_str(), "running" | "paused"))
        .map(|(id, _)| id.clone())
        .collect();
    let sandboxes = data.join("sandboxes");
    // A jailed QEMU's root is its sandbox directory (it pivots into it): match by inode.
    let inode = |p: &Path| {
        use std::os::unix::fs::MetadataExt as _;
        std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()))
    };
    let dirs: BTreeMap<(u64, u64), String> = with_vm
        .iter()
        .chain(pooled.iter())
        .filter_map(|id| inode(&sandboxes.join(id)).map(|k| (k, id.clone())))
        .collect();
    let mut owners = BTreeSet::new();
    let mut owned = BTreeSet::new();
    for pid in space_node::teardown::vms_of(data) {
        let proc = Path::new("/proc").join(pid.to_string());
        let owner = ["root", "cwd"]
            .iter()
            .filter_map(|l| inode(&proc.join(l)))
            .find_map(|k| dirs.get(&k).cloned());
        if let Some(id) = owner {
            owners.insert(id);
            owned.insert(pid);
        }
    }
    let mut cgroup_parents = BTreeSet::new();
    for pid in space_node::teardown::vms_of(data) {
        let proc = Path::new("/proc").join(pid.to_string());
        if !owned.contains(&pid) {
            let cmdline = std::fs::read(proc.join("cmdline")).unwrap_or_default();
            let link = |l: &str| std::fs::read_link(proc.join(l)).unwrap_or_default();
            wrong.push(format!(
                "QEMU {pid} (cwd {}, root {}) belongs to no live sandbox: {}",
                link("cwd").display(),
                link("root").display(),
                String::from_utf8_lossy(&cmdline).replace('\0', " ")
            ));
        }
        // cgroup v2 (`0::/path`) or v1's memory hierarchy (`N:memory:/path`).
        for line in std::fs::read_to_string(proc.join("cgroup"))
            .unwrap_or_default()
            .lines()
        {
            let mut parts = line.splitn(3, ':');
            let (_, controllers, path) = (parts.next(), parts.next(), parts.next());
            let root = match controllers {
                Some("") => Path::new("/sys/fs/cgroup").to_owned(),
                Some("memory") => Path::new("/sys/fs/cgroup/memory").to_owned(),
                _ => continue,
            };
            let dir = root.join(path.unwrap_or("").trim_start_matches('/'));
            if let Some(parent) = dir.parent() {
                cgroup_parents.insert(parent.to_owned());
            }
        }
    }
    for id in with_vm.difference(&owners) {
        wrong.push(format!("{id} is {} but has no QEMU", states[id]));
    }
    // A sandbox's cgroup is `<id>-<hash>`; one without processes is left over.
    for parent in cgroup_parents {
        for entry in std::fs::read_dir(&parent).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some((id, _)) = name.rsplit_once('-') else {
                continue;
            };
            if !states.contains_key(id) && !pooled.contains(id) {
                continue;
            }
            let procs =
                std::fs::read_to_string(entry.path().join("cgroup.procs")).unwrap_or_default();
            if procs.trim().is_empty() {
                wrong.push(format!("cgroup {} has no VM", entry.path().display()));
            }
        }
    }
    let top = data.parent().expect("the test's directory");
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let under: Vec<&str> = mounts
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter(|m| Path::new(m).starts_with(top))
        .collect();
    if under.len() != 1 {
        wrong.push(format!(
            "mounts under {}: {under:?} (only the data image's)",
            top.display()
        ));
    }
    let loops = std::process::Command::new("losetup")
        .args(["--list", "--noheadings", "--output", "BACK-FILE"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let backing: Vec<&str> = loops
        .lines()
        .map(str::trim)
        .filter(|f| Path::new(f).starts_with(top))
        .collect();
    if backing.len() != 1 {
        wrong.push(format!(
            "loop devices on files under {}: {backing:?}",
            top.display()
        ));
    }
    wrong
}

#[test]
fn the_server_killed_at_any_moment_keeps_every_answer_it_gave() {
    let rounds = env_number("SPACE_CHAOS_ROUNDS", 2);
    let seed = env_number("SPACE_CHAOS_SEED", 0x5eed_c4a0);
    println!("chaos: {rounds} rounds, SPACE_CHAOS_SEED={seed}");
    let mut server = TestServer::start();
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let files = Arc::new(AtomicU64::new(0));
    let mut rng = StdRng::seed_from_u64(seed);
    for round in 0..rounds {
        let stop = Arc::new(AtomicBool::new(false));
        let clients: Vec<_> = (0..CLIENTS)
            .map(|i| {
                let (addr, key) = (server.addr, server.admin_key.clone());
                let (stop, ledger, files) = (stop.clone(), ledger.clone(), files.clone());
                let seed = rng.next_u64() ^ i as u64;
                std::thread::spawn(move || client(addr, key, seed, stop, ledger, files))
            })
            .collect();
        // A moment in the mix: between 4 and 20 s in.
        let after = Duration::from_millis(rng.gen_range(4_000..20_000));
        std::thread::sleep(after);
        let in_flight = ledger.lock().unwrap().creating;
        server.crash();
        stop.store(true, Ordering::Relaxed);
        for c in clients {
            c.join().expect("a client thread");
        }
        server.start_again();
        // Creates that never got their answer (the server died under them).
        let unanswered = {
            let l = ledger.lock().unwrap();
            in_flight.max(l.counts.get("create cut").copied().unwrap_or(0))
        };
        let mut l = ledger.lock().unwrap();
        let mut wrong = check(&server, &l, unanswered);
        println!(
            "round {round}: killed after {after:?}; {} sandboxes alive, {} files in the \
             ledger; answers {:?}; first server errors {:#?}",
            l.live.difference(&l.killing).count(),
            l.files.len(),
            l.counts,
            l.server_errors
        );
        // A refusal is 4xx; only an internal fault may be 5xx, and none is expected here.
        wrong.extend(
            l.server_errors
                .drain(..)
                .map(|e| format!("a 5xx answer: {e}")),
        );
        assert!(
            wrong.is_empty(),
            "after a SIGKILL in round {round} (SPACE_CHAOS_SEED={seed}):\n{}\n---- server \
             log ----\n{}",
            wrong.join("\n"),
            server.log_tail()
        );
    }
}
