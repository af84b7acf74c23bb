//! `tokenrace_draw` through the C ABI, with every field of the batch and the output taken from
//! the input: sampler config, dtype, rows, vocab, row stride, per-row temperature / seeds /
//! offsets / seeded / top_k / top_p / min_p, external noise with its kind and stride, struct
//! sizes (odd ones too, with or without bytes set past the known struct), misaligned and NULL
//! pointers, logprob mode and top-n. Logits and noise come from the input bytes or a PRNG keyed by
//! them, with NaN, infinities and values at the ends of the f32 range mixed in.
//!
//! Every buffer the batch and the output point at is allocated with the length the batch claims
//! (a stride whose span overflows the address space is the one exception: the library must refuse
//! it before it makes a slice). The target predicts from the documented rules whether the call
//! must succeed, and checks:
//! - the status is a documented code, never INTERNAL, and the one the rules predict (OK, or
//!   INVALID_ARGUMENT / UNSUPPORTED for a struct tail), with a last error naming `tokenrace_draw`;
//! - on failure nothing was written (every output array still holds its sentinels), and the
//!   batch, the output struct and the inputs are never written at all;
//! - on success every token is in [0, vocab) and obeys docs/semantics.md where that can be checked
//!   exactly (the flags; greedy rows' argmax; the first +inf wins; an empty row gives 0; a
//!   sampled token is a finite, unmasked logit inside its top-k and min-p cut), logprobs are never
//!   NaN and never above 0, ranks lie in [1, vocab], top-n lists are distinct ids sorted by
//!   logprob with lowest id first on ties;
//! - the same draw on a second sampler with the same seed but another SIMD level and thread
//!   count gives bit-identical outputs (every row, when the config has a seed), and the draw
//!   repeated on the first sampler gives the same tokens for every greedy, seeded and
//!   external-noise row, and the same flags and top-n for every row.

#![no_main]

#[path = "../common/mod.rs"]
mod common;
#[path = "../../tests/common/reference.rs"]
mod reference;

use arbitrary::{Result, Unstructured};
use common::buf::{pick_ptr, Buf, Ptr};
use common::sampler::{level_supported, new_sampler, other_level_sampler};
use common::*;
use libfuzzer_sys::fuzz_target;
use reference as rf;
use std::ffi::c_void;
use std::mem::{offset_of, size_of};
use tokenrace::internals::api::*;
use tokenrace::internals::types::*;

const BATCH_SIZE: usize = size_of::<tokenrace_batch>(); // 248
const OUTPUT_SIZE: usize = size_of::<tokenrace_output>(); // 88
/// The first versions: the batch up to `noise_row_stride`, the output up to `topn_logprobs`.
const BATCH_V1: usize = offset_of!(tokenrace_batch, top_k);
const OUTPUT_V1: usize = offset_of!(tokenrace_output, full_logprobs);

fuzz_target!(|data: &[u8]| {
    let _ = run(data);
});

/// An optional per-row array: NULL (off), or `rows` values from `gen` (valid ones), one of them
/// sometimes replaced by a value from `bad` (most often invalid).
fn per_row<T: Copy + Default>(
    u: &mut Unstructured,
    rows: usize,
    mut gen: impl FnMut(&mut Unstructured) -> Result<T>,
    bad: impl FnOnce(&mut Unstructured) -> Result<T>,
) -> Result<Buf<T>> {
    if !u.arbitrary::<bool>()? {
        return Ok(Buf::new(Ptr::Null, 0, T::default()));
    }
    // (A u8 array cannot be misaligned: the library would read it from the odd address.)
    let how = if std::mem::align_of::<T>() > 1 && one_in(u, 150)? { Ptr::Misaligned } else { Ptr::Aligned };
    let mut v = Vec::with_capacity(rows);
    // One generated value, repeated, or one per row.
    let same = u.arbitrary::<bool>()?;
    let first = gen(u)?;
    for r in 0..rows {
        v.push(if same || r == 0 { first } else { gen(u)? });
    }
    if rows > 0 && one_in(u, 12)? {
        let at = u.int_in_range(0..=rows - 1)?;
        v[at] = bad(u)?;
    }
    Ok(Buf::from_vec(how, v))
}

fn temperature(u: &mut Unstructured) -> Result<f32> {
    Ok(match u.int_in_range(0..=15u8)? {
        0 => 0.0,
        1 => 1.0,
        2 => 0.7,
        3 => 1e-5,
        4 => 9.9e-6,
        5 => 1e-38,
        6 => 2.0,
        7 => 1e30,
        8 => f32::MAX,
        9 => f32::from_bits(1),
        10 => -0.0,
        11 => 0.5,
        12 => f32::from_bits(u.int_in_range(0..=0x7f7f_ffffu32)?), // any finite non-negative
        _ => u.int_in_range(1..=300u32)? as f32 / 100.0,
    })
}

fn bad_temperature(u: &mut Unstructured) -> Result<f32> {
    Ok(match u.int_in_range(0..=5u8)? {
        0 => -1.0,
        1 => f32::NAN,
        2 => f32::INFINITY,
        3 => -f32::from_bits(1),
        4 => f32::NEG_INFINITY,
        _ => special_f32(u)?,
    })
}

fn bad_top_p(u: &mut Unstructured) -> Result<f32> {
    Ok(match u.int_in_range(0..=5u8)? {
        0 => 0.0,
        1 => -0.0,
        2 => f32::from_bits(0x3f80_0001), // just above 1
        3 => f32::NAN,
        4 => f32::from_bits(u.arbitrary()?),
        _ => special_f32(u)?,
    })
}

fn bad_min_p(u: &mut Unstructured) -> Result<f32> {
    Ok(match u.int_in_range(0..=4u8)? {
        0 => f32::from_bits(0x3f80_0001), // just above 1
        1 => -0.1,
        2 => f32::NAN,
        3 => f32::from_bits(u.arbitrary()?),
        _ => special_f32(u)?,
    })
}

fn top_k(u: &mut Unstructured, vocab: usize) -> Result<i32> {
    let v = vocab.min(i32::MAX as usize) as i32;
    Ok(match u.int_in_range(0..=9u8)? {
        0 => 0,
        1 => 1,
        2 => -1,
        3 => v,
        4 => v.saturating_sub(1),
        5 => v.saturating_add(1),
        6 => i32::MAX,
        7 => i32::MIN,
        8 => u.arbitrary()?,
        _ => u.int_in_range(1..=50)?,
    })
}

fn top_p(u: &mut Unstructured) -> Result<f32> {
    Ok(match u.int_in_range(0..=12u8)? {
        0 => 1.0,
        1 => 0.9,
        2 => 0.5,
        3 => 1e-6,
        4 => f32::MIN_POSITIVE,
        5 => f32::from_bits(1),
        6 => f32::from_bits(0x3f7f_ffff),                         // just below 1
        7 => f32::from_bits(u.int_in_range(1..=0x3f80_0000u32)?), // any in (0, 1]
        _ => u.int_in_range(1..=100u32)? as f32 / 100.0,
    })
}

fn min_p(u: &mut Unstructured) -> Result<f32> {
    Ok(match u.int_in_range(0..=10u8)? {
        0 => 0.0,
        1 => 0.1,
        2 => 0.5,
        3 => 1.0,
        4 => -0.0,
        5 => f32::from_bits(1),
        6 => f32::from_bits(u.int_in_range(0..=0x3f80_0000u32)?), // any in [0, 1]
        _ => u.int_in_range(0..=100u32)? as f32 / 100.0,
    })
}

/// A stride that makes the span of `rows >= 2` rows overflow, if one of the candidates does.
fn overflowing_stride(u: &mut Unstructured, rows: usize, vocab: usize, elem: usize) -> Result<Option<u64>> {
    let s = match u.int_in_range(0..=5u8)? {
        0 => u64::MAX,
        1 => 1 << 63,
        2 => 1 << 62,
        3 => (1 << 61) + 1,
        4 => i64::MAX as u64 / elem as u64 / (rows as u64).saturating_sub(1).max(1) + 1,
        _ => u.arbitrary::<u64>()? | (1 << 40),
    };
    Ok((rows >= 2 && span(rows, vocab, s, elem).is_none()).then_some(s))
}

/// Logit values for `n` elements, as f32 (converted to the dtype by the caller).
fn logit_values(u: &mut Unstructured, n: usize) -> Result<Vec<f32>> {
    let mut rng = Rng(u.arbitrary()?);
    let scale = match u.int_in_range(0..=6u8)? {
        0 => 1e-3,
        1 => 30.0,
        2 => 1e4,
        3 => 1e30,
        4 => 3e38,
        5 => 0.0,
        _ => 1.0,
    };
    let mut v = match u.int_in_range(0..=3u8)? {
        0 => {
            // The input's own bytes, cycled.
            let len = u.int_in_range(4..=512usize)? & !3;
            let raw = u.bytes(len.min(u.len()))?;
            cycled_f32(raw, n)
        }
        1 => {
            let c = special_f32(u)?;
            vec![c; n]
        }
        2 => (0..n).map(|_| (rng.normal() * scale) as f32).collect(),
        _ => (0..n).map(|_| ((rng.normal() * scale) as f32 * 8.0).round() / 8.0).collect(), // ties
    };
    // Sprinkle special values at chosen or random positions.
    let k = u.int_in_range(0..=8usize)?;
    for _ in 0..k {
        if n == 0 {
            break;
        }
        let at = if u.arbitrary::<bool>()? { u.int_in_range(0..=n - 1)? } else { rng.below(n) };
        v[at] = special_f32(u)?;
    }
    if n > 0 && one_in(u, 4)? {
        // Many specials: a sprinkle of NaN / inf over the whole buffer.
        let every = u.int_in_range(2..=64usize)?;
        let s = special_f32(u)?;
        for x in v.iter_mut().step_by(every) {
            *x = s;
        }
    }
    Ok(v)
}

fn noise_values(u: &mut Unstructured, n: usize, kind: u32) -> Result<Vec<f32>> {
    let mut rng = Rng(u.arbitrary()?);
    let mut v: Vec<f32> = match u.int_in_range(0..=2u8)? {
        0 => (0..n)
            .map(|_| {
                let e = -rng.unit().ln();
                (if kind == 1 { e.ln() } else { e }) as f32
            })
            .collect(),
        1 => {
            let len = u.int_in_range(4..=256usize)? & !3;
            let raw = u.bytes(len.min(u.len()))?;
            if raw.len() < 4 {
                vec![1.0; n]
            } else {
                (0..n)
                    .map(|i| {
                        let j = (i * 4) % (raw.len() & !3);
                        f32::from_le_bytes([raw[j], raw[j + 1], raw[j + 2], raw[j + 3]])
                    })
                    .collect()
            }
        }
        _ => {
            let c = special_f32(u)?;
            vec![c; n]
        }
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

/// One CSR list of the sampling step as handed to the library: `rows + 1` offsets and the
/// entries they index (ids, and for the logit bias the values), each array NULL, aligned or
/// misaligned; and whether the library must refuse it.
struct CsrList {
    offsets: Buf<u64>,
    ids: Buf<i32>,
    values: Buf<f32>,
    invalid: bool,
}

impl CsrList {
    fn none() -> CsrList {
        CsrList {
            offsets: Buf::new(Ptr::Null, 0, 0),
            ids: Buf::new(Ptr::Null, 0, 0),
            values: Buf::new(Ptr::Null, 0, 0.0),
            invalid: false,
        }
    }
    /// The list as the draw uses it: `None` without offsets (then nothing else is given).
    fn rows(&self) -> Option<(&[u64], &[i32], &[f32])> {
        self.offsets.given().then(|| (&self.offsets.v[..], &self.ids.v[..], &self.values.v[..]))
    }
    fn row_ids(&self, r: usize) -> &[i32] {
        match self.rows() {
            Some((o, ids, _)) => &ids[o[r] as usize..o[r + 1] as usize],
            None => &[],
        }
    }
    fn row_values(&self, r: usize) -> &[f32] {
        match self.rows() {
            Some((o, _, v)) => &v[o[r] as usize..o[r + 1] as usize],
            None => &[],
        }
    }
    fn bytes(&self) -> Vec<u8> {
        let mut b = self.offsets.bytes();
        b.extend(self.ids.bytes());
        b.extend(self.values.bytes());
        b
    }
}

fn bias_value(u: &mut Unstructured) -> Result<f32> {
    Ok(match u.int_in_range(0..=7u8)? {
        0 => f32::NEG_INFINITY,
        1 => -0.0,
        2 => 100.0,
        3 => -100.0,
        4 => f32::MAX,
        5 => special_f32(u).map(|x| if x.is_nan() || x == f32::INFINITY { 1.0 } else { x })?,
        _ => u.int_in_range(-40..=40i32)? as f32 / 4.0,
    })
}

/// A CSR list (`bias`: with values), or nothing (both NULL, valid). Its entries before the first
/// offset and after the last are never read; a defect among them is no defect.
fn csr_list(u: &mut Unstructured, rows: usize, vocab: usize, bias: bool) -> Result<CsrList> {
    if !one_in(u, 4)? {
        return Ok(CsrList::none());
    }
    // Ids and values from a PRNG keyed by the input (a few bytes for any length).
    let mut rng = Rng(u.arbitrary()?);
    let mut id = |_: &mut Unstructured| -> Result<i32> {
        Ok(if vocab == 0 { 0 } else { rng.below(vocab.min(i32::MAX as usize)) as i32 })
    };
    let mut l = CsrList::none();
    // (A used-up input reads 0s: the common, valid paths come first.)
    match u.int_in_range(0..=39u8)? {
        38 => {
            // Entries without offsets.
            let n = u.int_in_range(0..=4usize)?;
            let v: Vec<i32> = (0..n).map(|_| id(u)).collect::<Result<_>>()?;
            if !bias || u.arbitrary()? {
                l.ids = Buf::from_vec(Ptr::Aligned, v);
            }
            if bias && (!l.ids.given() || u.arbitrary()?) {
                l.values = Buf::from_vec(Ptr::Aligned, vec![0.5; n]);
            }
            l.invalid = true;
            return Ok(l);
        }
        39 => {
            // A last offset whose entries overflow the address space (the entries short).
            let mut o: Vec<u64> = (0..rows).map(|r| r as u64).collect();
            o.push(match u.int_in_range(0..=3u8)? {
                0 => 1 << 61,
                1 => u64::MAX,
                2 => (1 << 62) + 1,
                _ => u.arbitrary::<u64>()? | (1 << 61),
            });
            l.offsets = Buf::from_vec(Ptr::Aligned, o);
            l.ids = Buf::from_vec(Ptr::Aligned, vec![0; rows + 1]);
            if bias {
                l.values = Buf::from_vec(Ptr::Aligned, vec![0.5; rows + 1]);
            }
            l.invalid = true;
            return Ok(l);
        }
        _ => {}
    }
    // Offsets: junk entries before the first, a few (now and then many) per row.
    let mut o = vec![u.int_in_range(0..=2u64)?];
    for _ in 0..rows {
        let n = if one_in(u, 20)? { u.int_in_range(0..=300u64)? } else { u.int_in_range(0..=6u64)? };
        o.push(o.last().unwrap() + n);
    }
    let last = *o.last().unwrap() as usize;
    let extra = u.int_in_range(0..=2usize)?;
    let ids: Vec<i32> = (0..last + extra).map(|_| id(u)).collect::<Result<_>>()?;
    let values: Vec<f32> = if bias {
        // A few chosen values, cycled.
        let pool: Vec<f32> = (0..4).map(|_| bias_value(u)).collect::<Result<_>>()?;
        (0..last + extra).map(|i| pool[(i * 7 + i / 3) % 4]).collect()
    } else {
        Vec::new()
    };
    let read = o[0] as usize..last;
    l.ids = Buf::from_vec(pick_ptr(u, 1000)?, ids);
    if bias {
        l.values = Buf::from_vec(pick_ptr(u, 1000)?, values);
    }
    let mut how = Ptr::Aligned;
    if one_in(u, 150)? {
        how = Ptr::Misaligned;
    }
    // At most one defect more.
    match u.int_in_range(0..=19u8)? {
        17 if rows >= 1 => {
            // Decreasing offsets.
            let k = u.int_in_range(1..=rows)?;
            o[k - 1] = o[k] + u.int_in_range(1..=3u64)?;
            l.invalid = true;
        }
        18 if !l.ids.v.is_empty() && l.ids.how == Ptr::Aligned => {
            let at = u.int_in_range(0..=l.ids.v.len() - 1)?;
            let bad = match u.int_in_range(0..=3u8)? {
                0 => -1,
                1 => vocab.min(i32::MAX as usize) as i32,
                2 => i32::MIN,
                _ => u.arbitrary::<i32>()?.max(vocab.min(i32::MAX as usize) as i32),
            };
            l.ids.v[at] = bad;
            l.invalid |= read.contains(&at) && !(bad >= 0 && (bad as usize) < vocab);
        }
        19 if bias && !l.values.v.is_empty() && l.values.how == Ptr::Aligned => {
            let at = u.int_in_range(0..=l.values.v.len() - 1)?;
            l.values.v[at] = if u.arbitrary()? { f32::NAN } else { f32::INFINITY };
            l.invalid |= read.contains(&at);
        }
        _ => {}
    }
    // A NULL or misaligned entry array the offsets need is a defect; one they do not is not.
    for b in [l.ids.how, if bias { l.values.how } else { Ptr::Aligned }] {
        l.invalid |= b == Ptr::Misaligned || (b == Ptr::Null && last > 0);
    }
    l.invalid |= how == Ptr::Misaligned;
    l.offsets = Buf::from_vec(how, o);
    Ok(l)
}

/// The batch struct in a 256-byte buffer, with `struct_size` and the bytes after the struct
/// chosen by the input. Returns the buffer and the status the size must give (None: fine).
fn place<T: Copy>(
    u: &mut Unstructured,
    value: T,
    valid_sizes: &[usize],
    v1: usize,
) -> Result<(Box<StructBytes>, u32, Option<u32>)> {
    let full = size_of::<T>();
    let size: usize = match u.int_in_range(0..=23u8)? {
        18 | 19 => valid_sizes[u.choose_index(valid_sizes.len())?],
        20 => full + 8 * u.int_in_range(1..=8usize)?,
        21 => u.int_in_range(0..=320usize)?,
        22 => v1 - 1,
        23 => full + 1,
        _ => full,
    };
    let (buf, tail_set) = struct_bytes(u, value, size)?;
    let expect = if size < v1 || (size < full && !valid_sizes.contains(&size)) {
        Some(INVALID_ARGUMENT)
    } else if tail_set {
        Some(UNSUPPORTED)
    } else {
        None
    };
    Ok((buf, size as u32, expect))
}

/// One row's values as f32.
fn row_values(dtype: u32, logits_f32: &[f32], logits_u16: &[u16], start: usize, vocab: usize) -> Vec<f32> {
    match dtype {
        0 => logits_f32[start..start + vocab].to_vec(),
        1 => logits_u16[start..start + vocab].iter().map(|&b| bf16_to_f32(b)).collect(),
        _ => logits_u16[start..start + vocab].iter().map(|&b| f16_to_f32(b)).collect(),
    }
}

/// What a draw wrote.
struct Outs {
    tokens: Buf<i32>,
    flags: Buf<u32>,
    logprobs: Buf<f32>,
    ranks: Buf<i32>,
    topn_ids: Buf<i32>,
    topn_lp: Buf<f32>,
}

const TOKEN_SENTINEL: i32 = -0x2152_4111;
const FLAG_SENTINEL: u32 = 0xa5a5_a5a5;
const LP_SENTINEL: f32 = f32::from_bits(0x7fc0_dead);
const RANK_SENTINEL: i32 = -77;

impl Outs {
    fn new(h: [Ptr; 6], rows: usize, topn_len: usize) -> Outs {
        Outs {
            tokens: Buf::new(h[0], rows, TOKEN_SENTINEL),
            flags: Buf::new(h[1], rows, FLAG_SENTINEL),
            logprobs: Buf::new(h[2], rows, LP_SENTINEL),
            ranks: Buf::new(h[3], rows, RANK_SENTINEL),
            topn_ids: Buf::new(h[4], topn_len, TOKEN_SENTINEL),
            topn_lp: Buf::new(h[5], topn_len, LP_SENTINEL),
        }
    }
    fn all_bytes(&self) -> Vec<u8> {
        let mut b = self.tokens.bytes();
        b.extend(self.flags.bytes());
        b.extend(self.logprobs.bytes());
        b.extend(self.ranks.bytes());
        b.extend(self.topn_ids.bytes());
        b.extend(self.topn_lp.bytes());
        b
    }
    fn untouched(&self) -> bool {
        self.tokens.v.iter().all(|&x| x == TOKEN_SENTINEL)
            && self.flags.v.iter().all(|&x| x == FLAG_SENTINEL)
            && self.logprobs.v.iter().all(|&x| x.to_bits() == LP_SENTINEL.to_bits())
            && self.ranks.v.iter().all(|&x| x == RANK_SENTINEL)
            && self.topn_ids.v.iter().all(|&x| x == TOKEN_SENTINEL)
            && self.topn_lp.v.iter().all(|&x| x.to_bits() == LP_SENTINEL.to_bits())
    }
    fn c(&mut self, mode: u32, top_n: u32) -> tokenrace_output {
        tokenrace_output {
            struct_size: OUTPUT_SIZE as u32,
            logprob_mode: mode,
            tokens: self.tokens.ptr_mut(),
            flags: self.flags.ptr_mut(),
            logprobs: self.logprobs.ptr_mut(),
            ranks: self.ranks.ptr_mut(),
            top_n,
            reserved0: 0,
            topn_ids: self.topn_ids.ptr_mut(),
            topn_logprobs: self.topn_lp.ptr_mut(),
            full_logprobs: std::ptr::null_mut(),
            full_row_stride: 0,
            full_mode: 0,
            reserved1: 0,
            // Not fuzzed yet: the logprobs of given ids.
            token_logprobs: std::ptr::null_mut(),
            token_ranks: std::ptr::null_mut(),
            // Not fuzzed yet: the kept sets.
            kept_threshold: std::ptr::null_mut(),
            kept_count: std::ptr::null_mut(),
            kept_mass: std::ptr::null_mut(),
            kept_bitmask: std::ptr::null_mut(),
            // Not fuzzed yet: mirostat's mu.
            mirostat_mu: std::ptr::null_mut(),
        }
    }
}

/// Whether a row's output is a pure function of the batch (not of the sampler's noise stream).
#[derive(Clone, Copy)]
struct RowInfo {
    greedy: bool,
    deterministic: bool,
}

fn run(data: &[u8]) -> Result<()> {
    let mut u = Unstructured::new(data);
    let u = &mut u;

    // --- The sampler.
    let max_rows = u.int_in_range(1..=48u32)?;
    let threads = [1u32, 1, 2, 3, 4, 0][u.choose_index(6)?];
    let greedy_below = match u.int_in_range(0..=6u8)? {
        0 => 0.0,
        1 => 0.5,
        2 => 1.0,
        3 => 2.0,
        4 => f32::from_bits(1),
        5 => u.int_in_range(0..=1000u32)? as f32 / 100.0,
        _ => 1e-5,
    };
    let mut cfg = tokenrace_config_default();
    cfg.max_rows = max_rows;
    cfg.threads = threads;
    cfg.greedy_below = greedy_below;
    cfg.has_seed = !one_in(u, 8)? as u32;
    cfg.seed = u.arbitrary()?;
    cfg.simd = [0u32, 0, 0, 0, 0, 1, 2, 3, 4][u.choose_index(9)?];
    cfg.log_level = 0;
    cfg.noise = [0u32, 0, 1, 2][u.choose_index(4)?];

    // --- The batch's shape.
    let dtype = if one_in(u, 40)? { u.int_in_range(3..=u32::MAX)? } else { u.int_in_range(0..=2u32)? };
    let elem = if dtype == 0 { 4 } else { 2 };
    let mut rows = if one_in(u, 30)? { max_rows as usize + 1 } else { u.int_in_range(0..=max_rows as usize)? };
    let vocab: usize = match u.int_in_range(0..=19u8)? {
        0 => 0,
        1 => 1,
        2..=5 => u.int_in_range(2..=16)?,
        6 | 7 => [255, 256, 257, 511, 512, 513, 1023, 1024, 1025][u.choose_index(9)?],
        8 => {
            rows = rows.min(4);
            u.int_in_range(16_384..=70_000)?
        }
        9 if rows == 0 => u.int_in_range(i32::MAX as usize..=u32::MAX as usize)?, // invalid, no buffers
        10..=13 => u.int_in_range(17..=300)?,
        _ => u.int_in_range(2..=2000)?,
    };
    let vocab_size = match u.int_in_range(0..=15u8)? {
        1..=3 => vocab as u32,
        4 => vocab as u32 ^ 1, // mismatch
        _ => 0,
    };
    cfg.vocab_size = vocab_size;
    if cfg.noise == 2 {
        // A sampler's own pool needs vocab_size; keep its memory small.
        cfg.vocab_size = vocab.clamp(1, i32::MAX as usize) as u32;
        cfg.pool_rows = if u.arbitrary::<bool>()? { 0 } else { u.int_in_range(max_rows..=max_rows * 2)? };
        let pool_rows = if cfg.pool_rows == 0 { 4 * max_rows } else { cfg.pool_rows } as usize;
        if pool_rows * cfg.vocab_size as usize > 1 << 17 {
            cfg.noise = 0;
        }
    }
    let stride: u64 = match u.int_in_range(0..=19u8)? {
        1..=3 => vocab as u64,
        4..=6 => vocab as u64 + u.int_in_range(1..=40u64)?,
        7 if vocab > 1 => vocab as u64 - 1, // invalid
        8 => overflowing_stride(u, rows, vocab, elem)?.unwrap_or(0),
        9 => vocab as u64 + 256,
        _ => 0,
    };
    let eff_stride = if stride == 0 { vocab as u64 } else { stride };
    let logits_span = span(rows, vocab, eff_stride, elem);

    // --- Expected sampler status.
    let expect_sampler = if cfg.vocab_size > i32::MAX as u32 {
        INVALID_CONFIG
    } else if !level_supported(cfg.simd) {
        UNSUPPORTED
    } else {
        OK
    };
    let (st, a) = new_sampler(&cfg);
    assert_eq!(st, expect_sampler, "tokenrace_sampler_new: {}", last_error());
    let Some(a) = a else { return Ok(()) };

    let mut invalid = false; // some rule says INVALID_ARGUMENT
    if dtype > 2 || logits_span.is_none() {
        invalid = true;
    }
    if rows > max_rows as usize || vocab == 0 || vocab > i32::MAX as usize {
        invalid = true;
    }
    if cfg.vocab_size != 0 && cfg.vocab_size as usize != vocab {
        invalid = true;
    }
    if eff_stride < vocab as u64 {
        invalid = true;
    }

    // --- Logits.
    let n_logits = logits_span.unwrap_or(0);
    let values = if logits_span.is_some() { logit_values(u, n_logits)? } else { Vec::new() };
    let logits_how = pick_ptr(u, 60)?;
    let logits_f32: Buf<f32>;
    let logits_u16: Buf<u16>;
    let logits_ptr: *const c_void;
    if elem == 4 {
        logits_f32 = Buf::from_vec(logits_how, values);
        logits_u16 = Buf::new(Ptr::Null, 0, 0);
        logits_ptr = logits_f32.ptr() as *const c_void;
        if logits_how == Ptr::Misaligned || (logits_how == Ptr::Null && n_logits > 0) {
            invalid = true;
        }
    } else {
        let conv: Vec<u16> = values.iter().map(|&x| if dtype == 1 { f32_to_bf16(x) } else { f32_to_f16(x) }).collect();
        logits_u16 = Buf::from_vec(logits_how, conv);
        logits_f32 = Buf::new(Ptr::Null, 0, 0.0);
        logits_ptr = logits_u16.ptr() as *const c_void;
        if logits_how == Ptr::Misaligned || (logits_how == Ptr::Null && n_logits > 0) {
            invalid = true;
        }
    }

    // --- Per-row arrays.
    let temps = per_row(u, rows, temperature, bad_temperature)?;
    let seeds = per_row(u, rows, |u| u.arbitrary::<u64>(), |u| u.arbitrary::<u64>())?;
    let offsets = per_row(
        u,
        rows,
        |u| if u.arbitrary()? { u.arbitrary::<u64>() } else { Ok(u.int_in_range(0..=8u64)?) },
        |_| Ok(u64::MAX),
    )?;
    // A seeded mask needs seeds (without them it is an error, tried now and then).
    let seeded = if seeds.given() || one_in(u, 40)? {
        per_row(u, rows, |u| Ok(if u.arbitrary()? { 1u8 } else { u.arbitrary()? }), |_| Ok(0))?
    } else {
        Buf::new(Ptr::Null, 0, 0)
    };
    let ks = per_row(u, rows, |u| top_k(u, vocab), |u| u.arbitrary::<i32>())?;
    let ps = per_row(u, rows, top_p, bad_top_p)?;
    let mps = per_row(u, rows, min_p, bad_min_p)?;

    // --- The sampling step's inputs, and everything after them, from the input read backwards:
    // a short input (libFuzzer starts short) reaches them too, instead of running out before.
    let backwards: Vec<u8> = data.iter().rev().copied().collect();
    let mut back = Unstructured::new(&backwards);
    let u = &mut back;
    let prompt = csr_list(u, rows, vocab, false)?;
    let output_l = csr_list(u, rows, vocab, false)?;
    let rep = per_row(
        u,
        rows,
        |u| Ok([1.0f32, 1.3, 0.5, 2.0, 1e-3][u.choose_index(5)?]),
        |u| Ok([0.0f32, -1.0, f32::NAN, f32::INFINITY, -0.0][u.choose_index(5)?]),
    )?;
    let freq = per_row(
        u,
        rows,
        |u| Ok(u.int_in_range(-8..=8i32)? as f32 / 4.0),
        |u| Ok([f32::NAN, f32::INFINITY, f32::NEG_INFINITY][u.choose_index(3)?]),
    )?;
    let pres = per_row(
        u,
        rows,
        |u| Ok(u.int_in_range(-8..=8i32)? as f32 / 4.0),
        |u| Ok([f32::NAN, f32::INFINITY, f32::NEG_INFINITY][u.choose_index(3)?]),
    )?;
    let bias = csr_list(u, rows, vocab, true)?;
    let allowed = csr_list(u, rows, vocab, false)?;
    let allowed_rows = if one_in(u, 4)? {
        Buf::from_vec(Ptr::Aligned, (0..rows).map(|_| u.arbitrary::<u8>()).collect::<Result<Vec<u8>>>()?)
    } else {
        Buf::new(Ptr::Null, 0, 0)
    };
    let banned = csr_list(u, rows, vocab, false)?;
    // The fields after the 0.2 batch: the penalty window, min_tokens with its stop lists, top-nσ.
    let last_n = per_row(
        u,
        rows,
        |u| Ok([0i32, 1, 3, 64, i32::MAX][u.choose_index(5)?]),
        |u| Ok([-1i32, i32::MIN][u.choose_index(2)?]),
    )?;
    let min_tokens = per_row(
        u,
        rows,
        |u| Ok([0i32, 1, 2, 5, i32::MAX][u.choose_index(5)?]),
        |u| Ok([-1i32, i32::MIN][u.choose_index(2)?]),
    )?;
    let stop = csr_list(u, rows, vocab, false)?;
    let nsigma = per_row(
        u,
        rows,
        |u| Ok([0.0f32, -1.0, 0.5, 1.0, 2.5, 1e-3][u.choose_index(6)?]),
        |u| Ok([f32::NAN, f32::INFINITY, f32::NEG_INFINITY][u.choose_index(3)?]),
    )?;
    let words = vocab.div_ceil(32);
    let mut bitmask_stride = 0u64;
    let mut bitmask_invalid = false;
    let bitmask: Buf<i32> = if one_in(u, 4)? {
        bitmask_stride = match u.int_in_range(0..=9u8)? {
            0..=3 => 0,
            4 | 5 => words as u64,
            6 => words as u64 + u.int_in_range(1..=5u64)?,
            7 if words >= 2 => u.int_in_range(1..=words as u64 - 1)?, // invalid
            8 => overflowing_stride(u, rows, words, 4)?.unwrap_or(0), // invalid
            _ => 0,
        };
        let eff = if bitmask_stride == 0 { words as u64 } else { bitmask_stride };
        let span_w = span(rows, words, eff, 4);
        bitmask_invalid = eff < words as u64 || span_w.is_none();
        let n = span_w.filter(|&n| n <= 1 << 20).unwrap_or(0);
        let mut rng = Rng(u.arbitrary()?);
        let dense = u.int_in_range(0..=3u8)?;
        let v = (0..n)
            .map(|_| match (dense, rng.below(8)) {
                (0, _) => rng.next() as i32,
                (1, 0) => 0,
                (2, k) => 1 << (k * 4),
                _ => -1,
            })
            .collect();
        let how = if one_in(u, 150)? { Ptr::Misaligned } else { Ptr::Aligned };
        bitmask_invalid |= how == Ptr::Misaligned;
        Buf::from_vec(how, v)
    } else {
        Buf::new(Ptr::Null, 0, 0)
    };

    // --- External noise.
    let mut noise_kind = 0u32;
    let mut noise_stride = 0u64;
    let noise: Buf<f32> = if one_in(u, 3)? {
        noise_kind = if one_in(u, 30)? { u.arbitrary()? } else { u.int_in_range(0..=1u32)? };
        noise_stride = match u.int_in_range(0..=15u8)? {
            1..=3 => 0,
            4..=5 => vocab as u64 + u.int_in_range(1..=9u64)?,
            6 if vocab > 1 => u.int_in_range(1..=vocab as u64 - 1)?, // invalid
            7 => overflowing_stride(u, rows, vocab, 4)?.unwrap_or(0),
            _ => vocab as u64,
        };
        let nspan = if rows == 0 {
            Some(0)
        } else if noise_stride == 0 {
            Some(vocab)
        } else {
            span(rows, vocab, noise_stride, 4)
        };
        let how = if one_in(u, 150)? { Ptr::Misaligned } else { Ptr::Aligned };
        if noise_kind > 1 || nspan.is_none() || how == Ptr::Misaligned {
            invalid = true;
        }
        if noise_stride != 0 && noise_stride < vocab as u64 {
            invalid = true;
        }
        // Only allocate what a sane size asks for (an overflowing span is refused unread).
        let n = nspan.filter(|&n| n <= 8 << 20).unwrap_or(0);
        if nspan.is_some() && nspan != Some(n) {
            return Ok(()); // too large to allocate here; nothing to test
        }
        Buf::from_vec(how, noise_values(u, n, noise_kind)?)
    } else {
        Buf::new(Ptr::Null, 0, 0.0)
    };

    // --- The batch struct, and which fields its size shows.
    let batch = tokenrace_batch {
        struct_size: BATCH_SIZE as u32,
        dtype,
        logits: logits_ptr,
        rows: rows as u32,
        vocab: vocab as u32,
        row_stride: stride,
        temperature: temps.ptr(),
        seeds: seeds.ptr(),
        offsets: offsets.ptr(),
        seeded: seeded.ptr(),
        noise: noise.ptr(),
        noise_kind,
        reserved0: if one_in(u, 20)? { u.arbitrary()? } else { 0 },
        noise_row_stride: noise_stride,
        top_k: ks.ptr(),
        top_p: ps.ptr(),
        min_p: mps.ptr(),
        prompt_ids: prompt.ids.ptr(),
        prompt_offsets: prompt.offsets.ptr(),
        output_ids: output_l.ids.ptr(),
        output_offsets: output_l.offsets.ptr(),
        repetition_penalty: rep.ptr(),
        frequency_penalty: freq.ptr(),
        presence_penalty: pres.ptr(),
        bias_ids: bias.ids.ptr(),
        bias_values: bias.values.ptr(),
        bias_offsets: bias.offsets.ptr(),
        allowed_ids: allowed.ids.ptr(),
        allowed_offsets: allowed.offsets.ptr(),
        allowed_rows: allowed_rows.ptr(),
        banned_ids: banned.ids.ptr(),
        banned_offsets: banned.offsets.ptr(),
        token_bitmask: bitmask.ptr(),
        bitmask_row_stride: bitmask_stride,
        penalty_last_n: last_n.ptr(),
        min_tokens: min_tokens.ptr(),
        stop_ids: stop.ids.ptr(),
        stop_offsets: stop.offsets.ptr(),
        top_n_sigma: nsigma.ptr(),
        // The request state, llama.cpp's typical, XTC, dynamic temperature and min_keep, bad
        // words, forced tokens and given-id logprobs are fuzzed by step_state_c_abi (against
        // the same draw with lists; the oracle here has no rule for their kept sets).
        requests: std::ptr::null(),
        request_ids: std::ptr::null(),
        min_keep: std::ptr::null(),
        typical_p: std::ptr::null(),
        xtc_probability: std::ptr::null(),
        xtc_threshold: std::ptr::null(),
        dynatemp_range: std::ptr::null(),
        dynatemp_exponent: std::ptr::null(),
        bad_words_ids: std::ptr::null(),
        bad_word_offsets: std::ptr::null(),
        bad_words_row_offsets: std::ptr::null(),
        forced_tokens: std::ptr::null(),
        logprob_token_ids: std::ptr::null(),
        order: std::ptr::null(),
        order_len: 0,
        logprob_token_offsets: std::ptr::null(),
        dry_multiplier: std::ptr::null(),
        dry_base: std::ptr::null(),
        dry_allowed_length: std::ptr::null(),
        dry_penalty_last_n: std::ptr::null(),
        dry_breaker_ids: std::ptr::null(),
        dry_breaker_offsets: std::ptr::null(),
        dry_breakers_row_offsets: std::ptr::null(),
        row_index: std::ptr::null(),
        // Not fuzzed yet: mirostat.
        mirostat: std::ptr::null(),
        mirostat_tau: std::ptr::null(),
        mirostat_eta: std::ptr::null(),
        mirostat_m: std::ptr::null(),
        mirostat_mu: std::ptr::null(),
        append_to_requests: 0,
        reserved1: 0,
    };
    // Every 8-byte field boundary from the first version on is a valid size.
    let sizes: Vec<usize> = (BATCH_V1..=BATCH_SIZE).step_by(8).collect();
    let (batch_buf, batch_size, batch_expect) = place(u, batch, &sizes, BATCH_V1)?;
    let batch_size = batch_size as usize;
    let sees = |offset: usize| batch_size >= offset + 8;
    let sees_k = sees(offset_of!(tokenrace_batch, top_k));
    let sees_p = sees(offset_of!(tokenrace_batch, top_p));
    let sees_minp = sees(offset_of!(tokenrace_batch, min_p));
    // The sampling step's fields: (list, whether its ids and offsets are seen).
    let sees_list = |ids: usize, offsets: usize| (sees(ids), sees(offsets));
    let lists_seen = [
        (&prompt, sees_list(offset_of!(tokenrace_batch, prompt_ids), offset_of!(tokenrace_batch, prompt_offsets))),
        (&output_l, sees_list(offset_of!(tokenrace_batch, output_ids), offset_of!(tokenrace_batch, output_offsets))),
        (&allowed, sees_list(offset_of!(tokenrace_batch, allowed_ids), offset_of!(tokenrace_batch, allowed_offsets))),
        (&banned, sees_list(offset_of!(tokenrace_batch, banned_ids), offset_of!(tokenrace_batch, banned_offsets))),
        (&stop, sees_list(offset_of!(tokenrace_batch, stop_ids), offset_of!(tokenrace_batch, stop_offsets))),
    ];
    let bias_seen = (
        sees(offset_of!(tokenrace_batch, bias_ids)),
        sees(offset_of!(tokenrace_batch, bias_values)),
        sees(offset_of!(tokenrace_batch, bias_offsets)),
    );
    let sees_rep = sees(offset_of!(tokenrace_batch, repetition_penalty));
    let sees_freq = sees(offset_of!(tokenrace_batch, frequency_penalty));
    let sees_pres = sees(offset_of!(tokenrace_batch, presence_penalty));
    let sees_allowed_rows = sees(offset_of!(tokenrace_batch, allowed_rows));
    let sees_bitmask = sees(offset_of!(tokenrace_batch, bitmask_row_stride));
    let sees_last_n = sees(offset_of!(tokenrace_batch, penalty_last_n));
    let sees_min_tokens = sees(offset_of!(tokenrace_batch, min_tokens));
    let sees_nsigma = sees(offset_of!(tokenrace_batch, top_n_sigma));
    // A list is what the library sees of it: the ids only when their field is inside the size
    // (else NULL), the offsets likewise. Only a list seen whole is judged as generated; one whose
    // offsets are unseen is judged by its entries alone (entries without offsets are refused).
    for (l, (ids_seen, offs_seen)) in lists_seen {
        if offs_seen {
            invalid |= l.invalid;
        } else if ids_seen && l.ids.given() {
            invalid = true;
        }
    }
    match bias_seen {
        (_, _, true) => invalid |= bias.invalid,
        (ids, values, false) => invalid |= (ids && bias.ids.given()) || (values && bias.values.given()),
    }
    let seen_rows = |seen: bool, b: &Buf<f32>, bad: &dyn Fn(f32) -> bool| {
        seen && b.given() && (b.misaligned() || b.v.iter().any(|&x| bad(x)))
    };
    invalid |= seen_rows(sees_rep, &rep, &|r| !(r.is_finite() && r > 0.0));
    invalid |= seen_rows(sees_freq, &freq, &|v| !v.is_finite());
    invalid |= seen_rows(sees_pres, &pres, &|v| !v.is_finite());
    invalid |= seen_rows(sees_nsigma, &nsigma, &|n| !n.is_finite());
    let seen_ints = |seen: bool, b: &Buf<i32>| seen && b.given() && (b.misaligned() || b.v.iter().any(|&n| n < 0));
    invalid |= seen_ints(sees_last_n, &last_n) || seen_ints(sees_min_tokens, &min_tokens);
    let allowed_seen = lists_seen[2].1 .1 && allowed.offsets.given();
    if sees_allowed_rows && allowed_rows.given() && !allowed_seen {
        invalid = true;
    }
    if sees_bitmask && bitmask.given() {
        invalid |= bitmask_invalid;
    } else if sees(offset_of!(tokenrace_batch, token_bitmask)) && bitmask.given() {
        // The words seen without their stride: the stride is 0 (ceil(vocab / 32)).
        if bitmask.how == Ptr::Aligned && span(rows, words, words as u64, 4).is_none_or(|n| bitmask.v.len() < n) {
            return Ok(()); // the buffer made for another stride is too short for this one
        }
        invalid |= bitmask.misaligned();
    }

    // Per-row rules, on the arrays the library sees.
    for (misaligned, seen) in [
        (temps.misaligned(), true),
        (seeds.misaligned(), true),
        (offsets.misaligned(), true),
        (ks.misaligned(), sees_k),
        (ps.misaligned(), sees_p),
        (mps.misaligned(), sees_minp),
    ] {
        if misaligned && seen {
            invalid = true;
        }
    }
    let aligned_rows = |b: &Buf<f32>| b.how == Ptr::Aligned;
    if aligned_rows(&temps) {
        invalid |= temps.v.iter().any(|&t| !(t.is_finite() && t >= 0.0));
    }
    if sees_p && aligned_rows(&ps) {
        invalid |= ps.v.iter().any(|&p| !(p > 0.0 && p <= 1.0));
    }
    if sees_minp && aligned_rows(&mps) {
        invalid |= mps.v.iter().any(|&p| !(0.0..=1.0).contains(&p));
    }
    if seeded.given() && !seeds.given() {
        invalid = true;
    }

    // --- The output.
    let logprob_mode = if one_in(u, 30)? { u.arbitrary()? } else { u.int_in_range(0..=1u32)? };
    let top_n: u32 = match u.int_in_range(0..=19u8)? {
        1..=2 => 1,
        3 => vocab.min(64) as u32,
        4 => vocab.min(1 << 16) as u32,
        5 => vocab as u32 + 1, // invalid
        6 => u32::MAX,
        7..=9 => u.int_in_range(1..=8)?,
        _ => 0,
    };
    let topn_len = rows * top_n as usize;
    let topn_alloc = topn_len <= 1 << 20;
    let mut h = [Ptr::Aligned; 6];
    h[0] = pick_ptr(u, 40)?;
    for x in h.iter_mut().skip(1) {
        *x = pick_ptr(u, 2)?;
    }
    if !topn_alloc {
        h[4] = Ptr::Null;
        h[5] = Ptr::Null;
    }
    if logprob_mode > 1 {
        invalid = true;
    }
    if h[0] == Ptr::Null && rows > 0 {
        invalid = true;
    }
    if h.contains(&Ptr::Misaligned) {
        invalid = true;
    }
    if top_n > 0 && top_n as usize > vocab {
        invalid = true;
    }
    let mut outs = Outs::new(h, rows, if topn_alloc { topn_len } else { 0 });
    let mut out = outs.c(logprob_mode, top_n);
    // An output placed inside an input's bytes or an earlier output's (the call must refuse it
    // before it writes anything).
    let out_bytes = rows * 4;
    if rows > 0 && one_in(u, 25)? {
        let which = u.int_in_range(0..=3u8)?;
        let (base, len): (*mut u8, usize) = match u.int_in_range(0..=2u8)? {
            0 if elem == 4 && logits_f32.how == Ptr::Aligned => (logits_f32.ptr() as *mut u8, logits_f32.v.len() * 4),
            1 if h[0] == Ptr::Aligned && which > 0 => (outs.tokens.ptr_mut() as *mut u8, out_bytes),
            _ if temps.how == Ptr::Aligned => (temps.ptr() as *mut u8, rows * 4),
            _ => (std::ptr::null_mut(), 0),
        };
        if len >= out_bytes && !base.is_null() {
            let at = 4 * u.int_in_range(0..=(len - out_bytes) / 4)?;
            let p = base.wrapping_add(at);
            match which {
                0 => out.tokens = p as *mut i32,
                1 => out.flags = p as *mut u32,
                2 => out.logprobs = p as *mut f32,
                _ => out.ranks = p as *mut i32,
            }
            invalid = true;
        }
    }
    let out_sizes = [OUTPUT_V1, OUTPUT_V1 + 8, OUTPUT_V1 + 16, OUTPUT_V1 + 20, OUTPUT_SIZE];
    let (out_buf, _, out_expect) = place(u, out, &out_sizes, OUTPUT_V1)?;

    let expect = batch_expect.or(out_expect).or(invalid.then_some(INVALID_ARGUMENT)).unwrap_or(OK);

    // --- The draw.
    // Every input's bytes, compared before and after the call.
    let inputs = || {
        (
            logits_f32.bytes(),
            logits_u16.bytes(),
            temps.bytes(),
            seeds.bytes(),
            offsets.bytes(),
            seeded.bytes(),
            ks.bytes(),
            ps.bytes(),
            mps.bytes(),
            noise.bytes(),
            [prompt.bytes(), output_l.bytes(), bias.bytes(), allowed.bytes(), banned.bytes()].concat(),
            [rep.bytes(), freq.bytes(), pres.bytes(), allowed_rows.bytes(), bitmask.bytes()].concat(),
        )
    };
    let inputs_before = inputs();
    let batch_bytes = batch_buf.0;
    let out_bytes = out_buf.0;
    // SAFETY: every pointer covers what the batch claims (see Buf); the structs have 256 bytes.
    let st = code(
        unsafe {
            tokenrace_draw(
                a.0,
                batch_buf.0.as_ptr() as *const tokenrace_batch,
                out_buf.0.as_ptr() as *mut tokenrace_output,
            )
        },
        "tokenrace_draw",
    );
    let err = check_last_error(st, "tokenrace_draw");
    assert!(batch_buf.0 == batch_bytes, "tokenrace_draw wrote into the batch struct");
    assert!(out_buf.0 == out_bytes, "tokenrace_draw wrote into the output struct");
    let inputs_after = inputs();
    assert!(inputs_before == inputs_after, "tokenrace_draw wrote into its inputs");
    assert_eq!(
        st,
        expect,
        "tokenrace_draw: status {} but the rules say {} (last error {err:?})",
        status_name(st),
        status_name(expect)
    );
    if verbose() {
        eprintln!(
            "draw: {} dtype {dtype} rows {rows} vocab {vocab} stride {stride} threads {threads} simd {} noise {} \
             seeded {} ext-noise {} top_n {top_n} step [prompt output bias allowed banned penalties bitmask] {:?} \
             {err}",
            status_name(st),
            cfg.simd,
            cfg.noise,
            seeds.given(),
            noise.given(),
            [
                prompt.offsets.given(),
                output_l.offsets.given(),
                bias.offsets.given(),
                allowed.offsets.given(),
                banned.offsets.given(),
                rep.given() || freq.given() || pres.given(),
                bitmask.given()
            ]
            .map(u8::from)
        );
    }
    if st != OK {
        assert!(outs.untouched(), "tokenrace_draw failed ({err}) but wrote into the outputs");
        return Ok(());
    }

    // --- Success: the semantics that can be checked exactly.
    let stride = eff_stride as usize;
    let mut info = Vec::with_capacity(rows);
    let sees_seeded_mask = seeded.given();
    for r in 0..rows {
        let t = if temps.given() { temps.at(r) } else { 1.0 };
        let greedy = t < greedy_below;
        let is_seeded = seeds.given() && (!sees_seeded_mask || seeded.at(r) != 0);
        let x = row_values(dtype, &logits_f32.v, &logits_u16.v, r * stride, vocab);
        // The sampling step's inputs the library saw make the effective row (HAS_NAN is the
        // logits' own, masked or not); the rules below are judged on it.
        let has_nan = x.iter().any(|v| v.is_nan());
        fn seen_list(l: &CsrList, seen: bool, r: usize) -> &[i32] {
            if seen {
                l.row_ids(r)
            } else {
                &[]
            }
        }
        let per_row_or = |b: &Buf<f32>, seen: bool, off: f32| if seen && b.given() { b.at(r) } else { off };
        let inputs = rf::RowInputs {
            prompt: seen_list(&prompt, lists_seen[0].1 .1, r),
            output: seen_list(&output_l, lists_seen[1].1 .1, r),
            repetition: per_row_or(&rep, sees_rep, 1.0),
            frequency: per_row_or(&freq, sees_freq, 0.0),
            presence: per_row_or(&pres, sees_pres, 0.0),
            bias_ids: seen_list(&bias, bias_seen.2, r),
            bias_values: if bias_seen.2 { bias.row_values(r) } else { &[] },
            allowed: (lists_seen[2].1 .1
                && allowed.offsets.given()
                && !(sees_allowed_rows && allowed_rows.given() && allowed_rows.at(r) == 0))
                .then(|| allowed.row_ids(r)),
            banned: seen_list(&banned, lists_seen[3].1 .1, r),
            last_n: if sees_last_n && last_n.given() { last_n.at(r) } else { 0 },
            stop: seen_list(&stop, lists_seen[4].1 .1, r),
            min_tokens: if sees_min_tokens && min_tokens.given() { min_tokens.at(r) } else { 0 },
            bitmask: (sees(offset_of!(tokenrace_batch, token_bitmask)) && bitmask.given()).then(|| {
                let st = if sees_bitmask && bitmask_stride != 0 { bitmask_stride as usize } else { words };
                &bitmask.v[r * st..r * st + words]
            }),
        };
        let vals = rf::effective_row(&x, &inputs);
        info.push(RowInfo { greedy, deterministic: greedy || is_seeded || noise.given() });
        let tok = outs.tokens.at(r);
        assert!(tok >= 0 && (tok as usize) < vocab, "row {r}: token {tok} not in [0, {vocab})");
        let tok = tok as usize;
        let first_inf = vals.iter().position(|&x| x == f32::INFINITY);
        let m = vals.iter().copied().filter(|x| x.is_finite()).fold(f32::NEG_INFINITY, f32::max);
        let empty = first_inf.is_none() && m == f32::NEG_INFINITY;
        let want_flags =
            has_nan as u32 | (first_inf.is_some() as u32) << 1 | (empty as u32) << 2 | (greedy as u32) << 3;
        if outs.flags.given() {
            assert_eq!(outs.flags.at(r), want_flags, "row {r}: flags");
        }
        if let Some(i) = first_inf {
            assert_eq!(tok, i, "row {r}: the first +inf must win");
        } else if empty {
            assert_eq!(tok, 0, "row {r}: an empty row draws token 0");
        } else if greedy {
            let argmax = vals.iter().position(|&x| x == m).unwrap();
            assert_eq!(tok, argmax, "row {r}: greedy token is not the lowest argmax");
        } else {
            let x = vals[tok];
            assert!(
                x.is_finite() && x - m > f32::NEG_INFINITY,
                "row {r}: sampled a masked/NaN/inf logit {x} (max {m})"
            );
            if sees_k && ks.given() {
                let k = ks.at(r);
                if k > 0 && (k as usize) < vocab {
                    let mut fin: Vec<f32> = vals.iter().copied().filter(|x| x.is_finite()).collect();
                    if fin.len() >= k as usize {
                        fin.sort_by(|a, b| b.partial_cmp(a).unwrap());
                        let kth = fin[k as usize - 1];
                        assert!(x >= kth, "row {r}: token logit {x} below the top-{k} cut {kth}");
                    }
                }
            }
            if sees_nsigma && nsigma.given() && nsigma.at(r) > 0.0 {
                // top-nσ over the effective row's finite values, with room for the f64 sums.
                let fin: Vec<f64> = vals.iter().filter(|x| x.is_finite()).map(|&x| x as f64).collect();
                let mean = fin.iter().sum::<f64>() / fin.len() as f64;
                let sigma = (fin.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / fin.len() as f64).sqrt();
                let cut = m as f64 - nsigma.at(r) as f64 * sigma;
                assert!(
                    x as f64 >= cut - 1e-9 * (1.0 + cut.abs() + sigma),
                    "row {r}: token logit {x} below the top-nσ cut {cut} (max {m}, sigma {sigma})"
                );
            }
            if sees_minp && mps.given() {
                let mp = mps.at(r) as f64;
                let inv_t = {
                    let i = 1.0 / t;
                    if i.is_finite() {
                        i
                    } else {
                        f32::MAX
                    }
                } as f64;
                // w = exp((x - m) / T), with room for an f32 rounding of x - m and of the
                // product (the library's cut is the smallest f32 whose weight reaches min_p).
                let arg = (x as f64 - m as f64) * inv_t;
                let w = (arg + arg.abs() * 1e-6 + 1e-12).exp();
                assert!(w >= mp, "row {r}: token weight {} below min_p {mp} (logit {x}, max {m}, T {t})", arg.exp());
            }
        }
        // Logprobs and ranks are of the logits as given (RAW) or of the effective row
        // (PROCESSED): +inf values share the mass, a row without finite values has none.
        let lrow = if logprob_mode == 0 { &x } else { &vals };
        let n_inf = lrow.iter().filter(|&&v| v == f32::INFINITY).count();
        let lempty = n_inf == 0 && !lrow.iter().any(|v| v.is_finite());
        let lp = outs.logprobs.given().then(|| outs.logprobs.at(r));
        if let Some(lp) = lp {
            assert!(!lp.is_nan() && lp <= 0.0, "row {r}: logprob {lp}");
            if lempty || (n_inf > 0 && lrow[tok] != f32::INFINITY) {
                assert_eq!(lp, f32::NEG_INFINITY, "row {r}: the logprob of a token without mass (mode {logprob_mode})");
            } else if n_inf > 0 {
                let want = -(n_inf as f64).ln();
                assert!((lp as f64 - want).abs() <= 1e-6, "row {r}: logprob {lp} of a +inf token among {n_inf}");
            }
        }
        if outs.ranks.given() {
            let rank = outs.ranks.at(r);
            assert!(rank >= 1 && rank as usize <= vocab, "row {r}: rank {rank}");
            if lempty {
                assert_eq!(rank as usize, vocab, "row {r}: an empty row's rank");
            }
        }
        let tn = top_n as usize;
        if tn > 0 {
            let ids = outs.topn_ids.given().then(|| &outs.topn_ids.v[r * tn..(r + 1) * tn]);
            let lps = outs.topn_lp.given().then(|| &outs.topn_lp.v[r * tn..(r + 1) * tn]);
            if let Some(ids) = ids {
                let mut seen = ids.to_vec();
                seen.sort_unstable();
                seen.dedup();
                assert_eq!(seen.len(), tn, "row {r}: top-n ids repeat: {ids:?}");
                assert!(ids.iter().all(|&i| i >= 0 && (i as usize) < vocab), "row {r}: top-n id out of range");
            }
            if let Some(lps) = lps {
                assert!(lps.iter().all(|&x| !x.is_nan() && x <= 0.0), "row {r}: top-n logprobs {lps:?}");
                for j in 1..tn {
                    assert!(lps[j] <= lps[j - 1], "row {r}: top-n logprobs not descending at {j}");
                    if let Some(ids) = ids {
                        if lps[j] == lps[j - 1] {
                            assert!(ids[j] > ids[j - 1], "row {r}: top-n tie not lowest id first at {j}");
                        }
                    }
                }
                if let (Some(ids), Some(lp)) = (ids, lp) {
                    if let Some(j) = ids.iter().position(|&i| i as usize == tok) {
                        assert_eq!(lps[j].to_bits(), lp.to_bits(), "row {r}: the token's logprob differs in top-n");
                    }
                }
                if let (Some(lp), true) = (lp, outs.ranks.given()) {
                    let above = lps.iter().filter(|&&x| x >= lp).count();
                    assert!(above <= outs.ranks.at(r) as usize, "row {r}: rank below the top-n count");
                }
            }
        }
    }

    // --- The same draw on another SIMD level and thread count, with the same seed.
    let first = outs.all_bytes();
    let b = other_level_sampler(&cfg);
    let mut outs_b = Outs::new(h, rows, if topn_alloc { topn_len } else { 0 });
    let mut out_b = outs_b.c(logprob_mode, top_n);
    // SAFETY: as above.
    let st = code(
        unsafe { tokenrace_draw(b.0, batch_buf.0.as_ptr() as *const tokenrace_batch, &mut out_b) },
        "tokenrace_draw",
    );
    assert_eq!(st, OK, "the same draw on the second sampler: {}", last_error());
    if verbose() {
        eprintln!(
            "  mode {logprob_mode} greedy_below {greedy_below} temps {:?} k {:?} p {:?} min_p {:?} (sees {sees_k} {sees_p} {sees_minp})",
            &temps.v[..temps.v.len().min(4)],
            &ks.v[..ks.v.len().min(4)],
            &ps.v[..ps.v.len().min(4)],
            &mps.v[..mps.v.len().min(4)]
        );
        eprintln!("  a: tokens {:?} logprobs {:?} ranks {:?}", &outs.tokens.v, &outs.logprobs.v, &outs.ranks.v);
        eprintln!("  b: tokens {:?} logprobs {:?} ranks {:?}", &outs_b.tokens.v, &outs_b.logprobs.v, &outs_b.ranks.v);
        let vals =
            row_values(dtype, &logits_f32.v, &logits_u16.v, 0, vocab.min(logits_f32.v.len().max(logits_u16.v.len())));
        let mut d = vals.clone();
        d.sort_by(|a, b| b.total_cmp(a));
        d.dedup_by(|a, b| a.to_bits() == b.to_bits());
        let counts: Vec<(u32, usize)> =
            d.iter().map(|x| (x.to_bits(), vals.iter().filter(|y| y.to_bits() == x.to_bits()).count())).collect();
        eprintln!("  row 0 bit patterns and counts: {counts:x?}");
        let pos: Vec<usize> = (0..vals.len()).filter(|&i| vals[i].to_bits() != vals[0].to_bits()).take(20).collect();
        eprintln!("  row 0 first value {:x}, positions differing: {pos:?}", vals[0].to_bits());
        eprintln!("  row 0 distinct values (desc, first 8): {:?} of {}", &d[..d.len().min(8)], d.len());
    }
    compare(&outs, &outs_b, &info, top_n as usize, cfg.has_seed != 0, "another level/thread count, same seed");
    drop(b);

    // --- The same draw again on the first sampler.
    let mut outs2 = Outs::new(h, rows, if topn_alloc { topn_len } else { 0 });
    let mut out2 = outs2.c(logprob_mode, top_n);
    // SAFETY: as above.
    let st = code(
        unsafe { tokenrace_draw(a.0, batch_buf.0.as_ptr() as *const tokenrace_batch, &mut out2) },
        "tokenrace_draw",
    );
    assert_eq!(st, OK, "the same draw repeated: {}", last_error());
    assert!(outs.all_bytes() == first);
    compare(&outs, &outs2, &info, top_n as usize, false, "the draw repeated");
    Ok(())
}

/// Compares two draws of one batch: with `all`, every output of every row bit for bit; else the
/// rows whose draw does not depend on the noise stream, and what never depends on noise.
fn compare(a: &Outs, b: &Outs, info: &[RowInfo], top_n: usize, all: bool, what: &str) {
    for (r, ri) in info.iter().enumerate() {
        let same_token = a.tokens.at(r) == b.tokens.at(r);
        if all || ri.deterministic {
            assert!(
                same_token,
                "{what}: row {r} (greedy {}) drew {} then {}",
                ri.greedy,
                a.tokens.at(r),
                b.tokens.at(r)
            );
        }
        if a.flags.given() {
            assert_eq!(a.flags.at(r), b.flags.at(r), "{what}: row {r}: flags");
        }
        if same_token {
            if a.logprobs.given() {
                assert_eq!(a.logprobs.at(r).to_bits(), b.logprobs.at(r).to_bits(), "{what}: row {r}: logprob");
            }
            if a.ranks.given() {
                assert_eq!(a.ranks.at(r), b.ranks.at(r), "{what}: row {r}: rank");
            }
        }
        if top_n > 0 {
            let s = r * top_n..(r + 1) * top_n;
            if a.topn_ids.given() {
                assert_eq!(a.topn_ids.v[s.clone()], b.topn_ids.v[s.clone()], "{what}: row {r}: top-n ids");
            }
            if a.topn_lp.given() {
                let x: Vec<u32> = a.topn_lp.v[s.clone()].iter().map(|x| x.to_bits()).collect();
                let y: Vec<u32> = b.topn_lp.v[s].iter().map(|x| x.to_bits()).collect();
                assert_eq!(x, y, "{what}: row {r}: top-n logprobs");
            }
        }
    }
}
