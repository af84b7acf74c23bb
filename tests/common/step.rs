//! Helpers of the sampling step's tests (`tests/step_*.rs`): the step's inputs of a call in CSR
//! form, random calls mixing every input (every dtype; seeded, unseeded and external-noise rows;
//! the filters and logprobs), the samplers of every SIMD level, thread count and filter order, and
//! the output buffers of a call. Each test binary uses part of it.
#![allow(dead_code)]

use super::reference as rf;
use super::{gen_row, pick_dist, Dist, TestRng};
use tokenrace::internals::{Apply, SETTINGS};
use tokenrace::*;

/// The seed of every sampler's key stream (so the reference can follow the unseeded rows).
pub const STREAM_SEED: u64 = 0x91be_11e5_7e9a_0009;
/// What the output buffers hold before a call (a value no draw writes).
pub const SENTINEL: f32 = 12345.0;

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Dtype {
    F32,
    Bf16,
    F16,
}

// ---------------------------------------------------------------------------------------------
// The inputs of a call.
// ---------------------------------------------------------------------------------------------

/// Per-row lists in CSR form, built row by row.
#[derive(Clone, Debug)]
pub struct Csr {
    pub ids: Vec<i32>,
    pub offsets: Vec<u64>,
}

impl Csr {
    pub fn new() -> Csr {
        Csr { ids: Vec::new(), offsets: vec![0] }
    }
    pub fn from_rows(rows: &[Vec<i32>]) -> Csr {
        let mut c = Csr::new();
        for r in rows {
            c.push(r);
        }
        c
    }
    pub fn push(&mut self, row: &[i32]) {
        self.ids.extend_from_slice(row);
        self.offsets.push(self.ids.len() as u64);
    }
    pub fn row(&self, r: usize) -> &[i32] {
        &self.ids[self.offsets[r] as usize..self.offsets[r + 1] as usize]
    }
    pub fn lists(&self) -> TokenLists<'_> {
        TokenLists { ids: &self.ids, offsets: &self.offsets }
    }
}

#[derive(Clone, Debug)]
pub struct BiasCsr {
    pub ids: Vec<i32>,
    pub values: Vec<f32>,
    pub offsets: Vec<u64>,
}

impl BiasCsr {
    pub fn new() -> BiasCsr {
        BiasCsr { ids: Vec::new(), values: Vec::new(), offsets: vec![0] }
    }
    pub fn push(&mut self, pairs: &[(i32, f32)]) {
        for &(id, v) in pairs {
            self.ids.push(id);
            self.values.push(v);
        }
        self.offsets.push(self.ids.len() as u64);
    }
    pub fn row(&self, r: usize) -> (&[i32], &[f32]) {
        let (a, b) = (self.offsets[r] as usize, self.offsets[r + 1] as usize);
        (&self.ids[a..b], &self.values[a..b])
    }
    pub fn bias(&self) -> LogitBias<'_> {
        LogitBias { ids: &self.ids, values: &self.values, offsets: &self.offsets }
    }
}

/// Every input of the sampling step of a call, each optional as the API takes it.
#[derive(Clone, Debug, Default)]
pub struct StepInputs {
    pub prompt: Option<Csr>,
    pub output: Option<Csr>,
    pub repetition: Option<Vec<f32>>,
    pub frequency: Option<Vec<f32>>,
    pub presence: Option<Vec<f32>>,
    pub last_n: Option<Vec<i32>>,
    pub bias: Option<BiasCsr>,
    pub allowed: Option<Csr>,
    pub allowed_rows: Option<Vec<u8>>,
    pub banned: Option<Csr>,
    /// Words and row stride in words.
    pub bitmask: Option<(Vec<i32>, usize)>,
    pub min_tokens: Option<Vec<i32>>,
    pub stop: Option<Csr>,
}

impl StepInputs {
    pub fn apply<'a>(&'a self, b: Batch<'a>) -> Batch<'a> {
        Batch {
            prompt_tokens: self.prompt.as_ref().map(Csr::lists),
            output_tokens: self.output.as_ref().map(Csr::lists),
            repetition_penalty: self.repetition.as_deref(),
            frequency_penalty: self.frequency.as_deref(),
            presence_penalty: self.presence.as_deref(),
            penalty_last_n: self.last_n.as_deref(),
            logit_bias: self.bias.as_ref().map(BiasCsr::bias),
            allowed_tokens: self.allowed.as_ref().map(Csr::lists),
            allowed_rows: self.allowed_rows.as_deref(),
            banned_tokens: self.banned.as_ref().map(Csr::lists),
            token_bitmask: self.bitmask.as_ref().map(|(w, s)| TokenBitmask { words: w, row_stride: *s }),
            min_tokens: self.min_tokens.as_deref(),
            stop_tokens: self.stop.as_ref().map(Csr::lists),
            ..b
        }
    }

    pub fn restricted(&self, r: usize) -> bool {
        self.allowed.is_some() && self.allowed_rows.as_ref().is_none_or(|m| m[r] != 0)
    }

    /// Row `r` as the reference takes it.
    pub fn row(&self, r: usize, vocab: usize) -> rf::RowInputs<'_> {
        let empty: &[i32] = &[];
        let (bias_ids, bias_values) = self.bias.as_ref().map_or((empty, &[][..]), |b| b.row(r));
        rf::RowInputs {
            prompt: self.prompt.as_ref().map_or(empty, |c| c.row(r)),
            output: self.output.as_ref().map_or(empty, |c| c.row(r)),
            repetition: self.repetition.as_ref().map_or(1.0, |v| v[r]),
            frequency: self.frequency.as_ref().map_or(0.0, |v| v[r]),
            presence: self.presence.as_ref().map_or(0.0, |v| v[r]),
            last_n: self.last_n.as_ref().map_or(0, |v| v[r]),
            bias_ids,
            bias_values,
            allowed: if self.restricted(r) { Some(self.allowed.as_ref().unwrap().row(r)) } else { None },
            banned: self.banned.as_ref().map_or(empty, |c| c.row(r)),
            bitmask: self.bitmask.as_ref().map(|(w, s)| &w[r * s..r * s + vocab.div_ceil(32)]),
            stop: self.stop.as_ref().map_or(empty, |c| c.row(r)),
            min_tokens: self.min_tokens.as_ref().map_or(0, |v| v[r]),
        }
    }

    /// The step inputs of row `r` alone (a batch of one row).
    pub fn single(&self, r: usize, vocab: usize) -> StepInputs {
        let one = |c: &Option<Csr>| c.as_ref().map(|c| Csr::from_rows(&[c.row(r).to_vec()]));
        StepInputs {
            prompt: one(&self.prompt),
            output: one(&self.output),
            repetition: self.repetition.as_ref().map(|v| vec![v[r]]),
            frequency: self.frequency.as_ref().map(|v| vec![v[r]]),
            presence: self.presence.as_ref().map(|v| vec![v[r]]),
            last_n: self.last_n.as_ref().map(|v| vec![v[r]]),
            bias: self.bias.as_ref().map(|b| {
                let (ids, values) = b.row(r);
                let mut one = BiasCsr::new();
                one.push(&ids.iter().copied().zip(values.iter().copied()).collect::<Vec<_>>());
                one
            }),
            allowed: one(&self.allowed),
            allowed_rows: self.allowed_rows.as_ref().map(|m| vec![m[r]]),
            banned: one(&self.banned),
            bitmask: self.bitmask.as_ref().map(|(w, s)| {
                let words = vocab.div_ceil(32);
                (w[r * s..r * s + words].to_vec(), words)
            }),
            min_tokens: self.min_tokens.as_ref().map(|v| vec![v[r]]),
            stop: one(&self.stop),
        }
    }
}

/// The ways a generated row can be built to hit an edge of the spec.
#[derive(Clone, Copy, Debug, Default)]
pub struct Edges {
    /// A -inf bias on the row's only finite token.
    pub ban_only_finite: usize,
    /// A restricted row with an empty allowed list.
    pub empty_allowed: usize,
    /// A bitmask row of no allowed token (with ones past vocab).
    pub zero_bitmask: usize,
    /// A large positive bias on a banned token.
    pub bias_on_banned: usize,
}

/// Random step inputs for `rows` rows of `x` (which it may change: zeros and negative values at
/// history tokens, rows of one finite token).
pub fn make_step_inputs(rng: &mut TestRng, x: &mut [f32], rows: usize, vocab: usize, edges: &mut Edges) -> StepInputs {
    if rng.below(8) == 0 {
        return StepInputs::default();
    }
    let mut on = || rng.below(3) != 0;
    let (has_prompt, has_output, has_rep, has_freq, has_pres) = (on(), on(), on(), on(), on());
    let (has_bias, has_allowed, has_allowed_rows, has_banned, has_bitmask) = (on(), on(), on(), on(), on());
    let words = vocab.div_ceil(32);
    let stride = words + [0, 0, 1, 3][rng.below(4)];
    // Garbage everywhere: the bits past vocab and the words past a row's words must be ignored.
    let mut bitmask: Vec<i32> = (0..rows * stride).map(|_| rng.u64() as i32).collect();
    let (mut prompt, mut output, mut allowed, mut banned) = (Csr::new(), Csr::new(), Csr::new(), Csr::new());
    let mut bias = BiasCsr::new();
    let (mut rep, mut freq, mut pres) = (Vec::new(), Vec::new(), Vec::new());
    let allowed_rows: Vec<u8> = (0..rows).map(|_| (rng.below(2) == 0) as u8).collect();
    for r in 0..rows {
        let row = &mut x[r * vocab..(r + 1) * vocab];
        let plain = rng.below(5) == 0;
        let hot: Vec<i32> = (0..4).map(|_| rng.below(vocab) as i32).collect();
        let pick = |rng: &mut TestRng| if rng.below(3) == 0 { hot[rng.below(4)] } else { rng.below(vocab) as i32 };
        let (mut p_row, mut o_row) = (Vec::new(), Vec::new());
        if !plain {
            for _ in 0..rng.below(1 + (2 * vocab).min(150)) {
                p_row.push(pick(rng));
            }
            for _ in 0..rng.below(1 + vocab.min(40)) {
                o_row.push(pick(rng));
            }
            if rng.below(2) == 0 {
                // One token in both histories.
                let t = pick(rng);
                p_row.push(t);
                o_row.push(t);
            }
            // Zero and negative logits under the repetition penalty.
            if rng.below(2) == 0 {
                for (k, &t) in p_row.iter().chain(&o_row).take(4).enumerate() {
                    if row[t as usize].is_finite() {
                        row[t as usize] = [0.0f32, -0.0, -1.5, 2.0][k];
                    }
                }
            }
        }
        prompt.push(&p_row);
        output.push(&o_row);
        let pick3 = |rng: &mut TestRng, v: &[f32]| v[rng.below(v.len())];
        rep.push(if plain { 1.0 } else { pick3(rng, &[1.0, 1.0, 0.5, 1.3, 2.0]) });
        freq.push(if plain { 0.0 } else { pick3(rng, &[0.0, 0.0, 0.4, -0.7, 1.5]) });
        pres.push(if plain { 0.0 } else { pick3(rng, &[0.0, 0.0, 0.6, -0.3]) });
        let mut b_row: Vec<(i32, f32)> = Vec::new();
        let mut ban_row: Vec<i32> = Vec::new();
        let mut a_row: Vec<i32> = Vec::new();
        if !plain {
            for _ in 0..rng.below(10) {
                let v = match rng.below(8) {
                    0 => f32::NEG_INFINITY,
                    1 => 0.0,
                    2 => 25.0,
                    _ => (rng.normal() * 3.0) as f32,
                };
                b_row.push((pick(rng), v));
            }
            for _ in 0..rng.below(5) {
                ban_row.push(pick(rng));
            }
        }
        // An allowed list for every row (rows `allowed_rows` leaves out must ignore theirs).
        if rng.below(10) != 0 {
            for _ in 0..1 + rng.below(vocab.min(60)) {
                a_row.push(pick(rng));
            }
        }
        let restricted = has_allowed && (!has_allowed_rows || allowed_rows[r] != 0);
        // The bitmask row: all ones, random, sparse or dense bits; the bits past vocab keep their
        // garbage.
        let density = rng.below(4);
        let mut zero_mask = false;
        match rng.below(12) {
            0 if has_bias => {
                let j = rng.below(vocab);
                row.iter_mut().for_each(|v| *v = f32::NEG_INFINITY);
                row[j] = 1.0;
                b_row.push((j as i32, f32::NEG_INFINITY));
                edges.ban_only_finite += 1;
            }
            1 if restricted => {
                a_row.clear();
                edges.empty_allowed += 1;
            }
            2 if has_bitmask => {
                zero_mask = true;
                edges.zero_bitmask += 1;
            }
            3 if has_bias && has_banned => {
                let j = pick(rng);
                ban_row.push(j);
                b_row.push((j, 25.0));
                if row[j as usize].is_finite() {
                    row[j as usize] = 10.0;
                }
                edges.bias_on_banned += 1;
            }
            _ => {}
        }
        for w in 0..words {
            let word = match density {
                _ if zero_mask => 0,
                0 => -1,
                1 => rng.u64() as i32,
                2 => (rng.u64() & rng.u64() & rng.u64()) as i32,
                _ => (rng.u64() | rng.u64()) as i32,
            };
            let valid = (vocab - 32 * w).min(32);
            let keep: u32 = if valid == 32 { u32::MAX } else { (1u32 << valid) - 1 };
            let old = bitmask[r * stride + w] as u32;
            bitmask[r * stride + w] = ((word as u32 & keep) | (old & !keep)) as i32;
        }
        bias.push(&b_row);
        banned.push(&ban_row);
        allowed.push(&a_row);
    }
    // The penalty window, on a third of the calls: none, inside the output, across the two
    // histories, or longer than both.
    let last_n = (rng.below(3) == 0).then(|| (0..rows).map(|_| [0, 1, 2, 5, 20, 60, 1000][rng.below(7)]).collect());
    // min_tokens on a third of the calls: the stop tokens (likely ones among them) banned in the
    // rows whose output is shorter than the minimum.
    let (min_tokens, stop) = if rng.below(3) == 0 {
        let min: Vec<i32> = (0..rows).map(|r| [0, 1, 10, 100][(r + rng.below(4)) % 4]).collect();
        let mut stop = Csr::new();
        for r in 0..rows {
            let row = &x[r * vocab..(r + 1) * vocab];
            let best = (0..vocab).fold(0, |b, i| if row[i] > row[b] { i } else { b }) as i32;
            let mut ids: Vec<i32> = (0..rng.below(4)).map(|_| rng.below(vocab) as i32).collect();
            if rng.below(2) == 0 {
                ids.push(best);
            }
            stop.push(&ids);
        }
        (Some(min), Some(stop))
    } else {
        (None, None)
    };
    StepInputs {
        prompt: has_prompt.then_some(prompt),
        output: has_output.then_some(output),
        repetition: has_rep.then_some(rep),
        frequency: has_freq.then_some(freq),
        presence: has_pres.then_some(pres),
        last_n,
        bias: has_bias.then_some(bias),
        allowed: has_allowed.then_some(allowed),
        allowed_rows: (has_allowed && has_allowed_rows).then_some(allowed_rows),
        banned: has_banned.then_some(banned),
        bitmask: has_bitmask.then_some((bitmask, stride)),
        min_tokens,
        stop,
    }
}

/// One draw call and everything the reference needs to judge it.
pub struct Case {
    pub label: String,
    pub vocab: usize,
    pub rows: usize,
    pub row_stride: usize,
    pub dists: Vec<Dist>,
    /// The logits as the library reads them (after the dtype conversion), as f32, contiguous.
    pub x: Vec<f32>,
    /// The logits as passed, `row_stride` apart (one of them, by dtype).
    pub f32s: Vec<f32>,
    pub bf16: Vec<Bf16>,
    pub f16: Vec<F16>,
    pub dtype: Dtype,
    pub temps: Vec<f32>,
    pub seeds: Option<Vec<u64>>,
    pub offsets: Vec<u64>,
    pub seeded: Vec<u8>,
    pub top_k: Option<Vec<i32>>,
    pub top_p: Option<Vec<f32>>,
    pub min_p: Option<Vec<f32>>,
    /// External noise: values, kind, row stride (0: broadcast).
    pub noise: Option<(Vec<f32>, NoiseKind, usize)>,
    pub mode: LogprobMode,
    pub top_n: usize,
    pub full_mode: FullMode,
    pub full_stride: usize,
    pub step: StepInputs,
}

impl Case {
    pub fn logits(&self) -> Logits<'_> {
        match self.dtype {
            Dtype::F32 => Logits::F32(&self.f32s),
            Dtype::Bf16 => Logits::Bf16(&self.bf16),
            Dtype::F16 => Logits::F16(&self.f16),
        }
    }

    /// The batch without step inputs, on `logits` (`row_stride` apart).
    pub fn base<'a>(&'a self, logits: Logits<'a>, row_stride: usize) -> Batch<'a> {
        Batch {
            row_stride,
            temperature: Some(&self.temps),
            seeds: self.seeds.as_deref(),
            offsets: self.seeds.as_ref().map(|_| &self.offsets[..]),
            seeded: self.seeds.as_ref().map(|_| &self.seeded[..]),
            noise: self.noise.as_ref().map(|(v, kind, stride)| ExternalNoise {
                values: v,
                kind: *kind,
                row_stride: *stride,
            }),
            top_k: self.top_k.as_deref(),
            top_p: self.top_p.as_deref(),
            min_p: self.min_p.as_deref(),
            ..Batch::new(logits, self.rows, self.vocab)
        }
    }

    /// The call itself: the raw logits with every step input.
    pub fn batch(&self) -> Batch<'_> {
        self.step.apply(self.base(self.logits(), self.row_stride))
    }

    /// A plain call (no step inputs) on the materialised effective rows `y` (contiguous).
    pub fn plain<'a>(&'a self, y: &'a [f32]) -> Batch<'a> {
        self.base(Logits::F32(y), self.vocab)
    }

    pub fn row(&self, r: usize) -> &[f32] {
        &self.x[r * self.vocab..(r + 1) * self.vocab]
    }

    pub fn filters(&self, r: usize) -> rf::Filters {
        rf::Filters {
            top_k: self.top_k.as_ref().map_or(0, |v| v[r]),
            top_p: self.top_p.as_ref().map_or(1.0, |v| v[r]),
            min_p: self.min_p.as_ref().map_or(0.0, |v| v[r]),
        }
    }

    pub fn is_seeded(&self, r: usize) -> bool {
        self.seeds.is_some() && self.seeded[r] != 0
    }

    pub fn describe_row(&self, r: usize) -> String {
        let seed = if self.is_seeded(r) {
            format!("seed {:#x} offset {}", self.seeds.as_ref().unwrap()[r], self.offsets[r])
        } else {
            "unseeded".to_string()
        };
        let noise = match &self.noise {
            Some((_, kind, stride)) if !self.is_seeded(r) => format!("external {kind:?} stride {stride}"),
            _ => "inline".to_string(),
        };
        let p = self.step.row(r, self.vocab);
        format!(
            "{}: row {r} of {} x {} (stride {}, {:?}, {:?}), T {}, {seed}, {noise}, filters {:?}, {:?}, top_n {}, \
             full {:?}; prompt {:?}, output {:?}, r {} f {} p {}, bias {:?} {:?}, allowed {:?}, banned {:?}, \
             bitmask {:?}",
            self.label,
            self.rows,
            self.vocab,
            self.row_stride,
            self.dtype,
            self.dists[r],
            self.temps[r],
            self.filters(r),
            self.mode,
            self.top_n,
            self.full_mode,
            p.prompt,
            p.output,
            p.repetition,
            p.frequency,
            p.presence,
            p.bias_ids,
            p.bias_values,
            p.allowed,
            p.banned,
            p.bitmask.map(|w| w.iter().map(|v| format!("{:08x}", *v as u32)).collect::<Vec<_>>().join(" "))
        )
    }

    /// Row `r` alone, as a batch of one row (its noise row too).
    pub fn single(&self, r: usize) -> Case {
        let v = self.vocab;
        let stored = |s: usize| s * self.row_stride..s * self.row_stride + v;
        Case {
            label: format!("{} row {r} alone", self.label),
            vocab: v,
            rows: 1,
            row_stride: v,
            dists: vec![self.dists[r]],
            x: self.row(r).to_vec(),
            f32s: if self.f32s.is_empty() { Vec::new() } else { self.f32s[stored(r)].to_vec() },
            bf16: if self.bf16.is_empty() { Vec::new() } else { self.bf16[stored(r)].to_vec() },
            f16: if self.f16.is_empty() { Vec::new() } else { self.f16[stored(r)].to_vec() },
            dtype: self.dtype,
            temps: vec![self.temps[r]],
            seeds: self.seeds.as_ref().map(|s| vec![s[r]]),
            offsets: vec![self.offsets[r]],
            seeded: vec![self.seeded[r]],
            top_k: self.top_k.as_ref().map(|s| vec![s[r]]),
            top_p: self.top_p.as_ref().map(|s| vec![s[r]]),
            min_p: self.min_p.as_ref().map(|s| vec![s[r]]),
            noise: self
                .noise
                .as_ref()
                .map(|(values, kind, stride)| (values[r * stride..r * stride + v].to_vec(), *kind, v)),
            mode: self.mode,
            top_n: self.top_n,
            full_mode: self.full_mode,
            full_stride: self.full_stride,
            step: self.step.single(r, v),
        }
    }
}

/// Per-row seeds (none in one call of three), offsets and seeded flags.
pub fn random_seeds(rng: &mut TestRng, rows: usize) -> (Option<Vec<u64>>, Vec<u64>, Vec<u8>) {
    let seeds = (rng.below(3) != 0).then(|| (0..rows).map(|_| rng.u64()).collect::<Vec<u64>>());
    let offsets: Vec<u64> = (0..rows).map(|_| rng.u64() % 100_000).collect();
    let seeded: Vec<u8> = (0..rows).map(|_| (rng.below(2) == 0) as u8).collect();
    (seeds, offsets, seeded)
}

/// The filters of one call in two: top_k, top_p and min_p, each given two times in three, with
/// values at and past their edges (top_k 0, -3 and the vocabulary; top_p and min_p 1).
pub type Filters = (Option<Vec<i32>>, Option<Vec<f32>>, Option<Vec<f32>>);

pub fn random_filters(rng: &mut TestRng, rows: usize, vocab: usize) -> Filters {
    let (mut top_k, mut top_p, mut min_p) = (None, None, None);
    if rng.below(2) == 0 {
        let ks = [0i32, 0, 1, 2, 5, 40, 1000, vocab as i32, -3];
        let ps = [1.0f32, 1.0, 0.3, 0.8, 0.95, 0.999];
        let mps = [0.0f32, 0.0, 0.02, 0.1, 0.5, 1.0];
        if rng.below(3) != 0 {
            top_k = Some((0..rows).map(|_| ks[rng.below(ks.len())]).collect());
        }
        if rng.below(3) != 0 {
            top_p = Some((0..rows).map(|_| ps[rng.below(ps.len())]).collect());
        }
        if rng.below(3) != 0 {
            min_p = Some((0..rows).map(|_| mps[rng.below(mps.len())]).collect());
        }
    }
    (top_k, top_p, min_p)
}

/// Noise of `kind` for `rows` rows (one shared row, stride 0, one call in four) and its stride.
/// In one call of four, one value in 500 is special: for E noise one of `exp_specials`, for ln E
/// noise -inf, +inf or NaN (picked by the same draw, NaN past the second).
pub fn random_noise_values(
    rng: &mut TestRng,
    kind: NoiseKind,
    rows: usize,
    vocab: usize,
    exp_specials: &[f32],
) -> (Vec<f32>, usize) {
    let stride = if rng.below(4) == 0 { 0 } else { vocab };
    let count = if stride == 0 { vocab } else { rows * vocab };
    let special = rng.below(4) == 0;
    let values = (0..count)
        .map(|_| {
            let e = rng.exp();
            if special && rng.below(500) == 0 {
                let pick = rng.below(exp_specials.len());
                return match kind {
                    NoiseKind::Exp => exp_specials[pick],
                    NoiseKind::LogExp => [f32::NEG_INFINITY, f32::INFINITY, f32::NAN][pick.min(2)],
                };
            }
            if kind == NoiseKind::Exp {
                e as f32
            } else {
                e.ln() as f32
            }
        })
        .collect();
    (values, stride)
}

pub fn external_noise(rng: &mut TestRng, rows: usize, vocab: usize) -> Option<(Vec<f32>, NoiseKind, usize)> {
    let kind = match rng.below(3) {
        0 => return None,
        1 => NoiseKind::Exp,
        _ => NoiseKind::LogExp,
    };
    // One case in four also holds special values: 0, NaN, negative and subnormal E (-inf, +inf,
    // NaN ln E).
    let (values, stride) = random_noise_values(rng, kind, rows, vocab, &[0.0, f32::NAN, -1.0, 1e-40]);
    Some((values, kind, stride))
}

pub fn make_case(rng: &mut TestRng, dtype: Dtype, index: usize, vocab: usize, rows: usize, edges: &mut Edges) -> Case {
    let dists: Vec<Dist> = (0..rows).map(|_| pick_dist(rng)).collect();
    let mut x: Vec<f32> = Vec::with_capacity(rows * vocab);
    for &d in &dists {
        x.extend(gen_row(rng, d, vocab));
    }
    let step = make_step_inputs(rng, &mut x, rows, vocab, edges);
    let to_dtype = |v: f32| match dtype {
        Dtype::F32 => v,
        Dtype::Bf16 => Bf16::from_f32(v).to_f32(),
        Dtype::F16 => F16::from_f32(v).to_f32(),
    };
    let x: Vec<f32> = x.into_iter().map(to_dtype).collect();
    let row_stride = if rng.below(4) == 0 { vocab + 1 + rng.below(5) } else { vocab };
    // The padding between rows holds values that must never be read.
    let mut stored = vec![f32::NAN; (rows - 1) * row_stride + vocab];
    for r in 0..rows {
        stored[r * row_stride..r * row_stride + vocab].copy_from_slice(&x[r * vocab..(r + 1) * vocab]);
        if r + 1 < rows {
            stored[r * row_stride + vocab] = f32::INFINITY;
        }
    }
    let (f32s, bf16, f16) = match dtype {
        Dtype::F32 => (stored, Vec::new(), Vec::new()),
        Dtype::Bf16 => (Vec::new(), stored.iter().map(|&v| Bf16::from_f32(v)).collect(), Vec::new()),
        Dtype::F16 => (Vec::new(), Vec::new(), stored.iter().map(|&v| F16::from_f32(v)).collect()),
    };
    // T = 0 (greedy) one row in six.
    let temps: Vec<f32> = (0..rows).map(|_| [0.0f32, 0.3, 0.7, 1.0, 1.0, 2.0][rng.below(6)]).collect();
    let (seeds, offsets, seeded) = random_seeds(rng, rows);
    let (top_k, top_p, min_p) = random_filters(rng, rows, vocab);
    let noise = external_noise(rng, rows, vocab);
    let mode = if rng.below(2) == 0 { LogprobMode::Raw } else { LogprobMode::Processed };
    let top_n = [0usize, 1, 3, 20][rng.below(4)].min(vocab);
    let full_mode = [FullMode::Raw, FullMode::Processed, FullMode::ProcessedLogits][rng.below(3)];
    let full_stride = vocab + [0, 0, 2][rng.below(3)];
    Case {
        label: format!("{dtype:?} case {index}"),
        vocab,
        rows,
        row_stride,
        dists,
        x,
        f32s,
        bf16,
        f16,
        dtype,
        temps,
        seeds,
        offsets,
        seeded,
        top_k,
        top_p,
        min_p,
        noise,
        mode,
        top_n,
        full_mode,
        full_stride,
        step,
    }
}

/// The cases of one dtype: vocabularies around the word (32) and block (256) sizes, up to 3000.
pub fn cases(dtype: Dtype, seed: u64, edges: &mut Edges) -> Vec<Case> {
    let mut rng = TestRng::new(seed);
    let mut out = Vec::new();
    let plan: &[(usize, usize, usize)] = &[
        // (vocab, calls, rows)
        (1, 8, 6),
        (2, 10, 6),
        (7, 16, 8),
        (31, 16, 8),
        (32, 16, 8),
        (33, 20, 8),
        (100, 24, 10),
        (255, 14, 8),
        (256, 14, 8),
        (257, 16, 8),
        (513, 16, 8),
        (1000, 20, 8),
        (1025, 10, 6),
        (2048, 6, 8),
        (3000, 8, 6),
        // Past one chunk of the fused scan (4096 tokens), whose touched tokens resolve chunk by chunk.
        (4353, 6, 4),
        (8500, 4, 3),
    ];
    for &(vocab, calls, rows) in plan {
        for _ in 0..calls {
            let r = 1 + rng.below(rows);
            let index = out.len();
            out.push(make_case(&mut rng, dtype, index, vocab, r, edges));
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Running a call.
// ---------------------------------------------------------------------------------------------

/// What the library returned for one call.
#[derive(Clone, Debug, PartialEq)]
pub struct Got {
    pub tokens: Vec<i32>,
    pub flags: Vec<u32>,
    pub lps: Vec<f32>,
    pub ranks: Vec<i32>,
    pub ids: Vec<i32>,
    pub tlps: Vec<f32>,
    pub full: Vec<f32>,
}

/// Output buffers of `rows` rows, every one holding a sentinel.
pub fn sentinels(rows: usize, top_n: usize, full_len: usize) -> Got {
    Got {
        tokens: vec![-7; rows],
        flags: vec![0xdead; rows],
        lps: vec![SENTINEL; rows],
        ranks: vec![-7; rows],
        ids: vec![-7; rows * top_n],
        tlps: vec![SENTINEL; rows * top_n],
        full: vec![SENTINEL; full_len],
    }
}

pub fn run_batch(s: &Sampler, b: &Batch, case: &Case) -> Got {
    let mut g = sentinels(b.rows, case.top_n, b.rows * case.full_stride);
    let want_topn = case.top_n > 0;
    let mut out = Output {
        flags: Some(&mut g.flags),
        logprobs: Some(&mut g.lps),
        ranks: Some(&mut g.ranks),
        top_n: case.top_n,
        topn_ids: want_topn.then_some(&mut g.ids[..]),
        topn_logprobs: want_topn.then_some(&mut g.tlps[..]),
        logprob_mode: case.mode,
        full_logprobs: Some(&mut g.full[..]),
        full_row_stride: case.full_stride,
        full_mode: case.full_mode,
        ..Output::new(&mut g.tokens)
    };
    s.draw(b, &mut out).unwrap_or_else(|e| panic!("{}: the call failed: {e}", case.label));
    g
}

/// The call of `run_batch` asking for tokens and flags alone (on `setup.lean`, whose stream of
/// keys follows `setup.fused`'s) gives the tokens and flags `got` holds.
pub fn check_lean(setup: &Setup, b: &Batch, case: &Case, got: &Got) {
    let (mut tokens, mut flags) = (vec![-7; b.rows], vec![u32::MAX; b.rows]);
    let mut out = Output { flags: Some(&mut flags), ..Output::new(&mut tokens) };
    setup.lean.draw(b, &mut out).unwrap_or_else(|e| panic!("{}: the call failed: {e}", case.label));
    let what = format!(
        "{}: {:?} {} threads {:?}, tokens and flags alone",
        case.label, setup.level, setup.threads, setup.order
    );
    assert_eq!((&tokens, &flags), (&got.tokens, &got.flags), "{what}");
}

pub fn choice_of(level: SimdLevel) -> SimdChoice {
    match level {
        SimdLevel::Scalar => SimdChoice::Scalar,
        SimdLevel::Portable => SimdChoice::Portable,
        SimdLevel::Avx2 => SimdChoice::Avx2,
        SimdLevel::Avx512 => SimdChoice::Avx512,
        SimdLevel::Neon => SimdChoice::Neon,
        SimdLevel::Vxe2 => SimdChoice::Vxe2,
    }
}

/// A config with the filter order, which the settings table (`TOKENRACE_FILTER_ORDER`'s row)
/// must parse to the same value.
pub fn with_order(cfg: Config, order: rf::Order) -> Config {
    let (filter_order, value) = match order {
        rf::Order::TemperatureFirst => (FilterOrder::TemperatureFirst, "temperature_first"),
        rf::Order::FiltersFirst => (FilterOrder::FiltersFirst, "filters_first"),
    };
    let mut parsed = cfg.clone();
    let setting = SETTINGS.iter().find(|s| s.field == "filter_order").expect("the filter_order setting");
    match &setting.apply {
        Apply::Sampler(apply) => apply(&mut parsed, value).unwrap(),
        Apply::Pool(_) => panic!("filter_order is a sampler setting"),
    }
    assert_eq!(parsed.filter_order, filter_order, "TOKENRACE_FILTER_ORDER={value}");
    assert_eq!(Config::default().filter_order, FilterOrder::TemperatureFirst, "the default order");
    Config { filter_order, ..cfg }
}

pub fn config(level: SimdLevel, threads: usize, order: rf::Order) -> Config {
    with_order(
        Config { simd: choice_of(level), seed: Some(STREAM_SEED), max_rows: 4096, threads, ..Config::default() },
        order,
    )
}

/// One configuration: the sampler of the fused draws and the sampler of the plain draws of the
/// materialised rows (two samplers, so that both see the same calls and take the same keys).
pub struct Setup {
    pub level: SimdLevel,
    pub threads: usize,
    pub order: rf::Order,
    pub fused: Sampler,
    pub plain: Sampler,
    /// As `fused`, for the calls that ask for tokens and flags alone (a row with nothing that
    /// reads its whole row may leave its histories to the blocks it visits).
    pub lean: Sampler,
}

pub const ORDERS: [rf::Order; 2] = [rf::Order::TemperatureFirst, rf::Order::FiltersFirst];

/// Every (order, level, threads) this machine runs. Calls of several rows use both threads
/// (forced: the cost model would keep these small calls on one).
pub fn setups() -> Vec<Setup> {
    tokenrace::internals::force_participants(usize::MAX);
    let mut out = Vec::new();
    for order in ORDERS {
        for level in supported_levels() {
            for threads in [1usize, 2] {
                let fused = Sampler::new(config(level, threads, order)).unwrap();
                let plain = Sampler::new(config(level, threads, order)).unwrap();
                let lean = Sampler::new(config(level, threads, order)).unwrap();
                assert_eq!(fused.simd_level(), level);
                out.push(Setup { level, threads, order, fused, plain, lean });
            }
        }
    }
    out
}

/// What a draw with every per-row output writes: (tokens, flags, logprobs, ranks, top-n ids,
/// top-n logprobs).
pub type DrawnRows = (Vec<i32>, Vec<u32>, Vec<f32>, Vec<i32>, Vec<i32>, Vec<f32>);

/// Draws `b` with logprobs in `mode`, ranks and the top `top_n`.
pub fn draw_with_logprobs(s: &Sampler, b: &Batch, mode: LogprobMode, top_n: usize) -> DrawnRows {
    let rows = b.rows;
    let (mut tokens, mut flags, mut lps, mut ranks) =
        (vec![-1; rows], vec![0u32; rows], vec![0f32; rows], vec![0; rows]);
    let (mut ids, mut tlps) = (vec![0; rows * top_n], vec![0f32; rows * top_n]);
    let mut out = Output {
        flags: Some(&mut flags),
        logprobs: Some(&mut lps),
        ranks: Some(&mut ranks),
        top_n,
        topn_ids: Some(&mut ids),
        topn_logprobs: Some(&mut tlps),
        logprob_mode: mode,
        ..Output::new(&mut tokens)
    };
    s.draw(b, &mut out).unwrap();
    (tokens, flags, lps, ranks, ids, tlps)
}

/// The greedy token of the one-row batch `b` and the processed logprob of every token.
pub fn greedy_with_processed_row(b: &Batch) -> (i32, Vec<f32>) {
    let s = Sampler::new(Config { seed: Some(1), ..Config::default() }).unwrap();
    let (mut tokens, mut full) = ([-1], vec![0f32; b.vocab]);
    let mut out = Output {
        full_logprobs: Some(&mut full),
        full_row_stride: b.vocab,
        full_mode: FullMode::Processed,
        ..Output::new(&mut tokens)
    };
    s.draw(b, &mut out).unwrap();
    (tokens[0], full)
}

/// The seeded rows of `fused` (a batch with step inputs) draw what the same rows already
/// processed draw (`plain`, without them): the same token, flags and processed logprob bits, at
/// every level, on 1 and 4 threads, with and without logprobs. `what(threads, logprobs, row)`
/// names a failing row.
pub fn assert_fused_draws_as_plain(fused: &Batch, plain: &Batch, what: impl Fn(usize, bool, usize) -> String) {
    let rows = fused.rows;
    super::each_level(|level| {
        for threads in [1, 4] {
            let s = Sampler::new(config(level, threads, rf::Order::TemperatureFirst)).unwrap();
            for with_logprobs in [false, true] {
                let draw = |b: &Batch| {
                    let (mut tokens, mut flags, mut lps) = (vec![-1; rows], vec![0; rows], vec![0f32; rows]);
                    let mut out = Output {
                        flags: Some(&mut flags),
                        logprob_mode: LogprobMode::Processed,
                        ..Output::new(&mut tokens)
                    };
                    if with_logprobs {
                        out.logprobs = Some(&mut lps);
                    }
                    s.draw(b, &mut out).unwrap();
                    (tokens, flags, lps)
                };
                let fused = draw(fused);
                let plain = draw(plain);
                for r in 0..rows {
                    assert_eq!(
                        (fused.0[r], fused.1[r], fused.2[r].to_bits()),
                        (plain.0[r], plain.1[r], plain.2[r].to_bits()),
                        "{}",
                        what(threads, with_logprobs, r)
                    );
                }
            }
        }
    });
}

/// Draws `b` into sentinel-filled tokens on a sampler seeded with 1 and expects
/// INVALID_ARGUMENT naming `want`, with nothing written; returns the sampler, for checks of
/// its stream.
pub fn expect_draw_error(b: &Batch, want: &str) -> Sampler {
    let s = Sampler::new(Config { seed: Some(1), ..Config::default() }).unwrap();
    let mut tokens = vec![-7; b.rows];
    let err = s.draw(b, &mut Output::new(&mut tokens)).expect_err(want);
    assert_eq!(err.kind, ErrorKind::InvalidArgument, "{want}: {err}");
    assert!(err.message.contains(want), "expected a message containing {want:?}, got {:?}", err.message);
    assert!(tokens.iter().all(|&t| t == -7), "{want}: a failed call wrote tokens");
    s
}

/// Rows whose token could not be checked exactly: the filters' cut within rounding of a
/// threshold (`ambiguous`), and near ties.
#[derive(Default, Debug)]
pub struct Unchecked {
    pub ambiguous: usize,
    pub near_ties: usize,
}

impl Unchecked {
    /// A test that skips everything tests nothing: a handful of near ties at most (5, or one
    /// in 500 of the `raced` rows), and at most `ambiguous` filter cuts within rounding.
    pub fn assert_few(&self, raced: usize, ambiguous: usize) {
        let allowed = 5.max(raced / 500);
        assert!(self.near_ties <= allowed, "{} near ties of {} races skipped", self.near_ties, raced);
        assert!(self.ambiguous <= ambiguous, "{} rows with a filter cut within rounding", self.ambiguous);
    }
}

/// Checks the library's token `tok` of a row against the reference's draw `d`: any token when
/// the filters' cut is within rounding of a threshold (`d.ambiguous`: the token depends on it),
/// one of the near-tied best in a near tie (docs/semantics.md, "Noise": the library may return
/// any token whose float64 key is within the documented tolerance of the best), else exactly
/// `d.token`. Rows it cannot check exactly are counted and printed when `count` is given (the
/// first pass over a case). `at` names the row; `more` adds to the message of a wrong token.
pub fn check_drawn_token(
    tok: usize,
    d: &rf::Drawn,
    count: Option<&mut Unchecked>,
    at: &str,
    more: impl Fn() -> String,
) {
    if d.ambiguous {
        if let Some(c) = count {
            c.ambiguous += 1;
            eprintln!("skipped, filter cut within rounding: {at}");
        }
    } else if !d.near.is_empty() {
        if let Some(c) = count {
            c.near_ties += 1;
            eprintln!("skipped near tie ({} vs {:?}, gap {:.2} tolerances): {at}", d.token, d.near, d.gap);
        }
        assert!(
            tok == d.token || d.near.contains(&tok),
            "{at}: token {tok} is none of the near-tied best {} and {:?}",
            d.token,
            d.near
        );
    } else {
        assert_eq!(
            tok,
            d.token,
            "{at}: expected token {} (the closest other, {}, is {:.3e} tolerances below), got {tok}{}",
            d.token,
            d.runner_up,
            d.gap,
            more()
        );
    }
}
