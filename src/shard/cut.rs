//! The filters' floor of a sharded row (min-p, top-k and top-p), the same on every rank.
//!
//! min-p's floor is a function of the row's maximum; top-k's is the k-th largest of the ranks'
//! candidates. top-p's threshold θ is the largest kept logit `x` at which the mass of the kept
//! tokens `>= x` reaches `top_p` of the kept mass Z (the walk of `filter::top_p`, ties kept
//! together). No rank holds Z or the tokens near θ, so it is found in rounds of fixed-size
//! histograms: each rank sends, per bin of the current interval of logits, the f64 mass, the
//! count and the least and largest value of its tokens there; the combination (on every rank,
//! from the same gathered histograms) finds the bin where the cumulative mass crosses the target
//! and narrows the interval to that bin's values. The first round bins by weight (half a nat per
//! bin below the maximum, which also gives Z), later ones split the interval's f32 values evenly
//! (their order-preserving integers), and once the crossing bin holds at most [`CUT_BINS`] tokens
//! the ranks send those tokens' values and the walk is done token by token, as unsharded.

use super::local::{check_out_len, effective_top_k, kth_of_candidates};
use super::{race_fingerprint, ShardPartial, ShardRow, ShardRows, ROUND_CUT};
use crate::alloc;
use crate::batch::inv_temperature;
use crate::config::FilterOrder;
use crate::error::{Error, Result};
use crate::filter;
use crate::mass::weight64;
use crate::noise::splitmix64;
use crate::sampler::Sampler;

/// Bins of a histogram round (and most values of a values round) per row.
pub const CUT_BINS: usize = 64;
/// Nats of weight per bin of the first round.
const BIN_NATS: f64 = 0.5;

/// The phases of a row's cut.
pub mod phase {
    /// The floor is known: `floor` is the row's (no top-p, or θ found).
    pub const DONE: u32 = 0;
    /// The next round bins the kept tokens by weight (and gives Z).
    pub const WEIGHT: u32 = 1;
    /// The next round splits `[lo, hi]` evenly by value.
    pub const SPLIT: u32 = 2;
    /// The next round sends the values in `[lo, hi]` (at most [`super::CUT_BINS`] in all).
    pub const VALUES: u32 = 3;
}

/// The state of one row's floor, the same on every rank (56 bytes; C: `tokenrace_shard_cut`):
/// made by [`Sampler::shard_cut_start`], advanced by [`cut_advance`] until its phase is
/// [`phase::DONE`], then raced with by [`Sampler::shard_race_cut`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ShardCut {
    /// The row's floor: min-p's and top-k's, then θ once found (a token races when `x >= floor`).
    pub floor: f32,
    /// The least value of the interval that holds θ.
    pub lo: f32,
    /// The largest value of that interval.
    pub hi: f32,
    /// The row's top-p (1: off).
    pub top_p: f32,
    /// The row's maximum.
    pub m: f32,
    /// The 1/T the filters weigh at.
    pub inv_t: f32,
    /// One of [`phase`].
    pub phase: u32,
    /// Rounds done.
    pub step: u32,
    /// A hash of the row and of every round's outcome: histograms of another state are refused.
    pub fingerprint: u32,
    /// The combined row's round-2 fingerprint (checked by the race).
    pub row: u32,
    /// The kept mass above `hi`.
    pub above: f64,
    /// The kept mass Z (after the first round).
    pub z: f64,
}

/// What one rank sends for one row in a round of the cut (1320 bytes; C: `tokenrace_shard_mass`).
/// In a values round `count[0]` is the number of values, in `low[..count[0]]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ShardMass {
    /// Round, fingerprint, slice and key, as a partial (value, token and flags unused).
    pub head: ShardPartial,
    /// Per bin, the f64 mass of the rank's kept tokens in it (in slice order).
    pub mass: [f64; CUT_BINS],
    /// Per bin, their count.
    pub count: [u32; CUT_BINS],
    /// Per bin, their least value (+inf: none).
    pub low: [f32; CUT_BINS],
    /// Per bin, their largest value (-inf: none).
    pub high: [f32; CUT_BINS],
}

impl Default for ShardMass {
    fn default() -> Self {
        ShardMass {
            head: ShardPartial::default(),
            mass: [0.0; CUT_BINS],
            count: [0; CUT_BINS],
            low: [f32::INFINITY; CUT_BINS],
            high: [f32::NEG_INFINITY; CUT_BINS],
        }
    }
}

/// Whether any row's cut needs another round.
pub fn cut_pending(cuts: &[ShardCut]) -> bool {
    cuts.iter().any(|c| c.phase != phase::DONE)
}

/// An f32 as an integer in the same order (+0 and -0 as one).
fn ordered(x: f32) -> u32 {
    let b = (x + 0.0).to_bits();
    if b >> 31 == 1 {
        !b
    } else {
        b | 0x8000_0000
    }
}

/// The bin of a kept value `x` of `[c.lo, c.hi]` in `c`'s next round.
fn bin_of(c: &ShardCut, x: f32) -> usize {
    let last = CUT_BINS - 1;
    if c.phase == phase::WEIGHT {
        let d = (c.m as f64 - x as f64) * c.inv_t as f64 / BIN_NATS;
        if d < last as f64 {
            d as usize
        } else {
            last
        }
    } else {
        let (hi, lo) = (ordered(c.hi), ordered(c.lo));
        let n = u64::from(hi - lo) + 1;
        (u64::from(hi - ordered(x)) * CUT_BINS as u64 / n) as usize
    }
}

fn step_fingerprint(c: &ShardCut) -> u32 {
    let parts = [c.fingerprint, c.lo.to_bits(), c.hi.to_bits(), c.floor.to_bits(), c.phase, c.step];
    (parts.iter().fold(0x0063_7574, |h: u64, &x| splitmix64(h ^ u64::from(x))) >> 32) as u32
}

impl Sampler {
    /// The first state of every row's floor (`out`, one per row): min-p's floor from the combined
    /// maximum, top-k's from the ranks' candidates (`candidates[rank]`, as
    /// [`Sampler::shard_race_top_k`]; empty when no row has top-k), and for rows with top-p (and a
    /// race) the interval to search for θ. Every rank computes the same states. Takes no key.
    pub fn shard_cut_start(
        &self,
        rows: &ShardRows,
        combined: &[ShardRow],
        candidates: &[&[f32]],
        out: &mut [ShardCut],
    ) -> Result<()> {
        let (k, _, _) = self.shard_parts();
        let batch = self.shard_batch(k, rows)?;
        check_out_len("combined", combined.len(), rows.rows)?;
        check_out_len("out", out.len(), rows.rows)?;
        let mut buf = Vec::new();
        let rows = &super::step::processed(k, rows, &mut buf)?;
        let mut cuts = alloc::filled(rows.rows, ShardCut::default(), "the shard cuts")?;
        for (r, c) in cuts.iter_mut().enumerate() {
            let row = combined[r];
            self.check_combined(rows, &batch, r, &row)?;
            let top_p = rows.top_p.map_or(1.0, |p| p[r]);
            *c = ShardCut { floor: f32::NEG_INFINITY, top_p, row: race_fingerprint(&row), ..ShardCut::default() };
            if !row.races() {
                continue;
            }
            let kth = match effective_top_k(rows, r) {
                0 => None,
                top_k => kth_of_candidates(candidates, rows.rows, r, top_k)?,
            };
            let inv_t = inv_temperature(batch.temperature(r));
            let filter_inv_t = if self.config().filter_order == FilterOrder::FiltersFirst { 1.0 } else { inv_t };
            let v = &rows.logits[r * rows.row_stride..][..rows.slice_len];
            // The batch holds min-p alone: its floor is a function of the row's maximum.
            let floor = filter::row_floor(k, &batch, r, v, &[], row.top, filter_inv_t).map_err(|e| e.in_row(r))?;
            c.floor = kth.map_or(floor, |kth| floor.max(kth));
            c.m = row.top;
            c.inv_t = filter_inv_t;
            if top_p < 1.0 {
                c.phase = phase::WEIGHT;
                c.lo = c.floor.max(-f32::MAX);
                c.hi = row.top;
            }
            c.fingerprint = step_fingerprint(&ShardCut { fingerprint: c.row ^ top_p.to_bits(), ..*c });
        }
        out[..rows.rows].copy_from_slice(&cuts);
        Ok(())
    }

    /// One round of the cut on this rank: per row whose cut is pending, the histogram (or the
    /// values) of its slice's kept tokens in the cut's interval, into `out`; rows whose cut is
    /// done get an empty record. `rows` are the rows of [`Sampler::shard_top`].
    pub fn shard_cut_round(&self, rows: &ShardRows, cuts: &[ShardCut], out: &mut [ShardMass]) -> Result<()> {
        check_out_len("cuts", cuts.len(), rows.rows)?;
        check_out_len("out", out.len(), rows.rows)?;
        let (k, _, _) = self.shard_parts();
        self.shard_batch(k, rows)?;
        let mut buf = Vec::new();
        let rows = &super::step::processed(k, rows, &mut buf)?;
        let mut all = alloc::filled(rows.rows, ShardMass::default(), "the shard histograms")?;
        let (mut xs, mut ws): (Vec<f32>, Vec<f64>) = (Vec::new(), Vec::new());
        for (r, (o, c)) in all.iter_mut().zip(cuts).enumerate() {
            o.head = ShardPartial {
                round: ROUND_CUT,
                fingerprint: c.fingerprint,
                vocab_start: rows.vocab_start as u32,
                slice_len: rows.slice_len as u32,
                vocab_size: rows.vocab_size as u32,
                ..ShardPartial::default()
            };
            if c.phase == phase::DONE {
                continue;
            }
            let v = &rows.logits[r * rows.row_stride..][..rows.slice_len];
            let inside = v.iter().copied().filter(|&x| x >= c.lo && x <= c.hi);
            if c.phase == phase::VALUES {
                for x in inside {
                    let n = o.count[0] as usize;
                    if n == CUT_BINS {
                        return Err(Error::invalid_argument(format!(
                            "cuts[{r}]: more than {CUT_BINS} values of this slice in [{}, {}], which the last round \
                             counted at most {CUT_BINS} over all ranks (a cut of other rows?)",
                            c.lo, c.hi
                        )));
                    }
                    o.low[n] = x;
                    o.count[0] += 1;
                }
                continue;
            }
            xs.clear();
            alloc::reserve(&mut xs, v.len(), "the cut's values")?;
            xs.extend(inside);
            ws.clear();
            alloc::resize(&mut ws, xs.len(), 0.0, "the cut's weights")?;
            // SAFETY: the level is supported; `ws` is as long as `xs`. (The kernel computes
            // `weight64` of each value.)
            unsafe { (k.weights64)(&xs, c.m as f64, c.inv_t as f64, &mut ws) };
            for (&x, &w) in xs.iter().zip(&ws) {
                let j = bin_of(c, x);
                o.mass[j] += w;
                o.count[j] += 1;
                o.low[j] = o.low[j].min(x);
                o.high[j] = o.high[j].max(x);
            }
        }
        out[..rows.rows].copy_from_slice(&all);
        Ok(())
    }

    /// [`Sampler::shard_race`] with the rows' floors from their finished cuts (`cuts`, each of
    /// [`phase::DONE`]).
    pub fn shard_race_cut(
        &self,
        rows: &ShardRows,
        combined: &[ShardRow],
        cuts: &[ShardCut],
        out: &mut [ShardPartial],
    ) -> Result<()> {
        check_out_len("cuts", cuts.len(), rows.rows)?;
        check_out_len("combined", combined.len(), rows.rows)?;
        for (r, c) in cuts[..rows.rows].iter().enumerate() {
            if c.phase != phase::DONE {
                return Err(Error::invalid_argument(format!(
                    "cuts[{r}]: its cut is not done (phase {}): run more rounds of shard_cut_round and cut_advance",
                    c.phase
                )));
            }
            if c.row != race_fingerprint(&combined[r]) {
                return Err(Error::invalid_argument(format!("cuts[{r}]: is the cut of another row or call")));
            }
        }
        self.shard_race_floors(rows, combined, &|r| Ok(Some(cuts[r].floor)), out)
    }
}

/// Advances every pending cut (`cuts`, one per row, the same on every rank) by the round's
/// records of all ranks (`masses[rank]`, one per row, the ranks in any order). Fails, changing
/// nothing, when a record is of another round, row or state, or the slices do not tile the row.
pub fn cut_advance(cuts: &mut [ShardCut], masses: &[&[ShardMass]]) -> Result<()> {
    let rows = cuts.len();
    if masses.is_empty() {
        return Err(Error::invalid_argument("masses: no rank given"));
    }
    if let Some(q) = masses.iter().position(|m| m.len() != rows) {
        return Err(Error::invalid_argument(format!("masses[{q}]: {} records for {rows} rows", masses[q].len())));
    }
    let mut next = alloc::filled(rows, ShardCut::default(), "the shard cuts")?;
    for (r, (n, c)) in next.iter_mut().zip(cuts.iter()).enumerate() {
        let heads: Vec<ShardPartial> = masses.iter().map(|m| m[r].head).collect();
        let views: Vec<&[ShardPartial]> = heads.iter().map(std::slice::from_ref).collect();
        super::combine::check_row(&views, 0, ROUND_CUT, c.fingerprint).map_err(|e| in_row(e, r))?;
        // The ranks by slice, so that every rank adds them in one order.
        let mut order: Vec<usize> = (0..masses.len()).collect();
        order.sort_unstable_by_key(|&q| masses[q][r].head.vocab_start);
        let ranked: Vec<&ShardMass> = order.iter().map(|&q| &masses[q][r]).collect();
        *n = advance_row(c, &ranked);
    }
    cuts.copy_from_slice(&next);
    Ok(())
}

fn in_row(e: Error, r: usize) -> Error {
    let message = e.message.replace("[0] (", &format!("[{r}] (")).replace("row 0", &format!("row {r}"));
    Error { message, ..e }
}

/// One row's next state from the ranks' records (ordered by slice).
fn advance_row(c: &ShardCut, ranked: &[&ShardMass]) -> ShardCut {
    if c.phase == phase::DONE {
        return *c;
    }
    let mut n = ShardCut { step: c.step + 1, ..*c };
    if c.phase == phase::VALUES {
        let mut xs: Vec<f32> = ranked.iter().flat_map(|m| m.low[..m.count[0] as usize].iter().copied()).collect();
        xs.sort_unstable_by(|a, b| b.total_cmp(a));
        let t = c.top_p as f64 * c.z;
        let mut cum = c.above;
        // Rounding may leave the target above every value's cumulative mass: keep them all.
        let mut theta = xs.last().copied().unwrap_or(c.lo);
        for &x in &xs {
            cum += weight64(x, c.m, c.inv_t);
            if cum >= t {
                theta = x;
                break;
            }
        }
        return done(n, theta);
    }
    let mut mass = [0f64; CUT_BINS];
    let mut count = [0u64; CUT_BINS];
    let mut low = [f32::INFINITY; CUT_BINS];
    let mut high = [f32::NEG_INFINITY; CUT_BINS];
    for m in ranked {
        for j in 0..CUT_BINS {
            mass[j] += m.mass[j];
            count[j] += u64::from(m.count[j]);
            low[j] = low[j].min(m.low[j]);
            high[j] = high[j].max(m.high[j]);
        }
    }
    if c.phase == phase::WEIGHT {
        n.z = mass.iter().sum();
    }
    let t = c.top_p as f64 * n.z;
    let mut cum = c.above;
    for j in 0..CUT_BINS {
        if count[j] == 0 {
            continue;
        }
        if cum + mass[j] >= t {
            n.above = cum;
            (n.lo, n.hi) = (low[j], high[j]);
            if low[j] == high[j] {
                return done(n, high[j]);
            }
            n.phase = if count[j] <= CUT_BINS as u64 { phase::VALUES } else { phase::SPLIT };
            n.fingerprint = step_fingerprint(&n);
            return n;
        }
        cum += mass[j];
    }
    // Rounding left the target above the whole kept mass: keep every kept token, as unsharded.
    done(n, c.floor)
}

fn done(mut n: ShardCut, theta: f32) -> ShardCut {
    n.floor = n.floor.max(theta);
    n.phase = phase::DONE;
    n.fingerprint = step_fingerprint(&n);
    n
}
