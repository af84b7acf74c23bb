//! SIMD kernels, chosen once at run time.
//!
//! The algorithms live in `generic/`, written once over the `simd::Simd` trait. Each
//! instruction set provides the trait (`simd.rs` for one lane, `portable.rs`, `x86_64/`) and a
//! table of `#[target_feature]` entry points built by `kernel_table!`. [`best_level`] detects
//! the CPU once and caches the answer, as the `memchr` crate does.
//!
//! # Unsafe code
//!
//! Two things are relied on, and each `unsafe` block says which (`// SAFETY:`):
//! - Pointers: every kernel that reads or writes through a pointer is an `unsafe fn` whose
//!   `# Safety` section says how many elements must be valid; its callers (in `draw/`, the noise
//!   pool) pass slices of at least that length.
//! - Instructions: the `Simd` implementations of `x86_64/` execute AVX2 or AVX-512 instructions
//!   from safe methods, and the first passes of `aarch64.rs` and `s390x.rs` NEON or VX ones. `Simd` is an `unsafe trait` whose contract is that its methods run only
//!   where their features are available. This module keeps it: those types are private to it,
//!   they are instantiated only in the entry points of `kernel_table!`, each compiled with
//!   `#[target_feature]` for exactly its level's features ([`SimdLevel::target_features`]), and
//!   those entry points are reachable only through the table that `kernels(level)` returns after
//!   checking [`SimdLevel::is_supported`], which detects exactly those features.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub(crate) mod generic;
pub(crate) mod portable;
pub(crate) mod simd;
#[cfg(any(test, feature = "internals"))]
pub mod test_support;
/// The x86-64 instruction sets: private to this module (see the module doc, "Unsafe code").
#[cfg(target_arch = "x86_64")]
mod x86_64 {
    pub(crate) mod avx2;
    pub(crate) mod avx512;
}
/// aarch64 NEON: private to this module (see the module doc, "Unsafe code").
#[cfg(target_arch = "aarch64")]
mod aarch64;
/// IBM Z vector enhancements 2 (z15+), built by compilers from 1.93 on (`build.rs`), which
/// accept the s390x target features and detection: private to this module.
#[cfg(all(target_arch = "s390x", tokenrace_s390x_vector))]
mod s390x;

use crate::config::{NoiseKind, SimdChoice};
use crate::error::{Error, ErrorKind, Result};
pub(crate) use generic::{
    largest, Best, BlockNoise, BlockValues, Mass64Params, MassKind, MassParams, RaceParams, RaceScratch, BLOCK,
};
pub use simd::{Bf16, F16};
use std::ffi::CStr;
use std::sync::OnceLock;

/// An instruction-set level the kernels run at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum SimdLevel {
    /// One lane at a time: the reference.
    Scalar,
    /// Fixed-width arrays that the compiler vectorises for the target's baseline.
    Portable,
    /// x86-64 with the features `avx2` and `f16c` (not `fma`: see [`SimdLevel::target_features`]).
    Avx2,
    /// x86-64 with the feature `avx512f`.
    Avx512,
    /// aarch64 with `neon`: the portable arrays and a NEON first pass.
    Neon,
    /// s390x with `vector`, `vector-enhancements-1` and `vector-enhancements-2` (z15 and later):
    /// the portable arrays compiled for them and a first pass in inline assembly. Built by
    /// compilers from Rust 1.93 on.
    Vxe2,
}

impl SimdLevel {
    /// The level's name: "scalar", "portable", "avx2", "avx512", "neon" or "vxe2".
    pub fn name(self) -> &'static str {
        match self.c_name().to_str() {
            Ok(name) => name,
            Err(_) => unreachable!("the names are ASCII"),
        }
    }

    /// [`SimdLevel::name`] as a NUL-terminated C string in static storage, for the C ABI.
    pub(crate) fn c_name(self) -> &'static CStr {
        match self {
            SimdLevel::Scalar => c"scalar",
            SimdLevel::Portable => c"portable",
            SimdLevel::Avx2 => c"avx2",
            SimdLevel::Avx512 => c"avx512",
            SimdLevel::Neon => c"neon",
            SimdLevel::Vxe2 => c"vxe2",
        }
    }

    /// Every level, lowest first.
    pub const ALL: [SimdLevel; 6] =
        [SimdLevel::Scalar, SimdLevel::Portable, SimdLevel::Avx2, SimdLevel::Avx512, SimdLevel::Neon, SimdLevel::Vxe2];

    /// The CPU features the level's kernels are compiled with (`#[target_feature(enable = ...)]`
    /// on each entry point), which are exactly those [`SimdLevel::is_supported`] detects:
    /// none for `Scalar` and `Portable`; `avx2`, `f16c` for `Avx2`; `avx512f` for `Avx512`;
    /// `neon` for `Neon`; `vector`, `vector-enhancements-1`, `vector-enhancements-2` for `Vxe2`
    /// (empty for a level of another architecture).
    ///
    /// FMA is not among them, by design: every level runs the same IEEE operations in the same
    /// order, with separate roundings, so that all compute bit-identical keys and sums. (The
    /// compiler takes `avx512f` to imply `fma`, but Rust never fuses a multiply and an add on its
    /// own and the kernels call no FMA intrinsic.)
    pub fn target_features(self) -> &'static [&'static str] {
        match self {
            SimdLevel::Scalar => scalar_table::FEATURES,
            SimdLevel::Portable => portable_table::FEATURES,
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 => avx2_table::FEATURES,
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512 => avx512_table::FEATURES,
            #[cfg(target_arch = "aarch64")]
            SimdLevel::Neon => neon_table::FEATURES,
            #[cfg(all(target_arch = "s390x", tokenrace_s390x_vector))]
            SimdLevel::Vxe2 => vxe2_table::FEATURES,
            #[allow(unreachable_patterns)]
            _ => &[],
        }
    }

    /// Whether this CPU can run the level: it has every one of
    /// [`SimdLevel::target_features`] (and the level is built for this architecture).
    pub fn is_supported(self) -> bool {
        match self {
            SimdLevel::Scalar => scalar_table::detected(),
            SimdLevel::Portable => portable_table::detected(),
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 => avx2_table::detected(),
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512 => avx512_table::detected(),
            #[cfg(target_arch = "aarch64")]
            SimdLevel::Neon => neon_table::detected(),
            #[cfg(all(target_arch = "s390x", tokenrace_s390x_vector))]
            SimdLevel::Vxe2 => vxe2_table::detected(),
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }
}

/// The best level this CPU supports, detected once.
pub fn best_level() -> SimdLevel {
    static BEST: OnceLock<SimdLevel> = OnceLock::new();
    *BEST.get_or_init(|| {
        SimdLevel::ALL.into_iter().rev().find(|&l| l.is_supported() && chosen_by_auto(l)).unwrap_or(SimdLevel::Scalar)
    })
}

/// Whether `auto` may choose a supported level. Not `portable` on an s390x build without
/// vector-enhancements-1 (the default target is z10, without even the vector facility): there
/// its arrays compile to scalar code whose accumulators spill, 1.5-1.9x the instructions of the
/// `scalar` level (docs/performance.md). It can still be asked for.
fn chosen_by_auto(level: SimdLevel) -> bool {
    #[cfg(target_arch = "s390x")]
    if level == SimdLevel::Portable && !cfg!(target_feature = "vector-enhancements-1") {
        return false;
    }
    let _ = level;
    true
}

/// The level a configuration asks for, or an UNSUPPORTED error naming it.
pub fn resolve(choice: SimdChoice) -> Result<SimdLevel> {
    let level = match choice {
        SimdChoice::Auto => return Ok(best_level()),
        SimdChoice::Scalar => SimdLevel::Scalar,
        SimdChoice::Portable => SimdLevel::Portable,
        SimdChoice::Avx2 => SimdLevel::Avx2,
        SimdChoice::Avx512 => SimdLevel::Avx512,
        SimdChoice::Neon => SimdLevel::Neon,
        SimdChoice::Vxe2 => SimdLevel::Vxe2,
    };
    if !level.is_supported() {
        return Err(Error::new(
            ErrorKind::Unsupported,
            format!("simd: this CPU does not support {} (best available: {})", level.name(), best_level().name()),
        ));
    }
    Ok(level)
}

/// The inline race: (row, n, block maxima, params, row key, base index, scratch of the blocks'
/// bounds).
pub(crate) type RaceInlineFn<E> = unsafe fn(*const E, usize, &[f32], RaceParams, u64, usize, &mut RaceScratch) -> Best;

/// The inline race of the tokens a mask keeps: (row, mask words, n, block maxima, params, row
/// key, scratch of the blocks' bounds, the values of the blocks whose values are not the row's).
pub(crate) type RaceInlineMaskedFn<E> =
    unsafe fn(*const E, *const u32, usize, &[f32], RaceParams, u64, &mut RaceScratch, Option<&dyn BlockValues>) -> Best;

/// The last pass of a row's step (keep, mask or empty, seen, output, listed).
pub(crate) type StepWordsFn = unsafe fn(&mut [u32], &mut [u32], &mut [u32], &mut [u32], &[u32]) -> generic::WordPass;

/// [`DtypeKernels::top_block_pair`]: two rows (row, other row, n), each row's `top_block`.
pub(crate) type TopBlockPairFn<E> = unsafe fn(*const E, *const E, usize) -> [(f32, usize, bool); 2];

/// The kernels of one logits dtype.
pub(crate) struct DtypeKernels<E> {
    pub scan: unsafe fn(*const E, usize, &mut [f32]) -> bool,
    pub find_first: unsafe fn(*const E, usize, usize, f32) -> Option<usize>,
    /// The pass of a greedy row that needs nothing else (row, n): its maximum, the first block
    /// holding it, and whether any element is NaN.
    pub top_block: unsafe fn(*const E, usize) -> (f32, usize, bool),
    /// `top_block` of two rows of the same length (row, other row, n), read in turn.
    pub top_block_pair: TopBlockPairFn<E>,
    pub race_inline: RaceInlineFn<E>,
    pub race_external: unsafe fn(*const E, *const f32, usize, RaceParams, NoiseKind, usize) -> Best,
    /// The first pass over the tokens a mask keeps (row, mask words, n, block maxima): NaN is
    /// reported for every token.
    pub scan_masked: unsafe fn(*const E, *const u32, usize, &mut [f32]) -> bool,
    /// The inline race of the tokens a mask keeps, of a whole row (row, mask words, n, block
    /// maxima of the kept tokens, params, row key, block-noise scratch).
    pub race_inline_masked: RaceInlineMaskedFn<E>,
    /// The race on external noise of the tokens a mask keeps, of a whole row (row, mask words,
    /// noise, n, params, kind).
    pub race_external_masked: unsafe fn(*const E, *const u32, *const f32, usize, RaceParams, NoiseKind) -> Best,
    /// The values a mask keeps, -inf elsewhere, as f32 (row, mask words, n, out, block maxima
    /// of the copy or empty): whether any value is NaN.
    pub masked_copy: unsafe fn(*const E, *const u32, usize, *mut f32, &mut [f32]) -> bool,
    /// The read floor of the benchmark (row, n): the largest value.
    #[cfg(feature = "internals")]
    pub max_only: unsafe fn(*const E, usize) -> f32,
    /// The read floor of a race on external noise (row, noise, n): the largest value of both.
    #[cfg(feature = "internals")]
    pub max_two: unsafe fn(*const E, *const f32, usize) -> f32,
    /// Per-block mass (row, n, block maxima or empty, params, kind, out).
    pub mass: MassFn<E>,
    /// Per-token f32 weights (row, n, params, out).
    pub mass_weights: unsafe fn(*const E, usize, MassParams, *mut f32),
    /// The values `>= lo` in row order (row, n, block maxima, lo, out).
    pub gather_ge: unsafe fn(*const E, usize, &[f32], f32, &mut Vec<f32>),
    /// The count of the values `>= lo` (row, n, block maxima, lo).
    pub count_ge: unsafe fn(*const E, usize, &[f32], f32) -> usize,
    /// The least and the count of the values `>= lo`, their bits into the words (row, n, block
    /// maxima, lo, words or empty): the kept set's scan.
    pub kept_scan: KeptScanFn<E>,
    /// Per-block exp mass below the cut and the values at or above it (row, n, block maxima,
    /// params, out, values).
    pub mass_gather: MassGatherFn<E>,
    /// Per-block f32 mass below the cut and at or above it, in one pass (row, n, block maxima
    /// or empty, params, cheap weights, out below, out above).
    pub mass_split: MassSplitFn<E>,
    /// Per-block f64 mass (row, n, block maxima or empty, params, out).
    pub mass64: unsafe fn(*const E, usize, &[f32], Mass64Params, &mut [f64]),
}

/// The kept set's scan: (row, n, block maxima, lo, words or empty) -> (least, count).
pub(crate) type KeptScanFn<E> = unsafe fn(*const E, usize, &[f32], f32, &mut [i32]) -> (f32, i32);

/// The mass-and-gather kernel: (row, n, block maxima, params, out, values).
pub(crate) type MassGatherFn<E> = unsafe fn(*const E, usize, &[f32], MassParams, &mut [f64], &mut Vec<f32>);

/// The split mass kernel: (row, n, block maxima or empty, params, cheap, out below, out above).
pub(crate) type MassSplitFn<E> = unsafe fn(*const E, usize, &[f32], MassParams, bool, &mut [f64], &mut [f64]);

/// The per-block f32 mass kernel: (row, n, block maxima or empty, params, kind, out).
pub(crate) type MassFn<E> = unsafe fn(*const E, usize, &[f32], MassParams, MassKind, &mut [f64]);

/// Every kernel of one level. Calling them is safe once the level is known to be supported,
/// which [`kernels`] guarantees.
#[allow(dead_code)] // fill_noise is used by the noise pool
pub(crate) struct Kernels {
    pub level: SimdLevel,
    /// Whether greedy rows on one thread go two at a time, read in turn
    /// ([`Simd::INTERLEAVE_ROWS`](simd::Simd::INTERLEAVE_ROWS)).
    pub interleave_rows: bool,
    pub f32: DtypeKernels<f32>,
    pub bf16: DtypeKernels<Bf16>,
    pub f16: DtypeKernels<F16>,
    pub fill_noise: unsafe fn(*mut f32, usize, u64, u32, bool),
    /// f64 weights of f32 values (values, m, inv_t, out).
    pub weights64: unsafe fn(&[f32], f64, f64, &mut [f64]),
    /// The inline noise of every block of a row (row key, first block, block maxima, params,
    /// out), for code that visits blocks itself (the residual race of a verify call).
    pub block_noise: unsafe fn(u64, usize, &[f32], RaceParams, &mut [BlockNoise]),
    /// The sum of a probability row and whether a value is negative (row, n).
    pub prob_sum: unsafe fn(*const f32, usize) -> (f64, bool),
    /// The last pass of a row's step over its words (keep, mask or empty, seen, output,
    /// listed): see `generic::step_words`.
    pub step_words: StepWordsFn,
    /// Whether every id lies in `[0, vocab)` (ids, vocab below 2^31).
    pub ids_in_range: unsafe fn(&[i32], u32) -> bool,
    /// The tokens of one block in a row's histories (prompt, output, the block's first token,
    /// whether to count, out): see `generic::block_history`.
    pub block_history: unsafe fn(&[i32], &[i32], u32, bool, &mut generic::BlockHistory),
}

/// Builds the module `$module` of one level: `#[target_feature]` entry points that instantiate
/// the generic kernels for `$simd`, the table of them, and the level's feature list.
///
/// The list `[$feature, ...]` of each invocation (below) is the only place where a level's
/// features are written, and it is used three times: every entry point
/// enables exactly these features, `FEATURES` lists them ([`SimdLevel::target_features`]) and
/// `detected` checks exactly these ([`SimdLevel::is_supported`]), so the table is only built
/// for a CPU that can run it.
///
/// SAFETY (every `unsafe` block of the entry points): the caller keeps the kernel's pointer
/// contract (its `# Safety` in `generic/`); `$simd` may run here because this function enables
/// its level's features (see the `Simd` trait).
macro_rules! kernel_table {
    ($module:ident, $level:expr, $simd:ty, $detect:ident, [$($feature:tt),*]) => {
        mod $module {
            use super::generic;
            use super::simd::Elem;
            use super::*;

            /// The features every entry point below enables.
            pub(super) const FEATURES: &[&str] = &[$($feature),*];

            /// Whether this CPU has every one of `FEATURES`.
            pub(super) fn detected() -> bool {
                true $(&& std::arch::$detect!($feature))*
            }

            $(#[target_feature(enable = $feature)])*
            unsafe fn scan<E: Elem>(row: *const E, n: usize, bmax: &mut [f32]) -> bool {
                // SAFETY: see kernel_table!.
                unsafe { generic::scan::<$simd, E>(row, std::ptr::null(), n, bmax) }
            }
            $(#[target_feature(enable = $feature)])*
            unsafe fn scan_masked<E: Elem>(row: *const E, keep: *const u32, n: usize, bmax: &mut [f32]) -> bool {
                // SAFETY: see kernel_table!.
                unsafe { generic::scan::<$simd, E>(row, keep, n, bmax) }
            }
            $(#[target_feature(enable = $feature)])*
            unsafe fn top_block<E: Elem>(row: *const E, n: usize) -> (f32, usize, bool) {
                // SAFETY: see kernel_table!.
                unsafe { generic::top_block::<$simd, E>(row, n) }
            }
            $(#[target_feature(enable = $feature)])*
            unsafe fn top_block_pair<E: Elem>(row: *const E, other: *const E, n: usize) -> [(f32, usize, bool); 2] {
                // SAFETY: see kernel_table!.
                unsafe { generic::top_block_pair::<$simd, E>(row, other, n) }
            }
            $(#[target_feature(enable = $feature)])*
            unsafe fn find_first<E: Elem>(row: *const E, start: usize, end: usize, target: f32) -> Option<usize> {
                // SAFETY: see kernel_table!.
                unsafe { generic::find_first::<$simd, E>(row, start, end, target) }
            }
            $(#[target_feature(enable = $feature)])*
            unsafe fn race_inline<E: Elem>(row: *const E, n: usize, bmax: &[f32], p: RaceParams, key: u64, base: usize, blocks: &mut RaceScratch) -> Best {
                // SAFETY: see kernel_table!.
                unsafe { generic::race_inline::<$simd, E>(row, std::ptr::null(), n, bmax, p, key, base, blocks, None) }
            }
            $(#[target_feature(enable = $feature)])*
            #[allow(clippy::too_many_arguments)]
            unsafe fn race_inline_masked<E: Elem>(row: *const E, keep: *const u32, n: usize, bmax: &[f32], p: RaceParams, key: u64, blocks: &mut RaceScratch, processed: Option<&dyn BlockValues>) -> Best {
                // SAFETY: see kernel_table!.
                unsafe { generic::race_inline::<$simd, E>(row, keep, n, bmax, p, key, 0, blocks, processed) }
            }
            $(#[target_feature(enable = $feature)])*
            unsafe fn race_external<E: Elem>(row: *const E, noise: *const f32, n: usize, p: RaceParams, kind: NoiseKind, base: usize) -> Best {
                // SAFETY: see kernel_table!.
                unsafe { generic::race_external::<$simd, E>(row, std::ptr::null(), noise, n, p, kind, base) }
            }
            $(#[target_feature(enable = $feature)])*
            unsafe fn race_external_masked<E: Elem>(row: *const E, keep: *const u32, noise: *const f32, n: usize, p: RaceParams, kind: NoiseKind) -> Best {
                // SAFETY: see kernel_table!.
                unsafe { generic::race_external::<$simd, E>(row, keep, noise, n, p, kind, 0) }
            }
            $(#[target_feature(enable = $feature)])*
            unsafe fn masked_copy<E: Elem>(row: *const E, keep: *const u32, n: usize, out: *mut f32, bmax: &mut [f32]) -> bool {
                // SAFETY: see kernel_table!.
                unsafe { generic::masked_copy::<$simd, E>(row, keep, n, out, bmax) }
            }
            #[cfg(feature = "internals")]
            $(#[target_feature(enable = $feature)])*
            unsafe fn max_only<E: Elem>(row: *const E, n: usize) -> f32 {
                // SAFETY: see kernel_table!.
                unsafe { generic::max_only::<$simd, E>(row, n) }
            }
            #[cfg(feature = "internals")]
            $(#[target_feature(enable = $feature)])*
            unsafe fn max_two<E: Elem>(row: *const E, other: *const f32, n: usize) -> f32 {
                // SAFETY: see kernel_table!.
                unsafe { generic::max_two::<$simd, E>(row, other, n) }
            }
            $(#[target_feature(enable = $feature)])*
            unsafe fn fill_noise(out: *mut f32, n: usize, key: u64, first: u32, log: bool) {
                // SAFETY: see kernel_table!.
                unsafe { generic::fill_noise::<$simd>(out, n, key, first, log) }
            }
            $(#[target_feature(enable = $feature)])*
            unsafe fn mass<E: Elem>(row: *const E, n: usize, bmax: &[f32], p: MassParams, kind: MassKind, out: &mut [f64]) {
                // SAFETY: see kernel_table!.
                unsafe { generic::mass::<$simd, E>(row, n, bmax, p, kind, out) }
            }
            $(#[target_feature(enable = $feature)])*
            unsafe fn mass_weights<E: Elem>(row: *const E, n: usize, p: MassParams, out: *mut f32) {
                // SAFETY: see kernel_table!.
                unsafe { generic::mass_weights::<$simd, E>(row, n, p, out) }
            }
            $(#[target_feature(enable = $feature)])*
            unsafe fn gather_ge<E: Elem>(row: *const E, n: usize, bmax: &[f32], lo: f32, out: &mut Vec<f32>) {
                // SAFETY: see kernel_table!.
                unsafe { generic::gather_ge::<$simd, E>(row, n, bmax, lo, out) }
            }
            $(#[target_feature(enable = $feature)])*
            unsafe fn count_ge<E: Elem>(row: *const E, n: usize, bmax: &[f32], lo: f32) -> usize {
                // SAFETY: see kernel_table!.
                unsafe { generic::count_ge::<$simd, E>(row, n, bmax, lo) }
            }
            $(#[target_feature(enable = $feature)])*
            unsafe fn kept_scan<E: Elem>(row: *const E, n: usize, bmax: &[f32], lo: f32, bits: &mut [i32]) -> (f32, i32) {
                // SAFETY: see kernel_table!.
                unsafe { generic::kept_scan::<$simd, E>(row, n, bmax, lo, bits) }
            }
            $(#[target_feature(enable = $feature)])*
            unsafe fn mass_gather<E: Elem>(row: *const E, n: usize, bmax: &[f32], p: MassParams, out: &mut [f64], cands: &mut Vec<f32>) {
                // SAFETY: see kernel_table!.
                unsafe { generic::mass_gather::<$simd, E>(row, n, bmax, p, out, cands) }
            }
            $(#[target_feature(enable = $feature)])*
            unsafe fn mass_split<E: Elem>(row: *const E, n: usize, bmax: &[f32], p: MassParams, cheap: bool, below: &mut [f64], above: &mut [f64]) {
                // SAFETY: see kernel_table!.
                unsafe { generic::mass_split::<$simd, E>(row, n, bmax, p, cheap, below, above) }
            }
            $(#[target_feature(enable = $feature)])*
            unsafe fn mass64<E: Elem>(row: *const E, n: usize, bmax: &[f32], p: Mass64Params, out: &mut [f64]) {
                // SAFETY: see kernel_table!.
                unsafe { generic::mass64::<$simd, E>(row, n, bmax, p, out) }
            }
            $(#[target_feature(enable = $feature)])*
            unsafe fn weights64(xs: &[f32], m: f64, s: f64, out: &mut [f64]) {
                // SAFETY: see kernel_table!.
                unsafe { generic::weights64::<$simd>(xs, m, s, out) }
            }
            $(#[target_feature(enable = $feature)])*
            unsafe fn block_noise(key: u64, first: usize, bmax: &[f32], p: RaceParams, out: &mut [BlockNoise]) {
                // SAFETY: see kernel_table!.
                unsafe { generic::race::fill_block_noise::<$simd>(key, first, bmax, p, out) }
            }
            $(#[target_feature(enable = $feature)])*
            unsafe fn prob_sum(row: *const f32, n: usize) -> (f64, bool) {
                // SAFETY: see kernel_table!.
                unsafe { generic::probs::prob_sum::<$simd>(row, n) }
            }
            $(#[target_feature(enable = $feature)])*
            unsafe fn step_words(keep: &mut [u32], mask: &mut [u32], seen: &mut [u32], output: &mut [u32], listed: &[u32]) -> generic::WordPass {
                generic::step_words(keep, mask, seen, output, listed)
            }
            $(#[target_feature(enable = $feature)])*
            unsafe fn ids_in_range(ids: &[i32], vocab: u32) -> bool {
                generic::ids_in_range(ids, vocab)
            }
            $(#[target_feature(enable = $feature)])*
            unsafe fn block_history(prompt: &[i32], output: &[i32], base: u32, count: bool, h: &mut generic::BlockHistory) {
                generic::block_history(prompt, output, base, count, h)
            }
            fn dtype<E: Elem>() -> DtypeKernels<E> {
                DtypeKernels {
                    scan: scan::<E>, find_first: find_first::<E>, top_block: top_block::<E>, top_block_pair: top_block_pair::<E>, race_inline: race_inline::<E>, race_external: race_external::<E>,
                    scan_masked: scan_masked::<E>, race_inline_masked: race_inline_masked::<E>, race_external_masked: race_external_masked::<E>,
                    masked_copy: masked_copy::<E>,
                    #[cfg(feature = "internals")]
                    max_only: max_only::<E>,
                    #[cfg(feature = "internals")]
                    max_two: max_two::<E>,
                    mass: mass::<E>, mass_weights: mass_weights::<E>, gather_ge: gather_ge::<E>, count_ge: count_ge::<E>, kept_scan: kept_scan::<E>, mass_gather: mass_gather::<E>, mass_split: mass_split::<E>, mass64: mass64::<E>,
                }
            }
            /// The table. Only [`kernels`] calls it, once it has checked `detected()`.
            pub(super) fn table() -> Kernels {
                Kernels { level: $level, interleave_rows: <$simd as super::simd::Simd>::INTERLEAVE_ROWS, f32: dtype(), bf16: dtype(), f16: dtype(), fill_noise, weights64, block_noise, prob_sum, step_words, ids_in_range, block_history }
            }
        }
    };
}

kernel_table!(scalar_table, SimdLevel::Scalar, super::simd::Scalar, is_x86_feature_detected, []);
kernel_table!(portable_table, SimdLevel::Portable, super::portable::Portable, is_x86_feature_detected, []);
#[cfg(target_arch = "x86_64")]
kernel_table!(avx2_table, SimdLevel::Avx2, super::x86_64::avx2::Avx2, is_x86_feature_detected, ["avx2", "f16c"]);
#[cfg(target_arch = "x86_64")]
kernel_table!(avx512_table, SimdLevel::Avx512, super::x86_64::avx512::Avx512, is_x86_feature_detected, ["avx512f"]);
#[cfg(target_arch = "aarch64")]
kernel_table!(neon_table, SimdLevel::Neon, super::aarch64::Neon, is_aarch64_feature_detected, ["neon"]);
#[cfg(all(target_arch = "s390x", tokenrace_s390x_vector))]
kernel_table!(
    vxe2_table,
    SimdLevel::Vxe2,
    super::s390x::Vxe2,
    is_s390x_feature_detected,
    ["vector", "vector-enhancements-1", "vector-enhancements-2"]
);

/// The kernels of a supported level (built once per level).
pub(crate) fn kernels(level: SimdLevel) -> &'static Kernels {
    static TABLES: [OnceLock<Kernels>; SimdLevel::ALL.len()] = [const { OnceLock::new() }; SimdLevel::ALL.len()];
    assert!(level.is_supported(), "kernels({level:?}) on a CPU without it");
    TABLES[level as usize].get_or_init(|| match level {
        SimdLevel::Scalar => scalar_table::table(),
        SimdLevel::Portable => portable_table::table(),
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 => avx2_table::table(),
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512 => avx512_table::table(),
        #[cfg(target_arch = "aarch64")]
        SimdLevel::Neon => neon_table::table(),
        #[cfg(all(target_arch = "s390x", tokenrace_s390x_vector))]
        SimdLevel::Vxe2 => vxe2_table::table(),
        #[allow(unreachable_patterns)]
        _ => unreachable!(),
    })
}

/// The read floor of the benchmark: the largest value of each row, one SIMD pass, at `level`.
#[cfg(feature = "internals")]
#[doc(hidden)]
pub fn read_floor(level: SimdLevel, logits: crate::Logits, rows: usize, stride: usize, vocab: usize) -> f32 {
    let k = kernels(level);
    let mut m = f32::NEG_INFINITY;
    for r in 0..rows {
        let start = r * stride;
        // SAFETY: the slices are indexed in bounds below; the level is supported.
        let v = unsafe {
            match logits {
                crate::Logits::F32(s) => (k.f32.max_only)(s[start..start + vocab].as_ptr(), vocab),
                crate::Logits::Bf16(s) => (k.bf16.max_only)(s[start..start + vocab].as_ptr(), vocab),
                crate::Logits::F16(s) => (k.f16.max_only)(s[start..start + vocab].as_ptr(), vocab),
            }
        };
        m = m.max(v);
    }
    m
}

/// The first pass of `rows` f32 rows at `level`, for the benchmark: each row's block maxima
/// (the plain scan, or with `keep`, the masked scan over each row's `keep.1` words of `keep.0`).
/// Returns the largest block maximum seen.
#[cfg(feature = "internals")]
#[doc(hidden)]
pub fn scan_rows(level: SimdLevel, logits: &[f32], keep: Option<(&[u32], usize)>, rows: usize, vocab: usize) -> f32 {
    let k = kernels(level);
    let mut bmax = vec![f32::NEG_INFINITY; vocab.div_ceil(BLOCK)];
    let mut m = f32::NEG_INFINITY;
    for r in 0..rows {
        let row = &logits[r * vocab..(r + 1) * vocab];
        // SAFETY: `row` holds `vocab` values, `bmax` a slot per block, the keep words (sliced in
        // bounds) a bit per token; the level is supported.
        unsafe {
            match keep {
                None => (k.f32.scan)(row.as_ptr(), vocab, &mut bmax),
                Some((words, stride)) => {
                    let w = &words[r * stride..r * stride + vocab.div_ceil(32)];
                    (k.f32.scan_masked)(row.as_ptr(), w.as_ptr(), vocab, &mut bmax)
                }
            }
        };
        m = bmax.iter().fold(m, |a, &b| a.max(b));
    }
    m
}

/// The read floor of a race on external noise: logits and noise read in one pass, at `level`.
#[cfg(feature = "internals")]
#[doc(hidden)]
pub fn read_floor_two(level: SimdLevel, logits: crate::Logits, noise: &[f32], rows: usize, vocab: usize) -> f32 {
    let k = kernels(level);
    let mut m = f32::NEG_INFINITY;
    for r in 0..rows {
        let (s0, nz) = (r * vocab, noise[r * vocab..(r + 1) * vocab].as_ptr());
        // SAFETY: the slices are indexed in bounds; the level is supported.
        let v = unsafe {
            match logits {
                crate::Logits::F32(s) => (k.f32.max_two)(s[s0..s0 + vocab].as_ptr(), nz, vocab),
                crate::Logits::Bf16(s) => (k.bf16.max_two)(s[s0..s0 + vocab].as_ptr(), nz, vocab),
                crate::Logits::F16(s) => (k.f16.max_two)(s[s0..s0 + vocab].as_ptr(), nz, vocab),
            }
        };
        m = m.max(v);
    }
    m
}

/// One step of the xorshift64 generator the kernels' unit tests draw their rows from (a test
/// needs reproducible data, not quality).
#[cfg(test)]
pub(crate) fn xorshift64(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// The levels this machine can run, lowest first (for tests and benchmarks).
pub fn supported_levels() -> Vec<SimdLevel> {
    SimdLevel::ALL.into_iter().filter(|l| l.is_supported()).collect()
}

/// Scalar noise functions, the single definition that the SIMD paths reproduce bit for bit
/// (a test seam: feature `internals`).
#[cfg(feature = "internals")]
pub mod scalar_noise {
    use super::generic::race::{
        block_keys, block_noise_bound, exp_bits_bound, fill_block_noise, token_noise, BlockNoise, RaceParams,
    };
    use super::generic::{noise, BLOCK};
    use super::simd::Scalar;

    /// The 32 random bits of token `index` in the row keyed by `key`.
    pub fn bits(key: u64, index: u32) -> u32 {
        let (k0, k1) = noise::key_words(key);
        noise::hash::<Scalar>(index, k0, k1)
    }
    /// E = -ln((bits + 0.5) 2^-32), in f32.
    pub fn exp(bits: u32) -> f32 {
        noise::exp_noise::<Scalar>(bits)
    }
    /// ln of a positive normal f32, as the kernels compute it.
    pub fn ln(x: f32) -> f32 {
        noise::ln::<Scalar>(x)
    }
    /// ln of any f32, as the kernels compute it for external EXP noise.
    pub fn ln_any(x: f32) -> f32 {
        noise::ln_any::<Scalar>(x)
    }
    /// The noise of every token of a row, as the inline race computes it: `E_i` for
    /// `i in 0..n` of the row keyed by `key` (see `BlockNoise`).
    pub fn race_noise(key: u64, n: usize) -> Vec<f32> {
        let nb = n.div_ceil(BLOCK);
        let mut blocks = vec![BlockNoise { e_min: 0.0, j_min: 0, g_max: 0.0, bound: 0.0 }; nb];
        let p = RaceParams { m: 0.0, inv_t: 1.0, floor: f32::NEG_INFINITY };
        // SAFETY: `bmax` has as many elements as `blocks`; Scalar runs anywhere.
        unsafe { fill_block_noise::<Scalar>(key, 0, &vec![0.0; nb], p, &mut blocks) };
        let k = noise::key_words(key);
        (0..n).map(|i| token_noise(k, &blocks[i / BLOCK], (i % BLOCK) as u32, i as u32)).collect()
    }
    /// The cheap upper bound of `-ln E` (E from `bits`) that the race prunes with.
    pub fn bound(bits: u32) -> f32 {
        noise::noise_bound::<Scalar>(bits)
    }
    /// The bound of `-ln E` over a block whose minimum is `e_min`, as the inline race computes it.
    pub fn block_bound(e_min: f32) -> f32 {
        block_noise_bound::<Scalar>(e_min)
    }
    /// The bound of `-ln E` from the bits of an external E that the race on EXP noise prunes with.
    pub fn exp_bound(e: f32) -> f32 {
        exp_bits_bound::<Scalar>(e)
    }
    /// The bits behind the noise of block `block`: (minimum's bits, position's bits) and the
    /// bound of `-ln E` over the block.
    pub fn block_bits(key: u64, block: u32) -> (u32, u32, f32) {
        let (kmin, kpos) = block_keys(key);
        let h1 = noise::hash::<Scalar>(block, kmin.0, kmin.1);
        let h2 = noise::hash::<Scalar>(block, kpos.0, kpos.1);
        let mut b = [BlockNoise { e_min: 0.0, j_min: 0, g_max: 0.0, bound: 0.0 }];
        let p = RaceParams { m: 0.0, inv_t: 1.0, floor: f32::NEG_INFINITY };
        // SAFETY: one block, one maximum; Scalar runs anywhere.
        unsafe { fill_block_noise::<Scalar>(key, block as usize, &[0.0], p, &mut b) };
        (h1, h2, b[0].g_max)
    }
}
