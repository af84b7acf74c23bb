//! The race: `key_i = (x_i - m) * inv_t - ln E_i`, the token the lowest index of the largest key.
//!
//! - Inline (counter-based) noise ([`race_inline`]): the noise of each block comes with a bound
//!   of its largest `-ln E` ([`BlockNoise`], [`fill_block_noise`]), so that a block, then a
//!   vector, whose keys cannot reach the best key so far is skipped without generating its noise.
//! - External noise, the caller's or a pool's ([`race_external`]): E noise is pruned with a bound
//!   from the bits of E; ln-E noise is a plain max pass over two streams.
//!
//! Pruning only skips tokens whose computed key is provably below the best, so it never changes
//! the result.

use super::noise::{exp_noise, hash, key_words, ln, ln_any, noise_bound, splitmix64, LN2_DOWN, LN2_UP};
use super::scan::keep_bits;
use super::BLOCK;
use crate::kernels::simd::{Elem, Scalar, Simd};

/// The best key so far and its token; ties go to the lower token.
#[derive(Clone, Copy)]
pub(crate) struct Best {
    pub key: f32,
    pub token: usize,
}

impl Best {
    pub(crate) const NONE: Best = Best { key: f32::NEG_INFINITY, token: usize::MAX };

    #[inline(always)]
    pub(crate) fn offer(&mut self, key: f32, token: usize) {
        if key > self.key || (key == self.key && token < self.token) {
            *self = Best { key, token };
        }
    }

    /// Combines the bests of two ranges (in any order).
    pub(crate) fn merge(mut self, other: Best) -> Best {
        if other.token != usize::MAX {
            self.offer(other.key, other.token);
        }
        self
    }
}

/// Row constants of a race.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RaceParams {
    /// The row's finite maximum.
    pub m: f32,
    /// 1/T, at most f32::MAX.
    pub inv_t: f32,
    /// Tokens whose logit is below this do not race (the filters keep `x >= floor`); -inf keeps
    /// every finite logit.
    pub floor: f32,
}

// ---------------------------------------------------------------------------------------------
// The race with inline (counter-based) noise.
// ---------------------------------------------------------------------------------------------

/// The noise of the block of BLOCK tokens that starts at token `b * BLOCK`, built from the
/// memorylessness of Exp(1): the minimum of BLOCK independent Exp(1) values is Exp(BLOCK)
/// (`E_min = E(h1) / BLOCK`), its position `J` is uniform and independent of it (the top 8 bits
/// of `h2`), and every other value is `E_min + F_j` with `F_j ~ Exp(1)` from the token's own
/// hash, independent of the rest. So the values are exactly i.i.d. Exp(1), and `-ln E_min`
/// bounds every key of the block, which lets the race skip a block on one hash.
///
/// `h1`, `h2` and the token hashes are three streams of the same hash under three 64-bit keys:
/// the row key for the tokens, and [`block_keys`] (independent mixes of it) for `h1` and `h2`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BlockNoise {
    pub e_min: f32,
    /// The block-relative position holding `e_min`.
    pub j_min: u32,
    /// An upper bound of `-ln E` over the block (`-ln e_min`, with room for rounding).
    pub g_max: f32,
    /// An upper bound of every key of the block (-inf if the filters keep none of it).
    pub bound: f32,
}

/// The domain of the key of the block minima (`h1`): "blockmin".
pub(crate) const MIN_KEY_DOMAIN: u64 = 0x626c_6f63_6b6d_696e;
/// The domain of the key of the minimum positions (`h2`): "blockpos".
pub(crate) const POS_KEY_DOMAIN: u64 = 0x626c_6f63_6b70_6f73;

/// The keys of the two block streams of the row keyed by `key`: `splitmix64(key ^ domain)` for
/// the minima and for the positions, split into hash words. Computed once per race.
///
/// They must be mixes of the key, not the key with a salt: a salt `S` xored into the hash's
/// first word ties the two streams to the token stream for every key, since the hash of token
/// `t` and the salted hash of block `b` then share their whole input whenever
/// `t * 0x9e3779b9 == (b * 0x9e3779b9) ^ S (mod 2^32)` (3 such pairs below vocab 2^20, 469 below
/// 2^24: the token of each pair is drawn at a wrong rate, in every row). Under independent keys
/// a coincidence of two streams is an event of probability 2^-32 per pair, different in every
/// row, as for independent uniform values. (The row keys fed in are themselves SplitMix64
/// outputs or xoshiro outputs, so the xor here relates no two keys a caller can choose.)
#[inline(always)]
pub(crate) fn block_keys(key: u64) -> ((u32, u32), (u32, u32)) {
    (key_words(splitmix64(key ^ MIN_KEY_DOMAIN)), key_words(splitmix64(key ^ POS_KEY_DOMAIN)))
}

/// An upper bound of the computed `-ln E` of every token of a block whose minimum is `e_min`:
/// `-ln e_min`, plus room for `ln`'s rounding (every other token's `E = fl(e_min + F) >= e_min`,
/// and `ln` is monotone to within far less than 1e-4 over the range of E).
#[inline(always)]
pub(crate) fn block_noise_bound<S: Simd>(e_min: S::F) -> S::F {
    S::add(S::sub(S::splat(0.0), ln::<S>(e_min)), S::splat(1e-4))
}

/// `BlockNoise` of `S::LANES` consecutive blocks starting at block index `b`, whose largest
/// logits are `bm`, with the block keys `(kmin, kpos)` of [`block_keys`]: (e_min, j_min, g_max,
/// bound).
#[inline(always)]
fn block_noise<S: Simd>(
    b: u32,
    (kmin, kpos): ((u32, u32), (u32, u32)),
    bm: S::F,
    p: RaceParams,
) -> (S::F, S::U, S::F, S::F) {
    let idx = S::iota_u(b);
    let h1 = hash::<S>(idx, S::splat_u(kmin.0), S::splat_u(kmin.1));
    let h2 = hash::<S>(idx, S::splat_u(kpos.0), S::splat_u(kpos.1));
    let e_min = S::mul(exp_noise::<S>(h1), S::splat(1.0 / BLOCK as f32));
    let g_max = block_noise_bound::<S>(e_min);
    let bound = S::add(S::mul(S::sub(bm, S::splat(p.m)), S::splat(p.inv_t)), g_max);
    let bound = S::select(S::ge(bm, S::splat(p.floor)), bound, S::splat(f32::NEG_INFINITY));
    (e_min, S::shr_u::<24>(h2), g_max, bound)
}

/// Fills `out` with the `BlockNoise` of blocks `first, first + 1, ...` of the row keyed by `key`,
/// whose largest logits are `bmax`.
///
/// # Safety
/// `bmax` has `out.len()` elements; `S` usable here.
#[inline(always)]
pub(crate) unsafe fn fill_block_noise<S: Simd>(
    key: u64,
    first: usize,
    bmax: &[f32],
    p: RaceParams,
    out: &mut [BlockNoise],
) {
    let k = block_keys(key);
    let (mut e, mut j, mut g, mut u) = ([0f32; 64], [0u32; 64], [0f32; 64], [0f32; 64]);
    let mut b = 0;
    while b < out.len() {
        let lanes = if b + S::LANES <= out.len() {
            // SAFETY: b + LANES <= out.len() = bmax.len(); LANES <= 64 (the scratch arrays);
            // `S` usable (the caller's contract).
            unsafe {
                let (ve, vj, vg, vu) = block_noise::<S>((first + b) as u32, k, S::load_f32(bmax.as_ptr().add(b)), p);
                S::store(e.as_mut_ptr(), ve);
                S::store_u(j.as_mut_ptr(), vj);
                S::store(g.as_mut_ptr(), vg);
                S::store(u.as_mut_ptr(), vu);
            }
            S::LANES
        } else {
            (e[0], j[0], g[0], u[0]) = block_noise::<Scalar>((first + b) as u32, k, bmax[b], p);
            1
        };
        for l in 0..lanes {
            out[b + l] = BlockNoise { e_min: e[l], j_min: j[l], g_max: g[l], bound: u[l] };
        }
        b += lanes;
    }
}

/// The noise E of token `t` (block-relative index `i0`) of a block with noise `bn`, in a row
/// whose key words are `k`: one lane of what [`race_inline_vec`] computes, for code that needs
/// single tokens' noise (the residual race of a verify call, the tests' reference).
pub(crate) fn token_noise(k: (u32, u32), bn: &BlockNoise, i0: u32, t: u32) -> f32 {
    if i0 == bn.j_min {
        bn.e_min
    } else {
        bn.e_min + exp_noise::<Scalar>(hash::<Scalar>(t, k.0, k.1))
    }
}

/// An upper bound of `-ln token_noise(k, bn, i0, t)`, in f64, from a few integer operations on
/// the token's noise bits (the bound the race applies per token before computing its noise):
/// `E = fl(e_min + F) >= F`, so `-ln E <= -ln F <= noise_bound`; 1e-4 more covers the rounding
/// of a `-ln E` taken in f64 rather than the race's f32.
pub(crate) fn token_noise_bound(k: (u32, u32), bn: &BlockNoise, i0: u32, t: u32) -> f64 {
    if i0 == bn.j_min {
        bn.g_max as f64
    } else {
        noise_bound::<Scalar>(hash::<Scalar>(t, k.0, k.1)) as f64 + 1e-4
    }
}

/// The exact keys of the `LANES` tokens at `row[i..]`, which lie in a block with noise `bn`;
/// `i0` is the block-relative index of `row[i]` and `t` the vocabulary index of `row[i]`.
/// With a non-null `keep` (the block's words), only the tokens whose bit is set in `keep` (bit
/// `i0 % 32` of word `i0 / 32`) race. Returns the lanes
/// whose value, kept or not, passes the block's noise bound (the first test): what
/// [`race_block`] asks of the tokens whose values are bounded by the row's.
///
/// # Safety
/// `row` valid for `i + S::LANES` reads; when `keep` is not null, `keep` valid for `i0 / 32 + 1` reads; `S`
/// usable here.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn race_inline_vec<S: Simd, E: Elem>(
    row: *const E,
    keep: *const u32,
    i: usize,
    (i0, t): (u32, u32),
    bn: BlockNoise,
    p: RaceParams,
    k: (u32, u32),
    best: &mut Best,
) -> S::M {
    // SAFETY: the caller's contract.
    let x = unsafe { E::load::<S>(row.add(i)) };
    let d = S::mul(S::sub(x, S::splat(p.m)), S::splat(p.inv_t));
    let mut racing = S::and_m(S::gt(d, S::splat(f32::NEG_INFINITY)), S::ge(x, S::splat(p.floor)));
    if !keep.is_null() {
        // SAFETY: the caller's contract.
        racing = S::and_m(racing, unsafe { keep_bits::<S>(keep, i0 as usize) });
    }
    // Most vectors of a live block stop here: even the block's smallest noise cannot lift them.
    let reach = S::ge(S::add(d, S::splat(bn.g_max)), S::splat(best.key));
    let live = S::and_m(reach, racing);
    if !S::any(live) {
        return reach;
    }
    // A tighter bound per token from its own noise bits: E_j = E_min + F_j >= F_j, except at
    // the block minimum's position, where E = E_min.
    let h = hash::<S>(S::iota_u(t), S::splat_u(k.0), S::splat_u(k.1));
    let is_min = S::eq(S::cvt_i32(S::iota_u(i0)), S::cvt_i32(S::splat_u(bn.j_min)));
    let g = S::select(is_min, S::splat(bn.g_max), noise_bound::<S>(h));
    let live = S::and_m(live, S::ge(S::add(d, g), S::splat(best.key)));
    if !S::any(live) {
        return reach;
    }
    let e_min = S::splat(bn.e_min);
    let e = S::select(is_min, e_min, S::add(e_min, exp_noise::<S>(h)));
    let key = S::sub(d, ln::<S>(e));
    let kv = S::select(live, key, S::splat(f32::NEG_INFINITY));
    let top = S::reduce_max(kv);
    let lane = S::first(S::and_m(live, S::eq(kv, S::splat(top))));
    best.offer(top, t as usize + lane);
    reach
}

/// Races every token of block `b` (whose noise is `bn`) against `best` (with a non-null `keep`, the
/// block's words: those whose bit is set in `keep`). When `TOUCHED`, also sets in `reached` (bit `i % 32` of word `i / 32`
/// for the block's token `i`) the tokens whose bit is set in `touched` and whose value in the
/// row passes the block's noise bound as its vector is raced: of the tokens whose values are
/// bounded by the row's, those that may reach the best, found in the same vector operations.
///
/// # Safety
/// `row` valid for `n` reads; when `keep` is not null, `keep` for the block's words (`BLOCK / 32`,
/// or to the row's end); when `TOUCHED`, `touched` for `n.div_ceil(32)`; `S` usable here.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn race_block<S: Simd, E: Elem, const TOUCHED: bool>(
    row: *const E,
    keep: *const u32,
    n: usize,
    (b, bn): (usize, BlockNoise),
    p: RaceParams,
    k: (u32, u32),
    base: usize,
    best: &mut Best,
    (touched, reached): (*const u32, &mut [u32; BLOCK / 32]),
) {
    let (start, end) = (b * BLOCK, ((b + 1) * BLOCK).min(n));
    let mut i = start;
    while i + S::LANES <= end {
        // SAFETY: i + LANES <= end <= n; `S` usable (the caller's contract).
        let reach =
            unsafe { race_inline_vec::<S, E>(row, keep, i, ((i - start) as u32, (base + i) as u32), bn, p, k, best) };
        if TOUCHED {
            // SAFETY: as above (`touched` as `keep`). A vector's lanes lie in one word, as
            // LANES divides 32.
            let bits = S::bits_of(S::and_m(reach, unsafe { keep_bits::<S>(touched, i) }));
            reached[(i - start) / 32] |= bits << (i % 32);
        }
        i += S::LANES;
    }
    while i < end {
        // SAFETY: i < end <= n; Scalar runs anywhere.
        let reach = unsafe {
            race_inline_vec::<Scalar, E>(row, keep, i, ((i - start) as u32, (base + i) as u32), bn, p, k, best)
        };
        if TOUCHED {
            // SAFETY: as above.
            let bit = Scalar::bits_of(reach && unsafe { keep_bits::<Scalar>(touched, i) });
            reached[(i - start) / 32] |= bit << (i % 32);
        }
        i += 1;
    }
}

/// The tokens of a row whose values are not the row's own (a row whose sampling step changed them:
/// `src/step/`), handed to the race one visited block at a time, so that the tokens of the
/// blocks it skips are never worked out.
pub(crate) trait BlockValues {
    /// Writes into `out` the tokens of block `b` whose values are not the row's, each with an
    /// upper bound of its value (`(token, bound)`, in no particular order), and returns how many.
    fn listed(&self, b: usize, out: &mut [(u32, f32); BLOCK]) -> usize;
    /// When every token that [`BlockValues::listed`] would list for block `b` has its value in
    /// the row as its bound: the bits of those tokens (one per token of the whole row, as
    /// `keep`), which the race then tests in its own vector pass instead of listing them (on a
    /// flat row, most visited blocks hold a few, of which only a few percent pass).
    fn bounded_by_row(&self, b: usize) -> Option<*const u32>;
    /// The value of listed token `t` (NaN or -inf: it is not drawn).
    fn value(&self, t: u32) -> f32;
    /// Whether the race must not read a block's bits in the row's `keep` but ask
    /// [`BlockValues::block_keep`] for them (the step finds a block's touched tokens only when it
    /// is visited). Asked once a race.
    fn own_keep(&self) -> bool {
        false
    }
    /// With [`BlockValues::own_keep`]: writes block `b`'s keep words into `words`.
    fn block_keep(&self, _b: usize, _words: &mut [u32; BLOCK / 32]) {}
}

/// Races token `t` of value `y` (worked out apart from the row) in its block of noise `bn`, on
/// the scalar code of a vector lane, so that it gets the key it would get in a row holding `y`.
#[inline(always)]
fn race_value(y: f32, t: u32, bn: BlockNoise, p: RaceParams, k: (u32, u32), best: &mut Best) {
    // SAFETY: one value at `&y`; nothing read from `keep` (null); Scalar runs anywhere.
    unsafe { race_inline_vec::<Scalar, f32>(&y, std::ptr::null(), 0, (t % BLOCK as u32, t), bn, p, k, best) };
}

/// Races block `(b, bn)` of [`race_inline`]: its kept tokens from the row, then, with `processed`,
/// its listed tokens, each on the same scalar code as a vector lane, so that it gets the key it
/// would get in a row holding its value. A listed token whose bound cannot reach the best is
/// skipped before its value is worked out: the first test of that code, on the bound, is at
/// least its test on the value, since every rounding step is monotone. Where the bound is the
/// token's value in the row ([`BlockValues::bounded_by_row`]), that first test is made on the
/// race's own vectors ([`race_block`]), and only the tokens that pass are worked out. The kept
/// tokens are those of `keep`, or of the block's own words when `processed` has them
/// ([`BlockValues::block_keep`]).
///
/// # Safety
/// As [`race_block`], but `keep` (when not null) valid for the row's words, `n.div_ceil(32)`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn visit<S: Simd, E: Elem>(
    row: *const E,
    keep: *const u32,
    n: usize,
    (b, bn): (usize, BlockNoise),
    (p, k, base): (RaceParams, (u32, u32), usize),
    (processed, listed, own_keep): (Option<&dyn BlockValues>, &mut [(u32, f32); BLOCK], bool),
    best: &mut Best,
) {
    let mut reached = [0u32; BLOCK / 32];
    let no_touched = (std::ptr::null(), &mut reached);
    let mut words = [0u32; BLOCK / 32];
    let keep = match processed {
        Some(values) if own_keep => {
            values.block_keep(b, &mut words);
            words.as_ptr()
        }
        // SAFETY: `keep` holds the row's words (the caller's contract), of which block b's
        // start at b * BLOCK / 32.
        _ if !keep.is_null() => unsafe { keep.add(b * (BLOCK / 32)) },
        _ => keep,
    };
    let Some(values) = processed else {
        // SAFETY: the caller's contract.
        unsafe { race_block::<S, E, false>(row, keep, n, (b, bn), p, k, base, best, no_touched) };
        return;
    };
    if let Some(touched) = values.bounded_by_row(b) {
        // SAFETY: the caller's contract; `touched` has a bit per token of the row.
        unsafe { race_block::<S, E, true>(row, keep, n, (b, bn), p, k, base, best, (touched, &mut reached)) };
        for (w, &word) in reached.iter().enumerate() {
            let mut bits = word;
            while bits != 0 {
                let t = (base + b * BLOCK + w * 32) as u32 + bits.trailing_zeros();
                race_value(values.value(t), t, bn, p, k, best);
                bits &= bits - 1;
            }
        }
        return;
    }
    // SAFETY: the caller's contract.
    unsafe { race_block::<S, E, false>(row, keep, n, (b, bn), p, k, base, best, no_touched) };
    let count = values.listed(b, listed);
    for &(t, bound) in &listed[..count] {
        let d = Scalar::mul(Scalar::sub(bound, p.m), p.inv_t);
        if d + bn.g_max >= best.key {
            race_value(values.value(t), t, bn, p, k, best);
        }
    }
}

/// ln BLOCK (ln 256 = 5.545177...) rounded up.
const LN_BLOCK_UP: f32 = 5.545_2;

/// Room above `noise_bound(h1) + ln BLOCK + 1e-4` for the roundings of the computed
/// `-ln e_min` (of the order of 1e-6 at these magnitudes) and of the bound's own sums.
const CHEAP_ROOM: f32 = 1e-4 + 1e-3;

/// Upper bounds of the `bound`s of [`block_noise`] for `S::LANES` consecutive blocks from block
/// index `b` (block maxima `bm`), from a few integer operations and no logarithm: the block's
/// `g_max = -ln(E(h1) / BLOCK) + 1e-4` is at most `noise_bound(h1) + ln BLOCK + 1e-4`
/// ([`noise_bound`] bounds `-ln E(h1)`), and rounding goes up through the same sums.
#[inline(always)]
fn cheap_bound<S: Simd>(b: u32, kmin: (u32, u32), bm: S::F, p: RaceParams) -> S::F {
    let h1 = hash::<S>(S::iota_u(b), S::splat_u(kmin.0), S::splat_u(kmin.1));
    let g = S::add(noise_bound::<S>(h1), S::splat(LN_BLOCK_UP + CHEAP_ROOM));
    let bound = S::add(S::mul(S::sub(bm, S::splat(p.m)), S::splat(p.inv_t)), g);
    S::select(S::ge(bm, S::splat(p.floor)), bound, S::splat(f32::NEG_INFINITY))
}

/// Writes into `out` (of `bmax.len()`) the [`cheap_bound`] of every block of `bmax` (block
/// `first` the first) and returns the largest.
///
/// # Safety
/// `S` usable here.
#[inline(always)]
unsafe fn cheap_bounds<S: Simd>(kmin: (u32, u32), first: usize, bmax: &[f32], p: RaceParams, out: &mut [f32]) -> f32 {
    let mut top = S::splat(f32::NEG_INFINITY);
    let mut b = 0;
    while b + S::LANES <= bmax.len() {
        // SAFETY: b + LANES <= bmax.len() = out.len(); `S` usable (the caller's contract).
        unsafe {
            let u = cheap_bound::<S>((first + b) as u32, kmin, S::load_f32(bmax.as_ptr().add(b)), p);
            S::store(out.as_mut_ptr().add(b), u);
            top = S::max(u, top);
        }
        b += S::LANES;
    }
    let mut top = S::reduce_max(top);
    while b < bmax.len() {
        out[b] = cheap_bound::<Scalar>((first + b) as u32, kmin, bmax[b], p);
        top = Scalar::max(out[b], top);
        b += 1;
    }
    top
}

/// The first index from `from` on whose value in `v` is at least `at`, `S::LANES` at a time.
///
/// # Safety
/// `S` usable here.
#[inline(always)]
unsafe fn next_at_least<S: Simd>(v: &[f32], from: usize, at: f32) -> Option<usize> {
    let mut i = from;
    while i + S::LANES <= v.len() {
        // SAFETY: i + LANES <= v.len(); `S` usable (the caller's contract).
        let bits = S::bits_of(S::ge(unsafe { S::load_f32(v.as_ptr().add(i)) }, S::splat(at)));
        if bits != 0 {
            return Some(i + bits.trailing_zeros() as usize);
        }
        i += S::LANES;
    }
    (i..v.len()).find(|&i| v[i] >= at)
}

/// How many values of `v` are at least `at`, `S::LANES` at a time.
///
/// # Safety
/// `S` usable here.
#[inline(always)]
unsafe fn count_at_least<S: Simd>(v: &[f32], at: f32) -> usize {
    let (mut count, mut i) = (0, 0);
    while i + S::LANES <= v.len() {
        // SAFETY: i + LANES <= v.len(); `S` usable (the caller's contract).
        count += S::bits_of(S::ge(unsafe { S::load_f32(v.as_ptr().add(i)) }, S::splat(at))).count_ones() as usize;
        i += S::LANES;
    }
    count + v[i..].iter().filter(|&&x| x >= at).count()
}

/// The scratch of [`race_inline`]: every block's [`cheap_bound`], and the [`BlockNoise`] of the
/// blocks, worked out `S::LANES` blocks (a chunk) at a time when the race first needs a block of
/// the chunk: most blocks of a row are skipped on their cheap bound alone, and never need the two
/// logarithms of their exact noise.
#[derive(Default)]
pub(crate) struct RaceScratch {
    cheap: Vec<f32>,
    e: Vec<f32>,
    j: Vec<u32>,
    g: Vec<f32>,
    u: Vec<f32>,
    /// Per chunk, whether its noise is worked out.
    done: Vec<bool>,
}

impl RaceScratch {
    /// Room for `blocks` blocks in every array, so that [`RaceScratch::reset`] (inside the
    /// race, which cannot fail) allocates nothing: OUT_OF_MEMORY instead of an abort.
    pub(crate) fn reserve(&mut self, blocks: usize) -> crate::error::Result<()> {
        const WHAT: &str = "the race's block bounds";
        for v in [&mut self.cheap, &mut self.e, &mut self.g, &mut self.u] {
            v.clear();
            crate::alloc::reserve(v, blocks, WHAT)?;
        }
        self.j.clear();
        crate::alloc::reserve(&mut self.j, blocks, WHAT)?;
        self.done.clear();
        crate::alloc::reserve(&mut self.done, blocks, WHAT)
    }

    /// The bytes this scratch holds.
    pub(crate) fn capacity_bytes(&self) -> usize {
        4 * (self.cheap.capacity() + self.e.capacity() + self.g.capacity() + self.u.capacity() + self.j.capacity())
            + self.done.capacity()
    }

    /// Makes room for `blocks` blocks, no chunk's noise worked out; allocates nothing after
    /// [`RaceScratch::reserve`] of at least `blocks`.
    fn reset(&mut self, blocks: usize, lanes: usize) {
        debug_assert!(self.j.capacity() >= blocks && self.done.capacity() >= blocks.div_ceil(lanes));
        for v in [&mut self.cheap, &mut self.e, &mut self.g, &mut self.u] {
            v.clear();
            v.resize(blocks, 0.0);
        }
        self.j.clear();
        self.j.resize(blocks, 0);
        self.done.clear();
        self.done.resize(blocks.div_ceil(lanes), false);
    }

    /// The noise of block `b` of a row whose first block is block index `first`, with block keys
    /// `kb` and block maxima `bmax` (`b < bmax.len()`, the length [`RaceScratch::reset`] was
    /// given): what [`fill_block_noise`] writes for it.
    ///
    /// # Safety
    /// `S` usable here.
    #[inline(always)]
    unsafe fn block<S: Simd>(
        &mut self,
        b: usize,
        first: usize,
        kb: ((u32, u32), (u32, u32)),
        bmax: &[f32],
        p: RaceParams,
    ) -> BlockNoise {
        let c = b / S::LANES;
        if !self.done[c] {
            let start = c * S::LANES;
            if start + S::LANES <= bmax.len() {
                // SAFETY: start + LANES <= bmax.len(), the length of every array; `S` usable
                // (the caller's contract).
                unsafe {
                    let (ve, vj, vg, vu) =
                        block_noise::<S>((first + start) as u32, kb, S::load_f32(bmax.as_ptr().add(start)), p);
                    S::store(self.e.as_mut_ptr().add(start), ve);
                    S::store_u(self.j.as_mut_ptr().add(start), vj);
                    S::store(self.g.as_mut_ptr().add(start), vg);
                    S::store(self.u.as_mut_ptr().add(start), vu);
                }
            } else {
                for (i, &bm) in bmax.iter().enumerate().skip(start) {
                    (self.e[i], self.j[i], self.g[i], self.u[i]) = block_noise::<Scalar>((first + i) as u32, kb, bm, p);
                }
            }
            self.done[c] = true;
        }
        BlockNoise { e_min: self.e[b], j_min: self.j[b], g_max: self.g[b], bound: self.u[b] }
    }
}

/// The best (key, token) among the `n` tokens at `row`, which start at vocabulary index `base`
/// (a multiple of BLOCK) and have block maxima `bmax`, in a row with finite maximum `p.m`.
/// `Best::NONE` if no token races. Tiles of one row combine with [`Best::merge`].
///
/// Promising blocks go first, so that the best key is high from the start; a block whose
/// maximum logit plus its noise bound cannot reach the best is skipped without reading it, most
/// on a bound from a few integer operations ([`cheap_bound`], one vector pass over the blocks),
/// the others on their exact noise ([`RaceScratch`]).
/// With a non-null `keep`, only the tokens whose bit is set in `keep` race (`bmax` their maxima).
/// With `processed`, the listed tokens of each visited block race too (`bmax` then bounds the values
/// of both from above).
///
/// # Safety
/// `row` valid for `n` reads; `bmax` from [`scan`](super::scan()) of the same range (and mask),
/// or upper bounds of the values raced;
/// when `keep` is not null, `keep` valid for `n.div_ceil(32)` reads; `S` usable here.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn race_inline<S: Simd, E: Elem>(
    row: *const E,
    keep: *const u32,
    n: usize,
    bmax: &[f32],
    p: RaceParams,
    key: u64,
    base: usize,
    scratch: &mut RaceScratch,
    processed: Option<&dyn BlockValues>,
) -> Best {
    let (k, kb, first_block) = (key_words(key), block_keys(key), base / BLOCK);
    let mut listed = [(0u32, 0f32); BLOCK];
    let own_keep = processed.is_some_and(|v| v.own_keep());
    scratch.reset(bmax.len(), S::LANES);
    let mut best = Best::NONE;
    // Promising blocks first, so that the best key is high early and most bounds fall short of
    // it: the block of the highest exact bound (it most often holds the winner; its cheap bound
    // is at least the exact bound of the block of the highest cheap one), then every block
    // within PROMISING of it, then the rest. The order only changes how much work is skipped,
    // never the result.
    const PROMISING: f32 = 3.0;
    // More than one block in DENSE whose cheap bound reaches the exact bound of the block of the
    // largest cheap one: every block's exact noise is worked out at once.
    const DENSE: usize = 8;
    // SAFETY: `S` usable (the caller's contract) in every call below; every block index is below
    // bmax.len() = n.div_ceil(BLOCK), the length of the scratch's arrays, and `row` is valid for
    // `n` reads (and `keep` for `n.div_ceil(32)`, when not null).
    unsafe {
        let top = cheap_bounds::<S>(kb.0, first_block, bmax, p, &mut scratch.cheap);
        let mut first = next_at_least::<S>(&scratch.cheap, 0, top).unwrap_or(0);
        let mut bn = scratch.block::<S>(first, first_block, kb, bmax, p);
        if count_at_least::<S>(&scratch.cheap, bn.bound) * DENSE > bmax.len() {
            // Many blocks may beat it (a flat row): every block's exact noise, in one vector
            // pass, then the exact bounds stand for the cheap ones (they bound the same keys,
            // tighter), so that the loops below test each candidate once.
            for b in (0..bmax.len()).step_by(S::LANES) {
                scratch.block::<S>(b, first_block, kb, bmax, p);
            }
            scratch.cheap.copy_from_slice(&scratch.u);
        }
        let mut from = 0;
        while let Some(b) = next_at_least::<S>(&scratch.cheap, from, bn.bound) {
            let other = scratch.block::<S>(b, first_block, kb, bmax, p);
            if other.bound > bn.bound || (other.bound == bn.bound && b < first) {
                (first, bn) = (b, other);
            }
            from = b + 1;
        }
        visit::<S, E>(row, keep, n, (first, bn), (p, k, base), (processed, &mut listed, own_keep), &mut best);
        let cut = bn.bound - PROMISING;
        // The first pass visits the blocks whose exact bound reaches `cut`, the second the others.
        for promising in [true, false] {
            let mut from = 0;
            let at = |best: &Best| if promising { Scalar::max(cut, best.key) } else { best.key };
            while let Some(b) = next_at_least::<S>(&scratch.cheap, from, at(&best)) {
                if b != first {
                    let bn = scratch.block::<S>(b, first_block, kb, bmax, p);
                    if bn.bound >= best.key && (bn.bound >= cut) == promising {
                        visit::<S, E>(
                            row,
                            keep,
                            n,
                            (b, bn),
                            (p, k, base),
                            (processed, &mut listed, own_keep),
                            &mut best,
                        );
                    }
                }
                from = b + 1;
            }
        }
    }
    best
}

// ---------------------------------------------------------------------------------------------
// The race with external noise (the caller's or a pool's).
// ---------------------------------------------------------------------------------------------

// Whether external noise values are E or ln E is the library's `NoiseKind`.
use crate::config::NoiseKind;

/// The keys of the `LANES` tokens at `i` given `ln_e`: -inf, NaN and filtered-out logits (and,
/// when `keep` is not null, the tokens whose bit is clear in `keep`) get NaN, which no comparison (and no
/// `max`) takes.
///
/// # Safety
/// `row` valid for `i + S::LANES` reads; when `keep` is not null, `keep` for `i / 32 + 1`; `S` usable here.
#[inline(always)]
unsafe fn ext_key<S: Simd, E: Elem>(row: *const E, keep: *const u32, i: usize, p: RaceParams, ln_e: S::F) -> S::F {
    // SAFETY: the caller's contract.
    let x = unsafe { E::load::<S>(row.add(i)) };
    let d = S::mul(S::sub(x, S::splat(p.m)), S::splat(p.inv_t));
    let key = S::sub(d, ln_e);
    let mut racing = S::and_m(S::gt(d, S::splat(f32::NEG_INFINITY)), S::ge(x, S::splat(p.floor)));
    if !keep.is_null() {
        // SAFETY: the caller's contract.
        racing = S::and_m(racing, unsafe { keep_bits::<S>(keep, i) });
    }
    S::select(racing, key, S::splat(f32::NAN))
}

/// The keys of ln-E noise, for `LANES` tokens at `i`. Unfiltered, no mask is needed: a masked
/// logit's key is -inf or NaN, a NaN logit's is NaN, and `max` takes neither over a real key.
///
/// # Safety
/// `row` and `noise` valid for `i + S::LANES` reads; when `keep` is not null, `keep` for `i / 32 + 1`; `S`
/// usable here.
#[inline(always)]
unsafe fn log_exp_key<S: Simd, E: Elem, const FILTERED: bool>(
    row: *const E,
    keep: *const u32,
    noise: *const f32,
    i: usize,
    p: RaceParams,
) -> S::F {
    // SAFETY: (both branches) the caller's contract.
    unsafe {
        if FILTERED || !keep.is_null() {
            ext_key::<S, E>(row, keep, i, p, S::load_f32(noise.add(i)))
        } else {
            let x = E::load::<S>(row.add(i));
            S::sub(S::mul(S::sub(x, S::splat(p.m)), S::splat(p.inv_t)), S::load_f32(noise.add(i)))
        }
    }
}

/// `acc` raised to the keys of the racing tokens of the `LANES` at `i` (ln-E noise): the keys
/// of [`ext_key`], taken into the maximum under the racing mask rather than blended with NaN
/// first (whose masked memory operand ran the masked race at a third of the speed of the plain
/// one on AMD Zen 5).
///
/// # Safety
/// As [`log_exp_key`].
#[inline(always)]
unsafe fn masked_max<S: Simd, E: Elem>(
    row: *const E,
    keep: *const u32,
    noise: *const f32,
    i: usize,
    p: RaceParams,
    acc: S::F,
) -> S::F {
    // SAFETY: the caller's contract.
    let (x, ln_e) = unsafe { (E::load::<S>(row.add(i)), S::load_f32(noise.add(i))) };
    let d = S::mul(S::sub(x, S::splat(p.m)), S::splat(p.inv_t));
    let key = S::sub(d, ln_e);
    let mut racing = S::and_m(S::gt(d, S::splat(f32::NEG_INFINITY)), S::ge(x, S::splat(p.floor)));
    if !keep.is_null() {
        // SAFETY: the caller's contract.
        racing = S::and_m(racing, unsafe { keep_bits::<S>(keep, i) });
    }
    S::select(racing, S::max(key, acc), acc)
}

/// The best (key, token) of `[0, n)` with ln-E noise, as a plain max pass: each block's largest
/// key, the first block holding the overall largest, then a rescan of that block for the first
/// index holding it. Two streams read once, plus one block.
///
/// # Safety
/// `row` and `noise` valid for `n` reads; when `keep` is not null, `keep` for `n.div_ceil(32)`; `S` usable
/// here.
#[inline(always)]
unsafe fn race_log_exp<S: Simd, E: Elem, const FILTERED: bool>(
    row: *const E,
    keep: *const u32,
    noise: *const f32,
    n: usize,
    p: RaceParams,
    base: usize,
) -> Best {
    let l = S::LANES;
    let (mut top, mut top_block) = (f32::NEG_INFINITY, usize::MAX);
    for b in 0..n.div_ceil(BLOCK) {
        let (start, end) = (b * BLOCK, ((b + 1) * BLOCK).min(n));
        let ninf = S::splat(f32::NEG_INFINITY);
        let (mut a0, mut a1, mut a2, mut a3) = (ninf, ninf, ninf, ninf);
        let mut i = start;
        while i + 4 * l <= end {
            // SAFETY: i + 4 LANES <= end <= n; `S` usable (the caller's contract).
            unsafe {
                if FILTERED || !keep.is_null() {
                    a0 = masked_max::<S, E>(row, keep, noise, i, p, a0);
                    a1 = masked_max::<S, E>(row, keep, noise, i + l, p, a1);
                    a2 = masked_max::<S, E>(row, keep, noise, i + 2 * l, p, a2);
                    a3 = masked_max::<S, E>(row, keep, noise, i + 3 * l, p, a3);
                } else {
                    a0 = S::max(log_exp_key::<S, E, FILTERED>(row, keep, noise, i, p), a0);
                    a1 = S::max(log_exp_key::<S, E, FILTERED>(row, keep, noise, i + l, p), a1);
                    a2 = S::max(log_exp_key::<S, E, FILTERED>(row, keep, noise, i + 2 * l, p), a2);
                    a3 = S::max(log_exp_key::<S, E, FILTERED>(row, keep, noise, i + 3 * l, p), a3);
                }
            }
            i += 4 * l;
        }
        while i + l <= end {
            // SAFETY: i + LANES <= end <= n; as above.
            a0 = S::max(unsafe { log_exp_key::<S, E, FILTERED>(row, keep, noise, i, p) }, a0);
            i += l;
        }
        let mut m = S::reduce_max(S::max(S::max(a0, a1), S::max(a2, a3)));
        while i < end {
            // SAFETY: i < end <= n; Scalar runs anywhere.
            m = Scalar::max(unsafe { log_exp_key::<Scalar, E, FILTERED>(row, keep, noise, i, p) }, m);
            i += 1;
        }
        if m > top {
            (top, top_block) = (m, b);
        }
    }
    if top_block == usize::MAX {
        return Best::NONE;
    }
    let start = top_block * BLOCK;
    let end = (start + BLOCK).min(n);
    // SAFETY: i < end <= n; Scalar runs anywhere.
    let i = (start..end)
        .find(|&i| unsafe { log_exp_key::<Scalar, E, FILTERED>(row, keep, noise, i, p) } == top)
        .unwrap_or(start);
    Best { key: top, token: base + i }
}

/// An upper bound of `-ln E` from the bits of E: E >= 2^(e - 127) for a normal E with biased
/// exponent e, so `-ln E <= k ln 2` with `k = 127 - e`; +inf for 0 and subnormals (their ln is
/// below -87); negative, infinite or NaN E, whose key never wins, get a finite bound.
///
/// k is negative for every E >= 2, and an upper bound of `k ln 2` then needs ln 2 rounded
/// *down*: with ln 2 rounded up, the bound fell below `-ln E` by up to `|k| ln 2 2^-16 - 1e-5`
/// (1e-3 at E = 2^100), and a token whose key beat the best by less than that was skipped. The
/// room `|k| ln 2 2^-16 + 1e-5` covers the error of the computed `ln` and of this bound's own
/// f32 roundings (`tests/draw.rs` checks every exponent).
#[inline(always)]
pub(crate) fn exp_bits_bound<S: Simd>(e: S::F) -> S::F {
    let eb = S::shr_u::<23>(S::to_bits(e));
    let k = S::cvt_i32(S::sub_u(S::splat_u(127), eb));
    let ln2 = S::select(S::lt(k, S::splat(0.0)), S::splat(LN2_DOWN), S::splat(LN2_UP));
    let bound = S::add(S::mul(k, ln2), S::splat(1e-5));
    S::select(S::lt(e, S::splat(f32::MIN_POSITIVE)), S::splat(f32::INFINITY), bound)
}

/// Races the `LANES` tokens at `i` with E noise: only vectors that a bound from the bits of E
/// lets reach the best get their exact `ln E`.
///
/// # Safety
/// `row` and `noise` valid for `i + S::LANES` reads; when `keep` is not null, `keep` for `i / 32 + 1`; `S`
/// usable here.
#[inline(always)]
unsafe fn race_exp_vec<S: Simd, E: Elem>(
    row: *const E,
    keep: *const u32,
    noise: *const f32,
    i: usize,
    p: RaceParams,
    base: usize,
    best: &mut Best,
) {
    // SAFETY: the caller's contract.
    let x = unsafe { E::load::<S>(row.add(i)) };
    let d = S::mul(S::sub(x, S::splat(p.m)), S::splat(p.inv_t));
    // SAFETY: the caller's contract.
    let g = unsafe { S::load_f32(noise.add(i)) };
    if !S::any(S::ge(S::add(d, exp_bits_bound::<S>(g)), S::splat(best.key))) {
        return;
    }
    // SAFETY: the caller's contract.
    let key = unsafe { ext_key::<S, E>(row, keep, i, p, ln_any::<S>(g)) };
    let kv = S::select(S::gt(key, S::splat(f32::NEG_INFINITY)), key, S::splat(f32::NEG_INFINITY));
    let top = S::reduce_max(kv);
    if top > f32::NEG_INFINITY {
        best.offer(top, base + i + S::first(S::eq(kv, S::splat(top))));
    }
}

/// The best (key, token) among the `n` tokens at `row` (vocabulary index `base` onwards), given
/// one noise value per token at `noise`; `Best::NONE` when no key is a number above -inf
/// (external noise that is +inf or NaN everywhere that matters).
///
/// With a non-null `keep`, only the tokens whose bit is set in `keep` race.
///
/// # Safety
/// `row` and `noise` valid for `n` reads; when `keep` is not null, `keep` for `n.div_ceil(32)`; `S` usable
/// here.
#[inline(always)]
pub(crate) unsafe fn race_external<S: Simd, E: Elem>(
    row: *const E,
    keep: *const u32,
    noise: *const f32,
    n: usize,
    p: RaceParams,
    kind: NoiseKind,
    base: usize,
) -> Best {
    if kind == NoiseKind::LogExp {
        // SAFETY: the caller's contract.
        return unsafe {
            if p.floor == f32::NEG_INFINITY {
                race_log_exp::<S, E, false>(row, keep, noise, n, p, base)
            } else {
                race_log_exp::<S, E, true>(row, keep, noise, n, p, base)
            }
        };
    }
    let mut best = Best::NONE;
    let mut i = 0;
    while i + S::LANES <= n {
        // SAFETY: i + LANES <= n; `S` usable (the caller's contract).
        unsafe { race_exp_vec::<S, E>(row, keep, noise, i, p, base, &mut best) };
        i += S::LANES;
    }
    while i < n {
        // SAFETY: i < n; Scalar runs anywhere.
        unsafe { race_exp_vec::<Scalar, E>(row, keep, noise, i, p, base, &mut best) };
        i += 1;
    }
    best
}

// ---------------------------------------------------------------------------------------------
// Listed tokens: the values a row's sampling step changed (`src/step/`), raced one at a time with the
// same code as the vector races, so each gets the key it would get in a row holding that value.
// ---------------------------------------------------------------------------------------------

/// `best` merged with the race of the listed `(token, value)` pairs of a row keyed by `key`,
/// whose block noise `blocks` ([`race_inline`] of the same row and key, starting at token 0)
/// holds. A token whose key cannot reach the best is skipped on its block's noise bound.
pub(crate) fn race_listed_inline(
    tokens: &[(u32, f32)],
    p: RaceParams,
    key: u64,
    blocks: &[BlockNoise],
    mut best: Best,
) -> Best {
    let k = key_words(key);
    for &(t, y) in tokens {
        race_value(y, t, blocks[t as usize / BLOCK], p, k, &mut best);
    }
    best
}

/// `best` merged with the race of the listed `(token, value)` pairs on external noise of `kind`
/// (one value per token at `noise`).
///
/// # Safety
/// `noise` valid for reads at every listed token.
pub(crate) unsafe fn race_listed_external(
    tokens: &[(u32, f32)],
    noise: *const f32,
    p: RaceParams,
    kind: NoiseKind,
    mut best: Best,
) -> Best {
    for &(t, y) in tokens {
        // SAFETY: the caller's contract.
        unsafe { race_one_external(y, t as usize, noise, p, kind, &mut best) };
    }
    best
}

/// `best` merged with the race of the listed tokens of `values` given as `(token, bound)`, an
/// upper bound of each value, on external noise of `kind`: a token whose key at its bound would
/// not change the best is skipped before its value is worked out (a key never grows as the value
/// falls: every rounding step is monotone; a tie at the bound goes to the same lower token).
///
/// # Safety
/// `noise` valid for reads at every listed token.
pub(crate) unsafe fn race_bounded_external(
    tokens: &[(u32, f32)],
    values: &dyn BlockValues,
    noise: *const f32,
    p: RaceParams,
    kind: NoiseKind,
    mut best: Best,
) -> Best {
    for &(t, bound) in tokens {
        let mut at_bound = best;
        // SAFETY: the caller's contract (twice).
        unsafe { race_one_external(bound, t as usize, noise, p, kind, &mut at_bound) };
        if (at_bound.key, at_bound.token) != (best.key, best.token) {
            // SAFETY: as above.
            unsafe { race_one_external(values.value(t), t as usize, noise, p, kind, &mut best) };
        }
    }
    best
}

/// Offers token `t` of value `y` to `best`, on external noise of `kind`: the scalar lane of the
/// vector race, so that it gets the key it would get in a row holding that value.
///
/// # Safety
/// `noise` valid for a read at `t`.
#[inline(always)]
unsafe fn race_one_external(y: f32, t: usize, noise: *const f32, p: RaceParams, kind: NoiseKind, best: &mut Best) {
    // SAFETY: the caller's contract; one value at `&y`; Scalar runs anywhere.
    unsafe {
        if kind == NoiseKind::LogExp {
            let key = log_exp_key::<Scalar, f32, true>(&y, std::ptr::null(), noise.add(t), 0, p);
            if key > f32::NEG_INFINITY {
                best.offer(key, t);
            }
        } else {
            race_exp_vec::<Scalar, f32>(&y, std::ptr::null(), noise.add(t), 0, p, t, best);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cheap bound of a block is never below its exact bound ([`block_noise`]), on a million
    /// blocks of several keys, at several distances below the row's maximum and temperatures
    /// (the bits at the edges of [`noise_bound`]'s binades are `tests/draw.rs`'
    /// `the_inline_bounds_hold_at_every_exponent_edge`).
    #[test]
    fn the_cheap_block_bound_bounds_the_exact_one() {
        for key in [0u64, 1, 0x9e37_79b9_7f4a_7c15, u64::MAX] {
            let kb = block_keys(key);
            for (m, inv_t) in [(0.0f32, 1.0f32), (20.0, 1.0), (3.0, 0.25), (1.0, 7.5)] {
                let p = RaceParams { m, inv_t, floor: f32::NEG_INFINITY };
                for b in 0..250_000u32 {
                    let bm = m - (b % 13) as f32 * 0.37;
                    let exact = block_noise::<Scalar>(b, kb, bm, p).3;
                    let cheap = cheap_bound::<Scalar>(b, kb.0, bm, p);
                    assert!(cheap >= exact, "key {key:#x} block {b}: cheap {cheap} < exact {exact}");
                }
            }
        }
    }

    #[test]
    fn ln_block_up_is_above_ln_block() {
        assert!(LN_BLOCK_UP as f64 >= (BLOCK as f64).ln());
    }
}
