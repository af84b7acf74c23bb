//! The randomized driver of `tokenrace_verify` (speculative decoding) through the C entry point,
//! from a fixed list of seeds: random valid calls, and calls with exactly one defect each.
//!
//! Valid calls mix dtypes and row strides, 0 to 4 requests of 0 to 3 drafts each, draft ids
//! that are often the row's argmax (so that drafts are accepted) and sometimes vLLM's
//! placeholder -1 (rejected without reading anything by its id), draft probabilities (q rows,
//! also at a padded stride) or none (one-hot drafts), per-request temperature (greedy ones too),
//! top-k / top-p / min-p, seeds, offsets and the seeded mask, given acceptance uniforms, external
//! noise, logprobs in both modes, flags and a padded tokens stride. Defects: a draft id out of
//! range or negative but -1, a negative draft count, draft counts that do not add up to the
//! rows, a q row with a negative, NaN or +inf value or not summing to 1 (of a sampling request),
//! a uniform outside (0, 1) (of an unseeded sampling request), a q row stride whose span
//! overflows, a tokens stride below max(draft_counts) + 1, vocab 0, an output array that shares
//! memory with an input or an earlier output.
//!
//! For every call: the documented status and the start of the message, nothing written on a
//! failure, the counters (calls, rejected calls, nonfinite rows). On success: each request's count
//! in [1, drafts + 1], its emitted tokens in [0, vocab) and -1 after them, every emitted token
//! but the last equal to its draft (so a placeholder is never accepted), a greedy request's
//! tokens exactly the argmax chain, the flags the or of the rows looked at, logprobs never NaN
//! and never above 0 for emitted tokens (NaN in the padding), and the seeded, greedy and fully
//! given (uniforms and noise) requests the same on a sampler of another seed, thread count and
//! SIMD level (scalar).
//!
//! Every sampler has a twin of the same config and seed that gets every valid call (and must
//! write the same) and none of the refused ones; after every refusal both verify a batch of
//! unseeded sampling requests (their uniforms and noise from the stream, or from the attached
//! pool): the same tokens, and the same pool rows handed out and skipped.
//!
//! `cargo test --test random_verify_driver -- --nocapture` prints the count of calls per category.
mod common;

use common::reference as rf;
use common::{gen_row, last_error, pick_dist, TestRng};
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::mem::size_of;
use tokenrace::internals::api::*;
use tokenrace::internals::types::*;
use tokenrace::{Bf16, F16};

const SEEDS: [u64; 4] = [1, 2, 0x5eed_cafe_f00d, u64::MAX];
const CALLS_PER_SEED: usize = 800;
const VOCABS: [usize; 10] = [1, 2, 3, 5, 16, 100, 257, 300, 600, 1000];
const GREEDY_BELOW: f32 = 1e-5;
/// The kinds of defect `add_defect` makes (each must be reached).
const KINDS_OF_DEFECT: usize = 10;

const TOKEN_SENTINEL: i32 = -0x05a5_a5a5;
const FLAG_SENTINEL: u32 = 0xdead_beef;
const LP_SENTINEL: u32 = 0x7fc0_dead;

fn pick<T: Copy>(rng: &mut TestRng, from: &[T]) -> T {
    from[rng.below(from.len())]
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Dtype {
    F32,
    Bf16,
    F16,
}

/// One verify call as a C caller sets it.
#[derive(Clone, Debug)]
struct Case {
    vocab: usize,
    dtype: Dtype,
    row_stride: usize,
    /// The target rows as the library reads them (after the dtype's rounding), `row_stride` apart.
    logits: Vec<f32>,
    /// The `rows` field (normally sum(counts) + requests).
    rows: usize,
    counts: Vec<i32>,
    drafts: Vec<i32>,
    /// The q rows and their stride (0: vocab).
    q: Option<(Vec<f32>, u64)>,
    temperature: Option<Vec<f32>>,
    top_k: Option<Vec<i32>>,
    top_p: Option<Vec<f32>>,
    min_p: Option<Vec<f32>>,
    seeds: Option<Vec<u64>>,
    offsets: Option<Vec<u64>>,
    seeded: Option<Vec<u8>>,
    uniforms: Option<Vec<f64>>,
    /// E noise, one row per target row (stride 0: one row broadcast).
    noise: Option<(Vec<f32>, u64)>,
    tokens_stride: usize,
    want_flags: bool,
    /// `Some(mode)`: logprobs asked for.
    logprobs: Option<u32>,
    /// An output placed inside another array's bytes: (output, the other array, byte offset).
    overlap: Option<(&'static str, &'static str, usize)>,
}

impl Case {
    fn requests(&self) -> usize {
        self.counts.len()
    }
    fn width(&self) -> usize {
        if self.tokens_stride == 0 {
            self.counts.iter().map(|&c| c.max(0) as usize).max().unwrap_or(0) + 1
        } else {
            self.tokens_stride
        }
    }
    fn row(&self, r: usize) -> &[f32] {
        &self.logits[r * self.row_stride..r * self.row_stride + self.vocab]
    }
    fn temp(&self, i: usize) -> f32 {
        self.temperature.as_ref().map_or(1.0, |t| t[i])
    }
    fn seeded(&self, i: usize) -> bool {
        self.seeds.is_some() && self.seeded.as_ref().is_none_or(|m| m[i] != 0)
    }
    /// The first target row and draft index of request `i`.
    fn first(&self, i: usize) -> (usize, usize) {
        let d: usize = self.counts[..i].iter().map(|&c| c.max(0) as usize).sum();
        (d + i, d)
    }
    fn filters(&self, i: usize) -> rf::Filters {
        rf::Filters {
            top_k: self.top_k.as_ref().map_or(0, |v| v[i]),
            top_p: self.top_p.as_ref().map_or(1.0, |v| v[i]),
            min_p: self.min_p.as_ref().map_or(0.0, |v| v[i]),
        }
    }
    /// Whether request `i`'s output is a function of the batch alone (not of the sampler's
    /// stream or pool).
    fn deterministic(&self, i: usize) -> bool {
        self.temp(i) < GREEDY_BELOW || self.seeded(i) || (self.noise.is_some() && self.uniforms.is_some())
    }
}

/// A sampler, its twin (same config and seed, never sees a refused call), each with a pool of its
/// own attached or not, and the counters the sampler must report.
struct Subject {
    name: &'static str,
    ptr: *mut tokenrace_sampler,
    twin: *mut tokenrace_sampler,
    pools: Option<[*mut tokenrace_pool; 2]>,
    /// A sampler of another seed, thread count and SIMD level, for the deterministic requests.
    other: *mut tokenrace_sampler,
    vocab_size: usize,
    want: [u64; 3],
}

fn new_sampler(seed: u64, vocab_size: usize, threads: usize) -> *mut tokenrace_sampler {
    new_sampler_at(seed, vocab_size, threads, 0)
}

/// A sampler at SIMD level `simd` (a `tokenrace_simd`; 0: the best this CPU has).
fn new_sampler_at(seed: u64, vocab_size: usize, threads: usize, simd: u32) -> *mut tokenrace_sampler {
    let mut cfg = tokenrace_config_default();
    cfg.simd = simd;
    cfg.max_rows = 16;
    cfg.vocab_size = vocab_size as u32;
    cfg.threads = threads as u32;
    cfg.seed = seed;
    cfg.has_seed = 1;
    cfg.greedy_below = GREEDY_BELOW;
    let mut ptr = std::ptr::null_mut();
    // SAFETY: a valid config and a writable out pointer.
    assert_eq!(unsafe { tokenrace_sampler_new(&cfg, &mut ptr) }, tokenrace_status::Ok, "{}", last_error());
    ptr
}

fn attach_pool(s: *mut tokenrace_sampler, vocab: usize, seed: u64) -> *mut tokenrace_pool {
    let mut pc = tokenrace_pool_config_default();
    (pc.rows, pc.vocab, pc.threads, pc.has_seed, pc.seed) = (32, vocab as u32, 1, 1, seed);
    let mut p = std::ptr::null_mut();
    // SAFETY: a valid config, then two live handles.
    unsafe {
        assert_eq!(tokenrace_pool_new(&pc, &mut p), tokenrace_status::Ok, "{}", last_error());
        assert_eq!(tokenrace_sampler_attach_pool(s, p), tokenrace_status::Ok, "{}", last_error());
    }
    p
}

impl Subject {
    fn new(name: &'static str, seed: u64, vocab_size: usize, threads: usize, pool: bool) -> Subject {
        let (ptr, twin) = (new_sampler(seed, vocab_size, threads), new_sampler(seed, vocab_size, threads));
        let pools = pool.then(|| [attach_pool(ptr, vocab_size, seed ^ 5), attach_pool(twin, vocab_size, seed ^ 5)]);
        // Another seed, thread count and SIMD level (the scalar one).
        let other = new_sampler_at(seed ^ 0xffff, vocab_size, if threads == 1 { 4 } else { 1 }, 1);
        Subject { name, ptr, twin, pools, other, vocab_size, want: [0; 3] }
    }
    /// [calls, rejected_calls, nonfinite_rows].
    fn stats(&self) -> [u64; 3] {
        let mut st =
            tokenrace_sampler_stats { struct_size: size_of::<tokenrace_sampler_stats>() as u32, ..Default::default() };
        // SAFETY: a live sampler and a writable stats struct of its size.
        assert_eq!(unsafe { tokenrace_sampler_get_stats(self.ptr, &mut st) }, tokenrace_status::Ok);
        [st.calls, st.rejected_calls, st.nonfinite_rows]
    }
    fn pool_counts(&self) -> Option<[(u64, u64); 2]> {
        self.pools.map(|ps| {
            ps.map(|p| {
                let mut st = tokenrace_pool_stats {
                    struct_size: size_of::<tokenrace_pool_stats>() as u32,
                    ..Default::default()
                };
                // SAFETY: a live pool and a writable stats struct of its size.
                assert_eq!(unsafe { tokenrace_pool_get_stats(p, &mut st) }, tokenrace_status::Ok);
                (st.rows_borrowed, st.rows_skipped)
            })
        })
    }
}

impl Drop for Subject {
    fn drop(&mut self) {
        // SAFETY: each made once above, freed once.
        unsafe {
            for s in [self.ptr, self.twin, self.other] {
                tokenrace_sampler_free(s);
            }
            for p in self.pools.into_iter().flatten() {
                tokenrace_pool_free(p);
            }
        }
    }
}

/// What a verify call wrote, pre-filled with sentinels.
#[derive(PartialEq, Debug)]
struct Outs {
    tokens: Vec<i32>,
    counts: Vec<i32>,
    flags: Vec<u32>,
    logprobs: Vec<u32>,
}

impl Outs {
    fn new(case: &Case) -> Outs {
        let n = case.requests() * case.width();
        Outs {
            tokens: vec![TOKEN_SENTINEL; n],
            counts: vec![TOKEN_SENTINEL; case.requests()],
            flags: vec![FLAG_SENTINEL; case.requests()],
            logprobs: vec![LP_SENTINEL; n],
        }
    }
    fn untouched(&self) -> bool {
        self.tokens.iter().chain(&self.counts).all(|&t| t == TOKEN_SENTINEL)
            && self.flags.iter().all(|&f| f == FLAG_SENTINEL)
            && self.logprobs.iter().all(|&l| l == LP_SENTINEL)
    }
}

/// Makes the call `case` describes on `sampler`.
fn call(sampler: *mut tokenrace_sampler, case: &Case, out: &mut Outs) -> tokenrace_status {
    let logits: Vec<u8> = match case.dtype {
        Dtype::F32 => case.logits.iter().flat_map(|x| x.to_ne_bytes()).collect(),
        Dtype::Bf16 => case.logits.iter().flat_map(|&x| Bf16::from_f32(x).0.to_ne_bytes()).collect(),
        Dtype::F16 => case.logits.iter().flat_map(|&x| F16::from_f32(x).0.to_ne_bytes()).collect(),
    };
    // 8-aligned storage for the logits' bytes.
    let mut logits_buf = vec![0u64; logits.len().div_ceil(8) + 1];
    // SAFETY: the buffer holds at least logits.len() bytes.
    unsafe { std::ptr::copy_nonoverlapping(logits.as_ptr(), logits_buf.as_mut_ptr() as *mut u8, logits.len()) };
    let opt = |v: &Option<Vec<f32>>| v.as_ref().map_or(std::ptr::null(), |v| v.as_ptr());
    let mut b = tokenrace_verify_batch {
        struct_size: size_of::<tokenrace_verify_batch>() as u32,
        dtype: match case.dtype {
            Dtype::F32 => tokenrace_dtype::F32,
            Dtype::Bf16 => tokenrace_dtype::Bf16,
            Dtype::F16 => tokenrace_dtype::F16,
        } as u32,
        logits: logits_buf.as_ptr() as *const c_void,
        rows: case.rows as u32,
        vocab: case.vocab as u32,
        row_stride: case.row_stride as u64,
        requests: case.requests() as u32,
        reserved0: 0,
        draft_counts: case.counts.as_ptr(),
        draft_tokens: case.drafts.as_ptr(),
        draft_probs: case.q.as_ref().map_or(std::ptr::null(), |q| q.0.as_ptr()),
        draft_probs_row_stride: case.q.as_ref().map_or(0, |q| q.1),
        temperature: opt(&case.temperature),
        top_k: case.top_k.as_ref().map_or(std::ptr::null(), |v| v.as_ptr()),
        top_p: opt(&case.top_p),
        min_p: opt(&case.min_p),
        seeds: case.seeds.as_ref().map_or(std::ptr::null(), |v| v.as_ptr()),
        offsets: case.offsets.as_ref().map_or(std::ptr::null(), |v| v.as_ptr()),
        seeded: case.seeded.as_ref().map_or(std::ptr::null(), |v| v.as_ptr()),
        uniforms: case.uniforms.as_ref().map_or(std::ptr::null(), |v| v.as_ptr()),
        noise: case.noise.as_ref().map_or(std::ptr::null(), |n| n.0.as_ptr()),
        noise_kind: tokenrace_noise_kind::Exp as u32,
        reserved1: 0,
        noise_row_stride: case.noise.as_ref().map_or(0, |n| n.1),
        draft_parents: std::ptr::null(),
        // (The sampling step's inputs: none.)
        // SAFETY: every field left is a pointer or a size, for which zero is valid (NULL, 0).
        ..unsafe { std::mem::zeroed() }
    };
    let mut o = tokenrace_verify_output {
        struct_size: size_of::<tokenrace_verify_output>() as u32,
        logprob_mode: case.logprobs.unwrap_or(0),
        tokens: out.tokens.as_mut_ptr(),
        tokens_stride: case.tokens_stride as u64,
        counts: out.counts.as_mut_ptr(),
        flags: if case.want_flags { out.flags.as_mut_ptr() } else { std::ptr::null_mut() },
        logprobs: if case.logprobs.is_some() { out.logprobs.as_mut_ptr() as *mut f32 } else { std::ptr::null_mut() },
        accepted_nodes: std::ptr::null_mut(),
    };
    let mut keep: Vec<u64> = Vec::new();
    if let Some((output, input, at)) = case.overlap {
        // The input (or earlier output) copied into a buffer that also holds the output from
        // byte `at` on; nothing is written (the call must refuse it).
        let (src, len): (*const u8, usize) = match input {
            "logits" => (b.logits as *const u8, logits.len()),
            "draft_counts" => (b.draft_counts as *const u8, case.requests() * 4),
            "draft_tokens" => (b.draft_tokens as *const u8, case.drafts.len() * 4),
            "draft_probs" => (b.draft_probs as *const u8, case.q.as_ref().unwrap().0.len() * 4),
            _ => (o.tokens as *const u8, out.tokens.len() * 4),
        };
        let out_len =
            if output == "tokens" || output == "logprobs" { out.tokens.len() * 4 } else { case.requests() * 4 };
        keep = vec![0u64; len.max(at + out_len).div_ceil(8) + 1];
        let base = keep.as_mut_ptr() as *mut u8;
        // SAFETY: `keep` holds at least `len` bytes; `src` covers `len` bytes.
        unsafe { std::ptr::copy_nonoverlapping(src, base, len) };
        match input {
            "logits" => b.logits = base as *const c_void,
            "draft_counts" => b.draft_counts = base as *const i32,
            "draft_tokens" => b.draft_tokens = base as *const i32,
            "draft_probs" => b.draft_probs = base as *const f32,
            _ => o.tokens = base as *mut i32,
        }
        let shared = base.wrapping_add(at);
        match output {
            "tokens" => o.tokens = shared as *mut i32,
            "counts" => o.counts = shared as *mut i32,
            "flags" => o.flags = shared as *mut u32,
            _ => o.logprobs = shared as *mut f32,
        }
    }
    // SAFETY: every non-NULL pointer covers what the call's sizes say (a stride whose span
    // overflows is one the call must refuse before reading).
    let status = unsafe { tokenrace_verify(sampler, &b, &mut o) };
    drop(keep);
    status
}

/// A probability row over `vocab` tokens (sums to 1 in f32 within 1e-3): random, uniform, or
/// one-hot at `at`.
fn q_row(rng: &mut TestRng, vocab: usize, at: Option<usize>) -> Vec<f32> {
    match rng.below(4) {
        0 => vec![1.0 / vocab as f32; vocab],
        1 if at.is_some() => (0..vocab).map(|i| (Some(i) == at) as u8 as f32).collect(),
        _ => {
            let w: Vec<f64> = (0..vocab).map(|_| rng.exp().powi(2)).collect();
            let z: f64 = w.iter().sum();
            w.iter().map(|x| (x / z) as f32).collect()
        }
    }
}

fn round_to(dtype: Dtype, x: f32) -> f32 {
    match dtype {
        Dtype::F32 => x,
        Dtype::Bf16 => Bf16::from_f32(x).to_f32(),
        Dtype::F16 => F16::from_f32(x).to_f32(),
    }
}

/// A valid call on `s` of `requests` requests; `sampling`: every request an unseeded sampling
/// one with neither uniforms nor noise given (they come from the stream or the pool).
fn valid_case(rng: &mut TestRng, s: &Subject, sampling: bool) -> Case {
    let vocab = if s.vocab_size != 0 { s.vocab_size } else { pick(rng, &VOCABS) };
    let requests = if sampling { 1 + rng.below(4) } else { rng.below(5) };
    let counts: Vec<i32> = (0..requests).map(|_| rng.below(4) as i32).collect();
    let n_drafts: usize = counts.iter().map(|&c| c as usize).sum();
    let rows = n_drafts + requests;
    let dtype = pick(rng, &[Dtype::F32, Dtype::Bf16, Dtype::F16]);
    let row_stride = if rng.below(3) == 0 { vocab + 1 + rng.below(9) } else { vocab };
    let mut logits = vec![f32::INFINITY; rows.saturating_sub(1) * row_stride + if rows > 0 { vocab } else { 0 }];
    for r in 0..rows {
        let dist = pick_dist(rng);
        let row = gen_row(rng, dist, vocab);
        for (i, &v) in row.iter().enumerate() {
            logits[r * row_stride + i] = round_to(dtype, v);
        }
    }
    // Drafts: often the row's argmax, sometimes the placeholder, else any id.
    let mut drafts = Vec::with_capacity(n_drafts);
    for (i, &c) in counts.iter().enumerate() {
        let first_row = counts[..i].iter().map(|&c| c as usize).sum::<usize>() + i;
        for j in 0..c as usize {
            let row = &logits[(first_row + j) * row_stride..(first_row + j) * row_stride + vocab];
            drafts.push(match rng.below(6) {
                0 => -1,
                1 | 2 => rf::argmax(row) as i32,
                _ => rng.below(vocab) as i32,
            });
        }
    }
    let q = (rng.below(2) == 0).then(|| {
        let stride = if rng.below(3) == 0 { vocab + 3 } else { 0 };
        let at = if stride == 0 { vocab } else { stride };
        let mut v = vec![f32::NAN; n_drafts.saturating_sub(1) * at + if n_drafts > 0 { vocab } else { 0 }];
        for (d, &id) in drafts.iter().enumerate() {
            let row = q_row(rng, vocab, (id >= 0).then_some(id as usize));
            v[d * at..d * at + vocab].copy_from_slice(&row);
        }
        (v, stride as u64)
    });
    let temperature = (sampling || rng.below(4) != 0).then(|| {
        let from: &[f32] = if sampling { &[0.7, 1.0, 1.5] } else { &[0.0, 1e-6, 0.7, 1.0, 1.0, 1.5, 100.0] };
        (0..requests).map(|_| pick(rng, from)).collect()
    });
    let top_k = (rng.below(4) == 0).then(|| (0..requests).map(|_| pick(rng, &[0, 1, 3, 40, -1])).collect());
    let top_p = (rng.below(4) == 0).then(|| (0..requests).map(|_| pick(rng, &[1.0, 0.9, 0.5, 1e-3])).collect());
    let min_p = (rng.below(4) == 0).then(|| (0..requests).map(|_| pick(rng, &[0.0, 0.1, 0.5])).collect());
    let seeds = (!sampling && rng.below(3) == 0).then(|| (0..requests).map(|_| rng.u64()).collect::<Vec<_>>());
    let offsets = (seeds.is_some() && rng.below(2) == 0).then(|| (0..requests).map(|_| rng.u64() % 100).collect());
    let seeded = (seeds.is_some() && rng.below(2) == 0).then(|| (0..requests).map(|_| pick(rng, &[0u8, 1])).collect());
    let uniforms = (!sampling && rng.below(3) == 0).then(|| {
        (0..n_drafts)
            .map(|_| {
                let u = rng.f64().clamp(1e-12, 1.0 - 1e-12);
                pick(rng, &[u, u, 0.5, 1e-300])
            })
            .collect()
    });
    let noise = (!sampling && rng.below(3) == 0).then(|| {
        let stride = if rng.below(3) == 0 { 0 } else { vocab };
        let len = if stride == 0 { vocab } else { rows * vocab };
        ((0..len).map(|_| rng.exp() as f32).collect(), stride as u64)
    });
    let max_n = counts.iter().map(|&c| c as usize).max().unwrap_or(0);
    Case {
        vocab,
        dtype,
        row_stride,
        logits,
        rows,
        counts,
        drafts,
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
        tokens_stride: if rng.below(3) == 0 { max_n + 1 + rng.below(3) } else { 0 },
        want_flags: rng.below(2) == 0,
        logprobs: (rng.below(2) == 0).then(|| rng.below(2) as u32),
        overlap: None,
    }
}

/// Gives `case` one defect and says the start of the message the call must fail with (None:
/// no defect could be made this time).
fn add_defect(rng: &mut TestRng, case: &mut Case) -> Option<(&'static str, String)> {
    let n = case.requests();
    let nd = case.drafts.len();
    let vocab = case.vocab;
    match rng.below(12) {
        0 if nd > 0 => {
            let at = rng.below(nd);
            let d = pick(rng, &[vocab as i32, vocab as i32 + 7, -2, i32::MIN, i32::MAX]);
            case.drafts[at] = d;
            let (i, j) = locate(case, at);
            let want = format!(
                "batch.draft_tokens[{at}]: request {i}, draft {j}: {d} is not a token id in [0, {vocab}) nor -1 (a \
                 placeholder draft, rejected)"
            );
            Some(("bad draft id", want))
        }
        1 if n > 0 => {
            let i = rng.below(n);
            let c = pick(rng, &[-1, -3, i32::MIN]);
            case.counts[i] = c;
            Some(("negative draft count", format!("batch.draft_counts[{i}]: {c} is negative")))
        }
        2 if n > 0 => {
            // The rows field one short (every buffer still covers it).
            case.rows -= 1;
            let want =
                format!("batch.draft_counts: add up to {nd} drafts, so the {n} requests need {} target rows", nd + n);
            Some(("draft counts not adding up to the rows", want))
        }
        3 | 4 if nd > 0 => {
            // A q row of a sampling request that is not a distribution (its rows all finite, so
            // that it is planned as a sampling one).
            let at = rng.below(nd);
            let (i, j) = locate(case, at);
            let q = case.q.get_or_insert_with(|| (vec![1.0 / vocab as f32; nd * vocab], 0));
            let stride = if q.1 == 0 { vocab } else { q.1 as usize };
            let t = rng.below(vocab);
            let v = pick(rng, &[-0.5, f32::NAN, f32::INFINITY, 3.0]);
            q.0[at * stride + t] = v;
            case.temperature.get_or_insert_with(|| vec![1.0; n])[i] = 1.0;
            let (first_row, _) = case.first(i);
            for r in first_row..=first_row + case.counts[i] as usize {
                for x in 0..vocab {
                    case.logits[r * case.row_stride + x] = round_to(case.dtype, (x % 7) as f32 * 0.5);
                }
            }
            // The first bad value of the row is named: the one set here (the rest are valid).
            let why = if v == 3.0 { "sums to".to_string() } else { format!("token {t}: {v} is not") };
            Some(("bad q row", format!("batch.draft_probs[{at}]: request {i}, draft {j}: {why}")))
        }
        5 if nd > 0 => {
            let at = rng.below(nd);
            let (i, j) = locate(case, at);
            case.temperature.get_or_insert_with(|| vec![1.0; n])[i] = 1.0;
            if let Some(s) = case.seeded.as_mut() {
                s[i] = 0;
            } else {
                case.seeds = None;
                case.offsets = None;
            }
            let u = case.uniforms.get_or_insert_with(|| vec![0.5; nd]);
            let x = pick(rng, &[0.0, 1.0, -0.5, 1.5, f64::NAN, f64::INFINITY]);
            u[at] = x;
            Some(("bad uniform", format!("batch.uniforms[{at}]: request {i}, draft {j}: {x} is not in (0, 1)")))
        }
        6 if nd >= 2 => {
            let stride = pick(rng, &[1u64 << 62, u64::MAX, (isize::MAX as u64 / 4) / (nd as u64 - 1) + 1]);
            let q = case.q.get_or_insert_with(|| (vec![1.0 / vocab as f32; nd * vocab], 0));
            q.1 = stride;
            let want = format!("batch.draft_probs_row_stride: {stride} x {} rows of 4-byte elements overflows", nd - 1);
            Some(("q stride overflowing", want))
        }
        7 if case.counts.iter().any(|&c| c > 0) => {
            let max_n = case.counts.iter().map(|&c| c as usize).max().unwrap();
            case.tokens_stride = 1 + rng.below(max_n);
            let want = format!(
                "out.tokens_stride: {} is smaller than max(draft_counts) + 1 = {}",
                case.tokens_stride,
                max_n + 1
            );
            Some(("tokens stride too small", want))
        }
        8 => {
            case.vocab = 0;
            Some(("vocab 0", "batch.vocab: must be at least 1".into()))
        }
        9 | 10 if n > 0 => {
            let mut inputs = vec!["logits", "draft_counts", "tokens"];
            if nd > 0 {
                inputs.push("draft_tokens");
            }
            if case.q.is_some() && nd > 0 {
                inputs.push("draft_probs");
            }
            let input = pick(rng, &inputs);
            let outputs: &[&str] = if input == "tokens" {
                &["counts", "flags", "logprobs"]
            } else {
                &["tokens", "counts", "flags", "logprobs"]
            };
            let output = pick(rng, outputs);
            case.want_flags |= output == "flags";
            if output == "logprobs" && case.logprobs.is_none() {
                case.logprobs = Some(0);
            }
            let len = match input {
                "logits" => case.logits.len() * if case.dtype == Dtype::F32 { 4 } else { 2 },
                "draft_counts" => n * 4,
                "draft_tokens" => nd * 4,
                "draft_probs" => case.q.as_ref().unwrap().0.len() * 4,
                _ => n * case.width() * 4,
            };
            let at = 4 * rng.below((len / 4).max(1));
            case.overlap = Some((output, input, at));
            let owner = if input == "tokens" { "out" } else { "batch" };
            Some(("output overlapping an input", format!("out.{output}: overlaps {owner}.{input} (bytes")))
        }
        11 if n > 0 => {
            let i = rng.below(n);
            let t = pick(rng, &[-1.0, f32::NAN, f32::INFINITY]);
            case.temperature.get_or_insert_with(|| vec![1.0; n])[i] = t;
            Some(("bad temperature", format!("batch.temperature[{i}]: {t} is not a finite number >= 0")))
        }
        _ => None,
    }
}

/// The request and draft position of draft `at`.
fn locate(case: &Case, at: usize) -> (usize, usize) {
    let mut first = 0;
    for (i, &c) in case.counts.iter().enumerate() {
        let c = c.max(0) as usize;
        if at < first + c {
            return (i, at - first);
        }
        first += c;
    }
    unreachable!("draft {at} is in no request")
}

#[derive(Default)]
struct Counts {
    calls: BTreeMap<String, usize>,
    requests: usize,
    greedy_requests: usize,
    placeholders: usize,
    accepted: usize,
    deterministic: usize,
    twin_checks: [usize; 2],
}

/// Checks a successful call's outputs; returns the nonfinite rows it read.
fn check_valid(case: &Case, out: &Outs, counts: &mut Counts, at: &str) -> u64 {
    let w = case.width();
    let mut nonfinite = 0;
    for i in 0..case.requests() {
        let c = case.counts[i] as usize;
        let n = out.counts[i];
        assert!(1 <= n && n as usize <= c + 1, "{at}: request {i}: count {n} not in [1, {}]", c + 1);
        let n = n as usize;
        let toks = &out.tokens[i * w..(i + 1) * w];
        let (first_row, first_draft) = case.first(i);
        let drafts = &case.drafts[first_draft..first_draft + c];
        for (j, &t) in toks.iter().enumerate() {
            if j < n {
                assert!(0 <= t && (t as usize) < case.vocab, "{at}: request {i}: token {j} is {t}");
            } else {
                assert_eq!(t, -1, "{at}: request {i}: position {j} after the {n} emitted tokens");
            }
        }
        // Every emitted token but the last is an accepted draft (a placeholder never is).
        assert_eq!(&toks[..n - 1], &drafts[..n - 1], "{at}: request {i}: accepted tokens differ from the drafts");
        counts.accepted += n - 1;
        counts.placeholders += drafts.iter().filter(|&&d| d == -1).count();
        let greedy = case.temp(i) < GREEDY_BELOW;
        let mut flags = 0;
        for j in 0..n {
            let x = case.row(first_row + j);
            let f = rf::row_flags(x, greedy);
            flags |= f;
            nonfinite += (f & (rf::HAS_NAN | rf::HAS_POSINF | rf::EMPTY) != 0) as u64;
        }
        if greedy {
            // The argmax chain: accepted while the draft is the row's token.
            counts.greedy_requests += 1;
            for j in 0..n {
                let want =
                    rf::draw(case.row(first_row + j), 0.0, GREEDY_BELOW, rf::Noise::Inline(0), case.filters(i)).token;
                assert_eq!(toks[j] as usize, want, "{at}: greedy request {i}: token {j}");
                if j + 1 < n {
                    assert_eq!(drafts[j] as usize, want);
                } else if j < c {
                    assert_ne!(
                        drafts[j], want as i32,
                        "{at}: greedy request {i}: draft {j} is the argmax but was rejected"
                    );
                }
            }
        }
        if case.want_flags {
            assert_eq!(out.flags[i], flags, "{at}: request {i}: flags");
        }
        if case.logprobs.is_some() {
            for (j, &l) in out.logprobs[i * w..(i + 1) * w].iter().enumerate() {
                let l = f32::from_bits(l);
                if j < n {
                    assert!(!l.is_nan() && l <= 0.0, "{at}: request {i}: logprob {j} is {l}");
                } else {
                    assert!(l.is_nan(), "{at}: request {i}: logprob padding {j} is {l}");
                }
            }
        }
        counts.requests += 1;
    }
    nonfinite
}

/// A valid call on the twin (and, for deterministic requests, on the sampler of another seed and
/// thread count): the same outputs.
fn twin_agrees(s: &Subject, case: &Case, out: &Outs, counts: &mut Counts, at: &str) {
    let mut t = Outs::new(case);
    assert_eq!(call(s.twin, case, &mut t), tokenrace_status::Ok, "{at}: the twin: {}", last_error());
    assert_eq!(out, &t, "{at}: the twin sampler verified otherwise");
    if let Some([a, b]) = s.pool_counts() {
        assert_eq!(a, b, "{at}: pool rows (borrowed, skipped) differ from the twin's pool");
    }
    let mut o = Outs::new(case);
    assert_eq!(call(s.other, case, &mut o), tokenrace_status::Ok, "{at}: another sampler: {}", last_error());
    let w = case.width();
    for i in (0..case.requests()).filter(|&i| case.deterministic(i)) {
        counts.deterministic += 1;
        let r = i * w..(i + 1) * w;
        assert_eq!(out.counts[i], o.counts[i], "{at}: request {i} on another seed and thread count: count");
        assert_eq!(out.tokens[r.clone()], o.tokens[r.clone()], "{at}: request {i} on another seed and thread count");
        assert_eq!(
            out.logprobs[r.clone()],
            o.logprobs[r],
            "{at}: request {i} on another seed and thread count: logprobs"
        );
    }
}

fn run_seed(seed: u64, counts: &mut Counts) {
    let mut rng = TestRng::new(seed);
    let mut subjects =
        [Subject::new("any-vocab", seed ^ 0x7e, 0, 1, false), Subject::new("vocab-300-pool", seed, 300, 3, true)];
    for i in 0..CALLS_PER_SEED {
        let s = &mut subjects[rng.below(2)];
        let mut case = valid_case(&mut rng, s, false);
        let defect = if rng.below(2) == 0 { add_defect(&mut rng, &mut case) } else { None };
        let mut out = Outs::new(&case);
        let status = call(s.ptr, &case, &mut out);
        let message = last_error();
        let at = format!("seed {seed:#x} call {i} on {} [{:?}]: {case:?}", s.name, defect.as_ref().map(|d| d.0));
        match defect {
            None => {
                assert_eq!(status, tokenrace_status::Ok, "{at}: {message}");
                assert_eq!(message, "");
                s.want[0] += 1;
                s.want[2] += check_valid(&case, &out, counts, &at);
                twin_agrees(s, &case, &out, counts, &at);
                let placeholders = if case.drafts.contains(&-1) { ", placeholder drafts" } else { "" };
                let q = if case.q.is_some() { "q rows" } else { "one-hot drafts" };
                *counts.calls.entry(format!("valid: {q}{placeholders}")).or_default() += 1;
            }
            Some((category, want)) => {
                assert_eq!(status, tokenrace_status::InvalidArgument, "{at}: status ({message})");
                let want = format!("tokenrace_verify: {want}");
                assert!(message.starts_with(&want), "{at}: message {message:?} does not start {want:?}");
                assert!(out.untouched(), "{at}: the call failed but wrote its outputs");
                s.want[1] += 1;
                *counts.calls.entry(format!("invalid: {category}")).or_default() += 1;
                assert_eq!(s.stats(), s.want, "{at}: counters [calls, rejected, nonfinite rows]");
                // The twin check: unseeded sampling requests take the same uniforms and noise.
                let probe = valid_case(&mut rng, s, true);
                let mut a = Outs::new(&probe);
                let at = format!("{at}, then the twin check {probe:?}");
                assert_eq!(call(s.ptr, &probe, &mut a), tokenrace_status::Ok, "{at}: {}", last_error());
                s.want[0] += 1;
                s.want[2] += check_valid(&probe, &a, counts, &at);
                twin_agrees(s, &probe, &a, counts, &at);
                counts.twin_checks[s.pools.is_some() as usize] += 1;
            }
        }
        assert_eq!(s.stats(), s.want, "{at}: counters [calls, rejected, nonfinite rows]");
    }
}

#[test]
fn random_verify_calls_through_the_c_abi_answer_as_documented() {
    let started = std::time::Instant::now();
    let mut counts = Counts::default();
    for seed in SEEDS {
        run_seed(seed, &mut counts);
    }
    let total: usize = counts.calls.values().sum();
    let valid: usize = counts.calls.iter().filter(|(k, _)| k.starts_with("valid")).map(|(_, v)| v).sum();
    eprintln!(
        "random verify driver: {total} calls on seeds {SEEDS:x?}, {valid} valid, {} with one defect",
        total - valid
    );
    for (category, n) in &counts.calls {
        eprintln!("  {n:5}  {category}");
    }
    eprintln!(
        "  requests checked: {} ({} greedy, {} deterministic ones against another seed, thread count and level); {} \
         placeholder drafts, {} drafts accepted; twin checks after refusals [inline, pool] {:?}; {:.1?}",
        counts.requests,
        counts.greedy_requests,
        counts.deterministic,
        counts.placeholders,
        counts.accepted,
        counts.twin_checks,
        started.elapsed()
    );
    let kinds = counts.calls.keys().filter(|k| k.starts_with("invalid")).count();
    assert_eq!(kinds, KINDS_OF_DEFECT, "kinds of defect generated: {:?}", counts.calls.keys());
    assert!(counts.placeholders > 100 && counts.accepted > 100, "too few placeholders or accepted drafts");
}
