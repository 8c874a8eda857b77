//! The fence watchdog: what stops a node's guests when the node cannot, because its own
//! process is stuck, stopped (SIGSTOP) or dead.
//!
//! A member node keeps a deadline: the moment its lease might run out, less a margin
//! (`crate::member`). Pausing the VMs from the node process works only while that process
//! runs. So at start a member forks a small watchdog process that shares one page of memory
//! with it: the deadline on the monotonic clock and the pids of the node's QEMU processes.
//! The node renews the deadline after every heartbeat that renewed its lease. When the
//! deadline passes, the watchdog sends SIGSTOP to every QEMU process named (each checked to
//! be a QEMU process first): the guests stop mid-instruction, whatever the node process is
//! doing. When the node renews the deadline again, the watchdog sends SIGCONT to the ones it
//! stopped. If the node process dies, the watchdog still stops the guests at the deadline,
//! then exits; a node that is stopped on purpose disarms it first.
//!
//! The child does only what is safe after `fork` in a threaded process: atomic loads and
//! stores on the shared page and raw system calls (`clock_gettime`, `kill`, `open`, `read`,
//! `close`, `getppid`, `nanosleep`, `_exit`). It allocates nothing and takes no lock.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// QEMU processes the page can name.
pub const MAX_VMS: usize = 1024;
/// How often the watchdog looks at the deadline.
const TICK: Duration = Duration::from_millis(20);

#[repr(C)]
struct Page {
    /// Monotonic ms; 0: disarmed (nothing is stopped for it).
    deadline_ms: AtomicU64,
    /// How many of `pids` are set.
    count: AtomicU32,
    /// 1 while the watchdog holds the guests stopped.
    fenced: AtomicU32,
    /// How many of `stopped` are set.
    stopped_count: AtomicU32,
    pids: [AtomicI32; MAX_VMS],
    stopped: [AtomicI32; MAX_VMS],
}

/// The watchdog of this node process.
pub struct Watchdog {
    page: NonNull<Page>,
    child: libc::pid_t,
}

// SAFETY: the page holds atomics only, and the mapping lives until `Drop`; every access goes
// through `&Page`, so sharing the handle between threads is sharing atomics.
unsafe impl Send for Watchdog {}
// SAFETY: as above.
unsafe impl Sync for Watchdog {}

impl std::fmt::Debug for Watchdog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watchdog")
            .field("child", &self.child)
            .field("fenced", &self.fenced())
            .finish()
    }
}

fn monotonic_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the valid, exclusively borrowed `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64) * 1000 + (ts.tv_nsec as u64) / 1_000_000
}

impl Watchdog {
    /// Forks the watchdog, disarmed.
    pub fn spawn() -> std::io::Result<Watchdog> {
        let size = std::mem::size_of::<Page>();
        // SAFETY: an anonymous shared mapping of `size` bytes at an address the kernel picks;
        // no existing memory is touched. The kernel zero-fills it, which is a valid `Page`
        // (every field is an atomic integer, zero being disarmed and empty).
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let page = NonNull::new(addr.cast::<Page>()).expect("mmap does not answer null");
        // SAFETY: getpid has no preconditions.
        let parent = unsafe { libc::getpid() };
        // SAFETY: after fork the child runs only `watch`, which keeps to async-signal-safe
        // system calls and atomics on the shared page, and ends in `_exit`: it never returns
        // into Rust code that could take a lock or allocate.
        match unsafe { libc::fork() } {
            -1 => {
                let e = std::io::Error::last_os_error();
                // SAFETY: the mapping made above, unmapped once.
                unsafe { libc::munmap(addr, size) };
                Err(e)
            }
            0 => {
                // SAFETY: the page stays mapped in the child (MAP_SHARED survives fork).
                unsafe { watch(page.as_ref(), parent) }
            }
            child => Ok(Watchdog { page, child }),
        }
    }

    fn page(&self) -> &Page {
        // SAFETY: the mapping lives as long as `self` and is only ever used as atomics.
        unsafe { self.page.as_ref() }
    }

    /// Sets the deadline `deadline` (an instant of this process) and the QEMU processes the
    /// watchdog stops when it passes. A deadline in the future lifts a fence in force.
    pub fn arm(&self, deadline: Instant, vms: &[u32]) {
        self.set_vms(vms);
        let p = self.page();
        let left = deadline.saturating_duration_since(Instant::now());
        let at = monotonic_ms()
            .saturating_add(left.as_millis() as u64)
            .max(2);
        p.deadline_ms.store(at, Ordering::SeqCst);
    }

    /// Replaces the QEMU processes named (while no fence is in force; a fence holds the ones
    /// it stopped).
    pub fn set_vms(&self, vms: &[u32]) {
        let p = self.page();
        if p.fenced.load(Ordering::SeqCst) == 0 {
            let n = vms.len().min(MAX_VMS);
            for (slot, pid) in p.pids.iter().zip(vms.iter().take(n)) {
                slot.store(*pid as i32, Ordering::SeqCst);
            }
            p.count.store(n as u32, Ordering::SeqCst);
        }
    }

    /// Stops the guests now (the node knows it may not run them): `vms` are stopped, and
    /// stay so until [`Watchdog::arm`] sets a deadline in the future.
    pub fn fence_now(&self, vms: &[u32]) {
        self.set_vms(vms);
        self.page().deadline_ms.store(1, Ordering::SeqCst);
    }

    /// Waits (up to `wait`) until the watchdog reports the guests stopped.
    pub fn wait_fenced(&self, wait: Duration) -> bool {
        let until = Instant::now() + wait;
        while !self.fenced() {
            if Instant::now() >= until {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        true
    }

    /// Disarms: nothing will be stopped, and what is stopped is continued.
    pub fn disarm(&self) {
        self.page().deadline_ms.store(0, Ordering::SeqCst);
    }

    /// Whether the watchdog holds the guests stopped now.
    pub fn fenced(&self) -> bool {
        self.page().fenced.load(Ordering::SeqCst) == 1
    }

    /// Whether the watchdog process still runs.
    pub fn alive(&self) -> bool {
        let mut status = 0;
        // SAFETY: waitpid on our own child with WNOHANG writes one int into `status`.
        let r = unsafe { libc::waitpid(self.child, &mut status, libc::WNOHANG) };
        r == 0
    }

    /// The watchdog's pid.
    pub fn pid(&self) -> u32 {
        self.child as u32
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.disarm();
        // Give it one tick to continue what it stopped, then end it.
        let until = Instant::now() + TICK * 5;
        while self.fenced() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(2));
        }
        // SAFETY: our own child; SIGKILL, then reap it so that no zombie is left.
        unsafe {
            libc::kill(self.child, libc::SIGKILL);
            let mut status = 0;
            libc::waitpid(self.child, &mut status, 0);
            libc::munmap(self.page.as_ptr().cast(), std::mem::size_of::<Page>());
        }
    }
}

/// Whether `pid` is a QEMU process: `/proc/<pid>/comm` starts with `qemu`. Written without
/// allocation for the forked child.
fn is_qemu(pid: i32) -> bool {
    if pid <= 1 {
        return false;
    }
    let mut path = [0u8; 32];
    let prefix = b"/proc/";
    path[..prefix.len()].copy_from_slice(prefix);
    let mut digits = [0u8; 12];
    let mut n = 0;
    let mut v = pid as u32;
    while v > 0 && n < digits.len() {
        digits[n] = b'0' + (v % 10) as u8;
        v /= 10;
        n += 1;
    }
    let mut at = prefix.len();
    for i in (0..n).rev() {
        path[at] = digits[i];
        at += 1;
    }
    let suffix = b"/comm\0";
    path[at..at + suffix.len()].copy_from_slice(suffix);
    // SAFETY: `path` is NUL-terminated within its bounds; the descriptor is closed below.
    let fd = unsafe { libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return false;
    }
    let mut comm = [0u8; 16];
    // SAFETY: reads at most 16 bytes into the 16-byte buffer from the descriptor opened above.
    let got = unsafe { libc::read(fd, comm.as_mut_ptr().cast(), comm.len()) };
    // SAFETY: closes the descriptor opened above, once.
    unsafe { libc::close(fd) };
    got >= 4 && &comm[..4] == b"qemu"
}

/// The watchdog's loop, in the forked child. Never returns.
///
/// # Safety
/// Only to be called in the child right after `fork`, with `p` mapped shared.
unsafe fn watch(p: &Page, parent: libc::pid_t) -> ! {
    // Nothing of the node's: no descriptor held open (listening sockets, the data
    // directory's files), default dispositions for the signals a terminal sends, and no
    // signal blocked, so that ending the node's process group ends the watchdog too.
    libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
    libc::signal(libc::SIGINT, libc::SIG_DFL);
    libc::signal(libc::SIGTERM, libc::SIG_DFL);
    libc::signal(libc::SIGHUP, libc::SIG_DFL);
    let mut none: libc::sigset_t = std::mem::zeroed();
    libc::sigemptyset(&mut none);
    libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
    let tick = libc::timespec {
        tv_sec: 0,
        tv_nsec: TICK.as_nanos() as libc::c_long,
    };
    loop {
        let deadline = p.deadline_ms.load(Ordering::SeqCst);
        let orphaned = libc::getppid() != parent;
        let due = deadline != 0 && monotonic_ms() >= deadline;
        if due && p.fenced.load(Ordering::SeqCst) == 0 {
            let count = (p.count.load(Ordering::SeqCst) as usize).min(MAX_VMS);
            let mut stopped = 0;
            for slot in &p.pids[..count] {
                let pid = slot.load(Ordering::SeqCst);
                if is_qemu(pid) && libc::kill(pid, libc::SIGSTOP) == 0 {
                    p.stopped[stopped].store(pid, Ordering::SeqCst);
                    stopped += 1;
                }
            }
            p.stopped_count.store(stopped as u32, Ordering::SeqCst);
            p.fenced.store(1, Ordering::SeqCst);
        } else if !due && p.fenced.load(Ordering::SeqCst) == 1 {
            let stopped = (p.stopped_count.load(Ordering::SeqCst) as usize).min(MAX_VMS);
            for slot in &p.stopped[..stopped] {
                let pid = slot.load(Ordering::SeqCst);
                if is_qemu(pid) {
                    libc::kill(pid, libc::SIGCONT);
                }
            }
            p.stopped_count.store(0, Ordering::SeqCst);
            p.fenced.store(0, Ordering::SeqCst);
        }
        // A dead node leaves its guests stopped once its deadline passed (its successor
        // continues them when it adopts them), and nothing to do when it never armed.
        if orphaned && (deadline == 0 || p.fenced.load(Ordering::SeqCst) == 1) {
            libc::_exit(0);
        }
        libc::nanosleep(&tick, std::ptr::null_mut());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qemu_check_reads_comm() {
        assert!(
            !is_qemu(std::process::id() as i32),
            "the test runner is not QEMU"
        );
        assert!(!is_qemu(0));
        assert!(!is_qemu(i32::MAX));
    }

    fn state(pid: u32) -> char {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let after = stat.rsplit_once(") ").unwrap().1;
        after.chars().next().unwrap()
    }

    fn wait_state(pid: u32, want: char) -> bool {
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            if state(pid) == want {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    /// A process named like QEMU is stopped at the deadline and continued when the deadline
    /// moves on; a process of another name is never touched.
    #[test]
    fn stops_qemu_at_the_deadline_and_continues_it_on_renewal() {
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("qemu-system-x86_64");
        std::fs::copy("/bin/sleep", &fake).unwrap();
        let mut vm = std::process::Command::new(&fake).arg("60").spawn().unwrap();
        let mut other = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        // The new process takes its name when it executes the copy; poll for it rather
        // than trust that has happened by the time `spawn` returns.
        let named_until = Instant::now() + Duration::from_secs(5);
        while !is_qemu(vm.id() as i32) && Instant::now() < named_until {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(
            is_qemu(vm.id() as i32),
            "{:?}",
            std::fs::read_to_string(format!("/proc/{}/comm", vm.id()))
        );
        assert!(!is_qemu(other.id() as i32));

        let w = Watchdog::spawn().unwrap();
        assert!(w.alive());
        w.arm(
            Instant::now() + Duration::from_millis(150),
            &[vm.id(), other.id()],
        );
        assert!(!w.fenced());
        assert!(
            w.wait_fenced(Duration::from_secs(5)),
            "fenced at the deadline"
        );
        assert!(wait_state(vm.id(), 'T'), "the VM is stopped");
        assert_ne!(state(other.id()), 'T', "only QEMU is stopped");

        w.arm(Instant::now() + Duration::from_secs(60), &[vm.id()]);
        assert!(
            wait_state(vm.id(), 'S'),
            "a renewed deadline continues the VM"
        );
        assert!(!w.fenced());

        w.fence_now(&[vm.id()]);
        assert!(w.wait_fenced(Duration::from_secs(5)));
        assert!(wait_state(vm.id(), 'T'), "stopped at once");
        let pid = w.pid();
        drop(w);
        assert!(
            wait_state(vm.id(), 'S'),
            "dropping the watchdog continues what it stopped"
        );
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
        for c in [&mut vm, &mut other] {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
