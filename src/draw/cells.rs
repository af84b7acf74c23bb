//! What tasks on the worker threads write their results through.

/// A pointer that tasks write disjoint ranges through.
#[derive(Clone, Copy)]
pub(super) struct SyncPtr(pub *mut f32);

// SAFETY: every task writes its own disjoint range, and the owner reads only after the job ends.
unsafe impl Sync for SyncPtr {}

impl SyncPtr {
    /// The element `i` places past the start.
    ///
    /// # Safety
    /// `i` stays inside the allocation.
    pub(super) unsafe fn at(self, i: usize) -> *mut f32 {
        // SAFETY: the caller keeps `i` inside the allocation.
        unsafe { self.0.add(i) }
    }
}

/// A value written by exactly one task and read after the job ends.
#[derive(Default)]
pub(super) struct SyncCell<T>(std::cell::UnsafeCell<T>);

// SAFETY: each cell is written by one task at most, and read only after `WorkerPool::run`
// returned, which orders every write before the reads.
unsafe impl<T: Send> Sync for SyncCell<T> {}

impl<T: Copy> SyncCell<T> {
    pub(super) fn new(v: T) -> Self {
        SyncCell(std::cell::UnsafeCell::new(v))
    }

    /// Writes the value.
    ///
    /// # Safety
    /// Only the one task that owns this cell calls it, and nothing reads the cell until the job
    /// that runs the task has ended.
    pub(super) unsafe fn set(&self, v: T) {
        // SAFETY: the caller is the cell's one writer and nobody reads meanwhile.
        unsafe { *self.0.get() = v }
    }

    /// Reads the value.
    ///
    /// # Safety
    /// The job whose task may write the cell has ended (`WorkerPool::run` returned), or no task
    /// writes it.
    pub(super) unsafe fn get(&self) -> T {
        // SAFETY: no write can happen any more (the caller's contract).
        unsafe { *self.0.get() }
    }
}
