//! x86-64 AVX-512 (F): 16 lanes, mask registers for comparisons.
//!
//! # Safety
//! Every `unsafe` block here calls `core::arch` intrinsics of AVX-512F (and of AVX/AVX2, which
//! it implies), the feature `avx512f` of [`SimdLevel::Avx512`](crate::SimdLevel::Avx512), and
//! no others. They are sound because [`Avx512`] implements the `unsafe trait` [`Simd`], whose
//! contract `kernels/mod.rs` keeps: these methods only run inside the level's
//! `#[target_feature(enable = "avx512f")]` entry points, which are only handed out on a CPU that
//! has it. The blocks of the pointer methods also rely on the caller's pointer, as each says.

use crate::kernels::simd::Simd;
use crate::kernels::x86_64::avx2::POPCOUNT8;
use std::arch::x86_64::*;

#[derive(Clone, Copy)]
pub(crate) struct Avx512;

// SAFETY: see the module doc: only AVX-512F instructions, no others, and the pointer methods touch
// the 16 elements at `p`; 16 lanes only where `GATHER_IN_MASS_PASS` is set.
unsafe impl Simd for Avx512 {
    const INTERLEAVE_ROWS: bool = true;
    const LANES: usize = 16;
    /// A vector per row of a block, and a one-instruction compress.
    const GATHER_IN_MASS_PASS: bool = true;
    type F = __m512;
    type U = __m512i;
    type M = __mmask16;

    #[inline(always)]
    unsafe fn load_f32(p: *const f32) -> __m512 {
        // SAFETY: `p` valid for 16 f32 reads (the caller's contract); AVX-512F (see the module doc).
        unsafe { _mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const u16) -> __m512 {
        // SAFETY: `p` valid for 16 u16 reads (the caller's contract); AVX-512F (see the module doc).
        unsafe {
            let h = _mm256_loadu_si256(p as *const __m256i);
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
        }
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u16) -> __m512 {
        // SAFETY: `p` valid for 16 u16 reads (the caller's contract); AVX-512F (see the module doc).
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m512) {
        // SAFETY: `p` valid for 16 f32 writes (the caller's contract); AVX-512F (see the module doc).
        unsafe { _mm512_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn store_u(p: *mut u32, v: __m512i) {
        // SAFETY: `p` valid for 16 u32 writes (the caller's contract); AVX-512F (see the module doc).
        unsafe { _mm512_storeu_si512(p as *mut __m512i, v) }
    }
    #[inline(always)]
    fn splat(x: f32) -> __m512 {
        // SAFETY: AVX-512F intrinsics on values (see the module doc).
        unsafe { _mm512_set1_ps(x) }
    }
    #[inline(always)]
    fn add(a: __m512, b: __m512) -> __m512 {
        // SAFETY: AVX-512F intrinsics on values (see the module doc).
        unsafe { _mm512_add_ps(a, b) }
    }
    #[inline(always)]
    fn sub(a: __m512, b: __m512) -> __m512 {
        // SAFETY: AVX-512F intrinsics on values (see the module doc).
        unsafe { _mm512_sub_ps(a, b) }
    }
    #[inline(always)]
    fn mul(a: __m512, b: __m512) -> __m512 {
        // SAFETY: AVX-512F intrinsics on values (see the module doc).
        unsafe { _mm512_mul_ps(a, b) }
    }
    #[inline(always)]
    fn div(a: __m512, b: __m512) -> __m512 {
        // SAFETY: AVX-512F intrinsics on values (see the module doc).
        unsafe { _mm512_div_ps(a, b) }
    }
    #[inline(always)]
    fn max(x: __m512, acc: __m512) -> __m512 {
        // vmaxps returns its second operand when either is NaN or both are equal.
        // SAFETY: AVX-512F intrinsics on values (see the module doc).
        unsafe { _mm512_max_ps(x, acc) }
    }
    #[inline(always)]
    fn ge(a: __m512, b: __m512) -> __mmask16 {
        // SAFETY: AVX-512F intrinsics on values (see the module doc).
        unsafe { _mm512_cmp_ps_mask::<_CMP_GE_OQ>(a, b) }
    }
    #[inline(always)]
    fn gt(a: __m512, b: __m512) -> __mmask16 {
        // SAFETY: AVX-512F intrinsics on values (see the module doc).
        unsafe { _mm512_cmp_ps_mask::<_CMP_GT_OQ>(a, b) }
    }
    #[inline(always)]
    fn eq(a: __m512, b: __m512) -> __mmask16 {
        // SAFETY: AVX-512F intrinsics on values (see the module doc).
        unsafe { _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(a, b) }
    }
    #[inline(always)]
    fn lt(a: __m512, b: __m512) -> __mmask16 {
        // SAFETY: AVX-512F intrinsics on values (see the module doc).
        unsafe { _mm512_cmp_ps_mask::<_CMP_LT_OQ>(a, b) }
    }
    #[inline(always)]
    fn is_nan(a: __m512) -> __mmask16 {
        // SAFETY: AVX-512F intrinsics on values (see the module doc).
        unsafe { _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(a, a) }
    }
    #[inline(always)]
    fn unord(a: __m512, b: __m512) -> __mmask16 {
        // SAFETY: AVX-512F intrinsics on values (see the module doc).
        unsafe { _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(a, b) }
    }
    #[inline(always)]
    fn and_m(a: __mmask16, b: __mmask16) -> __mmask16 {
        a & b
    }
    #[inline(always)]
    fn or_m(a: __mmask16, b: __mmask16) -> __mmask16 {
        a | b
    }
    #[inline(always)]
    fn none() -> __mmask16 {
        0
    }
    #[inline(always)]
    fn mask_bits(bits: u32) -> __mmask16 {
        bits as __mmask16
    }
    #[inline(always)]
    fn any(m: __mmask16) -> bool {
        m != 0
    }
    #[inline(always)]
    fn first(m: __mmask16) -> usize {
        m.trailing_zeros() as usize
    }
    #[inline(always)]
    fn bits_of(m: __mmask16) -> u32 {
        m as u32
    }
    #[inline(always)]
    fn select(m: __mmask16, a: __m512, b: __m512) -> __m512 {
        // SAFETY: AVX-512F intrinsics on values (see the module doc).
        unsafe { _mm512_mask_blend_ps(m, b, a) }
    }
    #[inline(always)]
    fn max_where(m: __mmask16, x: __m512, acc: __m512) -> __m512 {
        // The masked vmaxps: `max(x, acc)` where `m` is set, `acc` elsewhere, as the default's
        // blend then max (a masked-out lane gives max(-inf, acc) = acc), in one instruction.
        // SAFETY: AVX-512F intrinsics on values (see the module doc).
        unsafe { _mm512_mask_max_ps(acc, m, x, acc) }
    }
    #[inline(always)]
    fn reduce_max(v: __m512) -> f32 {
        // SAFETY: AVX-512F intrinsics on values (see the module doc).
        unsafe { _mm512_reduce_max_ps(v) }
    }
    #[inline(always)]
    fn splat_u(x: u32) -> __m512i {
        // SAFETY: AVX-512F intrinsics on values (see the module doc).
        unsafe { _mm512_set1_epi32(x as i32) }
    }
    #[inline(always)]
    fn iota_u(base: u32) -> __m512i {
        // SAFETY: AVX-512F intrinsics on values (see the module doc).
        unsafe {
            let lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
            _mm512_add_epi32(_mm512_set1_epi32(base as i32), lane)
        }
    }
    #[inline(always)]
    fn add_u(a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: AVX-512F intrinsics on values (see the module doc).
        unsafe { _mm512_add_epi32(a, b) }
    }
    #[inline(always)]
    fn sub_u(a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: AVX-512F intrinsics on values (see the module doc).
        unsafe { _mm512_sub_epi32(a, b) }
    }
    #[inline(always)]
    fn xor_u(a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: AVX-512F intrinsics on values (see the module doc).
        unsafe { _mm512_xor_si512(a, b) }
    }
    #[inline(always)]
    fn and_u(a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: AVX-512F intrinsics on values (see the module doc).
        unsafe { _mm512_and_si512(a, b) }
    }
    #[inline(always)]
    fn or_u(a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: AVX-512F intrinsics on values (see the module doc).
        unsafe { _mm512_or_si512(a, b) }
    }
    #[inline(always)]
    fn mul_u(a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: AVX-512F intrinsics on values (see the module doc).
        unsafe { _mm512_mullo_epi32(a, b) }
    }
    #[inline(always)]
    fn shr_u<const N: i32>(a: __m512i) -> __m512i {
        // SAFETY: AVX-512F intrinsics on values (see the module doc).
        unsafe { _mm512_srlv_epi32(a, _mm512_set1_epi32(N)) }
    }
    #[inline(always)]
    fn sign_fill(a: __m512i) -> __m512i {
        // SAFETY: AVX-512F intrinsics on values (see the module doc).
        unsafe { _mm512_srai_epi32::<31>(a) }
    }
    #[inline(always)]
    fn gt_i32(a: __m512i, b: __m512i) -> __mmask16 {
        // SAFETY: AVX-512F intrinsics on values (see the module doc).
        unsafe { _mm512_cmpgt_epi32_mask(a, b) }
    }
    #[inline(always)]
    fn min_i32(a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: AVX-512F intrinsics on values (see the module doc).
        unsafe { _mm512_min_epi32(a, b) }
    }
    #[inline(always)]
    fn select_u(m: __mmask16, a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: AVX-512F intrinsics on values (see the module doc).
        unsafe { _mm512_mask_blend_epi32(m, b, a) }
    }
    #[inline(always)]
    fn cvt_i32(a: __m512i) -> __m512 {
        // SAFETY: AVX-512F intrinsics on values (see the module doc).
        unsafe { _mm512_cvtepi32_ps(a) }
    }
    #[inline(always)]
    fn to_bits(a: __m512) -> __m512i {
        // SAFETY: AVX-512F intrinsics on values (see the module doc).
        unsafe { _mm512_castps_si512(a) }
    }
    #[inline(always)]
    fn from_bits(a: __m512i) -> __m512 {
        // SAFETY: AVX-512F intrinsics on values (see the module doc).
        unsafe { _mm512_castsi512_ps(a) }
    }
    #[inline(always)]
    fn shl_u<const N: i32>(a: __m512i) -> __m512i {
        // SAFETY: AVX-512F intrinsics on values (see the module doc).
        unsafe { _mm512_sllv_epi32(a, _mm512_set1_epi32(N)) }
    }
    #[inline(always)]
    unsafe fn compress_store(p: *mut f32, m: __mmask16, v: __m512) -> usize {
        // SAFETY: `p` valid for 16 f32 writes (the caller's contract); AVX-512F (see the module doc).
        unsafe {
            // The register form: the memory form is slow on some cores.
            _mm512_storeu_ps(p, _mm512_maskz_compress_ps(m, v));
            // (popcnt is not among this level's features: a table.)
            (POPCOUNT8[(m & 0xff) as usize] + POPCOUNT8[(m >> 8) as usize]) as usize
        }
    }
}
