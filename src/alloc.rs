//! Allocations whose size follows the input (the candidates of a row, per-block scratch): they
//! fail with `OUT_OF_MEMORY`, naming what was being allocated, where `Vec`'s own growth would
//! abort the host process.
//!
//! Each reserves its final size up front, so the pushes that follow never reallocate.

use crate::error::{Error, ErrorKind, Result};

fn out_of_memory(what: &str, bytes: usize) -> Error {
    Error::new(ErrorKind::OutOfMemory, format!("{what}: cannot allocate {bytes} bytes"))
}

/// Makes room for `additional` more elements in `v`.
pub(crate) fn reserve<T>(v: &mut Vec<T>, additional: usize, what: &str) -> Result<()> {
    v.try_reserve_exact(additional).map_err(|_| out_of_memory(what, additional.saturating_mul(size_of::<T>())))
}

/// An empty vector with room for `n` elements.
pub(crate) fn with_capacity<T>(n: usize, what: &str) -> Result<Vec<T>> {
    let mut v = Vec::new();
    reserve(&mut v, n, what)?;
    Ok(v)
}

/// `n` copies of `value`.
pub(crate) fn filled<T: Clone>(n: usize, value: T, what: &str) -> Result<Vec<T>> {
    let mut v = with_capacity(n, what)?;
    v.resize(n, value);
    Ok(v)
}

/// The items, in a vector allocated once for the most the iterator says it can yield.
pub(crate) fn collect<T>(items: impl Iterator<Item = T>, what: &str) -> Result<Vec<T>> {
    let (low, high) = items.size_hint();
    let mut v = with_capacity(high.unwrap_or(low), what)?;
    v.extend(items);
    Ok(v)
}

/// Resizes `v` to `n` elements (new ones `value`).
pub(crate) fn resize<T: Clone>(v: &mut Vec<T>, n: usize, value: T, what: &str) -> Result<()> {
    reserve(v, n.saturating_sub(v.len()), what)?;
    v.resize(n, value);
    Ok(())
}

/// A buffer a thread keeps from one call for the next (see `draw::KEPT_PER_THREAD`): the bytes
/// it holds, and how to give it back.
pub(crate) struct Kept {
    pub bytes: usize,
    pub release: fn(),
}

/// [`Kept`] of a thread-local vector: its capacity in bytes (0 while it is borrowed, or once
/// the thread is exiting).
pub(crate) fn kept_vec<T>(key: &'static std::thread::LocalKey<std::cell::RefCell<Vec<T>>>, release: fn()) -> Kept {
    let bytes = key.try_with(|v| v.try_borrow().map_or(0, |v| v.capacity() * size_of::<T>())).unwrap_or(0);
    Kept { bytes, release }
}

/// Gives back a thread-local vector's storage (unless it is borrowed, or the thread exiting).
pub(crate) fn release_vec<T>(key: &'static std::thread::LocalKey<std::cell::RefCell<Vec<T>>>) {
    let _ = key.try_with(|v| v.try_borrow_mut().map(|mut v| *v = Vec::new()));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_impossible_size_is_an_error_not_an_abort() {
        let e = with_capacity::<u64>(usize::MAX / 4, "row 7: top-p candidates").unwrap_err();
        assert_eq!(e.kind, ErrorKind::OutOfMemory);
        assert!(e.message.starts_with("row 7: top-p candidates: cannot allocate"), "{}", e.message);
        let mut v = vec![1u8];
        assert!(resize(&mut v, usize::MAX, 0, "x").is_err());
        assert_eq!(v, [1]); // untouched
    }

    #[test]
    fn collect_allocates_once_for_the_bound() {
        let v = collect((0..100).filter(|x| x % 3 == 0), "t").unwrap();
        assert_eq!(v.len(), 34);
        assert_eq!(v.capacity(), 100);
    }
}
