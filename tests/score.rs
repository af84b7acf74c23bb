//! The score call (`Sampler::score`, `tokenrace_score`): given tokens' logprobs, ranks, top-n
//! and given-id logprobs, exactly the draw's for the same tokens (bit for bit, every SIMD level,
//! 1 and 4 threads), against a float64 reference; no noise used (the stream is where it was);
//! refusals that write nothing.
mod common;

use common::TestRng;
use tokenrace::*;

/// Everything one call reports, as bits.
#[derive(Debug, PartialEq)]
struct Scores {
    tokens: Vec<i32>,
    flags: Vec<u32>,
    logprobs: Vec<u32>,
    ranks: Vec<i32>,
    topn_ids: Vec<i32>,
    topn_logprobs: Vec<u32>,
    given_logprobs: Vec<u32>,
    given_ranks: Vec<i32>,
}

const TOP_N: usize = 3;

fn call(rows: usize, given: usize, mode: LogprobMode, f: impl FnOnce(&mut Output) -> Result<()>) -> Result<Scores> {
    let (mut tokens, mut flags) = (vec![-7; rows], vec![0xdead; rows]);
    let (mut lps, mut ranks) = (vec![f32::NAN; rows], vec![-7; rows]);
    let (mut ids, mut tlps) = (vec![-7; rows * TOP_N], vec![f32::NAN; rows * TOP_N]);
    let (mut glps, mut granks) = (vec![f32::NAN; given], vec![-7; given]);
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
    f(&mut out)?;
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    Ok(Scores {
        tokens,
        flags,
        logprobs: bits(&lps),
        ranks,
        topn_ids: ids,
        topn_logprobs: bits(&tlps),
        given_logprobs: bits(&glps),
        given_ranks: granks,
    })
}

fn rows_of(rng: &mut TestRng, rows: usize, vocab: usize) -> Vec<f32> {
    let mut x: Vec<f32> = (0..rows * vocab).map(|_| (rng.normal() * 3.0) as f32).collect();
    // Ties, a -inf and a NaN: data, not errors.
    x[1] = x[0];
    x[vocab + 2] = f32::NEG_INFINITY;
    x[2 * vocab + 3] = f32::NAN;
    x
}

fn sampler(level: SimdLevel, threads: usize) -> Sampler {
    Sampler::new(Config { simd: common::step::choice_of(level), threads, seed: Some(9), ..Config::default() }).unwrap()
}

#[test]
fn scores_are_the_draws_own_for_the_same_tokens() {
    tokenrace::internals::force_participants(usize::MAX);
    let (rows, vocab) = (6usize, 3000usize);
    let mut rng = TestRng::new(5);
    let x = rows_of(&mut rng, rows, vocab);
    let targets: Vec<i32> = (0..rows).map(|_| rng.below(vocab) as i32).collect();
    let given = TokenLists { ids: &[1, 2, 3, 0, 9, 9, 2999], offsets: &[0, 3, 3, 4, 6, 6, 7] };
    let temps = [1.0f32, 0.7, 0.0, 1.3, 0.5, 1.0];
    let (ks, ps) = ([0i32, 50, 0, 10, 0, 3], [1.0f32, 0.9, 1.0, 1.0, 0.5, 1.0]);
    let rep = [1.0f32, 1.2, 1.0, 0.8, 1.0, 1.5];
    let output = TokenLists { ids: &[targets[1], 5, 5, 7], offsets: &[0, 0, 1, 2, 2, 4, 4] };
    let base = Batch {
        temperature: Some(&temps),
        top_k: Some(&ks),
        top_p: Some(&ps),
        repetition_penalty: Some(&rep),
        output_tokens: Some(output),
        logprob_token_ids: Some(given),
        ..Batch::new(Logits::F32(&x), rows, vocab)
    };
    let seeds = [3u64, 1, 4, 1, 5, 9];
    let mut first = None;
    for mode in [LogprobMode::Raw, LogprobMode::Processed] {
        common::each_level(|level| {
            for threads in [1, 4] {
                let s = sampler(level, threads);
                let scored = call(rows, 7, mode, |o| s.score(&base, &targets, o)).unwrap();
                let forced = Batch { seeds: Some(&seeds), forced_tokens: Some(&targets), ..base };
                let drawn = call(rows, 7, mode, |o| s.draw(&forced, o)).unwrap();
                assert_eq!(scored, drawn, "{level:?} {threads} threads {mode:?}");
                assert_eq!(scored.tokens, targets);
                if mode == LogprobMode::Raw {
                    match &first {
                        None => first = Some(scored),
                        Some(f) => assert_eq!(&scored, f, "{level:?} {threads} threads: not the first level's"),
                    }
                }
            }
        });
    }
    // Raw logprobs and ranks against float64.
    let raw = first.unwrap();
    for r in 0..rows {
        let row = &x[r * vocab..(r + 1) * vocab];
        let m = row.iter().copied().filter(|v| !v.is_nan()).fold(f64::NEG_INFINITY, |a, v| a.max(v as f64));
        let z: f64 = row.iter().filter(|v| !v.is_nan()).map(|&v| (v as f64 - m).exp()).sum();
        let lp = |t: usize| row[t] as f64 - m - z.ln();
        let t = targets[r] as usize;
        assert!((f32::from_bits(raw.logprobs[r]) as f64 - lp(t)).abs() < 1e-5, "row {r}");
        // vLLM's rank: how many tokens have a logprob at least the token's (ties count).
        let rank = row.iter().filter(|&&v| v >= row[t]).count() as i32;
        assert_eq!(raw.ranks[r], rank, "row {r}");
    }
    for (j, &id) in given.ids.iter().enumerate() {
        let r = (0..rows).find(|&r| given.offsets[r + 1] as usize > j).unwrap();
        let row = &x[r * vocab..(r + 1) * vocab];
        let rank = row.iter().filter(|&&v| v >= row[id as usize]).count() as i32;
        assert_eq!(raw.given_ranks[j], rank, "given id {j}");
    }
}

#[test]
fn a_score_uses_no_noise() {
    let (rows, vocab) = (4usize, 500usize);
    let mut rng = TestRng::new(6);
    let x = rows_of(&mut rng, rows, vocab);
    let b = Batch::new(Logits::F32(&x), rows, vocab);
    common::each_level(|level| {
        let (a, twin) = (sampler(level, 1), sampler(level, 1));
        call(rows, 0, LogprobMode::Raw, |o| a.score(&b, &[0, 1, 2, 3], o)).unwrap();
        let after = call(rows, 0, LogprobMode::Raw, |o| a.draw(&b, o)).unwrap();
        let without = call(rows, 0, LogprobMode::Raw, |o| twin.draw(&b, o)).unwrap();
        assert_eq!(after, without, "{level:?}: the score moved the stream");
    });
}

#[test]
fn bad_scores_are_refused_naming_the_argument_and_write_nothing() {
    let (rows, vocab) = (2usize, 10usize);
    let x = vec![0.5f32; rows * vocab];
    let b = Batch::new(Logits::F32(&x), rows, vocab);
    let s = sampler(SimdLevel::Scalar, 1);
    let cases: [(Batch, &[i32], &str); 5] = [
        (b, &[1], "targets: has 1 elements, the batch has 2 rows"),
        (b, &[1, 10], "targets[1]: 10 is not a token id in [0, 10)"),
        (b, &[-1, 0], "targets[0]: -1 is not a token id in [0, 10)"),
        (Batch { seeds: Some(&[1, 2]), ..b }, &[0, 0], "batch.seeds: not read by a score call"),
        (Batch { forced_tokens: Some(&[1, 2]), ..b }, &[0, 0], "batch.forced_tokens: not read by a score call"),
    ];
    for (batch, targets, want) in cases {
        let (mut tokens, mut lps) = (vec![-7; rows], vec![9.0f32; rows]);
        let err = s
            .score(&batch, targets, &mut Output { logprobs: Some(&mut lps), ..Output::new(&mut tokens) })
            .expect_err(want);
        assert_eq!(err.kind, ErrorKind::InvalidArgument);
        assert!(err.message.contains(want), "{want:?} not in {:?}", err.message);
        assert!(tokens.iter().all(|&t| t == -7) && lps.iter().all(|&l| l == 9.0), "{want}: written");
    }
}
