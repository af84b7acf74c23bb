//! The C structs through the C entry points: sizes that tear a field, strides whose byte span
//! overflows, and enum fields out of range are refused with a message naming them, and nothing
//! is written.

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
    assert!(last_error().contains("simd: 9 is not a tokenrace_simd (0..=4)"), "{}", last_error());
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
