//! `tokenrace_draw_greedy`, the greedy call without the general batch: the tokens and flags of
//! `tokenrace_draw` at temperature 0 on the same rows (ties, NaN, infinities, empty rows, every
//! dtype, strided rows, several threads) at every SIMD level, the sampler's stats as a draw's,
//! and its refusals: each names the argument, writes nothing and counts as a rejected call.

mod common;

use common::{gen_row, last_error, pick_dist, TestRng};
use std::ffi::c_void;
use std::mem::{offset_of, size_of};
use tokenrace::internals::api::*;
use tokenrace::internals::types::*;
use tokenrace::internals::{each_level, force_participants};
use tokenrace::SimdLevel;

/// The C enum of a SIMD level.
fn simd_of(level: SimdLevel) -> u32 {
    (match level {
        SimdLevel::Scalar => tokenrace_simd::Scalar,
        SimdLevel::Portable => tokenrace_simd::Portable,
        SimdLevel::Avx2 => tokenrace_simd::Avx2,
        SimdLevel::Avx512 => tokenrace_simd::Avx512,
        SimdLevel::Neon => tokenrace_simd::Neon,
        SimdLevel::Vxe2 => tokenrace_simd::Vxe2,
    }) as u32
}

struct Sampler(*mut tokenrace_sampler);

impl Sampler {
    fn new(simd: u32, vocab_size: usize, max_rows: usize, threads: usize) -> Sampler {
        let mut cfg = tokenrace_config_default();
        (cfg.simd, cfg.vocab_size, cfg.max_rows, cfg.threads) =
            (simd, vocab_size as u32, max_rows as u32, threads as u32);
        let mut ptr = std::ptr::null_mut();
        // SAFETY: a valid config and a writable out pointer.
        assert_eq!(unsafe { tokenrace_sampler_new(&cfg, &mut ptr) }, tokenrace_status::Ok, "{}", last_error());
        Sampler(ptr)
    }

    fn stats(&self) -> tokenrace_sampler_stats {
        // SAFETY: all-zero is a valid stats struct; the sampler is live.
        let mut st: tokenrace_sampler_stats = unsafe { std::mem::zeroed() };
        st.struct_size = size_of::<tokenrace_sampler_stats>() as u32;
        assert_eq!(unsafe { tokenrace_sampler_get_stats(self.0, &mut st) }, tokenrace_status::Ok);
        st
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        // SAFETY: made by tokenrace_sampler_new, freed once.
        unsafe { tokenrace_sampler_free(self.0) };
    }
}

/// Rows of one dtype: the bytes of `rows` rows, `stride` elements apart.
struct Rows {
    dtype: tokenrace_dtype,
    data: Vec<u32>, // 4-byte aligned storage for every dtype
    rows: usize,
    vocab: usize,
    stride: usize,
}

impl Rows {
    fn new(rng: &mut TestRng, dtype: tokenrace_dtype, rows: usize, vocab: usize, stride: usize) -> Rows {
        let elem = if dtype == tokenrace_dtype::F32 { 4 } else { 2 };
        let mut bytes = vec![0u8; (rows * stride * elem).div_ceil(4) * 4];
        for r in 0..rows {
            let dist = pick_dist(rng);
            let row = gen_row(rng, dist, vocab);
            for (i, &x) in row.iter().enumerate() {
                let at = (r * stride + i) * elem;
                match dtype {
                    tokenrace_dtype::F32 => bytes[at..at + 4].copy_from_slice(&x.to_le_bytes()),
                    // The upper half of the f32: a bf16 (truncated, ties made often enough).
                    tokenrace_dtype::Bf16 => bytes[at..at + 2].copy_from_slice(&x.to_le_bytes()[2..]),
                    tokenrace_dtype::F16 => bytes[at..at + 2].copy_from_slice(&f16_bits(x).to_le_bytes()),
                }
            }
        }
        let data = bytes.chunks(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
        Rows { dtype, data, rows, vocab, stride }
    }

    fn ptr(&self) -> *const c_void {
        self.data.as_ptr() as *const c_void
    }

    fn greedy_batch(&self) -> tokenrace_greedy_batch {
        tokenrace_greedy_batch {
            struct_size: size_of::<tokenrace_greedy_batch>() as u32,
            dtype: self.dtype as u32,
            logits: self.ptr(),
            rows: self.rows as u32,
            vocab: self.vocab as u32,
            row_stride: self.stride as u64,
        }
    }
}

/// An f16 of `x`, rounded toward zero (ties and the special values are what matter here).
fn f16_bits(x: f32) -> u16 {
    if x.is_nan() {
        return 0x7e00;
    }
    let sign = if x.is_sign_negative() { 0x8000 } else { 0 };
    let a = x.abs();
    if a >= 65504.0 {
        return sign | if a.is_infinite() { 0x7c00 } else { 0x7bff };
    }
    if a < 6.1e-5 {
        return sign; // flushed to a zero: ties at 0 are kept
    }
    let bits = a.to_bits();
    let exp = ((bits >> 23) as i32 - 127 + 15) as u16;
    sign | (exp << 10) | ((bits >> 13) & 0x3ff) as u16
}

/// `tokenrace_draw` of the rows at temperature 0 with nothing else: (tokens, flags).
fn draw_general(s: &Sampler, x: &Rows) -> (Vec<i32>, Vec<u32>) {
    let temps = vec![0.0f32; x.rows];
    let (mut tokens, mut flags) = (vec![-7; x.rows], vec![7; x.rows]);
    // SAFETY: all-zero is valid for these structs (integers and NULL pointers).
    let (mut b, mut o): (tokenrace_batch, tokenrace_output) = unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
    (b.struct_size, b.dtype, b.logits, b.rows, b.vocab, b.row_stride) =
        (size_of::<tokenrace_batch>() as u32, x.dtype as u32, x.ptr(), x.rows as u32, x.vocab as u32, x.stride as u64);
    b.temperature = temps.as_ptr();
    (o.struct_size, o.tokens, o.flags) =
        (size_of::<tokenrace_output>() as u32, tokens.as_mut_ptr(), flags.as_mut_ptr());
    // SAFETY: the pointers cover what the sizes say.
    assert_eq!(unsafe { tokenrace_draw(s.0, &b, &mut o) }, tokenrace_status::Ok, "{}", last_error());
    (tokens, flags)
}

/// `tokenrace_draw_greedy` of the rows: (status, tokens, flags), the outputs prefilled.
fn draw_greedy(
    s: &Sampler,
    b: &tokenrace_greedy_batch,
    rows: usize,
    with_flags: bool,
) -> (tokenrace_status, Vec<i32>, Vec<u32>) {
    let (mut tokens, mut flags) = (vec![-7; rows], vec![7; rows]);
    let f = if with_flags { flags.as_mut_ptr() } else { std::ptr::null_mut() };
    // SAFETY: the outputs hold `rows` elements; the batch's pointers are the caller's.
    let status = unsafe { tokenrace_draw_greedy(s.0, b, tokens.as_mut_ptr(), f) };
    (status, tokens, flags)
}

#[test]
fn the_greedy_call_gives_the_draws_tokens_and_flags_at_every_level() {
    let mut rng = TestRng::new(41);
    each_level(|level| {
        for (dtype, vocab, stride) in [
            (tokenrace_dtype::F32, 1, 1),
            (tokenrace_dtype::F32, 37, 40),
            (tokenrace_dtype::F32, 1000, 0),
            (tokenrace_dtype::F32, 4099, 4099),
            (tokenrace_dtype::F32, 32_000, 32_005),
            (tokenrace_dtype::Bf16, 4099, 4102),
            (tokenrace_dtype::F16, 1000, 1000),
        ] {
            let rows = 24;
            let x = Rows::new(&mut rng, dtype, rows, vocab, stride.max(vocab));
            let s = Sampler::new(simd_of(level), vocab, 64, 1);
            let want = draw_general(&s, &x);
            let mut b = x.greedy_batch();
            b.row_stride = stride as u64; // 0: the vocab
            let (status, tokens, flags) = draw_greedy(&s, &b, rows, true);
            assert_eq!(status, tokenrace_status::Ok, "{}", last_error());
            assert_eq!((tokens, flags), want, "{dtype:?} vocab {vocab} stride {stride}");
            let (_, tokens, untouched) = draw_greedy(&s, &b, rows, false);
            assert_eq!(tokens, want.0);
            assert!(untouched.iter().all(|&f| f == 7), "flags NULL: not written");
            assert!(want.1.iter().all(|&f| f & tokenrace::flags::GREEDY != 0));
        }
    });
}

/// Rows the reference argmax decides: the first largest value, NaN ignored, the first +inf, token
/// 0 for an empty row; every special case is flagged as the draw flags it.
#[test]
fn the_greedy_call_takes_the_first_largest_value() {
    let s = Sampler::new(0, 0, 8, 1);
    let nan = f32::NAN;
    let (inf, ninf) = (f32::INFINITY, f32::NEG_INFINITY);
    for (row, token, flags) in [
        (vec![1.0, 3.0, 3.0, 2.0], 1, 0),
        (vec![nan, 3.0, nan, 3.0], 1, tokenrace::flags::HAS_NAN),
        (vec![ninf, 1.0, inf, inf], 2, tokenrace::flags::HAS_POSINF),
        (vec![ninf, nan, ninf, ninf], 0, tokenrace::flags::EMPTY | tokenrace::flags::HAS_NAN),
        (vec![-0.0, 0.0, -0.0, 0.0], 0, 0),
    ] {
        let b = tokenrace_greedy_batch {
            struct_size: size_of::<tokenrace_greedy_batch>() as u32,
            dtype: tokenrace_dtype::F32 as u32,
            logits: row.as_ptr() as *const c_void,
            rows: 1,
            vocab: 4,
            row_stride: 0,
        };
        let (status, tokens, got) = draw_greedy(&s, &b, 1, true);
        assert_eq!(status, tokenrace_status::Ok, "{}", last_error());
        assert_eq!((tokens[0], got[0] & !tokenrace::flags::GREEDY), (token, flags), "{row:?}");
    }
}

#[test]
fn the_greedy_call_on_several_threads_gives_one_threads_tokens() {
    let mut rng = TestRng::new(43);
    for (rows, vocab) in [(64, 4099), (3, 1 << 18)] {
        let x = Rows::new(&mut rng, tokenrace_dtype::F32, rows, vocab, vocab);
        let one = Sampler::new(0, vocab, 64, 1);
        let want = draw_greedy(&one, &x.greedy_batch(), rows, true);
        let many = Sampler::new(0, vocab, 64, 4);
        for forced in [0, 2, 4] {
            force_participants(forced);
            let got = draw_greedy(&many, &x.greedy_batch(), rows, true);
            force_participants(0);
            assert_eq!(got, want, "{rows} x {vocab}, {forced} participants");
        }
    }
}

#[test]
fn the_greedy_call_counts_as_a_draw_of_greedy_rows() {
    let mut rng = TestRng::new(44);
    let x = Rows::new(&mut rng, tokenrace_dtype::F32, 5, 100, 100);
    let s = Sampler::new(0, 100, 8, 1);
    assert_eq!(draw_greedy(&s, &x.greedy_batch(), 5, false).0, tokenrace_status::Ok);
    let st = s.stats();
    assert_eq!((st.calls, st.greedy_rows, st.rejected_calls, st.inline_rows), (1, 5, 0, 0));
    let mut b = x.greedy_batch();
    b.rows = 9; // above max_rows
    assert_eq!(draw_greedy(&s, &b, 9, false).0, tokenrace_status::InvalidArgument);
    let st = s.stats();
    assert_eq!((st.calls, st.greedy_rows, st.rejected_calls), (1, 5, 1));
}

/// Each refusal names what was wrong and writes nothing.
#[test]
fn the_greedy_call_refuses_bad_arguments_and_writes_nothing() {
    let mut rng = TestRng::new(45);
    let x = Rows::new(&mut rng, tokenrace_dtype::F32, 4, 100, 100);
    let s = Sampler::new(0, 100, 8, 1);
    let ok = x.greedy_batch();
    let cases: Vec<(tokenrace_greedy_batch, &str)> = vec![
        (tokenrace_greedy_batch { rows: 9, ..ok }, "batch.rows: 9 exceeds the sampler's max_rows 8"),
        (tokenrace_greedy_batch { vocab: 99, ..ok }, "batch.vocab: 99 differs from the sampler's vocab_size 100"),
        (tokenrace_greedy_batch { row_stride: 50, ..ok }, "batch.row_stride: 50 is smaller than vocab 100"),
        (tokenrace_greedy_batch { dtype: 9, ..ok }, "batch.dtype"),
        (tokenrace_greedy_batch { logits: std::ptr::null(), ..ok }, "batch.logits: is NULL"),
        (tokenrace_greedy_batch { struct_size: 20, ..ok }, "batch.struct_size: 20 is smaller than the first"),
    ];
    for (b, want) in cases {
        let (status, tokens, flags) = draw_greedy(&s, &b, 4, true);
        assert_eq!(status, tokenrace_status::InvalidArgument, "{want}");
        let msg = last_error();
        assert!(msg.starts_with("tokenrace_draw_greedy: ") && msg.contains(want), "{msg} (wanted {want})");
        assert!(tokens.iter().all(|&t| t == -7) && flags.iter().all(|&f| f == 7), "{want}: written");
    }
    // SAFETY (each call below): NULL arguments, refused before anything is read through them.
    unsafe {
        let mut tokens = [-7i32; 4];
        assert_eq!(
            tokenrace_draw_greedy(std::ptr::null_mut(), &ok, tokens.as_mut_ptr(), std::ptr::null_mut()),
            tokenrace_status::InvalidArgument
        );
        assert!(last_error().contains("sampler: is NULL"));
        assert_eq!(
            tokenrace_draw_greedy(s.0, std::ptr::null(), tokens.as_mut_ptr(), std::ptr::null_mut()),
            tokenrace_status::InvalidArgument
        );
        assert!(last_error().contains("batch: is NULL"));
        assert_eq!(
            tokenrace_draw_greedy(s.0, &ok, std::ptr::null_mut(), std::ptr::null_mut()),
            tokenrace_status::InvalidArgument
        );
        assert!(last_error().contains("tokens: is NULL"), "{}", last_error());
        let odd = (tokens.as_mut_ptr() as *mut u8).add(1) as *mut i32;
        assert_eq!(tokenrace_draw_greedy(s.0, &ok, odd, std::ptr::null_mut()), tokenrace_status::InvalidArgument);
        assert!(last_error().contains("tokens: is not aligned to 4 bytes"), "{}", last_error());
        assert_eq!(tokens, [-7; 4]);
    }
}

/// An output that shares memory with the logits or with the other output is refused, naming both.
#[test]
fn the_greedy_call_refuses_overlapping_outputs() {
    let s = Sampler::new(0, 0, 8, 1);
    let mut buf = vec![1.0f32; 64];
    let logits = buf.as_mut_ptr();
    let b = tokenrace_greedy_batch {
        struct_size: size_of::<tokenrace_greedy_batch>() as u32,
        dtype: tokenrace_dtype::F32 as u32,
        logits: logits as *const c_void,
        rows: 2,
        vocab: 16,
        row_stride: 16,
    };
    let mut tokens = [-7i32; 2];
    let mut flags = [7u32; 2];
    // SAFETY: every pointer covers 2 elements; the overlapping ones are refused before writing.
    unsafe {
        let in_logits = logits.add(20) as *mut i32;
        assert_eq!(tokenrace_draw_greedy(s.0, &b, in_logits, std::ptr::null_mut()), tokenrace_status::InvalidArgument);
        assert!(last_error().contains("tokens: overlaps batch.logits"), "{}", last_error());
        let flags_in_logits = logits.add(31) as *mut u32;
        assert_eq!(
            tokenrace_draw_greedy(s.0, &b, tokens.as_mut_ptr(), flags_in_logits),
            tokenrace_status::InvalidArgument
        );
        assert!(last_error().contains("flags: overlaps batch.logits"), "{}", last_error());
        let flags_on_tokens = (tokens.as_mut_ptr() as *mut u32).add(1);
        assert_eq!(
            tokenrace_draw_greedy(s.0, &b, tokens.as_mut_ptr(), flags_on_tokens),
            tokenrace_status::InvalidArgument
        );
        assert!(last_error().contains("flags: overlaps tokens"), "{}", last_error());
        assert_eq!((tokens, flags), ([-7; 2], [7; 2]));
        // Past the logits' span (2 rows of 16): not an overlap.
        let after = logits.add(32) as *mut i32;
        assert_eq!(tokenrace_draw_greedy(s.0, &b, after, flags.as_mut_ptr()), tokenrace_status::Ok, "{}", last_error());
    }
}

#[test]
fn the_greedy_batch_layout_is_pinned() {
    assert_eq!(size_of::<tokenrace_greedy_batch>(), 32);
    for (offset, want) in [
        (offset_of!(tokenrace_greedy_batch, struct_size), 0),
        (offset_of!(tokenrace_greedy_batch, dtype), 4),
        (offset_of!(tokenrace_greedy_batch, logits), 8),
        (offset_of!(tokenrace_greedy_batch, rows), 16),
        (offset_of!(tokenrace_greedy_batch, vocab), 20),
        (offset_of!(tokenrace_greedy_batch, row_stride), 24),
    ] {
        assert_eq!(offset, want);
    }
}
