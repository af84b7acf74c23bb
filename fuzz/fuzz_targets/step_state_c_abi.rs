//! The sampling step's later inputs through the C ABI, judged by a differential oracle: a request
//! state, llama.cpp's filters (min_keep, typical, XTC, dynamic temperature), multi-token bad
//! words, forced tokens and the logprobs of given ids, over a few steps of a small batch whose
//! histories grow by the drawn tokens.
//!
//! Three samplers share one config seed: A draws with the histories passed as lists, B (another
//! SIMD level and thread count) names the same rows by request id in a `tokenrace_requests`
//! state, and C repeats only A's successful calls. The target predicts from the documented rules
//! whether each call must succeed (an id outside the vocabulary in any list, a malformed or empty
//! bad word, a forced token outside [-1, vocab), a filter value outside its range, processed
//! logprobs on a row whose filters keep a range, a request id the state does not hold), and
//! checks:
//! - the status is that prediction (never INTERNAL), with a last error naming `tokenrace_draw`;
//! - on failure nothing was written to the output arrays and the request state holds the same
//!   requests with the same output lengths (a refused `tokenrace_requests_append` included);
//! - on success A and B wrote the same bytes to every output (tokens, flags, logprobs, ranks,
//!   top-n, logprobs and ranks of the given ids): the state is the lists, bit for bit, at every
//!   level and thread count;
//! - a forced row returns its token; a drawn row never returns a token its bad words ban (unless
//!   the row was left empty), logprobs are never NaN nor above 0, ranks lie in [1, vocab];
//! - after the last step, one more valid call on A, B and C gives the same tokens: a refused call
//!   moved no sampler's noise stream.
//! - `tokenrace_score` of A's drawn tokens on a fourth sampler D reports what A reported for them
//!   (flags, logprobs, ranks, top-n, given-id logprobs), and D's stream never moves.

#![no_main]

#[path = "../common/mod.rs"]
mod common;

use arbitrary::{Result, Unstructured};
use common::sampler::Sampler;
use common::*;
use libfuzzer_sys::fuzz_target;
use std::ffi::c_void;
use tokenrace::internals::api::*;
use tokenrace::internals::types::*;
use tokenrace::SimdLevel;

const FLAG_EMPTY: u32 = 4;
const FLAG_FORCED_BANNED: u32 = 16;
const SENTINEL_TOKEN: i32 = -7;
const SENTINEL_F32: u32 = 0x7fc0_dead;

fuzz_target!(|data: &[u8]| {
    let _ = run(data);
});

fn new_sampler(seed: u64, simd: u32, threads: u32, max_rows: u32) -> Option<Sampler> {
    let mut cfg = tokenrace_config_default();
    cfg.max_rows = max_rows;
    cfg.threads = threads;
    cfg.has_seed = 1;
    cfg.seed = seed;
    cfg.simd = simd;
    cfg.log_level = 0;
    let mut s: *mut tokenrace_sampler = std::ptr::null_mut();
    // SAFETY: a valid config, a writable out.
    let st = code(unsafe { tokenrace_sampler_new(&cfg, &mut s) }, "tokenrace_sampler_new");
    (st == OK).then_some(Sampler(s))
}

fn level_supported(simd: u32) -> bool {
    match simd {
        1 => SimdLevel::Scalar.is_supported(),
        2 => SimdLevel::Portable.is_supported(),
        3 => SimdLevel::Avx2.is_supported(),
        4 => SimdLevel::Avx512.is_supported(),
        _ => true,
    }
}

/// A request state, freed on drop.
struct State(*mut c_void);

impl Drop for State {
    fn drop(&mut self) {
        // SAFETY: made by tokenrace_requests_new, freed once.
        unsafe { tokenrace_requests_free(self.0.cast()) };
    }
}

impl State {
    fn new() -> State {
        let mut p = std::ptr::null_mut();
        // SAFETY: a writable out.
        let st = code(unsafe { tokenrace_requests_new(&mut p) }, "tokenrace_requests_new");
        assert_eq!(st, OK);
        State(p.cast())
    }

    fn add(&self, id: u64, prompt: &[i32], output: &[i32]) -> u32 {
        // SAFETY: a live state; the slices cover their lengths.
        let st = unsafe {
            tokenrace_requests_add(
                self.0.cast(),
                id,
                prompt.as_ptr(),
                prompt.len() as u64,
                output.as_ptr(),
                output.len() as u64,
            )
        };
        code(st, "tokenrace_requests_add")
    }

    fn remove(&self, id: u64) -> u32 {
        // SAFETY: a live state.
        code(unsafe { tokenrace_requests_remove(self.0.cast(), id) }, "tokenrace_requests_remove")
    }

    fn append(&self, ids: &[u64], tokens: &[i32], offsets: Option<&[u64]>) -> u32 {
        // SAFETY: a live state; ids, tokens and offsets cover what the call reads.
        let st = unsafe {
            tokenrace_requests_append(
                self.0.cast(),
                ids.len() as u64,
                ids.as_ptr(),
                tokens.as_ptr(),
                offsets.map_or(std::ptr::null(), |o| o.as_ptr()),
            )
        };
        let st = code(st, "tokenrace_requests_append");
        check_last_error(st, "tokenrace_requests_append");
        st
    }

    /// Each id's output length (UINT64_MAX when not live), and how many requests it holds.
    fn shape(&self, ids: &[u64]) -> (Vec<u64>, u64) {
        let lens = ids
            .iter()
            .map(|&id| {
                let mut n = 0u64;
                // SAFETY: a live state, a writable out.
                assert_eq!(code(unsafe { tokenrace_requests_output_len(self.0.cast(), id, &mut n) }, "output_len"), OK);
                n
            })
            .collect();
        let mut len = 0u64;
        // SAFETY: a live state, a writable out.
        assert_eq!(code(unsafe { tokenrace_requests_len(self.0.cast(), &mut len) }, "len"), OK);
        (lens, len)
    }
}

/// One row's request: its histories and the step inputs that stay with it.
#[derive(Clone, Debug)]
struct Request {
    id: u64,
    prompt: Vec<i32>,
    output: Vec<i32>,
    bad_words: Vec<Vec<i32>>,
    given: Vec<i32>,
    /// Whether a call naming this request must be refused (an id outside the vocabulary in
    /// its lists, an empty bad word).
    bad: bool,
}

/// Per-row values of one call.
#[derive(Clone, Debug, Default)]
struct Rows {
    temperature: Vec<f32>,
    seeds: Vec<u64>,
    offsets: Vec<u64>,
    seeded: Vec<u8>,
    top_k: Vec<i32>,
    top_p: Vec<f32>,
    rep: Vec<f32>,
    freq: Vec<f32>,
    pres: Vec<f32>,
    last_n: Vec<i32>,
    min_keep: Vec<i32>,
    typical: Vec<f32>,
    xtc_p: Vec<f32>,
    xtc_t: Vec<f32>,
    dyn_range: Vec<f32>,
    dyn_exp: Vec<f32>,
    forced: Vec<i32>,
}

/// A CSR list of the rows' token lists.
fn csr(lists: impl Iterator<Item = Vec<i32>>) -> (Vec<i32>, Vec<u64>) {
    let mut ids = Vec::new();
    let mut offsets = vec![0u64];
    for l in lists {
        ids.extend_from_slice(&l);
        offsets.push(ids.len() as u64);
    }
    (ids, offsets)
}

/// The outputs of one call, filled with sentinels so that a refused call is seen to write none.
#[derive(PartialEq, Debug, Clone)]
struct Outputs {
    tokens: Vec<i32>,
    flags: Vec<u32>,
    logprobs: Vec<u32>,
    ranks: Vec<i32>,
    topn_ids: Vec<i32>,
    topn_logprobs: Vec<u32>,
    token_logprobs: Vec<u32>,
    token_ranks: Vec<i32>,
}

impl Outputs {
    fn new(rows: usize, top_n: usize, given: usize) -> Outputs {
        Outputs {
            tokens: vec![SENTINEL_TOKEN; rows],
            flags: vec![0xdead; rows],
            logprobs: vec![SENTINEL_F32; rows],
            ranks: vec![SENTINEL_TOKEN; rows],
            topn_ids: vec![SENTINEL_TOKEN; rows * top_n],
            topn_logprobs: vec![SENTINEL_F32; rows * top_n],
            token_logprobs: vec![SENTINEL_F32; given],
            token_ranks: vec![SENTINEL_TOKEN; given],
        }
    }
}

/// Everything one call reads, kept alive while the batch points at it.
struct Call {
    logits: Vec<f32>,
    rows: Rows,
    prompt: (Vec<i32>, Vec<u64>),
    output: (Vec<i32>, Vec<u64>),
    bad_ids: Vec<i32>,
    bad_word_offsets: Vec<u64>,
    bad_row_offsets: Vec<u64>,
    given: (Vec<i32>, Vec<u64>),
    request_ids: Vec<u64>,
    llama: bool,
    top_n: u32,
    processed: bool,
    with_ranks: bool,
}

impl Call {
    fn batch(&self, vocab: usize, state: Option<&State>) -> tokenrace_batch {
        let r = &self.rows;
        let opt = |v: &Vec<f32>, on: bool| if on { v.as_ptr() } else { std::ptr::null() };
        // SAFETY: every field of the C batch is a pointer or a number: all-zero is "every input
        // off", and the fields set below are the ones this call gives.
        let mut b: tokenrace_batch = unsafe { std::mem::zeroed() };
        b.struct_size = std::mem::size_of::<tokenrace_batch>() as u32;
        b.dtype = 0;
        b.logits = self.logits.as_ptr().cast();
        b.rows = r.temperature.len() as u32;
        b.vocab = vocab as u32;
        b.temperature = r.temperature.as_ptr();
        b.seeds = r.seeds.as_ptr();
        b.offsets = r.offsets.as_ptr();
        b.seeded = r.seeded.as_ptr();
        b.top_k = r.top_k.as_ptr();
        b.top_p = r.top_p.as_ptr();
        b.repetition_penalty = r.rep.as_ptr();
        b.frequency_penalty = r.freq.as_ptr();
        b.presence_penalty = r.pres.as_ptr();
        b.penalty_last_n = r.last_n.as_ptr();
        if let Some(s) = state {
            b.requests = s.0.cast();
            b.request_ids = self.request_ids.as_ptr();
        } else {
            b.prompt_ids = self.prompt.0.as_ptr();
            b.prompt_offsets = self.prompt.1.as_ptr();
            b.output_ids = self.output.0.as_ptr();
            b.output_offsets = self.output.1.as_ptr();
        }
        b.min_keep = if self.llama { r.min_keep.as_ptr() } else { std::ptr::null() };
        b.typical_p = opt(&r.typical, self.llama);
        b.xtc_probability = opt(&r.xtc_p, self.llama);
        b.xtc_threshold = opt(&r.xtc_t, self.llama);
        b.dynatemp_range = opt(&r.dyn_range, self.llama);
        b.dynatemp_exponent = opt(&r.dyn_exp, self.llama);
        b.bad_words_ids = self.bad_ids.as_ptr();
        b.bad_word_offsets = self.bad_word_offsets.as_ptr();
        b.bad_words_row_offsets = self.bad_row_offsets.as_ptr();
        b.forced_tokens = r.forced.as_ptr();
        b.logprob_token_ids = self.given.0.as_ptr();
        b.logprob_token_offsets = self.given.1.as_ptr();
        b
    }

    fn draw(&self, s: &Sampler, vocab: usize, state: Option<&State>) -> (u32, Outputs) {
        self.call(s, vocab, state, None)
    }

    /// `tokenrace_score` of `targets` with this call's other inputs (no seeds, offsets or
    /// forced tokens: the score refuses them).
    fn score(&self, s: &Sampler, vocab: usize, targets: &[i32]) -> (u32, Outputs) {
        self.call(s, vocab, None, Some(targets))
    }

    fn call(&self, s: &Sampler, vocab: usize, state: Option<&State>, targets: Option<&[i32]>) -> (u32, Outputs) {
        let rows = self.rows.temperature.len();
        let given = *self.given.1.last().unwrap() as usize;
        let mut o = Outputs::new(rows, self.top_n as usize, given);
        let mut batch = self.batch(vocab, state);
        if targets.is_some() {
            (batch.seeds, batch.offsets, batch.seeded, batch.forced_tokens) =
                (std::ptr::null(), std::ptr::null(), std::ptr::null(), std::ptr::null());
        }
        // SAFETY: all-zero is "every output off"; the arrays set below hold what the call writes.
        let mut out: tokenrace_output = unsafe { std::mem::zeroed() };
        out.struct_size = std::mem::size_of::<tokenrace_output>() as u32;
        out.logprob_mode = self.processed as u32;
        out.tokens = o.tokens.as_mut_ptr();
        out.flags = o.flags.as_mut_ptr();
        out.logprobs = o.logprobs.as_mut_ptr().cast();
        out.ranks = if self.with_ranks { o.ranks.as_mut_ptr() } else { std::ptr::null_mut() };
        out.top_n = self.top_n;
        out.topn_ids = o.topn_ids.as_mut_ptr();
        out.topn_logprobs = o.topn_logprobs.as_mut_ptr().cast();
        out.token_logprobs = o.token_logprobs.as_mut_ptr().cast();
        out.token_ranks = o.token_ranks.as_mut_ptr();
        // SAFETY: every pointer covers what the batch claims; targets hold one id a row.
        let (st, name) = match targets {
            None => (unsafe { tokenrace_draw(s.0, &batch, &mut out) }, "tokenrace_draw"),
            Some(t) => (unsafe { tokenrace_score(s.0, &batch, t.as_ptr(), &mut out) }, "tokenrace_score"),
        };
        let st = code(st, name);
        check_last_error(st, name);
        if st != OK {
            assert_eq!(o, Outputs::new(rows, self.top_n as usize, given), "a refused {name} wrote its output");
        }
        (st, o)
    }
}

/// A token id: mostly from a few small ids (so that histories repeat and bad words match),
/// rarely (setting `bad`) one outside the vocabulary: `vocab` or above, or with `negative` a
/// negative one (a request state refuses negative history ids when they are added, so histories
/// only take ids that a draw must refuse).
fn token(u: &mut Unstructured, vocab: usize, negative: bool, bad: &mut bool) -> Result<i32> {
    if one_in(u, 200)? {
        *bad = true;
        return Ok(if negative && u.arbitrary()? {
            -1 - u.int_in_range(0..=3)?
        } else {
            vocab as i32 + u.int_in_range(0..=2)?
        });
    }
    let small = vocab.min(6);
    Ok(if u.int_in_range(0..=3u8)? > 0 { u.int_in_range(0..=small - 1)? } else { u.int_in_range(0..=vocab - 1)? }
        as i32)
}

fn tokens(u: &mut Unstructured, vocab: usize, max: usize, negative: bool, bad: &mut bool) -> Result<Vec<i32>> {
    let n = u.int_in_range(0..=max)?;
    (0..n).map(|_| token(u, vocab, negative, bad)).collect()
}

fn pick<T: Copy>(u: &mut Unstructured, from: &[T]) -> Result<T> {
    Ok(from[u.choose_index(from.len())?])
}

/// A value from `valid`, or (rarely, setting `bad`) one from `invalid`.
fn value<T: Copy>(u: &mut Unstructured, valid: &[T], invalid: &[T], bad: &mut bool) -> Result<T> {
    if !invalid.is_empty() && one_in(u, 250)? {
        *bad = true;
        return pick(u, invalid);
    }
    pick(u, valid)
}

fn logits_row(u: &mut Unstructured, vocab: usize) -> Result<Vec<f32>> {
    let mut rng = Rng(u.arbitrary()?);
    let scale = pick(u, &[0.0f32, 0.5, 2.0, 6.0])?;
    let special = u.int_in_range(0..=4u8)?;
    Ok((0..vocab)
        .map(|_| match (special, rng.below(16)) {
            (1, 0) => f32::NEG_INFINITY,
            (2, 0) => f32::NAN,
            (3, 0) => f32::INFINITY,
            (4, _) => f32::NEG_INFINITY,
            _ => (rng.normal() as f32) * scale,
        })
        .collect())
}

fn request(u: &mut Unstructured, id: u64, vocab: usize) -> Result<Request> {
    let mut bad = false;
    let bad = &mut bad;
    let prompt = tokens(u, vocab, 24, false, bad)?;
    let output = tokens(u, vocab, 40, false, bad)?;
    let mut bad_words = Vec::new();
    for _ in 0..u.int_in_range(0..=3)? {
        let mut w = tokens(u, vocab, 3, true, bad)?;
        if w.is_empty() && !one_in(u, 80)? {
            w.push(token(u, vocab, true, bad)?);
        }
        *bad |= w.is_empty();
        bad_words.push(w);
    }
    let given = tokens(u, vocab, 3, true, bad)?;
    Ok(Request { id, prompt, output, bad_words, given, bad: *bad })
}

fn rows_of(u: &mut Unstructured, n: usize, vocab: usize, bad: &mut bool) -> Result<Rows> {
    let mut r = Rows::default();
    for _ in 0..n {
        r.temperature.push(pick(u, &[0.0f32, 0.5, 1.0, 1.0, 2.0])?);
        r.seeds.push(u.arbitrary()?);
        r.offsets.push(u.int_in_range(0..=3)?);
        r.seeded.push(u.arbitrary::<bool>()? as u8);
        r.top_k.push(pick(u, &[0i32, 0, 1, 3, 20])?);
        r.top_p.push(pick(u, &[1.0f32, 1.0, 0.9, 0.5])?);
        r.rep.push(pick(u, &[1.0f32, 1.3, 0.7])?);
        r.freq.push(pick(u, &[0.0f32, 0.5, -0.5])?);
        r.pres.push(pick(u, &[0.0f32, 1.0])?);
        r.last_n.push(pick(u, &[0i32, 0, 1, 4, 16])?);
        r.min_keep.push(value(u, &[0, 0, 1, 3], &[-1], bad)?);
        r.typical.push(value(u, &[1.0f32, 1.0, 0.9, 0.5, 0.2], &[0.0, 1.5, f32::NAN], bad)?);
        r.xtc_p.push(value(u, &[0.0f32, 0.0, 0.5, 1.0], &[1.5, -0.1], bad)?);
        r.xtc_t.push(value(u, &[0.1f32, 0.3, 0.6], &[2.0], bad)?);
        r.dyn_range.push(value(u, &[0.0f32, 0.0, 0.5], &[-1.0, f32::INFINITY], bad)?);
        r.dyn_exp.push(value(u, &[1.0f32, 2.0], &[f32::NAN], bad)?);
        let forced = if one_in(u, 4)? { u.int_in_range(0..=vocab - 1)? as i32 } else { -1 };
        r.forced.push(value(u, &[forced], &[vocab as i32, -2], bad)?);
    }
    Ok(r)
}

/// Whether row `r` keeps a range (typical, XTC or dynamic temperature on): processed logprobs are
/// refused for it.
fn keeps_range(r: &Rows, i: usize) -> bool {
    r.typical[i] < 1.0 || (r.xtc_p[i] > 0.0 && r.xtc_t[i] <= 0.5) || r.dyn_range[i] > 0.0
}

/// The tokens the bad words of `req` ban after its output (a word bans its last token when the
/// output ends with the tokens before it).
fn banned_by_words(req: &Request) -> Vec<i32> {
    req.bad_words
        .iter()
        .filter(|w| {
            let prefix = &w[..w.len() - 1];
            req.output.len() >= prefix.len() && req.output[req.output.len() - prefix.len()..] == *prefix
        })
        .map(|w| w[w.len() - 1])
        .collect()
}

fn check_success(o: &Outputs, call: &Call, reqs: &[Request], row_req: &[usize], vocab: usize) {
    for (i, &t) in o.tokens.iter().enumerate() {
        assert!(t >= 0 && (t as usize) < vocab, "row {i}: token {t} outside vocab {vocab}");
        let forced = call.rows.forced[i];
        if forced >= 0 {
            assert_eq!(t, forced, "row {i}: a forced row returned another token");
        } else {
            assert_eq!(o.flags[i] & FLAG_FORCED_BANNED, 0, "row {i}: FORCED_BANNED on a drawn row");
            if o.flags[i] & FLAG_EMPTY == 0 {
                let req = &reqs[row_req[i]];
                assert!(!banned_by_words(req).contains(&t), "row {i}: drew {t}, which its bad words ban");
            }
        }
        let lp = f32::from_bits(o.logprobs[i]);
        assert!(!lp.is_nan() && lp <= 0.0, "row {i}: logprob {lp}");
        if call.with_ranks {
            assert!(o.ranks[i] >= 1 && o.ranks[i] as usize <= vocab, "row {i}: rank {}", o.ranks[i]);
        }
    }
    for (j, (&lp, &rank)) in o.token_logprobs.iter().zip(&o.token_ranks).enumerate() {
        let lp = f32::from_bits(lp);
        assert!(!lp.is_nan() && lp <= 0.0, "given id {j}: logprob {lp}");
        assert!(rank >= 1 && rank as usize <= vocab, "given id {j}: rank {rank}");
    }
}

fn run(data: &[u8]) -> Result<()> {
    let mut u = Unstructured::new(data);
    let u = &mut u;
    let vocab: usize = match u.int_in_range(0..=9u8)? {
        0 => 1,
        1..=6 => u.int_in_range(2..=40)?,
        7 | 8 => u.int_in_range(41..=600)?,
        _ => u.int_in_range(1000..=5000)?,
    };
    let n_reqs = u.int_in_range(1..=5usize)?;
    let seed: u64 = u.arbitrary()?;
    let simd_b = pick(u, &[1u32, 2, 3, 4])?;
    let threads_b = pick(u, &[1u32, 2, 4])?;
    if !level_supported(simd_b) {
        return Ok(());
    }
    let max_rows = 8;
    let (Some(a), Some(b), Some(c), Some(d)) = (
        new_sampler(seed, 0, 1, max_rows),
        new_sampler(seed, simd_b, threads_b, max_rows),
        new_sampler(seed, 0, 1, max_rows),
        new_sampler(seed, 0, 1, max_rows),
    ) else {
        panic!("a valid config was refused: {}", last_error());
    };

    // The requests and the state holding them (ids arbitrary, distinct).
    let mut reqs = Vec::new();
    for i in 0..n_reqs {
        let id = u.arbitrary::<u64>()? ^ (i as u64) << 60;
        if reqs.iter().any(|r: &Request| r.id == id) {
            return Ok(());
        }
        reqs.push(request(u, id, vocab)?);
    }
    let state = State::new();
    for r in &reqs {
        assert_eq!(state.add(r.id, &r.prompt, &r.output), OK, "add: {}", last_error());
    }
    assert_eq!(state.add(reqs[0].id, &[], &[]), INVALID_ARGUMENT, "a live id was added twice");
    let ids: Vec<u64> = reqs.iter().map(|r| r.id).collect();

    let steps = u.int_in_range(1..=3)?;
    let mut last_ok: Option<Call> = None;
    let mut row_req_last = Vec::new();
    for _ in 0..steps {
        // The rows of this call: requests, possibly repeated (several rows may name one).
        let n_rows = u.int_in_range(1..=max_rows as usize)?;
        let row_req: Vec<usize> = (0..n_rows).map(|_| u.choose_index(n_reqs)).collect::<Result<_>>()?;
        let bad_history = row_req.iter().any(|&q| reqs[q].bad);
        let mut bad = bad_history;
        let rows = rows_of(u, n_rows, vocab, &mut bad)?;
        let llama: bool = u.arbitrary()?;
        if !llama {
            // Values the call does not pass cannot make it invalid: judge only what is seen.
            bad = bad_history;
            bad |= rows.forced.iter().any(|&f| f < -1 || f >= vocab as i32);
        }
        let processed = one_in(u, 3)?;
        if processed && llama && (0..n_rows).any(|i| keeps_range(&rows, i)) {
            bad = true;
        }
        let mut logits = Vec::with_capacity(n_rows * vocab);
        for _ in 0..n_rows {
            logits.extend(logits_row(u, vocab)?);
        }
        let of = |f: &dyn Fn(&Request) -> Vec<i32>| csr(row_req.iter().map(|&q| f(&reqs[q])));
        let mut bad_ids = Vec::new();
        let mut bad_word_offsets = vec![0u64];
        let mut bad_row_offsets = vec![0u64];
        for &q in &row_req {
            for w in &reqs[q].bad_words {
                bad_ids.extend_from_slice(w);
                bad_word_offsets.push(bad_ids.len() as u64);
            }
            bad_row_offsets.push(bad_word_offsets.len() as u64 - 1);
        }
        let mut request_ids: Vec<u64> = row_req.iter().map(|&q| reqs[q].id).collect();
        // A row naming a request the state does not hold: only B's call is refused.
        let absent = one_in(u, 40)?;
        if absent {
            request_ids[n_rows - 1] = !0 ^ reqs.iter().fold(0, |x, r| x ^ r.id);
            if ids.contains(&request_ids[n_rows - 1]) {
                return Ok(());
            }
        }
        let call = Call {
            logits,
            rows,
            prompt: of(&|r| r.prompt.clone()),
            output: of(&|r| r.output.clone()),
            bad_ids,
            bad_word_offsets,
            bad_row_offsets,
            given: of(&|r| r.given.clone()),
            request_ids,
            llama,
            top_n: pick(u, &[0u32, 0, 1, 3])?.min(vocab as u32),
            processed,
            with_ranks: u.arbitrary()?,
        };
        let before = state.shape(&ids);
        let (st_a, out_a) = call.draw(&a, vocab, None);
        let err_a = last_error();
        let (mut st_b, mut out_b) = call.draw(&b, vocab, Some(&state));
        let expect = if bad { INVALID_ARGUMENT } else { OK };
        if st_a != expect && verbose() {
            eprintln!("vocab {vocab} llama {} processed {}", call.llama, call.processed);
            eprintln!("rows {:?}\nrequests {:?}\nrow_req {row_req:?}\nlogits {:?}", call.rows, reqs, call.logits);
        }
        assert_eq!(st_a, expect, "lists: {err_a:?} (predicted {})", status_name(expect));
        let expect_b = if absent { INVALID_ARGUMENT } else { expect };
        assert_eq!(st_b, expect_b, "state: {:?} (predicted {})", last_error(), status_name(expect_b));
        assert_eq!(state.shape(&ids), before, "a draw changed the request state");
        let mut call = call;
        if absent && !bad {
            // The same call naming the right request: B's refused call moved nothing, so it now
            // draws what A drew.
            call.request_ids[n_rows - 1] = reqs[row_req[n_rows - 1]].id;
            (st_b, out_b) = call.draw(&b, vocab, Some(&state));
            assert_eq!(st_b, OK, "{}", last_error());
        }
        if st_a != OK || st_b != OK {
            continue;
        }
        if out_a != out_b {
            eprintln!(
                "vocab {vocab} simd_b {simd_b} threads_b {threads_b} llama {} processed {}",
                call.llama, call.processed
            );
            eprintln!("rows {:?}\nrequests {:?}\nrow_req {row_req:?}\nlogits {:?}", call.rows, reqs, call.logits);
        }
        assert_eq!(out_a, out_b, "the request state and the lists gave different outputs");
        check_success(&out_a, &call, &reqs, &row_req, vocab);
        let (st_c, out_c) = call.draw(&c, vocab, None);
        assert_eq!((st_c, &out_c.tokens), (OK, &out_a.tokens), "the shadow sampler drew other tokens");
        // The score of the drawn tokens reports what the draw reported for them (a row left
        // empty aside: its token 0 is scored as a banned forced token), on a sampler whose
        // stream no score moves.
        let (st_d, out_d) = call.score(&d, vocab, &out_a.tokens);
        assert_eq!(st_d, OK, "score: {}", last_error());
        for i in 0..n_rows {
            if out_a.flags[i] & FLAG_EMPTY != 0 {
                continue;
            }
            let n = call.top_n as usize;
            let what = format!("score of row {i}'s drawn token");
            assert_eq!(out_d.tokens[i], out_a.tokens[i], "{what}");
            assert_eq!(out_d.flags[i], out_a.flags[i], "{what}: flags");
            assert_eq!(out_d.logprobs[i], out_a.logprobs[i], "{what}: logprob");
            assert_eq!(out_d.ranks[i], out_a.ranks[i], "{what}: rank");
            assert_eq!(out_d.topn_ids[i * n..(i + 1) * n], out_a.topn_ids[i * n..(i + 1) * n], "{what}: top-n");
            assert_eq!(out_d.topn_logprobs[i * n..(i + 1) * n], out_a.topn_logprobs[i * n..(i + 1) * n], "{what}");
        }
        if out_a.flags.iter().all(|f| f & FLAG_EMPTY == 0) {
            assert_eq!(out_d.token_logprobs, out_a.token_logprobs, "score: the given ids' logprobs");
            assert_eq!(out_d.token_ranks, out_a.token_ranks, "score: the given ids' ranks");
        }

        // Keep the drawn tokens: the lists on the host, the state through append, one token a
        // row (a draw's tokens) or as a list per row (a verify call's accepted tokens).
        let as_lists = u.arbitrary::<bool>()?;
        let rid: Vec<u64> = row_req.iter().map(|&q| reqs[q].id).collect();
        let refuse = one_in(u, 20)?;
        let mut tokens = out_a.tokens.clone();
        if refuse {
            tokens[0] = -1; // a negative token: the whole append is refused
        }
        let st = if as_lists {
            let offsets: Vec<u64> = (0..=n_rows as u64).collect();
            state.append(&rid, &tokens, Some(&offsets))
        } else {
            state.append(&rid, &tokens, None)
        };
        if refuse {
            assert_eq!(st, INVALID_ARGUMENT);
            assert_eq!(state.shape(&ids), before, "a refused append changed the state");
            assert_eq!(state.append(&rid, &out_a.tokens, None), OK);
        } else {
            assert_eq!(st, OK, "append: {}", last_error());
        }
        for (i, &q) in row_req.iter().enumerate() {
            reqs[q].output.push(out_a.tokens[i]);
        }
        // Sometimes a request is removed and added again with the same histories.
        if one_in(u, 4)? {
            let q = u.choose_index(n_reqs)?;
            assert_eq!(state.remove(reqs[q].id), OK);
            assert_eq!(state.remove(reqs[q].id), INVALID_ARGUMENT, "a removed id was removed again");
            assert_eq!(state.add(reqs[q].id, &reqs[q].prompt, &reqs[q].output), OK);
        }
        row_req_last = row_req;
        last_ok = Some(call);
    }
    // One more call on all three: a refused call moved no stream.
    if let Some(mut call) = last_ok {
        for (i, &q) in row_req_last.iter().enumerate() {
            call.request_ids[i] = reqs[q].id;
        }
        call.output = csr(row_req_last.iter().map(|&q| reqs[q].output.clone()));
        let (sa, oa) = call.draw(&a, vocab, None);
        let (sb, ob) = call.draw(&b, vocab, Some(&state));
        let (sc, oc) = call.draw(&c, vocab, None);
        assert_eq!((sa, sb, sc), (OK, OK, OK), "{}", last_error());
        assert_eq!(oa, ob, "final call: the state and the lists differ");
        assert_eq!(oa, oc, "final call: a refused call moved a noise stream");
        // D only scored: its stream is where a fresh sampler's is.
        let fresh = new_sampler(seed, 0, 1, max_rows).unwrap();
        assert_eq!(call.draw(&d, vocab, None), call.draw(&fresh, vocab, None), "a score moved the stream");
    }
    Ok(())
}
