//! The storage of a row's step that a thread keeps between rows: a row's bitsets and table are
//! tens of KiB, which a fresh allocation would zero (and fault in) for every row. A row's step
//! takes the thread's storage when it is built and hands it back, its bitsets cleared, when it
//! is dropped.

use super::listed::{Listed, Slot};
use super::penalties::Penalties;
use super::RowStep;
use crate::alloc;

/// The vectors of a row's step while no row holds them. `seen`, `output_bits`, `listed_bits` and
/// `counts` are all zero here.
#[derive(Default)]
struct Scratch {
    keep: Vec<u32>,
    mask: Vec<u32>,
    raised: Vec<u32>,
    seen: Vec<u32>,
    output_bits: Vec<u32>,
    listed_bits: Vec<u32>,
    slots: Vec<Slot>,
    counts: Vec<u32>,
    counted: Vec<u32>,
    overrides: Vec<(u32, f32)>,
    ids: Vec<u32>,
    vals: Vec<f32>,
    words: Vec<u32>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Option<Scratch>> = const { std::cell::RefCell::new(None) };
}

impl Scratch {
    /// The bytes its vectors hold.
    fn bytes(&self) -> usize {
        let words = [
            &self.keep,
            &self.mask,
            &self.raised,
            &self.seen,
            &self.output_bits,
            &self.listed_bits,
            &self.counts,
            &self.counted,
            &self.ids,
            &self.words,
        ];
        4 * (words.iter().map(|v| v.capacity()).sum::<usize>() + self.vals.capacity())
            + self.slots.capacity() * size_of::<Slot>()
            + self.overrides.capacity() * size_of::<(u32, f32)>()
    }
}

/// What this thread keeps of a row's step (the bitsets, the output's counts, the touched
/// tokens' scratch) and of a deferred row's visited blocks, for `draw::KEPT_PER_THREAD`.
pub(crate) fn kept() -> [alloc::Kept; 2] {
    let bytes = SCRATCH.try_with(|s| s.try_borrow().map_or(0, |s| s.as_ref().map_or(0, Scratch::bytes))).unwrap_or(0);
    let release = || {
        let _ = SCRATCH.try_with(|s| s.try_borrow_mut().map(|mut s| *s = None));
    };
    [alloc::Kept { bytes, release }, super::deferred::kept()]
}

impl<'a> RowStep<'a> {
    /// An empty step of a row with `penalties` (nothing masked, nothing touched), in the storage
    /// this thread kept from its previous row, if any.
    pub(super) fn in_thread_storage(penalties: Penalties) -> RowStep<'a> {
        let scratch = SCRATCH.with(|s| s.borrow_mut().take()).unwrap_or_default();
        RowStep {
            keep: scratch.keep,
            given: None,
            masked: false,
            mask: scratch.mask,
            raised: scratch.raised,
            seen: scratch.seen,
            output_bits: scratch.output_bits,
            listed_bits: scratch.listed_bits,
            listed: Listed::empty(scratch.slots),
            counts: scratch.counts,
            counted: scratch.counted,
            touched: 0,
            deferred: false,
            dense: false,
            ids: scratch.ids,
            vals: scratch.vals,
            words: scratch.words,
            penalties,
            dry_ids: Vec::new(),
            overrides: scratch.overrides,
        }
    }
}

impl Drop for RowStep<'_> {
    /// Hands the storage back to this thread for its next row (bitsets cleared).
    fn drop(&mut self) {
        let mut scratch = Scratch {
            keep: std::mem::take(&mut self.keep),
            mask: std::mem::take(&mut self.mask),
            raised: std::mem::take(&mut self.raised),
            seen: std::mem::take(&mut self.seen),
            output_bits: std::mem::take(&mut self.output_bits),
            listed_bits: std::mem::take(&mut self.listed_bits),
            slots: std::mem::take(&mut self.listed.slots),
            counts: std::mem::take(&mut self.counts),
            counted: std::mem::take(&mut self.counted),
            overrides: std::mem::take(&mut self.overrides),
            ids: std::mem::take(&mut self.ids),
            vals: std::mem::take(&mut self.vals),
            words: std::mem::take(&mut self.words),
        };
        if !scratch.words.is_empty() {
            for &w in &scratch.words {
                let w = w as usize;
                (scratch.seen[w], scratch.output_bits[w], scratch.listed_bits[w]) = (0, 0, 0);
            }
            scratch.words.clear();
        } else if self.touched > 0 {
            // (No bit is set in a row that touched nothing, nor in the histories' bitsets of a
            // deferred row.) The output's bits are set only with the frequency or presence
            // penalty, and the listed ones are those of the table's few tokens.
            if !self.deferred {
                scratch.seen.fill(0);
                if self.penalties.counts() {
                    scratch.output_bits.fill(0);
                }
            }
            for slot in scratch.slots.iter().filter(|s| s.id != Slot::FREE) {
                scratch.listed_bits[slot.id as usize / 32] = 0;
            }
        }
        for &id in &scratch.counted {
            scratch.counts[id as usize] = 0;
        }
        // (`try_with`: a thread that is exiting drops its row's step without keeping the storage.)
        let _ = SCRATCH.try_with(|s| {
            let mut s = s.borrow_mut();
            if s.is_none() {
                *s = Some(scratch);
            }
        });
    }
}
