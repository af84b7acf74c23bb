//! What the fuzz targets share: the status codes, the last error, ASan's defaults, a small
//! PRNG, the half-precision conversions, pickers of interesting values, the buffers the C ABI
//! targets pass (`buf`) and their samplers (`sampler`).

#![allow(dead_code)]

pub mod buf;
pub mod sampler;

use arbitrary::{Result, Unstructured};
use std::ffi::{c_char, CStr};
use tokenrace::internals::api::tokenrace_last_error;
use tokenrace::internals::types::tokenrace_status;

/// ASan's defaults, built into every target so that a copied binary needs no environment:
/// an impossible allocation returns NULL (the library turns that into OUT_OF_MEMORY, which is
/// what the targets check) instead of aborting. `ASAN_OPTIONS` still overrides them.
#[no_mangle]
pub extern "C" fn __asan_default_options() -> *const c_char {
    c"allocator_may_return_null=1:detect_leaks=1:print_summary=1".as_ptr()
}

pub const OK: u32 = 0;
pub const INVALID_ARGUMENT: u32 = 1;
pub const INVALID_CONFIG: u32 = 2;
pub const OUT_OF_MEMORY: u32 = 3;
pub const INTERNAL: u32 = 4;
pub const UNSUPPORTED: u32 = 5;
pub const TIMEOUT: u32 = 6;
pub const CLOSED: u32 = 7;

/// The status as its C value, asserting that it is one of the documented codes and never
/// INTERNAL (a caught panic: "a bug in tokenrace").
pub fn code(s: tokenrace_status, call: &str) -> u32 {
    let c = s as u32;
    assert!(c <= CLOSED, "{call}: status {c} is not a documented tokenrace_status");
    assert!(c != INTERNAL, "{call}: INTERNAL (a caught panic): {}", last_error());
    c
}

/// The thread's last error.
pub fn last_error() -> String {
    // SAFETY: tokenrace_last_error returns a NUL-terminated string valid until the next call.
    unsafe { CStr::from_ptr(tokenrace_last_error()) }.to_string_lossy().into_owned()
}

/// After a call returned `status`: a failure has a message that starts with the function's name
/// (and is not just the name), a success clears it.
pub fn check_last_error(status: u32, call: &str) -> String {
    let e = last_error();
    if status == OK {
        assert!(e.is_empty(), "{call}: OK but the last error is {e:?}");
    } else {
        assert!(
            e.starts_with(&format!("{call}: ")) && e.len() > call.len() + 2,
            "{call}: status {status}, last error {e:?}"
        );
    }
    e
}

pub fn status_name(c: u32) -> &'static str {
    ["OK", "INVALID_ARGUMENT", "INVALID_CONFIG", "OUT_OF_MEMORY", "INTERNAL", "UNSUPPORTED", "TIMEOUT", "CLOSED"]
        .get(c as usize)
        .copied()
        .unwrap_or("?")
}

/// splitmix64, for filling large buffers from a few bytes of input.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in (0, 1).
    pub fn unit(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    /// Roughly normal (a sum of uniforms).
    pub fn normal(&mut self) -> f64 {
        (0..4).map(|_| self.unit()).sum::<f64>() * 1.7320508 - 3.4641016
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// bf16 by truncation (any bf16 will do: the fuzzer only needs values, not a rounding rule).
pub fn f32_to_bf16(x: f32) -> u16 {
    (x.to_bits() >> 16) as u16
}

/// IEEE binary16 to f32, exactly.
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h as u32) & 0x8000) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    let bits = match (exp, man) {
        (0, 0) => sign,
        (0, m) => {
            // Subnormal: m x 2^-24.
            let v = m as f32 * f32::from_bits(0x3380_0000); // 2^-24
            return if sign != 0 { -v } else { v };
        }
        (0x1f, 0) => sign | 0x7f80_0000,
        (0x1f, m) => sign | 0x7fc0_0000 | (m << 13),
        (e, m) => sign | ((e + 112) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

/// f32 to binary16 by truncation, with overflow to inf and NaN kept NaN.
pub fn f32_to_f16(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    if x.is_nan() {
        return sign | 0x7e00;
    }
    let a = x.abs();
    if a >= 65520.0 {
        return sign | 0x7c00;
    }
    if a < f32::from_bits(0x3380_0000) {
        return sign; // below the smallest subnormal
    }
    if a < 6.1035156e-5 {
        return sign | (a / f32::from_bits(0x3380_0000)) as u16;
    }
    let e = ((b >> 23) & 0xff) as i32 - 127 + 15;
    sign | ((e as u16) << 10) | ((b >> 13) & 0x3ff) as u16
}

/// Special f32 values: NaNs (with payloads and sign), infinities, the ends of the range, zeros,
/// subnormals.
pub fn special_f32(u: &mut Unstructured) -> Result<f32> {
    Ok(match u.int_in_range(0..=17u8)? {
        0 => f32::NAN,
        1 => -f32::NAN,
        2 => f32::from_bits(0x7f80_0001), // signalling NaN
        3 => f32::INFINITY,
        4 => f32::NEG_INFINITY,
        5 => f32::MAX,
        6 => -f32::MAX,
        7 => 1.7e38,
        8 => -1.7e38,
        9 => 0.0,
        10 => -0.0,
        11 => f32::MIN_POSITIVE,
        12 => f32::from_bits(1),
        13 => -f32::from_bits(1),
        14 => 65504.0, // f16's largest
        15 => 1.0,
        16 => -1e30,
        _ => f32::from_bits(u.arbitrary()?),
    })
}

/// `Ok(true)` with probability about 1/n; false once the input is used up (where
/// `int_in_range` returns its lower bound), so that short inputs take the common paths.
pub fn one_in(u: &mut Unstructured, n: u32) -> Result<bool> {
    Ok(u.int_in_range(0..=n - 1)? == n - 1)
}

/// With `FUZZ_VERBOSE` set, the targets print one line per input saying what it did (for
/// checking what a corpus exercises: `FUZZ_VERBOSE=1 ./<target> -runs=0 corpus/<target>`).
pub fn verbose() -> bool {
    static V: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *V.get_or_init(|| std::env::var_os("FUZZ_VERBOSE").is_some())
}

/// `n` floats read from `raw`'s bytes (little-endian, whole floats only), cycled; zeros when
/// `raw` holds less than one float.
pub fn cycled_f32(raw: &[u8], n: usize) -> Vec<f32> {
    if raw.len() < 4 {
        return vec![0.0; n];
    }
    (0..n)
        .map(|i| {
            let j = (i * 4) % (raw.len() & !3);
            f32::from_le_bytes([raw[j], raw[j + 1], raw[j + 2], raw[j + 3]])
        })
        .collect()
}

/// Elements spanned by `rows` rows of `vocab` elements of `elem` bytes, `stride` apart, or None
/// when that overflows the address space (as `batch::span` decides it).
pub fn span(rows: usize, vocab: usize, stride: u64, elem: usize) -> Option<usize> {
    if rows == 0 {
        return Some(0);
    }
    let n = (rows as u128 - 1) * stride as u128 + vocab as u128;
    (n <= usize::MAX as u128 && n * elem as u128 <= isize::MAX as u128).then_some(n as usize)
}

/// A C struct's bytes as a caller passes them: 8-aligned, 512 bytes (room past every struct).
#[repr(C, align(8))]
pub struct StructBytes(pub [u8; 512]);

/// `value` (a C struct of fewer than 512 bytes) in a buffer whose `struct_size` says `size`;
/// when `size` is past the struct, one time in six a nonzero byte past it (which a library that
/// does not know those bytes must refuse). Returns the buffer and whether that byte was set.
pub fn struct_bytes<T: Copy>(u: &mut Unstructured, value: T, size: usize) -> Result<(Box<StructBytes>, bool)> {
    let full = std::mem::size_of::<T>();
    let mut buf = Box::new(StructBytes([0u8; 512]));
    // SAFETY: T is a C struct of fewer than 512 bytes; the buffer is 8-aligned.
    unsafe { std::ptr::write(buf.0.as_mut_ptr() as *mut T, value) };
    buf.0[..4].copy_from_slice(&(size as u32).to_ne_bytes());
    let mut tail_set = false;
    if size > full && one_in(u, 6)? {
        let at = u.int_in_range(full..=size - 1)?;
        buf.0[at] = u.int_in_range(1..=255u8)?;
        tail_set = true;
    }
    Ok((buf, tail_set))
}
