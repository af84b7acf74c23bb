//! One row of logits, whatever its dtype: the single place the dtype is erased.
//!
//! [`with_row!`] matches the batch's [`Logits`](crate::batch::Logits) once and runs its body
//! with the row as a `&[E]` for the concrete element type, so everything below it (the race,
//! the filters, the logprobs) is monomorphised per dtype and reaches its kernels through
//! [`RowValues`].

use crate::config::NoiseKind;
use crate::error::Result;
use crate::kernels::generic::race::{race_bounded_external, race_listed_external, race_listed_inline};
use crate::kernels::simd::Elem;
use crate::kernels::{Best, Bf16, BlockNoise, BlockValues, DtypeKernels, Kernels, RaceParams, RaceScratch, F16};

/// A row's values as f32, and the kernels of its dtype. Every kernel call goes through here, so
/// the bounds that make the calls safe are checked in one place.
pub(crate) trait RowValues {
    type E: Elem;
    fn n(&self) -> usize;
    /// The value at `i`, as f32.
    fn at(&self, i: usize) -> f32;
    fn ptr(&self) -> *const Self::E;
    /// The kernels of this dtype in `k`.
    fn kernels(k: &Kernels) -> &DtypeKernels<Self::E>;

    /// Block maxima of elements `[start, start + len)` into `bmax` (one per block); whether any
    /// was NaN.
    fn scan(&self, k: &Kernels, start: usize, len: usize, bmax: &mut [f32]) -> bool {
        assert!(start + len <= self.n() && bmax.len() >= len.div_ceil(crate::kernels::BLOCK));
        // SAFETY: the range lies inside the row and `bmax` has a slot per block of it (checked
        // above); `k` is the table of a supported level.
        unsafe { (Self::kernels(k).scan)(self.ptr().add(start), len, bmax) }
    }

    /// Block maxima of the tokens of `[start, start + len)` whose bit is set in `keep` (the
    /// row's mask) into `bmax` (one per block of the range); whether any value of the range
    /// (kept or not) is NaN. `start` is a multiple of BLOCK.
    fn scan_masked(&self, k: &Kernels, keep: &[u32], start: usize, len: usize, bmax: &mut [f32]) -> bool {
        let n = self.n();
        assert!(start.is_multiple_of(crate::kernels::BLOCK) && start + len <= n && keep.len() >= n.div_ceil(32));
        assert!(bmax.len() == len.div_ceil(crate::kernels::BLOCK));
        // SAFETY: the range lies inside the row, `keep` has a bit for each of its tokens (from
        // word `start / 32`, as BLOCK is a multiple of 32) and `bmax` a slot per block of it
        // (checked above); `k` is the table of a supported level.
        unsafe { (Self::kernels(k).scan_masked)(self.ptr().add(start), keep.as_ptr().add(start / 32), len, bmax) }
    }

    /// Writes the row's values into `out` (`n` of them) where their bit is set in `keep`, -inf
    /// elsewhere; whether any value (kept or not) is NaN. With a non-empty `bmax`, also the
    /// block maxima of `out` (NaN ignored), as [`RowValues::scan`] of it would give them.
    fn masked_copy(&self, k: &Kernels, keep: &[u32], out: &mut [f32], bmax: &mut [f32]) -> bool {
        let n = self.n();
        assert!(keep.len() >= n.div_ceil(32) && out.len() == n);
        assert!(bmax.is_empty() || bmax.len() == n.div_ceil(crate::kernels::BLOCK));
        // SAFETY: `n` values of the row, `n` slots of `out`, a bit of `keep` for each, and no
        // block maximum or one per block (checked above); `k` is the table of a supported
        // level.
        unsafe { (Self::kernels(k).masked_copy)(self.ptr(), keep.as_ptr(), n, out.as_mut_ptr(), bmax) }
    }

    /// The best key of the race over a whole row whose values are the kept tokens' (bits of
    /// `keep`, block maxima `bmax`) and the `listed` (token, value) pairs, with the row's noise.
    /// Fails only if the race's per-block scratch cannot be allocated.
    fn race_processed(
        &self,
        k: &Kernels,
        keep: &[u32],
        bmax: &[f32],
        listed: &[(u32, f32)],
        p: RaceParams,
        noise: RaceNoise,
    ) -> Result<Best> {
        let n = self.n();
        assert!(keep.len() >= n.div_ceil(32) && bmax.len() >= n.div_ceil(crate::kernels::BLOCK));
        assert!(listed.iter().all(|&(t, _)| (t as usize) < n));
        let (row, dk) = (self.ptr(), Self::kernels(k));
        match noise {
            RaceNoise::Inline(key) => {
                // SAFETY: as in `scan_masked`; the scratch is this thread's, with room for
                // bmax.len() blocks.
                let best = with_scratch(bmax.len(), |b| unsafe {
                    (dk.race_inline_masked)(row, keep.as_ptr(), n, bmax, p, key, b, None)
                })?;
                // The listed tokens race on the noise of their blocks, every block's.
                BLOCK_NOISE.with(|bn| {
                    let blocks = &mut *bn.borrow_mut();
                    blocks.clear();
                    let none = BlockNoise { e_min: 0.0, j_min: 0, g_max: 0.0, bound: 0.0 };
                    crate::alloc::resize(blocks, bmax.len(), none, "the block noise of the touched tokens")?;
                    // SAFETY: `blocks` has bmax.len() elements; `k` is the table of a supported level.
                    unsafe { (k.block_noise)(key, 0, bmax, p, blocks) };
                    Ok(race_listed_inline(listed, p, key, blocks, best))
                })
            }
            // SAFETY: as in `scan_masked`; the noise row holds `n` values (as in `race`), and
            // every listed token is below `n` (checked above).
            RaceNoise::External(values, kind) => unsafe {
                let best = (dk.race_external_masked)(row, keep.as_ptr(), values, n, p, kind);
                Ok(race_listed_external(listed, values, p, kind, best))
            },
        }
    }

    /// The best key of the inline race over a whole row whose kept tokens (bits of `keep`) race
    /// with their own values and whose listed tokens, in each block the race visits, with the
    /// values `touched` works out; `bmax` bounds each block's values (kept and listed) from above
    /// and its largest value is the row's (`p.m`). Fails only if the race's per-block scratch
    /// cannot be allocated.
    fn race_blocks(
        &self,
        k: &Kernels,
        keep: &[u32],
        bmax: &[f32],
        p: RaceParams,
        key: u64,
        touched: &dyn BlockValues,
    ) -> Result<Best> {
        let n = self.n();
        assert!(keep.len() >= n.div_ceil(32) && bmax.len() >= n.div_ceil(crate::kernels::BLOCK));
        let (row, dk) = (self.ptr(), Self::kernels(k));
        // SAFETY: as in `scan_masked`; the scratch is this thread's, with room for bmax.len()
        // blocks.
        with_scratch(bmax.len(), |b| unsafe {
            (dk.race_inline_masked)(row, keep.as_ptr(), n, bmax, p, key, b, Some(touched))
        })
    }

    /// The best key of the race on external noise of `kind` (one value per token at `noise`)
    /// over a whole row whose kept tokens (bits of `keep`) race with their own values and whose
    /// listed tokens, block by block, with the values `touched` works out; `p.m` is the row's
    /// largest value.
    ///
    /// # Safety
    /// `noise` valid for `n` reads.
    unsafe fn race_external_blocks(
        &self,
        k: &Kernels,
        keep: &[u32],
        p: RaceParams,
        (noise, kind): (*const f32, NoiseKind),
        touched: &dyn BlockValues,
    ) -> Best {
        let n = self.n();
        assert!(keep.len() >= n.div_ceil(32));
        // SAFETY: as in `race_processed`.
        let mut best = unsafe { (Self::kernels(k).race_external_masked)(self.ptr(), keep.as_ptr(), noise, n, p, kind) };
        let mut listed = [(0u32, 0f32); crate::kernels::BLOCK];
        for b in 0..n.div_ceil(crate::kernels::BLOCK) {
            let count = touched.listed(b, &mut listed);
            // SAFETY: every listed token is below n (a token of block b), where `noise` reads.
            best = unsafe { race_bounded_external(&listed[..count], touched, noise, p, kind, best) };
        }
        best
    }

    /// The row's maximum (NaN ignored), the first block holding it, and whether any value is
    /// NaN: the pass of a greedy row that needs nothing else.
    fn top_block(&self, k: &Kernels) -> (f32, usize, bool) {
        // SAFETY: the whole row; `k` is the table of a supported level.
        unsafe { (Self::kernels(k).top_block)(self.ptr(), self.n()) }
    }

    /// [`RowValues::top_block`] of this row and `other`, as long, their blocks read in turn.
    fn top_block_pair(&self, other: &Self, k: &Kernels) -> [(f32, usize, bool); 2] {
        assert_eq!(self.n(), other.n());
        // SAFETY: both whole rows, of the same length; `k` is the table of a supported level.
        unsafe { (Self::kernels(k).top_block_pair)(self.ptr(), other.ptr(), self.n()) }
    }

    /// The first index in `[start, end)` whose value is `target`.
    fn find_first(&self, k: &Kernels, start: usize, end: usize, target: f32) -> Option<usize> {
        assert!(start <= end && end <= self.n());
        // SAFETY: as in `scan`.
        unsafe { (Self::kernels(k).find_first)(self.ptr(), start, end, target) }
    }

    /// The best key of the race over elements `[start, start + len)`, whose block maxima are
    /// `bmax`, with the row's noise. Fails only if the inline race's per-block scratch cannot
    /// be allocated.
    fn race(
        &self,
        k: &Kernels,
        start: usize,
        len: usize,
        bmax: &[f32],
        p: RaceParams,
        noise: RaceNoise,
    ) -> Result<Best> {
        assert!(start + len <= self.n() && bmax.len() >= len.div_ceil(crate::kernels::BLOCK));
        let row = self.ptr();
        let dk = Self::kernels(k);
        match noise {
            // SAFETY: as in `scan`; the scratch is this thread's, with room for bmax.len() blocks.
            RaceNoise::Inline(key) => {
                with_scratch(bmax.len(), |b| unsafe { (dk.race_inline)(row.add(start), len, bmax, p, key, start, b) })
            }
            // SAFETY: as in `scan`; the noise row holds `n` values (checked by `validate`, or a
            // pool lease of the row's length).
            RaceNoise::External(values, kind) => unsafe {
                Ok((dk.race_external)(row.add(start), values.add(start), len, p, kind, start))
            },
        }
    }
}

/// The best key of the race over `row`, an f32 run of whole blocks of a longer row that starts
/// at token `base` (a multiple of BLOCK), whose block maxima are `bmax`, with the inline noise
/// of `key`: the keys of the tokens of the longer row, as [`RowValues::race`] over the same
/// range of it computes them. Fails only if the race's per-block scratch cannot be allocated.
pub(crate) fn race_inline_at(
    k: &Kernels,
    row: &[f32],
    bmax: &[f32],
    p: RaceParams,
    key: u64,
    base: usize,
) -> Result<Best> {
    assert!(base.is_multiple_of(crate::kernels::BLOCK) && bmax.len() >= row.len().div_ceil(crate::kernels::BLOCK));
    let dk = <[f32]>::kernels(k);
    // SAFETY: `row.len()` values and a block maximum per block of them (checked above); the
    // scratch is this thread's, with room for bmax.len() blocks.
    with_scratch(bmax.len(), |b| unsafe { (dk.race_inline)(row.as_ptr(), row.len(), bmax, p, key, base, b) })
}

/// The noise a race reads: the counter-based noise of a row key, or one value per token.
#[derive(Clone, Copy, Debug)]
pub(crate) enum RaceNoise {
    Inline(u64),
    /// `n` values of this kind, valid for the draw call (the caller's noise or a pool lease).
    External(*const f32, NoiseKind),
}

// SAFETY: the values behind an external pointer outlive the draw call that uses them (the
// caller's noise, or the plan's own pool lease) and are only read, from any thread.
unsafe impl Send for RaceNoise {}
unsafe impl Sync for RaceNoise {}

thread_local! {
    /// The blocks' bounds and noise of the race running on this thread.
    static RACE_SCRATCH: std::cell::RefCell<RaceScratch> = std::cell::RefCell::new(RaceScratch::default());
    /// The block noise of a row whose listed tokens race apart ([`RowValues::race_processed`]).
    static BLOCK_NOISE: std::cell::RefCell<Vec<BlockNoise>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// What this thread keeps in the race's scratch and the block noise of touched tokens, for
/// `draw::KEPT_PER_THREAD`.
pub(crate) fn kept() -> [crate::alloc::Kept; 2] {
    let bytes = RACE_SCRATCH.try_with(|b| b.try_borrow().map_or(0, |s| s.capacity_bytes())).unwrap_or(0);
    let release = || {
        let _ = RACE_SCRATCH.try_with(|b| b.try_borrow_mut().map(|mut s| *s = RaceScratch::default()));
    };
    [
        crate::alloc::Kept { bytes, release },
        crate::alloc::kept_vec(&BLOCK_NOISE, || crate::alloc::release_vec(&BLOCK_NOISE)),
    ]
}

/// Runs `race` with this thread's race scratch, room made first for `blocks` blocks (the
/// allocation that can fail, here rather than inside the kernel).
fn with_scratch<R>(blocks: usize, race: impl FnOnce(&mut RaceScratch) -> R) -> Result<R> {
    RACE_SCRATCH.with(|b| {
        let scratch = &mut *b.borrow_mut();
        scratch.reserve(blocks)?;
        Ok(race(scratch))
    })
}

/// `RowValues` for a slice of one dtype: `$table` is its field in `Kernels`, `$to_f32` its
/// conversion.
macro_rules! impl_row_values {
    ($elem:ty, $table:ident, |$x:ident| $to_f32:expr) => {
        impl RowValues for [$elem] {
            type E = $elem;
            #[inline(always)]
            fn n(&self) -> usize {
                self.len()
            }
            #[inline(always)]
            fn at(&self, i: usize) -> f32 {
                let $x = self[i];
                $to_f32
            }
            fn ptr(&self) -> *const $elem {
                self.as_ptr()
            }
            fn kernels(k: &Kernels) -> &DtypeKernels<$elem> {
                &k.$table
            }
        }
    };
}
impl_row_values!(f32, f32, |x| x);
impl_row_values!(Bf16, bf16, |x| x.to_f32());
impl_row_values!(F16, f16, |x| x.to_f32());

/// Runs `$body` with `$v` bound to row `$r` of `$batch` as a `&[E]` of its dtype (monomorphised
/// per dtype): `with_row!(batch, r, |v| ...)`.
macro_rules! with_row {
    ($batch:expr, $r:expr, |$v:ident| $body:expr) => {{
        let start = $batch.logits_row($r) * $batch.row_stride;
        let end = start + $batch.vocab;
        match $batch.logits {
            $crate::batch::Logits::F32(s) => {
                let $v = &s[start..end];
                $body
            }
            $crate::batch::Logits::Bf16(s) => {
                let $v = &s[start..end];
                $body
            }
            $crate::batch::Logits::F16(s) => {
                let $v = &s[start..end];
                $body
            }
        }
    }};
}
pub(crate) use with_row;
