//! The sampled distribution of rows with the sampling step: chi-square of the counts against the
//! float64 reference of `tests/common/reference.rs`, with power checks: the same counts reject a
//! reference with the penalty order swapped, one with the bias applied after the penalties, and
//! (FiltersFirst) one that filters the tempered distribution. Deferred rows (histories found in
//! the blocks the draw visits) follow the same distribution.
mod common;

use common::reference as rf;
use common::step::*;
use common::{chi2, chi2_critical, TestRng};
use tokenrace::*;

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

/// The wrong steps the chi-square must tell from the right one.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Wrong {
    /// Frequency and presence before repetition.
    PenaltyOrderSwapped,
    /// Bias after the penalties.
    BiasAfterPenalties,
}

/// The effective row of a wrong step (the reference's steps, reordered).
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

/// `n` seeded draws of one row with its step inputs, in calls of 2000 rows.
fn sample_counts(
    s: &Sampler,
    x: &[f32],
    step: &StepInputs,
    t: f32,
    filters: rf::Filters,
    n: usize,
    seed: u64,
) -> Vec<u64> {
    let vocab = x.len();
    let per_call = 2000;
    let logits: Vec<f32> = x.iter().copied().cycle().take(per_call * vocab).collect();
    let rep = |c: &Option<Csr>| c.as_ref().map(|c| Csr::from_rows(&vec![c.row(0).to_vec(); per_call]));
    let bias = step.bias.as_ref().map(|b| {
        let (ids, values) = b.row(0);
        let pairs: Vec<(i32, f32)> = ids.iter().copied().zip(values.iter().copied()).collect();
        let mut all = BiasCsr::new();
        (0..per_call).for_each(|_| all.push(&pairs));
        all
    });
    let words = vocab.div_ceil(32);
    let big = StepInputs {
        prompt: rep(&step.prompt),
        output: rep(&step.output),
        repetition: step.repetition.as_ref().map(|v| vec![v[0]; per_call]),
        frequency: step.frequency.as_ref().map(|v| vec![v[0]; per_call]),
        presence: step.presence.as_ref().map(|v| vec![v[0]; per_call]),
        last_n: step.last_n.as_ref().map(|v| vec![v[0]; per_call]),
        bias,
        allowed: rep(&step.allowed),
        allowed_rows: None,
        banned: rep(&step.banned),
        bitmask: step.bitmask.as_ref().map(|(w, _)| (w[..words].repeat(per_call), words)),
        min_tokens: step.min_tokens.as_ref().map(|v| vec![v[0]; per_call]),
        stop: rep(&step.stop),
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

/// A row where the wrong steps differ materially: the likely tokens are in the histories
/// (with counts up to 3) and biased, a tenth of the vocabulary is masked by the bitmask.
fn chi_square_row(vocab: usize) -> (Vec<f32>, StepInputs) {
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
    let step = StepInputs {
        prompt: Some(Csr::from_rows(&[p_row])),
        output: Some(Csr::from_rows(&[o_row])),
        repetition: Some(vec![1.8]),
        frequency: Some(vec![0.6]),
        presence: Some(vec![0.4]),
        last_n: None,
        bias: Some({
            let mut b = BiasCsr::new();
            b.push(&b_row);
            b
        }),
        allowed: None,
        allowed_rows: None,
        banned: Some(Csr::from_rows(&[vec![23]])),
        bitmask: Some((mask, words)),
        min_tokens: None,
        stop: None,
    };
    (x, step)
}

#[test]
fn sampled_distribution_follows_the_reference_and_rejects_wrong_steps() {
    check_sampled_distribution(rf::Filters { top_k: 0, top_p: 0.95, min_p: 0.0 });
}

/// Without filters (and without logprobs) the same rows are deferred: their histories are found
/// per visited block (`src/step/deferred.rs`), and their distribution must be the reference's.
#[test]
fn sampled_distribution_of_deferred_rows_follows_the_reference() {
    check_sampled_distribution(rf::Filters { top_k: 0, top_p: 1.0, min_p: 0.0 });
}

/// Chi-square of 20,000 draws of `chi_square_row` under `filters` against the reference, with
/// power checks: the same counts reject the penalty order swapped and the bias applied after
/// the penalties.
fn check_sampled_distribution(filters: rf::Filters) {
    let vocab = 200;
    let (x, step) = chi_square_row(vocab);
    let p = step.row(0, vocab);
    let y = rf::effective_row(&x, &p);
    let t = 0.9f32;
    let n = 20_000;
    let level = supported_levels()[supported_levels().len() - 1];
    let s = Sampler::new(config(level, 1, rf::Order::TemperatureFirst)).unwrap();
    let counts = sample_counts(&s, &x, &step, t, filters, n, 2024);
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
        assert!(tv > 0.05, "{wrong:?} is too close to the right step to test (TV {tv})");
        assert!(ws > chi2_critical(wd, 5.0), "the counts cannot tell {wrong:?} from the right step ({ws})");
        // Not only through a token the wrong step never draws: restricted to the tokens it
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
    let (x, step) = chi_square_row(vocab);
    let y = rf::effective_row(&x, &step.row(0, vocab));
    let (t, filters) = (2.0f32, rf::Filters { top_k: 0, top_p: 0.6, min_p: 0.0 });
    let n = 20_000;
    let level = supported_levels()[supported_levels().len() - 1];
    let s = Sampler::new(config(level, 1, rf::Order::FiltersFirst)).unwrap();
    let counts = sample_counts(&s, &x, &step, t, filters, n, 77);
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
    let counts = sample_counts(&s, &x, &step, t, filters, n, 78);
    let (stat, dof) = chi2_or_reject(&counts, &tempered);
    assert!(stat < chi2_critical(dof, 5.0), "TemperatureFirst draws: chi-square {stat} on {dof} dof");
}

/// The penalty window, by its distribution: a row whose likely tokens sit on either side of
/// the window's first token (the prompt's last token, the output's first), so that a window
/// one token shorter or longer moves a tenth of the mass; the counts follow the reference of
/// the right window and reject both neighbours, deferred (no filters) or not (top-p).
#[test]
fn the_penalty_window_is_exact_to_the_token() {
    let vocab = 64;
    let mut rng = TestRng::new(606);
    let x: Vec<f32> = (0..vocab).map(|i| if i < 8 { 2.0 } else { (rng.normal() - 1.0) as f32 }).collect();
    // prompt ++ output = [0, 1, 2, 3 | 4, 5, 5, 6, 7]: window 6 starts at the prompt's 3.
    let (p_row, o_row) = (vec![0, 1, 2, 3], vec![4, 5, 5, 6, 7]);
    let last_n = 6;
    let step = |n: i32| StepInputs {
        prompt: Some(Csr::from_rows(std::slice::from_ref(&p_row))),
        output: Some(Csr::from_rows(std::slice::from_ref(&o_row))),
        repetition: Some(vec![2.0]),
        frequency: Some(vec![0.5]),
        presence: Some(vec![0.5]),
        last_n: Some(vec![n]),
        ..StepInputs::default()
    };
    let t = 0.9f32;
    let n = 20_000;
    let level = supported_levels()[supported_levels().len() - 1];
    let s = Sampler::new(config(level, 1, rf::Order::TemperatureFirst)).unwrap();
    for filters in [rf::Filters { top_k: 0, top_p: 1.0, min_p: 0.0 }, rf::Filters { top_k: 0, top_p: 0.97, min_p: 0.0 }]
    {
        let counts = sample_counts(&s, &x, &step(last_n), t, filters, n, 31);
        let want_of = |w: i32| {
            let y = rf::effective_row(&x, &step(w).row(0, vocab));
            probabilities(&y, t, filters, rf::inv_t32(t))
        };
        let want = want_of(last_n);
        let (stat, dof) = chi2_or_reject(&counts, &want);
        let crit = chi2_critical(dof, 5.0);
        eprintln!("window {last_n}, {filters:?}: chi-square {stat:.1} on {dof} dof (critical {crit:.1})");
        assert!(stat < crit, "window {last_n}: chi-square {stat} >= {crit} on {dof} dof");
        for off_by_one in [last_n - 1, last_n + 1] {
            let wrong = want_of(off_by_one);
            let tv: f64 = want.iter().zip(&wrong).map(|(a, b)| (a - b).abs()).sum::<f64>() / 2.0;
            let (ws, wd) = chi2_or_reject(&counts, &wrong);
            eprintln!("window {off_by_one}: total variation {tv:.3}, chi-square {ws:.1} on {wd} dof");
            assert!(tv > 0.05, "window {off_by_one} is too close to {last_n} to test (TV {tv})");
            assert!(ws > chi2_critical(wd, 5.0), "the counts cannot tell window {off_by_one} from {last_n} ({ws})");
        }
    }
}
