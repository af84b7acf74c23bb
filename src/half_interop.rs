//! Interop with the `half` crate (the cargo feature `half`): its `bf16` and `f16` hold the same
//! 16 bits as the library's [`Bf16`] and [`F16`], so rows of them are passed as they are:
//!
//! ```ignore
//! let rows: &[half::bf16] = ...;
//! sampler.draw(&Batch::new(rows.into(), n_rows, vocab), &mut out)?;
//! ```
//!
//! The slice conversions borrow the caller's memory (no copy, no pass over it); the value
//! conversions are the bits, unchanged.

use crate::batch::Logits;
use crate::kernels::{Bf16, F16};
use half::slice::HalfFloatSliceExt;

/// The same bits as `Bf16`s, borrowed.
fn bf16_bits_as_library(bits: &[u16]) -> &[Bf16] {
    // SAFETY: `Bf16` is `#[repr(transparent)]` over `u16`, so the slices have one layout; the
    // result borrows `bits` for its lifetime.
    unsafe { std::slice::from_raw_parts(bits.as_ptr().cast::<Bf16>(), bits.len()) }
}

/// The same bits as `F16`s, borrowed.
fn f16_bits_as_library(bits: &[u16]) -> &[F16] {
    // SAFETY: `F16` is `#[repr(transparent)]` over `u16`, as above.
    unsafe { std::slice::from_raw_parts(bits.as_ptr().cast::<F16>(), bits.len()) }
}

impl Bf16 {
    /// `values` as the library's bfloat16, without a copy.
    pub fn from_half_slice(values: &[half::bf16]) -> &[Bf16] {
        bf16_bits_as_library(values.reinterpret_cast())
    }
}

impl F16 {
    /// `values` as the library's binary16, without a copy.
    pub fn from_half_slice(values: &[half::f16]) -> &[F16] {
        f16_bits_as_library(values.reinterpret_cast())
    }
}

impl From<half::bf16> for Bf16 {
    fn from(x: half::bf16) -> Bf16 {
        Bf16(x.to_bits())
    }
}

impl From<Bf16> for half::bf16 {
    fn from(x: Bf16) -> half::bf16 {
        half::bf16::from_bits(x.0)
    }
}

impl From<half::f16> for F16 {
    fn from(x: half::f16) -> F16 {
        F16(x.to_bits())
    }
}

impl From<F16> for half::f16 {
    fn from(x: F16) -> half::f16 {
        half::f16::from_bits(x.0)
    }
}

/// Rows of bfloat16 logits, borrowed: `Logits::Bf16`.
impl<'a> From<&'a [half::bf16]> for Logits<'a> {
    fn from(rows: &'a [half::bf16]) -> Logits<'a> {
        Logits::Bf16(Bf16::from_half_slice(rows))
    }
}

/// Rows of binary16 logits, borrowed: `Logits::F16`.
impl<'a> From<&'a [half::f16]> for Logits<'a> {
    fn from(rows: &'a [half::f16]) -> Logits<'a> {
        Logits::F16(F16::from_half_slice(rows))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{Batch, Output};
    use crate::config::Config;
    use crate::sampler::Sampler;

    /// Logits in [-8, 8) from a fixed sequence, as f32.
    fn logits(n: usize) -> Vec<f32> {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        (0..n)
            .map(|_| {
                state = crate::noise::splitmix64(state);
                (state >> 40) as f32 / (1u64 << 24) as f32 * 16.0 - 8.0
            })
            .collect()
    }

    #[test]
    fn slices_are_borrowed_not_copied() {
        let b = [half::bf16::from_f32(1.5), half::bf16::NEG_INFINITY];
        let h = [half::f16::from_f32(-2.25), half::f16::NAN];
        let (lb, lh) = (Bf16::from_half_slice(&b), F16::from_half_slice(&h));
        assert_eq!(lb.as_ptr() as usize, b.as_ptr() as usize);
        assert_eq!(lh.as_ptr() as usize, h.as_ptr() as usize);
        assert_eq!((lb[0].to_f32(), lb[1].to_f32()), (1.5, f32::NEG_INFINITY));
        assert_eq!(lh[0].to_f32(), -2.25);
        assert!(lh[1].to_f32().is_nan());
        assert!(matches!(Logits::from(&b[..]), Logits::Bf16(s) if s.len() == 2));
        assert!(matches!(Logits::from(&h[..]), Logits::F16(s) if s.len() == 2));
    }

    #[test]
    fn values_convert_bit_for_bit() {
        for bits in [0u16, 1, 0x3c00, 0x7bff, 0x7c00, 0x7e00, 0x8001, 0xfc00, 0xffff] {
            assert_eq!(Bf16::from(half::bf16::from_bits(bits)), Bf16(bits));
            assert_eq!(half::bf16::from(Bf16(bits)).to_bits(), bits);
            assert_eq!(F16::from(half::f16::from_bits(bits)), F16(bits));
            assert_eq!(half::f16::from(F16(bits)).to_bits(), bits);
        }
        // Both round f32 to nearest even alike.
        for x in logits(1000) {
            assert_eq!(Bf16::from(half::bf16::from_f32(x)), Bf16::from_f32(x), "{x}");
            assert_eq!(F16::from(half::f16::from_f32(x)), F16::from_f32(x), "{x}");
        }
    }

    /// Rows of `half` values draw the tokens of the same rows as the library's types.
    #[test]
    fn half_rows_draw_as_the_library_types_do() {
        let (rows, vocab) = (6, 257);
        let x = logits(rows * vocab);
        let sampler = Sampler::new(Config { threads: 1, ..Config::default() }).unwrap();
        let seeds: Vec<u64> = (0..rows as u64).collect();
        let draw = |logits: Logits| {
            let mut tokens = vec![0i32; rows];
            let batch = Batch { seeds: Some(&seeds), ..Batch::new(logits, rows, vocab) };
            sampler.draw(&batch, &mut Output::new(&mut tokens)).unwrap();
            tokens
        };
        let half_bf16: Vec<half::bf16> = x.iter().map(|&v| half::bf16::from_f32(v)).collect();
        let own_bf16: Vec<Bf16> = x.iter().map(|&v| Bf16::from_f32(v)).collect();
        assert_eq!(draw(half_bf16[..].into()), draw(Logits::Bf16(&own_bf16)));
        let half_f16: Vec<half::f16> = x.iter().map(|&v| half::f16::from_f32(v)).collect();
        let own_f16: Vec<F16> = x.iter().map(|&v| F16::from_f32(v)).collect();
        assert_eq!(draw(half_f16[..].into()), draw(Logits::F16(&own_f16)));
    }
}
