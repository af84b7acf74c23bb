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
