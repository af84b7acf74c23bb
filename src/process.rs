//! The process a handle was made in, for `fork()`.
//!
//! A `fork()` child has one thread, the one that forked: the worker and producer threads of
//! every sampler and pool are gone, and a lock one of them (or another thread of the parent)
//! held at the fork stays locked for ever. So a handle records the process that made it and,
//! used in another process, never waits on such a lock or joins such a thread.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

/// The calling process's id: read from [`pid_page`] where the kernel offers one, else asked of
/// the kernel (`getpid`, a system call: a sizeable part of a short draw, which checks it).
pub(crate) fn current_pid() -> u32 {
    let Some(cached) = pid_page() else { return getpid() };
    match cached.load(Ordering::Relaxed) {
        0 => {
            let pid = getpid();
            cached.store(pid, Ordering::Relaxed);
            pid
        }
        pid => pid,
    }
}

fn getpid() -> u32 {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() as u32 }
}

/// [`PID_PAGE`] before it is made.
const UNMADE: usize = 0;
/// [`PID_PAGE`] where the kernel cannot wipe a page in a child.
const UNAVAILABLE: usize = 1;

/// The address of the page of [`pid_page`], or [`UNMADE`] or [`UNAVAILABLE`]. An atomic, not a
/// `OnceLock`: a child forked while another thread made the page must not wait on a lock that
/// thread held.
static PID_PAGE: AtomicUsize = AtomicUsize::new(UNMADE);

/// A private page that the kernel fills with zeros in every `fork()` child, however it was
/// forked (`MADV_WIPEONFORK`, Linux 4.14 and later), holding the id of the process that read
/// it: a child reads 0 and asks for its own. None where the kernel cannot do it.
fn pid_page() -> Option<&'static AtomicU32> {
    let mut addr = PID_PAGE.load(Ordering::Acquire);
    if addr == UNMADE {
        let made = make_wiped_page().unwrap_or(UNAVAILABLE);
        addr = match PID_PAGE.compare_exchange(UNMADE, made, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                reset_in_children();
                made
            }
            Err(theirs) => {
                // Another thread made one first: this one goes back.
                free_page(made);
                theirs
            }
        };
    }
    // SAFETY: any other value is a page mapped (read-write, zeroed) for the life of the
    // process, aligned for a u32, and only ever read and written as this atomic.
    (addr != UNAVAILABLE).then(|| unsafe { &*(addr as *const AtomicU32) })
}

/// A zeroed read-write page the kernel wipes in a `fork()` child: its address.
#[cfg(any(target_os = "linux", target_os = "android"))]
fn make_wiped_page() -> Option<usize> {
    const LEN: usize = 4096;
    // SAFETY: an anonymous private mapping at an address of the kernel's choice.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            LEN,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    // SAFETY: `p` is the mapping just made, of LEN bytes.
    if unsafe { libc::madvise(p, LEN, libc::MADV_WIPEONFORK) } != 0 {
        // SAFETY: as above; nothing else knows of the mapping.
        unsafe { libc::munmap(p, LEN) };
        return None;
    }
    Some(p as usize)
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn make_wiped_page() -> Option<usize> {
    None
}

/// Also clears the page in a child of `fork()` from the C library (a `pthread_atfork` handler),
/// for a kernel or an emulator (qemu-user) that accepts `MADV_WIPEONFORK` without honouring it.
fn reset_in_children() {
    extern "C" fn child() {
        let addr = PID_PAGE.load(Ordering::Acquire);
        if addr != UNMADE && addr != UNAVAILABLE {
            // SAFETY: as in `pid_page`: a mapped page, only ever used as this atomic.
            unsafe { &*(addr as *const AtomicU32) }.store(0, Ordering::Relaxed);
        }
    }
    // SAFETY: registers a handler that only stores to an atomic (async-signal-safe); failure
    // (ENOMEM) leaves the kernel's wipe alone to clear the page, as before.
    unsafe { libc::pthread_atfork(None, None, Some(child)) };
}

/// Unmaps a page [`make_wiped_page`] made that nothing uses ([`UNAVAILABLE`]: none).
fn free_page(addr: usize) {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    if addr != UNAVAILABLE {
        // SAFETY: the page of `make_wiped_page`, of 4096 bytes, that no one else has seen.
        unsafe { libc::munmap(addr as *mut libc::c_void, 4096) };
    }
    let _ = addr;
}

/// The process a handle was made in.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Birthplace {
    pid: u32,
}

impl Birthplace {
    pub(crate) fn here() -> Birthplace {
        Birthplace { pid: current_pid() }
    }

    /// True in a `fork()` child (or grandchild) of the process that made the handle.
    pub(crate) fn elsewhere(&self) -> bool {
        current_pid() != self.pid
    }
}

#[cfg(all(test, any(target_os = "linux", target_os = "android")))]
mod tests {
    /// A child forked after the parent cached its id reads its own (the page was wiped), and so
    /// does its own child.
    #[test]
    fn a_fork_child_reads_its_own_id() {
        let parent = super::current_pid();
        assert_eq!(parent, super::getpid());
        assert_eq!(super::current_pid(), parent, "the cached id");
        // SAFETY: the child only reads ids and leaves with _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let own = super::current_pid();
            let mut ok = own == super::getpid() && own != parent && super::current_pid() == own;
            // SAFETY: as above, one generation down.
            let grandchild = unsafe { libc::fork() };
            if grandchild == 0 {
                let g = super::current_pid();
                // SAFETY: ends the grandchild without the harness's handlers.
                unsafe { libc::_exit(if g == super::getpid() && g != own { 0 } else { 1 }) };
            }
            let mut status = 0;
            // SAFETY: waits for its own child with a valid status pointer.
            unsafe { libc::waitpid(grandchild, &mut status, 0) };
            ok &= libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
            // SAFETY: ends the child without the harness's handlers.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        assert!(pid > 0, "fork failed");
        let mut status = 0;
        // SAFETY: waits for our own child with a valid status pointer.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "the child read a stale id: {status}");
        assert_eq!(super::current_pid(), parent);
    }
}
