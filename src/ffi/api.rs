//! The C functions. Each one checks its pointers, converts to the library's Rust types, and
//! runs inside `guard`, which turns errors into a status and a thread-local message.

use super::types::*;
use super::{guard, last_error_ptr, read_versioned, write_versioned};
use crate::config::{self, Config, LogLevel, NoiseSource, SimdChoice};
use crate::draw::batch::{Batch, ExternalNoise, Logits, LogprobMode, Output};
use crate::error::{Error, Result};
use crate::kernels::{self, Bf16, F16};
use crate::sampler::Sampler;
use crate::NoiseKind;
use std::ffi::c_char;
use std::mem::{offset_of, size_of};

/// The ABI version of the loaded library (`TOKENRACE_ABI_VERSION` of its header).
#[no_mangle]
pub extern "C" fn tokenrace_abi_version() -> u32 {
    TOKENRACE_ABI_VERSION
}

/// The library version, e.g. "0.1.0". Static storage.
#[no_mangle]
pub extern "C" fn tokenrace_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr() as *const c_char
}

/// The message of the last failed call on this thread ("" after a successful one). Valid until
/// the next tokenrace call on this thread.
#[no_mangle]
pub extern "C" fn tokenrace_last_error() -> *const c_char {
    last_error_ptr()
}

/// The SIMD level a sampler made from the environment would use ("avx512", "avx2",
/// "portable" or "scalar"): `TOKENRACE_SIMD` if set and supported, else the best this CPU has.
/// Static storage.
#[no_mangle]
pub extern "C" fn tokenrace_simd_level() -> *const c_char {
    let choice = config::from_env().map(|(c, _)| c.simd).unwrap_or(SimdChoice::Auto);
    let level = kernels::resolve(choice).unwrap_or_else(|_| kernels::best_level());
    let name: &'static str = match level {
        kernels::SimdLevel::Scalar => "scalar\0",
        kernels::SimdLevel::Portable => "portable\0",
        kernels::SimdLevel::Avx2 => "avx2\0",
        kernels::SimdLevel::Avx512 => "avx512\0",
    };
    name.as_ptr() as *const c_char
}

fn config_to_c(c: &Config) -> tokenrace_config {
    tokenrace_config {
        struct_size: size_of::<tokenrace_config>() as u32,
        vocab_size: c.vocab_size as u32,
        max_rows: c.max_rows as u32,
        threads: c.threads as u32,
        seed: c.seed.unwrap_or(0),
        has_seed: c.seed.is_some() as u32,
        simd: match c.simd {
            SimdChoice::Auto => tokenrace_simd::Auto,
            SimdChoice::Scalar => tokenrace_simd::Scalar,
            SimdChoice::Portable => tokenrace_simd::Portable,
            SimdChoice::Avx2 => tokenrace_simd::Avx2,
            SimdChoice::Avx512 => tokenrace_simd::Avx512,
        } as u32,
        greedy_below: c.greedy_below,
        log_level: c.log_level as u32,
        noise: c.noise as u32,
        pool_rows: c.pool_rows as u32,
    }
}

fn enum_field<T: Copy>(name: &str, value: u32, choices: &[T]) -> Result<T> {
    choices.get(value as usize).copied().ok_or_else(|| {
        Error::invalid_config(format!("{name}: {value} is not a valid value (0..={})", choices.len() - 1))
    })
}

fn config_from_c(c: &tokenrace_config) -> Result<Config> {
    use SimdChoice as S;
    Ok(Config {
        vocab_size: c.vocab_size as usize,
        max_rows: c.max_rows as usize,
        threads: c.threads as usize,
        seed: (c.has_seed != 0).then_some(c.seed),
        simd: enum_field("simd", c.simd, &[S::Auto, S::Scalar, S::Portable, S::Avx2, S::Avx512])?,
        greedy_below: c.greedy_below,
        log_level: enum_field(
            "log_level",
            c.log_level,
            &[LogLevel::Off, LogLevel::Error, LogLevel::Warn, LogLevel::Info, LogLevel::Debug, LogLevel::Trace],
        )?,
        noise: enum_field("noise", c.noise, &[NoiseSource::Auto, NoiseSource::Inline, NoiseSource::Pool])?,
        pool_rows: c.pool_rows as usize,
    })
}

const CONFIG_V1_SIZE: usize = size_of::<tokenrace_config>();

/// The default settings (the defaults of docs/configuration.md), with `struct_size` set.
#[no_mangle]
pub extern "C" fn tokenrace_config_default() -> tokenrace_config {
    config_to_c(&Config::default())
}

/// Writes the default settings overridden by the `TOKENRACE_*` environment variables (read once
/// per process) into `*out`, whose `struct_size` the caller sets to `sizeof(tokenrace_config)`:
/// only that many bytes are written, so a caller built against an older header is safe. A bad
/// variable fails with INVALID_CONFIG naming it; `*out` is then left unchanged.
///
/// # Safety
/// `out` is NULL or points to a writable `tokenrace_config` of `out->struct_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn tokenrace_config_from_env(out: *mut tokenrace_config) -> tokenrace_status {
    guard("tokenrace_config_from_env", || {
        let (cfg, _) = config::from_env()?;
        write_versioned(out, config_to_c(&cfg), "out", CONFIG_V1_SIZE)
    })
}

/// Makes a sampler. `config` NULL means `tokenrace_config_from_env()`. On success `*out` holds
/// a sampler to release with `tokenrace_sampler_free()`; on failure `*out` is untouched.
///
/// # Safety
/// `config` is NULL or a valid `tokenrace_config`; `out` points to writable storage.
#[no_mangle]
pub unsafe extern "C" fn tokenrace_sampler_new(
    config: *const tokenrace_config,
    out: *mut *mut tokenrace_sampler,
) -> tokenrace_status {
    guard("tokenrace_sampler_new", || {
        if out.is_null() {
            return Err(Error::invalid_argument("out: is NULL"));
        }
        let cfg = if config.is_null() {
            config::from_env()?.0
        } else {
            let c = read_versioned(config, tokenrace_config_default(), "config", CONFIG_V1_SIZE)?;
            config_from_c(&c)?
        };
        let sampler = Box::new(tokenrace_sampler { inner: Sampler::new(cfg)? });
        out.write(Box::into_raw(sampler));
        Ok(())
    })
}

/// Releases a sampler (NULL is ignored). No call may be using it.
///
/// # Safety
/// `sampler` is NULL or came from `tokenrace_sampler_new()` and is not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn tokenrace_sampler_free(sampler: *mut tokenrace_sampler) {
    if !sampler.is_null() {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(Box::from_raw(sampler))));
    }
}

/// The SIMD level this sampler runs ("avx512", "avx2", "portable", "scalar"). Static storage;
/// NULL if `sampler` is NULL.
///
/// # Safety
/// `sampler` is NULL or a live sampler.
#[no_mangle]
pub unsafe extern "C" fn tokenrace_sampler_simd_level(sampler: *const tokenrace_sampler) -> *const c_char {
    match sampler.as_ref() {
        None => std::ptr::null(),
        Some(s) => match s.inner.simd_level() {
            kernels::SimdLevel::Scalar => c"scalar".as_ptr(),
            kernels::SimdLevel::Portable => c"portable".as_ptr(),
            kernels::SimdLevel::Avx2 => c"avx2".as_ptr(),
            kernels::SimdLevel::Avx512 => c"avx512".as_ptr(),
        },
    }
}

/// Copies the sampler's counters into `*out` (whose `struct_size` the caller sets).
///
/// # Safety
/// `sampler` is a live sampler; `out` points to a writable `tokenrace_sampler_stats` of at least
/// `out->struct_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn tokenrace_sampler_get_stats(
    sampler: *const tokenrace_sampler,
    out: *mut tokenrace_sampler_stats,
) -> tokenrace_status {
    guard("tokenrace_sampler_get_stats", || {
        let s = sampler.as_ref().ok_or_else(|| Error::invalid_argument("sampler: is NULL"))?;
        read_versioned(out as *const tokenrace_sampler_stats, tokenrace_sampler_stats::default(), "out", 8)?;
        let size = (out as *const u32).read_unaligned() as usize;
        let st = s.inner.stats();
        let full = tokenrace_sampler_stats {
            struct_size: size_of::<tokenrace_sampler_stats>() as u32,
            reserved0: 0,
            calls: st.calls,
            rejected_calls: st.rejected_calls,
            greedy_rows: st.greedy_rows,
            seeded_rows: st.seeded_rows,
            inline_rows: st.inline_rows,
            external_noise_rows: st.external_noise_rows,
            pool_rows: st.pool_rows,
            nonfinite_rows: st.nonfinite_rows,
        };
        let n = size.min(size_of::<tokenrace_sampler_stats>());
        std::ptr::copy_nonoverlapping(&full as *const _ as *const u8, out as *mut u8, n);
        (out as *mut u32).write_unaligned(n as u32);
        Ok(())
    })
}

const BATCH_V1_SIZE: usize = offset_of!(tokenrace_batch, top_k);
const OUTPUT_V1_SIZE: usize = size_of::<tokenrace_output>();

fn zero_batch() -> tokenrace_batch {
    // SAFETY: every field is an integer, a float or a raw pointer; all-zero is valid for each.
    unsafe { std::mem::zeroed() }
}

fn zero_output() -> tokenrace_output {
    // SAFETY: as above.
    unsafe { std::mem::zeroed() }
}

/// Builds a slice from a caller's pointer, checking NULL and alignment.
unsafe fn slice<'a, T>(name: &str, ptr: *const T, len: usize) -> Result<&'a [T]> {
    if ptr.is_null() {
        return Err(Error::invalid_argument(format!("{name}: is NULL")));
    }
    if !(ptr as usize).is_multiple_of(align_of::<T>()) {
        return Err(Error::invalid_argument(format!("{name}: is not aligned to {} bytes", align_of::<T>())));
    }
    Ok(std::slice::from_raw_parts(ptr, len))
}

unsafe fn opt_slice<'a, T>(name: &str, ptr: *const T, len: usize) -> Result<Option<&'a [T]>> {
    if ptr.is_null() {
        Ok(None)
    } else {
        slice(name, ptr, len).map(Some)
    }
}

unsafe fn slice_mut<'a, T>(name: &str, ptr: *mut T, len: usize) -> Result<&'a mut [T]> {
    slice(name, ptr as *const T, len)?;
    Ok(std::slice::from_raw_parts_mut(ptr, len))
}

unsafe fn opt_slice_mut<'a, T>(name: &str, ptr: *mut T, len: usize) -> Result<Option<&'a mut [T]>> {
    if ptr.is_null() {
        Ok(None)
    } else {
        slice_mut(name, ptr, len).map(Some)
    }
}

/// Elements spanned by `rows` rows of `vocab` values, `stride` apart.
fn span(rows: usize, vocab: usize, stride: usize, what: &str) -> Result<usize> {
    (rows - 1)
        .checked_mul(stride)
        .and_then(|n| n.checked_add(vocab))
        .ok_or_else(|| Error::invalid_argument(format!("rows x {what}: overflows")))
}

/// Draws one token per row. See docs/semantics.md for the exact rules. On failure nothing is
/// written to `out`'s arrays.
///
/// # Safety
/// `sampler` is a live sampler; `batch` and `out` point to valid structs whose non-NULL
/// pointers cover the elements the batch's sizes say.
#[no_mangle]
pub unsafe extern "C" fn tokenrace_draw(
    sampler: *mut tokenrace_sampler,
    batch: *const tokenrace_batch,
    out: *mut tokenrace_output,
) -> tokenrace_status {
    guard("tokenrace_draw", || {
        let s = sampler.as_ref().ok_or_else(|| Error::invalid_argument("sampler: is NULL"))?;
        let b = read_versioned(batch, zero_batch(), "batch", BATCH_V1_SIZE)?;
        let o = read_versioned(out as *const tokenrace_output, zero_output(), "out", OUTPUT_V1_SIZE)?;
        let rows = b.rows as usize;
        let vocab = b.vocab as usize;
        if b.vocab == 0 {
            return Err(Error::invalid_argument("batch.vocab: must be at least 1"));
        }
        let stride = if b.row_stride == 0 { vocab } else { usize::try_from(b.row_stride).unwrap_or(usize::MAX) };
        if stride < vocab {
            return Err(Error::invalid_argument(format!("batch.row_stride: {stride} is smaller than vocab {vocab}")));
        }
        if rows > s.inner.config().max_rows {
            return Err(Error::invalid_argument(format!(
                "batch.rows: {rows} exceeds the sampler's max_rows {}",
                s.inner.config().max_rows
            )));
        }
        if rows == 0 {
            return Ok(());
        }
        let n = span(rows, vocab, stride, "row_stride")?;
        let logits = match b.dtype {
            0 => Logits::F32(slice("batch.logits", b.logits as *const f32, n)?),
            1 => Logits::Bf16(slice("batch.logits", b.logits as *const Bf16, n)?),
            2 => Logits::F16(slice("batch.logits", b.logits as *const F16, n)?),
            d => return Err(Error::invalid_argument(format!("batch.dtype: {d} is not a tokenrace_dtype (0..=2)"))),
        };
        let noise = if b.noise.is_null() {
            None
        } else {
            let kind = match b.noise_kind {
                0 => NoiseKind::Exp,
                1 => NoiseKind::LogExp,
                k => {
                    return Err(Error::invalid_argument(format!(
                        "batch.noise_kind: {k} is not a tokenrace_noise_kind (0..=1)"
                    )))
                }
            };
            let nstride = usize::try_from(b.noise_row_stride).unwrap_or(usize::MAX);
            if nstride != 0 && nstride < vocab {
                return Err(Error::invalid_argument(format!(
                    "batch.noise_row_stride: {nstride} is neither 0 (broadcast) nor >= vocab {vocab}"
                )));
            }
            let len = if nstride == 0 { vocab } else { span(rows, vocab, nstride, "noise_row_stride")? };
            Some(ExternalNoise { values: slice("batch.noise", b.noise, len)?, kind, row_stride: nstride })
        };
        let batch = Batch {
            logits,
            rows,
            vocab,
            row_stride: stride,
            temperature: opt_slice("batch.temperature", b.temperature, rows)?,
            seeds: opt_slice("batch.seeds", b.seeds, rows)?,
            offsets: opt_slice("batch.offsets", b.offsets, rows)?,
            seeded: opt_slice("batch.seeded", b.seeded, rows)?,
            noise,
            top_k: opt_slice("batch.top_k", b.top_k, rows)?,
            top_p: opt_slice("batch.top_p", b.top_p, rows)?,
            min_p: opt_slice("batch.min_p", b.min_p, rows)?,
        };
        let logprob_mode = match o.logprob_mode {
            0 => LogprobMode::Raw,
            1 => LogprobMode::Processed,
            m => {
                return Err(Error::invalid_argument(format!(
                    "out.logprob_mode: {m} is not a tokenrace_logprob_mode (0..=1)"
                )))
            }
        };
        let top_n = o.top_n as usize;
        let topn_len =
            rows.checked_mul(top_n).ok_or_else(|| Error::invalid_argument("out.top_n: rows x top_n overflows"))?;
        let mut output = Output {
            tokens: slice_mut("out.tokens", o.tokens, rows)?,
            flags: opt_slice_mut("out.flags", o.flags, rows)?,
            logprobs: opt_slice_mut("out.logprobs", o.logprobs, rows)?,
            ranks: opt_slice_mut("out.ranks", o.ranks, rows)?,
            top_n,
            topn_ids: if top_n == 0 { None } else { opt_slice_mut("out.topn_ids", o.topn_ids, topn_len)? },
            topn_logprobs: if top_n == 0 {
                None
            } else {
                opt_slice_mut("out.topn_logprobs", o.topn_logprobs, topn_len)?
            },
            logprob_mode,
        };
        s.inner.draw(&batch, &mut output).map_err(|e| {
            let m = &e.message;
            let owner = if ["tokens", "flags", "logprobs", "ranks", "top_n", "topn_"].iter().any(|p| m.starts_with(p)) {
                "out"
            } else {
                "batch"
            };
            if m.starts_with("noise pool") {
                return Error::new(e.kind, m.clone());
            }
            Error::new(e.kind, format!("{owner}.{m}"))
        })
    })
}
