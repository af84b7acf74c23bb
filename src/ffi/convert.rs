//! Conversions at the C boundary: versioned structs, caller pointers into slices, C enums, and
//! the configurations. The C functions (`api.rs`, `pool_api.rs`, ...) depend on this module,
//! never the reverse.
//!
//! - **Versioned structs.** Every struct a caller passes starts with `struct_size`. A size must
//!   be at least the struct's first version ([`Versioned::V1_SIZE`], pinned: it never changes
//!   when a field is added) and must not end inside a field (a torn field would be read or
//!   written in part); fields beyond it keep their defaults on read and are not written; bytes a
//!   newer caller sets beyond what this library knows must be zero.
//! - **Slices.** A pointer and a length become a slice only when the pointer is aligned and not
//!   NULL (NULL is accepted for zero elements).
//! - **Enums.** Enum-valued fields are `uint32_t` in C, decoded through [`CEnum`] so that a bad
//!   value is an error naming the field, and mapped to the library's Rust enums by `From`.
//! - **Configurations.** `tokenrace_config` <-> [`Config`] and `tokenrace_pool_config` <->
//!   [`PoolConfig`]; the C defaults are the Rust defaults converted.

use super::greedy::tokenrace_greedy_batch;
use super::requests::tokenrace_request_params;
use super::shard::tokenrace_shard_rows;
use super::types::*;
use crate::batch::{FullMode, LogprobMode};
use crate::config::{Config, DrainPolicy, FilterOrder, LogLevel, NoiseKind, NoiseSource, PoolConfig, SimdChoice};
use crate::error::{Error, ErrorKind, Owner, Result};
use crate::requests::RequestParams;
use std::mem::size_of;

/// One field of a C struct: its byte range and its name.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Field {
    pub offset: usize,
    pub size: usize,
    pub name: &'static str,
}

/// The size of the value a field projection points to (never called: only its type is used).
pub(crate) fn size_of_pointee<T, F>(_: fn(*const T) -> *const F) -> usize {
    size_of::<F>()
}

/// A [`Field`] of struct `$t`.
macro_rules! field {
    ($t:ty, $f:ident) => {
        $crate::ffi::convert::Field {
            offset: std::mem::offset_of!($t, $f),
            // SAFETY: the projection only computes an address; it is never called.
            size: $crate::ffi::convert::size_of_pointee(|p: *const $t| unsafe { std::ptr::addr_of!((*p).$f) }),
            name: stringify!($f),
        }
    };
}
#[allow(unused_imports)] // used by the tests of this module
pub(crate) use field;

/// A struct a caller passes or receives with its `struct_size`.
pub(crate) trait Versioned: Copy {
    /// The C name, for messages.
    const NAME: &'static str;
    /// The size of the first version of the struct: the smallest `struct_size` accepted. Pinned
    /// to the end of the first version's last field, so that a caller built against the first
    /// header keeps working when fields are added.
    const V1_SIZE: usize;
    /// Every field, in order.
    fn fields() -> Vec<Field>;
    /// The value of a field a caller's struct lacks.
    fn default_value() -> Self;
}

/// Implements [`Versioned`] for `$t`, whose first version ends with field `$v1`.
macro_rules! versioned {
    ($t:ident, v1 ends with $v1:ident, default $default:expr, [$($f:ident),+ $(,)?]) => {
        impl Versioned for $t {
            const NAME: &'static str = stringify!($t);
            const V1_SIZE: usize = {
                let fields = [$((stringify!($f), std::mem::offset_of!($t, $f))),+];
                let mut i = 0;
                // The end of `$v1` is the start of the field after it (all fields are packed
                // without padding, which the layout test checks), or the end of the struct.
                let mut end = size_of::<$t>();
                let mut found = false;
                while i < fields.len() {
                    if found {
                        end = fields[i].1;
                        break;
                    }
                    found = const_str_eq(fields[i].0, stringify!($v1));
                    i += 1;
                }
                assert!(found, "the V1 field is a field of the struct");
                end
            };
            fn fields() -> Vec<Field> {
                vec![$(field!($t, $f)),+]
            }
            fn default_value() -> Self {
                $default
            }
        }
    };
}

const fn const_str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

fn zeroed<T>() -> T {
    // SAFETY: only used for the C structs below, whose fields are integers, floats and raw
    // pointers: all-zero is a valid value of each.
    unsafe { std::mem::zeroed() }
}

versioned!(tokenrace_config, v1 ends with pool_rows, default config_to_c(&Config::default()), [
    struct_size, vocab_size, max_rows, threads, seed, has_seed, simd, greedy_below, log_level, noise, pool_rows,
    filter_order, reserved1,
]);
versioned!(tokenrace_batch, v1 ends with noise_row_stride, default zeroed(), [
    struct_size, dtype, logits, rows, vocab, row_stride, temperature, seeds, offsets, seeded, noise, noise_kind,
    reserved0, noise_row_stride, top_k, top_p, min_p, prompt_ids, prompt_offsets, output_ids, output_offsets,
    repetition_penalty, frequency_penalty, presence_penalty, bias_ids, bias_values, bias_offsets, allowed_ids,
    allowed_offsets, allowed_rows, banned_ids, banned_offsets, token_bitmask, bitmask_row_stride, penalty_last_n,
    min_tokens, stop_ids, stop_offsets, top_n_sigma, requests, request_ids, min_keep, typical_p, xtc_probability,
    xtc_threshold, dynatemp_range, dynatemp_exponent, bad_words_ids, bad_word_offsets, bad_words_row_offsets,
    forced_tokens, logprob_token_ids, logprob_token_offsets, order, order_len,
    dry_multiplier, dry_base, dry_allowed_length,
    dry_penalty_last_n, dry_breaker_ids, dry_breaker_offsets, dry_breakers_row_offsets, row_index,
    mirostat, mirostat_tau, mirostat_eta, mirostat_m, mirostat_mu, append_to_requests, reserved1,
]);
versioned!(tokenrace_greedy_batch, v1 ends with row_stride, default zeroed(), [
    struct_size, dtype, logits, rows, vocab, row_stride,
]);
versioned!(tokenrace_output, v1 ends with topn_logprobs, default zeroed(), [
    struct_size, logprob_mode, tokens, flags, logprobs, ranks, top_n, reserved0, topn_ids, topn_logprobs,
    full_logprobs, full_row_stride, full_mode, reserved1, token_logprobs, token_ranks, kept_threshold, kept_count,
    kept_mass, kept_bitmask, mirostat_mu,
]);
versioned!(tokenrace_verify_batch, v1 ends with noise_row_stride, default zeroed(), [
    struct_size, dtype, logits, rows, vocab, row_stride, requests, reserved0, draft_counts, draft_tokens, draft_probs,
    draft_probs_row_stride, temperature, top_k, top_p, min_p, seeds, offsets, seeded, uniforms, noise, noise_kind,
    reserved1, noise_row_stride, draft_parents, prompt_ids, prompt_offsets, output_ids, output_offsets,
    repetition_penalty, frequency_penalty, presence_penalty, bias_ids, bias_values, bias_offsets, allowed_ids,
    allowed_offsets, allowed_rows, banned_ids, banned_offsets, token_bitmask, bitmask_row_stride, bad_words_ids,
    bad_word_offsets, bad_words_row_offsets, min_tokens, stop_ids, stop_offsets,
]);
versioned!(tokenrace_verify_output, v1 ends with logprobs, default zeroed(), [
    struct_size, logprob_mode, tokens, tokens_stride, counts, flags, logprobs, accepted_nodes,
]);
versioned!(tokenrace_request_params, v1 ends with banned_len, default super::requests::params_to_c(&RequestParams::default()), [
    struct_size, temperature, seed, has_seed, top_k, top_p, min_p, top_n_sigma, min_keep, typical_p,
    repetition_penalty, frequency_penalty, presence_penalty, penalty_last_n, min_tokens, stop_ids, stop_len, bias_ids,
    bias_values, bias_len, allowed_ids, allowed_len, banned_ids, banned_len,
]);
versioned!(tokenrace_pool_config, v1 ends with timeout_ms, default pool_config_to_c(&PoolConfig::default()), [
    struct_size, rows, vocab, kind, threads, has_seed, seed, policy, reserved0, timeout_ms,
]);
versioned!(tokenrace_pool_lease, v1 ends with first_seq, default zeroed(), [
    struct_size, kind, values, rows, vocab, id, first_seq, in_ring, reserved0,
]);
// The counters accept any prefix of whole fields: V1 is the header of the struct alone.
versioned!(tokenrace_sampler_stats, v1 ends with reserved0, default Default::default(), [
    struct_size, reserved0, calls, rejected_calls, greedy_rows, seeded_rows, inline_rows, external_noise_rows,
    pool_rows, nonfinite_rows,
]);
versioned!(tokenrace_pool_stats, v1 ends with reserved0, default Default::default(), [
    struct_size, reserved0, rows_produced, rows_borrowed, borrows_waited, wait_ns, inline_rows, rows_skipped,
]);
versioned!(tokenrace_shard_rows, v1 ends with min_p, default zeroed(), [
    struct_size, reserved0, logits, rows, row_stride, vocab_start, slice_len, vocab_size, temperature, seeds, offsets,
    seeded, min_p, top_k, top_p, prompt_ids, prompt_offsets, output_ids, output_offsets, repetition_penalty,
    frequency_penalty, presence_penalty, bias_ids, bias_values, bias_offsets, allowed_ids, allowed_offsets,
    allowed_rows, banned_ids, banned_offsets, token_bitmask, bitmask_row_stride, penalty_last_n, min_tokens, stop_ids,
    stop_offsets, bad_words_ids, bad_word_offsets, bad_words_row_offsets, dry_multiplier, dry_base,
    dry_allowed_length, dry_penalty_last_n, dry_breaker_ids, dry_breaker_offsets, dry_breakers_row_offsets,
]);

// The configurations: the C structs and the library's `Config`/`PoolConfig`, both ways. The
// default C configurations are these conversions of the Rust defaults, so the C functions that
// hand them out (`api.rs`, `pool_api.rs`) and the versioned reads here share one source.

/// A library configuration as the C struct, with `struct_size` set to the whole struct.
pub(crate) fn config_to_c(c: &Config) -> tokenrace_config {
    tokenrace_config {
        struct_size: size_of::<tokenrace_config>() as u32,
        vocab_size: c.vocab_size as u32,
        max_rows: c.max_rows as u32,
        threads: c.threads as u32,
        seed: c.seed.unwrap_or(0),
        has_seed: c.seed.is_some() as u32,
        simd: tokenrace_simd::from(c.simd) as u32,
        greedy_below: c.greedy_below,
        log_level: tokenrace_log_level::from(c.log_level) as u32,
        noise: tokenrace_noise_source::from(c.noise) as u32,
        pool_rows: c.pool_rows as u32,
        filter_order: tokenrace_filter_order::from(c.filter_order) as u32,
        reserved1: 0,
    }
}

/// The library configuration a caller's C struct describes (INVALID_CONFIG names a bad enum).
pub(crate) fn config_from_c(c: &tokenrace_config) -> Result<Config> {
    Ok(Config {
        vocab_size: c.vocab_size as usize,
        max_rows: c.max_rows as usize,
        threads: c.threads as usize,
        seed: (c.has_seed != 0).then_some(c.seed),
        simd: config_enum::<tokenrace_simd>("simd", c.simd)?.into(),
        greedy_below: c.greedy_below,
        log_level: config_enum::<tokenrace_log_level>("log_level", c.log_level)?.into(),
        noise: config_enum::<tokenrace_noise_source>("noise", c.noise)?.into(),
        pool_rows: c.pool_rows as usize,
        filter_order: config_enum::<tokenrace_filter_order>("filter_order", c.filter_order)?.into(),
    })
}

/// A pool configuration as the C struct, with `struct_size` set to the whole struct.
pub(crate) fn pool_config_to_c(c: &PoolConfig) -> tokenrace_pool_config {
    tokenrace_pool_config {
        struct_size: size_of::<tokenrace_pool_config>() as u32,
        rows: c.rows as u32,
        vocab: c.vocab as u32,
        kind: tokenrace_noise_kind::from(c.kind) as u32,
        threads: c.threads as u32,
        has_seed: c.seed.is_some() as u32,
        seed: c.seed.unwrap_or(0),
        policy: tokenrace_pool_policy::from(c.policy) as u32,
        reserved0: 0,
        timeout_ms: c.timeout_ms,
    }
}

/// The pool configuration a caller's C struct describes (INVALID_CONFIG names a bad enum).
pub(crate) fn pool_config_from_c(c: &tokenrace_pool_config) -> Result<PoolConfig> {
    Ok(PoolConfig {
        rows: c.rows as usize,
        vocab: c.vocab as usize,
        kind: config_enum::<tokenrace_noise_kind>("kind", c.kind)?.into(),
        threads: c.threads as usize,
        seed: (c.has_seed != 0).then_some(c.seed),
        policy: config_enum::<tokenrace_pool_policy>("policy", c.policy)?.into(),
        timeout_ms: c.timeout_ms,
    })
}

/// Checks a caller's `struct_size` against the layout of `T`; `name` is the argument.
fn check_size<T: Versioned>(size: usize, name: &str) -> Result<()> {
    if size < T::V1_SIZE {
        return Err(Error::invalid_argument(format!(
            "{name}.struct_size: {size} is smaller than the first {} ({} bytes); set it to sizeof(*{name})",
            T::NAME,
            T::V1_SIZE
        )));
    }
    // A caller built against this header passes exactly our size, which ends no field inside:
    // the walk over the fields (a list built per call) is for the other sizes.
    if size == size_of::<T>() {
        return Ok(());
    }
    if let Some(f) = T::fields().iter().find(|f| f.offset < size && size < f.offset + f.size) {
        return Err(Error::invalid_argument(format!(
            "{name}.struct_size: {size} ends inside field {} (bytes {}..{}) of {}; set it to sizeof(*{name})",
            f.name,
            f.offset,
            f.offset + f.size,
            T::NAME
        )));
    }
    Ok(())
}

/// Checks the `struct_size` of a caller's struct of type `T` without reading the rest.
///
/// # Safety
/// `ptr` is NULL or points to a struct that starts with its `u32` size.
pub(crate) unsafe fn check_struct_size<T: Versioned>(ptr: *const T, name: &str) -> Result<()> {
    if ptr.is_null() {
        return Err(Error::invalid_argument(format!("{name}: is NULL")));
    }
    // SAFETY: as the caller's.
    check_size::<T>(unsafe { (ptr as *const u32).read_unaligned() } as usize, name)
}

/// Reads a caller's versioned struct (see the module docs); `name` is the argument.
///
/// # Safety
/// `ptr` is NULL or points to at least `ptr->struct_size` readable bytes.
pub(crate) unsafe fn read_versioned<T: Versioned>(ptr: *const T, name: &str) -> Result<T> {
    if ptr.is_null() {
        return Err(Error::invalid_argument(format!("{name}: is NULL")));
    }
    // SAFETY: a non-NULL struct starts with its u32 size (the caller's contract).
    let size = unsafe { (ptr as *const u32).read_unaligned() } as usize;
    check_size::<T>(size, name)?;
    let ours = size_of::<T>();
    if size > ours {
        // SAFETY: the caller's struct has `size` readable bytes.
        let extra = unsafe { std::slice::from_raw_parts((ptr as *const u8).add(ours), size - ours) };
        if extra.iter().any(|&b| b != 0) {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "{name}: sets fields beyond the {ours} bytes of {} this version of tokenrace knows; upgrade the library",
                    T::NAME
                ),
            ));
        }
    }
    let mut value = T::default_value();
    // SAFETY: both sides have at least `min(size, ours)` bytes; T is plain old data.
    unsafe { std::ptr::copy_nonoverlapping(ptr as *const u8, &mut value as *mut T as *mut u8, size.min(ours)) };
    Ok(value)
}

/// Writes `value` into a caller's versioned struct: at most `out->struct_size` bytes, whole
/// fields only, so a caller built against an older header is never overrun; the written size is
/// stored back in `struct_size`.
///
/// # Safety
/// `out` is NULL or points to `out->struct_size` writable bytes.
pub(crate) unsafe fn write_versioned<T: Versioned>(out: *mut T, value: T, name: &str) -> Result<()> {
    if out.is_null() {
        return Err(Error::invalid_argument(format!("{name}: is NULL")));
    }
    // SAFETY: as in `read_versioned`.
    let size = unsafe { (out as *const u32).read_unaligned() } as usize;
    check_size::<T>(size, name)?;
    let n = size.min(size_of::<T>());
    // SAFETY: the caller's struct has `size >= n` writable bytes; ours has n readable ones.
    unsafe {
        std::ptr::copy_nonoverlapping(&value as *const T as *const u8, out as *mut u8, n);
        (out as *mut u32).write_unaligned(n as u32);
    }
    Ok(())
}

/// A slice from a caller's pointer to `len` elements: NULL only for zero elements, aligned.
///
/// # Safety
/// A non-NULL `ptr` points to `len` readable elements that outlive `'a`.
pub(crate) unsafe fn slice<'a, T>(owner: Owner, field: &'static str, ptr: *const T, len: usize) -> Result<&'a [T]> {
    if ptr.is_null() {
        if len == 0 {
            return Ok(&[]);
        }
        return Err(Error::arg(owner, field, None, "is NULL"));
    }
    if !(ptr as usize).is_multiple_of(align_of::<T>()) {
        return Err(Error::arg(owner, field, None, format!("is not aligned to {} bytes", align_of::<T>())));
    }
    // A slice may not span more than isize::MAX bytes nor wrap the address space: a length
    // that large can only be a mistaken size, and is refused before it is made into a slice.
    let fits = len
        .checked_mul(size_of::<T>())
        .is_some_and(|bytes| bytes <= isize::MAX as usize && (ptr as usize).checked_add(bytes).is_some());
    if !fits {
        return Err(Error::arg(owner, field, None, format!("{len} elements from {ptr:p} overflow the address space")));
    }
    // SAFETY: non-NULL, aligned, and `len` elements long by the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// [`slice`], or `None` for a NULL pointer (an optional argument not given).
///
/// # Safety
/// As [`slice`].
pub(crate) unsafe fn opt_slice<'a, T>(
    owner: Owner,
    field: &'static str,
    ptr: *const T,
    len: usize,
) -> Result<Option<&'a [T]>> {
    // SAFETY: as the caller's.
    if ptr.is_null() {
        Ok(None)
    } else {
        unsafe { slice(owner, field, ptr, len) }.map(Some)
    }
}

/// A C enum carried in a `uint32_t` field.
pub(crate) trait CEnum: Sized + Copy + 'static {
    const NAME: &'static str;
    const VARIANTS: &'static [Self];
    fn value(self) -> u32;
}

/// Decodes a `uint32_t` into the C enum `T` (also `T::try_from`), or says why not.
pub(crate) fn decode<T: CEnum>(value: u32) -> std::result::Result<T, String> {
    T::VARIANTS.iter().copied().find(|v| v.value() == value).ok_or_else(|| {
        let max = T::VARIANTS.iter().map(|v| v.value()).max().unwrap_or(0);
        format!("{value} is not a {} (0..={max})", T::NAME)
    })
}

/// Decodes an enum field of a config struct (INVALID_CONFIG naming the field).
pub(crate) fn config_enum<T: CEnum>(field: &str, value: u32) -> Result<T> {
    decode(value).map_err(|why| Error::invalid_config(format!("{field}: {why}")))
}

/// Decodes an enum field of an argument struct (INVALID_ARGUMENT naming it).
pub(crate) fn arg_enum<T: CEnum>(owner: Owner, field: &'static str, value: u32) -> Result<T> {
    decode(value).map_err(|why| Error::arg(owner, field, None, why))
}

/// Implements [`CEnum`] for a C enum and, with `<=> Rust`, `From` both ways between it and the
/// library's enum of the same variants.
macro_rules! c_enum {
    ($c:ident { $($v:ident),+ $(,)? }) => {
        impl CEnum for $c {
            const NAME: &'static str = stringify!($c);
            const VARIANTS: &'static [Self] = &[$($c::$v),+];
            fn value(self) -> u32 {
                self as u32
            }
        }
        impl TryFrom<u32> for $c {
            type Error = String;
            fn try_from(value: u32) -> std::result::Result<Self, String> {
                decode(value)
            }
        }
    };
    ($c:ident <=> $rust:ident { $($v:ident),+ $(,)? }) => {
        c_enum!($c { $($v),+ });
        impl From<$c> for $rust {
            fn from(c: $c) -> Self {
                match c { $($c::$v => $rust::$v),+ }
            }
        }
        impl From<$rust> for $c {
            fn from(r: $rust) -> Self {
                match r { $($rust::$v => $c::$v),+ }
            }
        }
    };
}

c_enum!(tokenrace_dtype { F32, Bf16, F16 });
c_enum!(tokenrace_simd <=> SimdChoice { Auto, Scalar, Portable, Avx2, Avx512, Neon, Vxe2 });
c_enum!(tokenrace_noise_kind <=> NoiseKind { Exp, LogExp });
c_enum!(tokenrace_noise_source <=> NoiseSource { Auto, Inline, Pool });
c_enum!(tokenrace_pool_policy <=> DrainPolicy { Inline, Block });
c_enum!(tokenrace_log_level <=> LogLevel { Off, Error, Warn, Info, Debug, Trace });
c_enum!(tokenrace_logprob_mode <=> LogprobMode { Raw, Processed });
c_enum!(tokenrace_full_mode <=> FullMode { Raw, Processed, ProcessedLogits });
c_enum!(tokenrace_filter_order <=> FilterOrder { TemperatureFirst, FiltersFirst });

#[cfg(test)]
mod tests {
    use super::*;

    /// The first versions are pinned: adding a field must never change them.
    #[test]
    fn v1_sizes_are_pinned() {
        assert_eq!(tokenrace_config::V1_SIZE, 48);
        assert_eq!(tokenrace_batch::V1_SIZE, 88);
        assert_eq!(tokenrace_output::V1_SIZE, 64);
        assert_eq!(tokenrace_pool_config::V1_SIZE, 48);
        assert_eq!(tokenrace_pool_lease::V1_SIZE, 40);
        assert_eq!(tokenrace_sampler_stats::V1_SIZE, 8);
        assert_eq!(tokenrace_pool_stats::V1_SIZE, 8);
        assert_eq!(tokenrace_verify_batch::V1_SIZE, 160);
        assert_eq!(tokenrace_verify_output::V1_SIZE, 48);
    }

    /// The field tables cover every byte of each struct, in order, without gaps (so "ends inside
    /// a field" is the only way a size can be wrong).
    #[test]
    fn field_tables_cover_the_structs() {
        fn check<T: Versioned>() {
            let mut at = 0;
            for f in T::fields() {
                assert_eq!(f.offset, at, "{}: gap or overlap before {}", T::NAME, f.name);
                at += f.size;
            }
            assert_eq!(at, size_of::<T>(), "{}: the table misses the tail", T::NAME);
        }
        check::<tokenrace_config>();
        check::<tokenrace_batch>();
        check::<tokenrace_output>();
        check::<tokenrace_pool_config>();
        check::<tokenrace_pool_lease>();
        check::<tokenrace_sampler_stats>();
        check::<tokenrace_pool_stats>();
        check::<tokenrace_verify_batch>();
        check::<tokenrace_verify_output>();
    }

    #[test]
    fn a_size_that_splits_a_field_is_rejected_naming_it() {
        let mut b: tokenrace_batch = zeroed();
        for size in (89..112u32).filter(|s| s % 8 != 0) {
            b.struct_size = size;
            // SAFETY: `b` has size_of bytes, more than any size tried.
            let err = unsafe { read_versioned(&b, "batch") }.unwrap_err();
            assert_eq!(err.kind, ErrorKind::InvalidArgument);
            let field = ["top_k", "top_p", "min_p"][(size as usize - 88) / 8];
            assert!(err.message.contains(&format!("inside field {field}")), "{size}: {}", err.message);
        }
        for size in [88u32, 96, 104, 112] {
            b.struct_size = size;
            // SAFETY: as above.
            assert!(unsafe { read_versioned(&b, "batch") }.is_ok(), "{size}");
        }
    }

    /// A stand-in for `tokenrace_config` after a field is added: a caller built against the
    /// first header (struct_size = V1) keeps working, reads get the new field's default, and
    /// writes stop at the caller's size.
    #[test]
    fn a_v1_caller_keeps_working_after_a_field_is_added() {
        #[repr(C)]
        #[derive(Clone, Copy, Debug)]
        struct Grown {
            v1: tokenrace_config,
            added: u64,
        }
        impl Versioned for Grown {
            const NAME: &'static str = "grown";
            const V1_SIZE: usize = tokenrace_config::V1_SIZE;
            fn fields() -> Vec<Field> {
                let mut f = tokenrace_config::fields();
                f.push(field!(Grown, added));
                f
            }
            fn default_value() -> Self {
                Grown { v1: config_to_c(&Config::default()), added: 7 }
            }
        }
        let mut caller = config_to_c(&Config::default());
        caller.struct_size = tokenrace_config::V1_SIZE as u32;
        caller.max_rows = 3;
        // SAFETY: the caller's struct has V1_SIZE bytes, which is all that is read.
        let read = unsafe { read_versioned(&caller as *const tokenrace_config as *const Grown, "config") }.unwrap();
        assert_eq!((read.v1.max_rows, read.added), (3, 7));
        // Writing into a V1-sized buffer leaves the bytes after it alone.
        let mut buf = [0xabu8; 64];
        buf[..4].copy_from_slice(&(tokenrace_config::V1_SIZE as u32).to_ne_bytes());
        let grown = Grown { added: 9, ..read };
        // SAFETY: buf has 64 writable bytes, more than V1_SIZE; unaligned writes are used.
        unsafe { write_versioned(buf.as_mut_ptr() as *mut Grown, grown, "out") }.unwrap();
        assert!(buf[tokenrace_config::V1_SIZE..].iter().all(|&b| b == 0xab));
        assert_eq!(u32::from_ne_bytes(buf[..4].try_into().unwrap()) as usize, tokenrace_config::V1_SIZE);
    }

    #[test]
    fn enums_decode_by_value_and_name_the_field() {
        assert_eq!(decode::<tokenrace_simd>(4), Ok(tokenrace_simd::Avx512));
        assert_eq!(SimdChoice::from(tokenrace_simd::Portable), SimdChoice::Portable);
        let e = arg_enum::<tokenrace_dtype>(Owner::Batch, "dtype", 3).unwrap_err();
        assert_eq!(e.to_string(), "batch.dtype: 3 is not a tokenrace_dtype (0..=2)");
        let e = config_enum::<tokenrace_log_level>("log_level", 6).unwrap_err();
        assert_eq!(
            (e.kind, e.message.as_str()),
            (ErrorKind::InvalidConfig, "log_level: 6 is not a tokenrace_log_level (0..=5)")
        );
    }
}
