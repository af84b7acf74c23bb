//! Probability mass of a row, fast and with proven bounds: the normaliser of the logprobs and
//! the mass behind the top-p threshold (`filter/top_p.rs`).
//!
//! The weight of a token is `w = exp(a)`, `a = (x - m) * inv_t` (exact in f64: [`weight64`]).
//! Three SIMD kernels sum weights over the tokens `lo <= x < cut` of a row, per block of 256, in
//! an order that does not depend on the SIMD level (`kernels/generic/`):
//!
//! - **cheap**: a weight within [-2.2%, +8.5%] of w from the exponent bits alone (a few
//!   operations per token);
//! - **exp**: an f32 `exp2` (relative error below 2^-22) of the f32 exponent `t = (x - m) * c`,
//!   whose three roundings move w by at most `|a| * 3 * 2^-24`, summed in f32 trees of depth 4;
//! - **exact**: an f64 exp (relative error below 1e-15) of the exact `a`, summed in f64.
//!
//! The first two come with rigorous bounds on the true mass ([`cheap_bounds`], [`exp_bounds`]).

use crate::error::Result;
use crate::kernels::generic::{exp64, A_MIN64, T_MIN};
use crate::kernels::{DtypeKernels, Kernels, Mass64Params, MassKind, MassParams, BLOCK};
use crate::order::bisect;
use crate::row::RowValues;

const U: f64 = 5.960_464_477_539_063e-8; // 2^-24
/// Bound of `|ln(w_f32 / exp2(t))|` per unit of `|a|` from the roundings of `t`: three f32
/// roundings (x - m, c, the product) and the f64 one of `c`.
const BETA: f64 = 3.000_001 * U;
/// Relative error bound of the kernels' `exp2` (1.93e-7 measured).
const EPS_EXP2: f64 = 2.384_185_791_015_625e-7; // 2^-22
/// Relative error bound of a kernel's block sums of non-negative weights: four f32 levels and
/// four f64 levels.
const SIGMA: f64 = 4.01 * U;
/// Bound of the weight of a token below `lo` (t < -125).
pub(crate) const TINY: f64 = 2.350_988_701_644_575e-38; // 2^-125
/// The cheap weight S of a token with true weight w: `S / CHEAP_HI <= w <= S / CHEAP_LO`.
const CHEAP_LO: f64 = 0.9785;
const CHEAP_HI: f64 = 1.0848;

/// A sum in a fixed order that the compiler can vectorise: eight interleaved partial sums.
pub(crate) fn sum(xs: &[f64]) -> f64 {
    let mut acc = [0f64; 8];
    let mut chunks = xs.chunks_exact(8);
    for c in &mut chunks {
        for j in 0..8 {
            acc[j] += c[j];
        }
    }
    for (j, &x) in chunks.remainder().iter().enumerate() {
        acc[j] += x;
    }
    ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
}

/// `c = fl32(inv_t * log2 e)`, or `None` if it overflows.
pub(crate) fn exp2_scale(inv_t: f32) -> Option<f32> {
    let c = (inv_t as f64 * std::f64::consts::LOG2_E) as f32;
    (c.is_finite() && c > 0.0).then_some(c)
}

/// The smallest finite f32 `v >= floor` whose f32 exponent `(v - m) * c` is at least `T_MIN`
/// (the kernels' `lo`); `floor <= m`.
pub(crate) fn mass_lo(m: f32, c: f32, floor: f32) -> f32 {
    let t = |v: f32| (v - m) * c;
    first_passing(floor, m, |v| t(v) >= T_MIN)
}

/// The smallest finite f32 `v >= floor` with `(v - m) * inv_t >= A_MIN64` in f64.
pub(crate) fn mass_lo64(m: f32, inv_t: f32, floor: f32) -> f32 {
    first_passing(floor, m, |v| (v as f64 - m as f64) * inv_t as f64 >= A_MIN64)
}

/// The smallest finite `v` in `[floor, m]` passing a monotone test that `m` passes.
pub(crate) fn first_passing(floor: f32, m: f32, pass: impl Fn(f32) -> bool) -> f32 {
    let start = if floor > -f32::MAX { floor } else { -f32::MAX };
    if pass(start) {
        return start;
    }
    bisect(start, m, pass)
}

/// The exact weight `exp((x - m) * inv_t)` of one value, in f64: the one f64 weight of the crate
/// (the filters' thresholds and the exact mass tier use it; the `weights64` kernel computes the
/// same value per element). 0 when the exponent is below `A_MIN64` (a weight under e^-700).
pub(crate) fn weight64(x: f32, m: f32, inv_t: f32) -> f64 {
    let a = (x as f64 - m as f64) * inv_t as f64;
    if a >= A_MIN64 {
        exp64(a)
    } else {
        0.0
    }
}

/// Bounds of the true mass of at most `count` tokens (all with `x >= floor`, below `cut`) whose
/// exp-kernel mass is `s` (the kinds without a mask add at most 2^-125 per token read). Tokens with `|a| <= A` are off by at most `e^(BETA A)` and the
/// exp2 error; the rest weigh at most `e^-A` each; A is chosen to give the tightest bounds.
pub(crate) fn exp_bounds(s: f64, count: usize) -> (f64, f64) {
    /// For each cap A: (e^(BETA A), e^(-BETA A), e^-A, e^(-A (1 - BETA))).
    static CAPS: std::sync::OnceLock<Vec<[f64; 4]>> = std::sync::OnceLock::new();
    let caps = CAPS.get_or_init(|| {
        [0.5, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0, 16.0, 20.0, 24.0, 32.0, 48.0, 64.0, 87.0]
            .iter()
            .map(|&a: &f64| [(BETA * a).exp(), (-BETA * a).exp(), (-a).exp(), (-a * (1.0 - BETA)).exp()])
            .collect()
    });
    let n = count as f64;
    let mut best = (0.0, f64::INFINITY);
    for &[up, down, tail_hi, tail_lo] in caps {
        let hi = s * (1.0 + SIGMA) * up / (1.0 - EPS_EXP2) + n * tail_hi + n * TINY;
        let tail = n * tail_lo * (1.0 + EPS_EXP2);
        let lo = (s * (1.0 - SIGMA) - tail - n * TINY).max(0.0) * down / (1.0 + EPS_EXP2);
        if hi - lo < best.1 - best.0 {
            best = (lo, hi);
        }
    }
    (best.0 * (1.0 - 1e-12), best.1 * (1.0 + 1e-12))
}

/// Bounds of the true mass of at most `count` tokens whose cheap-kernel mass is `s`.
pub(crate) fn cheap_bounds(s: f64, count: usize) -> (f64, f64) {
    let n = count as f64;
    let lo = (s * (1.0 - SIGMA) - n * TINY).max(0.0) / CHEAP_HI;
    (lo * (1.0 - 1e-12), (s * (1.0 + SIGMA) / CHEAP_LO + n * TINY) * (1.0 + 1e-12))
}

/// Blocks that [`RowMass::split_refined`] weighs again by f32 exps.
const REFINED: usize = 16;

/// The indices of the (at most) `R` largest of `masses` that are above 0, largest first (ties
/// to the lower index), and how many there are.
fn heaviest<const R: usize>(masses: &[f64]) -> ([usize; R], usize) {
    let mut top: [(f64, usize); R] = [(0.0, usize::MAX); R];
    for (b, &s) in masses.iter().enumerate() {
        if s > top[R - 1].0 {
            let mut j = R - 1;
            while j > 0 && top[j - 1].0 < s {
                top[j] = top[j - 1];
                j -= 1;
            }
            top[j] = (s, b);
        }
    }
    (top.map(|t| t.1), top.iter().filter(|t| t.1 != usize::MAX).count())
}

/// One row and its kernels, with the constants of its mass.
pub(crate) struct RowMass<'a, V: RowValues + ?Sized> {
    pub k: &'a Kernels,
    pub dk: &'a DtypeKernels<V::E>,
    pub v: &'a V,
    pub n: usize,
    pub m: f32,
    pub inv_t: f32,
    /// The filters' floor before this one (-inf: none).
    pub floor: f32,
    /// f32 mass constants (`cut` is set per call).
    pub mp: MassParams,
    pub lo64: f32,
    /// The floor keeps every token with `t >= T_MIN`.
    unmasked: bool,
}

impl<'a, V: RowValues + ?Sized> RowMass<'a, V> {
    /// `None` when `inv_t * log2 e` overflows f32 (then only the f64 paths apply).
    pub(crate) fn new(k: &'a Kernels, v: &'a V, m: f32, inv_t: f32, floor: f32) -> Option<Self> {
        let c = exp2_scale(inv_t)?;
        let lo = mass_lo(m, c, floor);
        let mp = MassParams { m, c, lo, cut: f32::INFINITY };
        let lo64 = mass_lo64(m, inv_t, floor);
        let unmasked = floor == f32::NEG_INFINITY || floor <= mass_lo(m, c, f32::NEG_INFINITY);
        Some(RowMass { k, dk: V::kernels(k), v, n: v.n(), m, inv_t, floor, mp, lo64, unmasked })
    }

    /// Per-block f32 masses of the tokens `x < cut` into `out` (blocks whose maximum in `bmax`
    /// is below `lo` are skipped); their sum. Fails only if `out` cannot grow to a slot per
    /// block (with that room already, it allocates nothing).
    pub(crate) fn blocks(&self, bmax: &[f32], kind: MassKind, cut: f32, out: &mut Vec<f64>) -> Result<f64> {
        out.clear();
        crate::alloc::resize(out, self.n.div_ceil(BLOCK), 0.0, "the row's block masses")?;
        let mp = MassParams { cut, ..self.mp };
        // SAFETY: the row has n values; out has one slot per block, bmax as many or none.
        unsafe { (self.dk.mass)(self.v.ptr(), self.n, bmax, mp, kind, out) };
        Ok(sum(out))
    }

    /// The f32 masses of the kept tokens below `cut` and at or above it (`cut` above `lo`), in
    /// one pass (the weights of [`MassKind::CheapCut`] when `cheap`, else of [`MassKind::Exp`]):
    /// each is the sum [`RowMass::blocks`] gives for its tokens, and their f64 sum is a mass of
    /// every kept token whose bounds are those of one pass (its one more f64 rounding is far
    /// inside `SIGMA`'s f64 levels). `below` and `above`: scratch for the per-block masses, as
    /// in `blocks`.
    pub(crate) fn split(
        &self,
        bmax: &[f32],
        cheap: bool,
        cut: f32,
        (below, above): (&mut Vec<f64>, &mut Vec<f64>),
    ) -> Result<(f64, f64)> {
        let nb = self.n.div_ceil(BLOCK);
        for out in [&mut *below, &mut *above] {
            out.clear();
            crate::alloc::resize(out, nb, 0.0, "the row's block masses")?;
        }
        let mp = MassParams { cut, ..self.mp };
        // SAFETY: the row has n values; below and above one slot per block, bmax as many or none.
        unsafe { (self.dk.mass_split)(self.v.ptr(), self.n, bmax, mp, cheap, below, above) };
        Ok((sum(below), sum(above)))
    }

    /// Bounds of the masses at or above `cut` and of every kept token (Z) from their per-block
    /// cheap masses (`above`; `z`, as [`RowMass::split`] gives them, below and above added),
    /// with the [`REFINED`] blocks of the largest cheap Z weighed again by the split kernel's f32
    /// exps: each group's bounds hold its tokens' true mass, so their sums bound the whole.
    /// Where the mass sits in a few blocks (the peaks of a row) this is nearly as tight as an
    /// f32-exp pass, for the cost of those blocks. `None` when those blocks hold less than a
    /// quarter of the cheap Z: the bounds would be little tighter than the cheap ones (a flat row).
    pub(crate) fn split_refined(&self, cut: f32, z: &[f64], above: &[f64]) -> Option<((f64, f64), (f64, f64))> {
        let (mut ids, n) = heaviest::<REFINED>(z);
        ids[..n].sort_unstable();
        let ids = &ids[..n];
        let (mut rest_above, mut rest_z, mut next) = (0.0, 0.0, 0);
        for (b, (&zb, &ab)) in z.iter().zip(above).enumerate() {
            if next < ids.len() && ids[next] == b {
                next += 1;
            } else {
                rest_above += ab;
                rest_z += zb;
            }
        }
        let heavy: f64 = ids.iter().map(|&b| z[b]).sum();
        if heavy < (heavy + rest_z) / 4.0 {
            return None;
        }
        let (mut exp_above, mut exp_z) = (0.0, 0.0);
        let mp = MassParams { cut, ..self.mp };
        for &b in ids {
            let start = b * BLOCK;
            let len = BLOCK.min(self.n - start);
            let (mut lo, mut hi) = ([0.0], [0.0]);
            // SAFETY: the block lies inside the row; one slot each, no block maxima.
            unsafe { (self.dk.mass_split)(self.v.ptr().add(start), len, &[], mp, false, &mut lo, &mut hi) };
            exp_above += hi[0];
            exp_z += lo[0] + hi[0];
        }
        let tokens = ids.len() * BLOCK;
        let add = |(a, b): (f64, f64), (c, d): (f64, f64)| ((a + c) * (1.0 - 1e-12), (b + d) * (1.0 + 1e-12));
        // Every token's TINY is in the rest's cheap bounds (count: the whole row).
        let above = add(cheap_bounds(rest_above, self.count()), exp_bounds(exp_above, tokens));
        let z = add(cheap_bounds(rest_z, self.count()), exp_bounds(exp_z, tokens));
        Some((above, z))
    }

    /// Exact (f64) mass of the tokens `floor <= x < cut`, block by block as in `blocks`.
    pub(crate) fn exact(&self, bmax: &[f32], cut: f32) -> Result<f64> {
        let mut out = crate::alloc::filled(self.n.div_ceil(BLOCK), 0.0, "the row's exact block masses")?;
        let p = Mass64Params { m: self.m as f64, s: self.inv_t as f64, lo: self.lo64, cut };
        // SAFETY: as in `blocks`.
        unsafe { (self.dk.mass64)(self.v.ptr(), self.n, bmax, p, &mut out) };
        Ok(sum(&out))
    }

    /// Whether the kept tokens are exactly those with `t >= T_MIN` (no floor above it), so that
    /// the kernels without a mask apply.
    pub(crate) fn unmasked(&self) -> bool {
        self.unmasked
    }

    /// Tokens the bounds must allow for: the row, and the padding of its last block.
    pub(crate) fn count(&self) -> usize {
        self.n + BLOCK
    }

    /// The f32-exp mass of the kept tokens of block `b` (bounds: `exp_bounds` of `BLOCK` tokens).
    pub(crate) fn exp_block(&self, b: usize) -> f64 {
        let start = b * BLOCK;
        let len = BLOCK.min(self.n - start);
        let mut out = [0.0];
        let kind = if self.unmasked() { MassKind::ExpAll } else { MassKind::Exp };
        // SAFETY: the block lies inside the row.
        unsafe { (self.dk.mass)(self.v.ptr().add(start), len, &[], self.mp, kind, &mut out) };
        out[0]
    }

    /// The f32-exp mass of every kept token, with its error bounds: the logprob normaliser.
    /// The blocks whose maximum in `bmax` (the row's block maxima, or empty) is below `lo` are
    /// skipped: each of their tokens weighs less than 2^-125, which the bounds allow for.
    /// `out`: scratch for the per-block masses (see [`RowMass::blocks`]).
    pub(crate) fn z_exp(&self, bmax: &[f32], out: &mut Vec<f64>) -> Result<(f64, (f64, f64))> {
        let kind = if self.unmasked() { MassKind::ExpAll } else { MassKind::Exp };
        let s = self.blocks(bmax, kind, f32::INFINITY, out)?;
        Ok((s, exp_bounds(s, self.count())))
    }

    /// The cheap mass of every kept token (a few operations per token), with its error bounds
    /// (within about -2% / +9%) and the per-block masses, which [`RowMass::z_refined`]
    /// tightens; blocks skipped as in [`RowMass::z_exp`].
    pub(crate) fn z_cheap(&self, bmax: &[f32]) -> Result<(f64, (f64, f64), Vec<f64>)> {
        let mut out = Vec::new();
        let kind = if self.unmasked() { MassKind::CheapAll } else { MassKind::CheapCut };
        let s = self.blocks(bmax, kind, f32::INFINITY, &mut out)?;
        Ok((s, cheap_bounds(s, self.count()), out))
    }

    /// Bounds of Z from the per-block cheap masses `cheap` (of [`RowMass::z_cheap`]) with the
    /// [`REFINED`] heaviest blocks weighed again by the f32-exp kernel: the mass of a block is bounded
    /// by its own kernel's bounds, so the sums of the bounds bound Z. Where the mass sits in a
    /// few blocks (a peaked row: a handful of tokens hold nearly all of it) this is nearly as
    /// tight as the exp pass, for the cost of those blocks; on a flat row, as the cheap bounds.
    pub(crate) fn z_refined(&self, cheap: &[f64]) -> (f64, f64) {
        // The heaviest blocks, heaviest first; the rest summed in block order (a block of mass 0
        // adds nothing to it).
        let (top, n) = heaviest::<REFINED>(cheap);
        let mut ids = top;
        ids[..n].sort_unstable();
        let (mut rest, mut next) = (0.0, 0);
        for (b, &s) in cheap.iter().enumerate() {
            if next < n && ids[next] == b {
                next += 1;
            } else {
                rest += s;
            }
        }
        // Every token's TINY is in the rest's bounds (count: the whole row).
        let (mut lo, mut hi) = cheap_bounds(rest, self.count());
        for &b in &top[..n] {
            let (l, h) = exp_bounds(self.exp_block(b), BLOCK);
            lo += l;
            hi += h;
        }
        (lo * (1.0 - 1e-12), hi * (1.0 + 1e-12))
    }

    /// Exact f64 weights of `xs`.
    pub(crate) fn weights(&self, xs: &[f32]) -> Result<Vec<f64>> {
        let mut ws = crate::alloc::filled(xs.len(), 0.0, "top-p weights")?;
        // SAFETY: the level is supported.
        unsafe { (self.k.weights64)(xs, self.m as f64, self.inv_t as f64, &mut ws) };
        Ok(ws)
    }
}

/// Test seams: the mass kernels of a level on one row.
#[cfg(feature = "internals")]
pub mod hooks {
    use super::*;
    use crate::kernels::{kernels, SimdLevel};
    use crate::Logits;

    /// The kernels' constants for a row: (c, lo, lo64), or None if `c` overflows.
    pub fn consts(m: f32, inv_t: f32, floor: f32) -> Option<(f32, f32, f32)> {
        let c = exp2_scale(inv_t)?;
        Some((c, mass_lo(m, c, floor), mass_lo64(m, inv_t, floor)))
    }

    /// 2^t for `-125 <= t <= 0`, as every kernel computes it (one lane).
    pub fn exp2(t: f32) -> f32 {
        crate::kernels::generic::exp2_neg::<crate::kernels::simd::Scalar>(t)
    }

    /// exp(a) for `-700 <= a <= 0`, as the f64 kernels compute it.
    pub fn exp64(a: f64) -> f64 {
        crate::kernels::generic::exp64(a)
    }

    /// Bounds of the true mass of at most `count` tokens whose f32-exp kernel mass is `s`.
    pub fn exp_bounds(s: f64, count: usize) -> (f64, f64) {
        super::exp_bounds(s, count)
    }

    /// Bounds of the true mass of at most `count` tokens whose cheap-kernel mass is `s`.
    pub fn cheap_bounds(s: f64, count: usize) -> (f64, f64) {
        super::cheap_bounds(s, count)
    }

    /// Per-token f32 weights of an f32 row (`exp2((x - m) * c)` for `lo <= x < cut`, else 0).
    pub fn weights(level: SimdLevel, x: &[f32], m: f32, c: f32, lo: f32, cut: f32) -> Vec<f32> {
        let mut out = vec![0f32; x.len()];
        let mp = MassParams { m, c, lo, cut };
        // SAFETY: x and out have x.len() values; the level is supported (kernels() checks).
        unsafe { (kernels(level).f32.mass_weights)(x.as_ptr(), x.len(), mp, out.as_mut_ptr()) };
        out
    }

    /// Per-block masses of a row: kind 0 exp, 1 exp below `cut`, 2 cheap below `cut`, 3 exp
    /// and 4 cheap of every token (no mask: `lo` and `cut` unused).
    #[allow(clippy::too_many_arguments)]
    pub fn blocks(level: SimdLevel, x: Logits, m: f32, c: f32, lo: f32, cut: f32, kind: u8) -> Vec<f64> {
        let kind =
            [MassKind::Exp, MassKind::ExpCut, MassKind::CheapCut, MassKind::ExpAll, MassKind::CheapAll][kind as usize];
        let mp = MassParams { m, c, lo, cut };
        let k = kernels(level);
        let n = x.len();
        let mut out = vec![0f64; n.div_ceil(BLOCK)];
        // SAFETY: as above.
        unsafe {
            match x {
                Logits::F32(s) => (k.f32.mass)(s.as_ptr(), n, &[], mp, kind, &mut out),
                Logits::Bf16(s) => (k.bf16.mass)(s.as_ptr(), n, &[], mp, kind, &mut out),
                Logits::F16(s) => (k.f16.mass)(s.as_ptr(), n, &[], mp, kind, &mut out),
            }
        };
        out
    }

    /// The mass-and-gather kernel on an f32 row: per-block exp masses of `lo <= x < cut`, and the
    /// values `>= cut`; then the same from the separate kernels (mass of kind 1, gather).
    #[allow(clippy::type_complexity)]
    pub fn mass_gather(
        level: SimdLevel,
        x: &[f32],
        m: f32,
        c: f32,
        lo: f32,
        cut: f32,
    ) -> ((Vec<f64>, Vec<f32>), (Vec<f64>, Vec<f32>)) {
        let k = kernels(level);
        let mp = MassParams { m, c, lo, cut };
        let bmax: Vec<f32> =
            x.chunks(BLOCK).map(|b| b.iter().fold(f32::NEG_INFINITY, |a, &v| if v > a { v } else { a })).collect();
        let (mut out, mut xs) = (vec![0f64; bmax.len()], Vec::new());
        // SAFETY: as above.
        unsafe { (k.f32.mass_gather)(x.as_ptr(), x.len(), &bmax, mp, &mut out, &mut xs) };
        let (mut out2, mut xs2) = (vec![0f64; bmax.len()], Vec::new());
        // SAFETY: as above.
        unsafe {
            (k.f32.mass)(x.as_ptr(), x.len(), &bmax, mp, MassKind::ExpCut, &mut out2);
            (k.f32.gather_ge)(x.as_ptr(), x.len(), &bmax, cut, &mut xs2);
        }
        ((out, xs), (out2, xs2))
    }

    /// The split kernel on an f32 row (`cheap` weights or f32 exps): per-block masses of
    /// `lo <= x < cut` and of `x >= cut`; then the same from the kernel of one mass (kind ExpCut
    /// or CheapCut below the cut; Exp or CheapCut from `lo` raised to the cut above it).
    #[allow(clippy::type_complexity)]
    pub fn mass_split(
        level: SimdLevel,
        x: &[f32],
        (m, c, lo, cut): (f32, f32, f32, f32),
        cheap: bool,
    ) -> ((Vec<f64>, Vec<f64>), (Vec<f64>, Vec<f64>)) {
        let k = kernels(level);
        let mp = MassParams { m, c, lo, cut };
        let bmax: Vec<f32> =
            x.chunks(BLOCK).map(|b| b.iter().fold(f32::NEG_INFINITY, |a, &v| if v > a { v } else { a })).collect();
        let nb = bmax.len();
        let (mut below, mut above) = (vec![0f64; nb], vec![0f64; nb]);
        // SAFETY: as above.
        unsafe { (k.f32.mass_split)(x.as_ptr(), x.len(), &bmax, mp, cheap, &mut below, &mut above) };
        let (kind_below, kind_above) =
            if cheap { (MassKind::CheapCut, MassKind::CheapCut) } else { (MassKind::ExpCut, MassKind::Exp) };
        let (mut below2, mut above2) = (vec![0f64; nb], vec![0f64; nb]);
        let mp_above = MassParams { lo: cut, cut: f32::INFINITY, ..mp };
        // SAFETY: as above.
        unsafe {
            (k.f32.mass)(x.as_ptr(), x.len(), &bmax, mp, kind_below, &mut below2);
            (k.f32.mass)(x.as_ptr(), x.len(), &bmax, mp_above, kind_above, &mut above2);
        }
        ((below, above), (below2, above2))
    }

    /// Per-block f64 masses of an f32 row (tokens `lo <= x < cut`).
    pub fn blocks64(level: SimdLevel, x: &[f32], m: f32, inv_t: f32, lo: f32, cut: f32) -> Vec<f64> {
        let p = Mass64Params { m: m as f64, s: inv_t as f64, lo, cut };
        let mut out = vec![0f64; x.len().div_ceil(BLOCK)];
        // SAFETY: as above.
        unsafe { (kernels(level).f32.mass64)(x.as_ptr(), x.len(), &[], p, &mut out) };
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::{kernels, supported_levels};

    fn block_maxima(x: &[f32]) -> Vec<f32> {
        x.chunks(BLOCK).map(|b| b.iter().fold(f32::NEG_INFINITY, |a, &v| if v > a { v } else { a })).collect()
    }

    /// The split pass's bounds refined by the heaviest blocks hold the exact (float64) masses
    /// above the cut and of every kept token, on every level, for peaked and flat rows, floors,
    /// temperatures and cuts from the maximum down to the tail; on a peaked row they are far
    /// tighter than the cheap bounds, and on a flat row they are not computed (`None`).
    #[test]
    fn refined_split_bounds_hold_the_float64_masses() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut normal = || {
            let mut u = || ((crate::kernels::xorshift64(&mut state) >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
            (-2.0 * u().ln()).sqrt() * (std::f64::consts::TAU * u()).cos()
        };
        for (vocab, peaks, floor, inv_t) in [
            (65_536, 24, f32::NEG_INFINITY, 1.0),
            (65_536, 0, f32::NEG_INFINITY, 1.0),
            (20_003, 40, 2.0, 0.8),
            (4_097, 6, f32::NEG_INFINITY, 2.5),
        ] {
            let mut x: Vec<f32> = (0..vocab).map(|_| normal() as f32).collect();
            for j in 0..peaks {
                x[(j * 7919 + 13) % vocab] = 10.0 - (j % 12) as f32 * 0.1;
            }
            x[vocab / 3] = f32::NEG_INFINITY;
            let bmax = block_maxima(&x);
            let m = x.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
            let exact = |lo: f32| -> f64 {
                x.iter()
                    .filter(|&&v| v >= lo && v >= floor)
                    .map(|&v| ((v as f64 - m as f64) * inv_t as f64).exp())
                    .sum()
            };
            let z = exact(f32::NEG_INFINITY);
            for cut in [m, m - 0.3, 9.5, 3.0, 0.0] {
                for level in supported_levels() {
                    let r = RowMass::new(kernels(level), &x[..], m, inv_t, floor).unwrap();
                    // (The split needs a cut above the kernels' lo.)
                    let cut = cut.max(r.mp.lo.next_up());
                    let want = exact(cut);
                    let (mut below, mut above) = (Vec::new(), Vec::new());
                    let (sb, sa) = r.split(&bmax, true, cut, (&mut below, &mut above)).unwrap();
                    let zb: Vec<f64> = below.iter().zip(&above).map(|(&b, &a)| b + a).collect();
                    let Some((a, zz)) = r.split_refined(cut, &zb, &above) else {
                        assert_eq!(peaks, 0, "{level:?}: not refined with {peaks} peaks");
                        continue;
                    };
                    assert!(peaks > 0, "{level:?}: refined a flat row");
                    let tol = 1e-13 * z;
                    assert!(a.0 <= want + tol && want <= a.1 + tol, "{level:?} cut {cut}: {a:?} miss {want}");
                    assert!(zz.0 <= z + tol && z <= zz.1 + tol, "{level:?} cut {cut}: {zz:?} miss {z}");
                    let cheap = cheap_bounds(sb + sa, r.count());
                    assert!(zz.1 - zz.0 <= cheap.1 - cheap.0, "{level:?}: refined wider than cheap");
                    if peaks >= 24 && floor == f32::NEG_INFINITY {
                        assert!((zz.1 - zz.0) / z < 0.05, "{level:?}: refined band {}", (zz.1 - zz.0) / z);
                    }
                }
            }
        }
    }

    /// The refined bounds hold the exact Z on every kind of row, and on a peaked row (a few
    /// tokens hold nearly all the mass) they are far tighter than the cheap bounds they refine.
    #[test]
    fn refined_bounds_hold_z_and_are_tight_where_the_mass_is_in_few_blocks() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut normal = || {
            let mut u = || ((crate::kernels::xorshift64(&mut state) >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
            (-2.0 * u().ln()).sqrt() * (std::f64::consts::TAU * u()).cos()
        };
        for (vocab, peaked, floor, inv_t) in [
            (151_936, true, f32::NEG_INFINITY, 1.0),
            (151_936, false, f32::NEG_INFINITY, 1.0),
            (32_000, true, 5.0, 1.0),
            (1000, true, f32::NEG_INFINITY, 2.5),
            (300, false, f32::NEG_INFINITY, 0.7),
        ] {
            let mut x: Vec<f32> = (0..vocab).map(|_| (normal() * 3.0) as f32).collect();
            if peaked {
                for k in 0..4 {
                    x[(k * 7919 + 13) % vocab] = 20.0 - k as f32 * 0.7;
                }
            }
            x[vocab / 3] = f32::NEG_INFINITY;
            let bmax = block_maxima(&x);
            let m = x.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
            for level in supported_levels() {
                let rm = RowMass::new(kernels(level), &x[..], m, inv_t, floor).unwrap();
                let z = rm.exact(&bmax, f32::INFINITY).unwrap();
                let (_, cheap, blocks) = rm.z_cheap(&bmax).unwrap();
                let (lo, hi) = rm.z_refined(&blocks);
                assert!(lo <= z && z <= hi, "{level:?} vocab {vocab}: {lo} <= {z} <= {hi}");
                assert!(hi - lo <= cheap.1 - cheap.0, "{level:?}: refined wider than cheap");
                if peaked && floor == f32::NEG_INFINITY && vocab > 100_000 {
                    assert!((hi - lo) / z < 2e-3, "{level:?}: peaked band {}", (hi - lo) / z);
                }
            }
        }
    }
}
