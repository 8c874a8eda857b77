//! Commands run to their end (`run_command`): the exec's events read into bounded captures
//! of stdout and stderr, the exit reported as data.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use serde::Serialize;
use space_api::{ExecEvent, ExecRequest};

use crate::api::{Conn, Failure};
use crate::progress::Status;

/// The first and last bytes of a stream, and how many there were in all.
#[derive(Debug)]
pub struct Capture {
    half: usize,
    head: Vec<u8>,
    tail: VecDeque<u8>,
    total: u64,
}

impl Capture {
    /// Keeps at most `cap` bytes: the first half and the last half.
    pub fn new(cap: usize) -> Capture {
        let half = cap.div_ceil(2).max(1);
        Capture {
            half,
            head: Vec::new(),
            tail: VecDeque::new(),
            total: 0,
        }
    }

    /// Takes more bytes.
    pub fn push(&mut self, mut b: &[u8]) {
        self.total += b.len() as u64;
        let room = self.half - self.head.len();
        if room > 0 {
            let n = room.min(b.len());
            self.head.extend_from_slice(&b[..n]);
            b = &b[n..];
        }
        if b.len() >= self.half {
            self.tail.clear();
            self.tail.extend(&b[b.len() - self.half..]);
            return;
        }
        let over = (self.tail.len() + b.len()).saturating_sub(self.half);
        self.tail.drain(..over);
        self.tail.extend(b);
    }

    /// Bytes seen in all.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Whether bytes were left out.
    pub fn truncated(&self) -> bool {
        self.total > (self.head.len() + self.tail.len()) as u64
    }

    /// The text kept (invalid UTF-8 replaced), with a marker where bytes were left out.
    pub fn render(&self, name: &str) -> String {
        let (a, b) = self.tail.as_slices();
        let tail: Vec<u8> = [a, b].concat();
        if !self.truncated() {
            let mut all = self.head.clone();
            all.extend_from_slice(&tail);
            return String::from_utf8_lossy(&all).into_owned();
        }
        let left_out = self.total - (self.head.len() + tail.len()) as u64;
        format!(
            "{}\n[... truncated: {left_out} bytes of {name} left out; {} bytes in all, the \
             first {} and the last {} shown ...]\n{}",
            String::from_utf8_lossy(&self.head),
            self.total,
            self.head.len(),
            tail.len(),
            String::from_utf8_lossy(&tail),
        )
    }
}

/// What `run_command` asks for.
#[derive(Debug)]
pub struct Run {
    /// The shell line.
    pub command: String,
    /// The working directory.
    pub cwd: Option<String>,
    /// Extra environment.
    pub env: std::collections::BTreeMap<String, String>,
    /// Bytes written to stdin, then closed.
    pub stdin: Option<String>,
    /// Killed after this long.
    pub timeout: Duration,
    /// Bytes kept of each of stdout and stderr.
    pub max_output: usize,
}

/// How a command ended.
#[derive(Debug, Serialize)]
pub struct Ran {
    /// The exit code (`null` when a signal ended it).
    pub exit_code: Option<i32>,
    /// The signal that ended it.
    pub signal: Option<i32>,
    /// Killed because it ran past its timeout.
    pub timed_out: bool,
    /// stdout (with a truncation marker when bytes were left out).
    pub stdout: String,
    /// stderr (likewise).
    pub stderr: String,
    /// Bytes of stdout in all.
    pub stdout_bytes: u64,
    /// Bytes of stderr in all.
    pub stderr_bytes: u64,
    /// Whether stdout or stderr was cut.
    pub truncated: bool,
    /// Wall time in milliseconds.
    pub duration_ms: u64,
}

/// Runs `run` in sandbox `id` to its end.
pub async fn run(conn: &Conn, id: &str, run: Run, status: &Status) -> Result<Ran, Failure> {
    let started = Instant::now();
    let req = ExecRequest {
        shell: Some(run.command.clone()),
        env: run.env.clone(),
        cwd: run.cwd.clone(),
        stdin: run.stdin.as_ref().map(|s| s.as_bytes().to_vec()),
        timeout_ms: Some(run.timeout.as_millis() as u64),
        ..ExecRequest::default()
    };
    let mut events = conn.ops.exec(&conn.who, id, &req).await?;
    let mut out = Capture::new(run.max_output);
    let mut err = Capture::new(run.max_output);
    // The API ends the process at its timeout; this is a bound in case the stream never ends.
    let deadline = tokio::time::Instant::now() + run.timeout + Duration::from_secs(60);
    loop {
        let next = match tokio::time::timeout_at(deadline, events.next()).await {
            Ok(next) => next,
            Err(_) => {
                return Err(Failure::local(
                    "timeout",
                    format!(
                        "the command did not end within its timeout of {} s and the stream \
                         did not close; it was killed",
                        run.timeout.as_secs()
                    ),
                ))
            }
        };
        let event = match next {
            None => {
                return Err(Failure::local(
                    "guest_error",
                    "the exec stream ended before the command's exit was reported",
                ))
            }
            Some(ev) => ev?,
        };
        let is_out = matches!(event, ExecEvent::Stdout { .. });
        match event {
            ExecEvent::Stdout { data } | ExecEvent::Stderr { data } => {
                if is_out {
                    out.push(&data);
                } else {
                    err.push(&data);
                }
                status.set(format!(
                    "running for {} s; {} bytes of output so far",
                    started.elapsed().as_secs(),
                    out.total() + err.total()
                ));
            }
            ExecEvent::Exit { exit_code, signal } => {
                let elapsed = started.elapsed();
                return Ok(Ran {
                    timed_out: exit_code.is_none() && signal == Some(9) && elapsed >= run.timeout,
                    exit_code,
                    signal,
                    truncated: out.truncated() || err.truncated(),
                    stdout: out.render("stdout"),
                    stderr: err.render("stderr"),
                    stdout_bytes: out.total(),
                    stderr_bytes: err.total(),
                    duration_ms: elapsed.as_millis() as u64,
                });
            }
            ExecEvent::Error { code, message } => return Err(Failure::new(0, code, message)),
            ExecEvent::Started { .. } => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_capture_is_whole() {
        let mut c = Capture::new(16);
        c.push(b"hello ");
        c.push(b"world");
        assert!(!c.truncated());
        assert_eq!(c.render("stdout"), "hello world");
    }

    #[test]
    fn a_large_capture_keeps_its_ends_and_says_what_it_left_out() {
        let mut c = Capture::new(10);
        for _ in 0..1000 {
            c.push(b"0123456789");
        }
        c.push(b"END");
        assert!(c.truncated());
        assert_eq!(c.total(), 10_003);
        let text = c.render("stdout");
        assert!(
            text.starts_with("01234\n[... truncated: 9993 bytes of stdout"),
            "{text}"
        );
        assert!(text.ends_with("89END"), "{text}");
    }

    #[test]
    fn one_push_larger_than_the_cap_keeps_its_end() {
        let mut c = Capture::new(4);
        c.push(b"abcdefgh");
        assert_eq!(c.total(), 8);
        assert!(c.render("stderr").ends_with("\ngh"));
    }
}
