//! The vector abstraction that every kernel is written against, and its one-lane implementation.
//!
//! Each instruction set implements [`Simd`]; the algorithms in `generic/` are written once over
//! it. Because every path runs the same sequence of IEEE-754 operations per element (no FMA, no
//! reassociation of anything but `max`), every path computes bit-identical keys and therefore the
//! same tokens. [`Scalar`] (one lane) is the reference and also handles the tails of rows.

/// Operations on a vector of `LANES` f32 (`F`), a vector of `LANES` u32 (`U`), and a lane mask (`M`).
///
/// # Safety
/// The methods of an implementation for an instruction set execute its instructions, safe
/// methods included: they may only run on a CPU with its level's features
/// ([`SimdLevel::target_features`](super::SimdLevel::target_features)), inside a function
/// compiled with them enabled. The crate does not check that per call; `kernels/mod.rs` keeps it
/// by construction: those implementations are private to `kernels`, instantiated only in the
/// `#[target_feature]` entry points of `kernel_table!`, and those are reachable only through the
/// table that `kernels(level)` builds after checking `level.is_supported()`. [`Scalar`] and
/// `Portable` need no feature and run anywhere.
///
/// An implementation promises: its instructions are those of its level and no others; its
/// `unsafe` methods touch only the memory their docs name; `LANES` is its lane count (at most
/// 64, a divisor of 16); and it sets `GATHER_IN_MASS_PASS` only with 16 lanes.
pub(crate) unsafe trait Simd: Copy {
    const LANES: usize;
    /// Whether `mass_gather` gathers the values of a full block during its mass pass (one read
    /// of the block) rather than in a pass of their own. Only right with `LANES == 16` (checked
    /// at compile time): the mass pass reads a block as 16 rows of 16 values, and only a vector
    /// as wide as a row visits the values in index order, as the gather must. Worth it where
    /// `compress_store` is one instruction (AVX-512).
    const GATHER_IN_MASS_PASS: bool = false;
    type F: Copy;
    type U: Copy;
    type M: Copy;

    unsafe fn load_f32(p: *const f32) -> Self::F;
    /// bfloat16 bits to f32 (exact).
    unsafe fn load_bf16(p: *const u16) -> Self::F;
    /// IEEE binary16 bits to f32 (exact).
    unsafe fn load_f16(p: *const u16) -> Self::F;
    unsafe fn store(p: *mut f32, v: Self::F);
    unsafe fn store_u(p: *mut u32, v: Self::U);

    fn splat(x: f32) -> Self::F;
    fn add(a: Self::F, b: Self::F) -> Self::F;
    fn sub(a: Self::F, b: Self::F) -> Self::F;
    fn mul(a: Self::F, b: Self::F) -> Self::F;
    fn div(a: Self::F, b: Self::F) -> Self::F;
    /// Per lane `if x > acc { x } else { acc }`: a NaN in `x` is ignored (x86 `maxps(x, acc)`).
    fn max(x: Self::F, acc: Self::F) -> Self::F;
    fn ge(a: Self::F, b: Self::F) -> Self::M;
    fn gt(a: Self::F, b: Self::F) -> Self::M;
    fn eq(a: Self::F, b: Self::F) -> Self::M;
    fn lt(a: Self::F, b: Self::F) -> Self::M;
    fn is_nan(a: Self::F) -> Self::M;
    /// Lanes where `a` or `b` is NaN.
    fn unord(a: Self::F, b: Self::F) -> Self::M;
    fn and_m(a: Self::M, b: Self::M) -> Self::M;
    fn or_m(a: Self::M, b: Self::M) -> Self::M;
    fn none() -> Self::M;
    /// The mask whose lane `j` is bit `j` of `bits` (bits from `LANES` on are ignored): a
    /// vector's bits of a token mask.
    fn mask_bits(bits: u32) -> Self::M;
    /// The mask of the `LANES` bits of `word` from bit `first` (a multiple of `LANES`, below
    /// 32): `mask_bits(word >> first)`. A level may build it from one broadcast of `word`,
    /// which the vectors of one word then share.
    #[inline(always)]
    fn mask_of_word(word: u32, first: u32) -> Self::M {
        Self::mask_bits(word >> first)
    }
    fn any(m: Self::M) -> bool;
    /// The lowest set lane of a non-empty mask.
    fn first(m: Self::M) -> usize;
    /// The mask as bits, lane `l` at bit `l` (the inverse of [`Simd::mask_bits`]).
    fn bits_of(m: Self::M) -> u32;
    /// Per lane `if m { a } else { b }`.
    fn select(m: Self::M, a: Self::F, b: Self::F) -> Self::F;
    /// Per lane `if m { max(x, acc) } else { acc }`: `max(select(m, x, -inf), acc)`, lane for
    /// lane (the masked scan's step), which a level may do in one instruction.
    #[inline(always)]
    fn max_where(m: Self::M, x: Self::F, acc: Self::F) -> Self::F {
        Self::max(Self::select(m, x, Self::splat(f32::NEG_INFINITY)), acc)
    }
    /// The largest lane; lanes are never NaN where this is used.
    fn reduce_max(v: Self::F) -> f32;

    fn splat_u(x: u32) -> Self::U;
    /// `base + lane` in each lane.
    fn iota_u(base: u32) -> Self::U;
    fn add_u(a: Self::U, b: Self::U) -> Self::U;
    fn sub_u(a: Self::U, b: Self::U) -> Self::U;
    fn xor_u(a: Self::U, b: Self::U) -> Self::U;
    fn and_u(a: Self::U, b: Self::U) -> Self::U;
    fn or_u(a: Self::U, b: Self::U) -> Self::U;
    /// Low 32 bits of the product.
    fn mul_u(a: Self::U, b: Self::U) -> Self::U;
    fn shr_u<const N: i32>(a: Self::U) -> Self::U;
    /// Arithmetic shift right by 31: all ones where the top bit is set.
    fn sign_fill(a: Self::U) -> Self::U;
    /// Signed `a > b`.
    fn gt_i32(a: Self::U, b: Self::U) -> Self::M;
    /// Signed minimum.
    fn min_i32(a: Self::U, b: Self::U) -> Self::U;
    fn select_u(m: Self::M, a: Self::U, b: Self::U) -> Self::U;
    /// Lanes read as i32, converted to f32 with round-to-nearest-even.
    fn cvt_i32(a: Self::U) -> Self::F;
    fn to_bits(a: Self::F) -> Self::U;
    fn from_bits(a: Self::U) -> Self::F;

    // Added for the probability-mass kernels.
    fn shl_u<const N: i32>(a: Self::U) -> Self::U;
    /// Writes the lanes of `v` that `m` selects, in lane order, at `p` (writing up to `LANES`
    /// values there); returns how many `m` selects.
    unsafe fn compress_store(p: *mut f32, m: Self::M, v: Self::F) -> usize;

    /// Whether greedy rows on one thread go two at a time, read in turn
    /// ([`top_block_pair`](super::generic::top_block_pair)): on a level with 32 vector
    /// registers, two streams of reads in flight read 64 rows of 163840 7% faster on one core
    /// (2-core VM, AVX-512, against one row at a time; both passes one after the other before
    /// the token searches: 1-3%). With 16 (AVX2) the two rows' accumulators spill (6-24%
    /// slower interleaved, and one pass after the other was no faster than one row at a time),
    /// so such a level draws one row at a time.
    const INTERLEAVE_ROWS: bool = false;
    /// Whether the plain first pass over f32 tries [`Simd::max_f32_any`] on each block before
    /// its exact loop (a level whose compiler leaves that loop scalar: s390x, aarch64).
    const MAX_F32_ANY: bool = false;
    /// The `n` f32 values at `p` (`n` a multiple of 32, at least 32), reduced with a
    /// NaN-propagating maximum in any order: their maximum when no value is NaN and the
    /// maximum is not a zero (a unique bit pattern, the same as the exact `x > acc` loop's),
    /// NaN when a value is NaN, and a zero of either sign when the maximum is a zero. The first
    /// pass takes the result only when it is neither NaN nor a zero, and otherwise runs its exact
    /// loop over the same values, so every level still computes bit-identical block maxima.
    ///
    /// # Safety
    /// `p` valid for `n` reads; `Self` usable here.
    #[inline(always)]
    unsafe fn max_f32_any(p: *const f32, n: usize) -> f32 {
        let mut m = f32::NEG_INFINITY;
        for i in 0..n {
            // SAFETY: i < n (the caller's contract).
            let x = unsafe { p.add(i).read_unaligned() };
            m = if x.is_nan() || m.is_nan() { f32::NAN } else { m.max(x) };
        }
        m
    }
}

/// One lane: the reference implementation, also used for the tails of rows.
#[derive(Clone, Copy)]
pub(crate) struct Scalar;

/// Exact IEEE binary16 to f32 conversion.
#[inline(always)]
pub(crate) fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h & 0x8000) as u32) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    let bits = match exp {
        0 => (man as f32 * (1.0 / 16_777_216.0)).to_bits(), // zero or subnormal: man * 2^-24, exact
        31 => 0x7f80_0000 | (man << 13),                    // inf or NaN
        _ => ((exp + 112) << 23) | (man << 13),
    };
    f32::from_bits(sign | bits)
}

#[inline(always)]
pub(crate) fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

// SAFETY: plain Rust on one lane, no instruction-set feature needed; the unsafe methods touch
// one element at `p`.
unsafe impl Simd for Scalar {
    const LANES: usize = 1;
    type F = f32;
    type U = u32;
    type M = bool;

    #[inline(always)]
    unsafe fn load_f32(p: *const f32) -> f32 {
        // SAFETY: `p` valid for one read (the caller's contract).
        unsafe { p.read_unaligned() }
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const u16) -> f32 {
        // SAFETY: `p` valid for one read (the caller's contract).
        unsafe { bf16_to_f32(p.read_unaligned()) }
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u16) -> f32 {
        // SAFETY: `p` valid for one read (the caller's contract).
        unsafe { f16_to_f32(p.read_unaligned()) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: f32) {
        // SAFETY: `p` valid for one write (the caller's contract).
        unsafe { p.write_unaligned(v) }
    }
    #[inline(always)]
    unsafe fn store_u(p: *mut u32, v: u32) {
        // SAFETY: `p` valid for one write (the caller's contract).
        unsafe { p.write_unaligned(v) }
    }
    #[inline(always)]
    fn splat(x: f32) -> f32 {
        x
    }
    #[inline(always)]
    fn add(a: f32, b: f32) -> f32 {
        a + b
    }
    #[inline(always)]
    fn sub(a: f32, b: f32) -> f32 {
        a - b
    }
    #[inline(always)]
    fn mul(a: f32, b: f32) -> f32 {
        a * b
    }
    #[inline(always)]
    fn div(a: f32, b: f32) -> f32 {
        a / b
    }
    #[inline(always)]
    fn max(x: f32, acc: f32) -> f32 {
        if x > acc {
            x
        } else {
            acc
        }
    }
    #[inline(always)]
    fn ge(a: f32, b: f32) -> bool {
        a >= b
    }
    #[inline(always)]
    fn gt(a: f32, b: f32) -> bool {
        a > b
    }
    #[inline(always)]
    fn eq(a: f32, b: f32) -> bool {
        a == b
    }
    #[inline(always)]
    fn lt(a: f32, b: f32) -> bool {
        a < b
    }
    #[inline(always)]
    fn is_nan(a: f32) -> bool {
        a.is_nan()
    }
    #[inline(always)]
    fn unord(a: f32, b: f32) -> bool {
        a.is_nan() | b.is_nan()
    }
    #[inline(always)]
    fn and_m(a: bool, b: bool) -> bool {
        a & b
    }
    #[inline(always)]
    fn or_m(a: bool, b: bool) -> bool {
        a | b
    }
    #[inline(always)]
    fn none() -> bool {
        false
    }
    #[inline(always)]
    fn mask_bits(bits: u32) -> bool {
        bits & 1 != 0
    }
    #[inline(always)]
    fn any(m: bool) -> bool {
        m
    }
    #[inline(always)]
    fn first(_m: bool) -> usize {
        0
    }
    #[inline(always)]
    fn bits_of(m: bool) -> u32 {
        m as u32
    }
    #[inline(always)]
    fn select(m: bool, a: f32, b: f32) -> f32 {
        if m {
            a
        } else {
            b
        }
    }
    #[inline(always)]
    fn reduce_max(v: f32) -> f32 {
        v
    }
    #[inline(always)]
    fn splat_u(x: u32) -> u32 {
        x
    }
    #[inline(always)]
    fn iota_u(base: u32) -> u32 {
        base
    }
    #[inline(always)]
    fn add_u(a: u32, b: u32) -> u32 {
        a.wrapping_add(b)
    }
    #[inline(always)]
    fn sub_u(a: u32, b: u32) -> u32 {
        a.wrapping_sub(b)
    }
    #[inline(always)]
    fn xor_u(a: u32, b: u32) -> u32 {
        a ^ b
    }
    #[inline(always)]
    fn and_u(a: u32, b: u32) -> u32 {
        a & b
    }
    #[inline(always)]
    fn or_u(a: u32, b: u32) -> u32 {
        a | b
    }
    #[inline(always)]
    fn mul_u(a: u32, b: u32) -> u32 {
        a.wrapping_mul(b)
    }
    #[inline(always)]
    fn shr_u<const N: i32>(a: u32) -> u32 {
        a >> N
    }
    #[inline(always)]
    fn sign_fill(a: u32) -> u32 {
        ((a as i32) >> 31) as u32
    }
    #[inline(always)]
    fn gt_i32(a: u32, b: u32) -> bool {
        (a as i32) > (b as i32)
    }
    #[inline(always)]
    fn min_i32(a: u32, b: u32) -> u32 {
        (a as i32).min(b as i32) as u32
    }
    #[inline(always)]
    fn select_u(m: bool, a: u32, b: u32) -> u32 {
        if m {
            a
        } else {
            b
        }
    }
    #[inline(always)]
    fn cvt_i32(a: u32) -> f32 {
        a as i32 as f32
    }
    #[inline(always)]
    fn to_bits(a: f32) -> u32 {
        a.to_bits()
    }
    #[inline(always)]
    fn from_bits(a: u32) -> f32 {
        f32::from_bits(a)
    }
    #[inline(always)]
    fn shl_u<const N: i32>(a: u32) -> u32 {
        a << N
    }
    #[inline(always)]
    unsafe fn compress_store(p: *mut f32, m: bool, v: f32) -> usize {
        // SAFETY: `p` valid for one write (the caller's contract).
        unsafe { p.write_unaligned(v) };
        m as usize
    }
}

/// A logits element type: f32, bfloat16 or float16 bits.
pub(crate) trait Elem: Copy + Send + Sync + 'static {
    /// Loads `S::LANES` elements as f32.
    ///
    /// # Safety
    /// `p` must be valid for `S::LANES` reads, and `S` usable in the calling context.
    unsafe fn load<S: Simd>(p: *const Self) -> S::F;
    /// Whether the type is `f32` (the first pass's [`Simd::max_f32_any`] reads f32 only).
    const IS_F32: bool = false;
}

/// A bfloat16 value, as its bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(transparent)]
pub struct Bf16(pub u16);

/// An IEEE binary16 value, as its bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(transparent)]
pub struct F16(pub u16);

impl Elem for f32 {
    const IS_F32: bool = true;
    #[inline(always)]
    unsafe fn load<S: Simd>(p: *const f32) -> S::F {
        // SAFETY: forwarded (the caller's contract).
        unsafe { S::load_f32(p) }
    }
}
impl Elem for Bf16 {
    #[inline(always)]
    unsafe fn load<S: Simd>(p: *const Bf16) -> S::F {
        // SAFETY: forwarded (the caller's contract); the element types are `u16`-sized bits.
        unsafe { S::load_bf16(p as *const u16) }
    }
}
impl Elem for F16 {
    #[inline(always)]
    unsafe fn load<S: Simd>(p: *const F16) -> S::F {
        // SAFETY: forwarded (the caller's contract); the element types are `u16`-sized bits.
        unsafe { S::load_f16(p as *const u16) }
    }
}

impl Bf16 {
    /// The value as f32 (exact: every bfloat16 is an f32).
    pub fn to_f32(self) -> f32 {
        bf16_to_f32(self.0)
    }
    /// Round-to-nearest-even conversion (NaN stays NaN).
    pub fn from_f32(x: f32) -> Bf16 {
        if x.is_nan() {
            return Bf16(0x7fc0);
        }
        let b = x.to_bits();
        Bf16(((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16)
    }
}

impl F16 {
    /// The value as f32 (exact: every binary16 is an f32).
    pub fn to_f32(self) -> f32 {
        f16_to_f32(self.0)
    }
    /// Round-to-nearest-even conversion, for tests and tools.
    pub fn from_f32(x: f32) -> F16 {
        let b = x.to_bits();
        let sign = ((b >> 16) & 0x8000) as u16;
        if x.is_nan() {
            return F16(sign | 0x7e00);
        }
        let a = x.abs();
        if a >= 65520.0 {
            return F16(sign | 0x7c00);
        }
        if a < 6.103_515_6e-5 {
            // subnormal range: multiples of 2^-24, rounded to nearest even by the f32 arithmetic
            let m = (a * 16_777_216.0).round_ties_even() as u16;
            return F16(sign | m);
        }
        let e = ((a.to_bits() >> 23) as i32) - 127;
        let man = a.to_bits() & 0x7f_ffff;
        let mut h = (((e + 15) as u32) << 10) | (man >> 13);
        let rest = man & 0x1fff;
        if rest > 0x1000 || (rest == 0x1000 && (h & 1) == 1) {
            h += 1;
        }
        F16(sign | h as u16)
    }
}
