//! Several outputs from one logits row (`Batch::row_index`, vLLM's `n > 1`, FlashInfer's
//! `indices`): row r reads logits row `row_index[r]`, in place, with its own seed, offset,
//! parameters and outputs.
//!
//! - bit for bit the draw of a batch holding a copy of each row's logits row (tokens, flags,
//!   logprobs, ranks, top-n; seeded and unseeded rows, filters, a step, both logprob modes), at
//!   every SIMD level on 1 and 4 threads;
//! - chi-square: the outputs of one logits row, seeded with different seeds, are independent
//!   draws of its distribution (the pairs' joint counts against the product of the float64
//!   reference probabilities), and the test rejects a sampler that gives two outputs the same
//!   seed (the power check);
//! - refusals naming the row, nothing written, the stream unmoved.
mod common;

use common::reference as rf;
use common::step::{config, draw_with_logprobs, Csr};
use common::{chi2, chi2_critical, softmax64, TestRng};
use tokenrace::*;

/// (tokens, flags, logprob bits, ranks, top-n ids, top-n logprob bits) of a draw.
type Drawn = (Vec<i32>, Vec<u32>, Vec<u32>, Vec<i32>, Vec<i32>, Vec<u32>);

fn draw_all(s: &Sampler, b: &Batch, mode: LogprobMode) -> Drawn {
    let (tokens, flags, lps, ranks, ids, tlps) = draw_with_logprobs(s, b, mode, 3);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect();
    (tokens, flags, bits(&lps), ranks, ids, bits(&tlps))
}

#[test]
fn each_output_is_the_draw_of_a_copy_of_its_logits_row() {
    let (logits_rows, vocab) = (4, 600);
    let index: Vec<i32> = vec![0, 0, 0, 2, 1, 1, 3, 0, 2, 2, 2, 2, 1];
    let rows = index.len();
    let mut rng = TestRng::new(12);
    let x: Vec<f32> = (0..logits_rows * vocab).map(|_| (rng.normal() * 2.0) as f32).collect();
    let copies: Vec<f32> =
        index.iter().flat_map(|&i| x[i as usize * vocab..(i as usize + 1) * vocab].iter().copied()).collect();
    let temps: Vec<f32> = (0..rows).map(|r| [1.0, 0.8, 0.0, 1.2][r % 4]).collect();
    let top_k: Vec<i32> = (0..rows).map(|r| [0, 25, 0][r % 3]).collect();
    let top_p: Vec<f32> = (0..rows).map(|r| [1.0, 0.9][r % 2]).collect();
    let seeds: Vec<u64> = (0..rows as u64).map(|r| 77 + r).collect();
    let seeded: Vec<u8> = (0..rows).map(|r| (r % 3 != 1) as u8).collect();
    let banned =
        Csr::from_rows(&(0..rows).map(|r| if r % 5 == 0 { vec![r as i32] } else { vec![] }).collect::<Vec<_>>());
    let copied = Batch {
        temperature: Some(&temps),
        top_k: Some(&top_k),
        top_p: Some(&top_p),
        seeds: Some(&seeds),
        seeded: Some(&seeded),
        banned_tokens: Some(banned.lists()),
        ..Batch::new(Logits::F32(&copies), rows, vocab)
    };
    let indexed = Batch { logits: Logits::F32(&x), row_index: Some(&index), ..copied };
    for mode in [LogprobMode::Raw, LogprobMode::Processed] {
        let mut first = None;
        common::each_level(|level| {
            for threads in [1, 4] {
                let what = format!("{level:?}, {threads} threads, {mode:?}");
                let (a, b) = (
                    Sampler::new(config(level, threads, rf::Order::TemperatureFirst)).unwrap(),
                    Sampler::new(config(level, threads, rf::Order::TemperatureFirst)).unwrap(),
                );
                for call in 0..2 {
                    let got = draw_all(&a, &indexed, mode);
                    assert_eq!(got, draw_all(&b, &copied, mode), "{what}, call {call}");
                    if call == 0 {
                        match &first {
                            None => first = Some(got),
                            Some(f) => assert_eq!(&got, f, "{what}: the first level's"),
                        }
                    }
                }
            }
        });
    }
}

/// Pair counts of outputs 0 and 1 of one logits row drawn `calls` times, seeds from `seed_of`.
fn pair_counts(x: &[f32], calls: u64, n: usize, seed_of: impl Fn(u64, usize) -> u64) -> (Vec<u64>, Vec<u64>) {
    let vocab = x.len();
    let s = Sampler::new(Config { seed: Some(3), max_rows: 4096, ..Config::default() }).unwrap();
    let index = vec![0i32; n];
    let temps = vec![0.9f32; n];
    let (mut pairs, mut each) = (vec![0u64; vocab * vocab], vec![0u64; vocab]);
    let mut tokens = vec![0; n];
    for call in 0..calls {
        let seeds: Vec<u64> = (0..n).map(|j| seed_of(call, j)).collect();
        let b = Batch {
            temperature: Some(&temps),
            seeds: Some(&seeds),
            row_index: Some(&index),
            ..Batch::new(Logits::F32(x), n, vocab)
        };
        s.draw(&b, &mut Output::new(&mut tokens)).unwrap();
        pairs[tokens[0] as usize * vocab + tokens[1] as usize] += 1;
        for &t in &tokens {
            each[t as usize] += 1;
        }
    }
    (pairs, each)
}

#[test]
fn outputs_of_one_row_with_their_own_seeds_are_independent_draws_of_its_distribution() {
    let x = [0.3f32, 1.1, -0.4, 0.9, 0.0, -1.2];
    let vocab = x.len();
    let p = softmax64(&x, 1.0 / rf::inv_t32(0.9));
    let joint: Vec<f64> = (0..vocab * vocab).map(|k| p[k / vocab] * p[k % vocab]).collect();
    let (calls, n) = (6000u64, 4);
    let (pairs, each) = pair_counts(&x, calls, n, |call, j| call * n as u64 + j as u64 + 1);
    let (stat, dof) = chi2(&each, &p);
    assert!(stat < chi2_critical(dof, 5.0), "the outputs' marginal: chi-square {stat} on {dof}");
    let (stat, dof) = chi2(&pairs, &joint);
    assert!(stat < chi2_critical(dof, 5.0), "the pairs against the product: chi-square {stat} on {dof}");
    // Power: outputs 0 and 1 with the same seed draw the same token, far from independent.
    let (same, _) = pair_counts(&x, 1500, n, |call, j| call * n as u64 + (j / 2) as u64 + 1);
    let (stat, dof) = chi2(&same, &joint);
    assert!(stat > chi2_critical(dof, 5.0), "a sampler seeding two outputs alike would pass ({stat})");
}

#[test]
fn bad_row_indices_are_refused_naming_the_row() {
    let x = vec![0.5f32; 2 * 10];
    let cases: [(&[i32], usize, &str); 3] = [
        (&[0, -3, 1], 3, "batch.row_index[1]: -3 is not a logits row"),
        (&[0, 1], 3, "batch.row_index: has 2 elements"),
        (&[0, 2, 1], 3, "batch.logits"),
    ];
    for (index, rows, want) in cases {
        let s = Sampler::new(Config { seed: Some(1), ..Config::default() }).unwrap();
        let b = Batch { row_index: Some(index), ..Batch::new(Logits::F32(&x), rows, 10) };
        let mut tokens = vec![-7; rows];
        let err = s.draw(&b, &mut Output::new(&mut tokens)).expect_err(want);
        assert!(err.message.contains(want), "expected {want:?} in {:?}", err.message);
        assert!(tokens.iter().all(|&t| t == -7), "{want}: a refused call wrote");
        let fresh = Sampler::new(Config { seed: Some(1), ..Config::default() }).unwrap();
        let plain = Batch::new(Logits::F32(&x), 2, 10);
        assert_eq!(common::draw(&s, &plain), common::draw(&fresh, &plain), "{want}: the stream moved");
    }
}
