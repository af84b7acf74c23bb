//! Outputs that share memory with an input or with each other are refused at the C boundary.
//!
//! In Rust a `&mut` output cannot alias an input; through C it can, and a draw would then read
//! values it has already overwritten (an `out` one row ahead of the logits gave wrong processed
//! values, silently). Each output array is compared, byte range against byte range, with every
//! input array of the call and every output array before it. The first overlap found is kept
//! and reported once the call's sizes are known to be right: a wrong row count makes arrays
//! overlap too, and its own message says more.

use super::convert::slice;
use crate::batch::Logits;
use crate::error::{Error, Owner, Result};
use std::mem::size_of_val;

/// The bytes one argument's array covers.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Region {
    owner: Owner,
    field: &'static str,
    start: usize,
    end: usize,
}

impl Region {
    /// The bytes of `s` (empty when `s` is).
    pub(crate) fn of<T>(owner: Owner, field: &'static str, s: &[T]) -> Region {
        let start = s.as_ptr() as usize;
        Region { owner, field, start, end: start + size_of_val(s) }
    }

    /// The bytes of an input array of the call (`None`: not given).
    pub(crate) fn input<T>(field: &'static str, s: Option<&[T]>) -> Option<Region> {
        s.map(|s| Region::of(Owner::Batch, field, s))
    }

    /// The bytes of the call's logits, whatever their dtype.
    pub(crate) fn logits(logits: Logits) -> Region {
        match logits {
            Logits::F32(s) => Region::of(Owner::Batch, "logits", s),
            Logits::Bf16(s) => Region::of(Owner::Batch, "logits", s),
            Logits::F16(s) => Region::of(Owner::Batch, "logits", s),
        }
    }

    fn overlaps(&self, other: &Region) -> bool {
        self.start < other.end && other.start < self.end
    }
}

/// The regions of a call's inputs and of the outputs taken so far.
pub(crate) struct Disjoint {
    taken: Vec<Region>,
    overlap: Option<Error>,
}

impl Disjoint {
    /// Starts from the call's input arrays (`None`: not given).
    pub(crate) fn new(inputs: impl IntoIterator<Item = Option<Region>>) -> Disjoint {
        Disjoint { taken: inputs.into_iter().flatten().filter(|r| r.start < r.end).collect(), overlap: None }
    }

    /// The first overlap found, naming both arrays.
    pub(crate) fn overlap(self) -> Option<Error> {
        self.overlap
    }

    /// Takes `r`, noting the first region taken before that it shares a byte with.
    fn take(&mut self, r: Region) {
        if r.start == r.end {
            return;
        }
        if let Some(t) = self.taken.iter().find(|t| t.overlaps(&r)).filter(|_| self.overlap.is_none()) {
            self.overlap = Some(Error::arg(
                r.owner,
                r.field,
                None,
                format!(
                    "overlaps {}.{} (bytes {:#x}..{:#x} and {:#x}..{:#x}): an output may share memory with no input \
                     and no other output",
                    t.owner.name(),
                    t.field,
                    r.start,
                    r.end,
                    t.start,
                    t.end
                ),
            ));
        }
        self.taken.push(r);
    }

    /// The output array at `ptr` (`len` elements, NULL for none) as a unique slice, once it is
    /// known to be a valid slice (as `convert::slice` checks); an overlap is noted.
    ///
    /// # Safety
    /// A non-NULL `ptr` covers `len` elements for `'a`, and nothing else uses them meanwhile.
    pub(crate) unsafe fn slice_mut<'a, T>(
        &mut self,
        owner: Owner,
        field: &'static str,
        ptr: *mut T,
        len: usize,
    ) -> Result<&'a mut [T]> {
        // SAFETY: as the caller's; checked as a shared slice first. (A call whose arrays
        // overlap is refused before anything is written through them.)
        unsafe {
            let shared: &[T] = slice(owner, field, ptr as *const T, len)?;
            self.take(Region::of(owner, field, shared));
            Ok(if ptr.is_null() { &mut [] } else { std::slice::from_raw_parts_mut(ptr, len) })
        }
    }

    /// [`Disjoint::slice_mut`], or `None` for a NULL pointer.
    ///
    /// # Safety
    /// As [`Disjoint::slice_mut`].
    pub(crate) unsafe fn opt_slice_mut<'a, T>(
        &mut self,
        owner: Owner,
        field: &'static str,
        ptr: *mut T,
        len: usize,
    ) -> Result<Option<&'a mut [T]>> {
        if ptr.is_null() {
            return Ok(None);
        }
        // SAFETY: as the caller's.
        unsafe { self.slice_mut(owner, field, ptr, len) }.map(Some)
    }
}
