//! The process a handle was made in, for `fork()`.
//!
//! A `fork()` child has one thread, the one that forked: the worker and producer threads of
//! every sampler and pool are gone, and a lock one of them (or another thread of the parent)
//! held at the fork stays locked for ever. So a handle records the process that made it and,
//! used in another process, never waits on such a lock or joins such a thread.

/// The calling process's id.
pub(crate) fn current_pid() -> u32 {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() as u32 }
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
