//! aarch64 with NEON (Advanced SIMD, the architecture's baseline): the `neon` level. Its kernels
//! are the portable arrays (which the compiler vectorises into NEON already: greedy and the noise)
//! and a first pass in NEON intrinsics, which the compiler leaves scalar (the per-lane unordered
//! compare of the NaN check does not vectorise).
//!
//! # Safety
//! The intrinsics below are NEON's (feature `neon`), which
//! [`SimdLevel::Neon`](crate::SimdLevel::Neon) enables and detects. [`NeonPass`] is instantiated
//! only in that level's `kernel_table!` entry points (see the `Simd` trait and `kernels/mod.rs`).

use super::portable::{FirstPass, PortableWith};
use std::arch::aarch64::*;

/// The `neon` level's first pass: two loads of four registers per 32 values and a
/// NaN-propagating FMAX into four accumulators.
pub(crate) struct NeonPass;

/// The `Simd` of the `neon` level.
pub(crate) type Neon = PortableWith<NeonPass, 8>;

// SAFETY: see the module doc; the loop reads the `n` values at `p`, nothing else.
unsafe impl FirstPass for NeonPass {
    const FAST: bool = true;
    const MASK_BY_AND: bool = true;
    #[inline(always)]
    unsafe fn max_f32_any(p: *const f32, n: usize) -> f32 {
        // SAFETY: `p` valid for `n` reads, `n` a multiple of 32 (the caller's contract), so each
        // step reads 32 of them; NEON is available (see the module doc).
        unsafe {
            let ninf = vdupq_n_f32(f32::NEG_INFINITY);
            let (mut a0, mut a1, mut a2, mut a3) = (ninf, ninf, ninf, ninf);
            let mut i = 0;
            while i < n {
                let x = vld1q_f32_x4(p.add(i));
                let y = vld1q_f32_x4(p.add(i + 16));
                a0 = vmaxq_f32(a0, x.0);
                a1 = vmaxq_f32(a1, x.1);
                a2 = vmaxq_f32(a2, x.2);
                a3 = vmaxq_f32(a3, x.3);
                a0 = vmaxq_f32(a0, y.0);
                a1 = vmaxq_f32(a1, y.1);
                a2 = vmaxq_f32(a2, y.2);
                a3 = vmaxq_f32(a3, y.3);
                i += 32;
            }
            // FMAX and FMAXV return NaN when an operand is NaN.
            vmaxvq_f32(vmaxq_f32(vmaxq_f32(a0, a1), vmaxq_f32(a2, a3)))
        }
    }
}
