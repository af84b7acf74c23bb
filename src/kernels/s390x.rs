//! IBM Z (s390x) with the vector facility and vector-enhancements 1 and 2 (z15 and later): the
//! `vxe2` level. Its kernels are the portable arrays compiled with those features (the compiler
//! vectorises them into 128-bit VX instructions), and a first pass in inline assembly, which the
//! compiler leaves scalar (the per-lane unordered compare of the NaN check does not vectorise).
//!
//! # Safety
//! The assembly below executes VX instructions (VLM, VFMAXSB, VGMF, VLR, VSLDB, VSTEF) of the features
//! `vector` and `vector-enhancements-1`, which [`SimdLevel::Vxe2`](crate::SimdLevel::Vxe2)
//! enables and detects. [`Vxe2Pass`] is instantiated only in that level's `kernel_table!` entry
//! points (see the `Simd` trait and `kernels/mod.rs`).

use super::portable::{FirstPass, PortableWith};

/// The `vxe2` level's first pass: one VECTOR LOAD MULTIPLE of four registers per 16 values and a
/// NaN-propagating VECTOR FP MAXIMUM (mode 1, Java's `Math.max`) into four accumulators.
pub(crate) struct Vxe2Pass;

/// The `Simd` of the `vxe2` level.
pub(crate) type Vxe2 = PortableWith<Vxe2Pass, 4>;

// SAFETY: see the module doc; the loop reads the `n` values at `p` and writes `m`, nothing else.
unsafe impl FirstPass for Vxe2Pass {
    const FAST: bool = true;
    const MASK_BY_AND: bool = true;
    #[inline(always)]
    unsafe fn max_f32_any(p: *const f32, n: usize) -> f32 {
        let mut m = 0f32;
        // SAFETY: `p` valid for `n` reads, `n` a multiple of 32 and at least 32 (the caller's
        // contract), so the loop runs n / 32 times over them; `m` takes the 4 bytes written; the
        // VX instructions are available (see the module doc).
        unsafe {
            core::arch::asm!(
                "vgmf %v24, 0, 8", // bits 0-8 of each lane: 0xff800000, -inf
                "vlr %v25, %v24",
                "vlr %v26, %v24",
                "vlr %v27, %v24",
                "0:",
                "vlm %v16, %v23, 0({p})",
                "vfmaxsb %v24, %v24, %v16, 1",
                "vfmaxsb %v25, %v25, %v17, 1",
                "vfmaxsb %v26, %v26, %v18, 1",
                "vfmaxsb %v27, %v27, %v19, 1",
                "vfmaxsb %v24, %v24, %v20, 1",
                "vfmaxsb %v25, %v25, %v21, 1",
                "vfmaxsb %v26, %v26, %v22, 1",
                "vfmaxsb %v27, %v27, %v23, 1",
                "la {p}, 128({p})",
                "brctg {c}, 0b",
                "vfmaxsb %v24, %v24, %v25, 1",
                "vfmaxsb %v26, %v26, %v27, 1",
                "vfmaxsb %v24, %v24, %v26, 1",
                // Across the lanes: the vector rotated by two lanes, then by one.
                "vsldb %v25, %v24, %v24, 8",
                "vfmaxsb %v24, %v24, %v25, 1",
                "vsldb %v25, %v24, %v24, 4",
                "vfmaxsb %v24, %v24, %v25, 1",
                "vstef %v24, 0({out}), 0",
                p = inout(reg_addr) p => _,
                c = inout(reg) (n / 32) as u64 => _,
                out = in(reg_addr) &mut m as *mut f32,
                out("v16") _, out("v17") _, out("v18") _, out("v19") _,
                out("v20") _, out("v21") _, out("v22") _, out("v23") _,
                out("v24") _, out("v25") _, out("v26") _, out("v27") _,
                options(nostack),
            );
        }
        m
    }
}
