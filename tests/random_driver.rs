//! The randomized bad-input and oracle driver: thousands of random draw calls through the C entry
//! point (`tokenrace_draw`, called as C calls it, on the C structs), from a fixed list of seeds.
//!
//! Each call is either valid or has exactly one defect, so that what the call must answer is
//! known. Valid calls mix dtypes, row strides (contiguous, padded, and for one row any stride up
//! to `u64::MAX`), `struct_size`s (the first version, sizes between versions, larger ones with a
//! zero tail), NULL for every optional array, masks, NaN and +inf, temperatures from 0 to FLT_MAX,
//! filters (top-k of any int32), seeded, unseeded and external-noise rows (EXP and LOG_EXP, also
//! broadcast), both logprob modes and top-n. Defects: rows above `max_rows`, vocab 0, a vocab
//! other than the sampler's, a bad dtype, noise kind or logprob mode, a row stride below the vocab
//! or whose byte span overflows (also the smallest overflowing one), the same for the noise
//! stride, a bad temperature, top-p or min-p in one row, `seeded` without `seeds`, top-n above the
//! vocab, a `struct_size` too small, inside a field, or larger with a nonzero tail, NULL
//! required pointers and structs, misaligned arrays.
//!
//! About half the valid calls also carry the sampling step's inputs (prompt and output histories
//! with repetition, frequency and presence penalties, logit bias with -inf bans, allowed lists for
//! the rows `allowed_rows` marks, banned lists, a token bitmask at any row stride; lists with
//! unread entries before the first and after the last offset), checked against the reference of
//! the step (`rf::effective_row`, `rf::draw_step`, as `tests/step_reference.rs` uses it); a batch
//! of an older version carries them now and then too, and must not read them. Their defects, for
//! each of the five lists (prompt, output, allowed, banned, bias): an id out of range in one row
//! (checked by the rows' tasks, after the rows were keyed), decreasing offsets, a last offset
//! whose entries overflow the address space (2^61 up to `u64::MAX`), entries given with NULL
//! offsets, offsets that count entries of a NULL array; and a NaN or +inf bias, a bad penalty,
//! `allowed_rows` without allowed lists, a bitmask stride below its words, an output array that
//! shares memory with an input or an earlier output.
//!
//! Every sampler has a twin of the same config and seed that gets every valid call (and must
//! write the same outputs) and none of the refused ones. After every refusal, both draw a valid
//! batch of unseeded sampling rows: the same tokens, so the refusal took no key of the stream;
//! one of the three samplers has a pool attached (and 3 threads), whose rows handed out and
//! skipped must equal the twin's pool's, so the refusal gave back its pool rows.
//!
//! For every call: the status is the documented one; a failure names the field and row in
//! `tokenrace_last_error()` and writes nothing (every output is pre-filled with sentinels, and a
//! sentinel tail after each array catches writes past the rows); on success every id is in
//! `[0, vocab)`, the flags are the row's, and the tokens, logprobs, ranks and top-n equal the
//! independent float64 reference (`tests/common/reference.rs`), unseeded rows included (the
//! reference follows the sampler's key stream, which a failed call must not advance), skipping
//! near ties and filter cuts within rounding as `tests/reference.rs` does; and the sampler's
//! counters add up.
//!
//! `cargo test --test random_driver -- --nocapture` prints the count of calls per category.
mod common;

use common::reference as rf;
use common::{gen_row, last_error, pick_dist, TestRng};
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::mem::{offset_of, size_of};
use tokenrace::internals::api::*;
use tokenrace::internals::types::*;
use tokenrace::{Bf16, F16};

/// Each seed is one reproducible run (a failure names its seed and call number).
const SEEDS: [u64; 4] = [1, 2, 0x5eed_cafe_f00d, u64::MAX];
const CALLS_PER_SEED: usize = 1500;
/// The kinds of defect `add_defect` makes (each must be reached).
const KINDS_OF_DEFECT: usize = 56;
/// Small vocabularies (the rules, not the speed, are under test), around the 256-token block.
const VOCABS: [usize; 14] = [1, 2, 3, 5, 16, 100, 255, 256, 257, 300, 511, 600, 1000, 2500];
/// Valid temperatures: greedy (0, -0, subnormal, below the threshold), the threshold itself, tiny,
/// ordinary and huge ones up to FLT_MAX.
const TEMPS: [f32; 15] = [0.0, -0.0, 1e-40, 1e-6, 1e-5, 1e-4, 0.3, 0.7, 1.0, 1.0, 1.0, 2.0, 100.0, 1e30, f32::MAX];
/// Valid filter values: off in every documented way, tiny, ordinary and extreme ones.
const TOP_KS: [i32; 9] = [0, 1, 2, 5, 40, -3, i32::MIN, i32::MAX, 1 << 20];
const TOP_PS: [f32; 8] = [1.0, 0.3, 0.8, 0.95, 0.999, 1e-30, f32::MIN_POSITIVE, 0.5];
const MIN_PS: [f32; 8] = [0.0, -0.0, 0.02, 0.1, 0.5, 1.0, 1e-30, 0.9];

const BATCH_FULL: usize = size_of::<tokenrace_batch>();
const OUT_FULL: usize = size_of::<tokenrace_output>();
/// The first version of `tokenrace_batch` ends where the filters begin (they came later).
const BATCH_V1: usize = offset_of!(tokenrace_batch, top_k);
/// The first version of `tokenrace_output` ends with `topn_logprobs`.
const OUT_V1: usize = offset_of!(tokenrace_output, topn_logprobs) + size_of::<*mut f32>();
/// Room for a struct larger than this library's (a caller built against a newer header).
const TAIL: usize = 32;

/// Output sentinels, compared by bits; the logprob one is a NaN payload no computation makes.
const TOKEN_SENTINEL: i32 = -0x05a5_a5a5;
const FLAG_SENTINEL: u32 = 0xdead_beef;
const LP_SENTINEL: u32 = 0x7fc0_dead;
/// Sentinel elements after each output array: a write past the rows is caught.
const GUARD: usize = 3;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Dtype {
    F32,
    Bf16,
    F16,
}

impl Dtype {
    fn elem_size(self) -> usize {
        if self == Dtype::F32 {
            4
        } else {
            2
        }
    }
    fn field(self) -> u32 {
        (match self {
            Dtype::F32 => tokenrace_dtype::F32,
            Dtype::Bf16 => tokenrace_dtype::Bf16,
            Dtype::F16 => tokenrace_dtype::F16,
        }) as u32
    }
}

/// The logits as the caller's memory holds them.
enum Buf {
    F32(Vec<f32>),
    Bf16(Vec<Bf16>),
    F16(Vec<F16>),
}

impl Buf {
    fn ptr(&self) -> *const c_void {
        match self {
            Buf::F32(v) => v.as_ptr() as *const c_void,
            Buf::Bf16(v) => v.as_ptr() as *const c_void,
            Buf::F16(v) => v.as_ptr() as *const c_void,
        }
    }
    fn bytes(&self) -> &[u8] {
        // SAFETY: plain numbers, viewed as the bytes they are made of.
        unsafe {
            match self {
                Buf::F32(v) => std::slice::from_raw_parts(v.as_ptr() as *const u8, v.len() * 4),
                Buf::Bf16(v) => std::slice::from_raw_parts(v.as_ptr() as *const u8, v.len() * 2),
                Buf::F16(v) => std::slice::from_raw_parts(v.as_ptr() as *const u8, v.len() * 2),
            }
        }
    }
    fn get(&self, i: usize) -> f32 {
        match self {
            Buf::F32(v) => v[i],
            Buf::Bf16(v) => v[i].to_f32(),
            Buf::F16(v) => v[i].to_f32(),
        }
    }
}

struct ExtNoise {
    values: Vec<f32>,
    kind: u32,
    row_stride: u64,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Null {
    Sampler,
    Batch,
    Out,
    Logits,
    Tokens,
}

/// One draw call: the batch and output fields as a C caller sets them.
struct Case {
    rows: usize,
    vocab: usize,
    dtype: Dtype,
    dtype_field: u32,
    row_stride: u64,
    /// Each row as the library reads it (after the dtype's rounding).
    x: Vec<Vec<f32>>,
    logits: Buf,
    temperature: Option<Vec<f32>>,
    seeds: Option<Vec<u64>>,
    offsets: Option<Vec<u64>>,
    seeded: Option<Vec<u8>>,
    noise: Option<ExtNoise>,
    top_k: Option<Vec<i32>>,
    top_p: Option<Vec<f32>>,
    min_p: Option<Vec<f32>>,
    batch_size: usize,
    /// Written into the last byte of a batch larger than this library's (0: a zero tail).
    batch_tail: u8,
    logprob_mode: u32,
    top_n: usize,
    /// Which optional outputs are given: flags, logprobs, ranks, topn_ids, topn_logprobs.
    wants: [bool; 5],
    out_size: usize,
    out_tail: u8,
    null: Option<Null>,
    /// The array given through a misaligned pointer.
    misaligned: Option<&'static str>,
    /// The sampling step's inputs (read only by a batch of the full size).
    pipe: Pipe,
    /// A list (`prompt`, `output`, `allowed`, `banned`, `bias`) whose offsets are passed as NULL
    /// while its entries are given.
    null_offsets: Option<&'static str>,
    /// An entry array passed as NULL while its list's offsets count entries.
    null_entries: Option<&'static str>,
    /// An output array placed inside another array's bytes: (output, the other array, byte
    /// offset into it).
    overlap: Option<(&'static str, &'static str, usize)>,
}

/// A CSR list: row r's entries are `ids[offsets[r]..offsets[r + 1]]`.
#[derive(Clone, Debug, Default)]
struct List {
    ids: Vec<i32>,
    offsets: Vec<u64>,
}

impl List {
    fn row(&self, r: usize) -> &[i32] {
        &self.ids[self.offsets[r] as usize..self.offsets[r + 1] as usize]
    }
}

/// The sampling step's inputs of a draw (each `None`: not given).
#[derive(Clone, Debug, Default)]
struct Pipe {
    prompt: Option<List>,
    output: Option<List>,
    repetition: Option<Vec<f32>>,
    frequency: Option<Vec<f32>>,
    presence: Option<Vec<f32>>,
    /// The pairs' ids and offsets, and their values.
    bias: Option<(List, Vec<f32>)>,
    allowed: Option<List>,
    allowed_rows: Option<Vec<u8>>,
    banned: Option<List>,
    /// The words, and `bitmask_row_stride` (0: ceil(vocab / 32)).
    bitmask: Option<(Vec<i32>, u64)>,
}

impl Pipe {
    fn is_some(&self) -> bool {
        self.prompt.is_some()
            || self.output.is_some()
            || self.repetition.is_some()
            || self.frequency.is_some()
            || self.presence.is_some()
            || self.bias.is_some()
            || self.allowed.is_some()
            || self.banned.is_some()
            || self.bitmask.is_some()
    }
    /// The list named `name` (`bias`: its ids).
    fn list_mut(&mut self, name: &str) -> Option<&mut List> {
        match name {
            "prompt" => self.prompt.as_mut(),
            "output" => self.output.as_mut(),
            "allowed" => self.allowed.as_mut(),
            "banned" => self.banned.as_mut(),
            _ => self.bias.as_mut().map(|b| &mut b.0),
        }
    }
    /// Row r's inputs as the reference takes them.
    fn row(&self, r: usize, vocab: usize) -> rf::RowInputs<'_> {
        let words = vocab.div_ceil(32);
        rf::RowInputs {
            prompt: self.prompt.as_ref().map_or(&[], |l| l.row(r)),
            output: self.output.as_ref().map_or(&[], |l| l.row(r)),
            repetition: self.repetition.as_ref().map_or(1.0, |v| v[r]),
            frequency: self.frequency.as_ref().map_or(0.0, |v| v[r]),
            presence: self.presence.as_ref().map_or(0.0, |v| v[r]),
            last_n: 0,
            bias_ids: self.bias.as_ref().map_or(&[], |b| b.0.row(r)),
            bias_values: self.bias.as_ref().map_or(&[], |b| &b.1[b.0.offsets[r] as usize..b.0.offsets[r + 1] as usize]),
            allowed: self
                .allowed
                .as_ref()
                .filter(|_| self.allowed_rows.as_ref().is_none_or(|m| m[r] != 0))
                .map(|l| l.row(r)),
            banned: self.banned.as_ref().map_or(&[], |l| l.row(r)),
            bitmask: self.bitmask.as_ref().map(|(w, stride)| {
                let at = r * if *stride == 0 { words } else { *stride as usize };
                &w[at..at + words]
            }),
            stop: &[],
            min_tokens: 0,
        }
    }
}

impl Case {
    fn temperature(&self, r: usize) -> f32 {
        self.temperature.as_ref().map_or(1.0, |t| t[r])
    }
    /// The seed and offset of a seeded row.
    fn seed_of(&self, r: usize) -> Option<(u64, u64)> {
        let seeds = self.seeds.as_ref()?;
        if self.seeded.as_ref().is_some_and(|m| m[r] == 0) {
            return None;
        }
        Some((seeds[r], self.offsets.as_ref().map_or(0, |o| o[r])))
    }
    /// Whether the batch's `struct_size` covers the field at `offset` (a caller built against an
    /// older header has none of the later fields: they keep their defaults, here filters off).
    fn reads(&self, offset: usize) -> bool {
        self.batch_size >= offset + 8
    }
    /// Whether the sampling step's inputs are read (they came with the full batch).
    fn reads_pipe(&self) -> bool {
        self.batch_size >= BATCH_FULL
    }
    fn filters(&self, r: usize) -> rf::Filters {
        let mut f = rf::Filters::OFF;
        if self.reads(offset_of!(tokenrace_batch, top_k)) {
            f.top_k = self.top_k.as_ref().map_or(0, |v| v[r]);
        }
        if self.reads(offset_of!(tokenrace_batch, top_p)) {
            f.top_p = self.top_p.as_ref().map_or(1.0, |v| v[r]);
        }
        if self.reads(offset_of!(tokenrace_batch, min_p)) {
            f.min_p = self.min_p.as_ref().map_or(0.0, |v| v[r]);
        }
        f
    }
    fn noise_row(&self, r: usize) -> Option<rf::Noise<'_>> {
        let n = self.noise.as_ref()?;
        let at = r * n.row_stride as usize; // row 0 is at 0 whatever the stride
        let row = &n.values[at..at + self.vocab];
        Some(if n.kind == tokenrace_noise_kind::Exp as u32 { rf::Noise::Exp(row) } else { rf::Noise::LogExp(row) })
    }
    fn describe(&self) -> String {
        format!(
            "{} rows x vocab {} ({:?}, row_stride {}), T {:?}, seeds {:?}, offsets {:?}, seeded {:?}, noise {:?}, \
             top_k {:?}, top_p {:?}, min_p {:?}, batch size {}, mode {}, top_n {}, outputs {:?}, out size {}, \
             sampling step {:?}",
            self.rows,
            self.vocab,
            self.dtype,
            self.row_stride,
            self.temperature,
            self.seeds,
            self.offsets,
            self.seeded,
            self.noise.as_ref().map(|n| (n.kind, n.row_stride)),
            self.top_k,
            self.top_p,
            self.min_p,
            self.batch_size,
            self.logprob_mode,
            self.top_n,
            self.wants,
            self.out_size,
            self.pipe
        )
    }
}

/// One sampler under test, and what the reference expects of it.
struct Subject {
    name: &'static str,
    ptr: *mut tokenrace_sampler,
    max_rows: usize,
    /// 0: any vocab.
    vocab_size: usize,
    greedy_below: f32,
    /// The reference's copy of the key stream of unseeded rows.
    stream: rf::KeyStream,
    /// The counters the sampler must report (every failed call counts in `rejected_calls`).
    want: tokenrace_sampler_stats,
    /// The pool attached to the sampler, if any (its noise is not the stream's).
    pool: Option<*mut tokenrace_pool>,
    /// A sampler of the same config and seed (and a pool of the same config) that gets every
    /// valid call and none of the refused ones: after a refusal both must draw the same.
    twin: *mut tokenrace_sampler,
    twin_pool: Option<*mut tokenrace_pool>,
}

impl Subject {
    fn new(name: &'static str, seed: u64, max_rows: usize, vocab_size: usize, threads: usize) -> Subject {
        Subject::with_pool(name, seed, max_rows, vocab_size, threads, false)
    }

    /// A sampler and its twin, each with a pool of its own attached when `pool` (then
    /// `vocab_size` is the pool's vocab).
    fn with_pool(
        name: &'static str,
        seed: u64,
        max_rows: usize,
        vocab_size: usize,
        threads: usize,
        pool: bool,
    ) -> Subject {
        let mut cfg = tokenrace_config_default();
        cfg.max_rows = max_rows as u32;
        cfg.vocab_size = vocab_size as u32;
        cfg.threads = threads as u32;
        cfg.seed = seed;
        cfg.has_seed = 1;
        let make = || {
            let mut ptr = std::ptr::null_mut();
            // SAFETY: a valid config and a writable out pointer.
            let status = unsafe { tokenrace_sampler_new(&cfg, &mut ptr) };
            assert_eq!(status, tokenrace_status::Ok, "{}", last_error());
            let pool = pool.then(|| {
                let mut pc = tokenrace_pool_config_default();
                pc.rows = 4 * max_rows as u32;
                pc.vocab = vocab_size as u32;
                pc.threads = 1;
                pc.has_seed = 1;
                pc.seed = seed ^ 0x9001;
                let mut p = std::ptr::null_mut();
                // SAFETY: as above; then both handles are live.
                unsafe {
                    assert_eq!(tokenrace_pool_new(&pc, &mut p), tokenrace_status::Ok, "{}", last_error());
                    assert_eq!(tokenrace_sampler_attach_pool(ptr, p), tokenrace_status::Ok, "{}", last_error());
                }
                p
            });
            (ptr, pool)
        };
        let ((ptr, pool), (twin, twin_pool)) = (make(), make());
        Subject {
            name,
            ptr,
            max_rows,
            vocab_size,
            greedy_below: cfg.greedy_below,
            stream: rf::KeyStream::new(seed),
            want: stats_slot(),
            pool,
            twin,
            twin_pool,
        }
    }

    /// The pools' rows handed out and skipped (subject, twin).
    fn pool_counts(&self) -> Option<[(u64, u64); 2]> {
        let get = |p: *mut tokenrace_pool| {
            let mut st =
                tokenrace_pool_stats { struct_size: size_of::<tokenrace_pool_stats>() as u32, ..Default::default() };
            // SAFETY: a live pool and a writable stats struct of its size.
            assert_eq!(unsafe { tokenrace_pool_get_stats(p, &mut st) }, tokenrace_status::Ok);
            (st.rows_borrowed, st.rows_skipped)
        };
        Some([get(self.pool?), get(self.twin_pool?)])
    }

    fn stats(&self) -> tokenrace_sampler_stats {
        let mut st = stats_slot();
        // SAFETY: a live sampler and a writable stats struct of its size.
        assert_eq!(unsafe { tokenrace_sampler_get_stats(self.ptr, &mut st) }, tokenrace_status::Ok);
        st
    }
}

impl Drop for Subject {
    fn drop(&mut self) {
        // SAFETY: made by tokenrace_sampler_new / tokenrace_pool_new, freed once.
        unsafe {
            tokenrace_sampler_free(self.ptr);
            tokenrace_sampler_free(self.twin);
            for p in [self.pool, self.twin_pool].into_iter().flatten() {
                tokenrace_pool_free(p);
            }
        }
    }
}

fn stats_slot() -> tokenrace_sampler_stats {
    tokenrace_sampler_stats { struct_size: size_of::<tokenrace_sampler_stats>() as u32, ..Default::default() }
}

/// The output arrays, each `GUARD` elements longer than the call may write, pre-filled with
/// sentinels.
struct OutBufs {
    tokens: Vec<i32>,
    flags: Vec<u32>,
    logprobs: Vec<f32>,
    ranks: Vec<i32>,
    topn_ids: Vec<i32>,
    topn_logprobs: Vec<f32>,
}

impl OutBufs {
    fn new(rows: usize, top_n: usize) -> OutBufs {
        let lp = f32::from_bits(LP_SENTINEL);
        OutBufs {
            tokens: vec![TOKEN_SENTINEL; rows + GUARD],
            flags: vec![FLAG_SENTINEL; rows + GUARD],
            logprobs: vec![lp; rows + GUARD],
            ranks: vec![TOKEN_SENTINEL; rows + GUARD],
            topn_ids: vec![TOKEN_SENTINEL; rows * top_n + GUARD],
            topn_logprobs: vec![lp; rows * top_n + GUARD],
        }
    }

    /// The first array with an element written from index `from` on (`from[k]` per array).
    fn written_from(&self, from: [usize; 6]) -> Option<&'static str> {
        let i32s = |v: &[i32], f: usize| v[f..].iter().any(|&t| t != TOKEN_SENTINEL);
        let f32s = |v: &[f32], f: usize| v[f..].iter().any(|t| t.to_bits() != LP_SENTINEL);
        [
            ("tokens", i32s(&self.tokens, from[0])),
            ("flags", self.flags[from[1]..].iter().any(|&f| f != FLAG_SENTINEL)),
            ("logprobs", f32s(&self.logprobs, from[2])),
            ("ranks", i32s(&self.ranks, from[3])),
            ("topn_ids", i32s(&self.topn_ids, from[4])),
            ("topn_logprobs", f32s(&self.topn_logprobs, from[5])),
        ]
        .into_iter()
        .find(|&(_, w)| w)
        .map(|(name, _)| name)
    }
}

/// A C struct with room after it, for a `struct_size` larger than this library's.
#[repr(C)]
struct Padded<T> {
    s: T,
    tail: [u8; TAIL],
}

/// A copy of `bytes` at an odd address (misaligned for every type wider than a byte), kept alive
/// in `keep`; long enough that the pointer still covers the array.
fn misaligned(bytes: &[u8], keep: &mut Vec<Vec<u64>>) -> *mut u8 {
    let mut v = vec![0u64; bytes.len() / 8 + 2];
    let p = (v.as_mut_ptr() as *mut u8).wrapping_add(1);
    // SAFETY: `v` has room for 1 + bytes.len() bytes.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, bytes.len()) };
    keep.push(v);
    p
}

fn bytes_of<T>(v: &[T]) -> &[u8] {
    // SAFETY: plain numbers, viewed as their bytes.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

/// An input array's pointer: NULL when not given, a misaligned copy when the case says so.
fn in_ptr<T>(case: &Case, name: &'static str, v: Option<&Vec<T>>, keep: &mut Vec<Vec<u64>>) -> *const T {
    match v {
        None => std::ptr::null(),
        Some(v) if case.misaligned == Some(name) => misaligned(bytes_of(v), keep) as *const T,
        Some(v) => v.as_ptr(),
    }
}

/// An output array's pointer (`want`: given at all), or a misaligned copy the call must refuse.
fn out_ptr<T>(case: &Case, name: &'static str, want: bool, v: &mut Vec<T>, keep: &mut Vec<Vec<u64>>) -> *mut T {
    match want {
        false => std::ptr::null_mut(),
        true if case.misaligned == Some(name) => misaligned(bytes_of(v), keep) as *mut T,
        true => v.as_mut_ptr(),
    }
}

/// Makes the call `case` describes on `s`.
fn call(s: &Subject, case: &Case, out: &mut OutBufs) -> tokenrace_status {
    call_on(s.ptr, case, out)
}

/// Makes the call `case` describes on the sampler at `sampler`.
fn call_on(sampler: *mut tokenrace_sampler, case: &Case, out: &mut OutBufs) -> tokenrace_status {
    let mut keep = Vec::new();
    // SAFETY: all-zero is a valid value of these C structs (integers and NULL pointers).
    let mut b: Padded<tokenrace_batch> = unsafe { std::mem::zeroed() };
    b.s.struct_size = case.batch_size as u32;
    if case.batch_size > BATCH_FULL {
        b.tail[case.batch_size - BATCH_FULL - 1] = case.batch_tail;
    }
    b.s.dtype = case.dtype_field;
    b.s.logits = match case.null {
        Some(Null::Logits) => std::ptr::null(),
        _ if case.misaligned == Some("logits") => misaligned(case.logits.bytes(), &mut keep) as *const c_void,
        _ => case.logits.ptr(),
    };
    b.s.rows = case.rows as u32;
    b.s.vocab = case.vocab as u32;
    b.s.row_stride = case.row_stride;
    b.s.temperature = in_ptr(case, "temperature", case.temperature.as_ref(), &mut keep);
    b.s.seeds = in_ptr(case, "seeds", case.seeds.as_ref(), &mut keep);
    b.s.offsets = in_ptr(case, "offsets", case.offsets.as_ref(), &mut keep);
    b.s.seeded = in_ptr(case, "seeded", case.seeded.as_ref(), &mut keep);
    if let Some(n) = &case.noise {
        b.s.noise = in_ptr(case, "noise", Some(&n.values), &mut keep);
        b.s.noise_kind = n.kind;
        b.s.noise_row_stride = n.row_stride;
    }
    b.s.top_k = in_ptr(case, "top_k", case.top_k.as_ref(), &mut keep);
    b.s.top_p = in_ptr(case, "top_p", case.top_p.as_ref(), &mut keep);
    b.s.min_p = in_ptr(case, "min_p", case.min_p.as_ref(), &mut keep);
    let p = &case.pipe;
    // A list's entries and offsets, NULL where the case says so.
    let list = |name: &str, l: Option<&List>| -> (*const i32, *const u64) {
        match l {
            None => (std::ptr::null(), std::ptr::null()),
            Some(l) => (
                if case.null_entries == Some(ids_field(name)) { std::ptr::null() } else { l.ids.as_ptr() },
                if case.null_offsets == Some(name) { std::ptr::null() } else { l.offsets.as_ptr() },
            ),
        }
    };
    (b.s.prompt_ids, b.s.prompt_offsets) = list("prompt", p.prompt.as_ref());
    (b.s.output_ids, b.s.output_offsets) = list("output", p.output.as_ref());
    (b.s.allowed_ids, b.s.allowed_offsets) = list("allowed", p.allowed.as_ref());
    (b.s.banned_ids, b.s.banned_offsets) = list("banned", p.banned.as_ref());
    (b.s.bias_ids, b.s.bias_offsets) = list("bias", p.bias.as_ref().map(|b| &b.0));
    if let Some((_, values)) = &p.bias {
        b.s.bias_values = if case.null_entries == Some("bias_values") { std::ptr::null() } else { values.as_ptr() };
    }
    b.s.repetition_penalty = in_ptr(case, "repetition_penalty", p.repetition.as_ref(), &mut keep);
    b.s.frequency_penalty = in_ptr(case, "frequency_penalty", p.frequency.as_ref(), &mut keep);
    b.s.presence_penalty = in_ptr(case, "presence_penalty", p.presence.as_ref(), &mut keep);
    b.s.allowed_rows = in_ptr(case, "allowed_rows", p.allowed_rows.as_ref(), &mut keep);
    if let Some((words, stride)) = &p.bitmask {
        b.s.token_bitmask = words.as_ptr();
        b.s.bitmask_row_stride = *stride;
    }

    // SAFETY: as above.
    let mut o: Padded<tokenrace_output> = unsafe { std::mem::zeroed() };
    o.s.struct_size = case.out_size as u32;
    if case.out_size > OUT_FULL {
        o.tail[case.out_size - OUT_FULL - 1] = case.out_tail;
    }
    o.s.logprob_mode = case.logprob_mode;
    o.s.top_n = case.top_n as u32;
    let [flags, logprobs, ranks, ids, tlps] = case.wants;
    o.s.tokens = out_ptr(case, "tokens", case.null != Some(Null::Tokens), &mut out.tokens, &mut keep);
    o.s.flags = out_ptr(case, "flags", flags, &mut out.flags, &mut keep);
    o.s.logprobs = out_ptr(case, "logprobs", logprobs, &mut out.logprobs, &mut keep);
    o.s.ranks = out_ptr(case, "ranks", ranks, &mut out.ranks, &mut keep);
    o.s.topn_ids = out_ptr(case, "topn_ids", ids, &mut out.topn_ids, &mut keep);
    o.s.topn_logprobs = out_ptr(case, "topn_logprobs", tlps, &mut out.topn_logprobs, &mut keep);

    if let Some((output, input, at)) = case.overlap {
        place_overlap(&mut b.s, &mut o.s, case, (output, input, at), &mut keep);
    }

    let sampler = if case.null == Some(Null::Sampler) { std::ptr::null_mut() } else { sampler };
    let batch: *const tokenrace_batch = if case.null == Some(Null::Batch) { std::ptr::null() } else { &b.s };
    let output: *mut tokenrace_output = if case.null == Some(Null::Out) { std::ptr::null_mut() } else { &mut o.s };
    // SAFETY: every non-NULL pointer covers what the batch's sizes say (a struct larger than
    // this library's has its tail in `Padded`); a stride whose span does not fit is one the
    // call must refuse before reading, which is what is under test.
    unsafe { tokenrace_draw(sampler, batch, output) }
}

/// The bytes an output array of `case` covers.
fn out_bytes(case: &Case, output: &str) -> usize {
    match output {
        "topn_ids" | "topn_logprobs" => case.rows * case.top_n * 4,
        _ => case.rows * 4,
    }
}

/// Moves input (or earlier output) `input` into a buffer long enough to also hold output
/// `output` from byte `at` of it on, and points `output` there: the two arrays share memory,
/// and every pointer still covers what the call's sizes say (nothing is written: the call must
/// refuse it).
fn place_overlap(
    b: &mut tokenrace_batch,
    o: &mut tokenrace_output,
    case: &Case,
    (output, input, at): (&str, &str, usize),
    keep: &mut Vec<Vec<u64>>,
) {
    let (src, len): (*const u8, usize) = match input {
        "logits" => (b.logits as *const u8, case.logits.bytes().len()),
        "temperature" => (b.temperature as *const u8, case.rows * 4),
        "seeds" => (b.seeds as *const u8, case.rows * 8),
        "token_bitmask" => (b.token_bitmask as *const u8, case.pipe.bitmask.as_ref().unwrap().0.len() * 4),
        "output_ids" => {
            (b.output_ids as *const u8, *case.pipe.output.as_ref().unwrap().offsets.last().unwrap() as usize * 4)
        }
        "tokens" => (o.tokens as *const u8, case.rows * 4),
        other => panic!("no overlap with {other}"),
    };
    let need = len.max(at + out_bytes(case, output));
    let mut v = vec![0u64; need.div_ceil(8) + 1];
    let base = v.as_mut_ptr() as *mut u8;
    // SAFETY: `v` holds at least `len` bytes; `src` covers `len` bytes.
    unsafe { std::ptr::copy_nonoverlapping(src, base, len) };
    let shared = base.wrapping_add(at);
    keep.push(v);
    match input {
        "logits" => b.logits = base as *const c_void,
        "temperature" => b.temperature = base as *const f32,
        "seeds" => b.seeds = base as *const u64,
        "token_bitmask" => b.token_bitmask = base as *const i32,
        "output_ids" => b.output_ids = base as *const i32,
        _ => o.tokens = base as *mut i32,
    }
    match output {
        "tokens" => o.tokens = shared as *mut i32,
        "flags" => o.flags = shared as *mut u32,
        "logprobs" => o.logprobs = shared as *mut f32,
        "ranks" => o.ranks = shared as *mut i32,
        "topn_ids" => o.topn_ids = shared as *mut i32,
        _ => o.topn_logprobs = shared as *mut f32,
    }
}

// ---------------------------------------------------------------------------------------------
// Cases.
// ---------------------------------------------------------------------------------------------

fn pick<T: Copy>(rng: &mut TestRng, from: &[T]) -> T {
    from[rng.below(from.len())]
}

/// A noise value of `kind`: mostly E ~ Exp(1) (or ln E), with `special` also 0, inf, NaN,
/// negative and subnormal E (-inf, inf, NaN ln E), which the race must survive.
fn noise_value(rng: &mut TestRng, exp: bool, special: bool) -> f32 {
    if special && rng.below(50) == 0 {
        return if exp {
            pick(rng, &[0.0, f32::INFINITY, f32::NAN, -1.0, 1e-40])
        } else {
            pick(rng, &[f32::NEG_INFINITY, f32::INFINITY, f32::NAN])
        };
    }
    let e = rng.exp();
    if exp {
        e as f32
    } else {
        e.ln() as f32
    }
}

/// A valid call of `rows` rows on `s` (rows may exceed `max_rows`: then that is its one defect).
fn valid_case(rng: &mut TestRng, s: &Subject, rows: usize) -> Case {
    let vocab = if s.vocab_size != 0 { s.vocab_size } else { pick(rng, &VOCABS) };
    let dtype = pick(rng, &[Dtype::F32, Dtype::Bf16, Dtype::F16]);
    // The last row needs only `vocab` elements, so one row takes any stride >= vocab.
    let row_stride: u64 = match rng.below(8) {
        0..=2 => 0,
        3 => vocab as u64,
        4 | 5 => (vocab + 1 + rng.below(40)) as u64,
        6 => 3 * vocab as u64 + 1,
        _ if rows == 1 => pick(rng, &[1u64 << 40, 1 << 62, u64::MAX]),
        _ => vocab as u64,
    };
    let stride = if row_stride == 0 { vocab } else { row_stride as usize };
    let len = if rows == 0 { 0 } else { (rows - 1) * stride + vocab };
    // Padding between rows is +inf: a read of it would flag HAS_POSINF and win the row.
    let mut vals = vec![f32::INFINITY; len];
    for r in 0..rows {
        let d = pick_dist(rng);
        vals[r * stride..r * stride + vocab].copy_from_slice(&gen_row(rng, d, vocab));
    }
    let logits = match dtype {
        Dtype::F32 => Buf::F32(vals),
        Dtype::Bf16 => Buf::Bf16(vals.iter().map(|&v| Bf16::from_f32(v)).collect()),
        Dtype::F16 => Buf::F16(vals.iter().map(|&v| F16::from_f32(v)).collect()),
    };
    let x = (0..rows).map(|r| (0..vocab).map(|i| logits.get(r * stride + i)).collect()).collect();

    let temperature = (rng.below(4) != 0).then(|| (0..rows).map(|_| pick(rng, &TEMPS)).collect());
    let seeds = (rng.below(3) != 0)
        .then(|| (0..rows).map(|_| [0, u64::MAX, rng.u64(), rng.u64()][rng.below(4)]).collect::<Vec<u64>>());
    // Offsets without seeds are allowed, and ignored.
    let offsets =
        (rng.below(2) == 0).then(|| (0..rows).map(|_| [0, u64::MAX, rng.u64() % 4096][rng.below(3)]).collect());
    let seeded =
        (seeds.is_some() && rng.below(2) == 0).then(|| (0..rows).map(|_| pick(rng, &[0u8, 1, 0xff])).collect());
    let noise = (rng.below(2) == 0).then(|| {
        let exp = rng.below(2) == 0;
        let row_stride: u64 = match rng.below(5) {
            0 => 0, // one row broadcast to every row
            1 if rows == 1 => u64::MAX,
            1 | 2 => vocab as u64,
            _ => (vocab + 1 + rng.below(20)) as u64,
        };
        let len = match (rows, row_stride) {
            (0, _) => 0,
            (_, 0) => vocab,
            _ => (rows - 1) * row_stride as usize + vocab,
        };
        // Padding wins if read: E = 0 (ln E = -inf) is an infinite key.
        let pad = if exp { 0.0 } else { f32::NEG_INFINITY };
        let mut values = vec![pad; len];
        let special = rng.below(4) == 0;
        let stride = if row_stride == 0 { 0 } else { row_stride as usize };
        for r in 0..if row_stride == 0 { rows.min(1) } else { rows } {
            for i in 0..vocab {
                values[r * stride + i] = noise_value(rng, exp, special);
            }
        }
        let kind = if exp { tokenrace_noise_kind::Exp } else { tokenrace_noise_kind::LogExp } as u32;
        ExtNoise { values, kind, row_stride }
    });
    let top_k = (rng.below(2) == 0).then(|| {
        let v = vocab as i32;
        (0..rows).map(|_| if rng.below(4) == 0 { pick(rng, &[v - 1, v, v + 1]) } else { pick(rng, &TOP_KS) }).collect()
    });
    let top_p = (rng.below(2) == 0).then(|| (0..rows).map(|_| pick(rng, &TOP_PS)).collect());
    let min_p = (rng.below(2) == 0).then(|| (0..rows).map(|_| pick(rng, &MIN_PS)).collect());
    let batch_size = match rng.below(12) {
        0 => BATCH_V1,
        1 => offset_of!(tokenrace_batch, top_p),
        2 => offset_of!(tokenrace_batch, min_p),
        3 => BATCH_FULL + 1 + rng.below(TAIL),
        _ => BATCH_FULL,
    };
    let top_n = match rng.below(4) {
        0 | 1 => 0,
        2 => 1 + rng.below(vocab.min(8)),
        _ => vocab.min(40),
    };
    let mut case = Case {
        rows,
        vocab,
        dtype,
        dtype_field: dtype.field(),
        row_stride,
        x,
        logits,
        temperature,
        seeds,
        offsets,
        seeded,
        noise,
        top_k,
        top_p,
        min_p,
        batch_size,
        batch_tail: 0,
        logprob_mode: pick(rng, &[tokenrace_logprob_mode::Raw, tokenrace_logprob_mode::Processed]) as u32,
        top_n,
        wants: [0; 5].map(|_| rng.below(3) != 0),
        out_size: if rng.below(10) == 0 { OUT_FULL + 1 + rng.below(TAIL) } else { OUT_FULL },
        out_tail: 0,
        null: None,
        misaligned: None,
        pipe: Pipe::default(),
        null_offsets: None,
        null_entries: None,
        overlap: None,
    };
    // The sampling step's inputs in about half the calls (a batch of an older version carries
    // them too now and then: it must not read them).
    if rng.below(2) == 0 && (case.reads_pipe() || rng.below(4) == 0) {
        case.pipe = gen_pipe(rng, rows, vocab);
    }
    // A batch of an older version does not have the later filters: values there that would be
    // invalid must not be read.
    if rng.below(2) == 0 {
        if !case.reads(offset_of!(tokenrace_batch, top_p)) && case.top_p.is_some() {
            case.top_p = Some(vec![7.0; rows]);
        }
        if !case.reads(offset_of!(tokenrace_batch, min_p)) && case.min_p.is_some() {
            case.min_p = Some(vec![f32::NAN; rows]);
        }
    }
    case
}

/// A CSR list of `rows` rows of up to `most` ids each in `[0, vocab)`, sometimes with entries
/// before the first offset and after the last one (never read).
fn gen_list(rng: &mut TestRng, rows: usize, vocab: usize, most: usize) -> List {
    let mut ids: Vec<i32> = Vec::new();
    if rng.below(6) == 0 {
        ids.extend([vocab as i32, -1, i32::MIN].iter().take(1 + rng.below(3)));
    }
    let mut offsets = vec![ids.len() as u64];
    for _ in 0..rows {
        for _ in 0..rng.below(most + 1) {
            ids.push(rng.below(vocab) as i32);
        }
        offsets.push(ids.len() as u64);
    }
    if rng.below(6) == 0 {
        ids.extend([i32::MAX, -7, vocab as i32 + 1]);
    }
    List { ids, offsets }
}

/// The sampling step's inputs of a valid call: histories with penalties, logit bias, allowed
/// lists (for some rows), banned lists and a bitmask, each given or not.
fn gen_pipe(rng: &mut TestRng, rows: usize, vocab: usize) -> Pipe {
    let per_row = |rng: &mut TestRng, from: &[f32]| -> Vec<f32> { (0..rows).map(|_| pick(rng, from)).collect() };
    let mut p = Pipe::default();
    if rng.below(3) == 0 {
        p.prompt = Some(gen_list(rng, rows, vocab, 20));
    }
    if rng.below(3) == 0 {
        p.output = Some(gen_list(rng, rows, vocab, 30));
    }
    if rng.below(3) == 0 {
        p.repetition = Some(per_row(rng, &[1.0, 1.0, 1.3, 0.7, 2.0, 1e-3, 50.0]));
    }
    if rng.below(4) == 0 {
        p.frequency = Some(per_row(rng, &[0.0, 0.5, -0.5, 2.0, 1e-3]));
    }
    if rng.below(4) == 0 {
        p.presence = Some(per_row(rng, &[0.0, 1.0, -1.0, 0.3, -0.0]));
    }
    if rng.below(3) == 0 {
        let l = gen_list(rng, rows, vocab, 8);
        let values =
            (0..l.ids.len()).map(|_| pick(rng, &[0.5, -1.0, 5.0, f32::NEG_INFINITY, 100.0, -0.0, -30.0])).collect();
        p.bias = Some((l, values));
    }
    if rng.below(5) == 0 {
        p.allowed = Some(gen_list(rng, rows, vocab, 12));
        if rng.below(2) == 0 {
            p.allowed_rows = Some((0..rows).map(|_| pick(rng, &[0u8, 1, 0xff])).collect());
        }
    }
    if rng.below(4) == 0 {
        p.banned = Some(gen_list(rng, rows, vocab, 6));
    }
    if rng.below(4) == 0 {
        let words = vocab.div_ceil(32);
        let stride = pick(rng, &[0, words as u64, words as u64 + 3]);
        let at = if stride == 0 { words } else { stride as usize };
        let len = if rows == 0 { 0 } else { (rows - 1) * at + words };
        // Mostly every token allowed, some words random, some rows nearly closed.
        let w = (0..len)
            .map(|_| match rng.below(6) {
                0 => rng.u64() as i32,
                1 => 1 << rng.below(32),
                2 => 0,
                _ => -1,
            })
            .collect();
        p.bitmask = Some((w, stride));
    }
    p
}

/// What a call must answer.
#[derive(Debug)]
enum Expect {
    Ok,
    /// The status, and the start of the message (`tokenrace_draw: ` and the argument it names).
    Fail(tokenrace_status, String),
}

fn invalid(prefix: String) -> Expect {
    Expect::Fail(tokenrace_status::InvalidArgument, format!("tokenrace_draw: {prefix}"))
}

/// The smallest stride at which `rows` rows of `vocab` elements of `elem` bytes no longer fit in
/// the address space (`isize::MAX` bytes), for `rows >= 2`: one less still fits.
fn first_overflowing_stride(rows: usize, vocab: usize, elem: usize) -> u64 {
    let most = isize::MAX as usize / elem;
    ((most - vocab) / (rows - 1) + 1) as u64
}

/// Makes the batch the full size, so that every filter is read, with the values a smaller size
/// left unread (and may have made invalid) turned back to valid ones.
fn read_every_filter(case: &mut Case) {
    case.batch_size = BATCH_FULL;
    case.batch_tail = 0;
    for p in case.top_p.iter_mut().flatten() {
        if !(*p > 0.0 && *p <= 1.0) {
            *p = 1.0;
        }
    }
    for p in case.min_p.iter_mut().flatten() {
        if !(0.0..=1.0).contains(p) {
            *p = 0.0;
        }
    }
}

/// The sampling step's CSR lists, by the prefix of their fields.
const LISTS: [&str; 5] = ["prompt", "output", "allowed", "banned", "bias"];

fn ids_field(list: &str) -> &'static str {
    match list {
        "prompt" => "prompt_ids",
        "output" => "output_ids",
        "allowed" => "allowed_ids",
        "banned" => "banned_ids",
        _ => "bias_ids",
    }
}

/// Gives `case` the list `name` if it has none.
fn ensure_list(rng: &mut TestRng, case: &mut Case, name: &str) {
    let (rows, vocab) = (case.rows, case.vocab);
    if case.pipe.list_mut(name).is_some() {
        return;
    }
    let l = gen_list(rng, rows, vocab, 4);
    match name {
        "prompt" => case.pipe.prompt = Some(l),
        "output" => case.pipe.output = Some(l),
        "allowed" => case.pipe.allowed = Some(l),
        "banned" => case.pipe.banned = Some(l),
        _ => {
            let n = l.ids.len();
            case.pipe.bias = Some((l, vec![0.5; n]));
        }
    }
}

/// Makes sure row `r` of list `name` has an entry (inserting a valid one at its end), and
/// returns the position in the row of one of its entries.
fn ensure_entry(rng: &mut TestRng, case: &mut Case, name: &str, r: usize) -> usize {
    ensure_list(rng, case, name);
    let id = rng.below(case.vocab) as i32;
    let l = case.pipe.list_mut(name).unwrap();
    let (a, b) = (l.offsets[r] as usize, l.offsets[r + 1] as usize);
    if a < b {
        return rng.below(b - a);
    }
    l.ids.insert(b, id);
    for o in &mut l.offsets[r + 1..] {
        *o += 1;
    }
    if name == "bias" {
        case.pipe.bias.as_mut().unwrap().1.insert(b, 1.0);
    }
    0
}

/// Gives `case` one defect (or none) and says what the call must answer; `category` names it
/// for the counts.
fn add_defect(rng: &mut TestRng, s: &Subject, case: &mut Case) -> (String, Expect) {
    let (rows, vocab) = (case.rows, case.vocab);
    let row = if rows > 0 { rng.below(rows) } else { 0 };
    let full = BATCH_FULL;
    loop {
        match rng.below(33) {
            0 => {
                case.vocab = 0;
                return ("vocab 0".into(), invalid("batch.vocab: must be at least 1".into()));
            }
            1 if s.vocab_size != 0 && vocab > 1 => {
                // Smaller than the buffers were made for, so every pointer still covers its span.
                case.vocab = 1 + rng.below(vocab - 1);
                let want =
                    format!("batch.vocab: {} differs from the sampler's vocab_size {}", case.vocab, s.vocab_size);
                return ("vocab other than the sampler's".into(), invalid(want));
            }
            2 => {
                case.dtype_field = pick(rng, &[3, 4, 255, u32::MAX]);
                let want = format!("batch.dtype: {} is not a tokenrace_dtype", case.dtype_field);
                return ("bad dtype".into(), invalid(want));
            }
            3 if vocab >= 2 => {
                case.row_stride = 1 + rng.below(vocab - 1) as u64;
                let want = format!("batch.row_stride: {} is smaller than vocab {vocab}", case.row_stride);
                return ("row stride below vocab".into(), invalid(want));
            }
            4 if rows >= 2 => {
                let first = first_overflowing_stride(rows, vocab, case.dtype.elem_size());
                case.row_stride = pick(rng, &[first, first, 1 << 62, 1 << 63, u64::MAX]);
                let want = format!(
                    "batch.row_stride: {} x {} rows of {}-byte elements overflows",
                    case.row_stride,
                    rows - 1,
                    case.dtype.elem_size()
                );
                return ("row stride overflowing".into(), invalid(want));
            }
            5 if case.noise.is_some() => {
                let n = case.noise.as_mut().unwrap();
                n.kind = pick(rng, &[2, 9, u32::MAX]);
                let want = format!("batch.noise_kind: {} is not a tokenrace_noise_kind", n.kind);
                return ("bad noise kind".into(), invalid(want));
            }
            6 if case.noise.is_some() && vocab >= 2 => {
                let n = case.noise.as_mut().unwrap();
                n.row_stride = 1 + rng.below(vocab - 1) as u64;
                // The span this stride says must still be covered (a broadcast row is shorter).
                let need = rows.saturating_sub(1) * n.row_stride as usize + vocab;
                if n.values.len() < need {
                    n.values.resize(need, 1.0);
                }
                let want =
                    format!("batch.noise_row_stride: {} is neither 0 (broadcast) nor >= vocab {vocab}", n.row_stride);
                return ("noise stride below vocab".into(), invalid(want));
            }
            7 if case.noise.is_some() && rows >= 2 => {
                let n = case.noise.as_mut().unwrap();
                n.row_stride = pick(rng, &[first_overflowing_stride(rows, vocab, 4), 1 << 62, u64::MAX]);
                let want = format!(
                    "batch.noise_row_stride: {} x {} rows of 4-byte elements overflows",
                    n.row_stride,
                    rows - 1
                );
                return ("noise stride overflowing".into(), invalid(want));
            }
            8 | 9 if rows >= 1 => {
                let t = pick(
                    rng,
                    &[-0.5, -1e-30, -1e-45, -f32::MAX, f32::NEG_INFINITY, f32::INFINITY, f32::NAN, -f32::NAN],
                );
                case.temperature.get_or_insert_with(|| vec![1.0; rows])[row] = t;
                let want = format!("batch.temperature[{row}]: {t} is not a finite number >= 0");
                return ("bad temperature".into(), invalid(want));
            }
            10 if rows >= 1 => {
                let p =
                    pick(rng, &[0.0, -0.0, -0.1, 1.0 + f32::EPSILON, 2.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY]);
                read_every_filter(case);
                case.top_p.get_or_insert_with(|| vec![1.0; rows])[row] = p;
                return ("bad top_p".into(), invalid(format!("batch.top_p[{row}]: {p} is not in (0, 1]")));
            }
            11 if rows >= 1 => {
                let p = pick(rng, &[-1e-7, -1.0, 1.0 + f32::EPSILON, f32::NAN, f32::INFINITY, f32::NEG_INFINITY]);
                read_every_filter(case);
                case.min_p.get_or_insert_with(|| vec![0.0; rows])[row] = p;
                return ("bad min_p".into(), invalid(format!("batch.min_p[{row}]: {p} is not in [0, 1]")));
            }
            12 if rows >= 1 => {
                case.seeds = None;
                case.seeded = Some(vec![1; rows]);
                return ("seeded without seeds".into(), invalid("batch.seeded: given without seeds".into()));
            }
            13 => {
                case.logprob_mode = pick(rng, &[2, 3, u32::MAX]);
                let want = format!("out.logprob_mode: {} is not a tokenrace_logprob_mode", case.logprob_mode);
                return ("bad logprob mode".into(), invalid(want));
            }
            14 if rows >= 1 => {
                case.top_n = vocab + 1 + rng.below(3);
                if !case.wants[3] && !case.wants[4] {
                    case.wants[3 + rng.below(2)] = true;
                }
                return (
                    "top_n above vocab".into(),
                    invalid(format!("out.top_n: {} exceeds vocab {vocab}", case.top_n)),
                );
            }
            15 => {
                let any = rng.below(BATCH_V1);
                case.batch_size = pick(rng, &[0, 4, 8, 12, 40, BATCH_V1 - 1, any]);
                let want = format!(
                    "batch.struct_size: {} is smaller than the first tokenrace_batch ({BATCH_V1} bytes)",
                    case.batch_size
                );
                return ("batch struct_size too small".into(), invalid(want));
            }
            16 => {
                // Every size between the first version and the 0.1 one that ends inside a filter.
                let size = loop {
                    let n = BATCH_V1 + 1 + rng.below(3 * 8 - 1);
                    if !n.is_multiple_of(8) {
                        break n;
                    }
                };
                let field = ["top_k", "top_p", "min_p"][(size - BATCH_V1) / 8];
                case.batch_size = size;
                let want = format!("batch.struct_size: {size} ends inside field {field}");
                return ("batch struct_size inside a field".into(), invalid(want));
            }
            17 => {
                case.batch_size = full + 1 + rng.below(TAIL);
                case.batch_tail = 1 + rng.below(255) as u8;
                let want = format!("tokenrace_draw: batch: sets fields beyond the {full} bytes of tokenrace_batch");
                return ("batch larger, nonzero tail".into(), Expect::Fail(tokenrace_status::Unsupported, want));
            }
            18 => {
                // Below the first version, also sizes that would end inside a field.
                let any = rng.below(OUT_V1);
                case.out_size = pick(rng, &[0, 4, 12, 30, OUT_V1 - 4, OUT_V1 - 1, any]);
                let want = format!(
                    "out.struct_size: {} is smaller than the first tokenrace_output ({OUT_V1} bytes)",
                    case.out_size
                );
                return ("out struct_size too small".into(), invalid(want));
            }
            19 => {
                case.out_size = OUT_FULL + 1 + rng.below(TAIL);
                case.out_tail = 1 + rng.below(255) as u8;
                let want = format!("tokenrace_draw: out: sets fields beyond the {OUT_FULL} bytes of tokenrace_output");
                return ("out larger, nonzero tail".into(), Expect::Fail(tokenrace_status::Unsupported, want));
            }
            20 if rows >= 1 => {
                let (null, want) =
                    pick(rng, &[(Null::Logits, "batch.logits: is NULL"), (Null::Tokens, "out.tokens: is NULL")]);
                case.null = Some(null);
                return (format!("NULL {null:?}"), invalid(want.into()));
            }
            21 => {
                let (null, want) = pick(rng, &[(Null::Sampler, "sampler"), (Null::Batch, "batch"), (Null::Out, "out")]);
                case.null = Some(null);
                return (format!("NULL {null:?}"), invalid(format!("{want}: is NULL")));
            }
            22 if rows >= 1 => {
                let mut arrays: Vec<(&'static str, usize)> = vec![("logits", case.dtype.elem_size()), ("tokens", 4)];
                let opts = [
                    ("temperature", case.temperature.is_some(), 4),
                    ("seeds", case.seeds.is_some(), 8),
                    ("offsets", case.offsets.is_some(), 8),
                    ("noise", case.noise.is_some(), 4),
                    ("top_k", case.top_k.is_some(), 4),
                    ("top_p", case.top_p.is_some(), 4),
                    ("min_p", case.min_p.is_some(), 4),
                    ("flags", case.wants[0], 4),
                    ("logprobs", case.wants[1], 4),
                    ("ranks", case.wants[2], 4),
                    ("topn_ids", case.wants[3] && case.top_n > 0, 4),
                    ("topn_logprobs", case.wants[4] && case.top_n > 0, 4),
                ];
                arrays.extend(opts.iter().filter(|o| o.1).map(|o| (o.0, o.2)));
                let (name, align) = pick(rng, &arrays);
                case.misaligned = Some(name);
                read_every_filter(case); // so that a misaligned filter array is looked at
                let owner = if ["tokens", "flags", "logprobs", "ranks", "topn_ids", "topn_logprobs"].contains(&name) {
                    "out"
                } else {
                    "batch"
                };
                return (
                    "misaligned array".into(),
                    invalid(format!("{owner}.{name}: is not aligned to {align} bytes")),
                );
            }
            23 => return ("valid".into(), Expect::Ok),
            24 if rows >= 1 => {
                // A list id out of range in one row (checked by the rows' tasks, after the rows
                // were keyed: the refusal must give the keys back).
                let name = pick(rng, &LISTS);
                read_every_filter(case);
                let j = ensure_entry(rng, case, name, row);
                let l = case.pipe.list_mut(name).unwrap();
                let at = l.offsets[row] as usize + j;
                let id = pick(rng, &[vocab as i32, vocab as i32 + 1, -1, i32::MIN, i32::MAX]);
                l.ids[at] = id;
                let want = format!(
                    "batch.{}[{row}]: position {j} (entry {at}): {id} is not a token id in [0, {vocab})",
                    ids_field(name)
                );
                return (format!("{name} id out of range"), invalid(want));
            }
            25 if rows >= 1 => {
                let name = pick(rng, &LISTS);
                read_every_filter(case);
                ensure_list(rng, case, name);
                let o = &mut case.pipe.list_mut(name).unwrap().offsets;
                let k = 1 + rng.below(rows);
                o[k - 1] = o[k] + 1 + rng.below(3) as u64;
                let want = format!(
                    "batch.{name}_offsets[{k}]: {} is below the previous offset {} (offsets must not decrease)",
                    o[k],
                    o[k - 1]
                );
                return (format!("{name} offsets decreasing"), invalid(want));
            }
            26 => {
                // A last offset whose entries span more than the address space: refused before
                // any slice of that length is made.
                let name = pick(rng, &LISTS);
                read_every_filter(case);
                ensure_list(rng, case, name);
                let o = &mut case.pipe.list_mut(name).unwrap().offsets;
                let last = pick(rng, &[1u64 << 61, (1 << 62) + 3, 1 << 63, u64::MAX]);
                o[rows] = last;
                let want =
                    format!("batch.{name}_offsets[{rows}]: {last} entries of 4 bytes overflow the address space");
                return (format!("{name} last offset overflowing"), invalid(want));
            }
            27 => {
                // Entries given without the offsets that say whose they are.
                let name = pick(rng, &LISTS);
                read_every_filter(case);
                ensure_list(rng, case, name);
                case.null_offsets = Some(name);
                let given = if name == "bias" && rng.below(2) == 0 {
                    case.null_entries = Some("bias_ids");
                    "bias_values"
                } else {
                    ids_field(name)
                };
                let want = format!("batch.{name}_offsets: is NULL while {given} is given");
                return (format!("{name} entries without offsets"), invalid(want));
            }
            28 if rows >= 1 => {
                // Offsets that count entries, with the entries' array NULL (through C an array
                // is as long as its last offset says: this is the last offset past the array).
                let name = pick(rng, &LISTS);
                read_every_filter(case);
                ensure_entry(rng, case, name, row);
                let field = if name == "bias" && rng.below(2) == 0 { "bias_values" } else { ids_field(name) };
                case.null_entries = Some(field);
                return (format!("{name} offsets past a NULL array"), invalid(format!("batch.{field}: is NULL")));
            }
            29 if rows >= 1 => {
                read_every_filter(case);
                let j = ensure_entry(rng, case, "bias", row);
                let (l, values) = case.pipe.bias.as_mut().unwrap();
                let at = l.offsets[row] as usize + j;
                let v = pick(rng, &[f32::NAN, f32::INFINITY, -f32::NAN]);
                values[at] = v;
                let want = format!(
                    "batch.bias_values[{row}]: position {j} (entry {at}): {v} is not a bias (finite, or -inf to ban)"
                );
                return ("bias NaN or +inf".into(), invalid(want));
            }
            30 if rows >= 1 => {
                read_every_filter(case);
                let p = &mut case.pipe;
                let (field, v, want) = match rng.below(3) {
                    0 => {
                        let v = pick(rng, &[0.0, -0.0, -1.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY]);
                        (
                            "repetition_penalty",
                            p.repetition.get_or_insert_with(|| vec![1.0; rows]),
                            (v, "is not a finite number > 0"),
                        )
                    }
                    1 => {
                        let v = pick(rng, &[f32::NAN, f32::INFINITY, f32::NEG_INFINITY]);
                        ("frequency_penalty", p.frequency.get_or_insert_with(|| vec![0.0; rows]), (v, "is not finite"))
                    }
                    _ => {
                        let v = pick(rng, &[f32::NAN, f32::INFINITY, f32::NEG_INFINITY]);
                        ("presence_penalty", p.presence.get_or_insert_with(|| vec![0.0; rows]), (v, "is not finite"))
                    }
                };
                v[row] = want.0;
                return ("bad penalty".into(), invalid(format!("batch.{field}[{row}]: {} {}", want.0, want.1)));
            }
            31 if rows >= 1 => {
                // An output sharing memory with an input or an earlier output.
                read_every_filter(case);
                let mut inputs = vec!["logits", "tokens"];
                if case.temperature.is_some() {
                    inputs.push("temperature");
                }
                if case.seeds.is_some() {
                    inputs.push("seeds");
                }
                if case.pipe.bitmask.is_some() {
                    inputs.push("token_bitmask");
                }
                if case.pipe.output.as_ref().is_some_and(|l| l.offsets[rows] > 0) {
                    inputs.push("output_ids");
                }
                let input = pick(rng, &inputs);
                let mut outputs = vec!["tokens", "flags", "logprobs", "ranks"];
                if case.top_n > 0 {
                    outputs.extend(["topn_ids", "topn_logprobs"]);
                }
                let output = pick(rng, &outputs[if input == "tokens" { 1 } else { 0 }..]);
                let k = ["tokens", "flags", "logprobs", "ranks", "topn_ids", "topn_logprobs"]
                    .iter()
                    .position(|&o| o == output)
                    .unwrap();
                if k > 0 {
                    case.wants[k - 1] = true;
                }
                let len = match input {
                    "logits" => case.logits.bytes().len(),
                    "tokens" | "temperature" => rows * 4,
                    "seeds" => rows * 8,
                    "token_bitmask" => case.pipe.bitmask.as_ref().unwrap().0.len() * 4,
                    _ => case.pipe.output.as_ref().unwrap().offsets[rows] as usize * 4,
                };
                // Anywhere from one element before the end to the start (4-byte aligned).
                let at = 4 * rng.below((len / 4).max(1));
                case.overlap = Some((output, input, at));
                let owner = if input == "tokens" { "out" } else { "batch" };
                let want = format!("out.{output}: overlaps {owner}.{input} (bytes");
                return ("output overlapping an input".into(), invalid(want));
            }
            32 if rows >= 1 => {
                read_every_filter(case);
                let words = vocab.div_ceil(32);
                if words >= 2 && rng.below(2) == 0 {
                    let stride = 1 + rng.below(words - 1) as u64;
                    case.pipe.bitmask = Some((vec![-1; rows * words], stride));
                    let want = format!("batch.bitmask_row_stride: {stride} is smaller than ceil(vocab / 32) = {words}");
                    return ("bitmask stride below its words".into(), invalid(want));
                }
                case.pipe.allowed = None;
                case.pipe.allowed_rows = Some(vec![1; rows]);
                return (
                    "allowed_rows without allowed lists".into(),
                    invalid("batch.allowed_rows: given without allowed lists".into()),
                );
            }
            _ => continue,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Checks.
// ---------------------------------------------------------------------------------------------

#[derive(Default)]
struct Counts {
    /// Calls per category (`valid ...` or the defect).
    calls: BTreeMap<String, usize>,
    rows: usize,
    greedy: usize,
    /// Sampling rows by noise: seeded, the key stream, external E, external ln E.
    noise: [usize; 4],
    filtered: usize,
    nonfinite: usize,
    near_ties: usize,
    ambiguous: usize,
    logprob_rows: usize,
    topn_rows: usize,
    /// Rows drawn with the sampling step's inputs; rows drawn from an attached pool.
    pipe_rows: usize,
    pool_rows: usize,
    /// The twin-sampler checks after refusals, by the sampler's noise (inline, pool).
    twin_checks: [usize; 2],
}

/// Checks a successful call's outputs against the reference, row by row, and adds to the
/// counters the sampler must report.
fn check_valid(s: &mut Subject, case: &Case, out: &OutBufs, counts: &mut Counts, at: &str) {
    let (rows, vocab, n) = (case.rows, case.vocab, case.top_n);
    let [want_flags, want_lps, want_ranks, want_ids, want_tlps] = case.wants;
    let mode =
        if case.logprob_mode == tokenrace_logprob_mode::Processed as u32 { rf::Mode::Processed } else { rf::Mode::Raw };
    // Every row written, and nothing after the rows.
    let (ids_end, tlps_end) = (if want_ids { rows * n } else { 0 }, if want_tlps { rows * n } else { 0 });
    let ends = [
        rows,
        if want_flags { rows } else { 0 },
        if want_lps { rows } else { 0 },
        if want_ranks { rows } else { 0 },
        ids_end,
        tlps_end,
    ];
    if let Some(name) = out.written_from(ends) {
        panic!("{at}: {name} written past what the call covers");
    }
    for r in 0..rows {
        let x = &case.x[r];
        let t = case.temperature(r);
        let sampling = t >= s.greedy_below;
        let seeded = case.seed_of(r);
        let noise = if let Some((seed, offset)) = seeded {
            rf::Noise::Inline(rf::row_key(seed, offset))
        } else if let Some(n) = case.noise_row(r) {
            n
        } else if sampling {
            // Unseeded sampling rows without external noise take the stream's next key, in row
            // order (greedy rows take none).
            rf::Noise::Inline(s.stream.next())
        } else {
            rf::Noise::Inline(0)
        };
        // The sampling step's inputs make the effective row y; raw logprobs are x's, processed
        // ones y's (tests/step_reference.rs).
        let y = (case.reads_pipe() && case.pipe.is_some()).then(|| rf::effective_row(x, &case.pipe.row(r, vocab)));
        let order = rf::Order::TemperatureFirst;
        let d = match &y {
            Some(y) => rf::draw_step(x, y, t, s.greedy_below, noise, case.filters(r), order),
            None => rf::draw(x, t, s.greedy_below, noise, case.filters(r)),
        };
        let from_pool = s.pool.is_some() && sampling && seeded.is_none() && case.noise.is_none();
        let at = format!("{at}, row {r} (T {t}, {:?}, {:?})", case.filters(r), noise_name(&noise, seeded.is_some()));
        let tok = out.tokens[r];
        assert!((0..vocab as i32).contains(&tok), "{at}: token {tok} is not in [0, {vocab})");
        let tok = tok as usize;
        if want_flags {
            assert_eq!(out.flags[r], d.flags, "{at}: flags");
        }
        counts.rows += 1;
        counts.greedy += d.greedy as usize;
        counts.nonfinite += (d.flags & (rf::HAS_NAN | rf::HAS_POSINF | rf::EMPTY) != 0) as usize;
        if !d.greedy {
            let source = match noise {
                _ if seeded.is_some() => 0,
                rf::Noise::Inline(_) => 1,
                rf::Noise::Exp(_) => 2,
                rf::Noise::LogExp(_) => 3,
            };
            counts.noise[source] += 1;
            if !d.kept.is_empty() && d.kept.iter().filter(|&&k| k).count() < x.iter().filter(|v| v.is_finite()).count()
            {
                counts.filtered += 1;
            }
        }
        // The counters: rows by path, and rows whose flags report NaN, +inf or an empty row.
        let w = &mut s.want;
        if d.greedy {
            w.greedy_rows += 1;
        } else if seeded.is_some() {
            w.seeded_rows += 1;
        } else if case.noise.is_some() {
            w.external_noise_rows += 1;
        } else if from_pool {
            w.pool_rows += 1;
        } else {
            w.inline_rows += 1;
        }
        w.nonfinite_rows +=
            (d.flags & (TOKENRACE_FLAG_HAS_NAN | TOKENRACE_FLAG_HAS_POSINF | TOKENRACE_FLAG_EMPTY) != 0) as u64;
        counts.pipe_rows += y.is_some() as usize;
        if from_pool && d.kept.len() == vocab {
            // The pool's noise is not the stream's: the token is checked against the twin
            // sampler only, and its logprobs at the token drawn.
            counts.pool_rows += 1;
            let lp = match &y {
                Some(y) if mode == rf::Mode::Processed => rf::logprobs(y, &d, mode),
                _ => rf::logprobs(x, &d, mode),
            };
            assert!(d.ambiguous || d.kept[tok], "{at}: pool-drawn token {tok} is not among the kept tokens");
            if want_lps && !d.ambiguous {
                assert!(rf::lp_close(out.logprobs[r], lp[tok]), "{at}: logprob of pool-drawn token {tok}");
            }
            continue;
        }

        // The token, as tests/reference.rs judges it.
        if d.ambiguous {
            // The filters' cut is within float64 rounding of a threshold: the kept set, hence
            // the token and the PROCESSED logprobs, are not decided.
            counts.ambiguous += 1;
            if mode == rf::Mode::Processed && !d.greedy {
                continue;
            }
        } else if !d.near.is_empty() {
            counts.near_ties += 1;
            assert!(
                tok == d.token || d.near.contains(&tok),
                "{at}: token {tok} is neither the best {} nor one near-tied with it {:?}",
                d.token,
                d.near
            );
        } else {
            assert_eq!(tok, d.token, "{at}: token (the runner-up {} is {:.2} tolerances behind)", d.runner_up, d.gap);
        }
        if !(want_lps || want_ranks || (n > 0 && (want_ids || want_tlps))) {
            continue;
        }
        let lp = match &y {
            Some(y) if mode == rf::Mode::Processed => rf::logprobs(y, &d, mode),
            _ => rf::logprobs(x, &d, mode),
        };
        counts.logprob_rows += 1;
        if want_lps {
            let got = out.logprobs[r];
            assert!(rf::lp_close(got, lp[tok]), "{at}: logprob of token {tok}: got {got:e}, want {:e}", lp[tok]);
        }
        if want_ranks {
            let (lo, hi) = rf::rank_range(&lp, tok);
            let rank = out.ranks[r];
            assert!(lo as i32 <= rank && rank <= hi as i32, "{at}: rank of token {tok}: got {rank}, want {lo}..={hi}");
        }
        if n > 0 && (want_ids || want_tlps) {
            counts.topn_rows += 1;
            check_top_n(
                &at,
                &lp,
                n,
                want_ids.then(|| &out.topn_ids[r * n..(r + 1) * n]),
                want_tlps.then(|| &out.topn_logprobs[r * n..(r + 1) * n]),
            );
        }
    }
}

fn noise_name(noise: &rf::Noise, seeded: bool) -> &'static str {
    match noise {
        _ if seeded => "seeded",
        rf::Noise::Inline(_) => "stream",
        rf::Noise::Exp(_) => "external E",
        rf::Noise::LogExp(_) => "external ln E",
    }
}

/// The top-n entries of a row: by logprob descending, lowest id first on ties, each id once,
/// with the reference's logprobs (entries whose reference logprobs are within the tolerance may
/// come in either order).
fn check_top_n(at: &str, lp: &[f64], n: usize, ids: Option<&[i32]>, tlps: Option<&[f32]>) {
    let want = rf::top_n(lp, n);
    for j in 0..n {
        let id = ids.map(|ids| {
            let id = ids[j];
            assert!((0..lp.len() as i32).contains(&id), "{at}: top-n id {id} out of range");
            let id = id as usize;
            let (a, b) = (lp[id], lp[want[j]]);
            assert!(
                id == want[j] || a == b || (a - b).abs() <= rf::lp_tolerance(b),
                "{at}: top-n entry {j}: id {id} ({a:e}), want id {} ({b:e}); got {ids:?}, want {want:?}",
                want[j]
            );
            assert!(!ids[..j].contains(&ids[j]), "{at}: top-n id {id} twice: {ids:?}");
            id
        });
        if let Some(tl) = tlps {
            // Judged at the id reported, or, without ids, at the reference's.
            let v = lp[id.unwrap_or(want[j])];
            assert!(rf::lp_close(tl[j], v), "{at}: top-n entry {j} has logprob {:e}, want {v:e}", tl[j]);
            if j > 0 {
                let ordered = tl[j - 1] > tl[j] || (tl[j - 1] == tl[j] && ids.is_none_or(|ids| ids[j - 1] < ids[j]));
                assert!(ordered, "{at}: top-n entries {} and {j} out of order: {ids:?} {tl:?}", j - 1);
            }
        }
    }
}

/// The sampler's counters against the expected ones: every failed call on a sampler counts in
/// `rejected_calls`, also one refused at the C boundary (NULL, `struct_size`, enums, alignment,
/// strides that overflow).
fn stats_match(s: &Subject, at: &str) {
    let got = s.stats();
    let w = &s.want;
    let fields = |st: &tokenrace_sampler_stats| {
        [
            st.calls,
            st.rejected_calls,
            st.greedy_rows,
            st.seeded_rows,
            st.inline_rows,
            st.external_noise_rows,
            st.pool_rows,
            st.nonfinite_rows,
        ]
    };
    assert_eq!(
        fields(&got),
        fields(w),
        "{at}: {} counters [calls, rejected, greedy, seeded, inline, external, pool, nonfinite]",
        s.name
    );
}

/// Whether two calls wrote the same outputs, bit for bit.
fn same_outputs(a: &OutBufs, b: &OutBufs) -> bool {
    let f = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    a.tokens == b.tokens
        && a.flags == b.flags
        && a.ranks == b.ranks
        && a.topn_ids == b.topn_ids
        && f(&a.logprobs) == f(&b.logprobs)
        && f(&a.topn_logprobs) == f(&b.topn_logprobs)
}

/// The same valid call on the twin, which must write what the subject wrote.
fn twin_agrees(s: &Subject, case: &Case, out: &OutBufs, at: &str) {
    let mut twin_out = OutBufs::new(case.rows, case.top_n);
    assert_eq!(call_on(s.twin, case, &mut twin_out), tokenrace_status::Ok, "{at}: the twin: {}", last_error());
    assert!(
        same_outputs(out, &twin_out),
        "{at}: the twin sampler drew otherwise: {:?} and {:?}",
        out.tokens,
        twin_out.tokens
    );
    if let Some([a, b]) = s.pool_counts() {
        assert_eq!(a, b, "{at}: pool rows (borrowed, skipped) differ from the twin's pool");
    }
}

/// After a refusal: a valid call of unseeded sampling rows (keyed by the stream or drawn from
/// the pool), on the subject and on its twin, which never saw the refused call: the same
/// tokens, and on inline noise the reference's (its copy of the stream was not advanced).
fn twin_check(rng: &mut TestRng, s: &mut Subject, counts: &mut Counts, at: &str) {
    let rows = 1 + rng.below(s.max_rows);
    let mut case = valid_case(rng, s, rows);
    case.temperature = Some((0..rows).map(|_| pick(rng, &[0.7, 1.0, 1.0, 2.0])).collect());
    (case.seeds, case.offsets, case.seeded, case.noise) = (None, None, None, None);
    let mut out = OutBufs::new(case.rows, case.top_n);
    let at = format!("{at}, then the twin check [{}]", case.describe());
    assert_eq!(call(s, &case, &mut out), tokenrace_status::Ok, "{at}: {}", last_error());
    s.want.calls += 1;
    twin_agrees(s, &case, &out, &at);
    check_valid(s, &case, &out, counts, &at);
    counts.twin_checks[s.pool.is_some() as usize] += 1;
}

fn run_seed(seed: u64, counts: &mut Counts) {
    let mut rng = TestRng::new(seed);
    // Three samplers: any vocab and 8 rows; a fixed vocab of 97 and 3 rows; a fixed vocab of 300,
    // 4 rows and 3 threads with a pool attached.
    let mut subjects = [
        Subject::new("any-vocab", seed ^ 0xa11, 8, 0, 1),
        Subject::new("vocab-97", seed.wrapping_add(97), 3, 97, 1),
        Subject::with_pool("vocab-300-pool", seed.wrapping_add(300), 4, 300, 3, true),
    ];
    for i in 0..CALLS_PER_SEED {
        let s = &mut subjects[rng.below(3)];
        // Rows above max_rows are decided first, since every per-row array must cover them.
        let too_many = rng.below(25) == 0;
        let rows = if too_many {
            s.max_rows + 1 + rng.below(3)
        } else if rng.below(20) == 0 {
            0
        } else {
            1 + rng.below(s.max_rows)
        };
        let mut case = valid_case(&mut rng, s, rows);
        // About half the calls carry one defect.
        let (category, expect) = if too_many {
            let want = format!("batch.rows: {rows} exceeds the sampler's max_rows {}", s.max_rows);
            ("rows above max_rows".to_string(), invalid(want))
        } else if rng.below(2) == 0 {
            ("valid".to_string(), Expect::Ok)
        } else {
            add_defect(&mut rng, s, &mut case)
        };
        let mut out = OutBufs::new(case.rows, case.top_n);
        let status = call(s, &case, &mut out);
        let message = last_error();
        let at = format!("seed {seed:#x} call {i} on {} [{category}]: {}", s.name, case.describe());
        match &expect {
            Expect::Ok => {
                assert_eq!(status, tokenrace_status::Ok, "{at}: {message}");
                assert_eq!(message, "", "{at}: a successful call leaves no error");
                s.want.calls += 1;
                twin_agrees(s, &case, &out, &at);
                check_valid(s, &case, &out, counts, &at);
                *counts.calls.entry(valid_label(&case)).or_default() += 1;
            }
            Expect::Fail(want_status, prefix) => {
                assert_eq!(status, *want_status, "{at}: status ({message})");
                assert!(message.starts_with(prefix.as_str()), "{at}: message {message:?} does not start {prefix:?}");
                if let Some(name) = out.written_from([0; 6]) {
                    panic!("{at}: the call failed but wrote {name}");
                }
                if case.null != Some(Null::Sampler) {
                    s.want.rejected_calls += 1;
                }
                *counts.calls.entry(format!("invalid: {category}")).or_default() += 1;
                stats_match(s, &at);
                twin_check(&mut rng, s, counts, &at);
            }
        }
        stats_match(s, &at);
    }
}

/// The category of a valid call, by its rarer features.
fn valid_label(case: &Case) -> String {
    let mut f = Vec::new();
    if case.rows == 0 {
        f.push("0 rows");
    }
    if case.rows == 1 && case.row_stride > 1 << 32 {
        f.push("1 row, huge stride");
    }
    if case.noise.as_ref().is_some_and(|n| n.row_stride == 0) && case.rows > 1 {
        f.push("broadcast noise");
    }
    if case.batch_size < BATCH_FULL {
        f.push("batch of an older version");
    }
    if case.batch_size > BATCH_FULL || case.out_size > OUT_FULL {
        f.push("larger struct, zero tail");
    }
    if case.pipe.is_some() {
        f.push(if case.reads_pipe() { "sampling step" } else { "sampling step unread" });
    }
    format!("valid: {}", if f.is_empty() { "plain".to_string() } else { f.join(", ") })
}

#[test]
fn random_calls_through_the_c_abi_answer_as_documented() {
    let started = std::time::Instant::now();
    let mut counts = Counts::default();
    for seed in SEEDS {
        run_seed(seed, &mut counts);
    }
    let total: usize = counts.calls.values().sum();
    let valid: usize = counts.calls.iter().filter(|(k, _)| k.starts_with("valid")).map(|(_, v)| v).sum();
    eprintln!("random driver: {total} calls on seeds {SEEDS:x?}, {valid} valid, {} with one defect", total - valid);
    for (category, n) in &counts.calls {
        eprintln!("  {n:5}  {category}");
    }
    eprintln!(
        "  rows checked against the reference: {} ({} greedy; sampling by noise [seeded, stream or pool, E, ln E] {:?}, {} of \
         them filtered; {} with NaN/+inf/empty); {} near ties and {} filter cuts within rounding skipped; logprobs \
         checked on {} rows, top-n on {}; {} rows with the sampling step's inputs, {} drawn from a pool; twin checks \
         after refusals [inline, pool] {:?}; {:.1?}",
        counts.rows,
        counts.greedy,
        counts.noise,
        counts.filtered,
        counts.nonfinite,
        counts.near_ties,
        counts.ambiguous,
        counts.logprob_rows,
        counts.topn_rows,
        counts.pipe_rows,
        counts.pool_rows,
        counts.twin_checks,
        started.elapsed()
    );
    // Every category was reached (a generator that stops producing one tests nothing of it).
    let invalid_categories = counts.calls.keys().filter(|k| k.starts_with("invalid")).count();
    assert_eq!(invalid_categories, KINDS_OF_DEFECT, "kinds of defect generated: {:?}", counts.calls.keys());
    assert!(counts.noise.iter().all(|&n| n > 100), "too few sampling rows of some noise: {:?}", counts.noise);
    assert!(counts.near_ties + counts.ambiguous <= 5.max(counts.rows / 200), "too many rows skipped");
}

/// `rejected_calls` is "calls that failed (bad arguments, the noise pool, a worker)": also a call
/// refused at the C boundary (here a bad dtype), before the sampler sees it.
#[test]
fn every_failed_call_is_counted() {
    let mut rng = TestRng::new(3);
    let s = Subject::new("any-vocab", 3, 8, 0, 1);
    let mut case = valid_case(&mut rng, &s, 2);
    case.dtype_field = 3;
    let mut out = OutBufs::new(case.rows, case.top_n);
    assert_eq!(call(&s, &case, &mut out), tokenrace_status::InvalidArgument);
    assert_eq!(s.stats().rejected_calls, 1, "the failed call was not counted ({})", last_error());
}
