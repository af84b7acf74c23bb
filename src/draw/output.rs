//! What a draw call writes, computed before anything is written: the logprob outputs of every
//! row ([`Logprobs`], filled through [`LogprobSlots`] by the tasks that draw the rows) and the
//! full-vocabulary output ([`write_full`], from the rows' processed values in [`Processed`]).

use crate::alloc;
use crate::batch::{Batch, FullMode, LogprobMode, Output};
use crate::error::Result;
use crate::kernels::{Kernels, BLOCK};
use crate::logprob::{block_maxima, logprob_fn, row_logprobs_given, scale_and_floor, GivenOut, RowInfo, RowOut};
use crate::row::{with_row, RowValues};
use crate::step::RowStep;

/// Every row's logprob outputs, computed into scratch so that nothing is written on failure:
/// by the task that drew the row, while its block maxima are at hand ([`LogprobSlots`]), or,
/// for the rows split into vocabulary tiles, after the draw ([`Logprobs::compute_rest`]).
pub(crate) struct Logprobs {
    mode: LogprobMode,
    want_rank: bool,
    top_n: usize,
    logprobs: Vec<f32>,
    ranks: Vec<i32>,
    ids: Vec<i32>,
    lps: Vec<f32>,
    /// The batch's `logprob_token_ids` (ids and `rows + 1` offsets; empty when not asked for),
    /// and their logprobs and ranks (ranks empty unless asked for).
    given_ids: Vec<i32>,
    given_offsets: Vec<u64>,
    given_lps: Vec<f32>,
    given_ranks: Vec<i32>,
}

/// Where the task that draws row `r` writes its logprobs: disjoint parts of [`Logprobs`]'
/// scratch, one row per task.
pub(crate) struct LogprobSlots {
    pub mode: LogprobMode,
    want_rank: bool,
    top_n: usize,
    logprobs: *mut f32,
    ranks: *mut i32,
    ids: *mut i32,
    lps: *mut f32,
    given_ids: *const i32,
    /// Null when no given ids are asked for.
    given_offsets: *const u64,
    given_lps: *mut f32,
    given_ranks: *mut i32,
    want_given_rank: bool,
}

// SAFETY: each row's slots are written by the one task that draws it (`row`'s contract), and
// read only after the draw's job ended.
unsafe impl Sync for LogprobSlots {}

impl LogprobSlots {
    /// Row `r`'s outputs.
    ///
    /// # Safety
    /// `r` is below the call's rows, and no other live `RowOut` is of row `r`.
    pub(crate) unsafe fn row(&self, r: usize) -> RowOut<'_> {
        let n = self.top_n;
        // SAFETY: the scratch has rows logprobs and ranks and rows x top_n ids and logprobs;
        // row r's are used by this caller alone (the contract).
        unsafe {
            RowOut {
                logprob: &mut *self.logprobs.add(r),
                rank: &mut *self.ranks.add(r),
                ids: std::slice::from_raw_parts_mut(self.ids.add(r * n), n),
                lps: std::slice::from_raw_parts_mut(self.lps.add(r * n), n),
                want_rank: self.want_rank,
            }
        }
    }

    /// Row `r`'s logprobs of given ids, if asked for.
    ///
    /// # Safety
    /// As [`LogprobSlots::row`].
    pub(crate) unsafe fn given(&self, r: usize) -> Option<GivenOut<'_>> {
        if self.given_offsets.is_null() {
            return None;
        }
        // SAFETY: the offsets have rows + 1 entries (validated: non-decreasing, within the ids);
        // the scratch holds one logprob (and rank, when asked) per id; row r's entries are used
        // by this caller alone (the contract).
        unsafe {
            let a = *self.given_offsets.add(r) as usize;
            let n = *self.given_offsets.add(r + 1) as usize - a;
            let ranks: &mut [i32] =
                if self.want_given_rank { std::slice::from_raw_parts_mut(self.given_ranks.add(a), n) } else { &mut [] };
            Some(GivenOut {
                ids: std::slice::from_raw_parts(self.given_ids.add(a), n),
                lps: std::slice::from_raw_parts_mut(self.given_lps.add(a), n),
                ranks,
            })
        }
    }
}

impl Logprobs {
    /// The scratch for what `out` asks for, or `None` if it asks for no logprob.
    pub(crate) fn new(out: &Output, batch: &Batch) -> Option<Logprobs> {
        let rows = batch.rows;
        let top_n = if out.topn_ids.is_some() || out.topn_logprobs.is_some() { out.top_n } else { 0 };
        let given = batch.logprob_token_ids.filter(|_| out.token_logprobs.is_some() || out.token_ranks.is_some());
        let (given_ids, given_offsets) = given.map_or((Vec::new(), Vec::new()), |g| {
            let end = g.offsets[rows] as usize;
            (g.ids[..end].to_vec(), g.offsets[..=rows].to_vec())
        });
        let given_ranks = if out.token_ranks.is_some() { given_ids.len() } else { 0 };
        out.wants_logprobs().then(|| Logprobs {
            mode: out.logprob_mode,
            want_rank: out.ranks.is_some(),
            top_n,
            logprobs: vec![0.0; rows],
            ranks: vec![0; rows],
            ids: vec![0; rows * top_n],
            lps: vec![0.0; rows * top_n],
            given_lps: vec![0.0; given_ids.len()],
            given_ranks: vec![0; given_ranks],
            given_ids,
            given_offsets,
        })
    }

    /// The slots the drawing tasks write through (valid while `self` is neither moved nor
    /// touched otherwise).
    pub(crate) fn slots(&mut self) -> LogprobSlots {
        LogprobSlots {
            mode: self.mode,
            want_rank: self.want_rank,
            top_n: self.top_n,
            logprobs: self.logprobs.as_mut_ptr(),
            ranks: self.ranks.as_mut_ptr(),
            ids: self.ids.as_mut_ptr(),
            lps: self.lps.as_mut_ptr(),
            given_ids: self.given_ids.as_ptr(),
            given_offsets: if self.given_offsets.is_empty() { std::ptr::null() } else { self.given_offsets.as_ptr() },
            given_lps: self.given_lps.as_mut_ptr(),
            given_ranks: self.given_ranks.as_mut_ptr(),
            want_given_rank: !self.given_ranks.is_empty(),
        }
    }

    /// Computes the rows whose drawing task did not (`done[r]` false: rows split into vocabulary
    /// tiles, which have no step), on this thread: each row's block maxima are read again.
    pub(crate) fn compute_rest(
        &mut self,
        k: &Kernels,
        batch: &Batch,
        inv_t: &[Option<f32>],
        info: &[RowInfo],
        tokens: &[i32],
        done: &[bool],
    ) -> Result<()> {
        let slots = self.slots();
        let mut bmax = Vec::new();
        for r in (0..batch.rows).filter(|&r| !done[r]) {
            // SAFETY: r < rows, and this loop holds row r's outputs alone.
            let (o, given) = unsafe { (slots.row(r), slots.given(r)) };
            let RowInfo { top, floor, .. } = info[r];
            with_row!(batch, r, |v| block_maxima(k, v, &mut bmax).and_then(|_| row_logprobs_given(
                k,
                v,
                &bmax,
                inv_t[r],
                self.mode,
                (top, floor),
                tokens[r],
                o,
                given
            )))
            .map_err(|e| e.in_row(r))?;
        }
        Ok(())
    }

    pub(crate) fn write(&self, out: &mut Output, rows: usize) {
        if let Some(d) = out.logprobs.as_deref_mut() {
            d[..rows].copy_from_slice(&self.logprobs);
        }
        if let Some(d) = out.ranks.as_deref_mut() {
            d[..rows].copy_from_slice(&self.ranks);
        }
        let n = rows * self.top_n;
        if let Some(d) = out.topn_ids.as_deref_mut() {
            d[..n].copy_from_slice(&self.ids);
        }
        if let Some(d) = out.topn_logprobs.as_deref_mut() {
            d[..n].copy_from_slice(&self.lps);
        }
        if let Some(d) = out.token_logprobs.as_deref_mut() {
            d[..self.given_lps.len()].copy_from_slice(&self.given_lps);
        }
        if let Some(d) = out.token_ranks.as_deref_mut() {
            d[..self.given_ranks.len()].copy_from_slice(&self.given_ranks);
        }
    }
}

/// The processed values of the rows of a call drawn with a step, for the outputs computed after
/// the draw: every row's step is built before anything is written (it is the only part that can
/// fail), and each row is materialized into one buffer when needed; with the scratch of the
/// full-vocabulary outputs ([`Processed::reserve_full`]).
pub(crate) struct Processed<'a> {
    steps: Vec<Option<RowStep<'a>>>,
    y: Vec<f32>,
    /// A row's block maxima and per-block masses, for [`write_full`].
    bmax: Vec<f32>,
    mass: Vec<f64>,
}

impl<'a> Processed<'a> {
    /// The step of every row of `batch` that `info` says was drawn from processed values.
    pub(crate) fn build(k: &Kernels, batch: &Batch<'a>, info: &[RowInfo]) -> Result<Processed<'a>> {
        let mut steps = alloc::with_capacity(batch.rows, "the rows' sampling steps")?;
        for (r, i) in info.iter().enumerate() {
            let e = if i.processed { crate::step::build(k, batch, r, false)? } else { None };
            steps.push(e);
        }
        let y =
            alloc::filled(if info.iter().any(|i| i.processed) { batch.vocab } else { 0 }, 0.0, "the processed row")?;
        Ok(Processed { steps, y, bmax: Vec::new(), mass: Vec::new() })
    }

    /// No processed values (no output that needs them).
    pub(crate) fn none(rows: usize) -> Processed<'a> {
        Processed { steps: (0..rows).map(|_| None).collect(), y: Vec::new(), bmax: Vec::new(), mass: Vec::new() }
    }

    /// Room for what [`write_full`] needs for rows of `vocab` values (a slot per block), so that
    /// it cannot fail once it writes.
    pub(crate) fn reserve_full(&mut self, vocab: usize) -> Result<()> {
        let blocks = vocab.div_ceil(BLOCK);
        alloc::reserve(&mut self.bmax, blocks, "the full output's block maxima")?;
        alloc::reserve(&mut self.mass, blocks, "the full output's block masses")
    }
}

/// Writes every row's full-vocabulary output of `out.full_mode` into `out.full_logprobs`
/// (nothing can fail here: every allocation was made by [`Processed::build`] and
/// [`Processed::reserve_full`]).
pub(crate) fn write_full(
    k: &Kernels,
    batch: &Batch,
    inv_t: &[Option<f32>],
    info: &[RowInfo],
    out: &mut Output,
    processed: &mut Processed,
) {
    let (mode, stride, vocab) = (out.full_mode, out.full_row_stride, batch.vocab);
    let Some(full) = out.full_logprobs.as_deref_mut() else { return };
    let Processed { steps, y, bmax, mass } = processed;
    let scratch = &mut (bmax, mass);
    for r in 0..batch.rows {
        let dest = &mut full[r * stride..r * stride + vocab];
        let RowInfo { top, floor, processed } = info[r];
        with_row!(batch, r, |v| {
            if mode == FullMode::Raw {
                let row_top = block_maxima(k, v, scratch.0).expect(RESERVED);
                let top = if processed { row_top } else { top };
                full_logprobs(k, v, (1.0, f32::NEG_INFINITY, top), scratch, dest);
            } else if let Some(e) = &mut steps[r] {
                // The buffer already has the row's length, so this allocates nothing.
                e.materialize(k, v, y, &mut []).expect("the buffer has the row's length");
                full_processed(k, batch, r, &y[..], (inv_t[r], floor, top), mode, scratch, dest);
            } else {
                full_processed(k, batch, r, v, (inv_t[r], floor, top), mode, scratch, dest);
            }
        });
    }
}

/// Why [`write_full`]'s scratch does not fail: [`Processed::reserve_full`] made room for a row.
const RESERVED: &str = "reserve_full made room for a row's blocks";

/// The logprob of every token of `v` at scale `s` over the tokens `>= floor` (block maxima and
/// per-block masses in `scratch`, its block maxima already there).
fn full_logprobs<V: RowValues + ?Sized>(
    k: &Kernels,
    v: &V,
    (s, floor, top): (f64, f32, f32),
    scratch: &mut (&mut Vec<f32>, &mut Vec<f64>),
    dest: &mut [f32],
) {
    let lp = logprob_fn(k, v, scratch.0, (s, floor, top), scratch.1).expect(RESERVED);
    for (i, d) in dest.iter_mut().enumerate() {
        *d = lp.of(v.at(i));
    }
}

/// The processed logprobs or logits of every token of the processed values `v` of row `r`,
/// drawn with `inv_t` (`None`: greedy), floor `floor`, maximum `top`.
#[allow(clippy::too_many_arguments)]
fn full_processed<V: RowValues + ?Sized>(
    k: &Kernels,
    batch: &Batch,
    r: usize,
    v: &V,
    (inv_t, floor, top): (Option<f32>, f32, f32),
    mode: FullMode,
    scratch: &mut (&mut Vec<f32>, &mut Vec<f64>),
    dest: &mut [f32],
) {
    let (s, floor) = scale_and_floor(LogprobMode::Processed, inv_t, floor);
    if mode == FullMode::Processed {
        block_maxima(k, v, scratch.0).expect(RESERVED);
        return full_logprobs(k, v, (s, floor, top), scratch, dest);
    }
    // Processed logits: the value divided by T (greedy rows: not divided) for the kept tokens.
    let t = inv_t.map(|_| batch.temperature(r));
    for (i, d) in dest.iter_mut().enumerate() {
        let y = v.at(i);
        let kept = if top == f32::INFINITY { y == f32::INFINITY } else { y >= floor && y.is_finite() };
        *d = match (kept, t) {
            (false, _) => f32::NEG_INFINITY,
            (true, Some(t)) => y / t,
            (true, None) => y,
        };
    }
}

/// Every row's kept set (threshold, count, mass, bitmask), computed into scratch after the draw
/// so that nothing is written on failure.
pub(crate) struct KeptSets {
    threshold: Vec<f32>,
    count: Vec<i32>,
    mass: Vec<f64>,
    /// `rows x words` words, empty unless the bitmask is asked for.
    bits: Vec<i32>,
    words: usize,
}

/// Which parts of a row's kept set a call asks for.
#[derive(Clone, Copy)]
struct KeptWanted {
    /// The threshold or the bitmask: one pass over every value.
    scan: bool,
    count: bool,
    mass: bool,
}

impl KeptSets {
    /// Computes the kept set of every row from the values its filters judged (its processed
    /// values, from `processed`, when it was drawn from them), its maximum and its filters'
    /// floor (`info`; the draw computed the whole floor: `floor_read`), at the 1/T the filters
    /// judged it at (`filter_inv_t`: 1 for greedy rows).
    pub(crate) fn compute(
        k: &Kernels,
        batch: &Batch,
        filter_inv_t: &[f32],
        info: &[RowInfo],
        out: &Output,
        processed: &mut Processed,
    ) -> Result<KeptSets> {
        let rows = batch.rows;
        let words = batch.vocab.div_ceil(32);
        let wanted = KeptWanted {
            scan: out.kept_threshold.is_some() || out.kept_bitmask.is_some(),
            count: out.kept_count.is_some(),
            mass: out.kept_mass.is_some(),
        };
        let mut bits = alloc::filled(if out.kept_bitmask.is_some() { rows * words } else { 0 }, 0, "the kept bitmask")?;
        let mut threshold = alloc::filled(rows, 0.0, "the kept thresholds")?;
        let mut count = alloc::filled(rows, 0, "the kept counts")?;
        let mut mass = alloc::filled(rows, 0.0, "the kept masses")?;
        let Processed { steps, y, bmax, mass: block_mass } = processed;
        let scratch = &mut (bmax, block_mass);
        for r in 0..rows {
            let row_bits = if bits.is_empty() { &mut [][..] } else { &mut bits[r * words..(r + 1) * words] };
            let RowInfo { top, floor, .. } = info[r];
            let at = (top, floor, filter_inv_t[r]);
            let (t, c, m) = with_row!(batch, r, |v| match &mut steps[r] {
                Some(e) => {
                    // The buffer already has the row's length, so this allocates nothing.
                    e.materialize(k, v, y, &mut []).expect("the buffer has the row's length");
                    row_kept(k, &y[..], at, wanted, scratch, row_bits)
                }
                None => row_kept(k, v, at, wanted, scratch, row_bits),
            })
            .map_err(|e| e.in_row(r))?;
            (threshold[r], count[r], mass[r]) = (t, c, m);
        }
        Ok(KeptSets { threshold, count, mass, bits, words })
    }

    pub(crate) fn write(&self, out: &mut Output, rows: usize) {
        if let Some(d) = out.kept_threshold.as_deref_mut() {
            d[..rows].copy_from_slice(&self.threshold);
        }
        if let Some(d) = out.kept_count.as_deref_mut() {
            d[..rows].copy_from_slice(&self.count);
        }
        if let Some(d) = out.kept_mass.as_deref_mut() {
            d[..rows].copy_from_slice(&self.mass);
        }
        if let Some(d) = out.kept_bitmask.as_deref_mut() {
            d[..rows * self.words].copy_from_slice(&self.bits);
        }
    }
}

/// The kept set of the values `v` whose maximum is `top` and filters' floor `floor`, judged at
/// 1/T `s`: its threshold, count and mass (what `wanted` asks for; NaN / 0 otherwise), and its
/// bits set in `bits` (empty: not asked for). The same rule as the race's: the finite values
/// `>= floor`, or the +inf ones when `top` is +inf. `scratch`: block maxima and masses.
fn row_kept<V: RowValues + ?Sized>(
    k: &Kernels,
    v: &V,
    (top, floor, s): (f32, f32, f32),
    wanted: KeptWanted,
    scratch: &mut (&mut Vec<f32>, &mut Vec<f64>),
    bits: &mut [i32],
) -> Result<(f32, i32, f64)> {
    if top == f32::NEG_INFINITY {
        return Ok((f32::NAN, 0, 0.0));
    }
    if top == f32::INFINITY {
        let mut count = 0;
        for i in (0..v.n()).filter(|&i| v.at(i) == f32::INFINITY) {
            count += 1;
            if let Some(w) = bits.get_mut(i / 32) {
                *w |= 1 << (i % 32);
            }
        }
        return Ok((f32::INFINITY, count, 1.0));
    }
    block_maxima(k, v, scratch.0)?;
    // The kept values: >= floor and finite (top is finite: no +inf; NaN compares false).
    let lo = floor.max(f32::MIN);
    let (least, count) = if wanted.scan {
        // SAFETY: the row has n values, the block maxima one per block, `bits` is empty or
        // holds a word per 32 values.
        unsafe { (V::kernels(k).kept_scan)(v.ptr(), v.n(), scratch.0, lo, bits) }
    } else if wanted.count {
        // SAFETY: the row has n values and the block maxima one per block.
        (f32::NAN, unsafe { (V::kernels(k).count_ge)(v.ptr(), v.n(), scratch.0, lo) as i32 })
    } else {
        (f32::NAN, 0)
    };
    let mass = if wanted.mass {
        let kept = row_mass(k, v, (top, s), floor, scratch)?;
        let all = if floor == f32::NEG_INFINITY { kept } else { row_mass(k, v, (top, s), f32::NEG_INFINITY, scratch)? };
        kept / all
    } else {
        0.0
    };
    Ok((least, count, mass))
}

/// The mass `sum exp((x - top) s)` of the finite values `x >= floor` (block maxima in
/// `scratch.0`): the logprobs' normaliser pass (f32 exps summed in an order fixed per block, the
/// same bits at every SIMD level), or, where `s log2 e` overflows f32, the float64 weights one by
/// one.
fn row_mass<V: RowValues + ?Sized>(
    k: &Kernels,
    v: &V,
    (top, s): (f32, f32),
    floor: f32,
    scratch: &mut (&mut Vec<f32>, &mut Vec<f64>),
) -> Result<f64> {
    match crate::mass::RowMass::new(k, v, top, s, floor) {
        Some(m) => Ok(m.z_exp(scratch.0, scratch.1)?.0),
        None => Ok((0..v.n())
            .map(|i| v.at(i))
            .filter(|&x| x >= floor && x.is_finite())
            .map(|x| crate::mass::weight64(x, top, s))
            .sum()),
    }
}
