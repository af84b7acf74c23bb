//! x86-64 AVX2 (+F16C for binary16 loads): 8 lanes, comparison results as all-ones lanes.
//!
//! # Safety
//! Every `unsafe` block here calls `core::arch` intrinsics of AVX2 and F16C (and of SSE/AVX,
//! which AVX2 implies), the features `avx2` and `f16c` of
//! [`SimdLevel::Avx2`](crate::SimdLevel::Avx2), and no others (no FMA, no POPCNT). They are sound
//! because [`Avx2`] implements the `unsafe trait` [`Simd`], whose contract `kernels/mod.rs`
//! keeps: these methods only run inside the level's `#[target_feature(enable = "avx2",
//! enable = "f16c")]` entry points, which are only handed out on a CPU that has both. The blocks
//! of the pointer methods also rely on the caller's pointer, as each says.

use crate::kernels::simd::Simd;
use std::arch::x86_64::*;

#[derive(Clone, Copy)]
pub(crate) struct Avx2;

// SAFETY: see the module doc: only AVX2/F16C instructions, no others, and the pointer methods touch
// the 8 elements at `p`.
unsafe impl Simd for Avx2 {
    const LANES: usize = 8;
    type F = __m256;
    type U = __m256i;
    type M = __m256;

    #[inline(always)]
    unsafe fn load_f32(p: *const f32) -> __m256 {
        // SAFETY: `p` valid for 8 f32 reads (the caller's contract); AVX2 (see the module doc).
        unsafe { _mm256_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const u16) -> __m256 {
        // SAFETY: `p` valid for 8 u16 reads (the caller's contract); AVX2 (see the module doc).
        unsafe {
            let h = _mm_loadu_si128(p as *const __m128i);
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
        }
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u16) -> __m256 {
        // SAFETY: `p` valid for 8 u16 reads (the caller's contract); AVX2 (see the module doc).
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m256) {
        // SAFETY: `p` valid for 8 f32 writes (the caller's contract); AVX2 (see the module doc).
        unsafe { _mm256_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn store_u(p: *mut u32, v: __m256i) {
        // SAFETY: `p` valid for 8 u32 writes (the caller's contract); AVX2 (see the module doc).
        unsafe { _mm256_storeu_si256(p as *mut __m256i, v) }
    }
    #[inline(always)]
    fn splat(x: f32) -> __m256 {
        // SAFETY: AVX2 intrinsics on values (see the module doc).
        unsafe { _mm256_set1_ps(x) }
    }
    #[inline(always)]
    fn add(a: __m256, b: __m256) -> __m256 {
        // SAFETY: AVX2 intrinsics on values (see the module doc).
        unsafe { _mm256_add_ps(a, b) }
    }
    #[inline(always)]
    fn sub(a: __m256, b: __m256) -> __m256 {
        // SAFETY: AVX2 intrinsics on values (see the module doc).
        unsafe { _mm256_sub_ps(a, b) }
    }
    #[inline(always)]
    fn mul(a: __m256, b: __m256) -> __m256 {
        // SAFETY: AVX2 intrinsics on values (see the module doc).
        unsafe { _mm256_mul_ps(a, b) }
    }
    #[inline(always)]
    fn div(a: __m256, b: __m256) -> __m256 {
        // SAFETY: AVX2 intrinsics on values (see the module doc).
        unsafe { _mm256_div_ps(a, b) }
    }
    #[inline(always)]
    fn max(x: __m256, acc: __m256) -> __m256 {
        // vmaxps returns its second operand when either is NaN or both are equal.
        // SAFETY: AVX2 intrinsics on values (see the module doc).
        unsafe { _mm256_max_ps(x, acc) }
    }
    #[inline(always)]
    fn ge(a: __m256, b: __m256) -> __m256 {
        // SAFETY: AVX2 intrinsics on values (see the module doc).
        unsafe { _mm256_cmp_ps::<_CMP_GE_OQ>(a, b) }
    }
    #[inline(always)]
    fn gt(a: __m256, b: __m256) -> __m256 {
        // SAFETY: AVX2 intrinsics on values (see the module doc).
        unsafe { _mm256_cmp_ps::<_CMP_GT_OQ>(a, b) }
    }
    #[inline(always)]
    fn eq(a: __m256, b: __m256) -> __m256 {
        // SAFETY: AVX2 intrinsics on values (see the module doc).
        unsafe { _mm256_cmp_ps::<_CMP_EQ_OQ>(a, b) }
    }
    #[inline(always)]
    fn lt(a: __m256, b: __m256) -> __m256 {
        // SAFETY: AVX2 intrinsics on values (see the module doc).
        unsafe { _mm256_cmp_ps::<_CMP_LT_OQ>(a, b) }
    }
    #[inline(always)]
    fn is_nan(a: __m256) -> __m256 {
        // SAFETY: AVX2 intrinsics on values (see the module doc).
        unsafe { _mm256_cmp_ps::<_CMP_UNORD_Q>(a, a) }
    }
    #[inline(always)]
    fn unord(a: __m256, b: __m256) -> __m256 {
        // SAFETY: AVX2 intrinsics on values (see the module doc).
        unsafe { _mm256_cmp_ps::<_CMP_UNORD_Q>(a, b) }
    }
    #[inline(always)]
    fn and_m(a: __m256, b: __m256) -> __m256 {
        // SAFETY: AVX2 intrinsics on values (see the module doc).
        unsafe { _mm256_and_ps(a, b) }
    }
    #[inline(always)]
    fn or_m(a: __m256, b: __m256) -> __m256 {
        // SAFETY: AVX2 intrinsics on values (see the module doc).
        unsafe { _mm256_or_ps(a, b) }
    }
    #[inline(always)]
    fn none() -> __m256 {
        // SAFETY: AVX2 intrinsics on values (see the module doc).
        unsafe { _mm256_setzero_ps() }
    }
    #[inline(always)]
    fn mask_bits(bits: u32) -> __m256 {
        // SAFETY: AVX2 intrinsics on values (see the module doc).
        unsafe {
            let lane_bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
            let set = _mm256_and_si256(_mm256_set1_epi32(bits as i32), lane_bit);
            _mm256_castsi256_ps(_mm256_cmpeq_epi32(set, lane_bit))
        }
    }
    #[inline(always)]
    fn mask_of_word(word: u32, first: u32) -> __m256 {
        // SAFETY: AVX2 intrinsics on values (see the module doc).
        unsafe {
            // Bit `first + j` of the word into lane j's sign bit (a variable shift left by
            // 31 - first - j), then spread over the lane. The broadcast of `word` is the same
            // for the four vectors of a word, so the scan pays it once a word, not once a vector.
            let shifts =
                _mm256_sub_epi32(_mm256_set1_epi32(31 - first as i32), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
            let top = _mm256_sllv_epi32(_mm256_set1_epi32(word as i32), shifts);
            _mm256_castsi256_ps(_mm256_srai_epi32::<31>(top))
        }
    }
    #[inline(always)]
    fn any(m: __m256) -> bool {
        // SAFETY: AVX2 intrinsics on values (see the module doc).
        unsafe { _mm256_movemask_ps(m) != 0 }
    }
    #[inline(always)]
    fn first(m: __m256) -> usize {
        // SAFETY: AVX2 intrinsics on values (see the module doc).
        unsafe { _mm256_movemask_ps(m).trailing_zeros() as usize }
    }
    #[inline(always)]
    fn bits_of(m: __m256) -> u32 {
        // SAFETY: AVX2 intrinsics on values (see the module doc).
        unsafe { _mm256_movemask_ps(m) as u32 }
    }
    #[inline(always)]
    fn select(m: __m256, a: __m256, b: __m256) -> __m256 {
        // SAFETY: AVX2 intrinsics on values (see the module doc).
        unsafe { _mm256_blendv_ps(b, a, m) }
    }
    #[inline(always)]
    fn reduce_max(v: __m256) -> f32 {
        // SAFETY: AVX2 intrinsics on values (see the module doc).
        unsafe {
            let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
            let m = _mm_max_ss(m, _mm_shuffle_ps::<1>(m, m));
            _mm_cvtss_f32(m)
        }
    }
    #[inline(always)]
    fn splat_u(x: u32) -> __m256i {
        // SAFETY: AVX2 intrinsics on values (see the module doc).
        unsafe { _mm256_set1_epi32(x as i32) }
    }
    #[inline(always)]
    fn iota_u(base: u32) -> __m256i {
        // SAFETY: AVX2 intrinsics on values (see the module doc).
        unsafe { _mm256_add_epi32(_mm256_set1_epi32(base as i32), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)) }
    }
    #[inline(always)]
    fn add_u(a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: AVX2 intrinsics on values (see the module doc).
        unsafe { _mm256_add_epi32(a, b) }
    }
    #[inline(always)]
    fn sub_u(a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: AVX2 intrinsics on values (see the module doc).
        unsafe { _mm256_sub_epi32(a, b) }
    }
    #[inline(always)]
    fn xor_u(a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: AVX2 intrinsics on values (see the module doc).
        unsafe { _mm256_xor_si256(a, b) }
    }
    #[inline(always)]
    fn and_u(a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: AVX2 intrinsics on values (see the module doc).
        unsafe { _mm256_and_si256(a, b) }
    }
    #[inline(always)]
    fn or_u(a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: AVX2 intrinsics on values (see the module doc).
        unsafe { _mm256_or_si256(a, b) }
    }
    #[inline(always)]
    fn mul_u(a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: AVX2 intrinsics on values (see the module doc).
        unsafe { _mm256_mullo_epi32(a, b) }
    }
    #[inline(always)]
    fn shr_u<const N: i32>(a: __m256i) -> __m256i {
        // SAFETY: AVX2 intrinsics on values (see the module doc).
        unsafe { _mm256_srli_epi32::<N>(a) }
    }
    #[inline(always)]
    fn sign_fill(a: __m256i) -> __m256i {
        // SAFETY: AVX2 intrinsics on values (see the module doc).
        unsafe { _mm256_srai_epi32::<31>(a) }
    }
    #[inline(always)]
    fn gt_i32(a: __m256i, b: __m256i) -> __m256 {
        // SAFETY: AVX2 intrinsics on values (see the module doc).
        unsafe { _mm256_castsi256_ps(_mm256_cmpgt_epi32(a, b)) }
    }
    #[inline(always)]
    fn min_i32(a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: AVX2 intrinsics on values (see the module doc).
        unsafe { _mm256_min_epi32(a, b) }
    }
    #[inline(always)]
    fn select_u(m: __m256, a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: AVX2 intrinsics on values (see the module doc).
        unsafe { _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(b), _mm256_castsi256_ps(a), m)) }
    }
    #[inline(always)]
    fn cvt_i32(a: __m256i) -> __m256 {
        // SAFETY: AVX2 intrinsics on values (see the module doc).
        unsafe { _mm256_cvtepi32_ps(a) }
    }
    #[inline(always)]
    fn to_bits(a: __m256) -> __m256i {
        // SAFETY: AVX2 intrinsics on values (see the module doc).
        unsafe { _mm256_castps_si256(a) }
    }
    #[inline(always)]
    fn from_bits(a: __m256i) -> __m256 {
        // SAFETY: AVX2 intrinsics on values (see the module doc).
        unsafe { _mm256_castsi256_ps(a) }
    }
    #[inline(always)]
    fn shl_u<const N: i32>(a: __m256i) -> __m256i {
        // SAFETY: AVX2 intrinsics on values (see the module doc).
        unsafe { _mm256_slli_epi32::<N>(a) }
    }
    #[inline(always)]
    unsafe fn compress_store(p: *mut f32, m: __m256, v: __m256) -> usize {
        // SAFETY: `p` valid for 8 f32 writes (the caller's contract); AVX2 (see the module doc).
        unsafe {
            let bits = _mm256_movemask_ps(m) as usize;
            let packed = _mm256_set1_epi32(COMPRESS[bits] as i32);
            let idx = _mm256_and_si256(
                _mm256_srlv_epi32(packed, _mm256_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21)),
                _mm256_set1_epi32(7),
            );
            _mm256_storeu_ps(p, _mm256_permutevar8x32_ps(v, idx));
            // (popcnt is not among this level's features: a table.)
            POPCOUNT8[bits] as usize
        }
    }
}

/// The number of bits set in each byte.
pub(crate) static POPCOUNT8: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = (i as u32).count_ones() as u8;
        i += 1;
    }
    t
};

/// For each 8-bit mask, the lanes it selects in order, as 3-bit fields (the rest 0).
static COMPRESS: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut m = 0;
    while m < 256 {
        let (mut packed, mut j, mut lane) = (0u32, 0, 0);
        while lane < 8 {
            if m & (1 << lane) != 0 {
                packed |= (lane as u32) << (3 * j);
                j += 1;
            }
            lane += 1;
        }
        t[m] = packed;
        m += 1;
    }
    t
};
