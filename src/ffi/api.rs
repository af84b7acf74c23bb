//! The C functions of the library, its configurations and its samplers. Each one checks its
//! pointers, converts to the library's Rust types (`convert.rs`), and runs inside `guard`, which
//! turns errors into a status and a thread-local message.

use super::convert::{config_from_c, config_to_c, read_versioned, write_versioned};
use super::panic::{guard, guard_void, last_error_ptr};
use super::types::*;
use crate::config::{self, Config, SimdChoice};
use crate::error::Error;
use crate::kernels::{self, SimdLevel};
use crate::sampler::{Sampler, SamplerStats};
use std::ffi::{c_char, c_void};
use std::mem::size_of;

/// An opaque sampler. Safe to use from several threads at once.
///
/// After `fork()`, the child may keep using a sampler made before the fork: it draws on the
/// calling thread only (the worker threads stay in the parent), seeded rows give the same tokens
/// as in the parent, and unseeded rows use inline noise keyed by a new stream of the child's own
/// (seeded from OS entropy and the process id, so parent and child never share noise), also when
/// the sampler had a pool (a pool's producers do not exist in the child). Freeing it there always
/// returns. `tokenrace_sampler_attach_pool()` fails in the child: make a new sampler there.
pub struct tokenrace_sampler {
    pub(crate) inner: Sampler,
}

/// The name of a SIMD level as a C string with static storage.
fn level_name(level: SimdLevel) -> *const c_char {
    level.c_name().as_ptr()
}

/// The ABI version of the loaded library (`TOKENRACE_ABI_VERSION` of its header).
#[no_mangle]
pub extern "C" fn tokenrace_abi_version() -> u32 {
    TOKENRACE_ABI_VERSION
}

/// The library version, e.g. "0.2.0". Static storage.
#[no_mangle]
pub extern "C" fn tokenrace_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr() as *const c_char
}

/// The message of the last failed call on this thread: "" after a call that succeeded, and
/// before any call. Each thread has its own; calls on other threads never change it.
///
/// The pointer belongs to the library. It stays valid, and its text unchanged, until the next
/// tokenrace call on this thread that returns a status (any call but `tokenrace_last_error`,
/// `tokenrace_version` and the other functions that return no status), and at most until the
/// thread exits: copy the text to keep it. Never free it.
#[no_mangle]
pub extern "C" fn tokenrace_last_error() -> *const c_char {
    last_error_ptr()
}

/// A host's log function: called with the message's level (a `tokenrace_log_level`, 1 = error
/// .. 5 = trace), its target (the library's module, e.g. "tokenrace::sampler"), the message, and
/// the `user_data` given to `tokenrace_set_log_callback()`. `target` and `message` are valid only
/// during the call. It may be called from any thread (the library's worker and pool threads
/// too), from several at once, and must not unwind (throw) into the library.
pub type tokenrace_log_callback =
    Option<unsafe extern "C" fn(level: u32, target: *const c_char, message: *const c_char, user_data: *mut c_void)>;

/// Sends the library's log messages to `callback` (NULL: back to stderr, the default), for a
/// host that routes them into its own log (the convention of llama.cpp's `llama_log_set`).
/// Which messages are produced is `TOKENRACE_LOG_LEVEL` (or the first sampler config's
/// `log_level`; default warnings and errors). The library installs its logger when the first
/// sampler or pool is made, unless the process already has a Rust `log` logger (then that one
/// receives the messages and the callback is never called). Since 0.2.
#[no_mangle]
pub extern "C" fn tokenrace_set_log_callback(callback: tokenrace_log_callback, user_data: *mut c_void) {
    guard_void(|| crate::logging::set_callback(callback, user_data));
}

/// The SIMD level a sampler made from the environment would use ("avx512", "avx2", "neon",
/// "vxe2", "portable" or "scalar"): `TOKENRACE_SIMD` if set and supported, else the best this CPU has.
/// Static storage.
#[no_mangle]
pub extern "C" fn tokenrace_simd_level() -> *const c_char {
    let choice = config::from_env().map(|(c, _)| c.simd).unwrap_or(SimdChoice::Auto);
    level_name(kernels::resolve(choice).unwrap_or_else(|_| kernels::best_level()))
}

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
        // SAFETY: the caller's contract for `out`.
        unsafe { write_versioned(out, config_to_c(&cfg), "out") }
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
            // SAFETY: the caller's contract for `config`.
            config_from_c(&unsafe { read_versioned(config, "config") }?)?
        };
        crate::logging::install(cfg.log_level);
        let sampler = Box::new(tokenrace_sampler { inner: Sampler::new(cfg)? });
        // SAFETY: `out` is writable (the caller's contract) and not NULL (checked).
        unsafe { out.write(Box::into_raw(sampler)) };
        Ok(())
    })
}

/// Releases a sampler (NULL is ignored). No call may be using it. In a `fork()` child of the
/// process that made it, this frees what the child can and never waits for the parent's threads.
///
/// # Safety
/// `sampler` is NULL or came from `tokenrace_sampler_new()` and is not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn tokenrace_sampler_free(sampler: *mut tokenrace_sampler) {
    if !sampler.is_null() {
        // SAFETY: it came from `tokenrace_sampler_new` and is not used again (the caller's
        // contract).
        guard_void(|| drop(unsafe { Box::from_raw(sampler) }));
    }
}

/// The SIMD level this sampler runs ("avx512", "avx2", "neon", "vxe2", "portable", "scalar"). Static storage;
/// NULL if `sampler` is NULL.
///
/// # Safety
/// `sampler` is NULL or a live sampler.
#[no_mangle]
pub unsafe extern "C" fn tokenrace_sampler_simd_level(sampler: *const tokenrace_sampler) -> *const c_char {
    // SAFETY: NULL or live (the caller's contract).
    match unsafe { sampler.as_ref() } {
        None => std::ptr::null(),
        Some(s) => level_name(s.inner.simd_level()),
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
        // SAFETY: NULL or live (the caller's contract).
        let s = unsafe { sampler.as_ref() }.ok_or_else(|| Error::invalid_argument("sampler: is NULL"))?;
        // SAFETY: the caller's contract for `out`.
        unsafe { write_versioned(out, stats_to_c(&s.inner.stats()), "out") }
    })
}

fn stats_to_c(st: &SamplerStats) -> tokenrace_sampler_stats {
    tokenrace_sampler_stats {
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
    }
}
