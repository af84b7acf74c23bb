//! The buffers the C ABI targets hand to the library: NULL, aligned or misaligned pointers over
//! plain numbers.

use super::one_in;
use arbitrary::{Result, Unstructured};
use std::mem::size_of;

/// A buffer of `T` handed to the library: NULL, aligned (exactly `len` elements, so that ASan
/// sees any access past them) or misaligned by one byte (`len + 1` elements, so that the
/// claimed `len` elements after the odd address are still inside it).
pub struct Buf<T> {
    pub v: Vec<T>,
    pub how: Ptr,
}

/// How a buffer is passed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Ptr {
    Null,
    Aligned,
    Misaligned,
}

impl<T: Copy> Buf<T> {
    /// A NULL buffer.
    pub fn null() -> Buf<T> {
        Buf { v: Vec::new(), how: Ptr::Null }
    }
    /// `len` elements, all `fill` (the extra one of a misaligned buffer too).
    pub fn new(how: Ptr, len: usize, fill: T) -> Buf<T> {
        let n = match how {
            Ptr::Null => 0,
            Ptr::Aligned => len,
            Ptr::Misaligned => len + 1,
        };
        Buf { v: vec![fill; n], how }
    }
    /// The elements `v` (none when NULL; a misaligned buffer repeats its last one).
    pub fn from_vec(how: Ptr, mut v: Vec<T>) -> Buf<T> {
        match how {
            Ptr::Null => v.clear(),
            Ptr::Aligned => {}
            Ptr::Misaligned => {
                if let Some(&x) = v.last() {
                    v.push(x);
                } else {
                    // An empty misaligned buffer still needs a byte to point into.
                    // SAFETY: T is one of the plain number types of the targets.
                    v.push(unsafe { std::mem::zeroed() });
                }
            }
        }
        Buf { v, how }
    }
    pub fn ptr(&self) -> *const T {
        match self.how {
            Ptr::Null => std::ptr::null(),
            Ptr::Aligned => self.v.as_ptr(),
            Ptr::Misaligned => (self.v.as_ptr() as *const u8).wrapping_add(1) as *const T,
        }
    }
    pub fn ptr_mut(&mut self) -> *mut T {
        self.ptr() as *mut T
    }
    pub fn given(&self) -> bool {
        self.how != Ptr::Null
    }
    /// A misaligned non-NULL pointer, which the library must refuse (u8 has no alignment).
    pub fn misaligned(&self) -> bool {
        self.how == Ptr::Misaligned && std::mem::align_of::<T>() > 1
    }
    /// The element at `i` as the library sees it (aligned buffers only).
    pub fn at(&self, i: usize) -> T {
        debug_assert!(self.how == Ptr::Aligned);
        self.v[i]
    }
    pub fn bytes(&self) -> Vec<u8> {
        // SAFETY: plain numbers, read as bytes.
        unsafe { std::slice::from_raw_parts(self.v.as_ptr() as *const u8, self.v.len() * size_of::<T>()) }.to_vec()
    }
}

/// Misaligned one time in 150, else NULL one time in `p_null`, else aligned.
pub fn pick_ptr(u: &mut Unstructured, p_null: u32) -> Result<Ptr> {
    Ok(if one_in(u, 150)? {
        Ptr::Misaligned
    } else if one_in(u, p_null)? {
        Ptr::Null
    } else {
        Ptr::Aligned
    })
}
