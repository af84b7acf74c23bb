//! The runner of the per-level tests: a test body run at every SIMD level this CPU supports,
//! a failure naming the level it happened at (a test seam: unit tests, and feature `internals`
//! for the integration tests).

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};

use super::{supported_levels, SimdLevel};

/// Runs `body` at every level this CPU supports, lowest first, and returns the levels that ran.
/// A panic in the body is raised again with the level's name in front of its message, so a
/// failure says which level's kernels broke even when the body's own message does not.
pub fn each_level(mut body: impl FnMut(SimdLevel)) -> Vec<SimdLevel> {
    let levels = supported_levels();
    for &level in &levels {
        at_level(level, || body(level));
    }
    levels
}

/// Runs `body` on behalf of `level`: its result, or its panic raised again with the level's name.
pub fn at_level<R>(level: SimdLevel, body: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(result) => result,
        Err(payload) => match panic_text(payload.as_ref()) {
            Some(text) => panic!("at SIMD level {}: {text}", level.name()),
            // A payload that is not text (`panic_any`) goes on unchanged: its receiver expects it.
            None => resume_unwind(payload),
        },
    }
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> Option<&str> {
    payload.downcast_ref::<&str>().copied().or_else(|| payload.downcast_ref::<String>().map(String::as_str))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_names_its_level() {
        let level = supported_levels()[0];
        let payload = catch_unwind(|| each_level(|l| assert!(l != level, "the body failed"))).unwrap_err();
        let text = panic_text(payload.as_ref()).unwrap();
        assert_eq!(text, format!("at SIMD level {}: the body failed", level.name()));
    }

    #[test]
    fn every_supported_level_runs_once_in_order() {
        let mut ran = Vec::new();
        let reported = each_level(|l| ran.push(l));
        assert_eq!(ran, supported_levels());
        assert_eq!(reported, ran);
        assert!(ran.contains(&SimdLevel::Scalar) && ran.contains(&SimdLevel::Portable));
    }
}
