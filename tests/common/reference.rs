//! An independent float64 reference of what a draw returns, written from `docs/semantics.md` in
//! plain loops. It calls nothing in the crate: the only things taken from the library's source are
//! its constants (the hash's mixing constants of `src/kernels/generic/noise.rs`, the block-stream
//! key domains of `src/kernels/generic/race.rs`, the pool key domain of `src/noise/pool.rs`, the
//! SplitMix64 constants, the xoshiro256++ stream of `rand_xoshiro`); every rule is re-derived
//! from the document. Integer hashing is integer; everything else is float64.
//!
//! A test file reaches it through the shared test module: `mod common; use common::reference as rf;`
//! (`tests/reference.rs` is the test binary of the reference's own checks).
#![allow(dead_code)]

/// Tokens per block of the inline noise construction.
pub const BLOCK: usize = 256;
/// The domains of the block streams' keys (`splitmix64(row key ^ domain)`): the block minimum's
/// value, its position.
pub const MIN_KEY_DOMAIN: u64 = 0x626c_6f63_6b6d_696e;
pub const POS_KEY_DOMAIN: u64 = 0x626c_6f63_6b70_6f73;
/// The domain of pool keys (`splitmix64(row_key(seed, s) ^ domain)` for pool row s).
pub const POOL_KEY_DOMAIN: u64 = 0x706f_6f6c_6e6f_6973;
/// The documented near-tie tolerance (docs/semantics.md, "Noise"): a token j is near-tied with
/// the best token b when `k_b - k_j <= NEAR_TIE * (1 + max(|d_b|, |d_j|) + max(|ln E_b|, |ln E_j|))`.
pub const NEAR_TIE: f64 = 2e-6;
/// The row flags of the documentation.
pub const HAS_NAN: u32 = 1;
pub const HAS_POSINF: u32 = 2;
pub const EMPTY: u32 = 4;
pub const GREEDY: u32 = 8;

// ---------------------------------------------------------------------------------------------
// Keys: seeded rows, and the stream that keys unseeded rows.
// ---------------------------------------------------------------------------------------------

/// SplitMix64's output function of `x` (the state after one step is `x + golden`).
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The key of a seeded row: a pure function of (seed, offset).
pub fn row_key(seed: u64, offset: u64) -> u64 {
    splitmix64(splitmix64(seed) ^ offset)
}

/// The key of row `s` of a pool seeded with `seed`.
pub fn pool_key(seed: u64, s: u64) -> u64 {
    splitmix64(row_key(seed, s) ^ POOL_KEY_DOMAIN)
}

/// The sampler's key stream: xoshiro256++, its state filled by a SplitMix64 generator started at
/// the sampler's seed (what `rand_xoshiro`'s `seed_from_u64` does).
pub struct KeyStream {
    s: [u64; 4],
}

impl KeyStream {
    pub fn new(seed: u64) -> KeyStream {
        let mut s = [0u64; 4];
        let mut state = seed;
        for word in s.iter_mut() {
            *word = splitmix64(state);
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        }
        KeyStream { s }
    }

    pub fn next(&mut self) -> u64 {
        let s = &mut self.s;
        let out = s[0].wrapping_add(s[3]).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        out
    }
}

// ---------------------------------------------------------------------------------------------
// Inline noise.
// ---------------------------------------------------------------------------------------------

/// One round of the 32-bit avalanche mix (a bijection).
fn mix32(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

/// The 32-bit hash of counter `i` under the key words (`lo`, `hi`): two rounds of the mix.
pub fn hash32(i: u32, lo: u32, hi: u32) -> u32 {
    let h = i.wrapping_mul(0x9e37_79b9) ^ lo;
    mix32(mix32(h).wrapping_add(hi))
}

/// The low and high 32-bit words of a row key.
pub fn key_words(key: u64) -> (u32, u32) {
    (key as u32, (key >> 32) as u32)
}

/// The own bits of token `i` of the row keyed by `key`.
pub fn token_bits(key: u64, i: usize) -> u32 {
    let (lo, hi) = key_words(key);
    hash32(i as u32, lo, hi)
}

/// E = -ln U with U = (b + 0.5) 2^-32, in float64 (U is exact in float64).
pub fn exp_of_bits(b: u32) -> f64 {
    let u = (b as f64 + 0.5) / 4_294_967_296.0;
    -u.ln()
}

/// The bits of block `block`'s minimum (`h1`) and of its position (`h2`) in the row keyed by
/// `key`: the hash of the block index under the keys `splitmix64(key ^ domain)`.
pub fn block_bits(key: u64, block: u32) -> (u32, u32) {
    let (lo1, hi1) = key_words(splitmix64(key ^ MIN_KEY_DOMAIN));
    let (lo2, hi2) = key_words(splitmix64(key ^ POS_KEY_DOMAIN));
    (hash32(block, lo1, hi1), hash32(block, lo2, hi2))
}

/// The inline noise E of token `i` of the row keyed by `key`: in block `i / 256`, the block
/// minimum `E(h1) / 256` sits at position `h2 >> 24`; every other token has the minimum plus the
/// E of its own hash.
pub fn inline_noise(key: u64, i: usize) -> f64 {
    let (h1, h2) = block_bits(key, (i / BLOCK) as u32);
    let e_min = exp_of_bits(h1) / BLOCK as f64;
    if (i % BLOCK) as u32 == h2 >> 24 {
        e_min
    } else {
        e_min + exp_of_bits(token_bits(key, i))
    }
}

// ---------------------------------------------------------------------------------------------
// One row.
// ---------------------------------------------------------------------------------------------

/// Where a sampling row's noise comes from.
#[derive(Clone, Copy, Debug)]
pub enum Noise<'a> {
    /// Inline noise of this row key.
    Inline(u64),
    /// External E values, one per token.
    Exp(&'a [f32]),
    /// External ln E values, one per token.
    LogExp(&'a [f32]),
}

/// A row's filter settings as the caller gives them (0 / 1 / 0: off).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Filters {
    pub top_k: i32,
    pub top_p: f32,
    pub min_p: f32,
}

impl Filters {
    pub const OFF: Filters = Filters { top_k: 0, top_p: 1.0, min_p: 0.0 };
}

/// What the reference says of one row.
#[derive(Clone, Debug)]
pub struct Drawn {
    pub token: usize,
    pub flags: u32,
    /// Whether the token was decided by a race between finite keys (not by a rule, an infinite
    /// key or a single candidate).
    pub raced: bool,
    /// The tokens near-tied with `token` (see [`near_tie`]), which the library may return instead.
    pub near: Vec<usize>,
    /// The token closest to a near tie with `token`, and its gap in units of the tolerance (a
    /// near tie is a gap of at most 1; `usize::MAX` and infinity when there is no other key).
    pub runner_up: usize,
    pub gap: f64,
    /// Sampling rows with a finite maximum: which tokens the filters keep (every finite logit
    /// without filters). Empty otherwise.
    pub kept: Vec<bool>,
    /// The filters' cut lies within float64 rounding of a threshold: the kept set is not decided.
    pub ambiguous: bool,
    /// Whether the row is greedy.
    pub greedy: bool,
    /// fl32(1/T), capped at the largest f32 (what the filters and PROCESSED logprobs scale by).
    pub inv_t: f64,
}

/// fl32(1/T), capped at the largest f32.
pub fn inv_t32(t: f32) -> f64 {
    let inv = 1.0f32 / t;
    if inv.is_finite() {
        inv as f64
    } else {
        f32::MAX as f64
    }
}

/// The largest finite value of `x`, or -inf if there is none.
pub fn finite_max(x: &[f32]) -> f64 {
    let mut m = f64::NEG_INFINITY;
    for &v in x {
        if v.is_finite() && (v as f64) > m {
            m = v as f64;
        }
    }
    m
}

/// The lowest index of the largest non-NaN value (+inf included), or 0 if every value is NaN.
pub fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    let mut best_v = f32::NAN;
    for (i, &v) in x.iter().enumerate() {
        if v.is_nan() {
            continue;
        }
        if best_v.is_nan() || v > best_v {
            best = i;
            best_v = v;
        }
    }
    best
}

/// The flags of a row.
pub fn row_flags(x: &[f32], greedy: bool) -> u32 {
    let mut f = 0;
    if x.iter().any(|v| v.is_nan()) {
        f |= HAS_NAN;
    }
    if x.contains(&f32::INFINITY) {
        f |= HAS_POSINF;
    } else if !x.iter().any(|v| v.is_finite()) {
        f |= EMPTY;
    }
    if greedy {
        f |= GREEDY;
    }
    f
}

/// Relative tolerance of the filters' float64 comparisons (the library's own exp and summation
/// order differ from these by far less).
const FILTER_EPS: f64 = 1e-9;

/// The set the filters keep of a row with finite maximum `m`: min-p, then top-k, then top-p, each
/// on what the previous one left, with probabilities `w_i = exp((x_i - m) * inv_t)` (unnormalised)
/// over the finite logits. Returns the set and whether a cut lies within rounding of a threshold.
pub fn filter_set(x: &[f32], m: f64, inv_t: f64, f: Filters) -> (Vec<bool>, bool) {
    filter_set_with_sigma(x, m, inv_t, f, 0.0)
}

/// top-nσ's threshold `m - n * sigma` of a row, `m` and `sigma` the maximum and the population
/// standard deviation of its finite logits, summed in index order; `None` without a finite
/// logit. `sigma` stays a parameter of [`top_n_sigma_threshold_with`] so a test can check that
/// a wrong one (the variance) is told apart.
pub fn top_n_sigma_threshold(x: &[f32], n: f64) -> Option<f64> {
    top_n_sigma_threshold_with(x, n, f64::sqrt)
}

/// [`top_n_sigma_threshold`] with `sigma = spread(variance)`.
pub fn top_n_sigma_threshold_with(x: &[f32], n: f64, spread: impl Fn(f64) -> f64) -> Option<f64> {
    let finite: Vec<f64> = x.iter().filter(|v| v.is_finite()).map(|&v| v as f64).collect();
    if finite.is_empty() {
        return None;
    }
    let count = finite.len() as f64;
    let mean = finite.iter().sum::<f64>() / count;
    let variance = finite.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / count;
    let max = finite.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Some(max - n * spread(variance))
}

/// [`filter_set`] with top-nσ (`top_n_sigma <= 0`: off) applied with min-p, before top-k and
/// top-p: keep the finite `x_i >= m - n * sigma` ([`top_n_sigma_threshold`]), in logit units
/// whatever `inv_t`.
pub fn filter_set_with_sigma(x: &[f32], m: f64, inv_t: f64, f: Filters, top_n_sigma: f32) -> (Vec<bool>, bool) {
    let n = x.len();
    let mut kept: Vec<bool> = x.iter().map(|v| v.is_finite()).collect();
    let w: Vec<f64> = x.iter().map(|&v| if v.is_finite() { ((v as f64 - m) * inv_t).exp() } else { 0.0 }).collect();
    let mut ambiguous = false;

    if top_n_sigma > 0.0 {
        if let Some(threshold) = top_n_sigma_threshold(x, top_n_sigma as f64) {
            let scale = m.abs().max((m - threshold).abs()).max(1.0);
            for i in 0..n {
                if kept[i] {
                    if (x[i] as f64 - threshold).abs() <= FILTER_EPS * scale {
                        ambiguous = true;
                    }
                    if (x[i] as f64) < threshold {
                        kept[i] = false;
                    }
                }
            }
        }
    }

    // min-p: drop p_i < min_p * p_max; p_max belongs to the maximum, whose w is 1.
    if f.min_p > 0.0 {
        let min_p = f.min_p as f64;
        for i in 0..n {
            if kept[i] {
                // (The maximum's w is exactly 1 in any implementation.)
                if x[i] as f64 != m && (w[i] - min_p).abs() <= FILTER_EPS * min_p {
                    ambiguous = true;
                }
                if w[i] < min_p {
                    kept[i] = false;
                }
            }
        }
    }

    // top-k: keep every token whose logit is >= the k-th largest kept logit.
    if f.top_k > 0 && (f.top_k as usize) < n {
        let k = f.top_k as usize;
        let mut vals: Vec<f32> = (0..n).filter(|&i| kept[i]).map(|i| x[i]).collect();
        if vals.len() > k {
            vals.sort_by(|a, b| b.partial_cmp(a).unwrap());
            let kth = vals[k - 1];
            for i in 0..n {
                if kept[i] && x[i] < kth {
                    kept[i] = false;
                }
            }
        }
    }

    // top-p: the most probable kept tokens, in order, until their mass reaches top_p of the kept
    // mass; every token tied with the last one kept stays. Tokens of one logit value form a
    // group: the cut is at the first group whose cumulative mass reaches the target.
    if f.top_p < 1.0 {
        let mut order: Vec<usize> = (0..n).filter(|&i| kept[i]).collect();
        order.sort_by(|&a, &b| x[b].partial_cmp(&x[a]).unwrap().then(a.cmp(&b)));
        let z: f64 = order.iter().map(|&i| w[i]).sum();
        let target = f.top_p as f64 * z;
        let mut cum = 0.0;
        let mut before = 0.0; // cumulative mass of the groups above the current one
        let mut cut = x[*order.last().unwrap()];
        let mut j = 0;
        while j < order.len() {
            let v = x[order[j]];
            before = cum;
            while j < order.len() && x[order[j]] == v {
                cum += w[order[j]];
                j += 1;
            }
            if cum >= target {
                cut = v;
                break;
            }
        }
        // The mass above the cut group decides only below the first group: the first group is
        // always kept, however small `top_p` is (its "mass before" of 0 is no boundary).
        if (cum - target).abs() <= FILTER_EPS * z || (before > 0.0 && (before - target).abs() <= FILTER_EPS * z) {
            ambiguous = true;
        }
        for i in 0..n {
            if kept[i] && x[i] < cut {
                kept[i] = false;
            }
        }
    }
    (kept, ambiguous)
}

/// The race key's `ln E` of token `i`: NaN for a value that is not a number or negative E.
fn ln_e(noise: Noise, i: usize) -> f64 {
    match noise {
        Noise::Inline(key) => inline_noise(key, i).ln(),
        Noise::Exp(v) => {
            let e = v[i] as f64;
            if e.is_nan() || e < 0.0 {
                f64::NAN
            } else {
                e.ln() // ln 0 = -inf: an infinite key, the limit of the race
            }
        }
        Noise::LogExp(v) => v[i] as f64,
    }
}

/// Where the filters and temperature meet (`Config::filter_order`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// vLLM's: the filters judge the tempered distribution `exp((x - m) * inv_t)`.
    TemperatureFirst,
    /// llama.cpp's chain: the filters judge the untempered distribution `exp(x - m)`; the race
    /// then runs at the row's temperature over the tokens they keep.
    FiltersFirst,
}

/// The reference draw of one row at temperature `t`; rows with `t < greedy_below` are greedy.
pub fn draw(x: &[f32], t: f32, greedy_below: f32, noise: Noise, filters: Filters) -> Drawn {
    draw_ordered(x, t, greedy_below, noise, filters, Order::TemperatureFirst)
}

/// [`draw`] with the filter order: the only difference is the scale at which the filters' kept
/// set is computed (`inv_t` for TemperatureFirst, 1 for FiltersFirst); the race, and
/// `Drawn::inv_t` (what PROCESSED logprobs scale by), use the row's own `inv_t` either way.
pub fn draw_ordered(x: &[f32], t: f32, greedy_below: f32, noise: Noise, filters: Filters, order: Order) -> Drawn {
    let greedy = t < greedy_below;
    let flags = row_flags(x, greedy);
    let inv_t = inv_t32(t);
    let decided = |token: usize| Drawn {
        token,
        flags,
        raced: false,
        near: Vec::new(),
        runner_up: usize::MAX,
        gap: f64::INFINITY,
        kept: Vec::new(),
        ambiguous: false,
        greedy,
        inv_t,
    };
    if flags & EMPTY != 0 {
        return decided(0);
    }
    if greedy || flags & HAS_POSINF != 0 {
        // The lowest index of the maximum (the first +inf when there is one).
        return decided(argmax(x));
    }
    let m = finite_max(x);
    let filter_inv_t = match order {
        Order::TemperatureFirst => inv_t,
        Order::FiltersFirst => 1.0,
    };
    let (kept, ambiguous) = filter_set(x, m, filter_inv_t, filters);
    let t64 = t as f64;
    let race = race64(x, |i| kept[i], |i| ((x[i] as f64 - m) / t64, ln_e(noise, i)));
    if race.token == usize::MAX {
        // No key above -inf: the greedy token.
        return Drawn { kept, ambiguous, ..decided(argmax(x)) };
    }
    Drawn {
        token: race.token,
        flags,
        raced: race.raced,
        near: race.near,
        runner_up: race.runner_up,
        gap: race.gap,
        kept,
        ambiguous,
        greedy,
        inv_t,
    }
}

/// The float64 race's result: the lowest index of the largest key, the tokens near-tied with it,
/// and the closest of the others (see [`Drawn`]).
#[derive(Clone, Debug)]
pub struct Race {
    pub token: usize,
    pub raced: bool,
    pub near: Vec<usize>,
    pub runner_up: usize,
    pub gap: f64,
}

/// The documented near-tie tolerance between tokens with parts `(d, ln E)` `a` and `b`, keys
/// `d - ln E`.
pub fn near_tie(a: (f64, f64), b: (f64, f64)) -> f64 {
    NEAR_TIE * (1.0 + a.0.abs().max(b.0.abs()) + a.1.abs().max(b.1.abs()))
}

/// The race `argmax_i d_i - ln E_i` over the tokens `i < x.len()` that `racing` admits, with
/// `parts(i) = (d_i, ln E_i)`; keys that are NaN or -inf never win. `token` is `usize::MAX` when
/// no key is above -inf.
pub fn race64(x: &[f32], racing: impl Fn(usize) -> bool, parts: impl Fn(usize) -> (f64, f64)) -> Race {
    let mut keys: Vec<(usize, f64, (f64, f64))> = Vec::new();
    let (mut best, mut best_key) = (usize::MAX, f64::NEG_INFINITY);
    for i in 0..x.len() {
        if !racing(i) {
            continue;
        }
        let (d, l) = parts(i);
        let key = d - l;
        if key.is_nan() || key == f64::NEG_INFINITY {
            continue;
        }
        if key > best_key {
            (best, best_key) = (i, key);
        }
        keys.push((i, key, (d, l)));
    }
    let mut race = Race { token: best, raced: false, near: Vec::new(), runner_up: usize::MAX, gap: f64::INFINITY };
    if best == usize::MAX || best_key == f64::INFINITY || keys.len() < 2 {
        // An infinite key wins outright (the first of them), as does a single candidate.
        return race;
    }
    race.raced = true;
    let own = keys.iter().find(|k| k.0 == best).unwrap().2;
    for &(j, key, p) in &keys {
        if j == best {
            continue;
        }
        let gap = (best_key - key) / near_tie(own, p);
        if gap <= 1.0 {
            race.near.push(j);
        }
        if gap < race.gap {
            (race.runner_up, race.gap) = (j, gap);
        }
    }
    race
}

// ---------------------------------------------------------------------------------------------
// Logprobs.
// ---------------------------------------------------------------------------------------------

/// Which logprobs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Raw,
    Processed,
}

/// Every token's logprob (float64) of a row drawn as `d`.
pub fn logprobs(x: &[f32], d: &Drawn, mode: Mode) -> Vec<f64> {
    let n = x.len();
    let posinf = x.iter().filter(|&&v| v == f32::INFINITY).count();
    if posinf > 0 {
        let lp = -(posinf as f64).ln();
        return x.iter().map(|&v| if v == f32::INFINITY { lp } else { f64::NEG_INFINITY }).collect();
    }
    let m = finite_max(x);
    if m == f64::NEG_INFINITY {
        return vec![f64::NEG_INFINITY; n];
    }
    let processed = mode == Mode::Processed && !d.greedy;
    let (s, inside): (f64, Vec<bool>) =
        if processed { (d.inv_t, d.kept.clone()) } else { (1.0, x.iter().map(|v| v.is_finite()).collect()) };
    let mut z = 0.0;
    for i in 0..n {
        if inside[i] {
            z += ((x[i] as f64 - m) * s).exp();
        }
    }
    let ln_z = z.ln();
    (0..n).map(|i| if inside[i] { (x[i] as f64 - m) * s - ln_z } else { f64::NEG_INFINITY }).collect()
}

/// The documented logprob tolerance: `ln Σ exp` within 1e-5 of float64, plus the final rounding
/// to f32.
pub fn lp_tolerance(v: f64) -> f64 {
    1e-5 + v.abs() * 6e-8
}

/// Whether a reported logprob agrees with the reference value.
pub fn lp_close(got: f32, want: f64) -> bool {
    if want == f64::NEG_INFINITY || got == f32::NEG_INFINITY {
        return got == f32::NEG_INFINITY && want == f64::NEG_INFINITY;
    }
    got.is_finite() && (got as f64 - want).abs() <= lp_tolerance(want)
}

/// The range the rank of `token` can take: exactly the count of tokens whose logprob is `>=` its
/// own, widened by the tolerance for tokens whose reported value may round onto it.
pub fn rank_range(lp: &[f64], token: usize) -> (usize, usize) {
    let own = lp[token];
    let tol = if own.is_finite() { lp_tolerance(own) } else { 0.0 };
    let mut lo = 0;
    let mut hi = 0;
    for &v in lp {
        if v == own || v > own + tol {
            lo += 1;
        }
        if v >= own - tol {
            hi += 1;
        }
    }
    (lo, hi)
}

/// The `n` most probable tokens: logprob descending, lowest id first on ties.
pub fn top_n(lp: &[f64], n: usize) -> Vec<usize> {
    let mut ids: Vec<usize> = (0..lp.len()).collect();
    let order = |a: &usize, b: &usize| lp[*b].partial_cmp(&lp[*a]).unwrap().then(a.cmp(b));
    if n < ids.len() {
        ids.select_nth_unstable_by(n, order);
        ids.truncate(n);
    }
    ids.sort_by(order);
    ids
}

// ---------------------------------------------------------------------------------------------
// The whole sampling step (docs/semantics.md, The sampling step): masks, bias, penalties.
// ---------------------------------------------------------------------------------------------

/// What one row carries before temperature and the filters, as plain slices.
#[derive(Clone, Copy, Debug)]
pub struct RowInputs<'a> {
    /// The prompt's tokens (repetition penalty only).
    pub prompt: &'a [i32],
    /// The tokens generated so far (all three penalties; duplicates count).
    pub output: &'a [i32],
    /// r > 0; 1 is off.
    pub repetition: f32,
    /// f; 0 is off.
    pub frequency: f32,
    /// p; 0 is off.
    pub presence: f32,
    /// The penalty window: only the last `last_n` tokens of prompt ++ output count for the
    /// penalties; 0 counts every token.
    pub last_n: i32,
    /// (id, bias) pairs; pairs of one id add up, a -inf among them bans.
    pub bias_ids: &'a [i32],
    pub bias_values: &'a [f32],
    /// `Some`: the row may draw only these tokens (an empty list allows nothing).
    pub allowed: Option<&'a [i32]>,
    pub banned: &'a [i32],
    /// The row's bitmask words (xgrammar: bit j of word w allows token 32 w + j).
    pub bitmask: Option<&'a [i32]>,
    /// The stop tokens, banned while `output` holds fewer than `min_tokens` tokens.
    pub stop: &'a [i32],
    pub min_tokens: i32,
}

impl RowInputs<'_> {
    /// A row with nothing: its effective row is its logits.
    pub const NONE: RowInputs<'static> = RowInputs {
        prompt: &[],
        output: &[],
        repetition: 1.0,
        frequency: 0.0,
        presence: 0.0,
        last_n: 0,
        bias_ids: &[],
        bias_values: &[],
        allowed: None,
        banned: &[],
        bitmask: None,
        stop: &[],
        min_tokens: 0,
    };
}

/// Which tokens are masked: not in the allowed list of a restricted row, their bitmask bit
/// clear, or banned.
pub fn masked(p: &RowInputs, n: usize) -> Vec<bool> {
    let mut allowed = vec![p.allowed.is_none(); n];
    for &id in p.allowed.unwrap_or(&[]) {
        allowed[id as usize] = true;
    }
    let mut out: Vec<bool> = (0..n).map(|i| !allowed[i]).collect();
    if let Some(words) = p.bitmask {
        for (i, m) in out.iter_mut().enumerate() {
            if (words[i / 32] as u32 >> (i % 32)) & 1 == 0 {
                *m = true;
            }
        }
    }
    for &id in p.banned {
        out[id as usize] = true;
    }
    if (p.output.len() as i64) < p.min_tokens as i64 {
        for &id in p.stop {
            out[id as usize] = true;
        }
    }
    out
}

/// The effective row: steps 1-4 of the spec applied literally to every token, in f32.
/// 1. masked tokens are -inf, and stay so;
/// 2. `y = x + b` with `b` the f32 sum of the token's biases in list order (-inf if any is -inf);
/// 3. tokens of the prompt or the output, when r != 1: `y > 0 ? y / r : y * r`;
/// 4. tokens of the output, count c: `y = y - f * c`, then `y = y - p`.
///
/// Steps 3 and 4 read only the tokens of the penalty window (`last_n`): of the history
/// prompt ++ output, the last `last_n` tokens, each remembering which list it came from.
pub fn effective_row(x: &[f32], p: &RowInputs) -> Vec<f32> {
    let n = x.len();
    let masked = masked(p, n);
    // The per-token sums of the bias lists (in list order) and counts of the histories.
    let mut bias: Vec<Option<f32>> = vec![None; n];
    let mut ban = vec![false; n];
    for (&id, &v) in p.bias_ids.iter().zip(p.bias_values) {
        let i = id as usize;
        bias[i] = Some(bias[i].map_or(v, |b| b + v));
        ban[i] |= v == f32::NEG_INFINITY;
    }
    let mut in_prompt = vec![false; n];
    let mut count = vec![0usize; n];
    for (from_output, id) in penalty_window(p) {
        if from_output {
            count[id as usize] += 1;
        } else {
            in_prompt[id as usize] = true;
        }
    }
    (0..n)
        .map(|i| {
            if masked[i] {
                return f32::NEG_INFINITY;
            }
            let mut y = x[i];
            if ban[i] {
                y = f32::NEG_INFINITY;
            } else if let Some(b) = bias[i] {
                y += b;
            }
            if p.repetition != 1.0 && (in_prompt[i] || count[i] > 0) {
                y = if y > 0.0 { y / p.repetition } else { y * p.repetition };
            }
            if count[i] > 0 {
                y -= p.frequency * count[i] as f32;
                y -= p.presence;
            }
            y
        })
        .collect()
}

/// The tokens of the row's history that its penalties read, as (from the output, id): the
/// whole of prompt ++ output, or its last `last_n` tokens.
pub fn penalty_window(p: &RowInputs) -> Vec<(bool, i32)> {
    let history: Vec<(bool, i32)> =
        p.prompt.iter().map(|&id| (false, id)).chain(p.output.iter().map(|&id| (true, id))).collect();
    let skip = if p.last_n == 0 { 0 } else { history.len().saturating_sub(p.last_n as usize) };
    history[skip..].to_vec()
}

/// The reference draw of a row with step inputs: [`draw_ordered`] on the effective row `y`,
/// with HAS_NAN taken from the logits as given (`x`, masked or not).
pub fn draw_step(
    x: &[f32],
    y: &[f32],
    t: f32,
    greedy_below: f32,
    noise: Noise,
    filters: Filters,
    order: Order,
) -> Drawn {
    let mut d = draw_ordered(y, t, greedy_below, noise, filters, order);
    d.flags &= !HAS_NAN;
    if x.iter().any(|v| v.is_nan()) {
        d.flags |= HAS_NAN;
    }
    d
}

/// `full_mode = ProcessedLogits` of a row drawn as `d` from the effective row `y` at `t`: the
/// kept tokens' `y / T` (f32; greedy rows: every finite `y`, undivided), -inf elsewhere. `None`
/// for a sampling row with a +inf value, where the spec leaves the kept set open.
pub fn processed_logits(y: &[f32], d: &Drawn, t: f32) -> Option<Vec<f32>> {
    let ninf = f32::NEG_INFINITY;
    if d.flags & EMPTY != 0 {
        return Some(vec![ninf; y.len()]);
    }
    if d.greedy {
        if d.flags & HAS_POSINF != 0 {
            return None;
        }
        return Some(y.iter().map(|&v| if v.is_finite() { v } else { ninf }).collect());
    }
    if d.kept.is_empty() {
        return None;
    }
    Some((0..y.len()).map(|i| if d.kept[i] { y[i] / t } else { ninf }).collect())
}

/// The tokens a row's bad words ban after its `output` (vLLM's rule): each word's last token
/// when the output's last `len - 1` tokens are the word's others (a word of one token always;
/// a word longer than the output plus one never), in word order.
pub fn bad_word_bans(output: &[i32], words: &[Vec<i32>]) -> Vec<i32> {
    let mut bans = Vec::new();
    for word in words {
        let others = word.len() - 1;
        if others > output.len() {
            continue;
        }
        if output[output.len() - others..] == word[..others] {
            bans.push(word[others]);
        }
    }
    bans
}
