//! Samplers made through the C ABI, freed on drop.

use super::{check_last_error, code, OK};
use tokenrace::internals::api::{tokenrace_sampler, tokenrace_sampler_free, tokenrace_sampler_new};
use tokenrace::internals::types::tokenrace_config;
use tokenrace::SimdLevel;

/// A sampler, freed on drop.
pub struct Sampler(pub *mut tokenrace_sampler);

impl Drop for Sampler {
    fn drop(&mut self) {
        // SAFETY: made by tokenrace_sampler_new, freed once.
        unsafe { tokenrace_sampler_free(self.0) };
    }
}

/// `tokenrace_sampler_new` on `cfg`: its status (checked against the last error) and the
/// sampler when it succeeded; a failed call must leave `*out` NULL.
pub fn new_sampler(cfg: &tokenrace_config) -> (u32, Option<Sampler>) {
    let mut s: *mut tokenrace_sampler = std::ptr::null_mut();
    // SAFETY: a valid config, a writable out.
    let st = code(unsafe { tokenrace_sampler_new(cfg, &mut s) }, "tokenrace_sampler_new");
    check_last_error(st, "tokenrace_sampler_new");
    if st == OK {
        assert!(!s.is_null());
        (st, Some(Sampler(s)))
    } else {
        assert!(s.is_null(), "tokenrace_sampler_new failed but wrote *out");
        (st, None)
    }
}

/// A sampler of `cfg`'s seed on another SIMD level and thread count (for the check that seeded
/// outputs do not depend on them); it must be made.
pub fn other_level_sampler(cfg: &tokenrace_config) -> Sampler {
    let mut other = *cfg;
    let scalar_single = cfg.simd == 1 && cfg.threads == 1;
    other.simd = if scalar_single { 0 } else { 1 };
    other.threads = if scalar_single { 3 } else { 1 };
    let (st, s) = new_sampler(&other);
    assert_eq!(st, OK, "the second sampler: {}", super::last_error());
    s.unwrap()
}

/// Whether the config's `simd` value (0 auto, 1 scalar, 2 portable, 3 AVX2, else AVX-512) runs
/// on this CPU.
pub fn level_supported(simd: u32) -> bool {
    match simd {
        0 => true,
        1 => SimdLevel::Scalar.is_supported(),
        2 => SimdLevel::Portable.is_supported(),
        3 => SimdLevel::Avx2.is_supported(),
        _ => SimdLevel::Avx512.is_supported(),
    }
}
