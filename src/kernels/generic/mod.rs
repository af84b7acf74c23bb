//! The kernels, written once over [`Simd`]. Each instruction set instantiates these inside its
//! own `#[target_feature]` functions (`kernel_table!` in the parent module); [`Scalar`]
//! instantiates them as the reference.
//!
//! Rows are processed in blocks of [`BLOCK`] elements. A first pass records each block's maximum
//! (NaN ignored) and whether any NaN was seen; greedy rows then look for the first index of the
//! maximum in the first block that holds it, and sampling rows run the race.
//!
//! The race for a token i is `key_i = (x_i - m) * inv_t - ln E_i`; the token is the lowest index
//! of the largest key. Inline noise is generated per block with a known bound on its largest
//! `-ln E` (see [`BlockNoise`]), so a block or vector whose keys cannot reach the best key so far
//! is skipped without generating its noise. Pruning only skips tokens whose computed key is
//! provably below the best, so it never changes the result.
//!
//! One algorithm per file:
//! - `noise.rs`: ln, the counter hash, the Exp(1) noise and its cheap bounds, the key words;
//!   `fill_noise`.
//! - `scan.rs`: pass 1 (block maxima and NaN), or a greedy row's one pass (`top_block`);
//!   `find_first`; the benchmark's read floors.
//! - `race.rs`: the block noise and the inline race; the race on external noise.
//! - `mass.rs`: f32 probability mass: exp2, the weight kinds, per-block mass, `mass_weights`,
//!   `mass_gather`, `mass_split`, `gather_ge`, `count_ge`, `kept_scan`.
//! - `mass64.rs`: f64 probability mass: `exp64`, per-block mass, `weights64`.
//! - `words.rs`: integer loops of the sampling step: the last pass of a row's step over its
//!   mask words (`step_words`), the range check of the token lists (`ids_in_range`), a block's
//!   tokens in the histories (`block_history`).
//! - `mod.rs` (this file): [`BLOCK`], and what the two mass files share: the last block's padding
//!   ([`tail_block`]) and the summation trees ([`tree16`], [`sum_columns`]).
//!
//! Every kernel that reads or writes through a pointer is an `unsafe fn` whose `# Safety`
//! section says what its pointers must allow; "`S` usable here" means that the code runs where
//! `S`'s instructions may run (see [`Simd`]: inside the entry points of its level).

pub(crate) mod mass;
pub(crate) mod mass64;
pub(crate) mod noise;
pub(crate) mod probs;
pub(crate) mod race;
pub(crate) mod scan;
pub(crate) mod words;

#[cfg(feature = "internals")]
pub(crate) use mass::exp2_neg;
pub(crate) use mass::{
    count_ge, gather_ge, kept_scan, mass, mass_gather, mass_split, mass_weights, MassKind, MassParams, T_MIN,
};
pub(crate) use mass64::{exp64, mass64, weights64, Mass64Params, A_MIN64};
pub(crate) use noise::fill_noise;
pub(crate) use race::{race_external, race_inline, Best, BlockNoise, BlockValues, RaceParams, RaceScratch};
pub(crate) use scan::{find_first, masked_copy, scan, top_block, top_block_pair};
#[cfg(feature = "internals")]
pub(crate) use scan::{max_only, max_two};
pub(crate) use words::{block_history, ids_in_range, step_words, BlockHistory, WordPass};

#[cfg(doc)]
use crate::kernels::simd::Simd;
use crate::kernels::simd::{Elem, Scalar};
use std::mem::MaybeUninit;

/// Elements per block of the first pass.
pub(crate) const BLOCK: usize = 256;

/// The largest of `values` and `init` (none NaN): a row's block maxima, a few hundred of them,
/// which a fold would chain through one `maxss` at a time (3-4 cycles each, a microsecond for
/// vocabulary 262144); here sixteen lanes run apart and the compiler vectorises them. Which of
/// two zeros it returns depends on the order: callers add `+ 0.0` or compare with `==`.
#[inline]
pub(crate) fn largest(values: &[f32], init: f32) -> f32 {
    const LANES: usize = 16;
    let mut acc = [init; LANES];
    let chunks = values.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a = if v > *a { v } else { *a };
        }
    }
    acc.iter().chain(rest).fold(init, |m, &v| if v > m { v } else { m })
}

/// The mass kernels read a block as `COLS` rows of `COLS` columns: `x[b * BLOCK + r * COLS + j]`.
pub(crate) const COLS: usize = 16;
const _: () = assert!(COLS * COLS == BLOCK);

/// The `len < BLOCK` values at `q` as f32, padded to a whole block with `pad`, in `buf`: the
/// last block of a row, for the kernels that read whole blocks. (Filled in place, so that no
/// block is copied.)
///
/// # Safety
/// `q` valid for `len` reads.
#[inline(always)]
pub(crate) unsafe fn tail_block<E: Elem>(
    q: *const E,
    len: usize,
    pad: f32,
    buf: &mut MaybeUninit<[f32; BLOCK]>,
) -> &[f32; BLOCK] {
    let tmp = buf.write([pad; BLOCK]);
    for (i, t) in tmp.iter_mut().enumerate().take(len) {
        // SAFETY: i < len (the caller's contract); one lane runs anywhere.
        *t = unsafe { E::load::<Scalar>(q.add(i)) };
    }
    tmp
}

// ---------------------------------------------------------------------------------------------
// The summation trees. The mass of a block does not depend on the SIMD level: each column is
// summed over its 16 rows in the fixed pairwise tree of `tree16` (in f32, `LANES` columns at a
// time, or in f64), and the 16 column sums are added in f64 in the fixed tree of `sum_columns`.
// The operations per element and per column are the same on every level (a level of `LANES`
// lanes handles `COLS / LANES` column groups), so every level returns bit-identical sums.
// ---------------------------------------------------------------------------------------------

/// The 16 values a `tree16` adds, produced in index order on demand (so that the f32 weights
/// are computed next to their use, with no closure: it would not inherit the caller's target
/// features).
pub(crate) trait Leaves {
    type T: Copy;
    fn add(a: Self::T, b: Self::T) -> Self::T;
    /// Leaf `r` (`r < 16`), asked for once each, in increasing `r`.
    ///
    /// # Safety
    /// What the implementation says.
    unsafe fn leaf(&mut self, r: usize) -> Self::T;

    /// Leaves `r .. r + 4`, in order (an implementation may compute them side by side).
    ///
    /// # Safety
    /// As `leaf`, for each of the four.
    #[inline(always)]
    unsafe fn leaves4(&mut self, r: usize) -> [Self::T; 4] {
        // SAFETY: the caller's contract.
        unsafe { [self.leaf(r), self.leaf(r + 1), self.leaf(r + 2), self.leaf(r + 3)] }
    }
}

/// `(l[r] + l[r+1]) + (l[r+2] + l[r+3])`.
///
/// # Safety
/// As [`Leaves::leaf`].
#[inline(always)]
unsafe fn tree4<L: Leaves>(l: &mut L, r: usize) -> L::T {
    // SAFETY: the caller's contract; r + 3 < 16.
    unsafe {
        let [w0, w1, w2, w3] = l.leaves4(r);
        L::add(L::add(w0, w1), L::add(w2, w3))
    }
}

/// The sum of 16 leaves in the fixed pairwise tree `((q0 + q4) + (q8 + q12))` of the quads
/// `q_r = (l[r] + l[r+1]) + (l[r+2] + l[r+3])`, leaves taken in index order.
///
/// # Safety
/// As [`Leaves::leaf`].
#[inline(always)]
pub(crate) unsafe fn tree16<L: Leaves>(l: &mut L) -> L::T {
    // SAFETY: the caller's contract.
    unsafe {
        let a = L::add(tree4(l, 0), tree4(l, 4));
        let b = L::add(tree4(l, 8), tree4(l, 12));
        L::add(a, b)
    }
}

/// The f64 sum of 16 column sums (f32 or f64), in a fixed tree.
#[inline(always)]
pub(crate) fn sum_columns<T: Copy + Into<f64>>(c: &[T; COLS]) -> f64 {
    let mut h = [0f64; 8];
    for j in 0..8 {
        h[j] = c[j].into() + c[j + 8].into();
    }
    ((h[0] + h[4]) + (h[2] + h[6])) + ((h[1] + h[5]) + (h[3] + h[7]))
}
