//! Probability mass in f32 (top-p, logprobs): a SIMD exp2, per-block sums of the weights
//! `w = exp((x - m) * inv_t)` in f32 (with a proven error bound) or as cheap bounds, and the
//! gathering of a row's values at or above a threshold.
//!
//! The weight of x is `2^t` with `t = fl32(fl32(x - m) * c)`, `c = fl32(inv_t * log2 e)`; the mass
//! kernels sum the tokens with `lo <= x < cut`, where `lo` is finite and high enough that
//! `t >= -125` (see `mass_lo`), so that every weight is a normal f32 (the kinds without a mask
//! clamp t at -125 instead, for rows where that is the only bound). Each [`MassKind`] is a type
//! here (module [`kind`], trait [`Weigh`]), so that each is compiled on its own: the kind is
//! matched once per call, outside the loops. The tokens at or above a cut are gathered in index
//! order (`gather_ge`, `mass_gather`), with a compress-store.
//!
//! The summation order does not depend on the SIMD level: a block is read as 16 rows of 16
//! columns and summed in the fixed trees of [`super::tree16`] and [`super::sum_columns`] (see
//! the parent module), so every level returns bit-identical block sums.

use super::{sum_columns, tail_block, tree16, Leaves, BLOCK, COLS};
use crate::kernels::simd::{Elem, Scalar, Simd};
use std::marker::PhantomData;
use std::mem::MaybeUninit;

/// 1.5 * 2^23: `t + ROUND_MAGIC` rounds `|t| < 2^22` to an integer held in the low bits.
const ROUND_MAGIC: f32 = 12_582_912.0;
/// 1.5 * 2^19: rounds `|t| < 2^18` to a multiple of 1/16.
const ROUND_MAGIC_16: f32 = 786_432.0;
/// 2^f on [-1/2, 1/2] = 1 + f (C1 + f (C2 + f (C3 + f (C4 + f C5)))), fitted for relative error.
#[allow(clippy::approx_constant)] // a fitted coefficient, not ln 2
const EXP2_C: [f32; 5] = [0.693_147, 0.240_222_42, 0.055_507_336, 0.009_671_513, 0.001_326_472_4];

/// The smallest exponent `t` the mass kernels accept (a weight of 2^-125, a normal f32).
pub(crate) const T_MIN: f32 = -125.0;

/// Row constants of the f32 mass kernels.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MassParams {
    /// The row's finite maximum.
    pub m: f32,
    /// `fl32(inv_t * log2 e)`.
    pub c: f32,
    /// Tokens with `lo <= x < cut` count; `lo` finite with `t(lo) >= T_MIN`.
    pub lo: f32,
    pub cut: f32,
}

/// Which weight the f32 mass kernels sum (chosen at run time; each is a type of [`kind`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MassKind {
    /// `exp2(t)` (relative error below 2^-22), tokens `x >= lo`.
    Exp,
    /// `exp2(t)`, tokens `lo <= x < cut` (the draw sums this mass with `mass_gather`, which
    /// also gathers the tokens at or above the cut; the tests compare the two).
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    ExpCut,
    /// A cheap weight `S` with `S / 1.0847 <= 2^t <= S / 0.97855` (Schraudolph's exponent trick
    /// at 1/16), tokens `lo <= x < cut`.
    CheapCut,
    /// `exp2(max(t, T_MIN))` of every token, NaN and -inf included (2^-125 each): fewer
    /// operations, for rows without a floor.
    ExpAll,
    /// The cheap weight of `max(t, T_MIN)` of every token.
    CheapAll,
}

// ---------------------------------------------------------------------------------------------
// The weights.
// ---------------------------------------------------------------------------------------------

/// `t = (x - m) * c` in f32, the exponent of 2 of the weight of x.
#[inline(always)]
pub(crate) fn mass_t<S: Simd>(x: S::F, m: f32, c: f32) -> S::F {
    S::mul(S::sub(x, S::splat(m)), S::splat(c))
}

/// 2^t for `T_MIN <= t <= 0` (no check): relative error below 2^-22 (1.93e-7 measured over every
/// f32 in [-1, 0], which covers every fractional part that can occur).
///
/// t = k + f with k = round(t) and f = t - k exact in [-1/2, 1/2]; 2^f from a degree-5
/// polynomial (Horner, no FMA), 2^k added to the exponent field.
#[inline(always)]
pub(crate) fn exp2_neg<S: Simd>(t: S::F) -> S::F {
    exp2_neg_n::<S, 1>([t])[0]
}

/// [`exp2_neg`] of `N` vectors, each step taken for all of them before the next: one vector's
/// chain of dependent operations is about 60 cycles long, and side by side the chains overlap
/// (the out-of-order window alone did not overlap enough of them).
#[inline(always)]
pub(crate) fn exp2_neg_n<S: Simd, const N: usize>(t: [S::F; N]) -> [S::F; N] {
    let (mut k, mut p) = (t, [S::splat(EXP2_C[4]); N]);
    for i in 0..N {
        k[i] = S::add(t[i], S::splat(ROUND_MAGIC));
    }
    let mut f = t;
    for i in 0..N {
        f[i] = S::sub(t[i], S::sub(k[i], S::splat(ROUND_MAGIC)));
    }
    for c in [EXP2_C[3], EXP2_C[2], EXP2_C[1], EXP2_C[0], 1.0] {
        for i in 0..N {
            p[i] = S::add(S::mul(p[i], f[i]), S::splat(c));
        }
    }
    // The bits of k are those of ROUND_MAGIC plus round(t); shifted by 23, only round(t) is left.
    for i in 0..N {
        p[i] = S::from_bits(S::add_u(S::to_bits(p[i]), S::shl_u::<23>(S::to_bits(k[i]))));
    }
    p
}

/// The cheap weight of `T_MIN <= t <= 0`: `2^q (1 + r/16)` where `round(16 t) = 16 q + r`.
#[inline(always)]
fn cheap_exp2<S: Simd>(t: S::F) -> S::F {
    let k = S::add(t, S::splat(ROUND_MAGIC_16));
    S::from_bits(S::add_u(S::shl_u::<19>(S::to_bits(k)), S::splat_u(0x3f80_0000)))
}

/// How a kind computes `2^t` for `T_MIN <= t <= 0`.
trait Pow2 {
    fn pow2<S: Simd>(t: S::F) -> S::F;

    /// `pow2` of `N` vectors (the same values, computed side by side where that pays).
    #[inline(always)]
    fn pow2_n<S: Simd, const N: usize>(t: [S::F; N]) -> [S::F; N] {
        let mut y = t;
        for i in 0..N {
            y[i] = Self::pow2::<S>(t[i]);
        }
        y
    }
}

/// [`exp2_neg`]: relative error below 2^-22.
struct Exact;
/// [`cheap_exp2`]: a bound within a few percent.
struct Cheap;

impl Pow2 for Exact {
    #[inline(always)]
    fn pow2<S: Simd>(t: S::F) -> S::F {
        exp2_neg::<S>(t)
    }
    #[inline(always)]
    fn pow2_n<S: Simd, const N: usize>(t: [S::F; N]) -> [S::F; N] {
        exp2_neg_n::<S, N>(t)
    }
}
impl Pow2 for Cheap {
    #[inline(always)]
    fn pow2<S: Simd>(t: S::F) -> S::F {
        cheap_exp2::<S>(t)
    }
}

/// The weights of the lanes of `x` that `keep` selects, 0 in the others (nothing is computed
/// when no lane is kept).
#[inline(always)]
fn masked<S: Simd, P: Pow2>(x: S::F, keep: S::M, mp: MassParams) -> S::F {
    masked_n::<S, P, 1>([x], [keep], mp)[0]
}

/// [`masked`] of `N` vectors side by side (nothing is computed when none of them keeps a lane).
#[inline(always)]
fn masked_n<S: Simd, P: Pow2, const N: usize>(x: [S::F; N], keep: [S::M; N], mp: MassParams) -> [S::F; N] {
    let mut any = keep[0];
    for k in &keep[1..] {
        any = S::or_m(any, *k);
    }
    if !S::any(any) {
        return [S::splat(0.0); N];
    }
    let mut t = x;
    for i in 0..N {
        t[i] = mass_t::<S>(x[i], mp.m, mp.c);
    }
    let mut w = P::pow2_n::<S, N>(t);
    for i in 0..N {
        w[i] = S::select(keep[i], w[i], S::splat(0.0));
    }
    w
}

/// The weights of every lane of `x`, t clamped to T_MIN, NaN and -inf included. `(m - x) * -c`
/// is `(x - m) * c` (the roundings are symmetric) with -0 for x = m, so that t is never above -0
/// and its bits as i32 grow with |t| (NaN of either sign included): an integer minimum clamps
/// it, off the floating-point adders.
#[inline(always)]
fn clamped<S: Simd, P: Pow2>(x: S::F, mp: MassParams) -> S::F {
    clamped_n::<S, P, 1>([x], mp)[0]
}

/// [`clamped`] of `N` vectors side by side.
#[inline(always)]
fn clamped_n<S: Simd, P: Pow2, const N: usize>(x: [S::F; N], mp: MassParams) -> [S::F; N] {
    let mut t = x;
    for i in 0..N {
        let ti = S::mul(S::sub(S::splat(mp.m), x[i]), S::splat(-mp.c));
        t[i] = S::from_bits(S::min_i32(S::to_bits(ti), S::splat_u(T_MIN.to_bits())));
    }
    P::pow2_n::<S, N>(t)
}

/// A weight kind of the f32 mass kernels, as a type (see [`kind`]).
trait Weigh {
    /// The weights of the `LANES` values `x` (0 for those the kind does not count).
    ///
    /// # Safety
    /// `S` usable here; a kind with a sink also needs room there (see [`kind::ExpCutGather`]).
    unsafe fn weigh<S: Simd>(&mut self, x: S::F, mp: MassParams) -> S::F;

    /// `weigh` of four vectors, in order (the kinds without a mask compute them side by side).
    ///
    /// # Safety
    /// As `weigh`.
    #[inline(always)]
    unsafe fn weigh4<S: Simd>(&mut self, x: [S::F; 4], mp: MassParams) -> [S::F; 4] {
        // SAFETY: the caller's contract.
        unsafe {
            [self.weigh::<S>(x[0], mp), self.weigh::<S>(x[1], mp), self.weigh::<S>(x[2], mp), self.weigh::<S>(x[3], mp)]
        }
    }
}

/// The weight kinds: one type per [`MassKind`], and the one kind that also gathers.
mod kind {
    use super::*;

    /// [`MassKind::Exp`]: `exp2(t)`, tokens `x >= lo`.
    pub(super) struct Exp;
    /// [`MassKind::ExpCut`]: `exp2(t)`, tokens `lo <= x < cut`.
    pub(super) struct ExpCut;
    /// [`MassKind::CheapCut`]: the cheap weight, tokens `lo <= x < cut`.
    pub(super) struct CheapCut;
    /// [`MassKind::ExpAll`]: `exp2(max(t, T_MIN))` of every token.
    pub(super) struct ExpAll;
    /// [`MassKind::CheapAll`]: the cheap weight of `max(t, T_MIN)` of every token.
    pub(super) struct CheapAll;

    /// [`ExpCut`] that also appends the values `>= cut`, in the order it weighs them, at
    /// `base + len` (only [`super::mass_gather`] uses it, when the visit is in index order).
    ///
    /// Its `weigh` writes `S::LANES` values at `base + len` (then advances `len` by the number
    /// `>= cut`): the caller keeps room for them.
    pub(super) struct ExpCutGather {
        pub base: *mut f32,
        pub len: usize,
    }

    /// The lanes `lo <= x` of Exp.
    #[inline(always)]
    fn at_least_lo<S: Simd>(x: S::F, mp: MassParams) -> S::M {
        S::ge(x, S::splat(mp.lo))
    }
    /// The lanes `lo <= x < cut` of the kinds with a cut.
    #[inline(always)]
    fn below_cut<S: Simd>(x: S::F, mp: MassParams) -> S::M {
        S::and_m(S::ge(x, S::splat(mp.lo)), S::lt(x, S::splat(mp.cut)))
    }
    /// The lanes `keep` selects in each of four vectors (a macro: a function pointer or a
    /// closure would not inherit the caller's target features).
    macro_rules! keep4 {
        ($keep:ident, $x:expr, $mp:expr) => {
            [$keep::<S>($x[0], $mp), $keep::<S>($x[1], $mp), $keep::<S>($x[2], $mp), $keep::<S>($x[3], $mp)]
        };
    }

    impl Weigh for Exp {
        #[inline(always)]
        unsafe fn weigh<S: Simd>(&mut self, x: S::F, mp: MassParams) -> S::F {
            masked::<S, Exact>(x, at_least_lo::<S>(x, mp), mp)
        }
        #[inline(always)]
        unsafe fn weigh4<S: Simd>(&mut self, x: [S::F; 4], mp: MassParams) -> [S::F; 4] {
            masked_n::<S, Exact, 4>(x, keep4!(at_least_lo, x, mp), mp)
        }
    }
    impl Weigh for ExpCut {
        #[inline(always)]
        unsafe fn weigh<S: Simd>(&mut self, x: S::F, mp: MassParams) -> S::F {
            masked::<S, Exact>(x, below_cut::<S>(x, mp), mp)
        }
        #[inline(always)]
        unsafe fn weigh4<S: Simd>(&mut self, x: [S::F; 4], mp: MassParams) -> [S::F; 4] {
            masked_n::<S, Exact, 4>(x, keep4!(below_cut, x, mp), mp)
        }
    }
    impl Weigh for CheapCut {
        #[inline(always)]
        unsafe fn weigh<S: Simd>(&mut self, x: S::F, mp: MassParams) -> S::F {
            masked::<S, Cheap>(x, below_cut::<S>(x, mp), mp)
        }
        #[inline(always)]
        unsafe fn weigh4<S: Simd>(&mut self, x: [S::F; 4], mp: MassParams) -> [S::F; 4] {
            masked_n::<S, Cheap, 4>(x, keep4!(below_cut, x, mp), mp)
        }
    }
    impl Weigh for ExpAll {
        #[inline(always)]
        unsafe fn weigh<S: Simd>(&mut self, x: S::F, mp: MassParams) -> S::F {
            clamped::<S, Exact>(x, mp)
        }
        #[inline(always)]
        unsafe fn weigh4<S: Simd>(&mut self, x: [S::F; 4], mp: MassParams) -> [S::F; 4] {
            clamped_n::<S, Exact, 4>(x, mp)
        }
    }
    impl Weigh for CheapAll {
        #[inline(always)]
        unsafe fn weigh<S: Simd>(&mut self, x: S::F, mp: MassParams) -> S::F {
            clamped::<S, Cheap>(x, mp)
        }
        #[inline(always)]
        unsafe fn weigh4<S: Simd>(&mut self, x: [S::F; 4], mp: MassParams) -> [S::F; 4] {
            clamped_n::<S, Cheap, 4>(x, mp)
        }
    }
    impl Weigh for ExpCutGather {
        #[inline(always)]
        unsafe fn weigh<S: Simd>(&mut self, x: S::F, mp: MassParams) -> S::F {
            // SAFETY: room for LANES values at base + len (the caller's contract); `S` usable.
            self.len += unsafe { S::compress_store(self.base.add(self.len), S::ge(x, S::splat(mp.cut)), x) };
            // SAFETY: `S` usable (the caller's contract).
            unsafe { ExpCut.weigh::<S>(x, mp) }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Per-block mass.
// ---------------------------------------------------------------------------------------------

/// The weights of the 16 rows of one group of `LANES` columns of a block, as leaves of the
/// summation tree: leaf `r` is the weight of the vector `q[r * COLS..]`.
struct BlockRows<'a, S, E, W> {
    q: *const E,
    mp: MassParams,
    w: &'a mut W,
    simd: PhantomData<S>,
}

impl<S: Simd, E: Elem, W: Weigh> Leaves for BlockRows<'_, S, E, W> {
    type T = S::F;
    #[inline(always)]
    fn add(a: S::F, b: S::F) -> S::F {
        S::add(a, b)
    }
    /// # Safety
    /// `q` valid for `r * COLS + S::LANES` reads; `S` usable here; what `W` needs.
    #[inline(always)]
    unsafe fn leaf(&mut self, r: usize) -> S::F {
        // SAFETY: the caller's contract.
        unsafe { self.w.weigh::<S>(E::load::<S>(self.q.add(r * COLS)), self.mp) }
    }
    /// # Safety
    /// `q` valid for `(r + 3) * COLS + S::LANES` reads; as `leaf`.
    #[inline(always)]
    unsafe fn leaves4(&mut self, r: usize) -> [S::F; 4] {
        // SAFETY: the caller's contract.
        unsafe {
            let q = self.q.add(r * COLS);
            let x = [
                E::load::<S>(q),
                E::load::<S>(q.add(COLS)),
                E::load::<S>(q.add(2 * COLS)),
                E::load::<S>(q.add(3 * COLS)),
            ];
            self.w.weigh4::<S>(x, self.mp)
        }
    }
}

/// The mass of the full block at `q`: each column summed over its 16 rows in f32 in the fixed
/// tree, `LANES` columns at a time, then the 16 column sums in f64.
///
/// # Safety
/// `q` valid for BLOCK reads; `S` usable here; what `W` needs.
#[inline(always)]
unsafe fn mass_block<S: Simd, E: Elem, W: Weigh>(q: *const E, mp: MassParams, w: &mut W) -> f64 {
    let mut cols = [0f32; COLS];
    let mut g = 0;
    while g < COLS {
        // SAFETY: the rows of columns g .. g + LANES lie in the block (LANES divides COLS);
        // `cols` has room for LANES values at g; `S` usable (the caller's contract).
        unsafe {
            let sums = tree16(&mut BlockRows::<S, E, W> { q: q.add(g), mp, w: &mut *w, simd: PhantomData });
            S::store(cols.as_mut_ptr().add(g), sums);
        }
        g += S::LANES;
    }
    sum_columns(&cols)
}

/// The mass of the block of `row` that starts at `start`; the last, partial block is read
/// padded with -inf, which counts as nothing (or as 2^-125 in the kinds without a mask).
///
/// # Safety
/// `row` valid for `n` reads, `start < n`; `S` usable here; what `W` needs.
#[inline(always)]
unsafe fn block_mass<S: Simd, E: Elem, W: Weigh>(
    row: *const E,
    n: usize,
    start: usize,
    mp: MassParams,
    w: &mut W,
) -> f64 {
    // SAFETY: the block lies in the row, or its n - start < BLOCK values do; `S` usable (the
    // caller's contract).
    unsafe {
        if start + BLOCK <= n {
            mass_block::<S, E, W>(row.add(start), mp, w)
        } else {
            let mut buf = MaybeUninit::uninit();
            let tail = tail_block(row.add(start), n - start, f32::NEG_INFINITY, &mut buf);
            mass_block::<S, f32, W>(tail.as_ptr(), mp, w)
        }
    }
}

/// Writes the mass (see [`MassKind`]) of each BLOCK of `row` into `out`: a sum of f32 weights,
/// the same on every SIMD level. Blocks whose maximum in `bmax` (if not empty) is below `lo`
/// give 0 without being read.
///
/// # Safety
/// `row` valid for `n` reads; `out` has `n.div_ceil(BLOCK)` elements, and `bmax` as many or none.
#[inline(always)]
pub(crate) unsafe fn mass<S: Simd, E: Elem>(
    row: *const E,
    n: usize,
    bmax: &[f32],
    mp: MassParams,
    kind: MassKind,
    out: &mut [f64],
) {
    // SAFETY: the caller's contract; the plain kinds need nothing more.
    unsafe {
        match kind {
            MassKind::Exp => mass_of::<S, E, _>(row, n, bmax, mp, kind::Exp, out),
            MassKind::ExpCut => mass_of::<S, E, _>(row, n, bmax, mp, kind::ExpCut, out),
            MassKind::CheapCut => mass_of::<S, E, _>(row, n, bmax, mp, kind::CheapCut, out),
            MassKind::ExpAll => mass_of::<S, E, _>(row, n, bmax, mp, kind::ExpAll, out),
            MassKind::CheapAll => mass_of::<S, E, _>(row, n, bmax, mp, kind::CheapAll, out),
        }
    }
}

/// [`mass`] of the kind `W`.
///
/// # Safety
/// As [`mass`]; what `W` needs.
#[inline(always)]
unsafe fn mass_of<S: Simd, E: Elem, W: Weigh>(
    row: *const E,
    n: usize,
    bmax: &[f32],
    mp: MassParams,
    mut w: W,
    out: &mut [f64],
) {
    for (b, o) in out.iter_mut().enumerate() {
        if !bmax.is_empty() && bmax[b] < mp.lo {
            *o = 0.0;
            continue;
        }
        // SAFETY: b * BLOCK < n (out has n.div_ceil(BLOCK) elements); the caller's contract.
        *o = unsafe { block_mass::<S, E, W>(row, n, b * BLOCK, mp, &mut w) };
    }
}

/// The weights of the 16 rows of one group of `LANES` columns of a block, split at the cut:
/// leaf `r` is the pair (weights of `lo <= x < cut`, weights of `x >= cut`) of the vector
/// `q[r * COLS..]`, each weight computed once ([`mass_split`]).
struct SplitRows<S, E, P> {
    q: *const E,
    mp: MassParams,
    kinds: PhantomData<(S, P)>,
}

impl<S: Simd, E: Elem, P: Pow2> SplitRows<S, E, P> {
    /// The weights of `x >= lo`, as (below the cut, at or above it).
    #[inline(always)]
    fn split(x: S::F, w: S::F, mp: MassParams) -> (S::F, S::F) {
        let above = S::ge(x, S::splat(mp.cut));
        (S::select(above, S::splat(0.0), w), S::select(above, w, S::splat(0.0)))
    }
}

impl<S: Simd, E: Elem, P: Pow2> Leaves for SplitRows<S, E, P> {
    type T = (S::F, S::F);
    #[inline(always)]
    fn add(a: Self::T, b: Self::T) -> Self::T {
        (S::add(a.0, b.0), S::add(a.1, b.1))
    }
    /// # Safety
    /// `q` valid for `r * COLS + S::LANES` reads; `S` usable here.
    #[inline(always)]
    unsafe fn leaf(&mut self, r: usize) -> Self::T {
        // SAFETY: the caller's contract.
        let x = unsafe { E::load::<S>(self.q.add(r * COLS)) };
        let w = masked::<S, P>(x, S::ge(x, S::splat(self.mp.lo)), self.mp);
        Self::split(x, w, self.mp)
    }
    /// # Safety
    /// `q` valid for `(r + 3) * COLS + S::LANES` reads; as `leaf`.
    #[inline(always)]
    unsafe fn leaves4(&mut self, r: usize) -> [Self::T; 4] {
        // SAFETY: the caller's contract.
        let x = unsafe {
            let q = self.q.add(r * COLS);
            [E::load::<S>(q), E::load::<S>(q.add(COLS)), E::load::<S>(q.add(2 * COLS)), E::load::<S>(q.add(3 * COLS))]
        };
        let vlo = S::splat(self.mp.lo);
        let keep = [S::ge(x[0], vlo), S::ge(x[1], vlo), S::ge(x[2], vlo), S::ge(x[3], vlo)];
        let w = masked_n::<S, P, 4>(x, keep, self.mp);
        [
            Self::split(x[0], w[0], self.mp),
            Self::split(x[1], w[1], self.mp),
            Self::split(x[2], w[2], self.mp),
            Self::split(x[3], w[3], self.mp),
        ]
    }
}

/// The two masses of the full block at `q` split at the cut, summed as [`mass_block`] sums one.
///
/// # Safety
/// `q` valid for BLOCK reads; `S` usable here.
#[inline(always)]
unsafe fn split_block<S: Simd, E: Elem, P: Pow2>(q: *const E, mp: MassParams) -> (f64, f64) {
    let (mut below, mut above) = ([0f32; COLS], [0f32; COLS]);
    let mut g = 0;
    while g < COLS {
        // SAFETY: as in `mass_block`.
        unsafe {
            let (b, a) = tree16(&mut SplitRows::<S, E, P> { q: q.add(g), mp, kinds: PhantomData });
            S::store(below.as_mut_ptr().add(g), b);
            S::store(above.as_mut_ptr().add(g), a);
        }
        g += S::LANES;
    }
    (sum_columns(&below), sum_columns(&above))
}

/// Writes per block of `row` the mass of the tokens `lo <= x < cut` into `below` and of the
/// tokens `x >= cut` (`cut > lo`) into `above`, in one pass: the f32 exps of [`MassKind::Exp`]
/// (`cheap`: the cheap weights of [`MassKind::CheapCut`]). Each weight is computed once and
/// summed into one of the two trees, so `below` is bit-identical to the mass of kind `ExpCut`
/// (`CheapCut`) with this `lo` and `cut`, and `above` to that of kind `Exp` (`CheapCut`) with
/// `lo` raised to `cut` (the other tree's lanes add zeros). Blocks whose maximum in `bmax` (if
/// not empty) is below `lo` give 0 in both without being read; those below `cut`, 0 above and
/// their mass below from one tree.
///
/// # Safety
/// `row` valid for `n` reads; `below` and `above` have `n.div_ceil(BLOCK)` elements, and `bmax`
/// as many or none; `S` usable here.
#[inline(always)]
pub(crate) unsafe fn mass_split<S: Simd, E: Elem>(
    row: *const E,
    n: usize,
    bmax: &[f32],
    mp: MassParams,
    cheap: bool,
    below: &mut [f64],
    above: &mut [f64],
) {
    // SAFETY: the caller's contract.
    unsafe {
        if cheap {
            split_of::<S, E, Cheap, _>(row, n, bmax, mp, kind::CheapCut, (below, above))
        } else {
            split_of::<S, E, Exact, _>(row, n, bmax, mp, kind::ExpCut, (below, above))
        }
    }
}

/// [`mass_split`] with the weights of `P`; `W`, the kind of `P` with a cut, weighs the blocks
/// that hold nothing at or above it.
///
/// # Safety
/// As [`mass_split`].
#[inline(always)]
unsafe fn split_of<S: Simd, E: Elem, P: Pow2, W: Weigh>(
    row: *const E,
    n: usize,
    bmax: &[f32],
    mp: MassParams,
    mut w: W,
    (below, above): (&mut [f64], &mut [f64]),
) {
    for (b, (lo, hi)) in below.iter_mut().zip(above.iter_mut()).enumerate() {
        let bm = if bmax.is_empty() { f32::INFINITY } else { bmax[b] };
        (*lo, *hi) = (0.0, 0.0);
        if bm < mp.lo {
            continue;
        }
        let start = b * BLOCK;
        if bm < mp.cut {
            // SAFETY: start < n (one slot per block); the caller's contract.
            *lo = unsafe { block_mass::<S, E, W>(row, n, start, mp, &mut w) };
            continue;
        }
        // SAFETY: as in `block_mass`: the block lies in the row, or its last n - start values
        // do, read padded with -inf (below lo: weight 0 in both trees).
        (*lo, *hi) = unsafe {
            if start + BLOCK <= n {
                split_block::<S, E, P>(row.add(start), mp)
            } else {
                let mut buf = MaybeUninit::uninit();
                let tail = tail_block(row.add(start), n - start, f32::NEG_INFINITY, &mut buf);
                split_block::<S, f32, P>(tail.as_ptr(), mp)
            }
        };
    }
}

/// Appends to `out`, in row order, the values `>= lo` of `row[start..end]` (`vlo` is `lo` in
/// every lane, splat once by the caller).
///
/// # Safety
/// `row` valid for `end` reads, `end - start <= BLOCK`; `S` usable here.
#[inline(always)]
unsafe fn gather_block<S: Simd, E: Elem>(
    row: *const E,
    (start, end): (usize, usize),
    (lo, vlo): (f32, S::F),
    out: &mut Vec<f32>,
) {
    let l = S::LANES;
    // Room for the block and one vector written past its last value.
    out.reserve(BLOCK + 64);
    let base = out.as_mut_ptr();
    let mut len = out.len();
    let mut i = start;
    while i + l <= end {
        // SAFETY: i + LANES <= end; at most i - start values were appended before, so the LANES
        // written at base + len stay below len0 + BLOCK + LANES, within the room reserved
        // (LANES <= 64); `S` usable (the caller's contract).
        unsafe {
            let x = E::load::<S>(row.add(i));
            len += S::compress_store(base.add(len), S::ge(x, vlo), x);
        }
        i += l;
    }
    while i < end {
        // SAFETY: as above, one value; Scalar runs anywhere.
        unsafe {
            let x = E::load::<Scalar>(row.add(i));
            len += Scalar::compress_store(base.add(len), x >= lo, x);
        }
        i += 1;
    }
    // SAFETY: the `len - out.len()` values after the old end were written above.
    unsafe { out.set_len(len) };
}

/// [`mass`] of kind `ExpCut`, and also appends to `cands`, in row order, every value `x >= cut`
/// (`cut` finite) of the blocks whose maximum in `bmax` reaches `cut`: one pass for the mass below
/// a cut and the tokens above it.
///
/// Where the level says so ([`Simd::GATHER_IN_MASS_PASS`]: 16 lanes, a vector per row of a
/// block, so that the mass pass visits the values in index order), a full block is gathered
/// during its mass pass; otherwise its values are gathered first, in a pass of their own.
///
/// # Safety
/// As [`mass`], with `bmax` not empty.
#[inline(always)]
pub(crate) unsafe fn mass_gather<S: Simd, E: Elem>(
    row: *const E,
    n: usize,
    bmax: &[f32],
    mp: MassParams,
    out: &mut [f64],
    cands: &mut Vec<f32>,
) {
    const { assert!(!S::GATHER_IN_MASS_PASS || S::LANES == COLS) };
    let vcut = S::splat(mp.cut);
    for (b, o) in out.iter_mut().enumerate() {
        let bm = bmax[b];
        if bm < mp.lo {
            *o = 0.0;
            continue;
        }
        let start = b * BLOCK;
        let end = (start + BLOCK).min(n);
        if bm >= mp.cut && S::GATHER_IN_MASS_PASS && end - start == BLOCK {
            cands.reserve(BLOCK + 64);
            let mut sink = kind::ExpCutGather { base: cands.as_mut_ptr(), len: cands.len() };
            // SAFETY: the block lies in the row; the 16 vectors of 16 lanes write at most
            // BLOCK + 16 values from the old end, within the room reserved; `S` usable (the
            // caller's contract). Then the `sink.len - cands.len()` values were written.
            unsafe {
                *o = mass_block::<S, E, _>(row.add(start), mp, &mut sink);
                cands.set_len(sink.len);
            }
            continue;
        }
        if bm >= mp.cut {
            // SAFETY: end <= n, end - start <= BLOCK; `S` usable (the caller's contract).
            unsafe { gather_block::<S, E>(row, (start, end), (mp.cut, vcut), cands) };
        }
        // SAFETY: start < n; the caller's contract.
        *o = unsafe { block_mass::<S, E, _>(row, n, start, mp, &mut kind::ExpCut) };
    }
}

/// Writes the f32 weight `exp2(t)` of each of the `n` values at `row` into `out` (0 outside
/// `lo <= x < cut`).
///
/// # Safety
/// `row` valid for `n` reads, `out` for `n` writes; `S` usable here.
#[inline(always)]
pub(crate) unsafe fn mass_weights<S: Simd, E: Elem>(row: *const E, n: usize, mp: MassParams, out: *mut f32) {
    let mut i = 0;
    while i + S::LANES <= n {
        // SAFETY: i + LANES <= n values of `row` and `out`; `S` usable (the caller's contract).
        unsafe { S::store(out.add(i), kind::ExpCut.weigh::<S>(E::load::<S>(row.add(i)), mp)) };
        i += S::LANES;
    }
    while i < n {
        // SAFETY: i < n; Scalar runs anywhere.
        unsafe { Scalar::store(out.add(i), kind::ExpCut.weigh::<Scalar>(E::load::<Scalar>(row.add(i)), mp)) };
        i += 1;
    }
}

/// The count of the values `x >= lo` (`lo` finite) of a row: those of the blocks whose maximum
/// in `bmax` reaches `lo` (the other blocks hold none). A rank is such a count: counting, not
/// gathering, writes nothing per value and needs no room for the row.
///
/// # Safety
/// `row` valid for `n` reads; `bmax` has `n.div_ceil(BLOCK)` elements; `S` usable here.
#[inline(always)]
pub(crate) unsafe fn count_ge<S: Simd, E: Elem>(row: *const E, n: usize, bmax: &[f32], lo: f32) -> usize {
    let (l, vlo, one) = (S::LANES, S::splat(lo), S::splat_u(1));
    let mut count = 0usize;
    for (b, &bm) in bmax.iter().enumerate() {
        if bm < lo {
            continue;
        }
        let (mut i, end) = (b * BLOCK, ((b + 1) * BLOCK).min(n));
        // Per-lane counts (at most BLOCK / LANES each), added up once a block: a mask's bits
        // counted per vector cost a dozen scalar operations where no popcnt is enabled.
        let mut lanes = S::splat_u(0);
        while i + l <= end {
            // SAFETY: i + LANES <= end <= n; `S` usable (the caller's contract).
            let x = unsafe { E::load::<S>(row.add(i)) };
            lanes = S::add_u(lanes, S::select_u(S::ge(x, vlo), one, S::splat_u(0)));
            i += l;
        }
        let mut per_lane = [0u32; 64];
        // SAFETY: LANES <= 64 slots.
        unsafe { S::store_u(per_lane.as_mut_ptr(), lanes) };
        count += per_lane[..l].iter().map(|&c| c as usize).sum::<usize>();
        while i < end {
            // SAFETY: i < n; Scalar runs anywhere.
            count += (unsafe { E::load::<Scalar>(row.add(i)) } >= lo) as usize;
            i += 1;
        }
    }
    count
}

/// The kept set's scan: the least and the count of the values `x >= lo` (`lo` finite) of a row,
/// and their bits, 32 values a word (value `i` at bit `i % 32` of word `i / 32`), written to
/// `bits` (empty: not asked for; else `n.div_ceil(32)` words) in the blocks whose maximum in
/// `bmax` reaches `lo` (the others keep nothing and their words are left as they are). The least
/// is found in the total order of the values' bits (`-0.0 < +0.0`), so that every level and
/// lane count returns the same zero; `+inf` when nothing is kept.
///
/// # Safety
/// `row` valid for `n` reads; `bmax` has `n.div_ceil(BLOCK)` elements; `S` usable here.
#[inline(always)]
pub(crate) unsafe fn kept_scan<S: Simd, E: Elem>(
    row: *const E,
    n: usize,
    bmax: &[f32],
    lo: f32,
    bits: &mut [i32],
) -> (f32, i32) {
    const _: () = assert!(BLOCK.is_multiple_of(32), "each bitmask word lies in one block");
    let (l, vlo) = (S::LANES, S::splat(lo));
    let none = S::splat_u(ordered_key(f32::INFINITY));
    let (mut count, mut least) = (0i32, ordered_key(f32::INFINITY) as i32);
    for (b, &bm) in bmax.iter().enumerate() {
        if bm < lo {
            continue;
        }
        let (start, end) = (b * BLOCK, ((b + 1) * BLOCK).min(n));
        let mut keys = none;
        for w in start / 32..end.div_ceil(32) {
            let (first, last) = (w * 32, (w * 32 + 32).min(end));
            let mut word = 0u32;
            let mut i = first;
            // Whole vectors: compare, the mask's bits into the word, the kept values' keys into
            // the per-lane minimum (32 is a multiple of LANES, so a whole word has no tail).
            while i + l <= last {
                // SAFETY: i + LANES <= last <= n; `S` usable (the caller's contract).
                let x = unsafe { E::load::<S>(row.add(i)) };
                let kept = S::ge(x, vlo);
                word |= S::bits_of(kept) << (i - first);
                keys = S::min_i32(keys, S::select_u(kept, ordered_keys::<S>(x), none));
                i += l;
            }
            while i < last {
                // SAFETY: i < n; Scalar runs anywhere.
                let x = unsafe { E::load::<Scalar>(row.add(i)) };
                if x >= lo {
                    word |= 1 << (i - first);
                    least = least.min(ordered_key(x) as i32);
                }
                i += 1;
            }
            count += word.count_ones() as i32;
            if let Some(d) = bits.get_mut(w) {
                *d = word as i32;
            }
        }
        let mut lanes = [0u32; 64];
        // SAFETY: LANES <= 64 slots.
        unsafe { S::store_u(lanes.as_mut_ptr(), keys) };
        least = lanes[..l].iter().fold(least, |a, &k| a.min(k as i32));
    }
    (f32::from_bits(ordered_key(f32::from_bits(least as u32))), count)
}

/// The bits of `x` as an i32 that orders as the values do (`-0.0` just below `+0.0`): the
/// negative values' bits but the sign flipped. Its own inverse (as bits).
#[inline(always)]
fn ordered_key(x: f32) -> u32 {
    let b = x.to_bits();
    b ^ (((b as i32) >> 31) as u32 >> 1)
}

/// [`ordered_key`] of each lane.
#[inline(always)]
fn ordered_keys<S: Simd>(x: S::F) -> S::U {
    let b = S::to_bits(x);
    S::xor_u(b, S::shr_u::<1>(S::sign_fill(b)))
}

/// Appends to `out`, in row order, every value `x >= lo` (`lo` finite) of the blocks whose
/// maximum in `bmax` reaches `lo`.
///
/// # Safety
/// `row` valid for `n` reads; `bmax` has `n.div_ceil(BLOCK)` elements; `S` usable here.
#[inline(always)]
pub(crate) unsafe fn gather_ge<S: Simd, E: Elem>(row: *const E, n: usize, bmax: &[f32], lo: f32, out: &mut Vec<f32>) {
    let vlo = S::splat(lo);
    for (b, &bm) in bmax.iter().enumerate() {
        if bm < lo {
            continue;
        }
        // SAFETY: the block lies in the row; `S` usable (the caller's contract).
        unsafe { gather_block::<S, E>(row, (b * BLOCK, ((b + 1) * BLOCK).min(n)), (lo, vlo), out) };
    }
}

#[cfg(test)]
mod tests {
    use super::BLOCK;
    use crate::kernels::test_support::each_level;
    use crate::kernels::{kernels, xorshift64};

    /// The definition, one value at a time: the least kept value (`-0.0` below `+0.0`; `+inf`
    /// when none), the count, and the words of the values `>= lo` in the blocks whose maximum
    /// reaches `lo` (the other words keep what they held).
    fn defined(row: &[f32], lo: f32, words: &mut [i32]) -> (f32, i32) {
        let key =
            |x: f32| if x.is_sign_negative() { -(x.to_bits() as i64 & 0x7fff_ffff) - 1 } else { x.to_bits() as i64 };
        let (mut least, mut count) = (f32::INFINITY, 0);
        for (b, block) in row.chunks(BLOCK).enumerate() {
            if !block.iter().any(|&x| x >= lo) {
                continue;
            }
            for (j, chunk) in block.chunks(32).enumerate() {
                let mut word = 0u32;
                for (i, &x) in chunk.iter().enumerate().filter(|&(_, &x)| x >= lo) {
                    word |= 1 << i;
                    count += 1;
                    least = if key(x) < key(least) { x } else { least };
                }
                if let Some(d) = words.get_mut(b * BLOCK / 32 + j) {
                    *d = word as i32;
                }
            }
        }
        (least, count)
    }

    /// Block maxima as the first pass finds them (NaN ignored).
    fn maxima(row: &[f32]) -> Vec<f32> {
        row.chunks(BLOCK).map(|b| b.iter().fold(f32::NEG_INFINITY, |a, &x| if x > a { x } else { a })).collect()
    }

    #[test]
    fn every_level_scans_the_kept_set_as_defined() {
        let mut state = 0x5851_f42d_4c95_7f2du64;
        for n in [0usize, 1, 31, 33, 255, 257, 300, 4097, 32000, 151_936] {
            for case in 0..6 {
                // Few distinct values around lo, zeros of both signs, NaN, infinities, and rows
                // whose blocks mostly stay below lo.
                let row: Vec<f32> = (0..n)
                    .map(|_| match (xorshift64(&mut state) % 32, case) {
                        (0, 1) => f32::NAN,
                        (1, 1) => f32::NEG_INFINITY,
                        (2 | 3, 2) => -0.0,
                        (4 | 5, 2) => 0.0,
                        (6, 3) => f32::INFINITY,
                        (r, 4) if r > 0 => -5.0,
                        (r, _) => (r as f32 - 16.0) / 4.0,
                    })
                    .collect();
                let bmax = maxima(&row);
                for lo in [-0.0f32, 0.0, -1.0, 1.25, -4.0, f32::MIN, 100.0] {
                    let words = n.div_ceil(32);
                    let mut want_bits = vec![7i32; words];
                    let want = defined(&row, lo, &mut want_bits);
                    let bf16: Vec<_> = row.iter().map(|&x| crate::kernels::Bf16((x.to_bits() >> 16) as u16)).collect();
                    each_level(|level| {
                        let k = kernels(level);
                        for with_bits in [true, false] {
                            let mut bits = if with_bits { vec![7i32; words] } else { Vec::new() };
                            // SAFETY: the row holds n values, the maxima one per block, the
                            // words one per 32 values or none; the level is supported.
                            let got = unsafe { (k.f32.kept_scan)(row.as_ptr(), n, &bmax, lo, &mut bits) };
                            assert_eq!(
                                (got.0.to_bits(), got.1),
                                (want.0.to_bits(), want.1),
                                "n {n} case {case} lo {lo}"
                            );
                            if with_bits {
                                assert_eq!(bits, want_bits, "n {n} case {case} lo {lo}");
                            }
                        }
                        if case != 1 {
                            // bf16 of values exact in bf16 (NaN rows aside: truncation may make a
                            // quiet NaN's payload odd, which is no matter here).
                            let mut bits = vec![7i32; words];
                            // SAFETY: as above.
                            let got = unsafe { (k.bf16.kept_scan)(bf16.as_ptr(), n, &bmax, lo, &mut bits) };
                            assert_eq!((got.0.to_bits(), got.1, &bits), (want.0.to_bits(), want.1, &want_bits));
                        }
                    });
                }
            }
        }
    }
}
