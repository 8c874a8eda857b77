//! The local terminal: raw mode for `space shell` (restored on every way out) and its size.

use std::io::IsTerminal as _;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::{Mutex, Once};

use anyhow::{Context, Result};
use nix::sys::termios::{self, SetArg, Termios};

/// The settings to put back, for the panic hook (release builds abort on panic, so no
/// destructor runs then).
static SAVED: Mutex<Option<Termios>> = Mutex::new(None);
static HOOK: Once = Once::new();

fn restore_saved() {
    let saved = SAVED.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(saved) = saved {
        let stdin = std::io::stdin();
        let _ = termios::tcsetattr(stdin.as_fd(), SetArg::TCSADRAIN, &saved);
    }
}

/// Puts the terminal on stdin into raw mode until dropped; dropping restores the settings
/// it found, and so does a panic (through a panic hook).
pub struct RawMode {
    _private: (),
}

impl RawMode {
    /// Enters raw mode when stdin is a terminal; `None` otherwise.
    pub fn enter() -> Result<Option<RawMode>> {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return Ok(None);
        }
        let fd = stdin.as_fd();
        let saved = termios::tcgetattr(fd).context("reading the terminal settings")?;
        let mut raw = saved.clone();
        termios::cfmakeraw(&mut raw);
        *SAVED.lock().unwrap_or_else(|e| e.into_inner()) = Some(saved);
        HOOK.call_once(|| {
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                restore_saved();
                previous(info);
            }));
        });
        if let Err(e) = termios::tcsetattr(fd, SetArg::TCSADRAIN, &raw) {
            SAVED.lock().unwrap_or_else(|e| e.into_inner()).take();
            return Err(e).context("entering raw mode");
        }
        Ok(Some(RawMode { _private: () }))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        restore_saved();
    }
}

/// The size (rows, columns) of the terminal on stdout, else stdin; `None` when neither is
/// a terminal.
pub fn size() -> Option<(u16, u16)> {
    let stdout = std::io::stdout();
    let stdin = std::io::stdin();
    winsize(stdout.as_fd()).or_else(|| winsize(stdin.as_fd()))
}

fn winsize(fd: BorrowedFd<'_>) -> Option<(u16, u16)> {
    let mut ws = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    use std::os::fd::AsRawFd as _;
    // SAFETY: TIOCGWINSZ writes one `winsize` through the pointer, which points at a live,
    // properly aligned local; the descriptor is borrowed, so it stays open for the call.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCGWINSZ, &mut ws) };
    (rc == 0 && ws.ws_row > 0 && ws.ws_col > 0).then_some((ws.ws_row, ws.ws_col))
}
