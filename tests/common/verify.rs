//! What the verify suites share (`tests/verify.rs` for chains, `tests/verify_tree.rs` for draft
//! trees): the sampler they call, the acceptance uniform's reference, and a random call's
//! per-request parameters and external randomness, drawn in one order so that both files keep
//! their inputs.

use super::reference as rf;
use super::step::choice_of;
use super::TestRng;
use tokenrace::*;

/// The temperature below which a request is greedy, in the samplers of [`sampler`].
pub const GREEDY_BELOW: f32 = 1e-5;
/// The domain of the acceptance uniforms' keys (docs/semantics.md): "accept".
pub const UNIFORM_DOMAIN: u64 = 0x6163_6365_7074;

/// The acceptance uniform of a draft position whose target row has key `key`.
pub fn ref_uniform(key: u64) -> f64 {
    let bits = rf::splitmix64(key ^ UNIFORM_DOMAIN) >> 11;
    // The top cell's centre rounds to 1 in f64: the largest f64 below 1 instead.
    ((bits as f64 + 0.5) / (1u64 << 53) as f64).min(1.0 - f64::EPSILON / 2.0)
}

/// The reference's acceptance of a draft whose target probability is `p` and draft probability
/// `q`, on the uniform `u`: `u < p / q` (never when `p` is 0, always when only `q` is); `None`
/// when `u` is within 1e-9 (relative) of `p / q`, where an exact implementation may go either
/// way.
pub fn ref_accept(p: f64, q: f64, u: f64) -> Option<bool> {
    if p == 0.0 {
        Some(false)
    } else if q == 0.0 {
        Some(true)
    } else if (u - p / q).abs() <= 1e-9 * (p / q) {
        None
    } else {
        Some(u < p / q)
    }
}

/// The token a rejected draft's row emits: the winner of the race over the residual, or the
/// row's own draw `drawn` when the residual has no mass (`race.token` is `usize::MAX`); `None`
/// when the token that decides is a near tie.
pub fn ref_recovered(race: &rf::Race, drawn: &rf::Drawn) -> Option<i32> {
    if !race.near.is_empty() {
        return None;
    }
    if race.token == usize::MAX {
        // No residual mass: a draw from p.
        if !drawn.near.is_empty() {
            return None;
        }
        return Some(drawn.token as i32);
    }
    Some(race.token as i32)
}

/// A sampler at `level` on `threads` threads whose stream is seeded with `seed`.
pub fn sampler(level: SimdLevel, threads: usize, seed: u64) -> Sampler {
    let cfg = Config {
        simd: choice_of(level),
        seed: Some(seed),
        max_rows: 4096,
        threads,
        greedy_below: GREEDY_BELOW,
        ..Config::default()
    };
    Sampler::new(cfg).unwrap()
}

/// Where a call's randomness comes from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Source {
    /// Seeded requests.
    Seeded,
    /// External uniforms and E noise for the unseeded requests.
    External,
    /// The sampler's stream.
    Stream,
}

/// A random verify call: per request its drafts (a chain, or a tree where `parents` is not
/// empty), its target rows and its parameters.
#[derive(Clone)]
pub struct Call {
    pub vocab: usize,
    pub counts: Vec<i32>,
    /// The drafts' parents, empty for chains.
    pub parents: Vec<i32>,
    pub drafts: Vec<i32>,
    pub logits: Vec<f32>,
    pub q: Option<Vec<f32>>,
    pub temperature: Vec<f32>,
    pub top_k: Vec<i32>,
    pub top_p: Vec<f32>,
    pub min_p: Vec<f32>,
    pub seeds: Vec<u64>,
    pub offsets: Vec<u64>,
    pub seeded: Vec<u8>,
    pub uniforms: Option<Vec<f64>>,
    pub noise: Option<Vec<f32>>,
}

/// Per-request parameters of a random call: temperatures (greedy, hot and in between), filters
/// some of the time, seeds and offsets.
pub struct Params {
    pub temperature: Vec<f32>,
    pub top_k: Vec<i32>,
    pub top_p: Vec<f32>,
    pub min_p: Vec<f32>,
    pub seeds: Vec<u64>,
    pub offsets: Vec<u64>,
}

impl Params {
    pub fn random(rng: &mut TestRng, requests: usize) -> Params {
        let temperature = (0..requests)
            .map(|_| match rng.below(5) {
                0 => 0.0,
                1 => 2.0,
                _ => 0.3 + rng.f64() as f32,
            })
            .collect();
        let top_k = (0..requests).map(|_| if rng.below(3) == 0 { 1 + rng.below(20) as i32 } else { 0 }).collect();
        let top_p = (0..requests).map(|_| if rng.below(3) == 0 { 0.5 + 0.5 * rng.f64() as f32 } else { 1.0 }).collect();
        let min_p = (0..requests).map(|_| if rng.below(4) == 0 { 0.05 * rng.f64() as f32 } else { 0.0 }).collect();
        let seeds = (0..requests).map(|_| rng.u64()).collect();
        let offsets = (0..requests).map(|_| rng.below(1000) as u64).collect();
        Params { temperature, top_k, top_p, min_p, seeds, offsets }
    }
}

/// The caller's uniforms (one per draft, in (0, 1)) and E noise (one per logit) of a call whose
/// randomness is external; none otherwise.
pub fn external_randomness(
    rng: &mut TestRng,
    source: Source,
    drafts: usize,
    logits: usize,
) -> (Option<Vec<f64>>, Option<Vec<f32>>) {
    if source != Source::External {
        return (None, None);
    }
    let u = (0..drafts).map(|_| (rng.u64() >> 11) as f64 / (1u64 << 53) as f64 + 1e-300).collect();
    let e = (0..logits).map(|_| rng.exp() as f32).collect();
    (Some(u), Some(e))
}

impl Call {
    /// A call of these parts; `parents` empty for chains.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        vocab: usize,
        counts: Vec<i32>,
        parents: Vec<i32>,
        drafts: Vec<i32>,
        logits: Vec<f32>,
        q: Option<Vec<f32>>,
        params: Params,
        seeded: Vec<u8>,
        (uniforms, noise): (Option<Vec<f64>>, Option<Vec<f32>>),
    ) -> Call {
        let Params { temperature, top_k, top_p, min_p, seeds, offsets } = params;
        Call {
            vocab,
            counts,
            parents,
            drafts,
            logits,
            q,
            temperature,
            top_k,
            top_p,
            min_p,
            seeds,
            offsets,
            seeded,
            uniforms,
            noise,
        }
    }

    /// The call as a verify batch on `logits` (this call's logits, in some dtype), its drafts
    /// as a chain.
    pub fn chain_batch<'a>(&'a self, logits: Logits<'a>) -> VerifyBatch<'a> {
        VerifyBatch {
            draft_probs: self.q.as_ref().map(|q| DraftProbs { values: q, row_stride: self.vocab }),
            temperature: Some(&self.temperature),
            top_k: Some(&self.top_k),
            top_p: Some(&self.top_p),
            min_p: Some(&self.min_p),
            seeds: Some(&self.seeds),
            offsets: Some(&self.offsets),
            seeded: Some(&self.seeded),
            uniforms: self.uniforms.as_deref(),
            noise: self.noise.as_ref().map(|n| ExternalNoise {
                values: n,
                kind: NoiseKind::Exp,
                row_stride: self.vocab,
            }),
            ..VerifyBatch::new(logits, self.vocab, &self.counts, &self.drafts)
        }
    }

    /// Each request's first target row and first draft.
    pub fn first_rows(&self) -> (Vec<usize>, Vec<usize>) {
        let (mut rows, mut drafts, mut r, mut d) = (Vec::new(), Vec::new(), 0, 0);
        for &c in &self.counts {
            rows.push(r);
            drafts.push(d);
            r += c as usize + 1;
            d += c as usize;
        }
        (rows, drafts)
    }
}
