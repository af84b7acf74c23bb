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
//!
//! Requests also hold their sampling parameters (`tokenrace_requests_set_params`: temperature,
//! seed, top-k/p, min-p, top-nσ, min_keep, typical_p, the penalties and their window,
//! min_tokens with its stop ids, the logit bias, the allowed and banned lists), set before a
//! step, replaced, turned off (NULL) or refused: one value out of its range (the status, the
//! last error naming `params.<field>`, and the request's later draws drawing with its previous
//! parameters, which the comparison below shows). Each step B leaves some per-row fields NULL
//! (taking them from the rows' requests; a field B gives is every row's) and A passes, for
//! those, the arrays the requests' parameters make (the off value for a request without),
//! with a seeded request's rows at its output length when B passes no offsets. An id of a
//! request's lists outside the vocabulary is refused by the draws naming it (B naming the
//! row; A, given it in its lists, too). Some steps set `append_to_requests`: B's successful
//! draw grows each request's output by exactly its rows' tokens (a failed one by none), in
//! place of the explicit append; A's draw with the flag and no state, and a score with it,
//! are refused. On a step that does not append, `tokenrace_score` of A's tokens through the
//! state (B's batch, seeds kept) writes what the score of A's arrays writes.

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

// The per-row fields a request's parameters may give (a call's `held` bits: those B leaves NULL,
// taking them from the rows' requests; a `Rows::bad` bit: the batch's values break its rule).
const F_TEMPERATURE: u32 = 1 << 0;
/// `seeds` and `seeded` together (a batch giving either takes no seed from the requests).
const F_SEEDS: u32 = 1 << 1;
const F_OFFSETS: u32 = 1 << 2;
const F_TOP_K: u32 = 1 << 3;
const F_TOP_P: u32 = 1 << 4;
const F_MIN_P: u32 = 1 << 5;
const F_SIGMA: u32 = 1 << 6;
const F_MIN_KEEP: u32 = 1 << 7;
const F_TYPICAL: u32 = 1 << 8;
const F_REP: u32 = 1 << 9;
const F_FREQ: u32 = 1 << 10;
const F_PRES: u32 = 1 << 11;
const F_LAST_N: u32 = 1 << 12;
const F_MIN_TOKENS: u32 = 1 << 13;
const F_STOP: u32 = 1 << 14;
const F_BIAS: u32 = 1 << 15;
const F_ALLOWED: u32 = 1 << 16;
const F_BANNED: u32 = 1 << 17;
const F_HOLDABLE: u32 = (1 << 18) - 1;
/// The fields the batch gave before requests held parameters: B gives them on a step that does
/// not hold parameters.
const F_CLASSIC: u32 = F_TEMPERATURE | F_SEEDS | F_OFFSETS | F_TOP_K | F_TOP_P | F_REP | F_FREQ | F_PRES | F_LAST_N;
/// The token lists: a request whose lists name an id outside the vocabulary refuses the draws
/// that name it, and A is given those lists so that its draw is refused too.
const F_LISTS: u32 = F_STOP | F_BIAS | F_ALLOWED | F_BANNED;
// Batch-only fields (`Rows::bad` bits): XTC and dynamic temperature (given with `llama`), forced.
const F_XTC_DYN: u32 = 1 << 18;
const F_FORCED: u32 = 1 << 19;

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

impl State {
    /// `tokenrace_requests_set_params` of `p` (NULL for `None`), its status checked against the
    /// last error.
    fn set_params(&self, id: u64, p: Option<&Params>) -> u32 {
        let Some(p) = p else {
            // SAFETY: a live state; NULL params turn every parameter off.
            let st = unsafe { tokenrace_requests_set_params(self.0.cast(), id, std::ptr::null()) };
            let st = code(st, "tokenrace_requests_set_params");
            check_last_error(st, "tokenrace_requests_set_params");
            return st;
        };
        let bias_ids: Vec<i32> = p.bias.iter().map(|b| b.0).collect();
        let bias_values: Vec<f32> = p.bias.iter().map(|b| b.1).collect();
        let mut c = tokenrace_request_params_default();
        c.temperature = p.temperature;
        c.seed = p.seed.unwrap_or(0);
        c.has_seed = p.seed.is_some() as u32;
        c.top_k = p.top_k;
        c.top_p = p.top_p;
        c.min_p = p.min_p;
        c.top_n_sigma = p.sigma;
        c.min_keep = p.min_keep;
        c.typical_p = p.typical;
        c.repetition_penalty = p.rep;
        c.frequency_penalty = p.freq;
        c.presence_penalty = p.pres;
        c.penalty_last_n = p.last_n;
        c.min_tokens = p.min_tokens;
        (c.stop_ids, c.stop_len) = (p.stop.as_ptr(), p.stop.len() as u64);
        (c.bias_ids, c.bias_values, c.bias_len) = (bias_ids.as_ptr(), bias_values.as_ptr(), p.bias.len() as u64);
        if let Some(a) = &p.allowed {
            // (An empty list: a non-NULL pointer of no entries, which allows nothing.)
            (c.allowed_ids, c.allowed_len) = (a.as_ptr(), a.len() as u64);
        }
        (c.banned_ids, c.banned_len) = (p.banned.as_ptr(), p.banned.len() as u64);
        // SAFETY: a live state; every list pointer covers its length and outlives the call.
        let st = code(unsafe { tokenrace_requests_set_params(self.0.cast(), id, &c) }, "tokenrace_requests_set_params");
        check_last_error(st, "tokenrace_requests_set_params");
        st
    }
}

/// The sampling parameters the state holds for a request (the default: every one off, what a
/// request that never set any gives).
#[derive(Clone, Debug, PartialEq)]
struct Params {
    temperature: f32,
    seed: Option<u64>,
    top_k: i32,
    top_p: f32,
    min_p: f32,
    sigma: f32,
    min_keep: i32,
    typical: f32,
    rep: f32,
    freq: f32,
    pres: f32,
    last_n: i32,
    min_tokens: i32,
    stop: Vec<i32>,
    bias: Vec<(i32, f32)>,
    allowed: Option<Vec<i32>>,
    banned: Vec<i32>,
}

impl Default for Params {
    fn default() -> Params {
        Params {
            temperature: 1.0,
            seed: None,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            sigma: 0.0,
            min_keep: 0,
            typical: 1.0,
            rep: 1.0,
            freq: 0.0,
            pres: 0.0,
            last_n: 0,
            min_tokens: 0,
            stop: Vec::new(),
            bias: Vec::new(),
            allowed: None,
            banned: Vec::new(),
        }
    }
}

impl Params {
    /// The largest id its lists name (-1 for none): a draw naming the request refuses one at or
    /// above its vocabulary.
    fn largest(&self) -> i32 {
        let bias = self.bias.iter().map(|b| b.0);
        let allowed = self.allowed.iter().flatten().copied();
        self.stop.iter().copied().chain(bias).chain(allowed).chain(self.banned.iter().copied()).max().unwrap_or(-1)
    }
}

/// `from[i]` for a random i.
fn rpick<T: Copy>(rng: &mut Rng, from: &[T]) -> T {
    from[rng.below(from.len())]
}

/// True with probability 1/n.
fn rone_in(rng: &mut Rng, n: usize) -> bool {
    rng.below(n) == 0
}

/// [`token`] from `rng`.
fn rtoken(rng: &mut Rng, vocab: usize, negative: bool, bad: &mut bool) -> i32 {
    if rone_in(rng, 200) {
        *bad = true;
        let over = rng.below(3) as i32;
        return if negative && rng.below(2) == 0 { -1 - over } else { vocab as i32 + over };
    }
    (if rng.below(4) > 0 { rng.below(vocab.min(6)) } else { rng.below(vocab) }) as i32
}

/// [`tokens`] from `rng`.
fn rtokens(rng: &mut Rng, vocab: usize, max: usize, negative: bool, bad: &mut bool) -> Vec<i32> {
    let n = rng.below(max + 1);
    (0..n).map(|_| rtoken(rng, vocab, negative, bad)).collect()
}

/// [`value`] from `rng`.
fn rvalue<T: Copy>(rng: &mut Rng, valid: &[T], invalid: &[T], bad: &mut u32, field: u32) -> T {
    if rone_in(rng, 250) {
        *bad |= field;
        return rpick(rng, invalid);
    }
    rpick(rng, valid)
}

/// Parameters for a request, each field on half the time, its lists' ids rarely outside the
/// vocabulary (accepted when set). One time in eight one field breaks its rule: its name (as
/// `params.<name>` in the error) comes back with them.
fn params(rng: &mut Rng, vocab: usize) -> (Params, Option<&'static str>) {
    let mut p = Params::default();
    let mut oov = false;
    let on = |rng: &mut Rng| rng.below(2) == 0;
    if on(rng) {
        p.temperature = rpick(rng, &[0.0f32, 0.5, 1.0, 2.0]);
    }
    if on(rng) {
        p.seed = Some(rng.next());
    }
    if on(rng) {
        p.top_k = rpick(rng, &[-1i32, 1, 3, 20]);
    }
    if on(rng) {
        p.top_p = rpick(rng, &[0.9f32, 0.5, 1.0]);
    }
    if on(rng) {
        p.min_p = rpick(rng, &[0.05f32, 0.3, 1.0]);
    }
    if on(rng) {
        p.sigma = rpick(rng, &[1.0f32, 2.0, -1.0]);
    }
    if on(rng) {
        p.min_keep = rpick(rng, &[1i32, 3]);
    }
    if on(rng) {
        p.typical = rpick(rng, &[0.9f32, 0.5, 0.2]);
    }
    if on(rng) {
        p.rep = rpick(rng, &[1.3f32, 0.7]);
        p.freq = rpick(rng, &[0.0f32, 0.5, -0.5]);
        p.pres = rpick(rng, &[0.0f32, 1.0]);
        p.last_n = rpick(rng, &[0i32, 0, 1, 4, 16, 64]);
    }
    if on(rng) {
        p.min_tokens = rpick(rng, &[1i32, 3, 60]);
        p.stop = rtokens(rng, vocab, 3, false, &mut oov);
    }
    if on(rng) {
        for _ in 0..rng.below(4) {
            let id = rtoken(rng, vocab, false, &mut oov);
            p.bias.push((id, rpick(rng, &[1.0f32, -2.0, 5.0, 0.0, f32::NEG_INFINITY])));
        }
    }
    if rone_in(rng, 4) {
        p.allowed = Some(rtokens(rng, vocab, 6, false, &mut oov));
    }
    if on(rng) {
        p.banned = rtokens(rng, vocab, 3, false, &mut oov);
    }
    let broken = rone_in(rng, 8).then(|| break_one(rng, &mut p));
    (p, broken)
}

/// Gives one field of `p` a value its rule refuses; returns the field's name.
fn break_one(rng: &mut Rng, p: &mut Params) -> &'static str {
    let nan = f32::NAN;
    let inf = f32::INFINITY;
    match rng.below(16) {
        0 => {
            p.temperature = rpick(rng, &[-1.0f32, nan, inf]);
            "temperature"
        }
        1 => {
            p.top_p = rpick(rng, &[0.0f32, 1.5, nan]);
            "top_p"
        }
        2 => {
            p.min_p = rpick(rng, &[-0.1f32, 1.5, nan]);
            "min_p"
        }
        3 => {
            p.sigma = rpick(rng, &[nan, inf, -inf]);
            "top_n_sigma"
        }
        4 => {
            p.min_keep = -1;
            "min_keep"
        }
        5 => {
            p.typical = rpick(rng, &[0.0f32, 1.5, nan]);
            "typical_p"
        }
        6 => {
            p.rep = rpick(rng, &[0.0f32, -1.0, inf, nan]);
            "repetition_penalty"
        }
        7 => {
            p.freq = rpick(rng, &[nan, inf]);
            "frequency_penalty"
        }
        8 => {
            p.pres = rpick(rng, &[nan, -inf]);
            "presence_penalty"
        }
        9 => {
            p.last_n = -1 - rng.below(3) as i32;
            "penalty_last_n"
        }
        10 => {
            p.min_tokens = -1;
            "min_tokens"
        }
        11 => {
            let at = rng.below(p.stop.len() + 1);
            p.stop.insert(at, -1);
            "stop_ids"
        }
        12 => {
            p.bias.push((-1 - rng.below(3) as i32, 0.5));
            "bias_ids"
        }
        13 => {
            p.bias.push((0, rpick(rng, &[nan, inf])));
            "bias_values"
        }
        14 => {
            p.allowed.get_or_insert_with(Vec::new).push(-2);
            "allowed_ids"
        }
        _ => {
            p.banned.push(-1);
            "banned_ids"
        }
    }
}

/// Sets new parameters for `req` in the state: one time in ten none (NULL), else
/// [`params`]; a broken value must be refused naming its field, the request keeping what it
/// held.
fn set_params(rng: &mut Rng, state: &State, req: &mut Request, vocab: usize) {
    if rone_in(rng, 10) {
        assert_eq!(state.set_params(req.id, None), OK, "set_params(NULL): {}", last_error());
        req.params = Params::default();
        return;
    }
    let (p, broken) = params(rng, vocab);
    let st = state.set_params(req.id, Some(&p));
    if verbose() {
        eprintln!("set_params: {} (broken {broken:?}, largest id {})", status_name(st), p.largest());
    }
    match broken {
        None => {
            assert_eq!(st, OK, "set_params: {} ({p:?})", last_error());
            req.params = p;
        }
        Some(field) => {
            let e = last_error();
            assert_eq!(st, INVALID_ARGUMENT, "set_params accepted a bad {field}: {p:?}");
            assert!(e.contains(&format!("params.{field}: ")), "set_params: the error {e:?} names no params.{field}");
        }
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
    /// The parameters the state holds for it.
    params: Params,
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
    min_p: Vec<f32>,
    sigma: Vec<f32>,
    min_tokens: Vec<i32>,
    stop: Vec<Vec<i32>>,
    bias: Vec<Vec<(i32, f32)>>,
    /// `None`: the row draws from every token (its `allowed_rows` flag 0).
    allowed: Vec<Option<Vec<i32>>>,
    banned: Vec<Vec<i32>>,
    /// The fields (`F_*` bits) holding a value, or an id, that the draw must refuse.
    bad: u32,
}

/// The token lists of a call's rows in the batch's CSR form.
#[derive(Default)]
struct Lists {
    stop: (Vec<i32>, Vec<u64>),
    bias_ids: Vec<i32>,
    bias_values: Vec<f32>,
    bias_offsets: Vec<u64>,
    allowed: (Vec<i32>, Vec<u64>),
    allowed_rows: Vec<u8>,
    banned: (Vec<i32>, Vec<u64>),
}

impl Lists {
    fn of(r: &Rows) -> Lists {
        let (bias_ids, bias_offsets) = csr(r.bias.iter().map(|l| l.iter().map(|b| b.0).collect()));
        Lists {
            stop: csr(r.stop.iter().cloned()),
            bias_ids,
            bias_values: r.bias.iter().flatten().map(|b| b.1).collect(),
            bias_offsets,
            allowed: csr(r.allowed.iter().map(|a| a.clone().unwrap_or_default())),
            allowed_rows: r.allowed.iter().map(|a| a.is_some() as u8).collect(),
            banned: csr(r.banned.iter().cloned()),
        }
    }
}

/// Replaces the fields `held` names of `rows` by what the rows' requests hold (B leaves them
/// NULL and takes them from the state; A passes these): a request's value, or the off value
/// for a request without parameters. Where B gives no offsets, a row seeded by its request is
/// at the request's output length; with the batch's seeds, at 0 (a NULL array's).
fn hold(rows: &mut Rows, held: u32, reqs: &[Request], row_req: &[usize]) {
    let on = |f: u32| held & f != 0;
    for (i, &q) in row_req.iter().enumerate() {
        let p = &reqs[q].params;
        if on(F_TEMPERATURE) {
            rows.temperature[i] = p.temperature;
        }
        if on(F_SEEDS) {
            rows.seeds[i] = p.seed.unwrap_or(0);
            rows.seeded[i] = p.seed.is_some() as u8;
        }
        if on(F_OFFSETS) {
            rows.offsets[i] = if on(F_SEEDS) { reqs[q].output.len() as u64 } else { 0 };
        }
        if on(F_TOP_K) {
            rows.top_k[i] = p.top_k;
        }
        if on(F_TOP_P) {
            rows.top_p[i] = p.top_p;
        }
        if on(F_MIN_P) {
            rows.min_p[i] = p.min_p;
        }
        if on(F_SIGMA) {
            rows.sigma[i] = p.sigma;
        }
        if on(F_MIN_KEEP) {
            rows.min_keep[i] = p.min_keep;
        }
        if on(F_TYPICAL) {
            rows.typical[i] = p.typical;
        }
        if on(F_REP) {
            rows.rep[i] = p.rep;
        }
        if on(F_FREQ) {
            rows.freq[i] = p.freq;
        }
        if on(F_PRES) {
            rows.pres[i] = p.pres;
        }
        if on(F_LAST_N) {
            rows.last_n[i] = p.last_n;
        }
        if on(F_MIN_TOKENS) {
            rows.min_tokens[i] = p.min_tokens;
        }
        if on(F_STOP) {
            rows.stop[i] = p.stop.clone();
        }
        if on(F_BIAS) {
            rows.bias[i] = p.bias.clone();
        }
        if on(F_ALLOWED) {
            rows.allowed[i] = p.allowed.clone();
        }
        if on(F_BANNED) {
            rows.banned[i] = p.banned.clone();
        }
    }
    // (The state refused every value out of its range when it was set; an id outside the
    // vocabulary is judged by the draw's caller.)
    rows.bad &= !held;
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
    /// `Lists::of(&rows)`.
    lists: Lists,
    /// The fields (`F_*` bits) B leaves NULL, taking them from the rows' requests.
    held: u32,
    /// Whether B's draw appends its tokens to the rows' requests (`append_to_requests`).
    append: bool,
}

/// What a call does: draw, or score `targets` (with or without the call's seeds).
#[derive(Clone, Copy)]
enum Kind<'t> {
    Draw,
    Score { targets: &'t [i32], seeds: bool },
}

/// `v`'s pointer when `on`, else NULL.
fn given_if<T>(on: bool, v: &[T]) -> *const T {
    if on {
        v.as_ptr()
    } else {
        std::ptr::null()
    }
}

impl Call {
    /// The batch of this call: A's (`state` None) gives every per-row array; B's names its rows
    /// in `state` and leaves the `held` fields NULL (they come from the rows' requests).
    fn batch(&self, vocab: usize, state: Option<&State>) -> tokenrace_batch {
        let r = &self.rows;
        let l = &self.lists;
        let give = |f: u32| state.is_none() || self.held & f == 0;
        // SAFETY: every field of the C batch is a pointer or a number: all-zero is "every input
        // off", and the fields set below are the ones this call gives.
        let mut b: tokenrace_batch = unsafe { std::mem::zeroed() };
        b.struct_size = std::mem::size_of::<tokenrace_batch>() as u32;
        b.dtype = 0;
        b.logits = self.logits.as_ptr().cast();
        b.rows = r.temperature.len() as u32;
        b.vocab = vocab as u32;
        b.temperature = given_if(give(F_TEMPERATURE), &r.temperature);
        b.seeds = given_if(give(F_SEEDS), &r.seeds);
        b.seeded = given_if(give(F_SEEDS), &r.seeded);
        b.offsets = given_if(give(F_OFFSETS), &r.offsets);
        b.top_k = given_if(give(F_TOP_K), &r.top_k);
        b.top_p = given_if(give(F_TOP_P), &r.top_p);
        b.min_p = given_if(give(F_MIN_P), &r.min_p);
        b.top_n_sigma = given_if(give(F_SIGMA), &r.sigma);
        b.repetition_penalty = given_if(give(F_REP), &r.rep);
        b.frequency_penalty = given_if(give(F_FREQ), &r.freq);
        b.presence_penalty = given_if(give(F_PRES), &r.pres);
        b.penalty_last_n = given_if(give(F_LAST_N), &r.last_n);
        b.min_tokens = given_if(give(F_MIN_TOKENS), &r.min_tokens);
        if give(F_STOP) {
            (b.stop_ids, b.stop_offsets) = (l.stop.0.as_ptr(), l.stop.1.as_ptr());
        }
        if give(F_BIAS) {
            (b.bias_ids, b.bias_values, b.bias_offsets) =
                (l.bias_ids.as_ptr(), l.bias_values.as_ptr(), l.bias_offsets.as_ptr());
        }
        if give(F_ALLOWED) {
            (b.allowed_ids, b.allowed_offsets, b.allowed_rows) =
                (l.allowed.0.as_ptr(), l.allowed.1.as_ptr(), l.allowed_rows.as_ptr());
        }
        if give(F_BANNED) {
            (b.banned_ids, b.banned_offsets) = (l.banned.0.as_ptr(), l.banned.1.as_ptr());
        }
        if let Some(s) = state {
            b.requests = s.0.cast();
            b.request_ids = self.request_ids.as_ptr();
        } else {
            b.prompt_ids = self.prompt.0.as_ptr();
            b.prompt_offsets = self.prompt.1.as_ptr();
            b.output_ids = self.output.0.as_ptr();
            b.output_offsets = self.output.1.as_ptr();
        }
        b.min_keep = given_if(give(F_MIN_KEEP), &r.min_keep);
        b.typical_p = given_if(give(F_TYPICAL), &r.typical);
        b.xtc_probability = given_if(self.llama, &r.xtc_p);
        b.xtc_threshold = given_if(self.llama, &r.xtc_t);
        b.dynatemp_range = given_if(self.llama, &r.dyn_range);
        b.dynatemp_exponent = given_if(self.llama, &r.dyn_exp);
        b.bad_words_ids = self.bad_ids.as_ptr();
        b.bad_word_offsets = self.bad_word_offsets.as_ptr();
        b.bad_words_row_offsets = self.bad_row_offsets.as_ptr();
        b.forced_tokens = r.forced.as_ptr();
        b.logprob_token_ids = self.given.0.as_ptr();
        b.logprob_token_offsets = self.given.1.as_ptr();
        b
    }

    /// The draw: through `state` (B's batch, appending its tokens when the call says so) or
    /// with the lists.
    fn draw(&self, s: &Sampler, vocab: usize, state: Option<&State>) -> (u32, Outputs) {
        self.call(s, vocab, state, Kind::Draw, state.is_some() && self.append)
    }

    /// `tokenrace_score` of `targets` with this call's other inputs but its seeds, offsets and
    /// forced tokens (the score refuses forced tokens; without seeds every row is scored as
    /// unseeded).
    fn score(&self, s: &Sampler, vocab: usize, targets: &[i32]) -> (u32, Outputs) {
        self.call(s, vocab, None, Kind::Score { targets, seeds: false }, false)
    }

    /// `tokenrace_score` of `targets` with this call's seeds and offsets (read by XTC rows),
    /// through `state` (B's batch: the fields it leaves NULL from the rows' requests) or with
    /// the lists.
    fn score_seeded(&self, s: &Sampler, vocab: usize, state: Option<&State>, targets: &[i32]) -> (u32, Outputs) {
        self.call(s, vocab, state, Kind::Score { targets, seeds: true }, false)
    }

    /// The call with `append_to_requests` set on A's batch (no state) or in a score: refused,
    /// naming the flag, whatever else it holds.
    fn refused_append(&self, s: &Sampler, vocab: usize, targets: Option<&[i32]>) {
        let kind = targets.map_or(Kind::Draw, |targets| Kind::Score { targets, seeds: false });
        let (st, _) = self.call(s, vocab, None, kind, true);
        let e = last_error();
        assert_eq!(st, INVALID_ARGUMENT, "append_to_requests without requests or in a score was accepted");
        assert!(e.contains("append_to_requests"), "append_to_requests refused with {e:?}");
    }

    fn call(&self, s: &Sampler, vocab: usize, state: Option<&State>, kind: Kind, append: bool) -> (u32, Outputs) {
        let rows = self.rows.temperature.len();
        let given = *self.given.1.last().unwrap() as usize;
        let mut o = Outputs::new(rows, self.top_n as usize, given);
        let mut batch = self.batch(vocab, state);
        let targets = match kind {
            Kind::Draw => None,
            Kind::Score { targets, seeds } => {
                batch.forced_tokens = std::ptr::null();
                if !seeds {
                    (batch.seeds, batch.offsets, batch.seeded) = (std::ptr::null(), std::ptr::null(), std::ptr::null());
                }
                Some(targets)
            }
        };
        batch.append_to_requests = append as u32;
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

/// A value from `valid`, or (rarely, setting `field` in `bad`) one from `invalid`.
fn value<T: Copy>(u: &mut Unstructured, valid: &[T], invalid: &[T], bad: &mut u32, field: u32) -> Result<T> {
    if !invalid.is_empty() && one_in(u, 250)? {
        *bad |= field;
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
    Ok(Request { id, prompt, output, bad_words, given, params: Params::default(), bad: *bad })
}

/// The batch's per-row values (the `bad` bits mark the fields given a value their rule refuses
/// or an id outside the vocabulary).
fn rows_of(u: &mut Unstructured, rng: &mut Rng, n: usize, vocab: usize) -> Result<Rows> {
    let mut r = Rows::default();
    let mut bad = 0u32;
    let b = &mut bad;
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
        r.last_n.push(pick(u, &[0i32, 0, 1, 4, 16, 64])?);
        r.min_keep.push(value(u, &[0, 0, 1, 3], &[-1], b, F_MIN_KEEP)?);
        r.typical.push(value(u, &[1.0f32, 1.0, 0.9, 0.5, 0.2], &[0.0, 1.5, f32::NAN], b, F_TYPICAL)?);
        r.xtc_p.push(value(u, &[0.0f32, 0.0, 0.5, 1.0], &[1.5, -0.1], b, F_XTC_DYN)?);
        r.xtc_t.push(value(u, &[0.1f32, 0.3, 0.6], &[2.0], b, F_XTC_DYN)?);
        r.dyn_range.push(value(u, &[0.0f32, 0.0, 0.5], &[-1.0, f32::INFINITY], b, F_XTC_DYN)?);
        r.dyn_exp.push(value(u, &[1.0f32, 2.0], &[f32::NAN], b, F_XTC_DYN)?);
        let forced = if one_in(u, 4)? { u.int_in_range(0..=vocab - 1)? as i32 } else { -1 };
        r.forced.push(value(u, &[forced], &[vocab as i32, -2], b, F_FORCED)?);
        // (The fields requests may also hold come from `rng`: short inputs reach them too.)
        r.min_p.push(rvalue(rng, &[0.0f32, 0.0, 0.05, 0.3], &[-0.5, 1.5, f32::NAN], b, F_MIN_P));
        r.sigma.push(rvalue(rng, &[0.0f32, 0.0, 1.0, -1.0], &[f32::NAN, f32::INFINITY], b, F_SIGMA));
        r.min_tokens.push(rvalue(rng, &[0i32, 0, 2, 60], &[-1], b, F_MIN_TOKENS));
        let mut oov = [false; 4];
        r.stop.push(rtokens(rng, vocab, 2, true, &mut oov[0]));
        let mut bias = Vec::new();
        for _ in 0..rng.below(3) {
            let id = rtoken(rng, vocab, true, &mut oov[1]);
            let values = [1.0f32, -2.0, 0.0, f32::NEG_INFINITY];
            bias.push((id, rvalue(rng, &values, &[f32::NAN, f32::INFINITY], b, F_BIAS)));
        }
        r.bias.push(bias);
        r.allowed.push(if rone_in(rng, 4) { Some(rtokens(rng, vocab, 4, true, &mut oov[2])) } else { None });
        r.banned.push(rtokens(rng, vocab, 2, true, &mut oov[3]));
        for (f, o) in [F_STOP, F_BIAS, F_ALLOWED, F_BANNED].into_iter().zip(oov) {
            if o {
                *b |= f;
            }
        }
    }
    r.bad = bad;
    Ok(r)
}

/// Whether row `r` keeps a range (typical, or with `llama` XTC or dynamic temperature on):
/// processed logprobs are refused for it.
fn keeps_range(r: &Rows, i: usize, llama: bool) -> bool {
    r.typical[i] < 1.0 || (llama && ((r.xtc_p[i] > 0.0 && r.xtc_t[i] <= 0.5) || r.dyn_range[i] > 0.0))
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

/// Each request id's output length grown by one for each row that names it (a draw that
/// appended its tokens).
fn grown(shape: &(Vec<u64>, u64), ids: &[u64], rows: &[u64]) -> (Vec<u64>, u64) {
    let mut lens = shape.0.clone();
    for id in rows {
        lens[ids.iter().position(|x| x == id).expect("a live id")] += 1;
    }
    (lens, shape.1)
}

/// Which fields B leaves NULL this step: on a step that holds parameters, each field three
/// times in four; else only fields the batch did not give before requests held parameters,
/// each three times in four (their values come from the state then as on any step).
fn held_fields(rng: &mut Rng) -> u32 {
    let holds = rng.below(2) == 0;
    let mut held = 0;
    for bit in 0..F_HOLDABLE.count_ones() {
        let f = 1 << bit;
        if (holds || f & F_CLASSIC == 0) && !rone_in(rng, 4) {
            held |= f;
        }
    }
    held
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
    // The choices of the parameters requests hold, the fields B leaves NULL and the append flag
    // (a short input reaches them all).
    let rng = &mut Rng(u.arbitrary()?);
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
    // An id the state does not hold.
    let absent_id = !0 ^ reqs.iter().fold(0, |x, r| x ^ r.id);
    if ids.contains(&absent_id) {
        return Ok(());
    }
    for r in reqs.iter_mut() {
        if rng.below(2) == 0 {
            set_params(rng, &state, r, vocab);
        }
    }

    let steps = u.int_in_range(1..=3)?;
    let mut last_ok: Option<Call> = None;
    let mut row_req_last = Vec::new();
    for _ in 0..steps {
        // New parameters for some requests (refused ones keep what they held); rarely for an
        // id the state lacks, which is refused and changes nothing.
        for r in reqs.iter_mut() {
            if rone_in(rng, 4) {
                set_params(rng, &state, r, vocab);
            }
        }
        if rone_in(rng, 30) {
            let before = state.shape(&ids);
            assert_eq!(state.set_params(absent_id, Some(&Params::default())), INVALID_ARGUMENT);
            assert_eq!(state.shape(&ids), before, "a refused set_params changed the state");
        }
        // The rows of this call: requests, possibly repeated (several rows may name one).
        let n_rows = u.int_in_range(1..=max_rows as usize)?;
        let row_req: Vec<usize> = (0..n_rows).map(|_| u.choose_index(n_reqs)).collect::<Result<_>>()?;
        let bad_history = row_req.iter().any(|&q| reqs[q].bad);
        let mut rows = rows_of(u, rng, n_rows, vocab)?;
        let llama: bool = u.arbitrary()?;
        let mut held = held_fields(rng);
        // A request whose lists name an id outside the vocabulary: B's draw is refused naming
        // the first such row; A is given those lists, so that its draw is refused too.
        let oov_row = row_req.iter().position(|&q| reqs[q].params.largest() >= vocab as i32);
        if oov_row.is_some() {
            held |= F_LISTS;
        }
        hold(&mut rows, held, &reqs, &row_req);
        let processed = one_in(u, 3)?;
        // Values the call does not pass cannot make it invalid: judge only what is seen.
        let seen = F_HOLDABLE | F_FORCED | if llama { F_XTC_DYN } else { 0 };
        let mut bad = bad_history || rows.bad & seen != 0 || oov_row.is_some();
        if processed && (0..n_rows).any(|i| keeps_range(&rows, i, llama)) {
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
            request_ids[n_rows - 1] = absent_id;
        }
        let lists = Lists::of(&rows);
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
            lists,
            held,
            append: rng.below(2) == 0,
        };
        if verbose() {
            eprintln!(
                "step: vocab {vocab} rows {n_rows} held {held:#x} append {} bad {bad} absent {absent} oov {oov_row:?}",
                call.append
            );
        }
        // The flag without a state (A's batch) is refused and moves nothing.
        if rone_in(rng, 25) {
            call.refused_append(&a, vocab, None);
        }
        let before = state.shape(&ids);
        let (st_a, out_a) = call.draw(&a, vocab, None);
        let err_a = last_error();
        let (mut st_b, mut out_b) = call.draw(&b, vocab, Some(&state));
        let err_b = last_error();
        if verbose() {
            eprintln!("draws: A {} B {} ({err_b})", status_name(st_a), status_name(st_b));
        }
        let expect = if bad { INVALID_ARGUMENT } else { OK };
        if st_a != expect && verbose() {
            eprintln!("vocab {vocab} llama {} processed {} held {held:#x}", call.llama, call.processed);
            eprintln!("rows {:?}\nrequests {:?}\nrow_req {row_req:?}\nlogits {:?}", call.rows, reqs, call.logits);
        }
        assert_eq!(st_a, expect, "lists: {err_a:?} (predicted {})", status_name(expect));
        let expect_b = if absent { INVALID_ARGUMENT } else { expect };
        assert_eq!(st_b, expect_b, "state: {err_b:?} (predicted {})", status_name(expect_b));
        let only_oov = oov_row.is_some() && !absent && !bad_history && call.rows.bad & seen == 0 && {
            !(processed && (0..n_rows).any(|i| keeps_range(&call.rows, i, llama)))
        };
        if let (true, Some(r)) = (only_oov, oov_row) {
            assert!(
                err_b.contains(&format!("request_ids[{r}]: ")) && err_b.contains("parameters name token"),
                "a request's id outside the vocabulary refused with {err_b:?} (row {r})"
            );
        }
        let appended = if call.append && st_b == OK { grown(&before, &ids, &call.request_ids) } else { before.clone() };
        assert_eq!(state.shape(&ids), appended, "the draw (append {}) changed the request state so", call.append);
        let mut call = call;
        if absent && !bad {
            // The same call naming the right request: B's refused call moved nothing, so it now
            // draws what A drew.
            call.request_ids[n_rows - 1] = reqs[row_req[n_rows - 1]].id;
            (st_b, out_b) = call.draw(&b, vocab, Some(&state));
            assert_eq!(st_b, OK, "{}", last_error());
            let appended = if call.append { grown(&before, &ids, &call.request_ids) } else { before.clone() };
            assert_eq!(state.shape(&ids), appended, "the draw (append {}) changed the request state so", call.append);
        }
        if st_a != OK || st_b != OK {
            continue;
        }
        if out_a != out_b {
            eprintln!(
                "vocab {vocab} simd_b {simd_b} threads_b {threads_b} llama {} processed {} held {held:#x}",
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
        if rone_in(rng, 25) {
            call.refused_append(&d, vocab, Some(&out_a.tokens));
        }
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
        // A score through the state (the fields B leaves NULL from the requests, seeds at their
        // output lengths) writes what the score of A's arrays writes, before the state holds
        // the drawn tokens.
        if !call.append {
            let (st_sa, out_sa) = call.score_seeded(&d, vocab, None, &out_a.tokens);
            assert_eq!(st_sa, OK, "score with seeds: {}", last_error());
            let (st_sb, out_sb) = call.score_seeded(&d, vocab, Some(&state), &out_a.tokens);
            assert_eq!(st_sb, OK, "score through the state: {}", last_error());
            assert_eq!(out_sa, out_sb, "the scores through the state and with the lists differ");
        }

        // Keep the drawn tokens: the lists on the host, the state through append, one token a
        // row (a draw's tokens) or as a list per row (a verify call's accepted tokens), unless
        // B's draw appended them itself.
        let as_lists = u.arbitrary::<bool>()?;
        let rid: Vec<u64> = row_req.iter().map(|&q| reqs[q].id).collect();
        let refuse = one_in(u, 20)?;
        let mut tokens = out_a.tokens.clone();
        if refuse {
            tokens[0] = -1; // a negative token: the whole append is refused
        }
        let now = state.shape(&ids);
        if refuse || !call.append {
            let st = if as_lists {
                let offsets: Vec<u64> = (0..=n_rows as u64).collect();
                state.append(&rid, &tokens, Some(&offsets))
            } else {
                state.append(&rid, &tokens, None)
            };
            if refuse {
                assert_eq!(st, INVALID_ARGUMENT);
                assert_eq!(state.shape(&ids), now, "a refused append changed the state");
            } else {
                assert_eq!(st, OK, "append: {}", last_error());
            }
        }
        if refuse && !call.append {
            assert_eq!(state.append(&rid, &out_a.tokens, None), OK);
        }
        assert_eq!(state.shape(&ids), grown(&before, &ids, &rid), "the state after the step's tokens");
        for (i, &q) in row_req.iter().enumerate() {
            reqs[q].output.push(out_a.tokens[i]);
        }
        // Sometimes a request is removed and added again with the same histories (and no
        // parameters, which it may set again).
        if one_in(u, 4)? {
            let q = u.choose_index(n_reqs)?;
            assert_eq!(state.remove(reqs[q].id), OK);
            assert_eq!(state.remove(reqs[q].id), INVALID_ARGUMENT, "a removed id was removed again");
            assert_eq!(state.add(reqs[q].id, &reqs[q].prompt, &reqs[q].output), OK);
            reqs[q].params = Params::default();
            if rng.below(2) == 0 {
                set_params(rng, &state, &mut reqs[q], vocab);
            }
        }
        row_req_last = row_req;
        last_ok = Some(call);
    }
    // One more call on all three: a refused call moved no stream. Its held fields are what the
    // requests hold now (at their new output lengths), none naming an id outside the
    // vocabulary, and its logprobs raw (a request's typical_p may have changed since).
    if let Some(mut call) = last_ok {
        for &q in &row_req_last {
            if reqs[q].params.largest() >= vocab as i32 {
                assert_eq!(state.set_params(reqs[q].id, None), OK);
                reqs[q].params = Params::default();
            }
        }
        for (i, &q) in row_req_last.iter().enumerate() {
            call.request_ids[i] = reqs[q].id;
        }
        call.output = csr(row_req_last.iter().map(|&q| reqs[q].output.clone()));
        hold(&mut call.rows, call.held, &reqs, &row_req_last);
        call.lists = Lists::of(&call.rows);
        call.processed = false;
        call.append = false;
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
