//! End-to-end tests of the `space` command line against a real `space up` (real HTTP, real
//! SQLite, real QEMU guests). Each test starts one server; they run one at a time, since a
//! server with its warm pool keeps a 2-core host busy.

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::{json, ok, stderr, stdout, TestServer};
use serde_json::Value;
use sha2::{Digest, Sha256};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn sha256(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Asserts the command failed with exit 1 and one `error: ... (<code>)` line on stderr.
fn fails_with(out: &Output, code: &str) {
    let err = stderr(out);
    assert_eq!(
        out.status.code(),
        Some(1),
        "expected exit 1 with ({code}); stdout: {} stderr: {err}",
        stdout(out)
    );
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "expected one error line, got: {err}");
    assert!(
        lines[0].starts_with("error: ") && lines[0].ends_with(&format!("({code})")),
        "expected `error: ... ({code})`, got: {err}"
    );
}

fn id_of(v: &Value) -> String {
    let id = v["id"].as_str().unwrap_or_else(|| panic!("no id in {v}"));
    assert!(id.starts_with("sbx-") || id.starts_with("sb-"), "{id}");
    id.to_owned()
}

/// Runs a shell line in the sandbox (no stdin) and insists on exit 0; returns stdout.
fn sh(s: &TestServer, id: &str, line: &str) -> String {
    ok(&s.cli(["exec", "-n", id, "--", "sh", "-c", line]))
}

fn state(s: &TestServer, id: &str) -> String {
    json(&s.cli(["info", id, "--json"]))["state"]
        .as_str()
        .unwrap()
        .to_owned()
}

fn ids(list: &Value) -> Vec<String> {
    list.as_array()
        .unwrap_or_else(|| panic!("not an array: {list}"))
        .iter()
        .map(|v| v["id"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn a_sandbox_lives_its_whole_life_through_the_cli() {
    let _serial = serial();
    let s = TestServer::start();

    // Templates: the stock one the server built.
    let templates = json(&s.cli(["template", "ls", "--json"]));
    assert!(
        templates
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["name"] == "minimal"),
        "{templates}"
    );

    // Create, list, inspect.
    let sb = json(&s.cli([
        "create",
        "--template",
        "minimal",
        "--meta",
        "owner=e2e",
        "--env",
        "GREETING=hello",
        "--json",
    ]));
    let id = id_of(&sb);
    assert_eq!(sb["state"], "running");
    assert_eq!(sb["metadata"]["owner"], "e2e");
    let listed = json(&s.cli(["ls", "--meta", "owner=e2e", "--json"]));
    assert_eq!(ids(&listed), vec![id.clone()]);
    let human = ok(&s.cli(["ls"]));
    assert!(human.starts_with("ID ") && human.contains(&id), "{human}");
    assert_eq!(state(&s, &id), "running");

    // Exec: both output streams, the sandbox env, stdin through the WebSocket form.
    let out = s.cli([
        "exec",
        "-n",
        &id,
        "--",
        "sh",
        "-c",
        "echo out-$GREETING; echo err >&2",
    ]);
    assert_eq!(ok(&out), "out-hello\n");
    assert_eq!(stderr(&out), "err\n");
    let out = s.cli_stdin(b"line one\nline two\n", ["exec", &id, "--", "wc", "-l"]);
    assert_eq!(ok(&out).trim(), "2");

    // Exit codes, in both forms.
    assert_eq!(
        s.cli(["exec", "-n", &id, "--", "true"]).status.code(),
        Some(0)
    );
    for form in [&["-n"][..], &[][..]] {
        let mut args = vec!["exec"];
        args.extend_from_slice(form);
        let code = |line: &str| {
            let mut a = args.clone();
            a.extend([id.as_str(), "--", "sh", "-c", line]);
            s.cli(&a).status.code()
        };
        assert_eq!(code("exit 3"), Some(3), "form {form:?}");
        assert_eq!(code("kill -9 $$"), Some(137), "form {form:?}");
    }

    // cp up and down: 20 MB of random bytes keep their hash both ways.
    let local = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..20 << 20).map(|_| rand_byte()).collect();
    let want = sha256(&data);
    let up = local.path().join("big.bin");
    std::fs::write(&up, &data).unwrap();
    ok(&s.cli(["cp", up.to_str().unwrap(), &format!("{id}:/root/big.bin")]));
    let guest_sum = sh(&s, &id, "sha256sum /root/big.bin");
    assert_eq!(guest_sum.split_whitespace().next(), Some(want.as_str()));
    let down = local.path().join("back.bin");
    ok(&s.cli(["cp", &format!("{id}:/root/big.bin"), down.to_str().unwrap()]));
    assert_eq!(sha256(&std::fs::read(&down).unwrap()), want);
    let missing = s.cli(["cp", &format!("{id}:/root/nope"), down.to_str().unwrap()]);
    fails_with(&missing, "file_not_found");
    assert_eq!(
        sha256(&std::fs::read(&down).unwrap()),
        want,
        "a failed download must leave the old file"
    );

    // Pause and resume; exec wakes a paused sandbox.
    let paused = json(&s.cli(["pause", &id, "--json"]));
    assert_eq!(paused["state"], "paused");
    assert_eq!(sh(&s, &id, "echo awake").trim(), "awake");
    assert_eq!(state(&s, &id), "running");
    ok(&s.cli(["pause", &id]));
    ok(&s.cli(["resume", &id]));
    assert_eq!(state(&s, &id), "running");

    // Snapshot, change, roll back: the earlier content returns.
    sh(&s, &id, "echo one > /root/note && sync");
    let snap = json(&s.cli(["snapshot", &id, "--json"]));
    let snap_id = snap["id"].as_str().unwrap().to_owned();
    sh(&s, &id, "echo two > /root/note && sync");
    let snaps = json(&s.cli(["snapshots", &id, "--json"]));
    assert!(ids(&snaps).contains(&snap_id), "{snaps}");
    let rolled = json(&s.cli(["rollback", &id, &snap_id, "--json"]));
    assert_eq!(rolled["state"], "running");
    assert_eq!(sh(&s, &id, "cat /root/note"), "one\n");

    // Suspend and restore keep the disk.
    let suspended = json(&s.cli(["suspend", &id, "--json"]));
    assert_eq!(suspended["state"], "suspended");
    ok(&s.cli(["restore", &id]));
    assert_eq!(state(&s, &id), "running");
    assert_eq!(sh(&s, &id, "cat /root/note"), "one\n");

    // Timeouts and logs.
    let t = json(&s.cli([
        "timeout", &id, "--idle", "never", "--action", "kill", "--json",
    ]));
    assert_eq!(t["timeouts"]["idle_ms"], Value::Null);
    assert_eq!(t["timeouts"]["action"], "kill");
    let logs = s.cli(["logs", &id, "--tail", "4096"]);
    assert!(logs.status.success(), "{}", stderr(&logs));
    assert!(logs.stdout.len() <= 4096);

    // Fork: the child has the parent's file.
    let child = json(&s.cli(["fork", &id, "--json"]));
    let child_id = id_of(&child);
    assert_ne!(child_id, id);
    assert_eq!(child["forked_from"]["sandbox"], id.as_str());
    assert_eq!(sh(&s, &child_id, "cat /root/note"), "one\n");

    // Kill both; terminated ones are listed with --all only.
    for victim in [&child_id, &id] {
        let killed = json(&s.cli(["kill", victim, "--json"]));
        assert_eq!(killed["state"], "terminated");
    }
    let live = json(&s.cli(["ls", "--json"]));
    assert!(!ids(&live).contains(&id), "{live}");
    let all = json(&s.cli(["ls", "--all", "--json"]));
    assert!(
        ids(&all).contains(&id) && ids(&all).contains(&child_id),
        "{all}"
    );

    // Mistakes get one clear line and exit 1; usage errors exit 2.
    fails_with(
        &s.cli(["create", "--template", "nope"]),
        "template_not_found",
    );
    fails_with(
        &s.cli(["info", "sbx-0000000000000000"]),
        "sandbox_not_found",
    );
    assert_eq!(s.cli(["create"]).status.code(), Some(2));

    // The audit log saw the lifecycle.
    let events = json(&s.cli(["audit", "--sandbox", &id, "--json"]));
    let ops: Vec<&str> = events
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["operation"].as_str())
        .collect();
    for op in [
        "sandbox.create",
        "sandbox.pause",
        "snapshot.rollback",
        "sandbox.kill",
    ] {
        assert!(ops.contains(&op), "no {op} in {ops:?}");
    }
}

fn rand_byte() -> u8 {
    use std::cell::Cell;
    thread_local!(static STATE: Cell<u64> = Cell::new(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64 | 1)
            .unwrap_or(0x9e37_79b9_7f4a_7c15)
    ));
    STATE.with(|s| {
        // xorshift64: random enough that the file does not compress or dedupe.
        let mut x = s.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.set(x);
        (x >> 24) as u8
    })
}

#[test]
fn tenants_are_isolated_and_revoked_keys_are_refused() {
    let _serial = serial();
    let s = TestServer::start();

    // Two tenants, through the CLI; the human form prints the key alone on stdout.
    let acme = json(&s.cli(["tenant", "create", "acme", "--max-sandboxes", "5", "--json"]));
    let acme_key = acme["key"]["key"].as_str().unwrap().to_owned();
    let beta_key = ok(&s.cli(["tenant", "create", "beta"])).trim().to_owned();
    assert!(beta_key.starts_with("space_"), "{beta_key}");
    // Every tenant starts on the deployment's master key; a KMS key needs all its parts.
    let mk = json(&s.cli(["tenant", "master-key", "acme", "--json"]));
    assert_eq!(mk["provider"], "deployment", "{mk}");
    assert!(mk["id"].as_str().unwrap().starts_with("local:"), "{mk}");
    assert!(!s
        .cli(["tenant", "master-key", "acme", "--kms-key-id", "k"])
        .status
        .success());
    let tenants = json(&s.cli(["tenant", "ls", "--json"]));
    let names: Vec<&str> = tenants
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(
        names.contains(&"acme") && names.contains(&"beta"),
        "{names:?}"
    );

    // acme's sandbox is invisible and untouchable for beta.
    let sb = json(&s.cli_as(&acme_key, ["create", "--template", "minimal", "--json"]));
    let id = id_of(&sb);
    assert_eq!(sb["tenant"], "acme");
    let beta_list = json(&s.cli_as(&beta_key, ["ls", "--json"]));
    assert!(!ids(&beta_list).contains(&id), "{beta_list}");
    fails_with(&s.cli_as(&beta_key, ["info", &id]), "sandbox_not_found");
    fails_with(
        &s.cli_as(&beta_key, ["exec", "-n", &id, "--", "true"]),
        "sandbox_not_found",
    );
    fails_with(&s.cli_as(&beta_key, ["kill", &id]), "sandbox_not_found");
    fails_with(
        &s.cli_as(&beta_key, ["cp", &format!("{id}:/etc/passwd"), "-"]),
        "sandbox_not_found",
    );
    assert_eq!(
        ok(&s.cli_as(&acme_key, ["exec", "-n", &id, "--", "echo", "mine"])),
        "mine\n"
    );

    // Tenant keys cannot administer.
    fails_with(&s.cli_as(&acme_key, ["tenant", "ls"]), "forbidden");

    // A second key, then revoked: refused with one line, and audited.
    let second = json(&s.cli(["key", "create", "acme", "--label", "second", "--json"]));
    let (second_id, second_key) = (
        second["id"].as_str().unwrap().to_owned(),
        second["key"].as_str().unwrap().to_owned(),
    );
    assert_eq!(second["label"], "second");
    assert!(ok(&s.cli_as(&second_key, ["ls"])).starts_with("ID "));
    ok(&s.cli(["key", "revoke", &second_id]));
    let keys = json(&s.cli(["key", "ls", "acme", "--json"]));
    let revoked = keys
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["id"] == second_id.as_str())
        .unwrap_or_else(|| panic!("{second_id} not in {keys}"));
    assert!(revoked["revoked_unix_ms"].is_u64(), "{revoked}");
    assert!(
        revoked.get("key").is_none(),
        "a listed key shows its secret"
    );
    fails_with(&s.cli_as(&second_key, ["ls"]), "unauthorized");
    let events = json(&s.cli(["audit", "--operation", "auth", "--json"]));
    assert!(
        events
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["result"] == "unauthorized"),
        "{events}"
    );

    ok(&s.cli_as(&acme_key, ["kill", &id]));

    // A server that is not there: one line that says so and how to start one.
    let mut cmd = Command::new(common::space_bin());
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_url = format!("http://{}", dead.local_addr().unwrap());
    drop(dead);
    cmd.env("SPACE_URL", &dead_url)
        .env("SPACE_API_KEY", &s.admin_key)
        .args(["ls"]);
    let out = common::run(cmd, None);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.lines().count() == 1
            && err.contains("not reachable")
            && err.contains(&dead_url)
            && err.contains("space up"),
        "{err}"
    );
}

/// A tmux server on a private socket, killed on drop.
struct Tmux {
    socket: std::path::PathBuf,
}

impl Tmux {
    fn cmd(&self) -> Command {
        let mut c = Command::new("tmux");
        c.arg("-S").arg(&self.socket);
        c
    }

    fn run(&self, args: &[&str]) -> String {
        let out = self.cmd().args(args).output().expect("running tmux");
        assert!(out.status.success(), "tmux {args:?}: {}", stderr(&out));
        stdout(&out)
    }

    /// Waits until the pane shows `text`; returns the pane.
    fn wait_for(&self, text: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let pane = self.run(&["capture-pane", "-p", "-t", "e2e"]);
            if pane.contains(text) {
                return pane;
            }
            assert!(
                Instant::now() < deadline,
                "the terminal never showed {text:?}; it shows:\n{pane}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd().arg("kill-server").output();
    }
}

#[test]
fn the_shell_runs_on_a_real_terminal_and_sandboxes_survive_a_restart() {
    let _serial = serial();
    let mut s = TestServer::start();
    let id = id_of(&json(&s.cli(["create", "--template", "minimal", "--json"])));

    // `space shell` on a tmux pane: typed input runs, the size follows a resize, and the
    // shell's exit code comes back.
    let dir = tempfile::tempdir().unwrap();
    let tmux = Tmux {
        socket: dir.path().join("tmux.sock"),
    };
    let script = dir.path().join("shell.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n{} shell {id}\necho shell-exit-$?\nsleep 600\n",
            common::space_bin().display()
        ),
    )
    .unwrap();
    set_executable(&script);
    tmux.run(&[
        "new-session",
        "-d",
        "-s",
        "e2e",
        "-x",
        "100",
        "-y",
        "30",
        "-e",
        &format!("SPACE_URL={}", s.url),
        "-e",
        &format!("SPACE_API_KEY={}", s.admin_key),
        script.to_str().unwrap(),
    ]);
    tmux.run(&["send-keys", "-t", "e2e", "echo hi-$((6*7))", "Enter"]);
    tmux.wait_for("hi-42");
    tmux.run(&["resize-window", "-t", "e2e", "-x", "120", "-y", "40"]);
    // The resize travels asynchronously (SIGWINCH, then a message): ask until it shows.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        tmux.run(&["send-keys", "-t", "e2e", "clear; stty size", "Enter"]);
        std::thread::sleep(Duration::from_millis(500));
        let pane = tmux.run(&["capture-pane", "-p", "-t", "e2e"]);
        if pane.lines().any(|l| l.trim() == "40 120") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "stty size never said 40 120:\n{pane}"
        );
    }
    tmux.run(&["send-keys", "-t", "e2e", "exit 7", "Enter"]);
    tmux.wait_for("shell-exit-7");
    drop(tmux);

    // A file written before a restart is there after it, in the same running sandbox.
    sh(&s, &id, "echo kept-$((40+2)) > /root/kept && sync");
    s.restart();
    assert_eq!(state(&s, &id), "running");
    assert_eq!(sh(&s, &id, "cat /root/kept"), "kept-42\n");
    let log = std::fs::read_to_string(&s.log_path).unwrap_or_default();
    assert!(
        log.contains("shown on the first start"),
        "the second start should say where the key went:\n{}",
        s.log_tail()
    );
    // The config the server wrote works on its own (no SPACE_API_KEY).
    let listed = json(&common::run(
        {
            let mut c = s.command(None);
            c.env_remove("SPACE_URL").args(["ls", "--json"]);
            c
        },
        None,
    ));
    assert!(ids(&listed).contains(&id), "{listed}");
    ok(&s.cli(["kill", &id]));
}

fn set_executable(p: &Path) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn templates_are_built_from_a_dockerfile_and_saved_from_a_sandbox() {
    let _serial = serial();
    let s = TestServer::start();
    let dir = tempfile::tempdir().unwrap();
    let ctx = dir.path().join("app");
    std::fs::create_dir_all(&ctx).unwrap();
    std::fs::write(ctx.join("note.txt"), "from the context\n").unwrap();
    std::fs::write(ctx.join("private.key"), "never sent\n").unwrap();
    std::fs::write(ctx.join(".dockerignore"), "*.key\n").unwrap();
    std::fs::write(
        ctx.join("Dockerfile"),
        "FROM minimal\nCOPY . /app\nWORKDIR /app\nRUN echo step-output-line && wc -l < note.txt > lines\n",
    )
    .unwrap();
    let df = ctx.join("Dockerfile");
    let out = s.cli([
        "template",
        "build",
        "mine",
        "--dockerfile",
        df.to_str().unwrap(),
    ]);
    let (log, said) = (stderr(&out), stdout(&out));
    assert!(out.status.success(), "{log}{said}");
    // The build's log streamed to stderr, the result on stdout.
    assert!(
        log.contains("step-output-line") && log.contains("3 steps, 0 from the cache"),
        "{log}"
    );
    assert!(said.contains("template mine:1 built"), "{said}");
    let id = id_of(&json(&s.cli(["create", "--template", "mine", "--json"])));
    assert_eq!(
        sh(&s, &id, "cat lines; pwd; ls /app"),
        "1\n/app\nDockerfile\nlines\nnote.txt\n"
    );

    // The builds list and a build's log afterwards.
    let builds = json(&s.cli(["template", "builds", "--json"]));
    let build = builds[0]["id"].as_str().unwrap().to_owned();
    assert_eq!(builds[0]["state"], "succeeded");
    let logs = s.cli(["template", "logs", &build]);
    assert!(
        stderr(&logs).contains("step-output-line"),
        "{}",
        stderr(&logs)
    );

    // A failing step fails the command with its output.
    std::fs::write(&df, "FROM minimal\nRUN echo it-broke; false\n").unwrap();
    let out = s.cli([
        "template",
        "build",
        "broken",
        "--dockerfile",
        df.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("it-broke") && err.contains("exited with code 1"),
        "{err}"
    );

    // A sandbox saved as a template carries its files.
    sh(&s, &id, "echo saved-state > /app/state");
    let saved = json(&s.cli(["template", "save", &id, "mine-saved", "--json"]));
    assert_eq!(saved["name"], "mine-saved");
    let copy = id_of(&json(&s.cli([
        "create",
        "--template",
        "mine-saved",
        "--json",
    ])));
    assert_eq!(sh(&s, &copy, "cat /app/state"), "saved-state\n");
    for sb in [&id, &copy] {
        ok(&s.cli(["kill", sb]));
    }
}

#[test]
fn volumes_and_metrics_through_the_cli() {
    let _serial = serial();
    let mut s = TestServer::start();
    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join("data.csv");
    std::fs::write(&local, b"a,b\n1,2\n").unwrap();

    // A volume, a file copied in without a sandbox.
    assert_eq!(
        ok(&s.cli(["volume", "create", "data", "--size", "64"])).trim(),
        "data"
    );
    fails_with(&s.cli(["volume", "create", "data"]), "volume_exists");
    ok(&s.cli(["volume", "cp", local.to_str().unwrap(), "data:/"]));
    let listed = json(&s.cli(["volume", "ls", "--json"]));
    assert_eq!(listed[0]["name"], "data", "{listed}");
    assert_eq!(listed[0]["size_bytes"], 64 << 20, "{listed}");
    assert!(ok(&s.cli(["volume", "files", "data"])).contains("data.csv"));

    // A sandbox mounts it, reads what was copied in and writes what is copied out.
    let sb = json(&s.cli([
        "create",
        "--template",
        "minimal",
        "--volume",
        "data:/data",
        "--json",
    ]));
    let id = id_of(&sb);
    assert_eq!(sb["volumes"][0]["path"], "/data", "{sb}");
    assert_eq!(sh(&s, &id, "cat /data/data.csv"), "a,b\n1,2\n");
    sh(&s, &id, "echo from-the-sandbox > /data/out.txt");
    let back = dir.path().join("out.txt");
    ok(&s.cli(["volume", "cp", "data:/out.txt", back.to_str().unwrap()]));
    assert_eq!(std::fs::read(&back).unwrap(), b"from-the-sandbox\n");
    fails_with(&s.cli(["volume", "rm", "data"]), "volume_in_use");

    // Copied to the server's object store within the copy interval, past the last write.
    let written = now_unix_ms();
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let listed = json(&s.cli(["volume", "ls", "--json"]));
        if listed[0]["synced_unix_ms"]
            .as_u64()
            .is_some_and(|t| t > written)
        {
            break;
        }
        assert!(Instant::now() < deadline, "no copy of the volume: {listed}");
        std::thread::sleep(Duration::from_secs(1));
    }

    // A restart of `space up`: the volume, its files and the running sandbox's mount stay.
    s.restart();
    assert_eq!(sh(&s, &id, "cat /data/out.txt"), "from-the-sandbox\n");
    sh(&s, &id, "echo after-the-restart > /data/after.txt");
    ok(&s.cli(["volume", "cp", "data:/after.txt", back.to_str().unwrap()]));
    assert_eq!(std::fs::read(&back).unwrap(), b"after-the-restart\n");

    // Its samples: one after two sampling intervals, in `space metrics` and `space top`.
    let deadline = Instant::now() + Duration::from_secs(60);
    let metrics = loop {
        let m = json(&s.cli(["metrics", &id, "--json"]));
        if m["samples"].as_array().is_some_and(|a| !a.is_empty()) || Instant::now() > deadline {
            break m;
        }
        std::thread::sleep(Duration::from_secs(2));
    };
    let sample = &metrics["samples"][0];
    assert!(sample["cpu_count"].as_u64() >= Some(1), "{metrics}");
    assert!(sample["mem_total_bytes"].as_u64() > Some(0), "{metrics}");
    let top = json(&s.cli(["top", "--json"]));
    let row = top
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == id.as_str())
        .unwrap_or_else(|| panic!("{id} not in {top}"));
    assert!(row["sample"]["mem_used_bytes"].as_u64() > Some(0), "{top}");
    let table = ok(&s.cli(["top", "--once"]));
    assert!(
        table.starts_with("ID ") && table.contains(&id) && table.contains("CPU%"),
        "{table}"
    );

    ok(&s.cli(["kill", &id]));
    ok(&s.cli(["volume", "rm", "data"]));
    fails_with(&s.cli(["volume", "rm", "data"]), "volume_not_found");
}

fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}
