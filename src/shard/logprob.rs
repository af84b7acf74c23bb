//! Logprobs of sharded rows: the sampled token's logprob (RAW or PROCESSED) and the top-n.
//!
//! A row's logprob function is `(x - m) * s - ln Z` over its set (`crate::logprob`): `m` is the
//! combined maximum, `s` and the set's floor are known on every rank, and Z is the sum of the
//! slices' masses. So each rank sends, with its race partial (the same round), its slice's mass
//! (f64, every weight exact: the `weights64` kernel), the value of its race winner, its count of
//! +inf, and its `top_n` best tokens by value (those of the set first, then the others by id):
//! the row's top-n are among the union. The unsharded draw sums Z from f32 exps (relative error
//! below 1e-5), so the two logprobs agree to that, not bit for bit.

use super::cut::ShardCut;
use super::local::check_out_len;
use super::{race_fingerprint, ShardPartial, ShardRow, ShardRows, ROUND_LOGPROB};
use crate::alloc;
use crate::batch::{inv_temperature, LogprobMode};
use crate::error::{Error, Result};
use crate::sampler::Sampler;
use std::cmp::Ordering;

/// One rank's part of a row's logprobs (64 bytes; C: `tokenrace_shard_logprob_partial`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ShardLogprobPartial {
    /// Round, fingerprint, slice and key as a partial; `value` and `token`: the value and id of
    /// this rank's race winner (-1: none).
    pub head: ShardPartial,
    /// The slice's mass `Σ exp((x - m) * s)` over the set.
    pub z: f64,
    /// The logprobs' scale (1/T for PROCESSED sampling rows, else 1).
    pub s: f32,
    /// The set's floor (-inf: every finite token).
    pub floor: f32,
    /// The slice's count of +inf values.
    pub posinf: u32,
    /// 0.
    pub reserved: u32,
}

/// A top-n candidate (8 bytes; C: `tokenrace_shard_top_entry`): a value and its global id (-1:
/// none).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ShardTopEntry {
    /// The token's value.
    pub value: f32,
    /// Its global id.
    pub token: i32,
}

impl Default for ShardTopEntry {
    fn default() -> Self {
        ShardTopEntry { value: f32::NEG_INFINITY, token: -1 }
    }
}

/// The logprob fingerprint of a combined row.
fn logprob_fingerprint(row: &ShardRow, mode: LogprobMode) -> u32 {
    race_fingerprint(row) ^ (0x6c70_0000 | mode as u32)
}

/// Whether `x` is in the set of a row whose maximum is `top`, with `floor`.
fn in_set(x: f32, top: f32, floor: f32) -> bool {
    if top == f32::INFINITY {
        x == f32::INFINITY
    } else {
        x.is_finite() && x >= floor
    }
}

/// The order of the top-n candidates before the logprobs are known: the set by value
/// descending, then the rest, each by id ascending on ties.
fn candidate_order(top: f32, floor: f32) -> impl Fn(&ShardTopEntry, &ShardTopEntry) -> Ordering {
    move |a, b| {
        let (ia, ib) = (in_set(a.value, top, floor), in_set(b.value, top, floor));
        ib.cmp(&ia)
            .then_with(|| if ia { b.value.total_cmp(&a.value) } else { Ordering::Equal })
            .then(a.token.cmp(&b.token))
    }
}

impl Sampler {
    /// This rank's logprob partials (`out`, one per row) and its `top_n` candidates per row
    /// (`top`, `rows.rows * top_n`), from its rows, the combined rows, the rows' finished cuts
    /// and this rank's own race partials (`races`, all "no winner" when no row raced). Sent
    /// with the race partials; [`shard_logprobs`] combines them.
    #[allow(clippy::too_many_arguments)]
    pub fn shard_logprob_partials(
        &self,
        rows: &ShardRows,
        combined: &[ShardRow],
        cuts: &[ShardCut],
        races: &[ShardPartial],
        mode: LogprobMode,
        top_n: usize,
        out: &mut [ShardLogprobPartial],
        top: &mut [ShardTopEntry],
    ) -> Result<()> {
        let (k, _, _) = self.shard_parts();
        let batch = self.shard_batch(k, rows)?;
        if mode == LogprobMode::Raw && rows.step.is_on() {
            // RAW logprobs are the logits' as given, normalised by the raw row's maximum and
            // mass, which the rounds (on the processed values) do not combine.
            return Err(Error::invalid_argument(
                "mode: RAW logprobs of rows with a step are not sharded (ask PROCESSED, or draw the rows unsharded)",
            ));
        }
        for (name, len) in [("combined", combined.len()), ("cuts", cuts.len()), ("races", races.len())] {
            check_out_len(name, len, rows.rows)?;
        }
        check_out_len("out", out.len(), rows.rows)?;
        let want = rows.rows.checked_mul(top_n).ok_or_else(|| Error::invalid_argument("top_n: overflows"))?;
        check_out_len("top", top.len(), want)?;
        let mut buf = Vec::new();
        let rows = &super::step::processed(k, rows, &mut buf)?;
        let mut parts = alloc::filled(rows.rows, ShardLogprobPartial::default(), "the logprob partials")?;
        let mut tops = alloc::filled(want, ShardTopEntry::default(), "the top-n candidates")?;
        let (mut xs, mut ws): (Vec<f32>, Vec<f64>) = (Vec::new(), Vec::new());
        for r in 0..rows.rows {
            let row = combined[r];
            self.check_combined(rows, &batch, r, &row)?;
            if cuts[r].row != race_fingerprint(&row) || cuts[r].phase != super::cut::phase::DONE {
                return Err(Error::invalid_argument(format!("cuts[{r}]: not the finished cut of this row")));
            }
            let v = &rows.logits[r * rows.row_stride..][..rows.slice_len];
            let sampling = row.flags & crate::batch::flags::GREEDY == 0;
            let (s, floor) = match mode {
                LogprobMode::Processed if sampling => (inv_temperature(batch.temperature(r)), cuts[r].floor),
                _ => (1.0, f32::NEG_INFINITY),
            };
            let mine = races[r];
            let winner = if mine.token >= 0 && row.races() {
                let at = (mine.token as usize).checked_sub(rows.vocab_start).filter(|&i| i < v.len());
                let at = at.ok_or_else(|| {
                    Error::invalid_argument(format!("races[{r}]: its winner {} is not in this slice", mine.token))
                })?;
                (v[at], mine.token)
            } else {
                (f32::NAN, -1)
            };
            let mut z = 0.0;
            if row.top.is_finite() {
                xs.clear();
                alloc::reserve(&mut xs, v.len(), "the logprobs' values")?;
                xs.extend(v.iter().copied().filter(|&x| x.is_finite() && x >= floor));
                ws.clear();
                alloc::resize(&mut ws, xs.len(), 0.0, "the logprobs' weights")?;
                // SAFETY: the level is supported; `ws` is as long as `xs`.
                unsafe { (k.weights64)(&xs, row.top as f64, s as f64, &mut ws) };
                z = ws.iter().sum();
            }
            parts[r] = ShardLogprobPartial {
                head: ShardPartial {
                    value: winner.0,
                    token: winner.1,
                    round: ROUND_LOGPROB,
                    fingerprint: logprob_fingerprint(&row, mode),
                    vocab_start: rows.vocab_start as u32,
                    slice_len: rows.slice_len as u32,
                    vocab_size: rows.vocab_size as u32,
                    key: row.key,
                    flags: 0,
                },
                z,
                s,
                floor,
                posinf: v.iter().filter(|&&x| x == f32::INFINITY).count() as u32,
                reserved: 0,
            };
            if top_n > 0 {
                let order = candidate_order(row.top, floor);
                let mut best = alloc::collect(
                    v.iter()
                        .enumerate()
                        .map(|(i, &x)| ShardTopEntry { value: x, token: (rows.vocab_start + i) as i32 }),
                    "the top-n candidates",
                )?;
                let n = top_n.min(best.len());
                if n < best.len() {
                    best.select_nth_unstable_by(n - 1, &order);
                }
                best[..n].sort_unstable_by(&order);
                tops[r * top_n..r * top_n + n].copy_from_slice(&best[..n]);
            }
        }
        out[..rows.rows].copy_from_slice(&parts);
        top[..want].copy_from_slice(&tops);
        Ok(())
    }
}

/// The logprob of each row's sampled token (`tokens`, from [`super::finish`]) into `logprobs`,
/// and its top-n (`top_n` ids and logprobs per row, by logprob descending then id ascending)
/// into `top_ids` and `top_lps`, from the combined rows and every rank's logprob partials and
/// candidates (`partials[rank]`, `tops[rank]`, the ranks in any order). Fails, writing
/// nothing, on partials of another row, call or mode, or slices that do not tile the row.
#[allow(clippy::too_many_arguments)]
pub fn shard_logprobs(
    combined: &[ShardRow],
    tokens: &[i32],
    partials: &[&[ShardLogprobPartial]],
    tops: &[&[ShardTopEntry]],
    mode: LogprobMode,
    top_n: usize,
    logprobs: &mut [f32],
    top_ids: &mut [i32],
    top_lps: &mut [f32],
) -> Result<()> {
    let rows = combined.len();
    check_out_len("tokens", tokens.len(), rows)?;
    check_out_len("logprobs", logprobs.len(), rows)?;
    let want = rows.checked_mul(top_n).ok_or_else(|| Error::invalid_argument("top_n: overflows"))?;
    check_out_len("top_ids", top_ids.len(), want)?;
    check_out_len("top_lps", top_lps.len(), want)?;
    if partials.is_empty() || partials.len() != tops.len() {
        return Err(Error::invalid_argument(format!(
            "partials: {} ranks of partials and {} of top-n candidates (at least one, as many)",
            partials.len(),
            tops.len()
        )));
    }
    if let Some(q) = partials.iter().position(|p| p.len() != rows) {
        return Err(Error::invalid_argument(format!("partials[{q}]: {} partials for {rows} rows", partials[q].len())));
    }
    if let Some(q) = tops.iter().position(|t| t.len() != want) {
        return Err(Error::invalid_argument(format!("tops[{q}]: {} entries for {rows} rows x {top_n}", tops[q].len())));
    }
    let mut lps = alloc::filled(rows, 0f32, "the sharded logprobs")?;
    let mut ids_out = alloc::filled(want, -1i32, "the sharded top-n")?;
    let mut lps_out = alloc::filled(want, f32::NEG_INFINITY, "the sharded top-n")?;
    for r in 0..rows {
        let row = combined[r];
        let heads: Vec<ShardPartial> = partials.iter().map(|p| p[r].head).collect();
        let views: Vec<&[ShardPartial]> = heads.iter().map(std::slice::from_ref).collect();
        super::combine::check_row(&views, 0, ROUND_LOGPROB, logprob_fingerprint(&row, mode)).map_err(|e| {
            let message = e.message.replace("][0] (", &format!("][{r}] (")).replace("row 0)", &format!("row {r})"));
            Error { message, ..e }
        })?;
        let mut order: Vec<usize> = (0..partials.len()).collect();
        order.sort_unstable_by_key(|&q| partials[q][r].head.vocab_start);
        let first = partials[order[0]][r];
        let lp_of = |x: f32| -> f32 {
            if row.top == f32::INFINITY {
                let count: u32 = order.iter().map(|&q| partials[q][r].posinf).sum();
                return if x == f32::INFINITY { -(count as f32).ln() } else { f32::NEG_INFINITY };
            }
            if !(row.top.is_finite() && x.is_finite() && x >= first.floor) {
                return f32::NEG_INFINITY;
            }
            let z: f64 = order.iter().map(|&q| partials[q][r].z).sum();
            ((x as f64 - row.top as f64) * first.s as f64 - z.ln()) as f32
        };
        let token = tokens[r];
        let x = order
            .iter()
            .map(|&q| partials[q][r].head)
            .find(|h| h.token == token && h.token >= 0)
            .map_or(row.top, |h| h.value);
        lps[r] = lp_of(x);
        if top_n > 0 {
            let mut all: Vec<(f32, i32)> = tops
                .iter()
                .flat_map(|t| t[r * top_n..(r + 1) * top_n].iter())
                .filter(|e| e.token >= 0)
                .map(|e| (lp_of(e.value), e.token))
                .collect();
            all.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            for (j, &(lp, id)) in all.iter().take(top_n).enumerate() {
                ids_out[r * top_n + j] = id;
                lps_out[r * top_n + j] = lp;
            }
        }
    }
    logprobs[..rows].copy_from_slice(&lps);
    top_ids[..want].copy_from_slice(&ids_out);
    top_lps[..want].copy_from_slice(&lps_out);
    Ok(())
}
