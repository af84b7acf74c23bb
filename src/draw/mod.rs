//! The fused draw: greedy rows, the exponential race, and the batch driver.
//!
//! A call is planned first (which rows are greedy, which noise each sampling row takes; the
//! unseeded rows' keys are taken from the stream in row order), then its rows are drawn, each
//! independently, so the result of a row never depends on how rows are spread over threads.

pub mod batch;

use crate::config::NoiseKind;
use crate::kernels::{DtypeKernels, ExtKind, Kernels, RaceParams, BLOCK};
use batch::{flags, Batch, Logits};
use std::cell::RefCell;

/// Where a sampling row's noise comes from.
#[derive(Clone, Copy, Debug)]
pub(crate) enum NoiseSrc {
    /// Counter-based noise of the row key.
    Inline(u64),
    /// One value per token at this pointer (the caller's noise or a pool lease), valid for the call.
    External(*const f32, ExtKind),
}

/// What to do with one row.
#[derive(Clone, Copy, Debug)]
pub(crate) enum RowPlan {
    Greedy,
    Sample { inv_t: f32, noise: NoiseSrc },
}

// SAFETY: the raw noise pointers in a plan point into buffers that outlive the draw call and are
// only read.
unsafe impl Send for RowPlan {}
unsafe impl Sync for RowPlan {}

pub(crate) fn ext_kind(kind: NoiseKind) -> ExtKind {
    match kind {
        NoiseKind::Exp => ExtKind::Exp,
        NoiseKind::LogExp => ExtKind::LogExp,
    }
}

/// 1/T for a sampling row, capped so that a tiny T never turns `0 * inv_t` into NaN.
pub(crate) fn inv_temperature(t: f32) -> f32 {
    let inv = 1.0 / t;
    if inv.is_finite() {
        inv
    } else {
        f32::MAX
    }
}

thread_local! {
    /// Block maxima of the row being drawn on this thread.
    static BLOCK_MAX: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Draws row `r` of `batch`: returns (token, flags).
pub(crate) fn draw_row(k: &Kernels, batch: &Batch, r: usize, plan: RowPlan) -> (i32, u32) {
    let start = r * batch.row_stride;
    // SAFETY (all three arms): `validate` checked that every row lies inside the slice, and the
    // kernels come from `kernels()`, which only hands out levels this CPU supports.
    match batch.logits {
        Logits::F32(s) => unsafe { draw_row_typed(&k.f32, s[start..].as_ptr(), batch.vocab, plan) },
        Logits::Bf16(s) => unsafe { draw_row_typed(&k.bf16, s[start..].as_ptr(), batch.vocab, plan) },
        Logits::F16(s) => unsafe { draw_row_typed(&k.f16, s[start..].as_ptr(), batch.vocab, plan) },
    }
}

/// # Safety
/// `row` valid for `n` reads; external noise pointers valid for `n` reads.
unsafe fn draw_row_typed<E>(k: &DtypeKernels<E>, row: *const E, n: usize, plan: RowPlan) -> (i32, u32) {
    BLOCK_MAX.with(|cell| {
        let mut bmax = cell.borrow_mut();
        bmax.resize(n.div_ceil(BLOCK), f32::NEG_INFINITY);
        let has_nan = (k.scan)(row, n, &mut bmax);
        let top = bmax.iter().fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a });
        let mut fl = if has_nan { flags::HAS_NAN } else { 0 };
        if matches!(plan, RowPlan::Greedy) {
            fl |= flags::GREEDY;
        }
        // The first index holding `top`, searched in the first block whose maximum is `top`.
        let first_of_top = || {
            let b = bmax.iter().position(|&v| v == top).unwrap_or(0);
            (k.find_first)(row, b * BLOCK, ((b + 1) * BLOCK).min(n), top).unwrap_or(0)
        };
        let token = if top == f32::INFINITY {
            fl |= flags::HAS_POSINF;
            first_of_top()
        } else if top == f32::NEG_INFINITY {
            fl |= flags::EMPTY;
            0
        } else {
            match plan {
                RowPlan::Greedy => first_of_top(),
                RowPlan::Sample { inv_t, noise } => {
                    let p = RaceParams { m: top, inv_t };
                    match noise {
                        NoiseSrc::Inline(key) => (k.race_inline)(row, n, &bmax, p, key),
                        NoiseSrc::External(ptr, kind) => {
                            (k.race_external)(row, ptr, n, p, kind).unwrap_or_else(first_of_top)
                        }
                    }
                }
            }
        };
        (token as i32, fl)
    })
}
