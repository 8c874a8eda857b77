//! Background processes (`start_process`, `read_process_output`, `stop_process`).
//!
//! A background process lives in the sandbox, not in this server: a short exec starts it in
//! a session of its own with its stdout and stderr going to files under
//! `/tmp/space-proc-<id>/`, and writes its exit code there when it ends. Reading its output
//! later reads those files through the file operations. So a process outlives the MCP connection
//! that started it, the server's restarts, and the sandbox's suspend and restore (its
//! memory is kept), and any client with the tenant's key can read it.

use std::time::Duration;

use serde::Serialize;

use crate::api::{Conn, Failure};

/// The directory of process `pid` in the guest.
fn dir(process: &str) -> String {
    format!("/tmp/space-proc-{process}")
}

/// Longest process id accepted.
const MAX_ID: usize = 32;

/// Checks an id a client gave back (it becomes part of a path in the guest).
pub fn check_id(process: &str) -> Result<(), Failure> {
    if process.is_empty()
        || process.len() > MAX_ID
        || !process
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    {
        return Err(Failure::local(
            "invalid_request",
            format!(
                "{process:?} is not a process id: start_process returns one (lowercase letters \
                 and digits)"
            ),
        ));
    }
    Ok(())
}

/// The start script. It runs with `SPACE_PROC_DIR` and `SPACE_PROC_CMD` set; the process
/// itself sees neither. A wrapper shell leads a session of its own, runs the process and
/// writes its exit status; it handles the signals `stop_process` sends to the whole group
/// (a handled signal is reset in the child, an ignored one would not be), so it outlives the
/// process to write the status. The script prints the wrapper's pid once it has written it.
const START: &str = r#"d="$SPACE_PROC_DIR"
mkdir -m 700 "$d" || exit 97
: >"$d/stdout"; : >"$d/stderr"
printf '%s\n' "$SPACE_PROC_CMD" >"$d/command"
s=; command -v setsid >/dev/null 2>&1 && s=setsid
$s sh -c 'd=$SPACE_PROC_DIR; c=$SPACE_PROC_CMD; unset SPACE_PROC_DIR SPACE_PROC_CMD
trap true TERM INT HUP
echo $$ >"$d/pid.new" && mv "$d/pid.new" "$d/pid"
sh -c "$c" >"$d/stdout" 2>"$d/stderr" </dev/null
s=$?
echo $s >"$d/exit.new" && mv "$d/exit.new" "$d/exit"' </dev/null >/dev/null 2>&1 &
i=0
while [ ! -s "$d/pid" ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done
cat "$d/pid""#;

/// What `start_process` answers.
#[derive(Debug, Serialize)]
pub struct Started {
    /// The id to read its output with.
    pub process_id: String,
    /// Its pid in the guest.
    pub pid: u32,
    /// Where its output goes.
    pub stdout_path: String,
    /// Likewise for stderr.
    pub stderr_path: String,
}

/// Starts `command` in the background.
pub async fn start(
    conn: &Conn,
    id: &str,
    command: &str,
    cwd: Option<String>,
    mut env: std::collections::BTreeMap<String, String>,
) -> Result<Started, Failure> {
    let process = format!("{:016x}", rand::random::<u64>());
    let d = dir(&process);
    env.insert("SPACE_PROC_DIR".into(), d.clone());
    env.insert("SPACE_PROC_CMD".into(), command.to_owned());
    let run = crate::exec::Run {
        command: START.to_owned(),
        cwd,
        env,
        stdin: None,
        timeout: Duration::from_secs(60),
        max_output: 4096,
    };
    let ran = crate::exec::run(conn, id, run, &Default::default()).await?;
    let pid = ran.stdout.trim().parse::<u32>().ok();
    match (ran.exit_code, pid) {
        (Some(0), Some(pid)) => Ok(Started {
            process_id: process,
            pid,
            stdout_path: format!("{d}/stdout"),
            stderr_path: format!("{d}/stderr"),
        }),
        _ => Err(Failure::local(
            "start_failed",
            format!(
                "the process did not start (exit {:?}): {}{}",
                ran.exit_code,
                ran.stderr.trim(),
                if ran.exit_code == Some(97) {
                    " (cannot make its directory under /tmp)"
                } else {
                    ""
                }
            ),
        )),
    }
}

/// What `read_process_output` answers.
#[derive(Debug, Serialize)]
pub struct Output {
    /// Whether the process is still running.
    pub running: bool,
    /// Its exit code, once it has ended (`null` while running, or when it was lost with a
    /// reboot of the sandbox).
    pub exit_code: Option<i32>,
    /// stdout from `stdout_offset`.
    pub stdout: String,
    /// stderr from `stderr_offset`.
    pub stderr: String,
    /// The offset to read stdout from next time.
    pub stdout_next_offset: u64,
    /// Likewise for stderr.
    pub stderr_next_offset: u64,
    /// Bytes of stdout written so far.
    pub stdout_size: u64,
    /// Bytes of stderr written so far.
    pub stderr_size: u64,
    /// Whether more output is there than was returned (read again from the next offsets).
    pub more: bool,
}

/// The size of a guest file, `None` when it does not exist.
async fn size(conn: &Conn, id: &str, path: &str) -> Result<Option<u64>, Failure> {
    match conn.ops.stat(&conn.who, id, path).await {
        Ok(stat) => Ok(Some(stat.size)),
        Err(f) if f.code == "file_not_found" => Ok(None),
        Err(f) => Err(f),
    }
}

/// Bytes `[offset, offset + max)` of a guest file.
async fn range(
    conn: &Conn,
    id: &str,
    path: &str,
    offset: u64,
    max: usize,
) -> Result<Vec<u8>, Failure> {
    use futures::StreamExt as _;
    let mut body = conn.ops.read_file(&conn.who, id, path).await?;
    let mut skip = offset;
    let mut kept = Vec::new();
    while kept.len() < max {
        let Some(chunk) = body.next().await else {
            break;
        };
        let chunk = chunk?;
        let mut part = &chunk[..];
        if skip > 0 {
            let n = (skip as usize).min(part.len());
            part = &part[n..];
            skip -= n as u64;
        }
        let room = max - kept.len();
        kept.extend_from_slice(&part[..part.len().min(room)]);
    }
    Ok(kept)
}

async fn small_text(conn: &Conn, id: &str, path: &str) -> Result<Option<String>, Failure> {
    match range(conn, id, path, 0, 64).await {
        Ok(b) => Ok(Some(String::from_utf8_lossy(&b).trim().to_owned())),
        Err(f) if f.code == "file_not_found" => Ok(None),
        Err(f) => Err(f),
    }
}

/// Reads a background process's output from the offsets given, waiting up to `wait` for it
/// to end or to write more.
pub async fn read(
    conn: &Conn,
    id: &str,
    process: &str,
    offsets: (u64, u64),
    max: usize,
    wait: Duration,
) -> Result<Output, Failure> {
    check_id(process)?;
    let d = dir(process);
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let mut exit = small_text(conn, id, &format!("{d}/exit")).await?;
        let Some(out_size) = size(conn, id, &format!("{d}/stdout")).await? else {
            return Err(Failure::local(
                "process_not_found",
                format!(
                    "no process {process} in sandbox {id} (its directory {d} is gone); \
                     start_process returns the ids"
                ),
            ));
        };
        let err_size = size(conn, id, &format!("{d}/stderr")).await?.unwrap_or(0);
        let running = match &exit {
            Some(_) => false,
            None => match small_text(conn, id, &format!("{d}/pid")).await? {
                Some(pid) if pid.parse::<u32>().is_ok() => {
                    size(conn, id, &format!("/proc/{pid}/stat"))
                        .await?
                        .is_some()
                }
                _ => true,
            },
        };
        if !running && exit.is_none() {
            // It may have ended between the two reads.
            exit = small_text(conn, id, &format!("{d}/exit")).await?;
        }
        let fresh = out_size > offsets.0 || err_size > offsets.1;
        if !running || fresh || tokio::time::Instant::now() >= deadline {
            let half = max.div_ceil(2);
            let out = if out_size > offsets.0 {
                range(conn, id, &format!("{d}/stdout"), offsets.0, half).await?
            } else {
                Vec::new()
            };
            let err = if err_size > offsets.1 {
                range(conn, id, &format!("{d}/stderr"), offsets.1, half).await?
            } else {
                Vec::new()
            };
            let next = (offsets.0 + out.len() as u64, offsets.1 + err.len() as u64);
            return Ok(Output {
                running,
                exit_code: exit.and_then(|e| e.parse().ok()),
                stdout: String::from_utf8_lossy(&out).into_owned(),
                stderr: String::from_utf8_lossy(&err).into_owned(),
                stdout_next_offset: next.0,
                stderr_next_offset: next.1,
                stdout_size: out_size,
                stderr_size: err_size,
                more: next.0 < out_size || next.1 < err_size,
            });
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// How a `stop_process` went.
#[derive(Debug, Serialize)]
pub struct Stopped {
    /// Whether the signal was sent (not when the process had ended already).
    pub signalled: bool,
    /// Whether the process has ended (it is given 5 seconds after the signal).
    pub ended: bool,
    /// Its exit status once ended (128 + the signal's number for one that ended it).
    pub exit_code: Option<i32>,
}

/// Signals a background process's whole process group and gives it 5 seconds to end.
pub async fn stop(conn: &Conn, id: &str, process: &str, signal: &str) -> Result<Stopped, Failure> {
    check_id(process)?;
    if !matches!(signal, "TERM" | "KILL" | "INT" | "HUP") {
        return Err(Failure::local(
            "invalid_request",
            format!("signal {signal:?} is not one of TERM, KILL, INT, HUP"),
        ));
    }
    let d = dir(process);
    // SIGKILL takes the wrapper too: the status it would have written is written here.
    // Exit 4: it had ended already; then the status (if any) is printed either way.
    let script = format!(
        "[ -f {d}/pid ] || exit 3; r=0; \
         if [ -f {d}/exit ]; then r=4; else p=$(cat {d}/pid); \
         kill -s {signal} -- -$p 2>/dev/null || kill -s {signal} $p 2>/dev/null || r=4; \
         if [ {signal} = KILL ]; then sleep 0.2; [ -f {d}/exit ] || echo 137 >{d}/exit; fi; fi; \
         i=0; while [ ! -f {d}/exit ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done; \
         cat {d}/exit 2>/dev/null; exit $r"
    );
    let run = crate::exec::Run {
        command: script,
        cwd: None,
        env: Default::default(),
        stdin: None,
        timeout: Duration::from_secs(30),
        max_output: 4096,
    };
    let ran = crate::exec::run(conn, id, run, &Default::default()).await?;
    let exit_code = ran.stdout.trim().parse::<i32>().ok();
    match ran.exit_code {
        Some(0) | Some(4) => Ok(Stopped {
            signalled: ran.exit_code == Some(0),
            ended: exit_code.is_some(),
            exit_code,
        }),
        Some(3) => Err(Failure::local(
            "process_not_found",
            format!("no process {process} in sandbox {id}"),
        )),
        other => Err(Failure::local(
            "guest_error",
            format!("signalling failed (exit {other:?}): {}", ran.stderr.trim()),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_ids_are_checked_before_they_become_paths() {
        assert!(check_id("00ff00ff00ff00ff").is_ok());
        for bad in ["", "../etc", "a/b", "A", "x y", &"a".repeat(33)] {
            let e = check_id(bad).unwrap_err();
            assert_eq!(e.code, "invalid_request", "{bad}");
        }
    }
}
