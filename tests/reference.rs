//! The library against an independent float64 reference (`tests/common/reference.rs`): plain loops
//! over the rules of `docs/semantics.md`, noise construction included, with no call into the
//! crate. Every SIMD level this machine has, 1 and 4 threads, f32/bf16/f16, vocabularies from 1
//! to 200,000, temperatures 0 to 2, seeded, unseeded and external-noise rows, the filters, and
//! every logprob output. Tokens must equal the reference except in a near tie, where they must
//! be one of the near-tied tokens (the documented rule, `rf::race64`; counted, and only a handful
//! may be); logprobs
//! must be within the documented tolerance. The reference itself is checked against the
//! distribution it must draw from.
//!
//! `cargo test --test reference -- --nocapture` prints the levels exercised and the counts.
mod common;

use common::reference as rf;
use common::step::{check_drawn_token, choice_of, random_filters, random_noise_values, random_seeds, Unchecked};
use common::{chi2, chi2_critical, each_level, gen_row, pick_dist, softmax64, Dist, TestRng};
use tokenrace::*;

/// The seed of every sampler's key stream (so the reference can follow the unseeded rows).
const STREAM_SEED: u64 = 0x7eca_11ab_1e5e_ed00;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Dtype {
    F32,
    Bf16,
    F16,
}

/// One draw call and everything the reference needs to judge it.
struct Case {
    label: String,
    vocab: usize,
    rows: usize,
    dists: Vec<Dist>,
    /// The logits as the library reads them (after the dtype conversion), as f32.
    x: Vec<f32>,
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
}

impl Case {
    fn logits(&self) -> Logits<'_> {
        match self.dtype {
            Dtype::F32 => Logits::F32(&self.x),
            Dtype::Bf16 => Logits::Bf16(&self.bf16),
            Dtype::F16 => Logits::F16(&self.f16),
        }
    }

    fn batch(&self) -> Batch<'_> {
        Batch {
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
            ..Batch::new(self.logits(), self.rows, self.vocab)
        }
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
            let s = self.seeds.as_ref().unwrap()[r];
            format!("seed {s:#x} offset {}", self.offsets[r])
        } else {
            "unseeded".to_string()
        };
        let noise = match &self.noise {
            Some((_, kind, stride)) if !self.is_seeded(r) => format!("external {kind:?} stride {stride}"),
            _ => "inline".to_string(),
        };
        format!(
            "{}: row {r} of {} x {} ({:?}, {:?}), T {}, {seed}, {noise}, filters {:?}, {:?}, top_n {}",
            self.label,
            self.rows,
            self.vocab,
            self.dtype,
            self.dists[r],
            self.temps[r],
            self.filters(r),
            self.mode,
            self.top_n
        )
    }
}

fn make_case(rng: &mut TestRng, dtype: Dtype, index: usize, vocab: usize, rows: usize) -> Case {
    let dists: Vec<Dist> = (0..rows).map(|_| pick_dist(rng)).collect();
    let mut x: Vec<f32> = Vec::with_capacity(rows * vocab);
    for &d in &dists {
        x.extend(gen_row(rng, d, vocab));
    }
    let bf16: Vec<Bf16> =
        if dtype == Dtype::Bf16 { x.iter().map(|&v| Bf16::from_f32(v)).collect() } else { Vec::new() };
    let f16: Vec<F16> = if dtype == Dtype::F16 { x.iter().map(|&v| F16::from_f32(v)).collect() } else { Vec::new() };
    match dtype {
        Dtype::F32 => {}
        Dtype::Bf16 => x = bf16.iter().map(|v| v.to_f32()).collect(),
        Dtype::F16 => x = f16.iter().map(|v| v.to_f32()).collect(),
    }
    // T = 0 (greedy) one row in six.
    let temps: Vec<f32> = (0..rows).map(|_| [0.0f32, 0.3, 0.3, 1.0, 1.0, 2.0][rng.below(6)]).collect();
    let (seeds, offsets, seeded) = random_seeds(rng, rows);
    let (top_k, top_p, min_p) = random_filters(rng, rows, vocab);
    let noise = match rng.below(3) {
        0 => None,
        k => {
            let kind = if k == 1 { NoiseKind::Exp } else { NoiseKind::LogExp };
            // One case in four also holds special values: 0, +inf, NaN, negative and subnormal E
            // (-inf, +inf, NaN ln E).
            let (values, stride) =
                random_noise_values(rng, kind, rows, vocab, &[0.0, f32::INFINITY, f32::NAN, -1.0, 1e-40]);
            Some((values, kind, stride))
        }
    };
    let mode = if index.is_multiple_of(2) { LogprobMode::Raw } else { LogprobMode::Processed };
    let top_n = [0usize, 1, 3, 20][rng.below(4)].min(vocab);
    Case {
        label: format!("{dtype:?} case {index}"),
        vocab,
        rows,
        dists,
        x,
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
    }
}

/// The cases of one dtype: every vocabulary size, a few calls each, at most ~600K logits a call.
fn cases(dtype: Dtype, seed: u64) -> Vec<Case> {
    let mut rng = TestRng::new(seed);
    let mut out = Vec::new();
    let plan: &[(usize, usize, usize)] = &[
        // (vocab, calls, rows)
        (1, 8, 8),
        (2, 8, 8),
        (3, 8, 8),
        (7, 12, 12),
        (16, 12, 12),
        (100, 16, 16),
        (255, 16, 16),
        (256, 16, 16),
        (257, 16, 16),
        (513, 16, 16),
        (1000, 20, 16),
        (2048, 6, 64),
        (4099, 16, 12),
        (32000, 10, 6),
        (50257, 6, 4),
        (131_072, 4, 2),
        (151_936, 6, 2),
        (200_000, 4, 1),
    ];
    for &(vocab, calls, rows) in plan {
        for _ in 0..calls {
            let r = 1 + rng.below(rows);
            let index = out.len();
            out.push(make_case(&mut rng, dtype, index, vocab, r));
        }
    }
    out
}

/// What the library returned for one call.
struct Got {
    tokens: Vec<i32>,
    flags: Vec<u32>,
    lps: Vec<f32>,
    ranks: Vec<i32>,
    ids: Vec<i32>,
    tlps: Vec<f32>,
}

fn run_library(s: &Sampler, case: &Case) -> Got {
    let rows = case.rows;
    let mut g = Got {
        tokens: vec![-1; rows],
        flags: vec![u32::MAX; rows],
        lps: vec![f32::NAN; rows],
        ranks: vec![-1; rows],
        ids: vec![-1; rows * case.top_n],
        tlps: vec![f32::NAN; rows * case.top_n],
    };
    let want_topn = case.top_n > 0;
    let mut out = Output {
        flags: Some(&mut g.flags),
        logprobs: Some(&mut g.lps),
        ranks: Some(&mut g.ranks),
        top_n: case.top_n,
        topn_ids: want_topn.then_some(&mut g.ids[..]),
        topn_logprobs: want_topn.then_some(&mut g.tlps[..]),
        logprob_mode: case.mode,
        ..Output::new(&mut g.tokens)
    };
    s.draw(&case.batch(), &mut out).unwrap_or_else(|e| panic!("{}: the call failed: {e:?}", case.label));
    g
}

#[derive(Default)]
struct Counts {
    calls: usize,
    rows: usize,
    raced: usize,
    /// Rows checked against a near tie or not at all.
    unchecked: Unchecked,
    lp_checked: usize,
    rank_wide: usize,
    /// Rows by noise: seeded, the sampler's key stream, external E, external ln E.
    noise: [usize; 4],
    /// Raced rows whose filters dropped tokens.
    filtered: usize,
    greedy: usize,
    nonfinite: usize,
    /// Calls that 4 threads split into vocabulary tiles, and calls they spread by rows.
    tiled: usize,
    spread: usize,
}

/// Every (level, threads) this machine runs, with a sampler each, all on the same key stream.
fn samplers() -> Vec<(SimdLevel, usize, Sampler)> {
    let mut out = Vec::new();
    each_level(|level| {
        for threads in [1usize, 4] {
            let cfg = Config {
                simd: choice_of(level),
                seed: Some(STREAM_SEED),
                max_rows: 4096,
                threads,
                ..Config::default()
            };
            let s = Sampler::new(cfg).unwrap();
            assert_eq!(s.simd_level(), level);
            out.push((level, threads, s));
        }
    });
    out
}

/// The reference's view of one row: its draw and every token's logprob.
struct RowRef {
    d: rf::Drawn,
    lp: Vec<f64>,
}

fn reference_rows(case: &Case, greedy_below: f32, stream: &mut rf::KeyStream) -> Vec<RowRef> {
    let mut out = Vec::with_capacity(case.rows);
    for r in 0..case.rows {
        let x = case.row(r);
        let t = case.temps[r];
        let sampling = t >= greedy_below;
        let noise = if case.is_seeded(r) {
            let seed = case.seeds.as_ref().unwrap()[r];
            rf::Noise::Inline(rf::row_key(seed, case.offsets[r]))
        } else if let Some((values, kind, stride)) = &case.noise {
            let row = &values[r * stride..r * stride + case.vocab];
            match kind {
                NoiseKind::Exp => rf::Noise::Exp(row),
                NoiseKind::LogExp => rf::Noise::LogExp(row),
            }
        } else if sampling {
            // Unseeded sampling rows take the stream's next key, in row order.
            rf::Noise::Inline(stream.next())
        } else {
            rf::Noise::Inline(0) // greedy: no noise, no key
        };
        let d = rf::draw(x, t, greedy_below, noise, case.filters(r));
        let mode = if case.mode == LogprobMode::Raw { rf::Mode::Raw } else { rf::Mode::Processed };
        let lp = rf::logprobs(x, &d, mode);
        out.push(RowRef { d, lp });
    }
    out
}

fn check_call(
    case: &Case,
    refs: &[RowRef],
    got: &Got,
    level: SimdLevel,
    threads: usize,
    counts: &mut Counts,
    first: bool,
) {
    let at = |r: usize| format!("{} [{} level, {threads} threads]", case.describe_row(r), level.name());
    for (r, rr) in refs.iter().enumerate() {
        let d = &rr.d;
        let tok = got.tokens[r];
        assert!((0..case.vocab as i32).contains(&tok), "{}: token {tok} out of range", at(r));
        let tok = tok as usize;
        assert_eq!(got.flags[r], d.flags, "{}: flags", at(r));
        let processed = case.mode == LogprobMode::Processed && !d.greedy;
        if first {
            counts.rows += 1;
            if d.raced {
                counts.raced += 1;
            }
            counts.greedy += d.greedy as usize;
            counts.nonfinite += (d.flags & (rf::HAS_POSINF | rf::EMPTY) != 0) as usize;
            if !d.kept.is_empty() {
                let finite = case.row(r).iter().filter(|v| v.is_finite()).count();
                counts.filtered += (d.kept.iter().filter(|&&k| k).count() < finite) as usize;
                let source = if case.is_seeded(r) {
                    0
                } else {
                    match &case.noise {
                        None => 1,
                        Some((_, NoiseKind::Exp, _)) => 2,
                        Some((_, NoiseKind::LogExp, _)) => 3,
                    }
                };
                counts.noise[source] += 1;
            }
        }
        check_drawn_token(tok, d, first.then_some(&mut counts.unchecked), &at(r), String::new);
        if d.ambiguous && processed {
            // The filters' cut is within float64 rounding of a threshold: the PROCESSED logprobs
            // depend on it too.
            continue;
        }
        // Logprobs, judged at the library's token (the same as the reference's outside near ties).
        let want = rr.lp[tok];
        assert!(
            rf::lp_close(got.lps[r], want),
            "{}: logprob of token {tok}: got {:e}, want {want:e}",
            at(r),
            got.lps[r]
        );
        let (lo, hi) = rf::rank_range(&rr.lp, tok);
        let rank = got.ranks[r] as usize;
        assert!(lo <= rank && rank <= hi, "{}: rank of token {tok}: got {rank}, want {lo}..={hi}", at(r));
        if first {
            counts.lp_checked += 1;
            counts.rank_wide += (lo != hi) as usize;
        }
        let n = case.top_n;
        if n > 0 {
            let want_ids = rf::top_n(&rr.lp, n);
            let ids = &got.ids[r * n..(r + 1) * n];
            let tl = &got.tlps[r * n..(r + 1) * n];
            for j in 0..n {
                let id = ids[j];
                assert!((0..case.vocab as i32).contains(&id), "{}: top-n id {id} out of range", at(r));
                let id = id as usize;
                let (a, b) = (rr.lp[id], rr.lp[want_ids[j]]);
                assert!(
                    rf::lp_close(tl[j], a),
                    "{}: top-n entry {j}: id {id} has logprob {:e}, want {a:e}",
                    at(r),
                    tl[j]
                );
                assert!(
                    id == want_ids[j] || a == b || (a - b).abs() <= rf::lp_tolerance(b),
                    "{}: top-n entry {j}: got id {id} ({a:e}), want id {} ({b:e}); got {ids:?}, want {want_ids:?}",
                    at(r),
                    want_ids[j]
                );
                if j > 0 {
                    let ordered = tl[j - 1] > tl[j] || (tl[j - 1] == tl[j] && ids[j - 1] < ids[j]);
                    assert!(ordered, "{}: top-n entries {} and {j} out of order: {ids:?} {tl:?}", at(r), j - 1);
                }
            }
        }
    }
}

/// Runs every case of a dtype at every level and thread count against the reference.
fn compare_dtype(dtype: Dtype, seed: u64) {
    let started = std::time::Instant::now();
    let cases = cases(dtype, seed);
    let configs = samplers();
    let greedy_below = configs[0].2.config().greedy_below;
    assert_eq!(greedy_below, 1e-5, "the documented default greedy threshold");
    let mut stream = rf::KeyStream::new(STREAM_SEED);
    let mut counts = Counts::default();
    let mut logits = 0usize;
    for case in &cases {
        let refs = reference_rows(case, greedy_below, &mut stream);
        counts.calls += 1;
        logits += case.rows * case.vocab;
        // How 4 threads could run the call (src/draw: fewer rows than threads with at least two
        // 32K-logit tiles can be tiled when a test forces the split; the cost model picks).
        if case.rows * case.vocab >= 65_536 {
            if case.rows < 4 && case.vocab >= 65_536 {
                counts.tiled += 1;
            } else {
                counts.spread += 1;
            }
        }
        for (c, (level, threads, s)) in configs.iter().enumerate() {
            let got = run_library(s, case);
            check_call(case, &refs, &got, *level, *threads, &mut counts, c == 0);
        }
    }
    let levels: Vec<&str> = supported_levels().iter().map(|l| l.name()).collect();
    eprintln!(
        "reference {dtype:?}: levels {levels:?} x threads [1, 4]; {} calls, {} rows ({} logits), {} raced, \
         {} near ties skipped, {} filter cuts within rounding, {} logprob rows ({} ranks with a tolerance window); \
         sampling rows with a finite maximum by noise [seeded, stream, E, ln E] {:?}, {} of them filtered; \
         {} greedy, {} +inf/empty rows; at 4 threads {} calls tileable, {} spreadable by rows; {:.1?}",
        counts.calls,
        counts.rows,
        logits,
        counts.raced,
        counts.unchecked.near_ties,
        counts.unchecked.ambiguous,
        counts.lp_checked,
        counts.rank_wide,
        counts.noise,
        counts.filtered,
        counts.greedy,
        counts.nonfinite,
        counts.tiled,
        counts.spread,
        started.elapsed()
    );
    assert!(counts.raced * 2 > counts.rows, "too few raced rows: {} of {}", counts.raced, counts.rows);
    counts.unchecked.assert_few(counts.raced, 2);
}

#[test]
fn f32_draws_and_logprobs_match_the_reference() {
    compare_dtype(Dtype::F32, 101);
}

#[test]
fn bf16_draws_and_logprobs_match_the_reference() {
    compare_dtype(Dtype::Bf16, 202);
}

#[test]
fn f16_draws_and_logprobs_match_the_reference() {
    compare_dtype(Dtype::F16, 303);
}

#[test]
fn greedy_and_nonfinite_rows_match_the_reference_exactly() {
    // Small hand-made rows where every rule decides without a race.
    let rows: Vec<(Vec<f32>, usize, u32)> = vec![
        (vec![f32::NAN, f32::NEG_INFINITY, 3.0, f32::NAN], 2, rf::HAS_NAN),
        (vec![0.0, f32::INFINITY, 5.0, f32::INFINITY], 1, rf::HAS_POSINF),
        (vec![f32::NEG_INFINITY; 9], 0, rf::EMPTY),
        (vec![f32::NAN, f32::NEG_INFINITY, f32::NAN], 0, rf::EMPTY | rf::HAS_NAN),
        (vec![f32::NEG_INFINITY, -1e30, f32::NEG_INFINITY], 1, 0),
    ];
    let configs = samplers();
    for (x, want, fl) in rows {
        for t in [0.0f32, 1.0] {
            let (seed, offset) = (11u64, 5u64);
            let d = rf::draw(&x, t, 1e-5, rf::Noise::Inline(rf::row_key(seed, offset)), rf::Filters::OFF);
            let greedy = if t == 0.0 { rf::GREEDY } else { 0 };
            assert_eq!((d.token, d.flags), (want, fl | greedy), "reference on {x:?} at T {t}");
            for (level, threads, s) in &configs {
                let mut tok = [0i32];
                let mut f = [0u32];
                let b = Batch {
                    temperature: Some(&[t]),
                    seeds: Some(&[seed]),
                    offsets: Some(&[offset]),
                    ..Batch::new(Logits::F32(&x), 1, x.len())
                };
                s.draw(&b, &mut Output { flags: Some(&mut f), ..Output::new(&mut tok) }).unwrap();
                assert_eq!(
                    (tok[0] as usize, f[0]),
                    (d.token, d.flags),
                    "{level:?} {threads} threads on {x:?} at T {t}"
                );
            }
        }
    }
}

/// One row for [`greedy_batches_match_the_reference_at_lane_and_block_edges`]: few distinct
/// values (ties everywhere), with its maximum, ties, NaN, +-inf or signed zeros placed at `spots`
/// (lane and block edges, the first and last tokens) by `kind`.
fn edge_row(rng: &mut TestRng, vocab: usize, spots: &[usize], kind: usize) -> Vec<f32> {
    let mut row: Vec<f32> = (0..vocab).map(|_| rng.below(5) as f32 - 4.0).collect();
    let put = |rng: &mut TestRng, row: &mut Vec<f32>, v: f32| row[spots[rng.below(spots.len())]] = v;
    match kind {
        // The maximum at two spots (a tie), or at one.
        0 | 1 => (0..2 - kind).for_each(|_| put(rng, &mut row, 7.0)),
        // NaN at spots, and a maximum tied at two.
        2 => {
            (0..3).for_each(|_| put(rng, &mut row, f32::NAN));
            (0..2).for_each(|_| put(rng, &mut row, 7.0));
        }
        // +inf at two spots (the first wins), NaN at one.
        3 => {
            (0..2).for_each(|_| put(rng, &mut row, f32::INFINITY));
            put(rng, &mut row, f32::NAN);
        }
        // -inf everywhere but a spot or two (-1e30, or nothing: an empty row).
        4 => {
            row.iter_mut().for_each(|v| *v = f32::NEG_INFINITY);
            (0..rng.below(2)).for_each(|_| put(rng, &mut row, -1e30));
        }
        // Zeros of both signs as the maximum (equal: the first wins).
        5 => {
            (0..2).for_each(|_| put(rng, &mut row, -0.0));
            (0..2).for_each(|_| put(rng, &mut row, 0.0));
        }
        // NaN everywhere but -inf at a spot, or NaN alone.
        6 => {
            row.iter_mut().for_each(|v| *v = f32::NAN);
            (0..rng.below(2)).for_each(|_| put(rng, &mut row, f32::NEG_INFINITY));
        }
        // -inf at spots, the maximum tied at a spot and at the last token.
        _ => {
            (0..3).for_each(|_| put(rng, &mut row, f32::NEG_INFINITY));
            put(rng, &mut row, 7.0);
            row[vocab - 1] = 7.0;
        }
    }
    row
}

#[test]
fn greedy_batches_match_the_reference_at_lane_and_block_edges() {
    // Batches of greedy rows alone (the greedy dispatch, one pass a row) and greedy rows among
    // seeded sampling rows, whose maxima, ties and non-finite values sit where the kernels change
    // gear: lanes (15/16), blocks of 256 (255/256, 511/512), the first and last tokens, partial
    // last blocks. Every level and thread count gives the float64 reference's token and flags on
    // the greedy rows, and the first configuration's (scalar, 1 thread) tokens and flags on all.
    let mut rng = TestRng::new(31);
    let configs = samplers();
    for vocab in [1usize, 15, 16, 17, 255, 256, 257, 511, 512, 513, 4096, 4111] {
        let spots: Vec<usize> =
            [0, 15, 16, 255, 256, 511, 512, vocab / 2, vocab - 1].into_iter().filter(|&i| i < vocab).collect();
        for case in 0..16 {
            let rows = 1 + rng.below(6);
            let x: Vec<f32> = (0..rows)
                .flat_map(|_| {
                    let kind = rng.below(8);
                    edge_row(&mut rng, vocab, &spots, kind)
                })
                .collect();
            let temps: Vec<f32> = (0..rows).map(|r| if case % 2 == 0 || r % 2 == 0 { 0.0 } else { 1.0 }).collect();
            let seeds: Vec<u64> = (0..rows as u64).map(|r| 100 + r).collect();
            let b =
                Batch { temperature: Some(&temps), seeds: Some(&seeds), ..Batch::new(Logits::F32(&x), rows, vocab) };
            let mut first: Option<(Vec<i32>, Vec<u32>)> = None;
            for (level, threads, s) in &configs {
                let (mut tok, mut fl) = (vec![-1i32; rows], vec![0u32; rows]);
                s.draw(&b, &mut Output { flags: Some(&mut fl), ..Output::new(&mut tok) }).unwrap();
                for r in (0..rows).filter(|&r| temps[r] == 0.0) {
                    let row = &x[r * vocab..(r + 1) * vocab];
                    let d = rf::draw(row, 0.0, 1e-5, rf::Noise::Inline(rf::row_key(seeds[r], 0)), rf::Filters::OFF);
                    assert_eq!(
                        (tok[r] as usize, fl[r]),
                        (d.token, d.flags),
                        "{level:?} {threads} threads, vocab {vocab}, row {r} of case {case}: {row:?}"
                    );
                }
                match &first {
                    None => first = Some((tok, fl)),
                    Some(want) => {
                        assert_eq!(
                            (&tok, &fl),
                            (&want.0, &want.1),
                            "{level:?} {threads} threads, vocab {vocab}, case {case}"
                        )
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The reference itself: its noise is Exp(1), and its draws follow softmax(x / T).
// ---------------------------------------------------------------------------------------------

/// 20 equiprobable bins of Exp(1) (edges -ln(1 - k/20)) of `scale * E`.
fn exp_bins(values: &[f64], scale: f64) -> Vec<u64> {
    let mut counts = vec![0u64; 20];
    for &e in values {
        let bin = ((1.0 - (-(e * scale)).exp()) * 20.0).floor().min(19.0) as usize;
        counts[bin] += 1;
    }
    counts
}

#[test]
fn reference_inline_noise_is_iid_exp1() {
    let mut rng = TestRng::new(7);
    let (keys, per_key) = (64, 16 * rf::BLOCK);
    let mut all = Vec::with_capacity(keys * per_key);
    let mut positions = vec![0u64; 16];
    let (mut sxy, mut sx, mut sy, mut sxx, mut syy, mut pairs) = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    for _ in 0..keys {
        let key = rng.u64();
        let row: Vec<f64> = (0..per_key).map(|i| rf::inline_noise(key, i)).collect();
        for block in row.chunks(rf::BLOCK) {
            // The block minimum is the smallest value of its block, and its position is uniform.
            let j = (0..rf::BLOCK).fold(0, |b, i| if block[i] < block[b] { i } else { b });
            assert!(block.iter().enumerate().all(|(i, &v)| i == j || v > block[j]));
            positions[j / 16] += 1;
            for w in block.windows(2) {
                (sx, sy, sxx, syy, sxy, pairs) =
                    (sx + w[0], sy + w[1], sxx + w[0] * w[0], syy + w[1] * w[1], sxy + w[0] * w[1], pairs + 1.0);
            }
        }
        all.extend(row);
    }
    let n = all.len() as f64;
    let mean = all.iter().sum::<f64>() / n;
    let var = all.iter().map(|e| (e - mean).powi(2)).sum::<f64>() / n;
    // Exp(1): mean 1, variance 1 (the mean's standard error is 1/sqrt(n)).
    assert!((mean - 1.0).abs() < 5.0 / n.sqrt(), "mean of E {mean}");
    assert!((var - 1.0).abs() < 5.0 * (8.0 / n).sqrt(), "variance of E {var}");
    let corr = (sxy / pairs - sx / pairs * sy / pairs)
        / ((sxx / pairs - (sx / pairs).powi(2)).sqrt() * (syy / pairs - (sy / pairs).powi(2)).sqrt());
    assert!(corr.abs() < 5.0 / pairs.sqrt(), "neighbouring values correlate: {corr}");
    let crit = chi2_critical(19, 5.0);
    let (stat, dof) = chi2(&exp_bins(&all, 1.0), &[0.05; 20]);
    assert!(stat < chi2_critical(dof, 5.0), "E bins: chi-square {stat} on {dof} dof");
    // The same test rejects noise 2% off in scale.
    let (wrong, _) = chi2(&exp_bins(&all, 1.02), &[0.05; 20]);
    assert!(wrong > crit, "the bin test cannot tell E from 1.02 E ({wrong} < {crit})");
    let (stat, dof) = chi2(&positions, &[1.0 / 16.0; 16]);
    assert!(stat < chi2_critical(dof, 5.0), "block minimum positions: chi-square {stat}");
    eprintln!("reference noise: {n} values, mean {mean:.5}, variance {var:.5}, neighbour correlation {corr:.2e}");
}

/// Counts of `n` reference draws of `x` at `t` (seeded rows, one offset each).
fn reference_counts(x: &[f32], t: f32, filters: rf::Filters, n: usize, seed: u64) -> Vec<u64> {
    let mut counts = vec![0u64; x.len()];
    for j in 0..n {
        let d = rf::draw(x, t, 1e-5, rf::Noise::Inline(rf::row_key(seed, j as u64)), filters);
        counts[d.token] += 1;
    }
    counts
}

#[test]
fn reference_draws_follow_softmax_by_chi_square() {
    let ninf = f32::NEG_INFINITY;
    let x: Vec<f32> = vec![1.0, ninf, 0.5, 2.0, -1.0, 2.0, ninf, 0.0, -3.0, 1.5, 3.0, -0.5];
    let n = 100_000;
    for (k, &t) in [0.5f32, 1.0, 2.0].iter().enumerate() {
        let counts = reference_counts(&x, t, rf::Filters::OFF, n, 1000 + k as u64);
        let (stat, dof) = chi2(&counts, &softmax64(&x, t as f64));
        let crit = chi2_critical(dof, 5.0);
        assert!(stat < crit, "T {t}: chi-square {stat} >= {crit} on {dof} dof");
        let (wrong, _) = chi2(&counts, &softmax64(&x, t as f64 * 1.05));
        assert!(wrong > crit, "T {t}: the test cannot tell T from 1.05 T ({wrong} < {crit})");
    }
    // Several blocks: the block construction must not bias any position.
    let mut rng = TestRng::new(8);
    let wide: Vec<f32> = (0..700).map(|_| (rng.normal() * 2.0) as f32).collect();
    let counts = reference_counts(&wide, 1.0, rf::Filters::OFF, 50_000, 2000);
    let (stat, dof) = chi2(&counts, &softmax64(&wide, 1.0));
    let crit = chi2_critical(dof, 5.0);
    assert!(stat < crit, "700 tokens: chi-square {stat} >= {crit} on {dof} dof");
    let (wrong, _) = chi2(&counts, &softmax64(&wide, 1.05));
    assert!(wrong > crit, "700 tokens: the test cannot tell T from 1.05 T ({wrong} < {crit})");
    // Filters: the race among the kept tokens, renormalised. top-k 2 keeps 3.0 and both 2.0 (ties
    // stay); min-p 0.2 keeps w >= 0.2, i.e. x >= 3 + ln 0.2 = 1.39: 3.0, 2.0, 2.0, 1.5.
    let only =
        |keep: &[usize]| -> Vec<f32> { (0..x.len()).map(|i| if keep.contains(&i) { x[i] } else { ninf }).collect() };
    for (filters, keep) in [
        (rf::Filters { top_k: 2, ..rf::Filters::OFF }, vec![3usize, 5, 10]),
        (rf::Filters { min_p: 0.2, ..rf::Filters::OFF }, vec![3, 5, 9, 10]),
    ] {
        let counts = reference_counts(&x, 1.0, filters, n, 3000);
        let (stat, dof) = chi2(&counts, &softmax64(&only(&keep), 1.0));
        assert!(stat < chi2_critical(dof, 5.0), "{filters:?}: chi-square {stat} on {dof} dof");
    }
}

// ---------------------------------------------------------------------------------------------
// The cases the Python suite checks its binding against
// ---------------------------------------------------------------------------------------------

/// Where the draw cases live: rows on external noise and this reference's tokens and kept sets,
/// read by `tests/python/test_sampling.py` and `test_filters.py` so that the race, its near-tie
/// rule and the filters have one float64 reference, this one.
const DRAW_CASES: &str = "tests/fixtures/draw_cases.json";
const DRAW_CASE_ROWS: usize = 24;
const DRAW_CASE_VOCAB: usize = 64;

/// One group of the draw cases: rows of one logits type on one kind of external noise.
struct DrawGroup {
    dtype: Dtype,
    kind: NoiseKind,
    x: Vec<f32>,
    noise: Vec<f32>,
    temps: Vec<f32>,
    filters: Vec<rf::Filters>,
}

impl DrawGroup {
    fn random(rng: &mut TestRng, dtype: Dtype, kind: NoiseKind) -> DrawGroup {
        let (rows, vocab) = (DRAW_CASE_ROWS, DRAW_CASE_VOCAB);
        let mut x = Vec::with_capacity(rows * vocab);
        for r in 0..rows {
            let row: Vec<f32> = match r % 3 {
                // Normal logits with a few masked tokens.
                0 => (0..vocab)
                    .map(|_| if rng.below(20) == 0 { f32::NEG_INFINITY } else { (rng.normal() * 3.0) as f32 })
                    .collect(),
                // Many ties (multiples of 1/4): top-k and top-p cut inside a run of equal logits.
                1 => (0..vocab).map(|_| rng.below(25) as f32 * 0.25).collect(),
                // Every logit shape of the shared generator (NaN, infinities, empty rows).
                _ => {
                    let dist = pick_dist(rng);
                    gen_row(rng, dist, vocab)
                }
            };
            x.extend(row.iter().map(|&v| match dtype {
                Dtype::F16 => F16::from_f32(v).to_f32(),
                Dtype::Bf16 => Bf16::from_f32(v).to_f32(),
                Dtype::F32 => v,
            }));
        }
        let noise = (0..rows * vocab)
            .map(|_| {
                let e = (rng.exp() as f32).max(1e-30);
                match kind {
                    NoiseKind::Exp => e,
                    NoiseKind::LogExp => (e as f64).ln() as f32,
                }
            })
            .collect();
        let temps = (0..rows).map(|_| 0.2 + 2.8 * rng.f64() as f32).collect();
        let filters = (0..rows)
            .map(|_| rf::Filters {
                top_k: [0, 0, 1, 2, 3, 5, 10, vocab as i32, vocab as i32 + 7][rng.below(9)],
                top_p: if rng.below(3) == 0 { 0.05 + 0.94 * rng.f64() as f32 } else { 1.0 },
                min_p: if rng.below(3) == 0 { 0.001 + 0.6 * rng.f64() as f32 } else { 0.0 },
            })
            .collect();
        DrawGroup { dtype, kind, x, noise, temps, filters }
    }

    /// The reference's row `r`.
    fn drawn(&self, r: usize) -> rf::Drawn {
        let row = r * DRAW_CASE_VOCAB..(r + 1) * DRAW_CASE_VOCAB;
        let noise = match self.kind {
            NoiseKind::Exp => rf::Noise::Exp(&self.noise[row.clone()]),
            NoiseKind::LogExp => rf::Noise::LogExp(&self.noise[row.clone()]),
        };
        rf::draw(&self.x[row], self.temps[r], 0.0, noise, self.filters[r])
    }

    fn json(&self) -> String {
        use common::fixtures::{floats, hex, list, or_null};
        let drawn: Vec<rf::Drawn> = (0..DRAW_CASE_ROWS).map(|r| self.drawn(r)).collect();
        // A near tie or an undecided cut: the library may return another token (null).
        let want: Vec<String> = drawn
            .iter()
            .map(|d| or_null((d.near.is_empty() && !d.ambiguous).then_some(d.token), |t| t.to_string()))
            .collect();
        // The kept set of a sampling row whose cut is decided (null otherwise).
        let kept: Vec<String> = drawn
            .iter()
            .map(|d| {
                let decided = !d.kept.is_empty() && !d.ambiguous;
                or_null(decided.then_some(&d.kept), |k| list(&(0..k.len()).filter(|&i| k[i]).collect::<Vec<_>>()))
            })
            .collect();
        let name =
            |f: fn(&rf::Filters) -> String| format!("[{}]", self.filters.iter().map(f).collect::<Vec<_>>().join(", "));
        format!(
            "{{\"dtype\": \"{}\", \"kind\": \"{}\", \"vocab\": {DRAW_CASE_VOCAB}, \"temperature\": {}, \"top_k\": {}, \
             \"top_p\": {}, \"min_p\": {},\n \"want\": [{}],\n \"kept\": [{}],\n \"logits\": {},\n \"noise\": {}}}",
            match self.dtype {
                Dtype::F32 => "float32",
                Dtype::Bf16 => "bfloat16",
                Dtype::F16 => "float16",
            },
            match self.kind {
                NoiseKind::Exp => "exp",
                NoiseKind::LogExp => "log_exp",
            },
            floats(&self.temps),
            name(|f| f.top_k.to_string()),
            name(|f| format!("{:?}", f.top_p as f64)),
            name(|f| format!("{:?}", f.min_p as f64)),
            want.join(", "),
            kept.join(", "),
            hex(&self.x),
            hex(&self.noise),
        )
    }
}

fn draw_groups() -> Vec<DrawGroup> {
    let mut rng = TestRng::new(0xd7a5_ca5e);
    let mut groups = Vec::new();
    for dtype in [Dtype::F32, Dtype::F16] {
        for kind in [NoiseKind::Exp, NoiseKind::LogExp] {
            groups.push(DrawGroup::random(&mut rng, dtype, kind));
        }
    }
    groups
}

/// The committed draw cases are what the reference says today (`TOKENRACE_BLESS=1` rewrites
/// them), they decide most rows, and the library draws them at every level.
#[test]
fn committed_draw_cases_are_current() {
    let groups = draw_groups();
    let body: Vec<String> = groups.iter().map(DrawGroup::json).collect();
    let text = format!(
        "{{\n\"about\": \"rows on external noise, the float64 reference's token (null: a near tie or a filter cut \
         within rounding) and kept set (null: not a sampling row, or an undecided cut); written by \
         tests/reference.rs: TOKENRACE_BLESS=1 cargo test --test reference committed_draw_cases\",\n\"groups\": [\n{}\n]\n}}\n",
        body.join(",\n")
    );
    common::fixtures::check_committed(DRAW_CASES, &text, "cargo test --test reference committed_draw_cases");
    each_level(|level| {
        for g in &groups {
            let s = Sampler::new(Config { simd: choice_of(level), max_rows: 64, ..Config::default() }).unwrap();
            let (rows, vocab) = (DRAW_CASE_ROWS, DRAW_CASE_VOCAB);
            let h16: Vec<F16> = g.x.iter().map(|&v| F16::from_f32(v)).collect();
            let logits = if g.dtype == Dtype::F16 { Logits::F16(&h16) } else { Logits::F32(&g.x) };
            let top_k: Vec<i32> = g.filters.iter().map(|f| f.top_k).collect();
            let top_p: Vec<f32> = g.filters.iter().map(|f| f.top_p).collect();
            let min_p: Vec<f32> = g.filters.iter().map(|f| f.min_p).collect();
            let batch = Batch {
                top_k: Some(&top_k),
                top_p: Some(&top_p),
                min_p: Some(&min_p),
                temperature: Some(&g.temps),
                noise: Some(ExternalNoise { values: &g.noise, kind: g.kind, row_stride: vocab }),
                ..Batch::new(logits, rows, vocab)
            };
            let mut tokens = vec![-1; rows];
            s.draw(&batch, &mut Output::new(&mut tokens)).unwrap();
            let mut decided = 0;
            for (r, &got) in tokens.iter().enumerate() {
                let d = g.drawn(r);
                if d.near.is_empty() && !d.ambiguous {
                    decided += 1;
                    assert_eq!(got as usize, d.token, "{:?} {:?} row {r}", g.dtype, g.kind);
                }
            }
            assert!(decided + 2 >= rows, "{decided} of {rows} rows decided");
        }
    });
}

// ---------------------------------------------------------------------------------------------
// The processed rows the C suite checks the sampling step against
// ---------------------------------------------------------------------------------------------

/// The processed rows of `c_tests/test_step.c`'s two rows, written from this reference's
/// `effective_row` so that the C suite compares the library's sampling step with the one float64
/// reference instead of its own port of the step.
const C_STEP_REFERENCE: &str = "c_tests/step_reference.h";

/// The inputs of `c_tests/test_step.c` (its `main` and the CSR lists above it), as they are
/// there: the rows are its logits after its overrides, the bitmask its words (padding word and
/// bits past the vocabulary included).
fn c_step_processed_rows() -> Vec<f32> {
    const V: usize = 100;
    let mut x: Vec<f32> = (0..2 * V).map(|k| ((k % V * 37 + k / V * 11) % 50) as f32 / 10.0 - 2.0).collect();
    x[10] = 3.0;
    x[20] = 2.5;
    x[30] = 9.0;
    x[7] = 8.0;
    x[V + 41] = -1.0;
    x[V + 55] = 1.0;
    let mut mask = [-1i32; 2 * 5];
    mask[0] &= !(1 << 30);
    mask[3] = 0x5a5a_5a5f;
    mask[5 + 3] = 0x0000_000f;
    mask[5 + 4] = 0;
    mask[5 + 1] = 0xf0f0_f0f0_u32 as i32 | 1 << (55 - 32) | 1 << (41 - 32);
    let rows = [
        rf::RowInputs {
            prompt: &[10, 11, 10],
            output: &[10, 10, 12],
            repetition: 2.0,
            frequency: 1.0,
            presence: 0.5,
            bias_ids: &[20, 20, 7],
            bias_values: &[2.0, 1.0, f32::NEG_INFINITY],
            bitmask: Some(&mask[0..5]),
            ..rf::RowInputs::NONE
        },
        rf::RowInputs {
            prompt: &[40, 41],
            output: &[41],
            repetition: 1.5,
            frequency: 0.5,
            presence: 0.25,
            bias_ids: &[55],
            bias_values: &[4.0],
            bitmask: Some(&mask[5..10]),
            ..rf::RowInputs::NONE
        },
    ];
    rows.iter().enumerate().flat_map(|(r, p)| rf::effective_row(&x[r * V..(r + 1) * V], p)).collect()
}

/// The committed header holds the reference's processed rows of the C test's inputs
/// (`TOKENRACE_BLESS=1` rewrites it).
#[test]
fn committed_c_step_reference_is_current() {
    let rows = c_step_processed_rows();
    let words: Vec<String> = rows.iter().map(|v| format!("0x{:08x}u", v.to_bits())).collect();
    let lines: Vec<String> = words.chunks(8).map(|c| format!("    {},", c.join(", "))).collect();
    let text = format!(
        "/* The processed rows of test_step.c's two rows (its logits, CSR lists, penalties, bias and\n \
         * bitmask) by the float64 reference's effective_row (tests/common/reference.rs), as f32 bit\n \
         * patterns. Written by tests/reference.rs; do not edit: TOKENRACE_BLESS=1 cargo test --test\n \
         * reference committed_c_step_reference */\n\
         #include <stdint.h>\n\n\
         static const uint32_t STEP_REFERENCE_ROWS[{}] = {{\n{}\n}};\n",
        rows.len(),
        lines.join("\n")
    );
    common::fixtures::check_committed(
        C_STEP_REFERENCE,
        &text,
        "cargo test --test reference committed_c_step_reference",
    );
}
