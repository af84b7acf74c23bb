//! The whole sampling step (issue 9, `/work/pipeline-spec.md`): token histories and the three
//! penalties, logit bias, allowed and banned tokens, the grammar bitmask, the filter order and
//! full-vocabulary logprobs, against the float64 reference of `tests/common/reference.rs`
//! (`rf::effective_row`: steps 1-4 of the spec applied literally to a copy of the row, then the
//! reference draw of `tests/reference.rs` on that row).
//!
//! - Random batches mixing every input, every SIMD level, 1 and 2 threads, f32/bf16/f16, seeded,
//!   unseeded and external-noise rows, both filter orders: tokens equal to the reference except
//!   documented near ties (counted, a handful at most), flags equal, logprobs, ranks, top-n and
//!   full-vocabulary logprobs within the documented tolerance.
//! - The same draws against a plain draw (no pipeline inputs) of the effective row the reference
//!   materialises in f32, with the same noise: tokens and flags must be identical.
//! - Batch invariance of seeded rows carrying pipeline inputs; one vocabulary of 151936; pool
//!   noise rows; hand-made rows the spec decides exactly (overflows, -inf bias on +inf and NaN,
//!   bias sums, empty allowed lists); CSR windows and inputs that change nothing.
//! - Chi-square of the sampled distribution against the reference, with power checks: the same
//!   counts reject a reference with the penalty order swapped, one with the bias applied after
//!   the penalties, and (FiltersFirst) one that filters the tempered distribution.
//! - Bad input: every new array, with a message naming the argument, row and position, and
//!   nothing written.
//!
//! `cargo test --test pipeline -- --nocapture` prints the counts.
mod common;

use common::reference as rf;
use common::{chi2, chi2_critical, gen_row, pick_dist, Dist, TestRng};
use tokenrace::*;

/// The seed of every sampler's key stream (so the reference can follow the unseeded rows).
const STREAM_SEED: u64 = 0x91be_11e5_7e9a_0009;
/// What the output buffers hold before a call (a value no draw writes).
const SENTINEL: f32 = 12345.0;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Dtype {
    F32,
    Bf16,
    F16,
}

// ---------------------------------------------------------------------------------------------
// The inputs of a call.
// ---------------------------------------------------------------------------------------------

/// Per-row lists in CSR form, built row by row.
#[derive(Clone, Debug)]
struct Csr {
    ids: Vec<i32>,
    offsets: Vec<u64>,
}

impl Csr {
    fn new() -> Csr {
        Csr { ids: Vec::new(), offsets: vec![0] }
    }
    fn from_rows(rows: &[Vec<i32>]) -> Csr {
        let mut c = Csr::new();
        for r in rows {
            c.push(r);
        }
        c
    }
    fn push(&mut self, row: &[i32]) {
        self.ids.extend_from_slice(row);
        self.offsets.push(self.ids.len() as u64);
    }
    fn row(&self, r: usize) -> &[i32] {
        &self.ids[self.offsets[r] as usize..self.offsets[r + 1] as usize]
    }
    fn lists(&self) -> TokenLists<'_> {
        TokenLists { ids: &self.ids, offsets: &self.offsets }
    }
}

#[derive(Clone, Debug)]
struct BiasCsr {
    ids: Vec<i32>,
    values: Vec<f32>,
    offsets: Vec<u64>,
}

impl BiasCsr {
    fn new() -> BiasCsr {
        BiasCsr { ids: Vec::new(), values: Vec::new(), offsets: vec![0] }
    }
    fn push(&mut self, pairs: &[(i32, f32)]) {
        for &(id, v) in pairs {
            self.ids.push(id);
            self.values.push(v);
        }
        self.offsets.push(self.ids.len() as u64);
    }
    fn row(&self, r: usize) -> (&[i32], &[f32]) {
        let (a, b) = (self.offsets[r] as usize, self.offsets[r + 1] as usize);
        (&self.ids[a..b], &self.values[a..b])
    }
    fn bias(&self) -> LogitBias<'_> {
        LogitBias { ids: &self.ids, values: &self.values, offsets: &self.offsets }
    }
}

/// Every pipeline input of a call, each optional as the API takes it.
#[derive(Clone, Debug, Default)]
struct Pipeline {
    prompt: Option<Csr>,
    output: Option<Csr>,
    repetition: Option<Vec<f32>>,
    frequency: Option<Vec<f32>>,
    presence: Option<Vec<f32>>,
    bias: Option<BiasCsr>,
    allowed: Option<Csr>,
    allowed_rows: Option<Vec<u8>>,
    banned: Option<Csr>,
    /// Words and row stride in words.
    bitmask: Option<(Vec<i32>, usize)>,
}

impl Pipeline {
    fn apply<'a>(&'a self, b: Batch<'a>) -> Batch<'a> {
        Batch {
            prompt_tokens: self.prompt.as_ref().map(Csr::lists),
            output_tokens: self.output.as_ref().map(Csr::lists),
            repetition_penalty: self.repetition.as_deref(),
            frequency_penalty: self.frequency.as_deref(),
            presence_penalty: self.presence.as_deref(),
            logit_bias: self.bias.as_ref().map(BiasCsr::bias),
            allowed_tokens: self.allowed.as_ref().map(Csr::lists),
            allowed_rows: self.allowed_rows.as_deref(),
            banned_tokens: self.banned.as_ref().map(Csr::lists),
            token_bitmask: self.bitmask.as_ref().map(|(w, s)| TokenBitmask { words: w, row_stride: *s }),
            ..b
        }
    }

    fn restricted(&self, r: usize) -> bool {
        self.allowed.is_some() && self.allowed_rows.as_ref().is_none_or(|m| m[r] != 0)
    }

    /// Row `r` as the reference takes it.
    fn row(&self, r: usize, vocab: usize) -> rf::RowInputs<'_> {
        let empty: &[i32] = &[];
        let (bias_ids, bias_values) = self.bias.as_ref().map_or((empty, &[][..]), |b| b.row(r));
        rf::RowInputs {
            prompt: self.prompt.as_ref().map_or(empty, |c| c.row(r)),
            output: self.output.as_ref().map_or(empty, |c| c.row(r)),
            repetition: self.repetition.as_ref().map_or(1.0, |v| v[r]),
            frequency: self.frequency.as_ref().map_or(0.0, |v| v[r]),
            presence: self.presence.as_ref().map_or(0.0, |v| v[r]),
            bias_ids,
            bias_values,
            allowed: if self.restricted(r) { Some(self.allowed.as_ref().unwrap().row(r)) } else { None },
            banned: self.banned.as_ref().map_or(empty, |c| c.row(r)),
            bitmask: self.bitmask.as_ref().map(|(w, s)| &w[r * s..r * s + vocab.div_ceil(32)]),
        }
    }

    /// The pipeline of row `r` alone (a batch of one row).
    fn single(&self, r: usize, vocab: usize) -> Pipeline {
        let one = |c: &Option<Csr>| c.as_ref().map(|c| Csr::from_rows(&[c.row(r).to_vec()]));
        Pipeline {
            prompt: one(&self.prompt),
            output: one(&self.output),
            repetition: self.repetition.as_ref().map(|v| vec![v[r]]),
            frequency: self.frequency.as_ref().map(|v| vec![v[r]]),
            presence: self.presence.as_ref().map(|v| vec![v[r]]),
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
        }
    }
}

/// The ways a generated row can be built to hit an edge of the spec.
#[derive(Clone, Copy, Debug, Default)]
struct Edges {
    /// A -inf bias on the row's only finite token.
    ban_only_finite: usize,
    /// A restricted row with an empty allowed list.
    empty_allowed: usize,
    /// A bitmask row of no allowed token (with ones past vocab).
    zero_bitmask: usize,
    /// A large positive bias on a banned token.
    bias_on_banned: usize,
}

/// Random pipeline inputs for `rows` rows of `x` (which it may edit: zeros and negative values at
/// history tokens, rows of one finite token).
fn make_pipeline(rng: &mut TestRng, x: &mut [f32], rows: usize, vocab: usize, edges: &mut Edges) -> Pipeline {
    if rng.below(8) == 0 {
        return Pipeline::default();
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
    Pipeline {
        prompt: has_prompt.then_some(prompt),
        output: has_output.then_some(output),
        repetition: has_rep.then_some(rep),
        frequency: has_freq.then_some(freq),
        presence: has_pres.then_some(pres),
        bias: has_bias.then_some(bias),
        allowed: has_allowed.then_some(allowed),
        allowed_rows: (has_allowed && has_allowed_rows).then_some(allowed_rows),
        banned: has_banned.then_some(banned),
        bitmask: has_bitmask.then_some((bitmask, stride)),
    }
}

/// One draw call and everything the reference needs to judge it.
struct Case {
    label: String,
    vocab: usize,
    rows: usize,
    row_stride: usize,
    dists: Vec<Dist>,
    /// The logits as the library reads them (after the dtype conversion), as f32, contiguous.
    x: Vec<f32>,
    /// The logits as passed, `row_stride` apart (one of them, by dtype).
    f32s: Vec<f32>,
    bf16: Vec<Bf16>,
    f16: Vec<F16>,
    dtype: Dtype,
    temps: Vec<f32>,
    seeds: Option<Vec<u64>>,
    offsets: Vec<u64>,
    seeded: Vec<u8>,
    top_k: Option<Vec<i32>>,
    top_p: Option<Vec<f32>>,
    min_p: Option<Vec<f32>>,
    /// External noise: values, kind, row stride (0: broadcast).
    noise: Option<(Vec<f32>, NoiseKind, usize)>,
    mode: LogprobMode,
    top_n: usize,
    full_mode: FullMode,
    full_stride: usize,
    pipe: Pipeline,
}

impl Case {
    fn logits(&self) -> Logits<'_> {
        match self.dtype {
            Dtype::F32 => Logits::F32(&self.f32s),
            Dtype::Bf16 => Logits::Bf16(&self.bf16),
            Dtype::F16 => Logits::F16(&self.f16),
        }
    }

    /// The batch without pipeline inputs, on `logits` (`row_stride` apart).
    fn base<'a>(&'a self, logits: Logits<'a>, row_stride: usize) -> Batch<'a> {
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

    /// The call itself: the raw logits with every pipeline input.
    fn batch(&self) -> Batch<'_> {
        self.pipe.apply(self.base(self.logits(), self.row_stride))
    }

    /// A plain call (no pipeline inputs) on the materialised effective rows `y` (contiguous).
    fn plain<'a>(&'a self, y: &'a [f32]) -> Batch<'a> {
        self.base(Logits::F32(y), self.vocab)
    }

    fn row(&self, r: usize) -> &[f32] {
        &self.x[r * self.vocab..(r + 1) * self.vocab]
    }

    fn filters(&self, r: usize) -> rf::Filters {
        rf::Filters {
            top_k: self.top_k.as_ref().map_or(0, |v| v[r]),
            top_p: self.top_p.as_ref().map_or(1.0, |v| v[r]),
            min_p: self.min_p.as_ref().map_or(0.0, |v| v[r]),
        }
    }

    fn is_seeded(&self, r: usize) -> bool {
        self.seeds.is_some() && self.seeded[r] != 0
    }

    fn describe_row(&self, r: usize) -> String {
        let seed = if self.is_seeded(r) {
            format!("seed {:#x} offset {}", self.seeds.as_ref().unwrap()[r], self.offsets[r])
        } else {
            "unseeded".to_string()
        };
        let noise = match &self.noise {
            Some((_, kind, stride)) if !self.is_seeded(r) => format!("external {kind:?} stride {stride}"),
            _ => "inline".to_string(),
        };
        let p = self.pipe.row(r, self.vocab);
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
    fn single(&self, r: usize) -> Case {
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
            pipe: self.pipe.single(r, v),
        }
    }
}

fn external_noise(rng: &mut TestRng, rows: usize, vocab: usize) -> Option<(Vec<f32>, NoiseKind, usize)> {
    let kind = match rng.below(3) {
        0 => return None,
        1 => NoiseKind::Exp,
        _ => NoiseKind::LogExp,
    };
    let stride = if rng.below(4) == 0 { 0 } else { vocab };
    let count = if stride == 0 { vocab } else { rows * vocab };
    let special = rng.below(4) == 0;
    let values = (0..count)
        .map(|_| {
            let e = rng.exp();
            if special && rng.below(500) == 0 {
                return match (kind, rng.below(4)) {
                    (NoiseKind::Exp, 0) => 0.0,
                    (NoiseKind::Exp, 1) => f32::NAN,
                    (NoiseKind::Exp, 2) => -1.0,
                    (NoiseKind::Exp, _) => 1e-40,
                    (NoiseKind::LogExp, 0) => f32::NEG_INFINITY,
                    (NoiseKind::LogExp, 1) => f32::INFINITY,
                    (NoiseKind::LogExp, _) => f32::NAN,
                };
            }
            if kind == NoiseKind::Exp {
                e as f32
            } else {
                e.ln() as f32
            }
        })
        .collect();
    Some((values, kind, stride))
}

fn make_case(rng: &mut TestRng, dtype: Dtype, index: usize, vocab: usize, rows: usize, edges: &mut Edges) -> Case {
    let dists: Vec<Dist> = (0..rows).map(|_| pick_dist(rng)).collect();
    let mut x: Vec<f32> = Vec::with_capacity(rows * vocab);
    for &d in &dists {
        x.extend(gen_row(rng, d, vocab));
    }
    let pipe = make_pipeline(rng, &mut x, rows, vocab, edges);
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
    let seeds = (rng.below(3) != 0).then(|| (0..rows).map(|_| rng.u64()).collect::<Vec<u64>>());
    let offsets: Vec<u64> = (0..rows).map(|_| rng.u64() % 100_000).collect();
    let seeded: Vec<u8> = (0..rows).map(|_| (rng.below(2) == 0) as u8).collect();
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
        pipe,
    }
}

/// The cases of one dtype: vocabularies around the word (32) and block (256) sizes, up to 3000.
fn cases(dtype: Dtype, seed: u64, edges: &mut Edges) -> Vec<Case> {
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
        // Past one chunk of the fused scan (4096 tokens), whose edited tokens resolve chunk by chunk.
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
struct Got {
    tokens: Vec<i32>,
    flags: Vec<u32>,
    lps: Vec<f32>,
    ranks: Vec<i32>,
    ids: Vec<i32>,
    tlps: Vec<f32>,
    full: Vec<f32>,
}

/// Output buffers of `rows` rows, every one holding a sentinel.
fn sentinels(rows: usize, top_n: usize, full_len: usize) -> Got {
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

fn run_batch(s: &Sampler, b: &Batch, case: &Case) -> Got {
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
fn check_lean(setup: &Setup, b: &Batch, case: &Case, got: &Got) {
    let (mut tokens, mut flags) = (vec![-7; b.rows], vec![u32::MAX; b.rows]);
    let mut out = Output { flags: Some(&mut flags), ..Output::new(&mut tokens) };
    setup.lean.draw(b, &mut out).unwrap_or_else(|e| panic!("{}: the call failed: {e}", case.label));
    let what = format!(
        "{}: {:?} {} threads {:?}, tokens and flags alone",
        case.label, setup.level, setup.threads, setup.order
    );
    assert_eq!((&tokens, &flags), (&got.tokens, &got.flags), "{what}");
}

fn choice_of(level: SimdLevel) -> SimdChoice {
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
fn with_order(cfg: Config, order: rf::Order) -> Config {
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

fn config(level: SimdLevel, threads: usize, order: rf::Order) -> Config {
    with_order(
        Config { simd: choice_of(level), seed: Some(STREAM_SEED), max_rows: 4096, threads, ..Config::default() },
        order,
    )
}

/// One configuration: the sampler of the fused draws and the sampler of the plain draws of the
/// materialised rows (two samplers, so that both see the same calls and take the same keys).
struct Setup {
    level: SimdLevel,
    threads: usize,
    order: rf::Order,
    fused: Sampler,
    plain: Sampler,
    /// As `fused`, for the calls that ask for tokens and flags alone (a row with nothing that
    /// reads its whole row may leave its histories to the blocks it visits).
    lean: Sampler,
}

const ORDERS: [rf::Order; 2] = [rf::Order::TemperatureFirst, rf::Order::FiltersFirst];

/// Every (order, level, threads) this machine runs. Calls of several rows use both threads
/// (forced: the cost model would keep these small calls on one).
fn setups() -> Vec<Setup> {
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

// ---------------------------------------------------------------------------------------------
// The reference's view of a call.
// ---------------------------------------------------------------------------------------------

struct OrderRef {
    d: rf::Drawn,
    /// Every token's logprob in the call's `logprob_mode`.
    lp: Vec<f64>,
    /// `full_mode` Raw or Processed: every token's logprob.
    full: Option<Vec<f64>>,
    /// `full_mode` ProcessedLogits, where the spec decides it.
    plogits: Option<Vec<f32>>,
}

struct RowRef {
    y: Vec<f32>,
    /// The reference token of the logits as given, without the pipeline (TemperatureFirst).
    x_token: usize,
    orders: Vec<OrderRef>,
}

/// The noise of each row as the library takes it: seeded, external, or the stream's next key
/// (unseeded sampling rows, in row order; greedy rows take none).
fn row_noises<'a>(case: &'a Case, greedy_below: f32, stream: &mut rf::KeyStream) -> Vec<rf::Noise<'a>> {
    (0..case.rows)
        .map(|r| {
            if case.is_seeded(r) {
                rf::Noise::Inline(rf::row_key(case.seeds.as_ref().unwrap()[r], case.offsets[r]))
            } else if let Some((values, kind, stride)) = &case.noise {
                let row = &values[r * stride..r * stride + case.vocab];
                match kind {
                    NoiseKind::Exp => rf::Noise::Exp(row),
                    NoiseKind::LogExp => rf::Noise::LogExp(row),
                }
            } else if case.temps[r] >= greedy_below {
                rf::Noise::Inline(stream.next())
            } else {
                rf::Noise::Inline(0)
            }
        })
        .collect()
}

fn reference_rows(case: &Case, greedy_below: f32, stream: &mut rf::KeyStream) -> Vec<RowRef> {
    let noises = row_noises(case, greedy_below, stream);
    (0..case.rows)
        .map(|r| {
            let x = case.row(r);
            let y = rf::effective_row(x, &case.pipe.row(r, case.vocab));
            let t = case.temps[r];
            let orders = ORDERS
                .iter()
                .map(|&order| {
                    let d = rf::draw_pipeline(x, &y, t, greedy_below, noises[r], case.filters(r), order);
                    let lp = match case.mode {
                        LogprobMode::Raw => rf::logprobs(x, &d, rf::Mode::Raw),
                        LogprobMode::Processed => rf::logprobs(&y, &d, rf::Mode::Processed),
                    };
                    let (full, plogits) = match case.full_mode {
                        FullMode::Raw => (Some(rf::logprobs(x, &d, rf::Mode::Raw)), None),
                        FullMode::Processed => (Some(rf::logprobs(&y, &d, rf::Mode::Processed)), None),
                        FullMode::ProcessedLogits => (None, rf::processed_logits(&y, &d, t)),
                    };
                    OrderRef { d, lp, full, plogits }
                })
                .collect();
            let x_token = rf::draw(x, t, greedy_below, noises[r], case.filters(r)).token;
            RowRef { y, x_token, orders }
        })
        .collect()
}

#[derive(Default, Debug)]
struct Counts {
    calls: usize,
    rows: usize,
    raced: usize,
    near_ties: usize,
    ambiguous: usize,
    greedy: usize,
    /// Rows whose effective row differs from their logits; rows whose reference token differs
    /// from the token of the logits without the pipeline (the same noise); rows whose token
    /// differs between the filter orders.
    changed_rows: usize,
    changed_tokens: usize,
    order_changed_tokens: usize,
    /// Rows the masks or bans left empty (the logits had a finite or +inf value).
    emptied: usize,
    greedy_penalised: usize,
    posinf: usize,
    nan: usize,
    /// Rows (of the exact check) whose logprobs and full rows were bit-identical to the plain draw's.
    bit_identical: usize,
    full_checked: usize,
    plogits_skipped: usize,
}

fn order_index(order: rf::Order) -> usize {
    ORDERS.iter().position(|&o| o == order).unwrap()
}

/// Checks one call of one setup against the reference (`first`: the counts are taken).
fn check_reference(case: &Case, refs: &[RowRef], got: &Got, setup: &Setup, counts: &mut Counts, first: bool) {
    let (level, threads, order) = (setup.level, setup.threads, setup.order);
    let at = |r: usize| format!("{} [{} level, {threads} threads, {order:?}]", case.describe_row(r), level.name());
    let fs = case.full_stride;
    for (r, rr) in refs.iter().enumerate() {
        let o = &rr.orders[order_index(order)];
        let d = &o.d;
        let x = case.row(r);
        let tok = got.tokens[r];
        assert!((0..case.vocab as i32).contains(&tok), "{}: token {tok} out of range", at(r));
        let tok = tok as usize;
        assert_eq!(got.flags[r], d.flags, "{}: flags (effective row {:?})", at(r), rr.y);
        if first {
            counts.rows += 1;
            counts.raced += d.raced as usize;
            counts.greedy += d.greedy as usize;
            let changed = x.iter().zip(&rr.y).any(|(a, b)| a.to_bits() != b.to_bits() && !(a.is_nan() && b.is_nan()));
            counts.changed_rows += changed as usize;
            counts.emptied += (d.flags & rf::EMPTY != 0 && rf::row_flags(x, false) & rf::EMPTY == 0) as usize;
            counts.changed_tokens += (d.token != rr.x_token) as usize;
            let p = case.pipe.row(r, case.vocab);
            counts.greedy_penalised += (d.greedy && (p.repetition != 1.0 || !p.output.is_empty())) as usize;
            counts.posinf += (d.flags & rf::HAS_POSINF != 0) as usize;
            counts.nan += (d.flags & rf::HAS_NAN != 0) as usize;
        }
        let processed = !d.greedy;
        let lp_processed = case.mode == LogprobMode::Processed && processed;
        let full_processed = case.full_mode != FullMode::Raw && processed;
        if d.ambiguous {
            if first {
                counts.ambiguous += 1;
                eprintln!("skipped, filter cut within rounding: {}", at(r));
            }
        } else if !d.near.is_empty() {
            if first {
                counts.near_ties += 1;
                eprintln!("skipped near tie ({} vs {:?}, gap {:.2} tolerances): {}", d.token, d.near, d.gap, at(r));
            }
            assert!(
                tok == d.token || d.near.contains(&tok),
                "{}: token {tok} is none of the near-tied best {} and {:?}",
                at(r),
                d.token,
                d.near
            );
        } else {
            assert_eq!(
                tok,
                d.token,
                "{}: expected token {} (the closest other, {}, is {:.3e} tolerances below), got {tok}; effective \
                 row {:?}",
                at(r),
                d.token,
                d.runner_up,
                d.gap,
                rr.y
            );
        }
        if !(d.ambiguous && lp_processed) {
            let want = o.lp[tok];
            assert!(
                rf::lp_close(got.lps[r], want),
                "{}: logprob of token {tok}: got {:e}, want {want:e} (logits {:?}, effective row {:?})",
                at(r),
                got.lps[r],
                &x[..x.len().min(8)],
                &rr.y[..x.len().min(8)]
            );
            let (lo, hi) = rf::rank_range(&o.lp, tok);
            let rank = got.ranks[r] as usize;
            assert!(lo <= rank && rank <= hi, "{}: rank of token {tok}: got {rank}, want {lo}..={hi}", at(r));
            let n = case.top_n;
            if n > 0 {
                let want_ids = rf::top_n(&o.lp, n);
                let ids = &got.ids[r * n..(r + 1) * n];
                let tl = &got.tlps[r * n..(r + 1) * n];
                for j in 0..n {
                    let id = ids[j];
                    assert!((0..case.vocab as i32).contains(&id), "{}: top-n id {id} out of range", at(r));
                    let (a, b) = (o.lp[id as usize], o.lp[want_ids[j]]);
                    assert!(rf::lp_close(tl[j], a), "{}: top-n entry {j}: id {id}: {:e}, want {a:e}", at(r), tl[j]);
                    assert!(
                        id as usize == want_ids[j] || a == b || (a - b).abs() <= rf::lp_tolerance(b),
                        "{}: top-n entry {j}: got id {id} ({a:e}), want id {} ({b:e}); got {ids:?}, want {want_ids:?}",
                        at(r),
                        want_ids[j]
                    );
                }
            }
        }
        // The full row, and the padding after it untouched.
        let full = &got.full[r * fs..r * fs + case.vocab];
        assert!(
            got.full[r * fs + case.vocab..(r + 1) * fs].iter().all(|&v| v == SENTINEL),
            "{}: full_logprobs written past vocab (the row stride's padding)",
            at(r)
        );
        if d.ambiguous && full_processed {
            continue;
        }
        if let Some(want) = &o.full {
            if first {
                counts.full_checked += 1;
            }
            for i in 0..case.vocab {
                assert!(
                    rf::lp_close(full[i], want[i]),
                    "{}: full_logprobs ({:?}) of token {i}: got {:e}, want {:e} (logit {}, effective {})",
                    at(r),
                    case.full_mode,
                    full[i],
                    want[i],
                    x[i],
                    rr.y[i]
                );
            }
        } else if let Some(want) = &o.plogits {
            if first {
                counts.full_checked += 1;
            }
            for i in 0..case.vocab {
                assert!(
                    full[i] == want[i],
                    "{}: processed logit of token {i}: got {:e}, want {:e} (logit {}, effective {})",
                    at(r),
                    full[i],
                    want[i],
                    x[i],
                    rr.y[i]
                );
            }
        } else {
            // ProcessedLogits of a sampling row with +inf: the spec leaves the kept set open, but
            // masked tokens are -inf whatever it is.
            if first {
                counts.plogits_skipped += 1;
            }
            let masked = rf::masked(&case.pipe.row(r, case.vocab), case.vocab);
            for i in 0..case.vocab {
                if masked[i] || x[i].is_nan() {
                    assert_eq!(full[i], f32::NEG_INFINITY, "{}: processed logit of masked token {i}", at(r));
                }
            }
        }
    }
}

/// The fused draw on the raw logits against a plain draw of the materialised effective rows with
/// the same noise: the same tokens, the same flags (but HAS_NAN, which the fused draw takes from
/// the raw logits), and in PROCESSED modes the same logprobs.
fn check_plain(
    case: &Case,
    refs: &[RowRef],
    fused: &Got,
    plain: &Got,
    setup: &Setup,
    counts: &mut Counts,
    first: bool,
) {
    let (level, threads, order) = (setup.level, setup.threads, setup.order);
    let at = |r: usize| {
        format!(
            "{} [{} level, {threads} threads, {order:?}] against the plain draw",
            case.describe_row(r),
            level.name()
        )
    };
    let fs = case.full_stride;
    for (r, rr) in refs.iter().enumerate() {
        assert_eq!(
            fused.tokens[r],
            plain.tokens[r],
            "{}: the fused draw and the plain draw of the effective row {:?} differ",
            at(r),
            rr.y
        );
        assert_eq!(fused.flags[r] & !rf::HAS_NAN, plain.flags[r] & !rf::HAS_NAN, "{}: flags", at(r));
        let x_nan = case.row(r).iter().any(|v| v.is_nan());
        assert_eq!(fused.flags[r] & rf::HAS_NAN != 0, x_nan, "{}: HAS_NAN of the raw logits", at(r));
        let mut identical = true;
        if case.mode == LogprobMode::Processed {
            let n = case.top_n;
            let (a, b) = (fused.lps[r], plain.lps[r]);
            identical &= a.to_bits() == b.to_bits();
            assert!(a == b || rf::lp_close(a, b as f64), "{}: logprob {a:e} vs plain {b:e}", at(r));
            let (ta, tb) = (&fused.tlps[r * n..(r + 1) * n], &plain.tlps[r * n..(r + 1) * n]);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            if a.to_bits() == b.to_bits() && bits(ta) == bits(tb) {
                assert_eq!(fused.ranks[r], plain.ranks[r], "{}: rank vs plain", at(r));
                assert_eq!(&fused.ids[r * n..(r + 1) * n], &plain.ids[r * n..(r + 1) * n], "{}: top-n ids", at(r));
            } else {
                identical = false;
                for j in 0..n {
                    assert!(ta[j] == tb[j] || rf::lp_close(ta[j], tb[j] as f64), "{}: top-n {j} vs plain", at(r));
                }
            }
        }
        let (fa, fb) = (&fused.full[r * fs..r * fs + case.vocab], &plain.full[r * fs..r * fs + case.vocab]);
        match case.full_mode {
            FullMode::Raw => {}
            FullMode::Processed => {
                for i in 0..case.vocab {
                    identical &= fa[i].to_bits() == fb[i].to_bits();
                    assert!(
                        fa[i] == fb[i] || rf::lp_close(fa[i], fb[i] as f64),
                        "{}: full processed logprob of {i}: {:e} vs plain {:e}",
                        at(r),
                        fa[i],
                        fb[i]
                    );
                }
            }
            FullMode::ProcessedLogits => {
                for i in 0..case.vocab {
                    assert!(
                        fa[i].to_bits() == fb[i].to_bits() || fa[i] == fb[i],
                        "{}: processed logit of {i}: {:e} vs plain {:e}",
                        at(r),
                        fa[i],
                        fb[i]
                    );
                }
            }
        }
        if first {
            counts.bit_identical += identical as usize;
        }
    }
}

/// Runs every case of a dtype on every setup, against the reference and the plain draw.
fn compare_dtype(dtype: Dtype, seed: u64) {
    let started = std::time::Instant::now();
    let mut edges = Edges::default();
    let cases = cases(dtype, seed, &mut edges);
    let setups = setups();
    let greedy_below = setups[0].fused.config().greedy_below;
    let mut stream = rf::KeyStream::new(STREAM_SEED);
    let mut counts = Counts::default();
    let mut logits = 0;
    for case in &cases {
        let refs = reference_rows(case, greedy_below, &mut stream);
        let y: Vec<f32> = refs.iter().flat_map(|r| r.y.iter().copied()).collect();
        counts.calls += 1;
        logits += case.rows * case.vocab;
        for (k, setup) in setups.iter().enumerate() {
            let first = k == 0 || (setup.order == rf::Order::FiltersFirst && k == setups.len() / 2);
            let got = run_batch(&setup.fused, &case.batch(), case);
            check_reference(case, &refs, &got, setup, &mut counts, first);
            check_lean(setup, &case.batch(), case, &got);
            let plain = run_batch(&setup.plain, &case.plain(&y), case);
            check_plain(case, &refs, &got, &plain, setup, &mut counts, first);
        }
        for rr in &refs {
            counts.order_changed_tokens += (rr.orders[0].d.token != rr.orders[1].d.token) as usize;
        }
    }
    let levels: Vec<&str> = supported_levels().iter().map(|l| l.name()).collect();
    eprintln!(
        "pipeline {dtype:?}: levels {levels:?} x threads [1, 2] x both orders; {} calls, {logits} logits; {counts:?}; \
         edges {edges:?}; {:.1?}",
        counts.calls,
        started.elapsed()
    );
    // A test that skips everything tests nothing.
    assert!(counts.raced * 3 > counts.rows, "too few raced rows: {} of {}", counts.raced, counts.rows);
    let allowed = 5.max(counts.raced / 500);
    assert!(counts.near_ties <= allowed, "{} near ties of {} races skipped", counts.near_ties, counts.raced);
    assert!(counts.ambiguous <= 4, "{} rows with a filter cut within rounding", counts.ambiguous);
    assert!(
        counts.changed_rows * 2 > counts.rows,
        "the pipeline changed only {} of {} rows",
        counts.changed_rows,
        counts.rows
    );
    assert!(
        counts.changed_tokens * 5 > counts.rows,
        "the pipeline changed only {} tokens: {counts:?}",
        counts.changed_tokens
    );
    assert!(counts.emptied >= 5 && counts.greedy_penalised >= 5, "too few edge rows: {counts:?}");
    assert!(counts.posinf >= 5 && counts.nan >= 5, "too few non-finite rows: {counts:?}");
    assert!(
        edges.ban_only_finite >= 3 && edges.empty_allowed >= 3 && edges.zero_bitmask >= 3 && edges.bias_on_banned >= 3,
        "too few edge rows: {edges:?}"
    );
}

#[test]
fn f32_pipeline_draws_match_the_reference_and_the_plain_draw() {
    compare_dtype(Dtype::F32, 901);
}

#[test]
fn bf16_pipeline_draws_match_the_reference_and_the_plain_draw() {
    compare_dtype(Dtype::Bf16, 902);
}

#[test]
fn f16_pipeline_draws_match_the_reference_and_the_plain_draw() {
    compare_dtype(Dtype::F16, 903);
}

// ---------------------------------------------------------------------------------------------
// Batch invariance, and a realistic vocabulary.
// ---------------------------------------------------------------------------------------------

#[test]
fn seeded_rows_with_pipeline_inputs_draw_the_same_alone_and_in_a_batch() {
    let setups = setups();
    let mut rng = TestRng::new(77);
    let mut edges = Edges::default();
    let (mut checked, mut changed) = (0, 0);
    for index in 0..24 {
        let vocab = [33usize, 257, 1000, 3000][index % 4];
        let mut case = make_case(&mut rng, Dtype::F32, index, vocab, 9, &mut edges);
        if index % 3 == 0 {
            case = make_case(&mut rng, [Dtype::Bf16, Dtype::F16][index % 2], index, vocab, 9, &mut edges);
        }
        // Every row seeded but the external-noise ones (also batch-invariant).
        case.seeds.get_or_insert_with(|| (0..9).map(|r| r as u64 * 1000 + 5).collect());
        for r in 0..9 {
            case.seeded[r] = (case.noise.is_none() || r % 2 == 0) as u8;
        }
        for setup in &setups {
            let all = run_batch(&setup.fused, &case.batch(), &case);
            for r in 0..9 {
                let one = case.single(r);
                let alone = run_batch(&setup.fused, &one.batch(), &one);
                let at = format!(
                    "{} [{} level, {} threads, {:?}]",
                    case.describe_row(r),
                    setup.level.name(),
                    setup.threads,
                    setup.order
                );
                assert_eq!(alone.tokens[0], all.tokens[r], "{at}: the token alone and in the batch");
                assert_eq!(alone.flags[0], all.flags[r], "{at}: flags");
                assert_eq!(alone.lps[0].to_bits(), all.lps[r].to_bits(), "{at}: logprob");
                let fs = case.full_stride;
                let (a, b) = (&alone.full[..vocab], &all.full[r * fs..r * fs + vocab]);
                assert!(a.iter().zip(b).all(|(p, q)| p.to_bits() == q.to_bits()), "{at}: full row");
                if setup.threads == 1
                    && setup.level == supported_levels()[0]
                    && setup.order == rf::Order::TemperatureFirst
                {
                    checked += 1;
                    let x = case.row(r);
                    let y = rf::effective_row(x, &case.pipe.row(r, vocab));
                    changed += x.iter().zip(&y).any(|(a, b)| a.to_bits() != b.to_bits() && !a.is_nan()) as usize;
                }
            }
        }
    }
    eprintln!("batch invariance: {checked} rows, {changed} changed by their pipeline inputs");
    assert!(changed * 2 > checked);
}

/// Rows where tokens the penalties touched tie with untouched ones, so that the race among them
/// is decided by the noise alone: a touched token is raced apart from its block's kept tokens,
/// and a bound of its key off by a fraction of a logit skips it where it wins. Half the touched
/// ones are at 0, which the repetition penalty leaves at 0 (the bound, its logit, is then its
/// value exactly); the others at 5, which it takes to 4 (5 / 1.25). Every draw must equal the
/// plain draw of the processed rows. The vocabulary is no multiple of a vector, so that touched
/// tokens lie in the last block's tail too, which the race's vectors do not cover.
#[test]
fn touched_tokens_tied_with_untouched_ones_race_exactly() {
    let (vocab, rows) = (1021usize, 256usize);
    let mut rng = TestRng::new(1025);
    let (mut x, mut y) = (vec![-3.0f32; rows * vocab], vec![-3.0f32; rows * vocab]);
    let mut touched = vec![false; rows * vocab];
    let mut prompt = Vec::new();
    for r in 0..rows {
        let mut ids = Vec::new();
        for k in 0..64 {
            let t = rng.below(vocab);
            if x[r * vocab + t] != -3.0 {
                continue;
            }
            // Rows of two kinds: ties at 0 (a touched token's logit is its value) or at 4.
            let tie = if r % 2 == 0 { 0.0 } else { 4.0 };
            let (given, value) = match k % 4 {
                0 if r % 2 == 0 => (0.0, 0.0),
                0 => (5.0, 4.0),
                _ => (tie, tie),
            };
            (x[r * vocab + t], y[r * vocab + t]) = (given, value);
            if k % 4 == 0 {
                ids.push(t as i32);
                touched[r * vocab + t] = true;
            }
        }
        prompt.push(ids);
    }
    let prompt = Csr::from_rows(&prompt);
    // External noise too (the caller's, as a pool's rows reach the draw): ln E and E, one
    // value per token, where touched blocks are passed over on a bound of their keys.
    let uniform = |rng: &mut TestRng| (rng.below(1 << 20) as f32 + 0.5) / (1 << 20) as f32;
    let e: Vec<f32> = (0..rows * vocab).map(|_| -uniform(&mut rng).ln()).collect();
    let ln_e: Vec<f32> = e.iter().map(|&e| e.ln()).collect();
    let noises = [
        None,
        Some(ExternalNoise { values: &ln_e[..], kind: NoiseKind::LogExp, row_stride: vocab }),
        Some(ExternalNoise { values: &e[..], kind: NoiseKind::Exp, row_stride: vocab }),
    ];
    let mut wins = [0usize; 2];
    for setup in &setups() {
        for (call, (t, noise)) in [1.0f32, 0.5, 2.0].into_iter().flat_map(|t| noises.map(|n| (t, n))).enumerate() {
            let temps = vec![t; rows];
            let seeds: Vec<u64> = (0..rows as u64).map(|r| r * 7 + call as u64 * 1000).collect();
            let seeds = noise.is_none().then_some(&seeds[..]);
            let base = |logits| Batch { temperature: Some(&temps), seeds, noise, ..Batch::new(logits, rows, vocab) };
            let fused = Batch {
                prompt_tokens: Some(TokenLists { ids: &prompt.ids, offsets: &prompt.offsets }),
                repetition_penalty: Some(&[1.25; 256][..]),
                ..base(Logits::F32(&x))
            };
            let (got, _) = common::draw(&setup.fused, &fused);
            let (want, _) = common::draw(&setup.plain, &base(Logits::F32(&y)));
            for r in 0..rows {
                let kind = noise.map(|n| n.kind);
                let at = format!(
                    "row {r}, T = {t}, noise {kind:?} [{} level, {} threads]",
                    setup.level.name(),
                    setup.threads
                );
                assert_eq!(got[r], want[r], "{at}");
                wins[touched[r * vocab + got[r] as usize] as usize] += 1;
            }
        }
    }
    // Both kinds win often, so both ways of racing are exercised.
    eprintln!("untouched / touched winners: {wins:?}");
    assert!(wins[0] > 100 && wins[1] > 100, "untouched / touched winners: {wins:?}");
}

/// A serving-sized row: vocabulary 151936, 4096 prompt and 1024 output tokens, the three
/// penalties, 16 biased ids, a bitmask allowing about 10%; one row (tiled on 2 threads) and two
/// rows, seeded and external noise, top-p, PROCESSED logprobs and the full row.
/// A call of `rows` rows of vocabulary 151936 with issue 9's inputs: 4096 prompt and 1024
/// output tokens favouring the likely tokens (as a real history does), r = 1.1, f = 0.2, p = 0.1,
/// 16 biased ids (one -inf), a bitmask allowing about 10% (the likely tokens among them). Row
/// `r` has the peak `peaks[r]` over N(0, 2) and temperature `temps[r]`. `filtered`: top-p 0.9 on
/// external noise; else no filter, on seeded inline noise.
fn realistic_case(
    rng: &mut TestRng,
    peaks: &[f64],
    temps: &[f32],
    filtered: bool,
    modes: (FullMode, LogprobMode),
) -> Case {
    let (vocab, rows) = (151_936usize, peaks.len());
    let mut x: Vec<f32> = Vec::new();
    let (mut prompt, mut output, mut bias) = (Csr::new(), Csr::new(), BiasCsr::new());
    let words = vocab.div_ceil(32);
    let mut bitmask: Vec<i32> = Vec::new();
    for &peak in peaks {
        let row = common::peaked_logits(rng, vocab, 2.0, peak);
        let mut order: Vec<usize> = (0..vocab).collect();
        order.sort_by(|&a, &b| row[b].partial_cmp(&row[a]).unwrap());
        let pick = |rng: &mut TestRng| {
            if rng.below(2) == 0 {
                order[rng.below(200)] as i32
            } else {
                rng.below(vocab) as i32
            }
        };
        prompt.push(&(0..4096).map(|_| pick(rng)).collect::<Vec<_>>());
        output.push(&(0..1024).map(|_| pick(rng)).collect::<Vec<_>>());
        bias.push(
            &(0..16)
                .map(|k| (pick(rng), if k == 0 { f32::NEG_INFINITY } else { (rng.normal() * 2.0) as f32 }))
                .collect::<Vec<_>>(),
        );
        let mut w: Vec<i32> = (0..words).map(|_| (rng.u64() & rng.u64() & rng.u64()) as i32).collect();
        for &i in &order[..100] {
            if rng.below(2) == 0 {
                w[i / 32] |= 1 << (i % 32);
            }
        }
        bitmask.extend(w);
        x.extend(row);
    }
    let noise = filtered.then(|| ((0..vocab).map(|_| rng.exp() as f32).collect(), NoiseKind::Exp, 0));
    Case {
        label: format!("vocab 151936, {rows} rows, filtered {filtered}"),
        vocab,
        rows,
        row_stride: vocab,
        dists: vec![Dist::Peaked; rows],
        f32s: x.clone(),
        x,
        bf16: Vec::new(),
        f16: Vec::new(),
        dtype: Dtype::F32,
        temps: temps.to_vec(),
        seeds: Some((0..rows as u64).map(|r| 42 + r).collect()),
        offsets: (0..rows as u64).map(|r| 7 + r).collect(),
        // Every row seeded when unfiltered (the inline noise of an unseeded row is the stream's).
        seeded: (0..rows).map(|r| (!filtered || r == 0) as u8).collect(),
        top_k: None,
        top_p: filtered.then(|| vec![0.9; rows]),
        min_p: None,
        noise,
        mode: modes.1,
        top_n: 5,
        full_mode: modes.0,
        full_stride: vocab,
        pipe: Pipeline {
            prompt: Some(prompt),
            output: Some(output),
            repetition: Some(vec![1.1; rows]),
            frequency: Some(vec![0.2; rows]),
            presence: Some(vec![0.1; rows]),
            bias: Some(bias),
            allowed: None,
            allowed_rows: None,
            banned: None,
            bitmask: Some((bitmask, words)),
        },
    }
}

/// `case` drawn by every setup matches the reference and the plain draw of its processed rows,
/// and gives the same tokens and flags when asked for nothing else.
fn check_realistic(case: &Case, setups: &[Setup]) {
    let greedy_below = setups[0].fused.config().greedy_below;
    let mut stream = rf::KeyStream::new(0); // no unseeded inline row here
    let refs = reference_rows(case, greedy_below, &mut stream);
    let y: Vec<f32> = refs.iter().flat_map(|r| r.y.iter().copied()).collect();
    let mut counts = Counts::default();
    for (k, setup) in setups.iter().enumerate() {
        let first = k == 0;
        let started = std::time::Instant::now();
        let got = run_batch(&setup.fused, &case.batch(), case);
        let took = started.elapsed();
        check_reference(case, &refs, &got, setup, &mut counts, first);
        check_lean(setup, &case.batch(), case, &got);
        let plain = run_batch(&setup.plain, &case.plain(&y), case);
        check_plain(case, &refs, &got, &plain, setup, &mut counts, first);
        if first {
            eprintln!(
                "{}, {:?}, {:?}: tokens {:?} (the reference's {:?}) in {took:.1?}",
                case.label,
                case.mode,
                case.full_mode,
                got.tokens,
                refs.iter().map(|r| r.orders[0].d.token).collect::<Vec<_>>()
            );
        }
    }
    assert_eq!(counts.changed_rows, case.rows);
}

#[test]
fn a_realistic_vocabulary_matches_the_reference_and_the_plain_draw() {
    let mut rng = TestRng::new(151);
    let setups = setups();
    for (rows, full_mode, mode) in [
        (1usize, FullMode::Processed, LogprobMode::Processed),
        (1, FullMode::Raw, LogprobMode::Raw),
        (2, FullMode::ProcessedLogits, LogprobMode::Processed),
        (2, FullMode::Raw, LogprobMode::Raw),
    ] {
        let case = realistic_case(&mut rng, &[12.0; 2][..rows], &[1.0, 0.8][..rows], true, (full_mode, mode));
        check_realistic(&case, &setups);
    }
}

/// Rows without filters or logprobs leave their histories to the blocks they visit when few are
/// within reach of the largest value (a sharp peak), and mark them whole otherwise (a peak of
/// 12 over N(0, 2) leaves every block within reach): the same tokens either way, greedy rows and
/// temperatures from 0.3 to 2 among them.
#[test]
fn rows_drawn_from_their_visited_blocks_match_the_reference() {
    let mut rng = TestRng::new(152);
    let setups = setups();
    let peaks = [24.0, 30.0, 24.0, 12.0, 26.0, 12.0];
    for temps in [[1.0f32, 0.3, 0.0, 1.0, 2.0, 0.0], [0.7, 1.0, 1.0, 0.0, 0.0, 0.8]] {
        let case = realistic_case(&mut rng, &peaks, &temps, false, (FullMode::Raw, LogprobMode::Raw));
        check_realistic(&case, &setups);
    }
}

// ---------------------------------------------------------------------------------------------
// Statistics: the sampled distribution against the reference, with power checks.
// ---------------------------------------------------------------------------------------------

/// Chi-square of `counts` against `probs`, or infinity when a token of probability 0 was drawn
/// (a reference that cannot have produced the counts).
fn chi2_or_reject(counts: &[u64], probs: &[f64]) -> (f64, usize) {
    if counts.iter().zip(probs).any(|(&c, &p)| c > 0 && p == 0.0) {
        return (f64::INFINITY, 1);
    }
    chi2(counts, probs)
}

/// The probabilities of drawing each token of the effective row `y` at `t` with `filters`,
/// filtered at `filter_inv_t`.
fn probabilities(y: &[f32], t: f32, filters: rf::Filters, filter_inv_t: f64) -> Vec<f64> {
    let m = rf::finite_max(y);
    let (kept, ambiguous) = rf::filter_set(y, m, filter_inv_t, filters);
    assert!(!ambiguous, "a chi-square row must not have a cut within rounding");
    let w: Vec<f64> = (0..y.len()).map(|i| if kept[i] { ((y[i] as f64 - m) / t as f64).exp() } else { 0.0 }).collect();
    let z: f64 = w.iter().sum();
    w.iter().map(|v| v / z).collect()
}

/// The wrong pipelines the chi-square must tell from the right one.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Wrong {
    /// Frequency and presence before repetition.
    PenaltyOrderSwapped,
    /// Bias after the penalties.
    BiasAfterPenalties,
}

/// The effective row of a wrong pipeline (the reference's steps, reordered).
fn wrong_row(x: &[f32], p: &rf::RowInputs, wrong: Wrong) -> Vec<f32> {
    let n = x.len();
    let masked = rf::masked(p, n);
    let mut count = vec![0usize; n];
    for &id in p.output {
        count[id as usize] += 1;
    }
    let in_prompt: Vec<bool> = (0..n).map(|i| p.prompt.contains(&(i as i32))).collect();
    let bias = |i: usize, y: f32| -> f32 {
        let mut b: Option<f32> = None;
        for (&id, &v) in p.bias_ids.iter().zip(p.bias_values) {
            if id as usize == i {
                b = Some(b.map_or(v, |s| s + v));
            }
        }
        b.map_or(y, |b| y + b)
    };
    let repetition = |i: usize, y: f32| {
        if in_prompt[i] || count[i] > 0 {
            if y > 0.0 {
                y / p.repetition
            } else {
                y * p.repetition
            }
        } else {
            y
        }
    };
    let freq = |i: usize, y: f32| if count[i] > 0 { y - p.frequency * count[i] as f32 - p.presence } else { y };
    (0..n)
        .map(|i| {
            if masked[i] {
                return f32::NEG_INFINITY;
            }
            match wrong {
                Wrong::PenaltyOrderSwapped => repetition(i, freq(i, bias(i, x[i]))),
                Wrong::BiasAfterPenalties => bias(i, freq(i, repetition(i, x[i]))),
            }
        })
        .collect()
}

/// `n` seeded draws of one row with its pipeline inputs, in calls of 2000 rows.
fn sample_counts(
    s: &Sampler,
    x: &[f32],
    pipe: &Pipeline,
    t: f32,
    filters: rf::Filters,
    n: usize,
    seed: u64,
) -> Vec<u64> {
    let vocab = x.len();
    let per_call = 2000;
    let logits: Vec<f32> = x.iter().copied().cycle().take(per_call * vocab).collect();
    let rep = |c: &Option<Csr>| c.as_ref().map(|c| Csr::from_rows(&vec![c.row(0).to_vec(); per_call]));
    let bias = pipe.bias.as_ref().map(|b| {
        let (ids, values) = b.row(0);
        let pairs: Vec<(i32, f32)> = ids.iter().copied().zip(values.iter().copied()).collect();
        let mut all = BiasCsr::new();
        (0..per_call).for_each(|_| all.push(&pairs));
        all
    });
    let words = vocab.div_ceil(32);
    let big = Pipeline {
        prompt: rep(&pipe.prompt),
        output: rep(&pipe.output),
        repetition: pipe.repetition.as_ref().map(|v| vec![v[0]; per_call]),
        frequency: pipe.frequency.as_ref().map(|v| vec![v[0]; per_call]),
        presence: pipe.presence.as_ref().map(|v| vec![v[0]; per_call]),
        bias,
        allowed: rep(&pipe.allowed),
        allowed_rows: None,
        banned: rep(&pipe.banned),
        bitmask: pipe.bitmask.as_ref().map(|(w, _)| (w[..words].repeat(per_call), words)),
    };
    let temps = vec![t; per_call];
    let (top_k, top_p, min_p) =
        (vec![filters.top_k; per_call], vec![filters.top_p; per_call], vec![filters.min_p; per_call]);
    let seeds = vec![seed; per_call];
    let mut counts = vec![0u64; vocab];
    let mut done = 0;
    while done < n {
        let offsets: Vec<u64> = (done..done + per_call).map(|j| j as u64).collect();
        let b = big.apply(Batch {
            temperature: Some(&temps),
            seeds: Some(&seeds),
            offsets: Some(&offsets),
            top_k: Some(&top_k),
            top_p: Some(&top_p),
            min_p: Some(&min_p),
            ..Batch::new(Logits::F32(&logits), per_call, vocab)
        });
        let mut tokens = vec![-1; per_call];
        s.draw(&b, &mut Output::new(&mut tokens)).unwrap();
        for &t in &tokens {
            counts[t as usize] += 1;
        }
        done += per_call;
    }
    counts
}

/// A row where the wrong pipelines differ materially: the likely tokens are in the histories
/// (with counts up to 3) and biased, a tenth of the vocabulary is masked by the bitmask.
fn chi_square_row(vocab: usize) -> (Vec<f32>, Pipeline) {
    let mut rng = TestRng::new(4242);
    let x: Vec<f32> =
        (0..vocab).map(|i| if i < 24 { 3.0 + (i % 6) as f32 * 0.5 } else { (rng.normal() - 0.5) as f32 }).collect();
    // Tokens 0..12 in the prompt, 6..18 in the output (counts 1..3), a few negative ones too.
    let mut p_row: Vec<i32> = (0..12).collect();
    p_row.extend([30, 31, 32]);
    let mut o_row: Vec<i32> = Vec::new();
    for i in 6..18 {
        for _ in 0..1 + i % 3 {
            o_row.push(i);
        }
    }
    o_row.extend([33, 34]);
    // Biases on penalised tokens (some turn a negative logit positive), a -inf, a bias on a masked token.
    let b_row: Vec<(i32, f32)> = vec![
        (2, 2.5),
        (8, 2.0),
        (9, -1.0),
        (14, 3.0),
        (15, 1.5),
        (30, 2.0),
        (33, 3.0),
        (20, f32::NEG_INFINITY),
        (40, 5.0),
        (2, 0.5),
    ];
    let words = vocab.div_ceil(32);
    let mut mask = vec![-1i32; words];
    for i in (40..vocab).step_by(10) {
        mask[i / 32] &= !(1 << (i % 32));
    }
    let pipe = Pipeline {
        prompt: Some(Csr::from_rows(&[p_row])),
        output: Some(Csr::from_rows(&[o_row])),
        repetition: Some(vec![1.8]),
        frequency: Some(vec![0.6]),
        presence: Some(vec![0.4]),
        bias: Some({
            let mut b = BiasCsr::new();
            b.push(&b_row);
            b
        }),
        allowed: None,
        allowed_rows: None,
        banned: Some(Csr::from_rows(&[vec![23]])),
        bitmask: Some((mask, words)),
    };
    (x, pipe)
}

#[test]
fn sampled_distribution_follows_the_reference_and_rejects_wrong_pipelines() {
    check_sampled_distribution(rf::Filters { top_k: 0, top_p: 0.95, min_p: 0.0 });
}

/// Without filters (and without logprobs) the same rows are deferred: their histories are found
/// per visited block (`src/edits/deferred.rs`), and their distribution must be the reference's.
#[test]
fn sampled_distribution_of_deferred_rows_follows_the_reference() {
    check_sampled_distribution(rf::Filters { top_k: 0, top_p: 1.0, min_p: 0.0 });
}

/// Chi-square of 20,000 draws of `chi_square_row` under `filters` against the reference, with
/// power checks: the same counts reject the penalty order swapped and the bias applied after
/// the penalties.
fn check_sampled_distribution(filters: rf::Filters) {
    let vocab = 200;
    let (x, pipe) = chi_square_row(vocab);
    let p = pipe.row(0, vocab);
    let y = rf::effective_row(&x, &p);
    let t = 0.9f32;
    let n = 20_000;
    let level = supported_levels()[supported_levels().len() - 1];
    let s = Sampler::new(config(level, 1, rf::Order::TemperatureFirst)).unwrap();
    let counts = sample_counts(&s, &x, &pipe, t, filters, n, 2024);
    let want = probabilities(&y, t, filters, rf::inv_t32(t));
    let (stat, dof) = chi2_or_reject(&counts, &want);
    let crit = chi2_critical(dof, 5.0);
    eprintln!("chi-square: {stat:.1} on {dof} dof (critical {crit:.1})");
    assert!(stat < crit, "the sampled distribution is not the reference's: chi-square {stat} >= {crit} on {dof} dof");
    assert!(dof >= 20, "too few cells: {dof}");
    for wrong in [Wrong::PenaltyOrderSwapped, Wrong::BiasAfterPenalties] {
        let yw = wrong_row(&x, &p, wrong);
        let pw = probabilities(&yw, t, filters, rf::inv_t32(t));
        // The alternative differs materially (total variation), and the counts reject it.
        let tv: f64 = want.iter().zip(&pw).map(|(a, b)| (a - b).abs()).sum::<f64>() / 2.0;
        let (ws, wd) = chi2_or_reject(&counts, &pw);
        eprintln!("{wrong:?}: total variation {tv:.3}, chi-square {ws:.1} on {wd} dof");
        assert!(tv > 0.05, "{wrong:?} is too close to the right pipeline to test (TV {tv})");
        assert!(ws > chi2_critical(wd, 5.0), "the counts cannot tell {wrong:?} from the right pipeline ({ws})");
        // Not only through a token the wrong pipeline never draws: restricted to the tokens it
        // keeps, the counts still reject its distribution there.
        let inside: Vec<u64> = counts.iter().zip(&pw).map(|(&c, &q)| if q > 0.0 { c } else { 0 }).collect();
        let (rs, rd) = chi2(&inside, &pw);
        eprintln!("{wrong:?}: on its own kept set, chi-square {rs:.1} on {rd} dof");
        assert!(rs > chi2_critical(rd, 5.0), "on its kept set, the counts cannot tell {wrong:?} ({rs})");
        // And the right reference's own counts would reject it: a sampler following the wrong
        // order fails this test.
        let mut rng = TestRng::new(5);
        let mut fake = vec![0u64; vocab];
        let cdf: Vec<f64> = pw
            .iter()
            .scan(0.0, |c, &p| {
                *c += p;
                Some(*c)
            })
            .collect();
        for _ in 0..n {
            let u = rng.f64();
            fake[cdf.iter().position(|&c| c > u).unwrap_or(vocab - 1)] += 1;
        }
        let (fs, fd) = chi2_or_reject(&fake, &want);
        assert!(fs > chi2_critical(fd, 5.0), "a sampler following {wrong:?} would pass ({fs})");
    }
}

#[test]
fn filters_first_filters_the_untempered_distribution() {
    // At T = 2 the tempered distribution is flatter: top-p 0.6 keeps more tokens of it than of
    // the untempered one, so the two orders draw from different sets.
    let vocab = 128;
    let (x, pipe) = chi_square_row(vocab);
    let y = rf::effective_row(&x, &pipe.row(0, vocab));
    let (t, filters) = (2.0f32, rf::Filters { top_k: 0, top_p: 0.6, min_p: 0.0 });
    let n = 20_000;
    let level = supported_levels()[supported_levels().len() - 1];
    let s = Sampler::new(config(level, 1, rf::Order::FiltersFirst)).unwrap();
    let counts = sample_counts(&s, &x, &pipe, t, filters, n, 77);
    let want = probabilities(&y, t, filters, 1.0);
    let (stat, dof) = chi2_or_reject(&counts, &want);
    let crit = chi2_critical(dof, 5.0);
    eprintln!("filters first: chi-square {stat:.1} on {dof} dof (critical {crit:.1})");
    assert!(stat < crit, "FiltersFirst draws: chi-square {stat} >= {crit} on {dof} dof");
    let tempered = probabilities(&y, t, filters, rf::inv_t32(t));
    let kept = |p: &[f64]| p.iter().filter(|&&v| v > 0.0).count();
    assert!(kept(&tempered) > kept(&want) + 3, "the orders keep {} and {} tokens", kept(&tempered), kept(&want));
    let (ws, wd) = chi2_or_reject(&counts, &tempered);
    assert!(ws > chi2_critical(wd, 5.0), "the counts cannot tell FiltersFirst from TemperatureFirst ({ws})");
    // And the default order draws from the tempered set.
    let s = Sampler::new(config(level, 1, rf::Order::TemperatureFirst)).unwrap();
    let counts = sample_counts(&s, &x, &pipe, t, filters, n, 78);
    let (stat, dof) = chi2_or_reject(&counts, &tempered);
    assert!(stat < chi2_critical(dof, 5.0), "TemperatureFirst draws: chi-square {stat} on {dof} dof");
}

// ---------------------------------------------------------------------------------------------
// Bad input.
// ---------------------------------------------------------------------------------------------

/// Draws `b` into sentinel-filled buffers (every output, `full_logprobs` at `full_stride`) and
/// expects INVALID_ARGUMENT with a message containing `want`, and nothing written.
fn expect_error(s: &Sampler, b: &Batch, full_len: usize, full_stride: usize, want: &str) {
    let rows = b.rows;
    let mut g = sentinels(rows, 2, full_len);
    let untouched = g.clone();
    let mut out = Output {
        flags: Some(&mut g.flags),
        logprobs: Some(&mut g.lps),
        ranks: Some(&mut g.ranks),
        top_n: 2,
        topn_ids: Some(&mut g.ids),
        topn_logprobs: Some(&mut g.tlps),
        logprob_mode: LogprobMode::Processed,
        full_logprobs: Some(&mut g.full),
        full_row_stride: full_stride,
        full_mode: FullMode::Processed,
        ..Output::new(&mut g.tokens)
    };
    let err = s.draw(b, &mut out).expect_err(want);
    assert_eq!(err.kind, ErrorKind::InvalidArgument, "{want}: {err}");
    assert!(err.message.contains(want), "expected a message containing {want:?}, got {:?}", err.message);
    assert!(g == untouched, "{want}: the outputs were written by a failed call");
}

/// The lists' ids are checked by the tasks that draw their rows, on several threads; a call
/// must still report the error a check of the whole batch in order finds first (the lists in
/// order, each row by row, before the penalties), and write nothing.
#[test]
fn bad_ids_found_by_the_rows_tasks_are_reported_in_the_batchs_order() {
    fn list<'a>(ids: &'a [i32], offsets: &'a [u64]) -> Option<TokenLists<'a>> {
        Some(TokenLists { ids, offsets })
    }
    // (As `setups`: every call on every thread it may use; never reset, as other tests here
    // rely on it.)
    tokenrace::internals::force_participants(usize::MAX);
    let (rows, vocab) = (64usize, 3000usize);
    let x: Vec<f32> = (0..rows * vocab).map(|i| (i % 97) as f32 / 10.0).collect();
    let temps = vec![0.7f32; rows];
    let ids: Vec<i32> = (0..rows * 20).map(|i| (i * 31 % vocab) as i32).collect();
    let offsets: Vec<u64> = (0..=rows as u64).map(|r| r * 20).collect();
    let with_bad = |bad: &[(usize, i32)]| {
        let mut v = ids.clone();
        for &(entry, id) in bad {
            v[entry] = id;
        }
        v
    };
    let late_two = with_bad(&[(50 * 20 + 3, 3000), (7 * 20 + 5, -4)]);
    let early = with_bad(&[(20 + 1, 5000)]);
    let late = with_bad(&[(50 * 20, 3001)]);
    let penalties = vec![1.1f32; rows];
    let mut zero_first = penalties.clone();
    zero_first[0] = 0.0;
    for threads in [1usize, 2, 4] {
        let s = Sampler::new(Config { seed: Some(3), threads, ..Config::default() }).unwrap();
        let base = Batch { temperature: Some(&temps), ..Batch::new(Logits::F32(&x), rows, vocab) };
        let good = list(&ids, &offsets);
        let cases: [(Batch, &str); 3] = [
            // Two bad rows of one list: the lower.
            (
                Batch { prompt_tokens: list(&late_two, &offsets), output_tokens: good, ..base },
                "batch.prompt_ids[7]: position 5 (entry 145): -4 is not a token id in [0, 3000)",
            ),
            // A bad output id in row 1 and a bad prompt id in row 50: the prompt's, checked first.
            (
                Batch { prompt_tokens: list(&late, &offsets), output_tokens: list(&early, &offsets), ..base },
                "batch.prompt_ids[50]: position 0 (entry 1000): 3001 is not a token id in [0, 3000)",
            ),
            // A bad banned id in row 50 and a repetition penalty of 0 in row 0: the ids, checked
            // before the penalties.
            (
                Batch {
                    banned_tokens: list(&late, &offsets),
                    repetition_penalty: Some(&zero_first),
                    prompt_tokens: good,
                    ..base
                },
                "batch.banned_ids[50]: position 0 (entry 1000): 3001 is not a token id in [0, 3000)",
            ),
        ];
        for (b, want) in &cases {
            expect_error(&s, b, rows * vocab, vocab, want);
        }
        // And the good lists draw.
        let b = Batch { prompt_tokens: good, output_tokens: good, repetition_penalty: Some(&penalties), ..base };
        let mut tokens = vec![0; rows];
        s.draw(&b, &mut Output::new(&mut tokens)).unwrap();
    }
}

#[test]
fn bad_pipeline_inputs_are_refused_with_their_argument_row_and_position() {
    let s = Sampler::new(Config { seed: Some(1), ..Config::default() }).unwrap();
    let (rows, vocab) = (3usize, 40usize);
    let x: Vec<f32> = (0..rows * vocab).map(|i| (i % 7) as f32).collect();
    let base = Batch { temperature: Some(&[1.0, 0.0, 0.5]), ..Batch::new(Logits::F32(&x), rows, vocab) };
    let full = rows * vocab;
    let err = |b: &Batch, want: &str| expect_error(&s, b, full, vocab, want);
    let good = TokenLists { ids: &[1, 2, 3, 4, 5], offsets: &[0, 2, 2, 5] };
    // The good batch draws (so every failure below is the one change).
    let mut tokens = vec![0; rows];
    let mut fl = vec![0.0f32; full];
    let all = Batch {
        prompt_tokens: Some(good),
        output_tokens: Some(good),
        repetition_penalty: Some(&[1.2, 1.0, 0.5]),
        frequency_penalty: Some(&[0.1, -0.5, 0.0]),
        presence_penalty: Some(&[0.0, 2.0, -1.0]),
        logit_bias: Some(LogitBias {
            ids: &[0, 39, 5],
            values: &[1.0, f32::NEG_INFINITY, -2.0],
            offsets: &[0, 1, 2, 3],
        }),
        allowed_tokens: Some(good),
        allowed_rows: Some(&[1, 0, 1]),
        banned_tokens: Some(good),
        token_bitmask: Some(TokenBitmask { words: &[-1; 6], row_stride: 2 }),
        ..base
    };
    s.draw(&all, &mut Output { full_logprobs: Some(&mut fl), full_row_stride: vocab, ..Output::new(&mut tokens) })
        .unwrap();

    // Token ids out of range, in every list: the row, the position in the row and the entry.
    for (field, set) in [("prompt_ids", 0), ("output_ids", 1), ("allowed_ids", 2), ("banned_ids", 3)] {
        for (bad, shown) in [
            (40i32, "40 is not a token id in [0, 40)"),
            (-1, "-1 is not a token id in [0, 40)"),
            (i32::MIN, "-2147483648 is not"),
        ] {
            let ids = [1, 2, 3, 4, bad, 6];
            let l = Some(TokenLists { ids: &ids, offsets: &[0, 2, 2, 6] });
            let b = match set {
                0 => Batch { prompt_tokens: l, ..all },
                1 => Batch { output_tokens: l, ..all },
                2 => Batch { allowed_tokens: l, ..all },
                _ => Batch { banned_tokens: l, ..all },
            };
            err(&b, &format!("batch.{field}[2]: position 2 (entry 4): {shown}"));
        }
    }
    // An allowed list of a row `allowed_rows` leaves out is checked too.
    let b = Batch { allowed_tokens: Some(TokenLists { ids: &[1, 2, 99, 4, 5], offsets: &[0, 2, 3, 5] }), ..all };
    err(&b, "batch.allowed_ids[1]: position 0 (entry 2): 99 is not a token id in [0, 40)");
    let b = Batch {
        logit_bias: Some(LogitBias { ids: &[0, 39, 40], values: &[1.0, 2.0, 3.0], offsets: &[0, 1, 2, 3] }),
        ..all
    };
    err(&b, "batch.bias_ids[2]: position 0 (entry 2): 40 is not a token id in [0, 40)");

    // Offsets: decreasing, past the list, too few.
    for (field, set) in [
        ("prompt_offsets", 0),
        ("output_offsets", 1),
        ("allowed_offsets", 2),
        ("banned_offsets", 3),
        ("bias_offsets", 4),
    ] {
        let with = |offsets: &'static [u64]| {
            let l = Some(TokenLists { ids: &[1, 2, 3, 4, 5], offsets });
            match set {
                0 => Batch { prompt_tokens: l, ..all },
                1 => Batch { output_tokens: l, ..all },
                2 => Batch { allowed_tokens: l, ..all },
                3 => Batch { banned_tokens: l, ..all },
                _ => Batch { logit_bias: Some(LogitBias { ids: &[1, 2, 3, 4, 5], values: &[0.5; 5], offsets }), ..all },
            }
        };
        err(
            &with(&[0, 3, 2, 5]),
            &format!("batch.{field}[2]: 2 is below the previous offset 3 (offsets must not decrease)"),
        );
        err(&with(&[1, 0, 2, 5]), &format!("batch.{field}[1]: 0 is below the previous offset 1"));
        err(&with(&[0, 2, 2, 6]), &format!("batch.{field}[3]: 6 is past the end of the list's 5 entries"));
        err(&with(&[0, 2, 2]), &format!("batch.{field}: has 3 elements, rows + 1 is 4"));
    }
    // Bias values shorter than the offsets say.
    let b =
        Batch { logit_bias: Some(LogitBias { ids: &[0, 1, 2], values: &[1.0, 2.0], offsets: &[0, 1, 2, 3] }), ..all };
    err(&b, "batch.bias_offsets[3]: 3 is past the end of the list's 2 entries");
    // Bias values: +inf and NaN (finite values and -inf are biases).
    for (v, shown) in [(f32::INFINITY, "inf"), (f32::NAN, "NaN")] {
        let values = [1.0, 2.0, 3.0, v, 5.0];
        let b = Batch {
            logit_bias: Some(LogitBias { ids: &[0, 1, 2, 3, 4], values: &values, offsets: &[0, 1, 2, 5] }),
            ..all
        };
        err(&b, &format!("batch.bias_values[2]: position 1 (entry 3): {shown} is not a bias (finite, or -inf to ban)"));
    }

    // Penalties: r <= 0 or not finite; f and p not finite; too short. Greedy rows are checked too.
    for (r, shown) in [(0.0f32, "0"), (-1.0, "-1"), (f32::NAN, "NaN"), (f32::INFINITY, "inf"), (-0.0, "-0")] {
        let v = [1.0, r, 1.0];
        err(
            &Batch { repetition_penalty: Some(&v), ..all },
            &format!("batch.repetition_penalty[1]: {shown} is not a finite number > 0"),
        );
    }
    for (v, shown) in [(f32::NAN, "NaN"), (f32::INFINITY, "inf"), (f32::NEG_INFINITY, "-inf")] {
        let vals = [0.0, 0.0, v];
        err(
            &Batch { frequency_penalty: Some(&vals), ..all },
            &format!("batch.frequency_penalty[2]: {shown} is not finite"),
        );
        err(
            &Batch { presence_penalty: Some(&vals), ..all },
            &format!("batch.presence_penalty[2]: {shown} is not finite"),
        );
    }
    for (field, b) in [
        ("repetition_penalty", Batch { repetition_penalty: Some(&[1.0, 1.0]), ..all }),
        ("frequency_penalty", Batch { frequency_penalty: Some(&[1.0, 1.0]), ..all }),
        ("presence_penalty", Batch { presence_penalty: Some(&[1.0]), ..all }),
        ("allowed_rows", Batch { allowed_rows: Some(&[1, 1]), ..all }),
    ] {
        err(&b, &format!("batch.{field}: has"));
    }
    err(&Batch { allowed_tokens: None, ..all }, "batch.allowed_rows: given without allowed lists");

    // The bitmask: stride below ceil(vocab / 32), too few words.
    err(
        &Batch { token_bitmask: Some(TokenBitmask { words: &[-1; 6], row_stride: 1 }), ..all },
        "batch.bitmask_row_stride: 1 is smaller than ceil(vocab / 32) = 2",
    );
    err(
        &Batch { token_bitmask: Some(TokenBitmask { words: &[-1; 5], row_stride: 2 }), ..all },
        "batch.token_bitmask: has 5 elements",
    );
    err(
        &Batch { token_bitmask: Some(TokenBitmask { words: &[-1; 7], row_stride: 3 }), ..all },
        "batch.token_bitmask: has 7 elements",
    );

    // full_logprobs: too short, stride below vocab.
    expect_error(&s, &all, full - 1, vocab, "out.full_logprobs: has 119 elements");
    expect_error(&s, &all, 2 * 41 + 39, 41, "out.full_logprobs: has 121 elements");
    expect_error(&s, &all, full, vocab - 1, "out.full_row_stride: 39 is smaller than vocab 40");
    // (Right at the span, strided: accepted.)
    let mut fl = vec![0.0f32; 2 * 41 + 40];
    s.draw(&all, &mut Output { full_logprobs: Some(&mut fl), full_row_stride: 41, ..Output::new(&mut tokens) })
        .unwrap();
}

/// Found by the random batches (an F16 row of N(0, 300) logits whose history tokens were set to
/// -0.0 and 0.0, every token masked): RAW logprobs are those of the logits as given, whatever the
/// pipeline does, so a row whose maximum 0 is held by a -0.0 before a +0.0 has every zero at
/// `-ln(count of zeros)`, as a plain draw of the same logits reports.
#[test]
fn raw_logprobs_of_an_edited_row_whose_maximum_is_a_signed_zero_tie() {
    let s = Sampler::new(Config { seed: Some(1), ..Config::default() }).unwrap();
    let x = [-0.0f32, 0.0, 0.0, -5.0];
    let z = 3.0f64 + (-5.0f64).exp();
    let want = [-z.ln(), -z.ln(), -z.ln(), -5.0 - z.ln()];
    let bias = LogitBias { ids: &[3], values: &[0.0], offsets: &[0, 1] };
    let banned = TokenLists { ids: &[0, 1, 2, 3], offsets: &[0, 4] };
    for (what, b) in [
        ("no pipeline input", Batch::new(Logits::F32(&x), 1, 4)),
        ("a bias of 0 on token 3", Batch { logit_bias: Some(bias), ..Batch::new(Logits::F32(&x), 1, 4) }),
        ("every token banned", Batch { banned_tokens: Some(banned), ..Batch::new(Logits::F32(&x), 1, 4) }),
    ] {
        let (mut tok, mut lp, mut full) = ([0i32], [0f32], [0f32; 4]);
        s.draw(
            &b,
            &mut Output {
                logprobs: Some(&mut lp),
                full_logprobs: Some(&mut full),
                full_row_stride: 4,
                ..Output::new(&mut tok)
            },
        )
        .unwrap();
        assert!(
            rf::lp_close(lp[0], want[tok[0] as usize]),
            "{what}: RAW logprob of token {}: got {}, want {}",
            tok[0],
            lp[0],
            want[tok[0] as usize]
        );
        for i in 0..4 {
            assert!(
                rf::lp_close(full[i], want[i]),
                "{what}: full RAW logprob of token {i}: got {}, want {}",
                full[i],
                want[i]
            );
        }
    }
}

/// Hand-made rows whose token the spec decides without a race (greedy, +inf, a single
/// candidate): every level, both thread counts and orders, and the reference, must agree exactly.
#[test]
fn hand_made_rows_follow_the_spec_exactly() {
    let (inf, nan) = (f32::INFINITY, f32::NAN);
    let none = rf::RowInputs::NONE;
    let no_bits: &[i32] = &[0b110];
    // (what, logits, inputs, temperature, token, flags)
    type Row<'a> = (&'a str, Vec<f32>, rf::RowInputs<'a>, f32, usize, u32);
    // Rows of four blocks of 256 tokens (the blocks the draw bounds and works out one by one),
    // -1 everywhere but at the named tokens.
    let blocks = |spikes: &[(usize, f32)]| {
        let mut x = vec![-1.0f32; 1024];
        for &(i, v) in spikes {
            x[i] = v;
        }
        x
    };
    let falling = blocks(&[(10, 5.0), (300, 4.8), (600, 4.7)]);
    let rows: Vec<Row> = vec![
        // The maximum (block 0) and the next (block 1) are repeated below the third (block 2).
        (
            "repeated maxima of two blocks, greedy",
            falling.clone(),
            rf::RowInputs { prompt: &[10, 300], repetition: 1.2, ..none },
            0.0,
            600,
            rf::GREEDY,
        ),
        (
            "repeated maxima of two blocks, sampled",
            falling.clone(),
            rf::RowInputs { prompt: &[300, 10], repetition: 1.2, ..none },
            1e-3,
            600,
            0,
        ),
        (
            "counted maxima of two blocks",
            falling.clone(),
            rf::RowInputs { output: &[300, 10, 10], frequency: 0.2, presence: 0.1, ..none },
            0.0,
            600,
            rf::GREEDY,
        ),
        (
            "a raising bias in another block",
            blocks(&[(10, 5.0), (700, 1.0)]),
            rf::RowInputs { bias_ids: &[700], bias_values: &[10.0], ..none },
            0.0,
            700,
            rf::GREEDY,
        ),
        (
            "a raising bias under repetition",
            blocks(&[(10, 5.0), (700, 1.0)]),
            rf::RowInputs { prompt: &[700, 10], repetition: 1.1, bias_ids: &[700], bias_values: &[10.0], ..none },
            1e-3,
            700,
            0,
        ),
        // 5 / 1.25 = 4 exactly: three blocks tie at 4, the lowest token wins.
        (
            "a tie of a repeated and two untouched maxima",
            blocks(&[(10, 5.0), (300, 4.0), (600, 4.0)]),
            rf::RowInputs { prompt: &[10], repetition: 1.25, ..none },
            0.0,
            10,
            rf::GREEDY,
        ),
        (
            "a tie below a repeated maximum",
            blocks(&[(5, 4.0), (300, 5.0)]),
            rf::RowInputs { prompt: &[300], repetition: 1.25, ..none },
            0.0,
            5,
            rf::GREEDY,
        ),
        (
            "a masked maximum and a repeated one",
            blocks(&[(10, 5.0), (300, 4.8), (600, 4.7)]),
            rf::RowInputs { prompt: &[300], repetition: 1.2, banned: &[10], ..none },
            0.0,
            600,
            rf::GREEDY,
        ),
        ("a banned +inf", vec![1.0, inf, 2.0], rf::RowInputs { banned: &[1], ..none }, 0.0, 2, rf::GREEDY),
        (
            "a -inf bias on +inf",
            vec![1.0, inf, 2.0],
            rf::RowInputs { bias_ids: &[1], bias_values: &[f32::NEG_INFINITY], ..none },
            0.0,
            2,
            rf::GREEDY,
        ),
        (
            "a masked NaN",
            vec![nan, 1.0, 2.0],
            rf::RowInputs { bitmask: Some(no_bits), ..none },
            0.0,
            2,
            rf::GREEDY | rf::HAS_NAN,
        ),
        (
            "a -inf bias on NaN",
            vec![nan, 1.0, 2.0],
            rf::RowInputs { bias_ids: &[0], bias_values: &[f32::NEG_INFINITY], ..none },
            0.0,
            2,
            rf::GREEDY | rf::HAS_NAN,
        ),
        (
            "a bias overflowing to +inf",
            vec![1.0, 3e38, 2.0],
            rf::RowInputs { bias_ids: &[1], bias_values: &[3e38], ..none },
            1.0,
            1,
            rf::HAS_POSINF,
        ),
        (
            "a bias on -inf",
            vec![f32::NEG_INFINITY, -1.0, -2.0],
            rf::RowInputs { bias_ids: &[0], bias_values: &[50.0], ..none },
            0.0,
            1,
            rf::GREEDY,
        ),
        (
            "repetition on +inf",
            vec![1.0, inf, inf],
            rf::RowInputs { prompt: &[1], repetition: 2.0, ..none },
            1.0,
            1,
            rf::HAS_POSINF,
        ),
        (
            "frequency reorders",
            vec![1.0, 2.0],
            rf::RowInputs { output: &[1, 1, 1], frequency: 1.0, ..none },
            0.0,
            0,
            rf::GREEDY,
        ),
        (
            "presence reorders",
            vec![1.0, 1.5],
            rf::RowInputs { output: &[1], presence: 0.6, ..none },
            0.0,
            0,
            rf::GREEDY,
        ),
        // r > 1 on a negative logit makes it smaller, on a positive one smaller too; r < 1 the reverse.
        (
            "repetition on a negative logit",
            vec![-1.0, -1.5],
            rf::RowInputs { prompt: &[0], repetition: 2.0, ..none },
            0.0,
            1,
            rf::GREEDY,
        ),
        (
            "repetition below 1 on a negative logit",
            vec![-1.0, -0.6],
            rf::RowInputs { prompt: &[0], repetition: 0.5, ..none },
            0.0,
            0,
            rf::GREEDY,
        ),
        (
            "repetition on zero",
            vec![0.0, -0.1],
            rf::RowInputs { output: &[0], repetition: 3.0, ..none },
            0.0,
            0,
            rf::GREEDY,
        ),
        (
            "f * c overflows to -inf",
            vec![1.0, 2.0],
            rf::RowInputs { output: &[1, 1], frequency: 3e38, ..none },
            0.0,
            0,
            rf::GREEDY,
        ),
        // -f * c overflows to +inf: the token becomes +inf, a banned one stays -inf (never NaN).
        (
            "-f * c overflows to +inf",
            vec![1.0, 2.0, 0.0],
            rf::RowInputs { output: &[1, 1, 2, 2], frequency: -3e38, banned: &[2], ..none },
            1.0,
            1,
            rf::HAS_POSINF,
        ),
        // The biases of one id are summed first: (1e8 + -1e8) = 0, so y = 1 (not (1 + 1e8) - 1e8 = 0).
        (
            "biases summed before they are added",
            vec![1.0, 0.9],
            rf::RowInputs { bias_ids: &[0, 0], bias_values: &[1e8, -1e8], ..none },
            0.0,
            0,
            rf::GREEDY,
        ),
        (
            "-inf bias on the only finite token",
            vec![f32::NEG_INFINITY, 4.0],
            rf::RowInputs { bias_ids: &[1], bias_values: &[f32::NEG_INFINITY], ..none },
            1.0,
            0,
            rf::EMPTY,
        ),
        ("an empty allowed list", vec![1.0, 2.0], rf::RowInputs { allowed: Some(&[]), ..none }, 1.0, 0, rf::EMPTY),
        ("an allowed list of one", vec![1.0, 2.0, 3.0], rf::RowInputs { allowed: Some(&[0, 0]), ..none }, 1.0, 0, 0),
        ("banned twice", vec![5.0, 2.0, 3.0], rf::RowInputs { banned: &[0, 0], ..none }, 0.0, 2, rf::GREEDY),
        (
            "a large bias on a banned token",
            vec![5.0, 2.0, 3.0],
            rf::RowInputs { banned: &[1], bias_ids: &[1], bias_values: &[100.0], ..none },
            0.0,
            0,
            rf::GREEDY,
        ),
    ];
    let setups = setups();
    for (what, x, p, t, token, fl) in &rows {
        let vocab = x.len();
        let y = rf::effective_row(x, p);
        let d = rf::draw_pipeline(
            x,
            &y,
            *t,
            1e-5,
            rf::Noise::Inline(rf::row_key(3, 4)),
            rf::Filters::OFF,
            rf::Order::TemperatureFirst,
        );
        // (The effective row of a short row says what went wrong; a long one would bury it.)
        let shown = if vocab <= 16 { format!("{y:?}") } else { format!("{vocab} tokens") };
        assert_eq!((d.token, d.flags), (*token, *fl), "the reference on {what}: effective row {shown}");
        let lists = |ids: &[i32]| Csr::from_rows(&[ids.to_vec()]);
        let mut bias = BiasCsr::new();
        bias.push(&p.bias_ids.iter().copied().zip(p.bias_values.iter().copied()).collect::<Vec<_>>());
        let pipe = Pipeline {
            prompt: Some(lists(p.prompt)),
            output: Some(lists(p.output)),
            repetition: Some(vec![p.repetition]),
            frequency: Some(vec![p.frequency]),
            presence: Some(vec![p.presence]),
            bias: Some(bias),
            allowed: p.allowed.map(lists),
            allowed_rows: None,
            banned: Some(lists(p.banned)),
            bitmask: p.bitmask.map(|w| (w.to_vec(), 1)),
        };
        for setup in &setups {
            let b = pipe.apply(Batch {
                temperature: Some(std::slice::from_ref(t)),
                seeds: Some(&[3]),
                offsets: Some(&[4]),
                ..Batch::new(Logits::F32(x), 1, vocab)
            });
            let (tokens, flags) = common::draw(&setup.fused, &b);
            assert_eq!(
                (tokens[0] as usize, flags[0]),
                (*token, *fl),
                "{what} [{} level, {} threads, {:?}]: effective row {shown}",
                setup.level.name(),
                setup.threads,
                setup.order
            );
        }
    }
}

/// Unseeded rows drawing from a noise pool: pool row s holds the per-token E of the key
/// `rf::pool_key(seed, s)` (no blocks), handed to the unseeded sampling rows in order, one lease
/// per call, whole in the ring (a 16-row ring here, which wraps several times). A seeded
/// pool hands out the same values for the same borrows, so two samplers with equal pools must
/// draw the fused and the plain call alike, and the reference follows both.
#[test]
fn pool_noise_rows_match_the_reference_and_the_plain_draw() {
    let vocab = 700;
    let pool_seed = 42;
    let setups: Vec<(SimdLevel, Sampler, Sampler)> = supported_levels()
        .into_iter()
        .map(|level| {
            let make = || {
                let cfg = Config { vocab_size: vocab, ..config(level, 2, rf::Order::TemperatureFirst) };
                let s = Sampler::new(cfg).unwrap();
                let pool = NoisePool::new(PoolConfig {
                    rows: POOL_ROWS,
                    vocab,
                    kind: NoiseKind::Exp,
                    seed: Some(pool_seed),
                    policy: DrainPolicy::Inline,
                    ..PoolConfig::default()
                })
                .unwrap();
                s.attach_pool(std::sync::Arc::new(pool)).unwrap();
                s
            };
            (level, make(), make())
        })
        .collect();
    let greedy_below = setups[0].1.config().greedy_below;
    let mut rng = TestRng::new(55);
    let mut edges = Edges::default();
    const POOL_ROWS: usize = 16;
    let (mut next_row, mut skipped) = (0u64, false);
    let (mut rows, mut from_pool) = (0, 0);
    for index in 0..30 {
        let n = 1 + rng.below(8);
        let mut case = make_case(&mut rng, Dtype::F32, index, vocab, n, &mut edges);
        case.noise = None;
        // The pool rows of the unseeded sampling rows, in row order: one lease per call, whole
        // in the ring (rows up to the ring's end are skipped when it would wrap).
        let lease = (0..case.rows).filter(|&r| !case.is_seeded(r) && case.temps[r] >= greedy_below).count() as u64;
        if lease > 0 && next_row % POOL_ROWS as u64 + lease > POOL_ROWS as u64 {
            next_row += POOL_ROWS as u64 - next_row % POOL_ROWS as u64;
            skipped = true;
        }
        let pool_rows: Vec<Option<Vec<f32>>> = (0..case.rows)
            .map(|r| {
                (!case.is_seeded(r) && case.temps[r] >= greedy_below).then(|| {
                    let key = rf::pool_key(pool_seed, next_row);
                    next_row += 1;
                    (0..vocab).map(|i| rf::exp_of_bits(rf::token_bits(key, i)) as f32).collect()
                })
            })
            .collect();
        let y: Vec<f32> =
            (0..case.rows).flat_map(|r| rf::effective_row(case.row(r), &case.pipe.row(r, vocab))).collect();
        for (level, fused, plain) in &setups {
            let got = run_batch(fused, &case.batch(), &case);
            let want = run_batch(plain, &case.plain(&y), &case);
            for r in 0..case.rows {
                let at = format!("{} [{} level, pool noise]", case.describe_row(r), level.name());
                assert_eq!(got.tokens[r], want.tokens[r], "{at}: the fused and the plain draw differ");
                assert_eq!(got.flags[r] & !rf::HAS_NAN, want.flags[r] & !rf::HAS_NAN, "{at}: flags");
                let noise = match &pool_rows[r] {
                    Some(e) => rf::Noise::Exp(e),
                    None if case.is_seeded(r) => {
                        rf::Noise::Inline(rf::row_key(case.seeds.as_ref().unwrap()[r], case.offsets[r]))
                    }
                    None => rf::Noise::Inline(0),
                };
                let yr = &y[r * vocab..(r + 1) * vocab];
                let d = rf::draw_pipeline(
                    case.row(r),
                    yr,
                    case.temps[r],
                    greedy_below,
                    noise,
                    case.filters(r),
                    rf::Order::TemperatureFirst,
                );
                assert_eq!(got.flags[r], d.flags, "{at}: flags against the reference");
                if !d.ambiguous {
                    let tok = got.tokens[r] as usize;
                    let e = |i: usize| pool_rows[r].as_ref().map(|v| v[i]);
                    assert!(
                        tok == d.token || d.near.contains(&tok),
                        "{at}: token {tok}, the reference's {} (near {:?}); effective {} and {}, E {:?} and {:?}; \
                         pool rows so far {next_row}",
                        d.token,
                        d.near,
                        yr[tok],
                        yr[d.token],
                        e(tok),
                        e(d.token),
                    );
                }
                if *level == supported_levels()[0] {
                    rows += 1;
                    from_pool += pool_rows[r].is_some() as usize;
                }
            }
        }
    }
    eprintln!("pool noise: {rows} rows, {from_pool} from the pool");
    assert!(from_pool * 4 > rows, "too few pool rows: {from_pool} of {rows}");
    assert!(skipped && next_row > 2 * POOL_ROWS as u64, "the ring wrapped too little: {next_row} rows");
}

/// CSR offsets need not start at 0 (rows may be a window of a longer list), a batch of no rows
/// takes one offset, and an all-ones bitmask, an unrestricted row's allowed list and r = 1
/// change nothing.
#[test]
fn csr_windows_empty_batches_and_inputs_that_change_nothing() {
    let s = Sampler::new(Config { seed: Some(5), ..Config::default() }).unwrap();
    let mut rng = TestRng::new(9);
    let (rows, vocab) = (3usize, 300usize);
    let x: Vec<f32> = (0..rows * vocab).map(|_| (rng.normal() * 2.0) as f32).collect();
    let seeds = [1u64, 2, 3];
    let base = Batch { seeds: Some(&seeds), ..Batch::new(Logits::F32(&x), rows, vocab) };
    let ids: Vec<i32> = (0..40).map(|_| rng.below(vocab) as i32).collect();
    let values: Vec<f32> = (0..40).map(|_| (rng.normal() * 3.0) as f32).collect();
    let at_zero: Vec<u64> = vec![0, 5, 5, 17];
    let windowed: Vec<u64> = at_zero.iter().map(|o| o + 11).collect();
    let with = |offsets: &[u64], ids: &[i32], values: &[f32]| {
        let lists = TokenLists { ids, offsets };
        let b = Batch {
            prompt_tokens: Some(lists),
            output_tokens: Some(lists),
            repetition_penalty: Some(&[1.5, 0.5, 2.0]),
            frequency_penalty: Some(&[0.5, 0.5, 0.5]),
            logit_bias: Some(LogitBias { ids, values, offsets }),
            banned_tokens: Some(lists),
            ..base
        };
        common::draw(&s, &b)
    };
    assert_eq!(with(&windowed, &ids, &values), with(&at_zero, &ids[11..], &values[11..]), "a window of the lists");
    // Inputs that change nothing draw what the plain call draws.
    let plain = common::draw(&s, &base);
    let ones = vec![-1i32; rows * vocab.div_ceil(32)];
    let free = Batch {
        token_bitmask: Some(TokenBitmask { words: &ones, row_stride: vocab.div_ceil(32) }),
        allowed_tokens: Some(TokenLists { ids: &ids, offsets: &at_zero }),
        allowed_rows: Some(&[0, 0, 0]),
        prompt_tokens: Some(TokenLists { ids: &ids, offsets: &at_zero }),
        repetition_penalty: Some(&[1.0; 3]),
        frequency_penalty: Some(&[0.0; 3]),
        presence_penalty: Some(&[0.0; 3]),
        ..base
    };
    assert_eq!(common::draw(&s, &free), plain, "an all-ones bitmask, unrestricted rows, r = 1");
    // No rows: one offset, nothing drawn.
    let none = TokenLists { ids: &[], offsets: &[0] };
    let empty = Batch {
        prompt_tokens: Some(none),
        banned_tokens: Some(none),
        token_bitmask: Some(TokenBitmask { words: &[], row_stride: 10 }),
        ..Batch::new(Logits::F32(&[]), 0, vocab)
    };
    s.draw(&empty, &mut Output { full_logprobs: Some(&mut []), full_row_stride: vocab, ..Output::new(&mut []) })
        .unwrap();
    let err = s.draw(
        &Batch { prompt_tokens: Some(TokenLists { ids: &[], offsets: &[] }), ..empty },
        &mut Output::new(&mut []),
    );
    assert!(err.unwrap_err().message.contains("batch.prompt_offsets: has 0 elements, rows + 1 is 1"));
}

/// A row with edits (penalties, bias, banned tokens) and filters, on a peaked row, may be raced
/// block by block and have its filters decided for the winner alone, without its processed
/// values written out; a call asking for processed logprobs writes them out and computes the
/// floor first. Both must give the same token for the same seed, at every level, both filter
/// orders, f32 and bf16. The histories hold the peaks (the touched tokens are the likely ones),
/// a positive bias raises a token of the bulk to the top in some rows, and four near-equal peaks
/// share a block in every third row, so that top-k 2-3 and top-p 0.3-0.8 cut between them.
#[test]
fn filters_of_an_edited_row_decided_after_the_race_give_the_tokens_of_the_threshold() {
    let mut rng = TestRng::new(43);
    let (rows, vocab) = (36usize, 20_003usize);
    let mut x = Vec::new();
    let (mut prompt, mut output, mut bias_ids, mut bias_values, mut banned) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut p_off, mut o_off, mut b_off, mut ban_off) = (vec![0u64], vec![0u64], vec![0u64], vec![0u64]);
    for r in 0..rows {
        let mut row = common::peaked_logits(&mut rng, vocab, 1.0, 12.0);
        if r % 3 == 0 {
            for (j, i) in [(0, 5002), (1, 5003), (2, 5004), (3, 5010)] {
                row[i] = 12.0 - 0.25 * j as f32;
            }
        }
        let mut top: Vec<usize> = (0..vocab).collect();
        top.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
        // The prompt: the two likeliest tokens and 200 random ones; the output: the third
        // likeliest three times and 50 random ones.
        prompt.extend(top[..2].iter().map(|&i| i as i32));
        prompt.extend((0..200).map(|_| rng.below(vocab) as i32));
        output.extend([top[2] as i32; 3]);
        output.extend((0..50).map(|_| rng.below(vocab) as i32));
        if r % 4 == 1 {
            // A bulk token raised to the top, and a peak banned by bias.
            bias_ids.extend([top[5000] as i32, top[1] as i32]);
            bias_values.extend([12.0 - row[top[5000]] + 0.1, f32::NEG_INFINITY]);
        }
        if r % 5 == 2 {
            banned.push(top[0] as i32);
        }
        p_off.push(prompt.len() as u64);
        o_off.push(output.len() as u64);
        b_off.push(bias_ids.len() as u64);
        ban_off.push(banned.len() as u64);
        x.extend(row);
    }
    let temps: Vec<f32> = (0..rows).map(|r| [1.0, 0.7, 1.2, 0.9][r % 4]).collect();
    let ps: Vec<f32> = (0..rows).map(|r| [0.9, 0.5, 0.75, 0.99, 0.3, 0.95, 1.0][r % 7]).collect();
    let mps: Vec<f32> = (0..rows).map(|r| [0.0, 0.0, 0.02, 0.0, 0.2][r % 5]).collect();
    let ks: Vec<i32> = (0..rows).map(|r| [3, 2, 0, 2, 50, 1][r % 6]).collect();
    let rep: Vec<f32> = (0..rows).map(|r| [1.1, 1.3, 1.0, 1.2][r % 4]).collect();
    let (freq, pres) = (vec![0.2f32; rows], vec![0.1f32; rows]);
    let b16: Vec<Bf16> = x.iter().map(|&v| Bf16::from_f32(v)).collect();
    for order in [rf::Order::TemperatureFirst, rf::Order::FiltersFirst] {
        for level in supported_levels() {
            let s = Sampler::new(config(level, 1, order)).unwrap();
            for logits in [Logits::F32(&x), Logits::Bf16(&b16)] {
                for call in 0..10u64 {
                    let seeds: Vec<u64> = (0..rows as u64).map(|r| call * 1000 + r).collect();
                    let b = Batch {
                        temperature: Some(&temps),
                        seeds: Some(&seeds),
                        top_k: Some(&ks),
                        top_p: Some(&ps),
                        min_p: Some(&mps),
                        prompt_tokens: Some(TokenLists { ids: &prompt, offsets: &p_off }),
                        output_tokens: Some(TokenLists { ids: &output, offsets: &o_off }),
                        repetition_penalty: Some(&rep),
                        frequency_penalty: Some(&freq),
                        presence_penalty: Some(&pres),
                        logit_bias: Some(LogitBias { ids: &bias_ids, values: &bias_values, offsets: &b_off }),
                        banned_tokens: Some(TokenLists { ids: &banned, offsets: &ban_off }),
                        ..Batch::new(logits, rows, vocab)
                    };
                    let mut plain = vec![-1; rows];
                    s.draw(&b, &mut Output::new(&mut plain)).unwrap();
                    let (mut tokens, mut lps) = (vec![-1; rows], vec![0f32; rows]);
                    let out = Output {
                        logprobs: Some(&mut lps),
                        logprob_mode: LogprobMode::Processed,
                        ..Output::new(&mut tokens)
                    };
                    s.draw(&b, &mut { out }).unwrap();
                    assert_eq!(plain, tokens, "{order:?} {level:?} call {call}");
                    for (r, &t) in plain.iter().enumerate() {
                        assert!(
                            !banned[ban_off[r] as usize..ban_off[r + 1] as usize].contains(&t),
                            "row {r} drew a banned token"
                        );
                    }
                }
            }
        }
    }
}
