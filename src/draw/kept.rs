//! The buffers a thread reuses from call to call, and the most it keeps of them after a call.

use crate::alloc;
use std::cell::RefCell;

/// The most a thread keeps, after a call, of the buffers it reuses from call to call (block
/// maxima, the race's per-block scratch, a row's step and processed values):
/// what exceeds it is given back at the end of the call, largest buffer first, on the calling
/// thread and on each worker that took part. At the largest vocabularies in use (262,144 tokens)
/// a row with every input keeps about 2.3 MiB (1 MiB each for the processed row and the output's
/// counts, and the bitsets and per-block arrays), so that such rows keep
/// reusing their buffers; a history of millions of ids or a vocabulary of tens of millions gives
/// its buffers back after the call (their allocation then costs far less than reading the row).
pub const KEPT_PER_THREAD: usize = 4 << 20;

thread_local! {
    /// Block maxima of the row being drawn on this thread.
    pub(super) static BLOCK_MAX: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// The processed values of the row being drawn on this thread, when it has a step.
    pub(super) static PROCESSED: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Every buffer this thread keeps from call to call.
fn kept_buffers() -> [alloc::Kept; 6] {
    let [scratch, block_noise] = crate::row::kept();
    let [step, deferred] = crate::step::kept();
    [
        alloc::kept_vec(&BLOCK_MAX, || alloc::release_vec(&BLOCK_MAX)),
        alloc::kept_vec(&PROCESSED, || alloc::release_vec(&PROCESSED)),
        scratch,
        block_noise,
        step,
        deferred,
    ]
}

/// The bytes this thread keeps from call to call (test seam: `internals::thread_kept_bytes`).
#[cfg(feature = "internals")]
pub fn kept_bytes() -> usize {
    kept_buffers().iter().map(|b| b.bytes).sum()
}

/// Gives back this thread's largest buffers until what it keeps is at most [`KEPT_PER_THREAD`].
pub(crate) fn trim_kept() {
    let mut buffers = kept_buffers();
    let mut total: usize = buffers.iter().map(|b| b.bytes).sum();
    if total <= KEPT_PER_THREAD {
        return;
    }
    buffers.sort_unstable_by_key(|b| std::cmp::Reverse(b.bytes));
    for b in buffers {
        if total <= KEPT_PER_THREAD {
            break;
        }
        (b.release)();
        total -= b.bytes;
    }
}
