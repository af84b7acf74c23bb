//! top-k: the k-th largest finite logit, ties kept.
//!
//! The k-th largest of the block maxima (from the first pass) is a lower bound of it, so only
//! the values above that bound, in the blocks whose maximum reaches it, are gathered and
//! selected (`select_nth_unstable`); when there are fewer blocks than k, every finite value is
//! gathered.

use crate::alloc;
use crate::error::Result;
use crate::kernels::Kernels;
use crate::row::RowValues;

/// Descending order of finite f32 values.
fn desc(a: &f32, b: &f32) -> std::cmp::Ordering {
    b.total_cmp(a)
}

/// The finite values `>= lo` of the blocks whose maximum reaches `lo` (NaN and -inf never), in
/// row order: the SIMD gather of top-p (`gather_ge`, a compress-store a vector), from `-f32::MAX`
/// when `lo` is -inf, which keeps every finite value and no -inf.
pub(super) fn gather<V: RowValues + ?Sized>(k: &Kernels, v: &V, bmax: &[f32], lo: f32) -> Result<Vec<f32>> {
    let lo = lo.max(-f32::MAX);
    let mut out = alloc::with_capacity(super::room(bmax, lo, v.n()), "top-k candidates")?;
    // SAFETY: the row has n values and bmax one per block; `room` leaves the gather's slack.
    unsafe { (V::kernels(k).gather_ge)(v.ptr(), v.n(), bmax, lo, &mut out) };
    Ok(out)
}

/// The `top_k`-th largest finite value of the row (1 <= top_k) and a superset of the values
/// `>=` it (all finite), or `None` if the row has fewer than `top_k` finite values.
pub(super) fn kth_largest<V: RowValues + ?Sized>(
    k: &Kernels,
    v: &V,
    bmax: &[f32],
    top_k: usize,
) -> Result<Option<(f32, Vec<f32>)>> {
    let mut bm = alloc::collect(bmax.iter().copied().filter(|&b| b > f32::NEG_INFINITY), "top-k block maxima")?;
    let lo = if bm.len() >= top_k { *bm.select_nth_unstable_by(top_k - 1, desc).1 } else { f32::NEG_INFINITY };
    let cand = gather(k, v, bmax, lo)?;
    if cand.len() < top_k {
        return Ok(None);
    }
    let mut sel = alloc::collect(cand.iter().copied(), "top-k selection")?;
    let kth = *sel.select_nth_unstable_by(top_k - 1, desc).1;
    Ok(Some((kth, cand)))
}

/// [`kth_largest`] for a top-k that comes after a floor `at_least` (the floor is then
/// `max(at_least, kth)`): the candidates are only the values `>= max(lo, at_least)` (`lo` the
/// `top_k`-th largest block maximum), fewer blocks behind a high floor. When at least `top_k`
/// of them are gathered, the `top_k`-th largest of them is the row's; when fewer, the row's lies
/// below `at_least` (`lo` has `top_k` values at or above it), and `at_least` stands for it, with
/// the same floor. `None` as [`kth_largest`]: the row has fewer than `top_k` finite values.
pub(super) fn kth_largest_at_least<V: RowValues + ?Sized>(
    k: &Kernels,
    v: &V,
    bmax: &[f32],
    top_k: usize,
    at_least: f32,
) -> Result<Option<(f32, Vec<f32>)>> {
    let mut bm = alloc::collect(bmax.iter().copied().filter(|&b| b > f32::NEG_INFINITY), "top-k block maxima")?;
    if bm.len() < top_k || at_least == f32::NEG_INFINITY {
        // Blocks with a finite maximum hold a finite value each: with fewer, the row may hold
        // fewer than top_k finite values, which only the full gather tells.
        return kth_largest(k, v, bmax, top_k);
    }
    let lo = *bm.select_nth_unstable_by(top_k - 1, desc).1;
    let cand = gather(k, v, bmax, lo.max(at_least))?;
    if cand.len() < top_k {
        return Ok(Some((at_least, cand)));
    }
    let mut sel = alloc::collect(cand.iter().copied(), "top-k selection")?;
    let kth = *sel.select_nth_unstable_by(top_k - 1, desc).1;
    Ok(Some((kth, cand)))
}

/// Whether top-k keeps a token of finite logit `x`: fewer than `top_k` finite values lie above
/// it (then the `top_k`-th largest is at most `x`; ties with it are kept). `false` too when as
/// many blocks as `top_k` reach above `x` (each holds one such value).
pub(super) fn keeps(bmax: &[f32], top_k: usize, (x, values_ge): (f32, super::ValuesGe)) -> Result<bool> {
    let above = x.next_up();
    if above > f32::MAX {
        return Ok(true);
    }
    if bmax.iter().filter(|&&b| b >= above).count() >= top_k {
        return Ok(false);
    }
    Ok(values_ge(above)?.len() < top_k)
}
