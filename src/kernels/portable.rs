//! The portable path: fixed-width arrays whose element-wise loops the compiler vectorises for
//! whatever the functions that instantiate it are compiled for. At the `portable` level that is
//! the target's baseline: SSE2 on x86-64, NEON on aarch64, and nothing on the default
//! `s390x-unknown-linux-gnu` target (z10: no vector facility, so portable is scalar code there
//! and `best_level` passes over it). The `neon` (aarch64) and `vxe2` (s390x) levels are this
//! same code under their `#[target_feature]`s, with a hand-written first pass
//! ([`FirstPass`]: `aarch64.rs`, `s390x.rs`).

use super::simd::{bf16_to_f32, f16_to_f32, Simd};
use std::marker::PhantomData;

/// The arrays of [`Portable`], `W` lanes (4 or 8), with the first pass of `H`.
pub(crate) struct PortableWith<H, const W: usize>(PhantomData<H>);

impl<H, const W: usize> Clone for PortableWith<H, W> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<H, const W: usize> Copy for PortableWith<H, W> {}

/// The portable level: arrays of 8 lanes with the generic first pass.
pub(crate) type Portable = PortableWith<Generic, 8>;

/// A level's own first pass over f32 ([`Simd::max_f32_any`]).
///
/// # Safety
/// As [`Simd`]: an implementation that executes instructions beyond the target's baseline may
/// only be used in a [`PortableWith`] instantiated in its level's `#[target_feature]` entry points;
/// `max_f32_any` keeps the contract of [`Simd::max_f32_any`].
pub(crate) unsafe trait FirstPass {
    const FAST: bool;
    /// Whether [`Simd::bits_of`] is a vector AND and an OR across lanes (the other form's
    /// per-lane shifts went lane by lane, through scalar compares, on s390x).
    const MASK_BY_AND: bool = false;
    /// [`Simd::max_f32_any`].
    ///
    /// # Safety
    /// As [`Simd::max_f32_any`].
    unsafe fn max_f32_any(p: *const f32, n: usize) -> f32;
}

/// No first pass of its own: the generic loops.
pub(crate) struct Generic;

// SAFETY: never called (FAST is false); plain Rust.
unsafe impl FirstPass for Generic {
    const FAST: bool = false;
    unsafe fn max_f32_any(_p: *const f32, _n: usize) -> f32 {
        f32::NAN
    }
}

/// A lane of a mask: all ones (true) or zero. Masks are `u32` lanes, as the vector units hold
/// them: `bool` lanes made the compiler pack and unpack every compare (the portable scan was
/// 6x its read floor on x86-64).
#[inline(always)]
fn lane(b: bool) -> u32 {
    (b as u32).wrapping_neg()
}

impl<H, const W: usize> PortableWith<H, W> {
    /// The mask of each byte of a token mask's bits, lane `j` set where bit `j` is: one load a
    /// vector. Computed per vector (a shift per lane), it was a page of constant shifts and
    /// shuffles on baseline x86-64, which has no per-lane shift: the masked scan ran at 3x the
    /// plain one.
    const MASKS: [[u32; W]; 256] = {
        let mut t = [[0u32; W]; 256];
        let mut b = 0;
        while b < 256 {
            let mut j = 0;
            while j < W {
                t[b][j] = if b >> j & 1 != 0 { u32::MAX } else { 0 };
                j += 1;
            }
            b += 1;
        }
        t
    };
    /// Lane `l`'s bit, `1 << l`.
    const BITS: [u32; W] = {
        let mut b = [0; W];
        let mut l = 0;
        while l < W {
            b[l] = 1 << l;
            l += 1;
        }
        b
    };
}

macro_rules! lanes {
    (|$i:ident| $e:expr) => {{
        let mut out = [Default::default(); W];
        for $i in 0..W {
            out[$i] = $e;
        }
        out
    }};
}

// SAFETY: plain Rust on arrays, no instruction-set feature beyond the target's baseline but
// those of the first pass `H` (see `FirstPass`); the unsafe methods touch the `W` elements at `p`.
unsafe impl<H: FirstPass, const W: usize> Simd for PortableWith<H, W> {
    const LANES: usize = W;
    const MAX_F32_ANY: bool = H::FAST;
    type F = [f32; W];
    type U = [u32; W];
    type M = [u32; W];

    #[inline(always)]
    unsafe fn load_f32(p: *const f32) -> [f32; W] {
        // SAFETY: `p` valid for W reads (the caller's contract).
        unsafe { (p as *const [f32; W]).read_unaligned() }
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const u16) -> [f32; W] {
        // SAFETY: `p` valid for W reads (the caller's contract).
        let h = unsafe { (p as *const [u16; W]).read_unaligned() };
        lanes!(|i| bf16_to_f32(h[i]))
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u16) -> [f32; W] {
        // SAFETY: `p` valid for W reads (the caller's contract).
        let h = unsafe { (p as *const [u16; W]).read_unaligned() };
        lanes!(|i| f16_to_f32(h[i]))
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: [f32; W]) {
        // SAFETY: `p` valid for W writes (the caller's contract).
        unsafe { (p as *mut [f32; W]).write_unaligned(v) }
    }
    #[inline(always)]
    unsafe fn store_u(p: *mut u32, v: [u32; W]) {
        // SAFETY: `p` valid for W writes (the caller's contract).
        unsafe { (p as *mut [u32; W]).write_unaligned(v) }
    }
    #[inline(always)]
    fn splat(x: f32) -> [f32; W] {
        [x; W]
    }
    #[inline(always)]
    fn add(a: [f32; W], b: [f32; W]) -> [f32; W] {
        lanes!(|i| a[i] + b[i])
    }
    #[inline(always)]
    fn sub(a: [f32; W], b: [f32; W]) -> [f32; W] {
        lanes!(|i| a[i] - b[i])
    }
    #[inline(always)]
    fn mul(a: [f32; W], b: [f32; W]) -> [f32; W] {
        lanes!(|i| a[i] * b[i])
    }
    #[inline(always)]
    fn div(a: [f32; W], b: [f32; W]) -> [f32; W] {
        lanes!(|i| a[i] / b[i])
    }
    #[inline(always)]
    fn max(x: [f32; W], acc: [f32; W]) -> [f32; W] {
        lanes!(|i| if x[i] > acc[i] { x[i] } else { acc[i] })
    }
    #[inline(always)]
    fn ge(a: [f32; W], b: [f32; W]) -> [u32; W] {
        lanes!(|i| lane(a[i] >= b[i]))
    }
    #[inline(always)]
    fn gt(a: [f32; W], b: [f32; W]) -> [u32; W] {
        lanes!(|i| lane(a[i] > b[i]))
    }
    #[inline(always)]
    fn eq(a: [f32; W], b: [f32; W]) -> [u32; W] {
        lanes!(|i| lane(a[i] == b[i]))
    }
    #[inline(always)]
    fn lt(a: [f32; W], b: [f32; W]) -> [u32; W] {
        lanes!(|i| lane(a[i] < b[i]))
    }
    #[inline(always)]
    fn is_nan(a: [f32; W]) -> [u32; W] {
        lanes!(|i| lane(a[i].is_nan()))
    }
    #[inline(always)]
    fn unord(a: [f32; W], b: [f32; W]) -> [u32; W] {
        lanes!(|i| lane(a[i].is_nan() | b[i].is_nan()))
    }
    #[inline(always)]
    fn and_m(a: [u32; W], b: [u32; W]) -> [u32; W] {
        lanes!(|i| a[i] & b[i])
    }
    #[inline(always)]
    fn or_m(a: [u32; W], b: [u32; W]) -> [u32; W] {
        lanes!(|i| a[i] | b[i])
    }
    #[inline(always)]
    fn none() -> [u32; W] {
        [0; W]
    }
    #[inline(always)]
    fn mask_bits(bits: u32) -> [u32; W] {
        Self::MASKS[(bits & 0xff) as usize]
    }
    #[inline(always)]
    fn any(m: [u32; W]) -> bool {
        m.iter().fold(0, |a, &b| a | b) != 0
    }
    #[inline(always)]
    fn first(m: [u32; W]) -> usize {
        if H::MASK_BY_AND {
            Self::bits_of(m).trailing_zeros() as usize % W
        } else {
            m.iter().position(|&b| b != 0).unwrap_or(0)
        }
    }
    #[inline(always)]
    fn bits_of(m: [u32; W]) -> u32 {
        if H::MASK_BY_AND {
            // A vector AND with the lanes' bits and an OR across lanes, which the compiler keeps
            // in vector registers (the shifts of the other form went lane by lane on s390x).
            lanes!(|i| m[i] & Self::BITS[i]).iter().fold(0, |a, &b| a | b)
        } else {
            m.iter().enumerate().fold(0, |a, (l, &b)| a | (b & 1) << l)
        }
    }
    #[inline(always)]
    fn select(m: [u32; W], a: [f32; W], b: [f32; W]) -> [f32; W] {
        // Bitwise, as a vector unit blends: the same values as a lane-wise choice.
        lanes!(|i| f32::from_bits(a[i].to_bits() & m[i] | b[i].to_bits() & !m[i]))
    }
    #[inline(always)]
    fn reduce_max(v: [f32; W]) -> f32 {
        v.iter().fold(f32::NEG_INFINITY, |acc, &x| if x > acc { x } else { acc })
    }
    #[inline(always)]
    fn splat_u(x: u32) -> [u32; W] {
        [x; W]
    }
    #[inline(always)]
    fn iota_u(base: u32) -> [u32; W] {
        lanes!(|i| base.wrapping_add(i as u32))
    }
    #[inline(always)]
    fn add_u(a: [u32; W], b: [u32; W]) -> [u32; W] {
        lanes!(|i| a[i].wrapping_add(b[i]))
    }
    #[inline(always)]
    fn sub_u(a: [u32; W], b: [u32; W]) -> [u32; W] {
        lanes!(|i| a[i].wrapping_sub(b[i]))
    }
    #[inline(always)]
    fn xor_u(a: [u32; W], b: [u32; W]) -> [u32; W] {
        lanes!(|i| a[i] ^ b[i])
    }
    #[inline(always)]
    fn and_u(a: [u32; W], b: [u32; W]) -> [u32; W] {
        lanes!(|i| a[i] & b[i])
    }
    #[inline(always)]
    fn or_u(a: [u32; W], b: [u32; W]) -> [u32; W] {
        lanes!(|i| a[i] | b[i])
    }
    #[inline(always)]
    fn mul_u(a: [u32; W], b: [u32; W]) -> [u32; W] {
        lanes!(|i| a[i].wrapping_mul(b[i]))
    }
    #[inline(always)]
    fn shr_u<const N: i32>(a: [u32; W]) -> [u32; W] {
        lanes!(|i| a[i] >> N)
    }
    #[inline(always)]
    fn sign_fill(a: [u32; W]) -> [u32; W] {
        lanes!(|i| ((a[i] as i32) >> 31) as u32)
    }
    #[inline(always)]
    fn gt_i32(a: [u32; W], b: [u32; W]) -> [u32; W] {
        lanes!(|i| lane((a[i] as i32) > (b[i] as i32)))
    }
    #[inline(always)]
    fn min_i32(a: [u32; W], b: [u32; W]) -> [u32; W] {
        lanes!(|i| (a[i] as i32).min(b[i] as i32) as u32)
    }
    #[inline(always)]
    fn select_u(m: [u32; W], a: [u32; W], b: [u32; W]) -> [u32; W] {
        lanes!(|i| a[i] & m[i] | b[i] & !m[i])
    }
    #[inline(always)]
    fn cvt_i32(a: [u32; W]) -> [f32; W] {
        lanes!(|i| a[i] as i32 as f32)
    }
    #[inline(always)]
    fn to_bits(a: [f32; W]) -> [u32; W] {
        lanes!(|i| a[i].to_bits())
    }
    #[inline(always)]
    fn from_bits(a: [u32; W]) -> [f32; W] {
        lanes!(|i| f32::from_bits(a[i]))
    }
    #[inline(always)]
    fn shl_u<const N: i32>(a: [u32; W]) -> [u32; W] {
        lanes!(|i| a[i] << N)
    }
    #[inline(always)]
    unsafe fn compress_store(p: *mut f32, m: [u32; W], v: [f32; W]) -> usize {
        let mut j = 0;
        for i in 0..W {
            // SAFETY: j <= i < W, and `p` is valid for W writes (the caller's contract).
            unsafe { p.add(j).write_unaligned(v[i]) };
            j += (m[i] & 1) as usize;
        }
        j
    }
    #[inline(always)]
    unsafe fn max_f32_any(p: *const f32, n: usize) -> f32 {
        // SAFETY: forwarded (the caller's contract; `H` usable where `Self` is).
        unsafe { H::max_f32_any(p, n) }
    }
}
