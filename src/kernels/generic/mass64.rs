//! Probability mass in f64, for the rows the f32 sums cannot decide: the weight
//! `exp(a)`, `a = (x - m) * inv_t` computed exactly in f64 ([`exp64`]), per-block sums in the
//! same fixed trees as the f32 mass ([`mass64`]), and per-value weights ([`weights64`]).

use super::{sum_columns, tail_block, tree16, Leaves, BLOCK, COLS};
use crate::kernels::simd::{Elem, Simd};
use std::mem::MaybeUninit;

const MAGIC52: f64 = 6_755_399_441_055_744.0; // 1.5 * 2^52
const LN2_HI64: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000); // 32 bits: k * LN2_HI64 is exact
const LN2_LO64: f64 = f64::from_bits(0x3dea_39ef_3579_3c76); // ln 2 - LN2_HI64
/// The smallest `a` the f64 weights accept.
pub(crate) const A_MIN64: f64 = -700.0;

/// exp(a) for `A_MIN64 <= a <= 0` in f64, relative error below 1e-15: a = k ln2 + r, |r| <=
/// ln2/2, exp(r) from its Taylor series to degree 12 (truncation below 2e-16), no FMA.
#[inline(always)]
pub(crate) fn exp64(a: f64) -> f64 {
    let k = a * std::f64::consts::LOG2_E + MAGIC52;
    let kf = k - MAGIC52;
    let r = (a - kf * LN2_HI64) - kf * LN2_LO64;
    let r2 = r * r;
    let r4 = r2 * r2;
    let r8 = r4 * r4;
    const C: [f64; 13] = [
        1.0,
        1.0,
        1.0 / 2.0,
        1.0 / 6.0,
        1.0 / 24.0,
        1.0 / 120.0,
        1.0 / 720.0,
        1.0 / 5040.0,
        1.0 / 40320.0,
        1.0 / 362_880.0,
        1.0 / 3_628_800.0,
        1.0 / 39_916_800.0,
        1.0 / 479_001_600.0,
    ];
    let q0 = (C[0] + C[1] * r) + (C[2] + C[3] * r) * r2;
    let q1 = (C[4] + C[5] * r) + (C[6] + C[7] * r) * r2;
    let q2 = (C[8] + C[9] * r) + ((C[10] + C[11] * r) + C[12] * r2) * r2;
    let y = (q0 + q1 * r4) + q2 * r8;
    // The bits of k are those of MAGIC52 plus round(a / ln2); shifted by 52, only the latter is left.
    f64::from_bits(y.to_bits().wrapping_add(k.to_bits() << 52))
}

/// Row constants of the f64 mass kernel: `a = (x - m) * s` in f64; tokens `lo <= x < cut` with
/// `lo` finite and `a(lo) >= A_MIN64`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Mass64Params {
    pub m: f64,
    pub s: f64,
    pub lo: f32,
    pub cut: f32,
}

/// The f64 weight of one value (0 outside `lo <= x < cut`; NaN counts as nothing).
#[inline(always)]
fn weight64(x: f32, p: Mass64Params) -> f64 {
    let keep = x >= p.lo && x < p.cut;
    let a = if keep { (x as f64 - p.m) * p.s } else { 0.0 };
    let w = exp64(a);
    if keep {
        w
    } else {
        0.0
    }
}

/// Column `j` of a block's f64 weights, as the leaves of the summation tree: leaf `r` is
/// `w[r * COLS + j]`.
struct Column<'a> {
    w: &'a [f64; BLOCK],
    j: usize,
}

impl Leaves for Column<'_> {
    type T = f64;
    #[inline(always)]
    fn add(a: f64, b: f64) -> f64 {
        a + b
    }
    #[inline(always)]
    unsafe fn leaf(&mut self, r: usize) -> f64 {
        self.w[r * COLS + self.j]
    }
}

/// The values of the full block at `q` as f32, in `buf`.
///
/// # Safety
/// `q` valid for BLOCK reads; `S` usable here.
#[inline(always)]
unsafe fn load_block<S: Simd, E: Elem>(q: *const E, buf: &mut MaybeUninit<[f32; BLOCK]>) -> &[f32; BLOCK] {
    let xs = buf.as_mut_ptr() as *mut f32;
    let mut i = 0;
    while i < BLOCK {
        // SAFETY: i + LANES <= BLOCK (LANES divides BLOCK) values of `q` and `buf`; `S` usable
        // (the caller's contract).
        unsafe { S::store(xs.add(i), E::load::<S>(q.add(i))) };
        i += S::LANES;
    }
    // SAFETY: every value of `buf` was written above.
    unsafe { buf.assume_init_ref() }
}

/// Writes the f64 mass of each BLOCK of `row` into `out`: per column of 16 a pairwise tree,
/// then the 16 columns in a fixed tree (those of the f32 mass), so every level gives the same
/// sums. Blocks whose maximum is below `lo` give 0 without being read.
///
/// # Safety
/// As [`mass`](super::mass()).
#[inline(always)]
pub(crate) unsafe fn mass64<S: Simd, E: Elem>(row: *const E, n: usize, bmax: &[f32], p: Mass64Params, out: &mut [f64]) {
    for (b, o) in out.iter_mut().enumerate() {
        if !bmax.is_empty() && bmax[b] < p.lo {
            *o = 0.0;
            continue;
        }
        let start = b * BLOCK;
        // The last, partial block is padded with NaN, whose weight is 0.
        let mut buf = MaybeUninit::uninit();
        // SAFETY: the block lies in the row, or its n - start < BLOCK values do; `S` usable (the
        // caller's contract).
        let xs = unsafe {
            if start + BLOCK <= n {
                load_block::<S, E>(row.add(start), &mut buf)
            } else {
                tail_block(row.add(start), n - start, f32::NAN, &mut buf)
            }
        };
        let mut w = [0f64; BLOCK];
        for i in 0..BLOCK {
            w[i] = weight64(xs[i], p);
        }
        let mut c = [0f64; COLS];
        for (j, cj) in c.iter_mut().enumerate() {
            // SAFETY: `Column` reads in bounds (checked indexing).
            *cj = unsafe { tree16(&mut Column { w: &w, j }) };
        }
        *o = sum_columns(&c);
    }
}

/// `out[i] = exp((xs[i] - m) * s)` in f64 for values with `a >= A_MIN64` (0 below).
///
/// # Safety
/// `S` usable here (only its instruction set is used, through the compiler).
#[inline(always)]
pub(crate) unsafe fn weights64<S: Simd>(xs: &[f32], m: f64, s: f64, out: &mut [f64]) {
    for (o, &x) in out.iter_mut().zip(xs) {
        let a = (x as f64 - m) * s;
        let keep = a >= A_MIN64;
        let w = exp64(if keep { a } else { 0.0 });
        *o = if keep { w } else { 0.0 };
    }
}
