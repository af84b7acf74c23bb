//! The C structs through the C entry points (the draw's and, since 0.2, the verify call's):
//! sizes that tear a field or fall below the first version, strides whose byte span overflows,
//! and enum fields out of range are refused with a message naming them, and nothing is written.

mod common;

use common::last_error;
use tokenrace::internals::api::*;
use tokenrace::internals::types::*;

struct Fixture {
    sampler: *mut tokenrace_sampler,
    logits: Vec<f32>,
    tokens: [i32; 2],
}

impl Fixture {
    fn new() -> Fixture {
        let mut sampler = std::ptr::null_mut();
        // SAFETY: a default config and a writable out pointer.
        assert_eq!(unsafe { tokenrace_sampler_new(&tokenrace_config_default(), &mut sampler) }, tokenrace_status::Ok);
        Fixture { sampler, logits: (0..2000).map(|i| (i % 7) as f32).collect(), tokens: [-1; 2] }
    }

    /// A valid batch of 2 rows of vocab 1000 and its output.
    fn args(&mut self) -> (tokenrace_batch, tokenrace_output) {
        // SAFETY: all-zero is valid for these structs (integers and NULL pointers).
        let (mut b, mut o): (tokenrace_batch, tokenrace_output) = unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
        b.struct_size = std::mem::size_of::<tokenrace_batch>() as u32;
        b.logits = self.logits.as_ptr() as *const _;
        b.rows = 2;
        b.vocab = 1000;
        o.struct_size = std::mem::size_of::<tokenrace_output>() as u32;
        o.tokens = self.tokens.as_mut_ptr();
        (b, o)
    }

    fn draw(&mut self, b: &tokenrace_batch, o: &mut tokenrace_output) -> tokenrace_status {
        // SAFETY: the batch's pointers cover what its sizes say (or the call must refuse them
        // before reading: that is what these tests check).
        unsafe { tokenrace_draw(self.sampler, b, o) }
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        // SAFETY: made by tokenrace_sampler_new, freed once.
        unsafe { tokenrace_sampler_free(self.sampler) };
    }
}

#[test]
fn the_valid_fixture_draws() {
    let mut f = Fixture::new();
    let (b, mut o) = f.args();
    assert_eq!(f.draw(&b, &mut o), tokenrace_status::Ok, "{}", last_error());
    assert!(f.tokens.iter().all(|&t| (0..1000).contains(&t)));
}

/// A stride whose byte span overflows the address space is refused, naming the stride (it used
/// to segfault at 2^61 and read row 0's memory as row 1 at 2^62).
#[test]
fn a_row_stride_whose_byte_span_overflows_is_refused() {
    let mut f = Fixture::new();
    for stride in [1u64 << 61, 1 << 62, 1 << 63, u64::MAX, (isize::MAX as u64) / 4] {
        let (mut b, mut o) = f.args();
        b.row_stride = stride;
        assert_eq!(f.draw(&b, &mut o), tokenrace_status::InvalidArgument, "stride {stride}");
        assert!(last_error().contains("batch.row_stride"), "{stride}: {}", last_error());
        assert_eq!(f.tokens, [-1; 2], "nothing is written");
    }
    // The noise stride likewise.
    let noise = vec![1.0f32; 2000];
    for stride in [1u64 << 61, 1 << 62] {
        let (mut b, mut o) = f.args();
        b.noise = noise.as_ptr();
        b.noise_row_stride = stride;
        assert_eq!(f.draw(&b, &mut o), tokenrace_status::InvalidArgument, "noise stride {stride}");
        assert!(last_error().contains("batch.noise_row_stride"), "{}", last_error());
    }
}

/// A `struct_size` that ends inside a field is refused naming the field (89..111 used to copy
/// part of a pointer, and 105 and 109 with min_p set segfaulted).
#[test]
fn a_struct_size_inside_a_field_is_refused_naming_it() {
    let mut f = Fixture::new();
    let min_p = [0.1f32, 0.1];
    for size in (89..112u32).filter(|s| s % 8 != 0) {
        let (mut b, mut o) = f.args();
        b.min_p = min_p.as_ptr();
        b.struct_size = size;
        assert_eq!(f.draw(&b, &mut o), tokenrace_status::InvalidArgument, "size {size}");
        let field = ["top_k", "top_p", "min_p"][(size as usize - 88) / 8];
        assert!(
            last_error().contains(&format!("batch.struct_size: {size} ends inside field {field}")),
            "{}",
            last_error()
        );
        assert_eq!(f.tokens, [-1; 2]);
    }
    for size in [88u32, 96, 104, 112] {
        let (mut b, mut o) = f.args();
        b.struct_size = size;
        assert_eq!(f.draw(&b, &mut o), tokenrace_status::Ok, "size {size}: {}", last_error());
    }
    let (b, mut o) = f.args();
    o.struct_size = 60;
    assert_eq!(f.draw(&b, &mut o), tokenrace_status::InvalidArgument);
    assert!(
        last_error().contains("out.struct_size: 60 is smaller than the first tokenrace_output (64 bytes)"),
        "{}",
        last_error()
    );
}

#[test]
fn enum_fields_out_of_range_name_the_field() {
    let mut f = Fixture::new();
    let (mut b, mut o) = f.args();
    b.dtype = 3;
    assert_eq!(f.draw(&b, &mut o), tokenrace_status::InvalidArgument);
    assert_eq!(last_error(), "tokenrace_draw: batch.dtype: 3 is not a tokenrace_dtype (0..=2)");
    let (b, mut o) = f.args();
    o.logprob_mode = 2;
    assert_eq!(f.draw(&b, &mut o), tokenrace_status::InvalidArgument);
    assert!(last_error().contains("out.logprob_mode: 2 is not a tokenrace_logprob_mode"), "{}", last_error());
    let mut cfg = tokenrace_config_default();
    cfg.simd = 9;
    let mut s = std::ptr::null_mut();
    // SAFETY: a config and a writable out pointer.
    assert_eq!(unsafe { tokenrace_sampler_new(&cfg, &mut s) }, tokenrace_status::InvalidConfig);
    assert!(last_error().contains("simd: 9 is not a tokenrace_simd (0..=6)"), "{}", last_error());
}

/// Zero rows need no pointers; the sizes are still checked.
#[test]
fn zero_rows_need_no_pointers() {
    let mut f = Fixture::new();
    let (mut b, mut o) = f.args();
    b.rows = 0;
    b.logits = std::ptr::null();
    o.tokens = std::ptr::null_mut();
    assert_eq!(f.draw(&b, &mut o), tokenrace_status::Ok, "{}", last_error());
    b.vocab = 0;
    assert_eq!(f.draw(&b, &mut o), tokenrace_status::InvalidArgument);
    assert!(last_error().contains("batch.vocab: must be at least 1"), "{}", last_error());
}

// ---- tokenrace_verify's structs (since 0.2) ----------------------------------------------------

/// A sampler and the buffers of a valid verify call: 2 requests (1 draft, then none) over 3 rows
/// of vocab 1000; the output arrays hold sentinels that a failing call must leave.
struct VerifyFixture {
    sampler: *mut tokenrace_sampler,
    logits: Vec<f32>,
    counts: [i32; 2],
    drafts: [i32; 1],
    q: Vec<f32>,
    noise: Vec<f32>,
    tokens: [i32; 4],
    emitted: [i32; 2],
    flags: [u32; 2],
    logprobs: [f32; 4],
}

impl VerifyFixture {
    fn new() -> VerifyFixture {
        let mut sampler = std::ptr::null_mut();
        // SAFETY: a default config and a writable out pointer.
        assert_eq!(unsafe { tokenrace_sampler_new(&tokenrace_config_default(), &mut sampler) }, tokenrace_status::Ok);
        VerifyFixture {
            sampler,
            logits: (0..3000).map(|i| (i % 7) as f32).collect(),
            counts: [1, 0],
            drafts: [5],
            q: vec![1.0 / 1000.0; 1000],
            noise: vec![1.0; 3000],
            tokens: [-7; 4],
            emitted: [-7; 2],
            flags: [77; 2],
            logprobs: [12345.0; 4],
        }
    }

    fn args(&mut self) -> (tokenrace_verify_batch, tokenrace_verify_output) {
        // SAFETY: all-zero is valid for these structs (integers and NULL pointers).
        let (mut b, mut o): (tokenrace_verify_batch, tokenrace_verify_output) =
            unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
        b.struct_size = std::mem::size_of::<tokenrace_verify_batch>() as u32;
        b.logits = self.logits.as_ptr() as *const _;
        b.rows = 3;
        b.vocab = 1000;
        b.requests = 2;
        b.draft_counts = self.counts.as_ptr();
        b.draft_tokens = self.drafts.as_ptr();
        o.struct_size = std::mem::size_of::<tokenrace_verify_output>() as u32;
        o.tokens = self.tokens.as_mut_ptr();
        o.counts = self.emitted.as_mut_ptr();
        o.flags = self.flags.as_mut_ptr();
        o.logprobs = self.logprobs.as_mut_ptr();
        (b, o)
    }

    fn verify(&mut self, b: &tokenrace_verify_batch, o: &mut tokenrace_verify_output) -> tokenrace_status {
        // SAFETY: the batch's pointers cover what its sizes say (or the call must refuse them
        // before reading: that is what these tests check).
        unsafe { tokenrace_verify(self.sampler, b, o) }
    }

    fn untouched(&self) -> bool {
        self.tokens == [-7; 4] && self.emitted == [-7; 2] && self.flags == [77; 2] && self.logprobs == [12345.0; 4]
    }
}

impl Drop for VerifyFixture {
    fn drop(&mut self) {
        // SAFETY: made by tokenrace_sampler_new, freed once.
        unsafe { tokenrace_sampler_free(self.sampler) };
    }
}

#[test]
fn the_valid_verify_fixture_verifies() {
    let mut f = VerifyFixture::new();
    let (b, mut o) = f.args();
    assert_eq!(f.verify(&b, &mut o), tokenrace_status::Ok, "{}", last_error());
    assert!((1..=2).contains(&f.emitted[0]) && f.emitted[1] == 1, "{:?}", f.emitted);
    assert!(f.tokens[..f.emitted[0] as usize].iter().all(|t| (0..1000).contains(t)));
    assert!(f.tokens[f.emitted[0] as usize..2].iter().all(|&t| t == -1) && f.tokens[3] == -1);
}

/// The layouts of the header (c_tests/test_verify.c pins the same offsets from C), packed
/// without padding.
#[test]
fn the_verify_structs_have_the_layout_of_the_header() {
    use std::mem::{offset_of, size_of};
    assert_eq!(size_of::<tokenrace_verify_batch>(), 352);
    assert_eq!(size_of::<tokenrace_verify_output>(), 56);
    let b = [
        (offset_of!(tokenrace_verify_batch, struct_size), 0),
        (offset_of!(tokenrace_verify_batch, dtype), 4),
        (offset_of!(tokenrace_verify_batch, logits), 8),
        (offset_of!(tokenrace_verify_batch, rows), 16),
        (offset_of!(tokenrace_verify_batch, vocab), 20),
        (offset_of!(tokenrace_verify_batch, row_stride), 24),
        (offset_of!(tokenrace_verify_batch, requests), 32),
        (offset_of!(tokenrace_verify_batch, reserved0), 36),
        (offset_of!(tokenrace_verify_batch, draft_counts), 40),
        (offset_of!(tokenrace_verify_batch, draft_tokens), 48),
        (offset_of!(tokenrace_verify_batch, draft_probs), 56),
        (offset_of!(tokenrace_verify_batch, draft_probs_row_stride), 64),
        (offset_of!(tokenrace_verify_batch, temperature), 72),
        (offset_of!(tokenrace_verify_batch, top_k), 80),
        (offset_of!(tokenrace_verify_batch, top_p), 88),
        (offset_of!(tokenrace_verify_batch, min_p), 96),
        (offset_of!(tokenrace_verify_batch, seeds), 104),
        (offset_of!(tokenrace_verify_batch, offsets), 112),
        (offset_of!(tokenrace_verify_batch, seeded), 120),
        (offset_of!(tokenrace_verify_batch, uniforms), 128),
        (offset_of!(tokenrace_verify_batch, noise), 136),
        (offset_of!(tokenrace_verify_batch, noise_kind), 144),
        (offset_of!(tokenrace_verify_batch, reserved1), 148),
        (offset_of!(tokenrace_verify_batch, noise_row_stride), 152),
        (offset_of!(tokenrace_verify_batch, draft_parents), 160),
        // The sampling step inside verification (since 0.3).
        (offset_of!(tokenrace_verify_batch, prompt_ids), 168),
        (offset_of!(tokenrace_verify_batch, prompt_offsets), 176),
        (offset_of!(tokenrace_verify_batch, output_ids), 184),
        (offset_of!(tokenrace_verify_batch, output_offsets), 192),
        (offset_of!(tokenrace_verify_batch, repetition_penalty), 200),
        (offset_of!(tokenrace_verify_batch, frequency_penalty), 208),
        (offset_of!(tokenrace_verify_batch, presence_penalty), 216),
        (offset_of!(tokenrace_verify_batch, bias_ids), 224),
        (offset_of!(tokenrace_verify_batch, bias_values), 232),
        (offset_of!(tokenrace_verify_batch, bias_offsets), 240),
        (offset_of!(tokenrace_verify_batch, allowed_ids), 248),
        (offset_of!(tokenrace_verify_batch, allowed_offsets), 256),
        (offset_of!(tokenrace_verify_batch, allowed_rows), 264),
        (offset_of!(tokenrace_verify_batch, banned_ids), 272),
        (offset_of!(tokenrace_verify_batch, banned_offsets), 280),
        (offset_of!(tokenrace_verify_batch, token_bitmask), 288),
        (offset_of!(tokenrace_verify_batch, bitmask_row_stride), 296),
        (offset_of!(tokenrace_verify_batch, bad_words_ids), 304),
        (offset_of!(tokenrace_verify_batch, bad_word_offsets), 312),
        (offset_of!(tokenrace_verify_batch, bad_words_row_offsets), 320),
        (offset_of!(tokenrace_verify_batch, min_tokens), 328),
        (offset_of!(tokenrace_verify_batch, stop_ids), 336),
        (offset_of!(tokenrace_verify_batch, stop_offsets), 344),
    ];
    let o = [
        (offset_of!(tokenrace_verify_output, struct_size), 0),
        (offset_of!(tokenrace_verify_output, logprob_mode), 4),
        (offset_of!(tokenrace_verify_output, tokens), 8),
        (offset_of!(tokenrace_verify_output, tokens_stride), 16),
        (offset_of!(tokenrace_verify_output, counts), 24),
        (offset_of!(tokenrace_verify_output, flags), 32),
        (offset_of!(tokenrace_verify_output, logprobs), 40),
        (offset_of!(tokenrace_verify_output, accepted_nodes), 48),
    ];
    for (i, (got, want)) in b.iter().chain(o.iter()).enumerate() {
        assert_eq!(got, want, "field {i}");
    }
}

/// Both structs are their first version: every size below it is refused naming the argument (a
/// size ending inside a field is below it too), nothing is written; a larger struct is accepted
/// when the bytes beyond are zero and UNSUPPORTED otherwise.
#[test]
fn verify_struct_sizes_below_the_first_version_are_refused() {
    let mut f = VerifyFixture::new();
    for size in [0u32, 4, 8, 100, 152, 156, 159] {
        let (mut b, mut o) = f.args();
        b.struct_size = size;
        assert_eq!(f.verify(&b, &mut o), tokenrace_status::InvalidArgument, "size {size}");
        let want = format!(
            "tokenrace_verify: batch.struct_size: {size} is smaller than the first tokenrace_verify_batch (160 bytes)"
        );
        assert!(last_error().starts_with(&want), "{}", last_error());
        assert!(f.untouched());
    }
    for size in [0u32, 8, 44, 47] {
        let (b, mut o) = f.args();
        o.struct_size = size;
        assert_eq!(f.verify(&b, &mut o), tokenrace_status::InvalidArgument, "size {size}");
        assert!(
            last_error().contains(&format!(
                "out.struct_size: {size} is smaller than the first tokenrace_verify_output (48 bytes)"
            )),
            "{}",
            last_error()
        );
        assert!(f.untouched());
    }

    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Newer<T> {
        known: T,
        extra: u64,
    }
    let (b, o) = f.args();
    let mut nb = Newer { known: b, extra: 0 };
    nb.known.struct_size = std::mem::size_of::<Newer<tokenrace_verify_batch>>() as u32;
    let mut no = Newer { known: o, extra: 0 };
    no.known.struct_size = std::mem::size_of::<Newer<tokenrace_verify_output>>() as u32;
    nb.extra = 1;
    assert_eq!(f.verify(&nb.known, &mut no.known), tokenrace_status::Unsupported);
    assert!(
        last_error().contains("batch: sets fields beyond the 352 bytes of tokenrace_verify_batch"),
        "{}",
        last_error()
    );
    nb.extra = 0;
    no.extra = 1;
    assert_eq!(f.verify(&nb.known, &mut no.known), tokenrace_status::Unsupported);
    assert!(
        last_error().contains("out: sets fields beyond the 56 bytes of tokenrace_verify_output"),
        "{}",
        last_error()
    );
    assert!(f.untouched());
    no.extra = 0;
    assert_eq!(f.verify(&nb.known, &mut no.known), tokenrace_status::Ok, "{}", last_error());
    assert_eq!(f.emitted[1], 1);
}

/// Strides whose byte span overflows the address space are refused naming the stride.
#[test]
fn verify_strides_whose_byte_span_overflows_are_refused() {
    let mut f = VerifyFixture::new();
    for stride in [1u64 << 61, 1 << 62, 1 << 63, u64::MAX, (isize::MAX as u64) / 4] {
        let (mut b, mut o) = f.args();
        b.row_stride = stride;
        assert_eq!(f.verify(&b, &mut o), tokenrace_status::InvalidArgument, "stride {stride}");
        assert!(last_error().contains("batch.row_stride"), "{stride}: {}", last_error());
        assert!(f.untouched());
    }
    for stride in [1u64 << 61, 1 << 62, u64::MAX] {
        let (mut b, mut o) = f.args();
        b.draft_probs = f.q.as_ptr();
        b.draft_probs_row_stride = stride;
        // One draft row only: its span is `vocab` whatever the stride; a second one overflows.
        assert_eq!(f.verify(&b, &mut o), tokenrace_status::Ok, "{}", last_error());
        f.tokens = [-7; 4];
        f.emitted = [-7; 2];
        f.flags = [77; 2];
        f.logprobs = [12345.0; 4];
        let counts = [2, 0];
        let drafts = [5, 6];
        let logits = vec![0.0f32; 4000];
        let (mut b, mut o) = f.args();
        b.logits = logits.as_ptr() as *const _;
        b.rows = 4;
        b.draft_counts = counts.as_ptr();
        b.draft_tokens = drafts.as_ptr();
        b.draft_probs = f.q.as_ptr();
        b.draft_probs_row_stride = stride;
        assert_eq!(f.verify(&b, &mut o), tokenrace_status::InvalidArgument, "q stride {stride}");
        assert!(last_error().contains("batch.draft_probs_row_stride"), "{stride}: {}", last_error());
        assert!(f.untouched());
    }
    for stride in [1u64 << 61, 1 << 62] {
        let (mut b, mut o) = f.args();
        b.noise = f.noise.as_ptr();
        b.noise_row_stride = stride;
        assert_eq!(f.verify(&b, &mut o), tokenrace_status::InvalidArgument, "noise stride {stride}");
        assert!(last_error().contains("batch.noise_row_stride"), "{}", last_error());
        assert!(f.untouched());
    }
    let (b, mut o) = f.args();
    o.tokens_stride = u64::MAX;
    assert_eq!(f.verify(&b, &mut o), tokenrace_status::InvalidArgument);
    assert!(last_error().contains("out.tokens_stride: requests x tokens_stride overflows"), "{}", last_error());
    assert!(f.untouched());
}

/// A `tokens_stride` whose element count fits a `usize` but whose byte span does not (2^62 with
/// one request) is refused naming `out.tokens_stride`, like the other strides (it once made a
/// slice of more than `isize::MAX` bytes).
#[test]
fn verify_tokens_stride_whose_byte_span_overflows_is_refused() {
    let mut f = VerifyFixture::new();
    for stride in [1u64 << 62, 1 << 61, (isize::MAX as u64) / 2] {
        let (mut b, mut o) = f.args();
        b.requests = 1;
        b.rows = 2;
        o.tokens_stride = stride;
        assert_eq!(f.verify(&b, &mut o), tokenrace_status::InvalidArgument, "stride {stride}");
        assert!(last_error().contains("out.tokens_stride"), "{}", last_error());
        assert!(f.untouched());
    }
}

#[test]
fn verify_enum_fields_out_of_range_name_the_field() {
    let mut f = VerifyFixture::new();
    let (mut b, mut o) = f.args();
    b.dtype = 3;
    assert_eq!(f.verify(&b, &mut o), tokenrace_status::InvalidArgument);
    assert_eq!(last_error(), "tokenrace_verify: batch.dtype: 3 is not a tokenrace_dtype (0..=2)");
    let (mut b, mut o) = f.args();
    b.noise = f.noise.as_ptr();
    b.noise_kind = 2;
    assert_eq!(f.verify(&b, &mut o), tokenrace_status::InvalidArgument);
    assert!(last_error().contains("batch.noise_kind: 2 is not a tokenrace_noise_kind"), "{}", last_error());
    let (b, mut o) = f.args();
    o.logprob_mode = 2;
    assert_eq!(f.verify(&b, &mut o), tokenrace_status::InvalidArgument);
    assert!(last_error().contains("out.logprob_mode: 2 is not a tokenrace_logprob_mode"), "{}", last_error());
    assert!(f.untouched());
}

/// Zero requests need no pointers; the sizes are still checked.
#[test]
fn verify_with_zero_requests_needs_no_pointers() {
    let mut f = VerifyFixture::new();
    let (mut b, mut o) = f.args();
    b.requests = 0;
    b.rows = 0;
    (b.logits, b.draft_counts, b.draft_tokens) = (std::ptr::null(), std::ptr::null(), std::ptr::null());
    (o.tokens, o.counts, o.flags, o.logprobs) =
        (std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut());
    assert_eq!(f.verify(&b, &mut o), tokenrace_status::Ok, "{}", last_error());
    b.vocab = 0;
    assert_eq!(f.verify(&b, &mut o), tokenrace_status::InvalidArgument);
    assert!(last_error().contains("batch.vocab: must be at least 1"), "{}", last_error());
    b.vocab = 1000;
    b.rows = 1;
    assert_eq!(f.verify(&b, &mut o), tokenrace_status::InvalidArgument);
    assert!(last_error().contains("batch.logits: is NULL"), "{}", last_error());
}

/// The penalty window is the first field after the 0.2 batch of 248 bytes: a caller
/// whose `struct_size` ends before it gets no window (its pointer is not read), one that
/// reaches it gets the window, and a negative value is refused naming its row, nothing written.
#[test]
fn the_penalty_window_is_read_only_by_callers_whose_struct_reaches_it() {
    use std::mem::{offset_of, size_of};
    let (window_at, whole) = (offset_of!(tokenrace_batch, penalty_last_n), size_of::<tokenrace_batch>());
    assert_eq!(window_at, 248);
    let mut f = Fixture::new();
    // Token 0 leads; in the output it falls below token 1 (repetition 4), unless the window of
    // one token leaves it out.
    for (i, v) in f.logits.iter_mut().enumerate() {
        *v = match i % 1000 {
            0 => 5.0,
            1 => 4.0,
            _ => 0.0,
        };
    }
    let (output_ids, output_offsets) = ([0i32, 2, 0, 2], [0u64, 2, 4]);
    let (temperature, repetition) = ([0.0f32; 2], [4.0f32; 2]);
    let mut greedy = |size: usize, last_n: [i32; 2]| {
        let (mut b, mut o) = f.args();
        b.struct_size = size as u32;
        b.temperature = temperature.as_ptr();
        b.output_ids = output_ids.as_ptr();
        b.output_offsets = output_offsets.as_ptr();
        b.repetition_penalty = repetition.as_ptr();
        b.penalty_last_n = last_n.as_ptr();
        f.tokens = [-1; 2];
        let status = f.draw(&b, &mut o);
        (status, f.tokens)
    };
    assert_eq!(greedy(whole, [1, 0]), (tokenrace_status::Ok, [0, 1]), "{}", last_error());
    assert_eq!(greedy(window_at, [1, 0]), (tokenrace_status::Ok, [1, 1]), "a 0.2 caller: no window");
    assert_eq!(greedy(whole, [0, -1]), (tokenrace_status::InvalidArgument, [-1, -1]));
    assert!(last_error().contains("batch.penalty_last_n[1]: -1 is negative"), "{}", last_error());
}

/// min_tokens' fields follow the penalty window: a caller whose `struct_size` ends before them
/// bans no stop token; one that reaches them does, and a stop id out of range is refused naming
/// its row and position, nothing written.
#[test]
fn min_tokens_is_read_only_by_callers_whose_struct_reaches_it() {
    use std::mem::{offset_of, size_of};
    let (min_at, whole) = (offset_of!(tokenrace_batch, min_tokens), size_of::<tokenrace_batch>());
    assert_eq!(min_at, offset_of!(tokenrace_batch, penalty_last_n) + 8);
    assert_eq!(offset_of!(tokenrace_batch, stop_ids), min_at + 8);
    assert_eq!(offset_of!(tokenrace_batch, stop_offsets), min_at + 16);
    let mut f = Fixture::new();
    for (i, v) in f.logits.iter_mut().enumerate() {
        *v = match i % 1000 {
            0 => 5.0,
            1 => 4.0,
            _ => 0.0,
        };
    }
    let temperature = [0.0f32; 2];
    let (min_tokens, stop_offsets) = ([1i32, 0], [0u64, 1, 2]);
    let mut greedy = |size: usize, stop_ids: [i32; 2]| {
        let (mut b, mut o) = f.args();
        b.struct_size = size as u32;
        b.temperature = temperature.as_ptr();
        b.min_tokens = min_tokens.as_ptr();
        b.stop_ids = stop_ids.as_ptr();
        b.stop_offsets = stop_offsets.as_ptr();
        f.tokens = [-1; 2];
        let status = f.draw(&b, &mut o);
        (status, f.tokens)
    };
    // Row 0 (no output yet, min 1) may not stop; row 1 (min 0) may.
    assert_eq!(greedy(whole, [0, 0]), (tokenrace_status::Ok, [1, 0]), "{}", last_error());
    assert_eq!(greedy(min_at, [0, 0]), (tokenrace_status::Ok, [0, 0]), "a caller before min_tokens");
    assert_eq!(greedy(whole, [0, 1000]), (tokenrace_status::InvalidArgument, [-1, -1]));
    assert!(
        last_error().contains("batch.stop_ids[1]: position 0 (entry 1): 1000 is not a token id"),
        "{}",
        last_error()
    );
}

/// The request state's fields follow top-nσ: a caller whose `struct_size` ends before them
/// reads no state (its rows have no histories); one that reaches them takes each row's
/// histories from the state, as if passed as lists; one field without the other, or an unknown
/// id, is refused naming it, nothing written.
#[test]
fn the_request_state_is_read_only_by_callers_whose_struct_reaches_it() {
    use std::mem::{offset_of, size_of};
    let requests_at = offset_of!(tokenrace_batch, requests);
    assert_eq!(requests_at, offset_of!(tokenrace_batch, top_n_sigma) + 8);
    assert_eq!(offset_of!(tokenrace_batch, request_ids), requests_at + 8);
    assert_eq!(offset_of!(tokenrace_batch, min_keep), requests_at + 16);
    let mut f = Fixture::new();
    for (i, v) in f.logits.iter_mut().enumerate() {
        *v = match i % 1000 {
            0 => 5.0,
            1 => 4.0,
            _ => 0.0,
        };
    }
    let mut state = std::ptr::null_mut();
    // SAFETY: a writable out pointer; then a live handle and arrays of the lengths given.
    unsafe {
        assert_eq!(tokenrace_requests_new(&mut state), tokenrace_status::Ok);
        assert_eq!(tokenrace_requests_add(state, 70, [0i32, 3].as_ptr(), 2, std::ptr::null(), 0), tokenrace_status::Ok);
        assert_eq!(tokenrace_requests_add(state, 71, std::ptr::null(), 0, std::ptr::null(), 0), tokenrace_status::Ok);
        assert_eq!(
            tokenrace_requests_add(state, 71, std::ptr::null(), 0, std::ptr::null(), 0),
            tokenrace_status::InvalidArgument
        );
        assert!(
            last_error().contains("tokenrace_requests_add: id: request 71 is already in the state"),
            "{}",
            last_error()
        );
        // Request 71 draws token 0 (below): its output now holds it.
        assert_eq!(
            tokenrace_requests_append(state, 1, [71u64].as_ptr(), [0i32].as_ptr(), std::ptr::null()),
            tokenrace_status::Ok
        );
        let mut len = 0u64;
        assert_eq!(tokenrace_requests_len(state, &mut len), tokenrace_status::Ok);
        assert_eq!(len, 2);
        assert_eq!(tokenrace_requests_output_len(state, 71, &mut len), tokenrace_status::Ok);
        assert_eq!(len, 1);
    }
    let temperature = [0.0f32; 2];
    let repetition = [4.0f32; 2];
    let mut greedy = |size: usize, ids: Option<[u64; 2]>, with_state: bool| {
        let (mut b, mut o) = f.args();
        b.struct_size = size as u32;
        b.temperature = temperature.as_ptr();
        b.repetition_penalty = repetition.as_ptr();
        b.requests = if with_state { state } else { std::ptr::null() };
        let ids_storage = ids.unwrap_or([0; 2]);
        b.request_ids = if ids.is_some() { ids_storage.as_ptr() } else { std::ptr::null() };
        f.tokens = [-1; 2];
        let status = f.draw(&b, &mut o);
        (status, f.tokens)
    };
    let whole = size_of::<tokenrace_batch>();
    // Both requests hold token 0 in a history: the repetition penalty lowers it below token 1.
    assert_eq!(greedy(whole, Some([70, 71]), true), (tokenrace_status::Ok, [1, 1]), "{}", last_error());
    assert_eq!(greedy(requests_at, Some([70, 71]), true), (tokenrace_status::Ok, [0, 0]), "a caller before the state");
    assert_eq!(greedy(whole, Some([70, 72]), true), (tokenrace_status::InvalidArgument, [-1, -1]));
    assert!(last_error().contains("batch.request_ids[1]: request 72 is not in the requests state"), "{}", last_error());
    assert_eq!(greedy(whole, None, true), (tokenrace_status::InvalidArgument, [-1, -1]));
    assert!(last_error().contains("batch.request_ids: is NULL while requests is given"), "{}", last_error());
    assert_eq!(greedy(whole, Some([70, 71]), false), (tokenrace_status::InvalidArgument, [-1, -1]));
    assert!(last_error().contains("batch.requests: is NULL while request_ids is given"), "{}", last_error());
    // SAFETY: a live handle, then freed once.
    unsafe {
        assert_eq!(tokenrace_requests_remove(state, 70), tokenrace_status::Ok);
        assert_eq!(tokenrace_requests_remove(state, 70), tokenrace_status::InvalidArgument);
        assert_eq!(tokenrace_requests_reset(state), tokenrace_status::Ok);
        assert_eq!(
            tokenrace_requests_append(std::ptr::null_mut(), 0, std::ptr::null(), std::ptr::null(), std::ptr::null()),
            tokenrace_status::InvalidArgument
        );
        assert!(last_error().contains("requests: is NULL"), "{}", last_error());
        tokenrace_requests_free(state);
    }
}

/// llama.cpp's filters' fields (min_keep, typical_p, xtc_probability, xtc_threshold,
/// dynatemp_range, dynatemp_exponent) are one block after the request state's fields, from the
/// struct's former end (304) to its new one (their behaviour: tests/llama_samplers.rs).
#[test]
fn the_llama_filters_block_follows_the_request_state_at_the_end() {
    use std::mem::offset_of;
    let at = offset_of!(tokenrace_batch, request_ids);
    assert_eq!(at + 8, 304);
    for (i, field) in [
        offset_of!(tokenrace_batch, min_keep),
        offset_of!(tokenrace_batch, typical_p),
        offset_of!(tokenrace_batch, xtc_probability),
        offset_of!(tokenrace_batch, xtc_threshold),
    ]
    .into_iter()
    .enumerate()
    {
        assert_eq!(field, at + 8 * (i + 1));
    }
    assert_eq!(offset_of!(tokenrace_batch, dynatemp_range), at + 40);
    assert_eq!(offset_of!(tokenrace_batch, dynatemp_exponent), at + 48);
    assert_eq!(offset_of!(tokenrace_batch, bad_words_ids), at + 56);
}

/// The parity fields (bad words, forced tokens, the ids whose logprobs are asked) are one block
/// at the end, after llama.cpp's filters': a caller whose
/// `struct_size` ends before them bans no bad word and forces nothing; one that reaches them
/// does, and a forced token out of range is refused naming its row, nothing written.
#[test]
fn bad_words_and_forced_tokens_are_read_only_by_callers_whose_struct_reaches_them() {
    use std::mem::offset_of;
    let at = offset_of!(tokenrace_batch, bad_words_ids);
    assert_eq!(offset_of!(tokenrace_batch, dynatemp_exponent), 344);
    assert_eq!(at, 352);
    assert_eq!(offset_of!(tokenrace_batch, bad_word_offsets), at + 8);
    assert_eq!(offset_of!(tokenrace_batch, bad_words_row_offsets), at + 16);
    assert_eq!(offset_of!(tokenrace_batch, forced_tokens), at + 24);
    assert_eq!(offset_of!(tokenrace_batch, logprob_token_ids), at + 32);
    assert_eq!(offset_of!(tokenrace_batch, logprob_token_offsets), at + 40);
    // The caller's order of filter stages (tests/stage_order.rs reads it), then llama.cpp's DRY.
    assert_eq!(offset_of!(tokenrace_batch, order), at + 48);
    assert_eq!(offset_of!(tokenrace_batch, order_len), at + 56);
    assert_eq!(offset_of!(tokenrace_batch, dry_multiplier), at + 64);
    let whole = at + 48;
    let mut f = Fixture::new();
    for (i, v) in f.logits.iter_mut().enumerate() {
        *v = match i % 1000 {
            0 => 5.0,
            1 => 4.0,
            _ => 0.0,
        };
    }
    let temperature = [0.0f32; 2];
    // Row 0's output ends with 7: its word [7, 0] bans 0. Row 1's word [8, 0] does not.
    let (output_ids, output_offsets) = ([7i32, 7], [0u64, 1, 2]);
    let (word_ids, word_offsets, row_offsets) = ([7i32, 0, 8, 0], [0u64, 2, 4], [0u64, 1, 2]);
    let mut greedy = |size: usize, forced: Option<[i32; 2]>| {
        let (mut b, mut o) = f.args();
        b.struct_size = size as u32;
        b.temperature = temperature.as_ptr();
        b.output_ids = output_ids.as_ptr();
        b.output_offsets = output_offsets.as_ptr();
        b.bad_words_ids = word_ids.as_ptr();
        b.bad_word_offsets = word_offsets.as_ptr();
        b.bad_words_row_offsets = row_offsets.as_ptr();
        let forced = forced.unwrap_or([-1, -1]);
        b.forced_tokens = forced.as_ptr();
        f.tokens = [-1; 2];
        let status = f.draw(&b, &mut o);
        (status, f.tokens)
    };
    assert_eq!(greedy(whole, None), (tokenrace_status::Ok, [1, 0]), "{}", last_error());
    assert_eq!(greedy(at, None), (tokenrace_status::Ok, [0, 0]), "a caller before the bad words");
    assert_eq!(greedy(whole, Some([-1, 9])), (tokenrace_status::Ok, [1, 9]), "{}", last_error());
    assert_eq!(greedy(whole, Some([1000, -1])), (tokenrace_status::InvalidArgument, [-1, -1]));
    assert!(last_error().contains("batch.forced_tokens[0]: 1000 is not a token id"), "{}", last_error());
}

/// The row index follows DRY's block (offset 472): a caller whose struct ends before it
/// reads logits row r for row r; one that reaches it reads `row_index[r]`, the logits then
/// spanning `max(row_index) + 1` rows; a negative entry or a span past the logits is refused,
/// nothing written.
#[test]
fn a_row_index_is_read_only_by_callers_whose_struct_reaches_it() {
    use std::mem::{offset_of, size_of};
    let at = offset_of!(tokenrace_batch, row_index);
    assert_eq!(at, 472);
    assert_eq!(offset_of!(tokenrace_batch, mirostat), at + 8);
    let mut f = Fixture::new();
    f.logits[1000 + 3] = 50.0; // row 1's argmax: 3; row 0's: 6 (logits i % 7)
    let temperature = [0.0f32; 2];
    let mut greedy = |size: usize, index: &[i32; 2], rows_of_logits: usize| {
        let (mut b, mut o) = f.args();
        b.struct_size = size as u32;
        b.temperature = temperature.as_ptr();
        b.row_index = index.as_ptr();
        let logits = f.logits[..rows_of_logits * 1000].to_vec();
        b.logits = logits.as_ptr() as *const _;
        f.tokens = [-1; 2];
        (f.draw(&b, &mut o), f.tokens)
    };
    let whole = size_of::<tokenrace_batch>();
    assert_eq!(greedy(whole, &[1, 1], 2), (tokenrace_status::Ok, [3, 3]), "{}", last_error());
    assert_eq!(greedy(whole, &[1, 0], 2), (tokenrace_status::Ok, [3, 6]), "{}", last_error());
    assert_eq!(greedy(whole, &[0, 0], 1), (tokenrace_status::Ok, [6, 6]), "one logits row read twice");
    assert_eq!(greedy(at, &[1, 1], 2), (tokenrace_status::Ok, [6, 3]), "a caller before the row index");
    assert_eq!(greedy(whole, &[0, -1], 2), (tokenrace_status::InvalidArgument, [-1, -1]));
    assert!(last_error().contains("batch.row_index[1]: -1 is not a logits row"), "{}", last_error());
}

/// The logprobs of given ids: the batch's ids follow the forced tokens, the output's arrays follow
/// its full-vocabulary fields. A caller whose output ends before them is refused when its batch
/// names ids (nothing would receive them); one that reaches them gets each id's logprob.
#[test]
fn logprobs_of_given_ids_are_written_only_where_the_output_reaches_them() {
    use std::mem::{offset_of, size_of};
    let at = offset_of!(tokenrace_output, token_logprobs);
    assert_eq!(at, offset_of!(tokenrace_output, reserved1) + 4);
    assert_eq!(offset_of!(tokenrace_output, token_ranks), at + 8);
    assert_eq!(offset_of!(tokenrace_output, kept_threshold), at + 16);
    let mut f = Fixture::new();
    let temperature = [0.0f32; 2];
    let offsets = [0u64, 2, 3];
    let (mut lps, mut ranks) = ([7f32; 3], [7i32; 3]);
    let mut draw = |size: usize, ids: &[i32; 3], lps: &mut [f32; 3], ranks: &mut [i32; 3]| {
        let (mut b, mut o) = f.args();
        o.struct_size = size as u32;
        b.temperature = temperature.as_ptr();
        b.logprob_token_ids = ids.as_ptr();
        b.logprob_token_offsets = offsets.as_ptr();
        o.token_logprobs = lps.as_mut_ptr();
        o.token_ranks = ranks.as_mut_ptr();
        f.tokens = [-1; 2];
        (f.draw(&b, &mut o), f.tokens)
    };
    let whole = size_of::<tokenrace_output>();
    assert_eq!(draw(whole, &[3, 6, 1000], &mut lps, &mut ranks).0, tokenrace_status::InvalidArgument);
    assert!(last_error().contains("batch.logprob_token_ids[1]: position 0 (entry 2): 1000 is not a token id"));
    assert_eq!((lps, ranks), ([7.0; 3], [7; 3]), "a failed call wrote");
    assert_eq!(draw(at, &[3, 6, 999], &mut lps, &mut ranks).0, tokenrace_status::InvalidArgument);
    assert!(last_error().contains("batch.logprob_token_ids: given without the output's token_logprobs"));
    assert_eq!(draw(whole, &[3, 6, 999], &mut lps, &mut ranks), (tokenrace_status::Ok, [6, 0]), "{}", last_error());
    // Logits i % 7 over both rows: row 0's token 6 (and every 7th) holds the maximum 6, 142
    // tokens of it; token 3 is below; row 1's token 999 holds 4.
    assert!(lps[0] < lps[1] && lps[2] < lps[1] && ranks[1] == 142 && ranks[0] > 142, "{lps:?} {ranks:?}");
}

/// llama.cpp's DRY is one block at the end, after the parity fields: a caller whose
/// `struct_size` ends before it penalises nothing; one that reaches it does, and a bad breaker is
/// refused naming its row, breaker and position, nothing written.
#[test]
fn dry_is_read_only_by_callers_whose_struct_reaches_it() {
    use std::mem::{offset_of, size_of};
    let at = offset_of!(tokenrace_batch, dry_multiplier);
    assert_eq!(at, 416);
    for (i, field) in [
        offset_of!(tokenrace_batch, dry_base),
        offset_of!(tokenrace_batch, dry_allowed_length),
        offset_of!(tokenrace_batch, dry_penalty_last_n),
        offset_of!(tokenrace_batch, dry_breaker_ids),
        offset_of!(tokenrace_batch, dry_breaker_offsets),
        offset_of!(tokenrace_batch, dry_breakers_row_offsets),
    ]
    .into_iter()
    .enumerate()
    {
        assert_eq!(field, at + 8 * (i + 1));
    }
    assert_eq!(offset_of!(tokenrace_batch, row_index), at + 56);
    let mut f = Fixture::new();
    for (i, v) in f.logits.iter_mut().enumerate() {
        // Tokens 1 and 2 of each row lead: 1 by a little.
        *v = match i % 1000 {
            1 => 5.0,
            2 => 4.5,
            _ => 0.0,
        };
    }
    let temperature = [0.0f32; 2];
    // Both rows' histories are "3 1 3 1 3": a 1 next would extend the repeat of "3 1 3" (3
    // tokens, one past the default allowed length 2), so it loses 1.0 * 1.75^1 and 2 leads. Row
    // 1's breaker 3 ends the history: no repeat spans it, nothing is penalised.
    let (output_ids, output_offsets) = ([3i32, 1, 3, 1, 3, 3, 1, 3, 1, 3], [0u64, 5, 10]);
    let multiplier = [1.0f32; 2];
    let mut greedy = |size: usize, breaker_ids: [i32; 1]| {
        let (breaker_offsets, row_offsets) = ([0u64, 1], [0u64, 0, 1]);
        let (mut b, mut o) = f.args();
        b.struct_size = size as u32;
        b.temperature = temperature.as_ptr();
        b.output_ids = output_ids.as_ptr();
        b.output_offsets = output_offsets.as_ptr();
        b.dry_multiplier = multiplier.as_ptr();
        b.dry_breaker_ids = breaker_ids.as_ptr();
        b.dry_breaker_offsets = breaker_offsets.as_ptr();
        b.dry_breakers_row_offsets = row_offsets.as_ptr();
        f.tokens = [-1; 2];
        (f.draw(&b, &mut o), f.tokens)
    };
    let whole = size_of::<tokenrace_batch>();
    assert_eq!(greedy(whole, [3]), (tokenrace_status::Ok, [2, 1]), "{}", last_error());
    assert_eq!(greedy(at, [3]), (tokenrace_status::Ok, [1, 1]), "a caller before DRY");
    assert_eq!(greedy(whole, [1000]), (tokenrace_status::InvalidArgument, [-1, -1]));
    assert!(
        last_error().contains("batch.dry_breaker_ids[1]: word 0 position 0 (entry 0): 1000 is not a token id"),
        "{}",
        last_error()
    );
}

/// The kept-set outputs follow the logprobs of given ids: 104..136 of a 136-byte output. A caller
/// whose output ends before them gets none written; one that reaches them gets every row's set.
#[test]
fn kept_set_outputs_are_written_only_where_the_output_reaches_them() {
    use std::mem::{offset_of, size_of};
    let at = offset_of!(tokenrace_output, kept_threshold);
    assert_eq!(at, offset_of!(tokenrace_output, token_ranks) + 8);
    assert_eq!(at, 104);
    assert_eq!(offset_of!(tokenrace_output, kept_count), at + 8);
    assert_eq!(offset_of!(tokenrace_output, kept_mass), at + 16);
    assert_eq!(offset_of!(tokenrace_output, kept_bitmask), at + 24);
    assert_eq!(offset_of!(tokenrace_output, mirostat_mu), at + 32);
    let mut f = Fixture::new();
    let temperature = [0.0f32, 1.0];
    let top_k = [0i32, 3];
    let words = 1000usize.div_ceil(32);
    let mut draw = |size: usize| {
        let (mut b, mut o) = f.args();
        o.struct_size = size as u32;
        b.temperature = temperature.as_ptr();
        b.top_k = top_k.as_ptr();
        let (mut t, mut c, mut m, mut bits) = ([7f32; 2], [7i32; 2], [7f64; 2], vec![7i32; 2 * words]);
        o.kept_threshold = t.as_mut_ptr();
        o.kept_count = c.as_mut_ptr();
        o.kept_mass = m.as_mut_ptr();
        o.kept_bitmask = bits.as_mut_ptr();
        assert_eq!(f.draw(&b, &mut o), tokenrace_status::Ok, "{}", last_error());
        (t, c, m, bits)
    };
    let (t, c, m, bits) = draw(at);
    assert_eq!((t, c, m), ([7.0; 2], [7; 2], [7.0; 2]));
    assert!(bits.iter().all(|&w| w == 7), "an output that ends before the kept set was written");
    let (t, c, m, bits) = draw(size_of::<tokenrace_output>());
    // Logits i % 7: the greedy row keeps all 1000 tokens; the top-k 3 row its sixes (row
    // 1 starts at 1000 % 7 = 6: its tokens 7 j, 143 of them, are 6s).
    assert_eq!((t, c), ([0.0, 6.0], [1000, 143]));
    assert_eq!(m[0], 1.0);
    assert!(m[1] > 0.0 && m[1] < 1.0, "{m:?}");
    let set = |r: usize, i: usize| (bits[r * words + i / 32] as u32 >> (i % 32)) & 1 == 1;
    assert!((0..1000).all(|i| set(0, i)) && (1000..words * 32).all(|i| !set(0, i)));
    assert!((0..1000).all(|i| set(1, i) == ((1000 + i) % 7 == 6)));
}

/// Mirostat is one block of the batch (480..520, before the request state's append flag), its mu out
/// the output's last field (136..144 of 144 bytes): a caller whose batch ends before it draws
/// without mirostat; one whose output ends before the mu out draws with it and gets no mu; a bad
/// mode is refused naming its row, nothing written.
#[test]
fn mirostat_is_read_only_by_callers_whose_struct_reaches_it() {
    use std::mem::{offset_of, size_of};
    let at = offset_of!(tokenrace_batch, mirostat);
    assert_eq!(at, 480);
    for (i, field) in [
        offset_of!(tokenrace_batch, mirostat_tau),
        offset_of!(tokenrace_batch, mirostat_eta),
        offset_of!(tokenrace_batch, mirostat_m),
        offset_of!(tokenrace_batch, mirostat_mu),
    ]
    .into_iter()
    .enumerate()
    {
        assert_eq!(field, at + 8 * (i + 1));
    }
    assert_eq!(offset_of!(tokenrace_batch, append_to_requests), 520);
    assert_eq!(size_of::<tokenrace_batch>(), 528);
    let out_at = offset_of!(tokenrace_output, mirostat_mu);
    assert_eq!(out_at, 136);
    assert_eq!(size_of::<tokenrace_output>(), 144);
    let mut f = Fixture::new();
    // One token of each row leads by 1 among 999 zeros: about 0.3% of the mass at T = 1, the
    // only token v2 keeps at mu = 0 (no surprise is <= 0 but the most probable stays).
    for (i, v) in f.logits.iter_mut().enumerate() {
        *v = if i == 5 || i == 1003 { 1.0 } else { 0.0 };
    }
    let seeds = [1u64, 2];
    let mut draw = |size: usize, out_size: usize, mode: [i32; 2], mu_out: &mut [f32; 2]| {
        let (mu_in, tau, eta) = ([0.0f32; 2], [4.0f32; 2], [0.25f32; 2]);
        let (mut b, mut o) = f.args();
        b.struct_size = size as u32;
        o.struct_size = out_size as u32;
        b.seeds = seeds.as_ptr();
        b.mirostat = mode.as_ptr();
        b.mirostat_tau = tau.as_ptr();
        b.mirostat_eta = eta.as_ptr();
        b.mirostat_mu = mu_in.as_ptr();
        o.mirostat_mu = mu_out.as_mut_ptr();
        f.tokens = [-1; 2];
        (f.draw(&b, &mut o), f.tokens)
    };
    let (whole, out_whole) = (size_of::<tokenrace_batch>(), size_of::<tokenrace_output>());
    let mut mu = [7f32; 2];
    assert_eq!(draw(whole, out_whole, [2, 2], &mut mu), (tokenrace_status::Ok, [5, 3]), "{}", last_error());
    // Surprise 0 (the kept token holds all the mass): mu = 0 - 0.25 * (0 - 4).
    assert_eq!(mu, [1.0, 1.0]);
    let mut mu = [7f32; 2];
    assert_eq!(draw(whole, out_at, [2, 2], &mut mu), (tokenrace_status::Ok, [5, 3]), "{}", last_error());
    assert_eq!(mu, [7.0, 7.0], "an output before the mu out got one");
    let (status, tokens) = draw(at, out_whole, [2, 2], &mut mu);
    assert_eq!(status, tokenrace_status::Ok, "{}", last_error());
    assert_ne!(tokens, [5, 3], "a caller before mirostat drew with it");
    assert_eq!(mu.map(f32::is_nan), [true, true], "rows without mirostat get NaN");
    let mut mu = [7f32; 2];
    assert_eq!(draw(whole, out_whole, [2, 5], &mut mu), (tokenrace_status::InvalidArgument, [-1, -1]));
    assert!(last_error().contains("batch.mirostat[1]: 5 is not 0 (off), 1 (v1) or 2 (v2)"), "{}", last_error());
    assert_eq!(mu, [7.0, 7.0], "a failed call wrote");
}

/// A request's parameters through C (`tokenrace_request_params`, from
/// `tokenrace_request_params_default`): a draw that names the request takes the ones its batch
/// leaves NULL; a bad value is refused naming the field, nothing changed; NULL turns them off.
/// `append_to_requests` (520..524 of 528) appends each row's token to its request once the
/// draw succeeds, and a failed draw (or a caller whose struct ends before it) appends nothing.
#[test]
fn request_parameters_and_the_append_flag_through_c() {
    use std::mem::{offset_of, size_of};
    assert_eq!(size_of::<tokenrace_request_params>(), 136);
    assert_eq!(offset_of!(tokenrace_request_params, seed), 8);
    assert_eq!(offset_of!(tokenrace_request_params, stop_ids), 64);
    assert_eq!(offset_of!(tokenrace_request_params, banned_len), 128);
    let mut f = Fixture::new();
    for (i, v) in f.logits.iter_mut().enumerate() {
        *v = match i % 1000 {
            0 => 5.0,
            1 => 4.0,
            _ => 0.0,
        };
    }
    let mut state = std::ptr::null_mut();
    let banned = [0i32];
    // SAFETY: a writable out pointer; then a live handle and structs and arrays of the lengths
    // given.
    unsafe {
        assert_eq!(tokenrace_requests_new(&mut state), tokenrace_status::Ok);
        for id in [5u64, 6] {
            assert_eq!(
                tokenrace_requests_add(state, id, std::ptr::null(), 0, std::ptr::null(), 0),
                tokenrace_status::Ok
            );
        }
        let mut p = tokenrace_request_params_default();
        assert_eq!((p.struct_size, p.temperature, p.top_p, p.has_seed), (136, 1.0, 1.0, 0));
        // Request 5: greedy, token 0 banned, so it draws token 1.
        p.temperature = 0.0;
        p.banned_ids = banned.as_ptr();
        p.banned_len = 1;
        assert_eq!(tokenrace_requests_set_params(state, 5, &p), tokenrace_status::Ok);
        // Request 6: greedy alone; then a bad top-p is refused, its parameters kept.
        let greedy = tokenrace_request_params { temperature: 0.0, ..tokenrace_request_params_default() };
        assert_eq!(tokenrace_requests_set_params(state, 6, &greedy), tokenrace_status::Ok);
        let bad = tokenrace_request_params { top_p: 1.5, ..greedy };
        assert_eq!(tokenrace_requests_set_params(state, 6, &bad), tokenrace_status::InvalidArgument);
        assert!(
            last_error().contains("tokenrace_requests_set_params: params.top_p: 1.5 is not in (0, 1]"),
            "{}",
            last_error()
        );
        assert_eq!(tokenrace_requests_set_params(state, 7, &greedy), tokenrace_status::InvalidArgument);
        assert!(last_error().contains("request 7 is not in the state"), "{}", last_error());
    }
    let ids = [5u64, 6];
    let mut draw = |size: usize, append: u32, ids: [u64; 2]| {
        let (mut b, mut o) = f.args();
        b.struct_size = size as u32;
        b.requests = state;
        b.request_ids = ids.as_ptr();
        b.append_to_requests = append;
        f.tokens = [-1; 2];
        let status = f.draw(&b, &mut o);
        (status, f.tokens)
    };
    let output_len = |id: u64| {
        let mut len = 0u64;
        // SAFETY: a live handle and a writable length.
        assert_eq!(unsafe { tokenrace_requests_output_len(state, id, &mut len) }, tokenrace_status::Ok);
        len
    };
    let whole = size_of::<tokenrace_batch>();
    assert_eq!(draw(whole, 0, ids), (tokenrace_status::Ok, [1, 0]), "{}", last_error());
    assert_eq!((output_len(5), output_len(6)), (0, 0), "a draw without the flag appended");
    assert_eq!(draw(whole, 1, ids), (tokenrace_status::Ok, [1, 0]), "{}", last_error());
    assert_eq!((output_len(5), output_len(6)), (1, 1));
    assert_eq!(draw(whole, 1, [5, 5]), (tokenrace_status::Ok, [1, 1]), "{}", last_error());
    assert_eq!((output_len(5), output_len(6)), (3, 1), "a request named twice gets both tokens");
    assert_eq!(draw(whole, 1, [5, 9]), (tokenrace_status::InvalidArgument, [-1, -1]));
    assert_eq!((output_len(5), output_len(6)), (3, 1), "a failed draw appended");
    assert_eq!(draw(whole - 8, 1, ids), (tokenrace_status::Ok, [1, 0]), "{}", last_error());
    assert_eq!((output_len(5), output_len(6)), (3, 1), "a caller before the flag appended");
    // SAFETY: a live handle, then freed once.
    unsafe {
        assert_eq!(tokenrace_requests_set_params(state, 5, std::ptr::null()), tokenrace_status::Ok);
        tokenrace_requests_free(state);
    }
}

/// A request state shared by threads: each drawing with `append_to_requests` (its own two
/// requests and one every thread names), one drawing without it and one adding and removing
/// requests of its own. Every successful appending draw appends exactly its rows' tokens: no
/// token is lost or doubled, whatever the interleaving.
#[test]
fn appending_draws_on_threads_lose_no_token() {
    struct Shared(*mut tokenrace_requests);
    // SAFETY: the handle is locked inside; the threads end before it is freed.
    unsafe impl Send for Shared {}
    unsafe impl Sync for Shared {}
    let mut state = std::ptr::null_mut();
    // SAFETY: a writable out pointer, then a live handle.
    unsafe {
        assert_eq!(tokenrace_requests_new(&mut state), tokenrace_status::Ok);
        for id in 0..9u64 {
            assert_eq!(
                tokenrace_requests_add(state, id, [1i32, 2].as_ptr(), 2, std::ptr::null(), 0),
                tokenrace_status::Ok
            );
        }
    }
    let shared = Shared(state);
    let (steps, drawers) = (60usize, 4u64);
    std::thread::scope(|s| {
        for t in 0..drawers {
            let shared = &shared;
            s.spawn(move || {
                let mut f = Fixture::new();
                let ids = [2 * t, 8];
                for _ in 0..steps {
                    let (mut b, mut o) = f.args();
                    b.requests = shared.0;
                    b.request_ids = ids.as_ptr();
                    b.append_to_requests = 1;
                    assert_eq!(f.draw(&b, &mut o), tokenrace_status::Ok, "{}", last_error());
                }
            });
        }
        let shared = &shared;
        s.spawn(move || {
            let mut f = Fixture::new();
            for step in 0..steps {
                let (mut b, mut o) = f.args();
                b.requests = shared.0;
                let ids = [8u64, (step % 8) as u64];
                b.request_ids = ids.as_ptr();
                assert_eq!(f.draw(&b, &mut o), tokenrace_status::Ok, "{}", last_error());
            }
        });
        s.spawn(move || {
            for step in 0..steps as u64 {
                // SAFETY: a live handle and arrays of the lengths given.
                unsafe {
                    assert_eq!(
                        tokenrace_requests_add(shared.0, 100 + step, [3i32].as_ptr(), 1, std::ptr::null(), 0),
                        tokenrace_status::Ok
                    );
                    assert_eq!(tokenrace_requests_remove(shared.0, 100 + step), tokenrace_status::Ok);
                }
            }
        });
    });
    let output_len = |id: u64| {
        let mut len = 0u64;
        // SAFETY: a live handle and a writable length.
        assert_eq!(unsafe { tokenrace_requests_output_len(state, id, &mut len) }, tokenrace_status::Ok);
        len
    };
    for t in 0..drawers {
        assert_eq!(output_len(2 * t), steps as u64, "request {}", 2 * t);
        assert_eq!(output_len(2 * t + 1), 0, "request {}", 2 * t + 1);
    }
    assert_eq!(output_len(8), drawers * steps as u64);
    // SAFETY: a live handle, freed once.
    unsafe { tokenrace_requests_free(state) };
}
