//! Scoring (`Sampler::score`): the logprob, rank and top-n of one target token per row, and of
//! the batch's `logprob_token_ids`, with nothing drawn.
//!
//! - equal bit for bit to what the draw reports for the same token: a draw's own tokens scored
//!   give its logprobs, ranks, top-n and given-id values; any target scores as a draw forced to
//!   it reports (temperature, filters, a step, seeded and unseeded rows, both modes, both filter
//!   orders), at every SIMD level on 1 and 4 threads, and the same at every level and thread
//!   count;
//! - against the float64 reference (raw and processed, with filters and greedy rows);
//! - nothing consumed: the sampler's stream and counters are as before a score;
//! - refusals naming the argument and row, nothing written, the stream unmoved.
//!
//! A score draws nothing, so it has no distribution to test by chi-square: the draws it is
//! compared with have theirs (tests/draw.rs, tests/step_parity.rs).
mod common;

use common::reference as rf;
use common::step::{config, Csr};
use common::TestRng;
use tokenrace::*;

/// What a draw or a score writes, kept for comparison (floats as bits).
#[derive(Debug, PartialEq, Eq)]
struct Written {
    tokens: Vec<i32>,
    flags: Vec<u32>,
    logprobs: Vec<u32>,
    ranks: Vec<i32>,
    topn_ids: Vec<i32>,
    topn_logprobs: Vec<u32>,
    token_logprobs: Vec<u32>,
    token_ranks: Vec<i32>,
}

const TOP_N: usize = 3;

/// Runs `call` (a draw or a score) with every logprob output asked for, in `mode`.
fn written(rows: usize, given: usize, mode: LogprobMode, call: impl FnOnce(&mut Output) -> Result<()>) -> Written {
    let (mut tokens, mut flags, mut lps, mut ranks) =
        (vec![-1; rows], vec![0u32; rows], vec![0f32; rows], vec![0; rows]);
    let (mut ids, mut tlps) = (vec![0; rows * TOP_N], vec![0f32; rows * TOP_N]);
    let (mut glps, mut granks) = (vec![0f32; given], vec![0; given]);
    let mut out = Output {
        flags: Some(&mut flags),
        logprobs: Some(&mut lps),
        ranks: Some(&mut ranks),
        top_n: TOP_N,
        topn_ids: Some(&mut ids),
        topn_logprobs: Some(&mut tlps),
        logprob_mode: mode,
        token_logprobs: (given > 0).then_some(&mut glps[..]),
        token_ranks: (given > 0).then_some(&mut granks[..]),
        ..Output::new(&mut tokens)
    };
    call(&mut out).unwrap();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect();
    Written {
        logprobs: bits(&lps),
        topn_logprobs: bits(&tlps),
        token_logprobs: bits(&glps),
        tokens,
        flags,
        ranks,
        topn_ids: ids,
        token_ranks: granks,
    }
}

/// The rows of the equality tests: mixed temperatures (greedy rows too), top-k, top-p, min-p,
/// a banned list on some rows, seeded and unseeded rows, given ids on some rows.
struct Rows {
    vocab: usize,
    rows: usize,
    x: Vec<f32>,
    temps: Vec<f32>,
    top_k: Vec<i32>,
    top_p: Vec<f32>,
    min_p: Vec<f32>,
    seeds: Vec<u64>,
    seeded: Vec<u8>,
    banned: Csr,
    given: Csr,
}

impl Rows {
    fn new(rows: usize, vocab: usize, seed: u64) -> Rows {
        let mut rng = TestRng::new(seed);
        let x = (0..rows * vocab).map(|_| (rng.normal() * 2.0) as f32).collect();
        let banned: Vec<Vec<i32>> =
            (0..rows).map(|r| if r % 4 == 1 { vec![(r % vocab) as i32, 3] } else { vec![] }).collect();
        let given: Vec<Vec<i32>> =
            (0..rows).map(|r| if r % 3 == 0 { vec![0, (r * 7 % vocab) as i32] } else { vec![] }).collect();
        Rows {
            vocab,
            rows,
            x,
            temps: (0..rows).map(|r| [1.0, 0.7, 0.0, 1.4, 0.9][r % 5]).collect(),
            top_k: (0..rows).map(|r| [0, 40, 0, 5, 0, 0][r % 6]).collect(),
            top_p: (0..rows).map(|r| [1.0, 0.9, 0.8, 1.0][r % 4]).collect(),
            min_p: (0..rows).map(|r| if r % 7 == 3 { 0.05 } else { 0.0 }).collect(),
            seeds: (0..rows as u64).map(|r| 1000 + r).collect(),
            seeded: (0..rows).map(|r| (r % 2) as u8).collect(),
            banned: Csr::from_rows(&banned),
            given: Csr::from_rows(&given),
        }
    }

    fn batch(&self, with_step: bool) -> Batch<'_> {
        Batch {
            temperature: Some(&self.temps),
            top_k: Some(&self.top_k),
            top_p: Some(&self.top_p),
            min_p: Some(&self.min_p),
            seeds: Some(&self.seeds),
            seeded: Some(&self.seeded),
            banned_tokens: with_step.then(|| self.banned.lists()),
            logprob_token_ids: Some(self.given.lists()),
            ..Batch::new(Logits::F32(&self.x), self.rows, self.vocab)
        }
    }
}

/// A draw's own tokens, scored, give back what the draw reported; any targets score as a draw
/// forced to them reports; the same at every level, on 1 and 4 threads, in both modes and both
/// filter orders, with and without a step.
#[test]
fn a_score_reports_what_the_draw_of_its_target_reports_bit_for_bit() {
    let d = Rows::new(37, 700, 5);
    let given = d.given.ids.len();
    let mut rng = TestRng::new(17);
    let targets: Vec<i32> = (0..d.rows).map(|_| rng.below(d.vocab) as i32).collect();
    for order in [rf::Order::TemperatureFirst, rf::Order::FiltersFirst] {
        for mode in [LogprobMode::Raw, LogprobMode::Processed] {
            for with_step in [false, true] {
                let b = d.batch(with_step);
                let mut first: Option<Written> = None;
                common::each_level(|level| {
                    for threads in [1, 4] {
                        let what = format!("{level:?}, {threads} threads, {mode:?}, {order:?}, step {with_step}");
                        let s = Sampler::new(config(level, threads, order)).unwrap();
                        let drawn = written(d.rows, given, mode, |o| s.draw(&b, o));
                        let scored = written(d.rows, given, mode, |o| s.score(&b, &drawn.tokens, o));
                        assert_eq!(scored, drawn, "{what}: the draw's tokens scored");
                        let forced = Batch { forced_tokens: Some(&targets), ..b };
                        let want = written(d.rows, given, mode, |o| s.draw(&forced, o));
                        let got = written(d.rows, given, mode, |o| s.score(&b, &targets, o));
                        assert_eq!(got, want, "{what}: targets scored as forced");
                        match &first {
                            None => first = Some(got),
                            Some(f) => assert_eq!(&got, f, "{what}: the first level's and thread count's"),
                        }
                    }
                });
            }
        }
    }
}

/// Random targets against the float64 reference: raw logprobs of every row, processed ones of
/// the row's temperature and kept set (greedy rows: raw), ranks within the tolerance of ties,
/// top-n values.
#[test]
fn scores_follow_the_float64_reference() {
    let (rows, vocab) = (24, 300);
    let mut rng = TestRng::new(3);
    let x: Vec<f32> = (0..rows * vocab).map(|_| (rng.normal() * 1.7) as f32).collect();
    let temps: Vec<f32> = (0..rows).map(|r| [1.0, 0.6, 0.0, 1.5][r % 4]).collect();
    let top_k: Vec<i32> = (0..rows).map(|r| [0, 30, 0, 7, 0][r % 5]).collect();
    let top_p: Vec<f32> = (0..rows).map(|r| [1.0, 0.85, 1.0][r % 3]).collect();
    let targets: Vec<i32> = (0..rows).map(|_| rng.below(vocab) as i32).collect();
    let greedy_below = Config::default().greedy_below;
    for mode in [LogprobMode::Raw, LogprobMode::Processed] {
        common::each_level(|level| {
            let s = common::sampler(level, 1);
            let b = Batch {
                temperature: Some(&temps),
                top_k: Some(&top_k),
                top_p: Some(&top_p),
                ..Batch::new(Logits::F32(&x), rows, vocab)
            };
            let got = written(rows, 0, mode, |o| s.score(&b, &targets, o));
            assert_eq!(got.tokens, targets, "the targets are the tokens");
            for r in 0..rows {
                let row = &x[r * vocab..(r + 1) * vocab];
                let filters = rf::Filters { top_k: top_k[r], top_p: top_p[r], min_p: 0.0 };
                let d = rf::draw(row, temps[r], greedy_below, rf::Noise::Inline(1), filters);
                assert!(!d.ambiguous, "row {r}: the reference's kept set is not decided");
                let want =
                    rf::logprobs(row, &d, if mode == LogprobMode::Raw { rf::Mode::Raw } else { rf::Mode::Processed });
                let t = targets[r] as usize;
                let lp = f32::from_bits(got.logprobs[r]);
                assert!(rf::lp_close(lp, want[t]), "{level:?} {mode:?} row {r}: {lp} vs {}", want[t]);
                let (lo, hi) = rf::rank_range(&want, t);
                assert!(
                    (lo..=hi).contains(&(got.ranks[r] as usize)),
                    "{level:?} {mode:?} row {r}: rank {}",
                    got.ranks[r]
                );
                for (j, &id) in rf::top_n(&want, TOP_N).iter().enumerate() {
                    let v = f32::from_bits(got.topn_logprobs[r * TOP_N + j]);
                    assert!(rf::lp_close(v, want[id]), "{level:?} {mode:?} row {r}: top-n {j}");
                }
            }
        });
    }
}

/// Prompt logprobs of thousands of positions in one call: the same on 1 and 4 threads, and the
/// unseeded stream, the pool-less sampler's counters and the next draw as if no score ran.
#[test]
fn a_score_consumes_no_noise_and_splits_over_threads_alike() {
    let (rows, vocab) = (2500, 160);
    let mut rng = TestRng::new(8);
    let x: Vec<f32> = (0..rows * vocab).map(|_| (rng.normal() * 3.0) as f32).collect();
    let targets: Vec<i32> = (0..rows).map(|_| rng.below(vocab) as i32).collect();
    let b = Batch::new(Logits::F32(&x), rows, vocab);
    let level = best_level();
    let one = Sampler::new(config(level, 1, rf::Order::TemperatureFirst)).unwrap();
    let four = Sampler::new(config(level, 4, rf::Order::TemperatureFirst)).unwrap();
    let want = written(rows, 0, LogprobMode::Raw, |o| one.score(&b, &targets, o));
    assert_eq!(written(rows, 0, LogprobMode::Raw, |o| four.score(&b, &targets, o)), want, "4 threads");
    let fresh = Sampler::new(config(level, 1, rf::Order::TemperatureFirst)).unwrap();
    assert_eq!(one.stats(), fresh.stats(), "a score counts nothing");
    let small = Batch::new(Logits::F32(&x[..8 * vocab]), 8, vocab);
    assert_eq!(common::draw(&one, &small), common::draw(&fresh, &small), "the stream after a score");
}

/// Refusals: the argument (and row) named, nothing written, the stream unmoved.
#[test]
fn bad_scores_are_refused_naming_the_argument_and_row_writing_nothing() {
    let x = vec![0.25f32; 3 * 10];
    let plain = Batch::new(Logits::F32(&x), 3, 10);
    let noise = vec![1.0f32; 30];
    let cases: Vec<(Batch, &[i32], &str)> = vec![
        (plain, &[1, 2], "target_ids: has 2 entries, the batch has 3 rows"),
        (plain, &[1, 10, 2], "target_ids: row 1: 10 is not a token id in [0, 10)"),
        (plain, &[-1, 0, 0], "target_ids: row 0: -1 is not a token id"),
        (Batch { forced_tokens: Some(&[0, 0, 0]), ..plain }, &[0, 0, 0], "batch.forced_tokens: must be absent"),
        (
            Batch { noise: Some(ExternalNoise { values: &noise, kind: NoiseKind::Exp, row_stride: 10 }), ..plain },
            &[0, 0, 0],
            "batch.noise: must be absent",
        ),
        (Batch { top_p: Some(&[1.0, 2.0, 1.0]), ..plain }, &[0, 0, 0], "batch.top_p[1]"),
    ];
    for (b, targets, want) in cases {
        let s = Sampler::new(Config { seed: Some(1), ..Config::default() }).unwrap();
        let (mut tokens, mut lps) = (vec![-7; 3], vec![9f32; 3]);
        let mut out = Output { logprobs: Some(&mut lps), ..Output::new(&mut tokens) };
        let err = s.score(&b, targets, &mut out).expect_err(want);
        assert_eq!(err.kind, ErrorKind::InvalidArgument, "{want}: {err}");
        assert!(err.message.contains(want), "expected {want:?} in {:?}", err.message);
        assert!(tokens.iter().all(|&t| t == -7) && lps.iter().all(|&v| v == 9.0), "{want}: a refused score wrote");
        let fresh = Sampler::new(Config { seed: Some(1), ..Config::default() }).unwrap();
        assert_eq!(common::draw(&s, &plain), common::draw(&fresh, &plain), "{want}: the stream moved");
    }
}
