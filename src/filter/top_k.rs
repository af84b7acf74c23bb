//! top-k: the k-th largest finite logit, ties kept.
//!
//! The k-th largest of the block maxima (from the first pass) is a lower bound of it, so only
//! the values above that bound, in the blocks whose maximum reaches it, are gathered and
//! selected (`select_nth_unstable`); when there are fewer blocks than k, every finite value is
//! gathered.

use crate::alloc;
use crate::error::Result;
use crate::kernels::BLOCK;
use crate::row::RowValues;

/// Descending order of finite f32 values.
fn desc(a: &f32, b: &f32) -> std::cmp::Ordering {
    b.total_cmp(a)
}

/// The finite values `>= lo` of the blocks whose maximum reaches `lo` (NaN and -inf never).
fn gather<V: RowValues + ?Sized>(v: &V, bmax: &[f32], lo: f32) -> Result<Vec<f32>> {
    let n = v.n();
    let mut out = alloc::with_capacity(super::room(bmax, lo, n), "top-k candidates")?;
    for (b, &bm) in bmax.iter().enumerate() {
        if !(bm >= lo && bm > f32::NEG_INFINITY) {
            continue;
        }
        for i in b * BLOCK..((b + 1) * BLOCK).min(n) {
            let x = v.at(i);
            if x >= lo && x > f32::NEG_INFINITY {
                out.push(x);
            }
        }
    }
    Ok(out)
}

/// The k-th largest finite value of the row (1 <= k) and a superset of the values `>=` it (all
/// finite), or `None` if the row has fewer than k finite values.
pub(super) fn kth_largest<V: RowValues + ?Sized>(v: &V, bmax: &[f32], k: usize) -> Result<Option<(f32, Vec<f32>)>> {
    let mut bm = alloc::collect(bmax.iter().copied().filter(|&b| b > f32::NEG_INFINITY), "top-k block maxima")?;
    let lo = if bm.len() >= k { *bm.select_nth_unstable_by(k - 1, desc).1 } else { f32::NEG_INFINITY };
    let cand = gather(v, bmax, lo)?;
    if cand.len() < k {
        return Ok(None);
    }
    let mut sel = alloc::collect(cand.iter().copied(), "top-k selection")?;
    let kth = *sel.select_nth_unstable_by(k - 1, desc).1;
    Ok(Some((kth, cand)))
}
