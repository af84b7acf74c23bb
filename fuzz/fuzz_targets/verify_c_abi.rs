//! `tokenrace_verify` (speculative decoding) through the C ABI, with every field of the verify
//! batch and output taken from the input: sampler config, dtype, requests and their draft counts
//! (negative ones too), the rows field (also one off), vocab, row stride (overflowing ones too),
//! draft ids (valid, the row's argmax, vLLM's placeholder -1, out of range, other negatives), q
//! rows (distributions, one-hot, uniform; a negative, NaN, +inf value or a wrong sum) at any
//! stride (below vocab, overflowing), per-request temperature / top_k / top_p / min_p / seeds /
//! offsets / seeded, acceptance uniforms (also 0, 1, NaN), external noise, the tokens stride
//! (too small, overflowing), NULL and misaligned pointers, outputs that share memory with an
//! input or another output, struct sizes with bytes set past the struct.
//!
//! The target predicts from the documented rules whether the call must succeed, and checks:
//! - the status is a documented code, never INTERNAL, and the one the rules predict, with a
//!   last error naming `tokenrace_verify`;
//! - on failure nothing was written (sentinels), and the structs and the inputs never are;
//! - on success each request's count is in [1, drafts + 1], its emitted tokens are in [0, vocab)
//!   and -1 follows them, every emitted token but the last is its draft (a placeholder is never
//!   accepted), a greedy request emits exactly the argmax chain, logprobs of emitted tokens are
//!   never NaN nor above 0 and the padding's are NaN;
//! - the same call on a sampler with another SIMD level and thread count and the same seed gives
//!   bit-identical outputs (every request, when the config has a seed; else the greedy, seeded
//!   and fully given ones), and the call repeated gives the same for those requests.

#![no_main]

#[path = "../common/mod.rs"]
mod common;

use arbitrary::{Result, Unstructured};
use common::buf::{pick_ptr, Buf, Ptr};
use common::sampler::{level_supported, new_sampler, other_level_sampler, Sampler};
use common::*;
use libfuzzer_sys::fuzz_target;
use std::ffi::c_void;
use std::mem::{offset_of, size_of};
use tokenrace::internals::api::*;
use tokenrace::internals::types::*;

const BATCH_SIZE: usize = size_of::<tokenrace_verify_batch>();
const OUTPUT_SIZE: usize = size_of::<tokenrace_verify_output>();

fuzz_target!(|data: &[u8]| {
    let _ = run(data);
});

/// An optional per-request array: NULL, or values from `gen`, one sometimes from `bad`; and
/// which request holds that one.
fn per_req<T: Copy + Default>(
    u: &mut Unstructured,
    n: usize,
    mut gen: impl FnMut(&mut Unstructured) -> Result<T>,
    bad: impl FnOnce(&mut Unstructured) -> Result<T>,
) -> Result<(Buf<T>, Option<usize>)> {
    if !u.arbitrary::<bool>()? {
        return Ok((Buf::null(), None));
    }
    let how = if std::mem::align_of::<T>() > 1 && one_in(u, 150)? { Ptr::Misaligned } else { Ptr::Aligned };
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        v.push(gen(u)?);
    }
    let mut bad_at = None;
    if n > 0 && one_in(u, 12)? {
        let at = u.int_in_range(0..=n - 1)?;
        v[at] = bad(u)?;
        bad_at = Some(at);
    }
    Ok((Buf::from_vec(how, v), bad_at))
}

fn overflowing_stride(u: &mut Unstructured, rows: usize, vocab: usize, elem: usize) -> Result<Option<u64>> {
    let s = match u.int_in_range(0..=4u8)? {
        0 => u64::MAX,
        1 => 1 << 62,
        2 => (1 << 61) + 1,
        3 => i64::MAX as u64 / elem as u64 / (rows as u64).saturating_sub(1).max(1) + 1,
        _ => u.arbitrary::<u64>()? | (1 << 40),
    };
    Ok((rows >= 2 && span(rows, vocab, s, elem).is_none()).then_some(s))
}

/// `n` logits: normal values at some scale, ties, or the input's bytes, with specials sprinkled.
fn logit_values(u: &mut Unstructured, n: usize) -> Result<Vec<f32>> {
    let mut rng = Rng(u.arbitrary()?);
    let scale = [1e-3, 1.0, 3.0, 30.0, 1e30][u.choose_index(5)?];
    let mut v: Vec<f32> = match u.int_in_range(0..=2u8)? {
        0 => (0..n).map(|_| ((rng.normal() * scale) as f32 * 4.0).round() / 4.0).collect(),
        1 => {
            let take = u.int_in_range(4..=256usize)? & !3;
            let raw = u.bytes(take)?;
            cycled_f32(raw, n)
        }
        _ => (0..n).map(|_| (rng.normal() * scale) as f32).collect(),
    };
    for _ in 0..u.int_in_range(0..=6usize)? {
        if n == 0 {
            break;
        }
        let at = rng.below(n);
        v[at] = special_f32(u)?;
    }
    Ok(v)
}

/// A probability row: uniform, one-hot at `at`, or random (sums to 1 in f64, then f32).
fn q_row(u: &mut Unstructured, vocab: usize, at: Option<usize>) -> Result<Vec<f32>> {
    Ok(match u.int_in_range(0..=3u8)? {
        0 => vec![1.0 / vocab as f32; vocab],
        1 if at.is_some() => (0..vocab).map(|i| (Some(i) == at) as u8 as f32).collect(),
        _ => {
            let mut rng = Rng(u.arbitrary()?);
            let w: Vec<f64> = (0..vocab).map(|_| rng.unit().powi(3)).collect();
            let z: f64 = w.iter().sum();
            w.iter().map(|x| (x / z) as f32).collect()
        }
    })
}

/// The struct in a 512-byte buffer with `struct_size` and bytes after it chosen by the input,
/// the status that gives (None: fine) and the size. `v1` is the size of the struct's first
/// version: a size from it to the whole struct is valid when it ends a field (the fields after
/// the first version are 8 bytes each), and the fields past it are not seen.
fn place<T: Copy>(u: &mut Unstructured, value: T, v1: usize) -> Result<(Box<StructBytes>, Option<u32>, usize)> {
    let full = size_of::<T>();
    let size: usize = match u.int_in_range(0..=15u8)? {
        11 => v1 + 8 * u.int_in_range(0..=(full - v1) / 8)?,
        12 => full + 8 * u.int_in_range(1..=8usize)?,
        13 => u.int_in_range(0..=full)?,
        14 => full - 1,
        15 => full + 1,
        _ => full,
    };
    let (buf, tail_set) = struct_bytes(u, value, size)?;
    let expect = if size < v1 || (size < full && (size - v1) % 8 != 0) {
        Some(INVALID_ARGUMENT) // before the first version's end, or inside a later field
    } else if tail_set {
        Some(UNSUPPORTED)
    } else {
        None
    };
    Ok((buf, expect, size))
}

const TOKEN_SENTINEL: i32 = -0x2152_4111;
const FLAG_SENTINEL: u32 = 0xa5a5_a5a5;
const LP_SENTINEL: u32 = 0x7fc0_dead;

/// `n` elements of `fill` (a misaligned buffer has one more, a sentinel too; NULL none).
fn filled<T: Copy>(how: Ptr, n: usize, fill: T) -> Buf<T> {
    let len = match how {
        Ptr::Null => 0,
        Ptr::Aligned => n,
        Ptr::Misaligned => n + 1,
    };
    Buf { v: vec![fill; len], how }
}

/// What a verify call wrote.
struct Outs {
    tokens: Buf<i32>,
    counts: Buf<i32>,
    flags: Buf<u32>,
    logprobs: Buf<u32>,
    nodes: Buf<i32>,
}

impl Outs {
    fn new(h: [Ptr; 5], len: usize, requests: usize) -> Outs {
        Outs {
            tokens: filled(h[0], len, TOKEN_SENTINEL),
            counts: filled(h[1], requests, TOKEN_SENTINEL),
            flags: filled(h[2], requests, FLAG_SENTINEL),
            logprobs: filled(h[3], len, LP_SENTINEL),
            nodes: filled(h[4], len, TOKEN_SENTINEL),
        }
    }
    fn untouched(&self) -> bool {
        self.tokens.v.iter().chain(&self.counts.v).chain(&self.nodes.v).all(|&x| x == TOKEN_SENTINEL)
            && self.flags.v.iter().all(|&x| x == FLAG_SENTINEL)
            && self.logprobs.v.iter().all(|&x| x == LP_SENTINEL)
    }
    fn c(&self, mode: u32, stride: u64) -> tokenrace_verify_output {
        tokenrace_verify_output {
            struct_size: OUTPUT_SIZE as u32,
            logprob_mode: mode,
            tokens: self.tokens.ptr() as *mut i32,
            tokens_stride: stride,
            counts: self.counts.ptr() as *mut i32,
            flags: self.flags.ptr() as *mut u32,
            logprobs: self.logprobs.ptr() as *mut f32,
            accepted_nodes: self.nodes.ptr() as *mut i32,
        }
    }
}

/// The row's token without noise: the first +inf, else the lowest index of the largest finite
/// value, else (an empty row) 0.
fn argmax(x: &[f32]) -> usize {
    if let Some(i) = x.iter().position(|&v| v == f32::INFINITY) {
        return i;
    }
    let m = x.iter().copied().filter(|v| v.is_finite()).fold(f32::NEG_INFINITY, f32::max);
    if m == f32::NEG_INFINITY {
        return 0;
    }
    x.iter().position(|&v| v == m).unwrap()
}

fn run(data: &[u8]) -> Result<()> {
    let mut u = Unstructured::new(data);
    let u = &mut u;

    // --- The sampler.
    let mut cfg = tokenrace_config_default();
    cfg.max_rows = u.int_in_range(1..=40u32)?;
    cfg.threads = [1u32, 1, 2, 4, 0][u.choose_index(5)?];
    cfg.greedy_below = [1e-5f32, 0.0, 0.5, 1.0, 2.0][u.choose_index(5)?];
    cfg.has_seed = !one_in(u, 8)? as u32;
    cfg.seed = u.arbitrary()?;
    cfg.simd = [0u32, 0, 0, 0, 1, 2, 3, 4][u.choose_index(8)?];
    cfg.log_level = 0;
    cfg.noise = [0u32, 0, 1, 2][u.choose_index(4)?];

    // --- The requests and their drafts.
    let big = one_in(u, 12)?;
    let requests = if big { u.int_in_range(0..=2usize)? } else { u.int_in_range(0..=6usize)? };
    let mut counts: Vec<i32> = Vec::with_capacity(requests);
    let mut invalid = false;
    for _ in 0..requests {
        counts.push(if one_in(u, 40)? {
            invalid = true;
            [-1, -2, i32::MIN][u.choose_index(3)?]
        } else {
            u.int_in_range(0..=if big { 2 } else { 4 })?
        });
    }
    let n_drafts: usize = counts.iter().map(|&c| c.max(0) as usize).sum();
    let rows_true = n_drafts + requests;
    let rows = match u.int_in_range(0..=30u8)? {
        0 => rows_true + 1,
        1 if rows_true > 0 => rows_true - 1,
        _ => rows_true,
    };
    if rows != rows_true {
        invalid = true;
    }
    let vocab: usize = match u.int_in_range(0..=15u8)? {
        0 => 0,
        1 => 1,
        2..=4 => u.int_in_range(2..=16)?,
        5 => [255, 256, 257, 511, 513][u.choose_index(5)?],
        6 if big => u.int_in_range(16_384..=70_000)?,
        _ => u.int_in_range(17..=1500)?,
    };
    cfg.vocab_size = match u.int_in_range(0..=9u8)? {
        1..=2 => vocab as u32,
        3 => vocab as u32 ^ 1,
        _ => 0,
    };
    if cfg.noise == 2 {
        cfg.vocab_size = vocab.max(1) as u32;
        let pool_rows = 4 * cfg.max_rows as usize;
        if pool_rows * cfg.vocab_size as usize > 1 << 17 {
            cfg.noise = 0;
        }
    }
    let (st, a) = new_sampler(&cfg);
    let want_sampler = if level_supported(cfg.simd) { OK } else { UNSUPPORTED };
    assert_eq!(st, want_sampler, "tokenrace_sampler_new: {}", last_error());
    let Some(a) = a else { return Ok(()) };
    if vocab == 0 || rows_true > cfg.max_rows as usize || (cfg.vocab_size != 0 && cfg.vocab_size as usize != vocab) {
        invalid = true;
    }

    // --- The target logits.
    let dtype = if one_in(u, 40)? { u.int_in_range(3..=9u32)? } else { u.int_in_range(0..=2u32)? };
    let elem = if dtype == 0 { 4 } else { 2 };
    invalid |= dtype > 2;
    let row_stride: u64 = match u.int_in_range(0..=12u8)? {
        1..=3 => vocab as u64 + u.int_in_range(1..=9u64)?,
        4 if vocab > 1 => vocab as u64 - 1,
        5 => overflowing_stride(u, rows, vocab, elem)?.unwrap_or(0),
        _ => 0,
    };
    let eff_stride = if row_stride == 0 { vocab as u64 } else { row_stride };
    invalid |= eff_stride < vocab as u64;
    let Some(n_logits) = span(rows, vocab, eff_stride, elem) else {
        // Refused before anything is read: no buffer of that size exists.
        return check_refused_only(u, &a, dtype, rows, vocab, row_stride, requests, counts);
    };
    if n_logits > 4 << 20 {
        return Ok(());
    }
    let values = logit_values(u, n_logits)?;
    // The rows as the library reads them (the dtype's rounding).
    let read: Vec<f32> = match dtype {
        1 => values.iter().map(|&x| bf16_to_f32(f32_to_bf16(x))).collect(),
        2 => values.iter().map(|&x| f16_to_f32(f32_to_f16(x))).collect(),
        _ => values.clone(),
    };
    let logits_how = pick_ptr(u, 80)?;
    invalid |= logits_how == Ptr::Misaligned || (logits_how == Ptr::Null && n_logits > 0);
    let logits_f32 = if elem == 4 { Buf::from_vec(logits_how, values.clone()) } else { Buf::null() };
    let logits_u16: Buf<u16> = if elem == 2 {
        Buf::from_vec(
            logits_how,
            values.iter().map(|&x| if dtype == 1 { f32_to_bf16(x) } else { f32_to_f16(x) }).collect(),
        )
    } else {
        Buf::null()
    };
    let logits_ptr = if elem == 4 { logits_f32.ptr() as *const c_void } else { logits_u16.ptr() as *const c_void };
    fn row_of(read: &[f32], stride: usize, vocab: usize, r: usize) -> &[f32] {
        let s = r * stride;
        if s + vocab <= read.len() {
            &read[s..s + vocab]
        } else {
            &[]
        }
    }
    let row = |r: usize| row_of(&read, eff_stride as usize, vocab, r);

    // Request layout (as the library reads it, when the counts are valid).
    let mut first_row = Vec::with_capacity(requests);
    let mut first_draft = Vec::with_capacity(requests);
    let (mut r0, mut d0) = (0usize, 0usize);
    for &c in &counts {
        first_row.push(r0);
        first_draft.push(d0);
        r0 += c.max(0) as usize + 1;
        d0 += c.max(0) as usize;
    }
    let req_of = |d: usize| (0..requests).rfind(|&i| first_draft[i] <= d).unwrap();

    // --- Per-request parameters.
    let (temps, bad_t) = per_req(
        u,
        requests,
        |u| Ok([0.0f32, 1e-6, 0.7, 1.0, 1.0, 2.0, 1e30][u.choose_index(7)?]),
        |u| Ok([f32::NAN, -1.0, f32::INFINITY][u.choose_index(3)?]),
    )?;
    invalid |= bad_t.is_some() || temps.misaligned();
    let (ks, _) = per_req(u, requests, |u| Ok([0i32, 1, 2, 5, -1, i32::MAX][u.choose_index(6)?]), |u| u.arbitrary())?;
    invalid |= ks.misaligned();
    let (ps, bad_p) = per_req(
        u,
        requests,
        |u| Ok([1.0f32, 0.9, 0.5, 1e-6][u.choose_index(4)?]),
        |u| Ok([0.0f32, f32::NAN, 1.5][u.choose_index(3)?]),
    )?;
    invalid |= bad_p.is_some() || ps.misaligned();
    let (mps, bad_m) = per_req(
        u,
        requests,
        |u| Ok([0.0f32, 0.1, 0.5, 1.0][u.choose_index(4)?]),
        |u| Ok([-0.1f32, f32::NAN, 1.5][u.choose_index(3)?]),
    )?;
    invalid |= bad_m.is_some() || mps.misaligned();
    let (seeds, _) = per_req(u, requests, |u| u.arbitrary::<u64>(), |u| u.arbitrary::<u64>())?;
    let (offsets, _) = per_req(u, requests, |u| u.int_in_range(0..=1000u64), |_| Ok(u64::MAX))?;
    let (seeded, _) = if seeds.given() || one_in(u, 30)? {
        per_req(u, requests, |u| Ok(u.arbitrary::<bool>()? as u8), |_| Ok(0u8))?
    } else {
        (Buf::null(), None)
    };
    invalid |= seeds.misaligned() || offsets.misaligned() || (seeded.given() && !seeds.given());
    let temp = |i: usize| if temps.how == Ptr::Aligned { temps.at(i) } else { 1.0 };
    let sampling = |i: usize| temp(i) >= cfg.greedy_below;
    let is_seeded = |i: usize| seeds.given() && (!seeded.given() || seeded.at(i) != 0);

    // --- Draft ids.
    let mut drafts = Vec::with_capacity(n_drafts);
    for d in 0..n_drafts {
        let i = req_of(d);
        let x = row(first_row[i] + d - first_draft[i]);
        drafts.push(match u.int_in_range(0..=11u8)? {
            0 | 1 => -1,
            2..=4 if !x.is_empty() => argmax(x) as i32,
            5 if one_in(u, 4)? => {
                invalid = true;
                [vocab as i32, -2, i32::MIN, i32::MAX][u.choose_index(4)?]
            }
            _ => u.int_in_range(0..=vocab.max(1) as u32 - 1)? as i32,
        });
    }
    // --- A draft tree (a third of the calls): node j's parent is -1 (the root) or an earlier node
    // of its request; rarely one that breaks that rule.
    let mut tree_invalid = false;
    let parents: Option<Vec<i32>> = if one_in(u, 3)? {
        let mut p = Vec::with_capacity(n_drafts);
        for &c in &counts {
            let c = c.max(0);
            for j in 0..c {
                p.push(if one_in(u, 100)? {
                    tree_invalid = true;
                    [j, c, -2, i32::MAX][u.choose_index(4)?]
                } else {
                    match u.int_in_range(0..=3u8)? {
                        0 | 1 => j - 1,
                        2 => -1,
                        _ => u.int_in_range(-1..=j - 1)?,
                    }
                });
            }
        }
        Some(p)
    } else {
        None
    };
    let parents_buf = match &parents {
        Some(p) => {
            let how = if one_in(u, 150)? { Ptr::Misaligned } else { Ptr::Aligned };
            tree_invalid |= how == Ptr::Misaligned;
            Buf::from_vec(how, p.clone())
        }
        None => Buf::null(),
    };
    // The earlier sibling (global index) of node `d`, in a tree.
    let first_sibling = |d: usize| -> Option<usize> {
        let p = parents.as_ref()?;
        let i = req_of(d);
        (first_draft[i]..d).find(|&e| p[e] == p[d])
    };
    let drafts_how = pick_ptr(u, 200)?;
    invalid |= drafts_how == Ptr::Misaligned || (drafts_how == Ptr::Null && n_drafts > 0);
    let drafts_buf = Buf::from_vec(drafts_how, drafts.clone());
    let counts_how = pick_ptr(u, 200)?;
    invalid |= counts_how == Ptr::Misaligned || (counts_how == Ptr::Null && requests > 0);
    let counts_buf = Buf::from_vec(counts_how, counts.clone());

    // --- Draft probabilities, and everything after them, from the input read backwards: a
    // short input (libFuzzer starts short) reaches them too, instead of running out before.
    let backwards: Vec<u8> = data.iter().rev().copied().collect();
    let mut back = Unstructured::new(&backwards);
    let u = &mut back;
    let mut q_stride = 0u64;
    let q: Buf<f32> = if one_in(u, 2)? && vocab > 0 {
        q_stride = match u.int_in_range(0..=9u8)? {
            1 | 2 => vocab as u64 + u.int_in_range(1..=5u64)?,
            3 if vocab > 1 => u.int_in_range(1..=vocab as u64 - 1)?,
            4 => overflowing_stride(u, n_drafts, vocab, 4)?.unwrap_or(0),
            _ => 0,
        };
        let eff = if q_stride == 0 { vocab as u64 } else { q_stride };
        invalid |= eff < vocab as u64;
        match span(n_drafts, vocab, eff.max(vocab as u64), 4) {
            None => {
                invalid = true;
                Buf::from_vec(Ptr::Aligned, vec![0.0; 4])
            }
            Some(n) if n > 4 << 20 => return Ok(()),
            Some(n) => {
                let mut v = vec![f32::NAN; n];
                let st = eff.max(vocab as u64) as usize;
                for (d, &id) in drafts.iter().enumerate() {
                    // A tree's siblings are draws from one q: mostly its first sibling's row.
                    if let Some(e) = first_sibling(d).filter(|_| !one_in(u, 5).unwrap_or(false)) {
                        v.copy_within(e * st..e * st + vocab, d * st);
                        continue;
                    }
                    let r = q_row(u, vocab, (id >= 0 && (id as usize) < vocab).then_some(id as usize))?;
                    v[d * st..d * st + vocab].copy_from_slice(&r);
                }
                if n_drafts > 0 && one_in(u, 8)? {
                    // One q row that is not a distribution: refused when its request samples
                    // (its first row planned as a sampling one: no +inf, some finite value).
                    let d = u.int_in_range(0..=n_drafts - 1)?;
                    let t = u.int_in_range(0..=vocab - 1)?;
                    v[d * st + t] = [-0.5f32, f32::NAN, f32::INFINITY, 3.0, f32::NEG_INFINITY][u.choose_index(5)?];
                    let i = req_of(d);
                    let x = row(first_row[i]);
                    let planned_sampling =
                        sampling(i) && !x.is_empty() && !x.contains(&f32::INFINITY) && x.iter().any(|v| v.is_finite());
                    invalid |= planned_sampling;
                    if !planned_sampling && sampling(i) {
                        return Ok(()); // whether such a row's q is read is not the rules' to say
                    }
                }
                // Siblings of a sampling request whose rows differ (bit for bit) are refused.
                if counts.iter().all(|&c| c >= 0) {
                    for d in 0..n_drafts {
                        if let Some(e) = first_sibling(d) {
                            let differ = (0..vocab).any(|t| v[e * st + t].to_bits() != v[d * st + t].to_bits());
                            tree_invalid |= differ && sampling(req_of(d));
                        }
                    }
                }
                let how = if one_in(u, 150)? { Ptr::Misaligned } else { Ptr::Aligned };
                invalid |= how == Ptr::Misaligned;
                Buf::from_vec(how, v)
            }
        }
    } else {
        Buf::null()
    };

    // --- Acceptance uniforms and noise.
    let uniforms: Buf<f64> = if one_in(u, 3)? {
        let mut v: Vec<f64> = Vec::with_capacity(n_drafts);
        for _ in 0..n_drafts {
            v.push(u.int_in_range(1..=(1u64 << 53) - 1)? as f64 / (1u64 << 53) as f64);
        }
        if n_drafts > 0 && one_in(u, 6)? {
            let d = u.int_in_range(0..=n_drafts - 1)?;
            v[d] = [0.0, 1.0, f64::NAN, -0.5, 2.0, f64::INFINITY][u.choose_index(6)?];
            let i = req_of(d);
            invalid |= sampling(i) && !is_seeded(i);
        }
        let how = if one_in(u, 150)? { Ptr::Misaligned } else { Ptr::Aligned };
        invalid |= how == Ptr::Misaligned;
        Buf::from_vec(how, v)
    } else {
        Buf::null()
    };
    let mut noise_kind = 0u32;
    let mut noise_stride = 0u64;
    let noise: Buf<f32> = if one_in(u, 4)? {
        noise_kind = if one_in(u, 30)? { u.int_in_range(2..=9u32)? } else { u.int_in_range(0..=1u32)? };
        noise_stride = match u.int_in_range(0..=7u8)? {
            0 | 1 => 0,
            2 if vocab > 1 => 1,
            3 => overflowing_stride(u, rows, vocab, 4)?.unwrap_or(0),
            _ => vocab as u64,
        };
        invalid |= noise_kind > 1 || (noise_stride != 0 && noise_stride < vocab as u64);
        let n = if rows == 0 {
            Some(0)
        } else if noise_stride == 0 {
            Some(vocab)
        } else {
            span(rows, vocab, noise_stride, 4)
        };
        match n {
            None => {
                invalid = true;
                Buf::from_vec(Ptr::Aligned, vec![1.0; 4])
            }
            Some(n) if n > 4 << 20 => return Ok(()),
            Some(n) => {
                let mut rng = Rng(u.arbitrary()?);
                let v = (0..n)
                    .map(|_| {
                        let e = -rng.unit().ln();
                        (if noise_kind == 1 { e.ln() } else { e }) as f32
                    })
                    .collect();
                Buf::from_vec(Ptr::Aligned, v)
            }
        }
    } else {
        Buf::null()
    };

    // --- The output.
    let max_n = counts.iter().map(|&c| c.max(0) as usize).max().unwrap_or(0);
    let tokens_stride: u64 = match u.int_in_range(0..=12u8)? {
        1 | 2 => max_n as u64 + 1 + u.int_in_range(0..=3u64)?,
        3 if max_n > 0 => u.int_in_range(1..=max_n as u64)?,
        4 if requests >= 2 => [u64::MAX, 1 << 62, (isize::MAX as u64 / 4) / requests as u64 + 1][u.choose_index(3)?],
        _ => 0,
    };
    let width = if tokens_stride == 0 { max_n as u64 + 1 } else { tokens_stride };
    invalid |= width < max_n as u64 + 1;
    let len = (requests as u128 * width as u128).min(usize::MAX as u128) as usize;
    let len_ok = requests as u128 * width as u128 * 4 <= isize::MAX as u128;
    invalid |= !len_ok;
    if len_ok && len > 4 << 20 {
        return Ok(());
    }
    let alloc = if len_ok { len } else { 4 };
    let mode = if one_in(u, 30)? { u.int_in_range(2..=5u32)? } else { u.int_in_range(0..=1u32)? };
    invalid |= mode > 1;
    let mut h = [pick_ptr(u, 60)?, pick_ptr(u, 60)?, pick_ptr(u, 2)?, pick_ptr(u, 2)?, pick_ptr(u, 2)?];
    if !len_ok && h[0] == Ptr::Misaligned {
        h[0] = Ptr::Aligned;
    }
    invalid |= h[..4].contains(&Ptr::Misaligned); // the accepted nodes' when the struct shows them
    invalid |= (h[0] == Ptr::Null && len > 0) || (h[1] == Ptr::Null && requests > 0);
    let outs = Outs::new(h, alloc, requests);
    let mut out = outs.c(mode, tokens_stride);
    // An output placed inside an input's bytes or an earlier output's.
    if requests > 0 && len_ok && one_in(u, 20)? {
        let which = u.int_in_range(0..=3u8)?;
        let out_len = if which == 0 || which == 3 { len * 4 } else { requests * 4 };
        let (base, blen): (*const u8, usize) = match u.int_in_range(0..=2u8)? {
            0 if logits_how == Ptr::Aligned => (logits_ptr as *const u8, n_logits * elem),
            1 if counts_how == Ptr::Aligned => (counts_buf.ptr() as *const u8, requests * 4),
            _ if h[0] == Ptr::Aligned && which > 0 => (outs.tokens.ptr() as *const u8, len * 4),
            _ => (std::ptr::null(), 0),
        };
        if !base.is_null() && blen >= out_len && out_len > 0 {
            let at = 4 * u.int_in_range(0..=(blen - out_len) / 4)?;
            let p = base.wrapping_add(at) as *mut u8;
            match which {
                0 => out.tokens = p as *mut i32,
                1 => out.counts = p as *mut i32,
                2 => out.flags = p as *mut u32,
                _ => out.logprobs = p as *mut f32,
            }
            invalid = true;
        }
    }

    let batch = tokenrace_verify_batch {
        struct_size: BATCH_SIZE as u32,
        dtype,
        logits: logits_ptr,
        rows: rows as u32,
        vocab: vocab as u32,
        row_stride,
        requests: requests as u32,
        reserved0: 0,
        draft_counts: counts_buf.ptr(),
        draft_tokens: drafts_buf.ptr(),
        draft_probs: q.ptr(),
        draft_probs_row_stride: q_stride,
        temperature: temps.ptr(),
        top_k: ks.ptr(),
        top_p: ps.ptr(),
        min_p: mps.ptr(),
        seeds: seeds.ptr(),
        offsets: offsets.ptr(),
        seeded: seeded.ptr(),
        uniforms: uniforms.ptr(),
        noise: noise.ptr(),
        noise_kind,
        reserved1: 0,
        noise_row_stride: noise_stride,
        draft_parents: parents_buf.ptr(),
        // The sampling step's fields (after the tree) stay NULL here: draw_c_abi and
        // step_state_c_abi fuzz the step.
        // SAFETY: the struct is pointers and integers, for which all zeros is valid (NULL, 0).
        ..unsafe { std::mem::zeroed() }
    };
    let (batch_buf, batch_expect, batch_size) = place(u, batch, offset_of!(tokenrace_verify_batch, draft_parents))?;
    let (out_buf, out_expect, out_size) = place(u, out, offset_of!(tokenrace_verify_output, accepted_nodes))?;
    // The tree and the accepted nodes only where the structs' sizes show them.
    let tree_seen = batch_size >= offset_of!(tokenrace_verify_batch, draft_parents) + 8 && parents.is_some();
    let nodes_seen = out_size >= OUTPUT_SIZE && outs.nodes.given();
    invalid |= tree_seen && tree_invalid;
    invalid |= nodes_seen && outs.nodes.misaligned();
    let expect = batch_expect.or(out_expect).or(invalid.then_some(INVALID_ARGUMENT)).unwrap_or(OK);

    let inputs = || {
        [
            logits_f32.bytes(),
            logits_u16.bytes(),
            counts_buf.bytes(),
            drafts_buf.bytes(),
            q.bytes(),
            temps.bytes(),
            ks.bytes(),
            ps.bytes(),
            mps.bytes(),
            seeds.bytes(),
            offsets.bytes(),
            seeded.bytes(),
            uniforms.bytes(),
            noise.bytes(),
            parents_buf.bytes(),
        ]
        .concat()
    };
    let before = inputs();
    let (bb, ob) = (batch_buf.0, out_buf.0);
    let call = |s: &Sampler, o: *mut tokenrace_verify_output| {
        // SAFETY: every pointer covers what the batch claims (see Buf); the structs have room.
        code(
            unsafe { tokenrace_verify(s.0, batch_buf.0.as_ptr() as *const tokenrace_verify_batch, o) },
            "tokenrace_verify",
        )
    };
    let st = call(&a, out_buf.0.as_ptr() as *mut tokenrace_verify_output);
    let err = check_last_error(st, "tokenrace_verify");
    assert!(batch_buf.0 == bb && out_buf.0 == ob, "tokenrace_verify wrote into a struct");
    assert!(inputs() == before, "tokenrace_verify wrote into its inputs");
    if verbose() {
        eprintln!(
            "verify: {} requests {requests} drafts {n_drafts} vocab {vocab} tree {tree_seen} nodes {nodes_seen} {err}",
            status_name(st)
        );
    }
    assert_eq!(
        st,
        expect,
        "tokenrace_verify: status {} but the rules say {} ({err:?})",
        status_name(st),
        status_name(expect)
    );
    if st != OK {
        assert!(outs.untouched(), "tokenrace_verify failed ({err}) but wrote into the outputs");
        return Ok(());
    }

    // --- Success.
    let w = width as usize;
    for i in 0..requests {
        let c = counts[i] as usize;
        let n = outs.counts.at(i);
        assert!(n >= 1 && n as usize <= c + 1, "request {i}: count {n} not in [1, {}]", c + 1);
        let n = n as usize;
        let toks = &outs.tokens.v[i * w..(i + 1) * w];
        let ds = &drafts[first_draft[i]..first_draft[i] + c];
        for (j, &t) in toks.iter().enumerate() {
            if j < n {
                assert!(t >= 0 && (t as usize) < vocab, "request {i}: token {j} is {t}");
            } else if j <= c {
                assert_eq!(t, -1, "request {i}: position {j} after the {n} emitted tokens");
            }
        }
        // Node j's parent: the tree's, or a chain's j - 1.
        let parent = |j: usize| match (&parents, tree_seen) {
            (Some(p), true) => p[first_draft[i] + j],
            _ => j as i32 - 1,
        };
        // The accepted path: the nodes output, or (without it) some path whose drafts are the
        // emitted tokens.
        if nodes_seen {
            let nodes = &outs.nodes.v[i * w..(i + 1) * w];
            let mut at = -1i32;
            for (k, &node) in nodes.iter().enumerate().take(c + 1) {
                if k + 1 < n {
                    assert!(node >= 0 && (node as usize) < c, "request {i}: accepted node {k} is {node}");
                    assert_eq!(parent(node as usize), at, "request {i}: accepted node {k} is not a child of the last");
                    assert_eq!(toks[k], ds[node as usize], "request {i}: token {k} is not its node's draft");
                    at = node;
                } else {
                    assert_eq!(node, -1, "request {i}: accepted nodes position {k} after the path");
                }
            }
        } else {
            let mut frontier = vec![-1i32];
            for (k, &t) in toks.iter().enumerate().take(n - 1) {
                frontier = (0..c).filter(|&j| frontier.contains(&parent(j)) && ds[j] == t).map(|j| j as i32).collect();
                assert!(!frontier.is_empty(), "request {i}: token {k} ({t}) ends no path of drafts");
            }
        }
        if !sampling(i) {
            // From the root, the first child whose draft is the row's argmax, until none is;
            // then that argmax. A node's row is the request's first row + 1 + its index.
            let (mut at, mut r, mut k) = (-1i32, first_row[i], 0usize);
            loop {
                let want = argmax(row(r));
                assert!(k < n, "greedy request {i}: fewer tokens than its argmax path");
                assert_eq!(toks[k] as usize, want, "greedy request {i}: token {k} is not the argmax");
                match (0..c).find(|&j| parent(j) == at && ds[j] == want as i32) {
                    Some(j) => (at, r, k) = (j as i32, first_row[i] + 1 + j, k + 1),
                    None => break,
                }
            }
            assert_eq!(k + 1, n, "greedy request {i}: more tokens than its argmax path");
        }
        if outs.logprobs.given() {
            for (j, &l) in outs.logprobs.v[i * w..(i + 1) * w].iter().enumerate() {
                let l = f32::from_bits(l);
                if j < n {
                    assert!(!l.is_nan() && l <= 0.0, "request {i}: logprob {j} is {l}");
                } else if j <= c {
                    assert!(l.is_nan(), "request {i}: the padding's logprob {j} is {l}");
                }
            }
        }
    }
    let deterministic = |i: usize| !sampling(i) || is_seeded(i) || (uniforms.given() && noise.given());
    let same = |o: &Outs, all: bool, what: &str| {
        for i in (0..requests).filter(|&i| all || deterministic(i)) {
            let r = i * w..(i + 1) * w;
            assert_eq!(outs.counts.at(i), o.counts.at(i), "{what}: request {i}: count");
            assert_eq!(outs.tokens.v[r.clone()], o.tokens.v[r.clone()], "{what}: request {i}: tokens");
            if outs.logprobs.given() {
                assert_eq!(outs.logprobs.v[r.clone()], o.logprobs.v[r.clone()], "{what}: request {i}: logprobs");
            }
            if outs.flags.given() {
                assert_eq!(outs.flags.at(i), o.flags.at(i), "{what}: request {i}: flags");
            }
            if nodes_seen {
                assert_eq!(outs.nodes.v[r.clone()], o.nodes.v[r], "{what}: request {i}: accepted nodes");
            }
        }
    };
    // Another level and thread count, the same seed.
    let b = other_level_sampler(&cfg);
    let outs_b = Outs::new(h, alloc, requests);
    let mut out_b = outs_b.c(mode, tokens_stride);
    out_b.struct_size = OUTPUT_SIZE as u32;
    assert_eq!(call(&b, &mut out_b), OK, "the same call on another level and thread count: {}", last_error());
    same(&outs_b, cfg.has_seed != 0, "another level/thread count, same seed");
    drop(b);
    let outs_c = Outs::new(h, alloc, requests);
    let mut out_c = outs_c.c(mode, tokens_stride);
    assert_eq!(call(&a, &mut out_c), OK, "the call repeated: {}", last_error());
    same(&outs_c, false, "the call repeated");
    Ok(())
}

/// A call whose logits' span overflows: refused before anything is read, whatever else it has.
#[allow(clippy::too_many_arguments)]
fn check_refused_only(
    u: &mut Unstructured,
    a: &Sampler,
    dtype: u32,
    rows: usize,
    vocab: usize,
    row_stride: u64,
    requests: usize,
    counts: Vec<i32>,
) -> Result<()> {
    let drafts = vec![0i32; counts.iter().map(|&c| c.max(0) as usize).sum()];
    let mut tokens = vec![TOKEN_SENTINEL; requests * 5];
    let mut n = vec![TOKEN_SENTINEL; requests];
    let logits = [0f32; 4];
    let b = tokenrace_verify_batch {
        struct_size: BATCH_SIZE as u32,
        dtype,
        logits: logits.as_ptr() as *const c_void,
        rows: rows as u32,
        vocab: vocab as u32,
        row_stride,
        requests: requests as u32,
        draft_counts: counts.as_ptr(),
        draft_tokens: drafts.as_ptr(),
        ..unsafe { std::mem::zeroed() }
    };
    let mut o = tokenrace_verify_output {
        struct_size: OUTPUT_SIZE as u32,
        logprob_mode: u.int_in_range(0..=1u32)?,
        tokens: tokens.as_mut_ptr(),
        tokens_stride: 5,
        counts: n.as_mut_ptr(),
        flags: std::ptr::null_mut(),
        logprobs: std::ptr::null_mut(),
        accepted_nodes: std::ptr::null_mut(),
    };
    // SAFETY: the logits' span overflows (refused unread); the rest covers what it claims.
    let st = code(unsafe { tokenrace_verify(a.0, &b, &mut o) }, "tokenrace_verify");
    check_last_error(st, "tokenrace_verify");
    assert_eq!(st, INVALID_ARGUMENT, "an overflowing row stride: {}", last_error());
    assert!(tokens.iter().chain(&n).all(|&t| t == TOKEN_SENTINEL), "written on failure");
    Ok(())
}
