//! llama.cpp's mirostat (v1 and v2) as the final sampler of a row: a float64 reference of
//! llama.cpp's rule (the kept set, the drawn token's surprise and the mu update), frequencies
//! against the renormalised kept set with power checks (wrong rules rejected), mu sequences over
//! many steps, bit-identity across SIMD levels and threads, and refusals that write nothing.
mod common;

use common::{chi2, chi2_critical, draw, each_level, sampler, TestRng};
use tokenrace::*;

/// One row's mirostat as the batch takes it.
#[derive(Clone, Copy, Debug)]
struct Miro {
    mode: i32,
    tau: f32,
    eta: f32,
    m: i32,
    mu: f32,
}

/// What the reference gets wrong on purpose (the power checks).
#[derive(Clone, Copy, PartialEq, Debug)]
enum Rule {
    Llama,
    /// v2 with the surprise in nats (`-ln p`).
    Nats,
    /// v1 keeping one token more than its k.
    KPlusOne,
    /// The surprise of the drawn token from its probability before mirostat renormalised.
    NotRenormalised,
}

/// The reference's verdict on one row: which tokens mirostat keeps, each token's surprise in the
/// kept set (bits), and whether a cut lies within float64 rounding of a boundary.
struct Verdict {
    kept: Vec<bool>,
    surprise: Vec<f64>,
    ambiguous: bool,
}

/// fl32(1/T), the draw's scale.
fn inv_t32(t: f32) -> f64 {
    (1.0f32 / t) as f64
}

/// llama.cpp's mirostat over the tokens `chain` keeps of row `x` at temperature `t`, for a
/// vocabulary of `n_vocab`, in float64: softmax over the chain's set, v2's surprise cut (the
/// most probable always stays) or v1's k from the Zipf estimate over the `m` most probable;
/// tokens tied with the last kept stay.
fn reference(x: &[f32], chain: &[bool], t: f32, ms: Miro, n_vocab: usize, rule: Rule) -> Verdict {
    let inv_t = inv_t32(t);
    let mut cand: Vec<usize> = (0..x.len()).filter(|&i| chain[i] && x[i].is_finite()).collect();
    cand.sort_by(|&a, &b| x[b].total_cmp(&x[a]).then(a.cmp(&b)));
    let hi = x[cand[0]] as f64;
    let w = |i: usize| ((x[i] as f64 - hi) * inv_t).exp();
    let z: f64 = cand.iter().map(|&i| w(i)).sum();
    let mu = ms.mu as f64;
    let (least, ambiguous) = if ms.mode == 2 {
        let unit = if rule == Rule::Nats { 1.0 } else { std::f64::consts::LN_2 };
        let surprise = |i: usize| -(w(i) / z).ln() / unit;
        let ambiguous = cand.iter().any(|&i| (surprise(i) - mu).abs() < 1e-9 * mu.abs().max(1.0));
        (cand.iter().copied().filter(|&i| surprise(i) <= mu).map(|i| x[i]).fold(x[cand[0]], f32::min), ambiguous)
    } else {
        let top = (ms.m as usize).min(cand.len());
        let (mut tb, mut tt) = (0.0f64, 0.0f64);
        for i in 0..top - 1 {
            let ti = ((i + 2) as f64 / (i + 1) as f64).ln();
            let bi = (w(cand[i]) / w(cand[i + 1])).ln();
            tb += ti * bi;
            tt += ti * ti;
        }
        let s_hat = tb / tt;
        let e = s_hat - 1.0;
        let k = ((e * 2f64.powf(mu)) / (1.0 - (n_vocab as f64).powf(-e))).powf(1.0 / s_hat);
        let ambiguous = k.is_finite() && k >= 1.0 && (k - k.round()).abs() < 1e-9 * k.max(1.0);
        let mut kk = if k.is_nan() || k < 1.0 { 1 } else { (k.floor() as usize).min(cand.len()) };
        if rule == Rule::KPlusOne {
            kk = (kk + 1).min(cand.len());
        }
        (x[cand[kk - 1]], ambiguous)
    };
    let kept: Vec<bool> = (0..x.len()).map(|i| chain[i] && x[i].is_finite() && x[i] >= least).collect();
    let z_kept: f64 = if rule == Rule::NotRenormalised { z } else { (0..x.len()).filter(|&i| kept[i]).map(w).sum() };
    let surprise = (0..x.len()).map(|i| if kept[i] { -(w(i) / z_kept).log2() } else { f64::INFINITY }).collect();
    Verdict { kept, surprise, ambiguous }
}

/// The mu after drawing a token of `surprise` bits.
fn updated(ms: Miro, surprise: f64) -> f64 {
    ms.mu as f64 - ms.eta as f64 * (surprise - ms.tau as f64)
}

/// Whether the library's f32 mu matches the reference's (the library rounds its f64 once).
fn mu_close(got: f32, want: f64) -> bool {
    (got as f64 - want).abs() <= 1e-6 * want.abs().max(1.0)
}

/// Per-row batch arrays of mirostat.
struct MiroRows {
    mode: Vec<i32>,
    tau: Vec<f32>,
    eta: Vec<f32>,
    m: Vec<i32>,
    mu: Vec<f32>,
}

impl MiroRows {
    fn of(rows: &[Miro]) -> MiroRows {
        MiroRows {
            mode: rows.iter().map(|r| r.mode).collect(),
            tau: rows.iter().map(|r| r.tau).collect(),
            eta: rows.iter().map(|r| r.eta).collect(),
            m: rows.iter().map(|r| r.m).collect(),
            mu: rows.iter().map(|r| r.mu).collect(),
        }
    }

    fn on<'a>(&'a self, b: Batch<'a>) -> Batch<'a> {
        Batch {
            mirostat: Some(&self.mode),
            mirostat_tau: Some(&self.tau),
            mirostat_eta: Some(&self.eta),
            mirostat_m: Some(&self.m),
            mirostat_mu: Some(&self.mu),
            ..b
        }
    }
}

/// Draws `b`: tokens and mu out.
fn draw_mu(s: &Sampler, b: &Batch) -> (Vec<i32>, Vec<f32>) {
    let mut tokens = vec![-1; b.rows];
    let mut mu = vec![f32::INFINITY; b.rows];
    s.draw(b, &mut Output { mirostat_mu: Some(&mut mu), ..Output::new(&mut tokens) }).unwrap();
    (tokens, mu)
}

fn sampler_with(level: SimdLevel, seed: u64, threads: usize) -> Sampler {
    Sampler::new(Config { threads, ..sampler(level, seed).config().clone() }).unwrap()
}

/// A random row's mirostat: v1 or v2, tau 1 to 8 bits, mu around 2 tau, m from 1 to 120.
fn random_miro(rng: &mut TestRng) -> Miro {
    let tau = (1.0 + rng.f64() * 7.0) as f32;
    Miro {
        mode: 1 + rng.below(2) as i32,
        tau,
        eta: (0.05 + rng.f64() * 0.3) as f32,
        m: [1, 2, 5, 100, 120][rng.below(5)],
        mu: (2.0 * tau as f64 * (0.3 + rng.f64() * 1.4)) as f32,
    }
}

/// Seeded random rows (some with top-k before mirostat, some masked tokens): every token drawn
/// lies in the reference's kept set, and the mu out is the reference's update from its surprise,
/// at every level on 1 and 4 threads, bit for bit the same everywhere.
#[test]
fn kept_sets_and_mu_match_the_float64_reference_at_every_level() {
    let mut rng = TestRng::new(701);
    let (rows, vocab) = (48usize, 3000usize);
    let mut x: Vec<f32> = Vec::with_capacity(rows * vocab);
    for r in 0..rows {
        let sd = [0.5, 1.5, 3.0, 6.0][r % 4];
        for i in 0..vocab {
            let masked = r % 5 == 4 && i % 7 == 0;
            x.push(if masked { f32::NEG_INFINITY } else { (rng.normal() * sd) as f32 });
        }
    }
    let ms: Vec<Miro> = (0..rows).map(|_| random_miro(&mut rng)).collect();
    let t: Vec<f32> = (0..rows).map(|r| [1.0, 0.7, 1.3][r % 3]).collect();
    let top_k: Vec<i32> = (0..rows).map(|r| if r % 3 == 2 { 50 } else { 0 }).collect();
    let seeds: Vec<u64> = (0..rows as u64).map(|r| 77 + r).collect();
    let offsets = vec![5u64; rows];
    let m = MiroRows::of(&ms);
    let base = Batch {
        temperature: Some(&t),
        top_k: Some(&top_k),
        seeds: Some(&seeds),
        offsets: Some(&offsets),
        ..Batch::new(Logits::F32(&x), rows, vocab)
    };
    let b = m.on(base);
    let mut first: Option<(Vec<i32>, Vec<u32>)> = None;
    let mut checked = 0;
    each_level(|level| {
        for threads in [1usize, 4] {
            let (tokens, mu) = draw_mu(&sampler_with(level, 3, threads), &b);
            let bits: Vec<u32> = mu.iter().map(|v| v.to_bits()).collect();
            match &first {
                None => first = Some((tokens.clone(), bits)),
                Some(f) => assert_eq!((&tokens, &bits), (&f.0, &f.1), "{level:?} threads {threads}"),
            }
            for r in 0..rows {
                let row = &x[r * vocab..(r + 1) * vocab];
                let chain = chain_of(row, top_k[r]);
                let v = reference(row, &chain, t[r], ms[r], vocab, Rule::Llama);
                if v.ambiguous {
                    continue;
                }
                let tok = tokens[r] as usize;
                assert!(v.kept[tok], "row {r}: token {tok} outside the kept set ({:?})", ms[r]);
                let want = updated(ms[r], v.surprise[tok]);
                assert!(mu_close(mu[r], want), "row {r}: mu {} vs {want} ({:?})", mu[r], ms[r]);
                checked += 1;
            }
        }
    });
    assert!(checked >= rows, "too few rows checked: {checked}");
}

/// The set top-k keeps of a row (ties kept); every finite token when `k` is 0.
fn chain_of(x: &[f32], k: i32) -> Vec<bool> {
    let mut sorted: Vec<f32> = x.iter().copied().filter(|v| v.is_finite()).collect();
    sorted.sort_by(|a, b| b.total_cmp(a));
    let floor = if k > 0 && (k as usize) < sorted.len() { sorted[k as usize - 1] } else { f32::NEG_INFINITY };
    x.iter().map(|&v| v.is_finite() && v >= floor).collect()
}

/// Probabilities of softmax(x / T) renormalised over `kept`.
fn probs_over(x: &[f32], t: f32, kept: &[bool]) -> Vec<f64> {
    let m = x.iter().filter(|v| v.is_finite()).fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
    let w: Vec<f64> =
        x.iter().zip(kept).map(|(&v, &k)| if k { ((v as f64 - m) * inv_t32(t)).exp() } else { 0.0 }).collect();
    let z: f64 = w.iter().sum();
    w.iter().map(|w| w / z).collect()
}

/// Frequencies of many unseeded draws of one row against `want`; each wrong set must be
/// rejected (a drawn token outside it, or chi-square).
fn frequencies_pass(x: &[f32], t: f32, ms: Miro, want: &[bool], wrong: &[(&[bool], &str)]) {
    let vocab = x.len();
    let per_call = 4000;
    let all: Vec<f32> = (0..per_call).flat_map(|_| x.iter().copied()).collect();
    let m = MiroRows::of(&vec![ms; per_call]);
    let temps = vec![t; per_call];
    let b = m.on(Batch { temperature: Some(&temps), ..Batch::new(Logits::F32(&all), per_call, vocab) });
    each_level(|level| {
        let s = sampler(level, 19);
        let mut counts = vec![0u64; vocab];
        for _ in 0..20 {
            for tok in draw(&s, &b).0 {
                counts[tok as usize] += 1;
            }
        }
        let (stat, dof) = chi2(&counts, &probs_over(x, t, want));
        assert!(stat < chi2_critical(dof, 5.0), "{level:?} {ms:?}: chi2 {stat} dof {dof}");
        for (set, what) in wrong {
            let p = probs_over(x, t, set);
            let outside = counts.iter().zip(&p).any(|(&c, &p)| c > 0 && p == 0.0);
            assert!(outside || chi2(&counts, &p).0 > chi2_critical(chi2(&counts, &p).1, 5.0), "{what} not rejected");
        }
    });
}

/// v2's draws follow softmax(x / T) over its kept set; the cut in nats is rejected.
#[test]
fn v2_frequencies_match_and_a_cut_in_nats_is_rejected() {
    let mut rng = TestRng::new(711);
    let x: Vec<f32> = (0..40).map(|_| (rng.normal() * 2.0) as f32).collect();
    let all = vec![true; x.len()];
    let t = 0.9f32;
    let ms = Miro { mode: 2, tau: 2.0, eta: 0.1, m: 100, mu: 4.0 };
    let right = reference(&x, &all, t, ms, x.len(), Rule::Llama);
    let nats = reference(&x, &all, t, ms, x.len(), Rule::Nats);
    assert!(!right.ambiguous && right.kept != nats.kept, "the power check needs sets that differ");
    assert!(right.kept.iter().filter(|&&k| k).count() >= 3, "a set worth a chi-square");
    frequencies_pass(&x, t, ms, &right.kept, &[(&nats.kept, "v2 in nats"), (&all, "no mirostat")]);
}

/// v1's draws follow softmax(x / T) over its top k; a k one too large is rejected.
#[test]
fn v1_frequencies_match_and_a_wrong_k_is_rejected() {
    let mut rng = TestRng::new(713);
    let x: Vec<f32> = (0..60).map(|i| -(i as f32) * 0.35 + (rng.normal() * 0.05) as f32).collect();
    let all = vec![true; x.len()];
    let t = 1.0f32;
    // A mu whose k keeps a handful of tokens, and whose next token carries a visible share.
    let ms = (4..40)
        .map(|i| Miro { mode: 1, tau: 3.0, eta: 0.1, m: 100, mu: i as f32 * 0.25 })
        .find(|&ms| {
            let v = reference(&x, &all, t, ms, x.len(), Rule::Llama);
            let n = v.kept.iter().filter(|&&k| k).count();
            !v.ambiguous && (3..=8).contains(&n)
        })
        .expect("a mu that keeps 3 to 8 tokens");
    let right = reference(&x, &all, t, ms, x.len(), Rule::Llama);
    let wrong = reference(&x, &all, t, ms, x.len(), Rule::KPlusOne);
    assert_ne!(right.kept, wrong.kept);
    frequencies_pass(&x, t, ms, &right.kept, &[(&wrong.kept, "v1 with k + 1")]);
}

/// A sequence of draws, each given the mu the previous one returned: the library's mu follows
/// the reference's step for step (and not the update from the probability before
/// renormalisation), and the observed surprise averages near tau.
#[test]
fn mu_sequences_follow_the_reference_over_many_steps() {
    let mut rng = TestRng::new(719);
    let vocab = 500;
    for mode in [1, 2] {
        let mut ms = Miro { mode, tau: 3.0, eta: 0.1, m: 100, mu: 6.0 };
        let mut mu_ref = ms.mu as f64;
        let s = sampler(best_level(), 5);
        let (mut surprise_sum, mut differs) = (0.0, false);
        let steps = 400;
        for step in 0..steps {
            let x: Vec<f32> = (0..vocab).map(|_| (rng.normal() * 2.5) as f32).collect();
            let m = MiroRows::of(&[ms]);
            let (seed, offset) = ([42u64], [step as u64]);
            let b = m.on(Batch { seeds: Some(&seed), offsets: Some(&offset), ..Batch::new(Logits::F32(&x), 1, vocab) });
            let (tokens, mu) = draw_mu(&s, &b);
            let all = vec![true; vocab];
            let v = reference(&x, &all, 1.0, ms, vocab, Rule::Llama);
            let tok = tokens[0] as usize;
            if !v.ambiguous {
                assert!(v.kept[tok], "mode {mode} step {step}: token outside the kept set");
                mu_ref = updated(ms, v.surprise[tok]);
                assert!(mu_close(mu[0], mu_ref), "mode {mode} step {step}: mu {} vs {mu_ref}", mu[0]);
                let unnormalised = reference(&x, &all, 1.0, ms, vocab, Rule::NotRenormalised);
                differs |= !mu_close(mu[0], updated(ms, unnormalised.surprise[tok]));
                surprise_sum += v.surprise[tok];
            }
            ms.mu = mu[0];
        }
        assert!(differs, "mode {mode}: the update without renormalisation was never rejected");
        let mean = surprise_sum / steps as f64;
        assert!((mean - 3.0).abs() < 0.5, "mode {mode}: mean surprise {mean} far from tau 3 (mu {mu_ref})");
    }
}

/// Defaults: NULL tau, eta, m and mu are llama.cpp's 5, 0.1, 100 and 2 tau; a greedy row keeps
/// its maximum (surprise 0); a row with mirostat 0 draws what it draws without the fields and
/// gets NaN; rows of a call without mirostat are unchanged.
#[test]
fn defaults_greedy_rows_and_rows_without_mirostat() {
    let mut rng = TestRng::new(727);
    let (rows, vocab) = (6usize, 2000usize);
    let x: Vec<f32> = (0..rows * vocab).map(|_| (rng.normal() * 2.0) as f32).collect();
    let t = [1.0f32, 0.0, 1.0, 0.8, 0.0, 1.2];
    let mode = [2, 1, 0, 1, 0, 2];
    let seeds: Vec<u64> = (0..rows as u64).collect();
    let base = Batch { temperature: Some(&t), seeds: Some(&seeds), ..Batch::new(Logits::F32(&x), rows, vocab) };
    let plain = draw(&sampler(best_level(), 1), &base).0;
    let b = Batch { mirostat: Some(&mode), ..base };
    let (tokens, mu) = draw_mu(&sampler(best_level(), 1), &b);
    let defaults = Miro { mode: 0, tau: 5.0, eta: 0.1, m: 100, mu: 10.0 };
    for r in 0..rows {
        let row = &x[r * vocab..(r + 1) * vocab];
        let greedy = t[r] == 0.0;
        if mode[r] == 0 {
            assert_eq!(tokens[r], plain[r], "row {r}: mirostat 0 changed the token");
            assert!(mu[r].is_nan(), "row {r}: {}", mu[r]);
        } else if greedy {
            assert_eq!(tokens[r], plain[r], "row {r}: a greedy row's token");
            assert!(mu_close(mu[r], updated(defaults, 0.0)), "row {r}: {}", mu[r]);
        } else {
            let v = reference(row, &[true; 2000], t[r], Miro { mode: mode[r], ..defaults }, vocab, Rule::Llama);
            let tok = tokens[r] as usize;
            assert!(v.kept[tok], "row {r}");
            assert!(mu_close(mu[r], updated(defaults, v.surprise[tok])), "row {r}: {}", mu[r]);
        }
    }
}

/// Bad values name the field and row; nothing is written (tokens and mu out untouched), and the
/// sampler's stream is as it was.
#[test]
fn bad_values_name_the_field_and_row_and_write_nothing() {
    let x: Vec<f32> = (0..40).map(|i| (i % 7) as f32 + i as f32 * 0.01).collect();
    let base = Batch::new(Logits::F32(&x), 4, 10);
    let on = [2, 1, 1, 2];
    let bad_mode = [0, 3, 0, 0];
    let neg_mode = [0, 0, -1, 0];
    let nan = [5.0f32, 5.0, f32::NAN, 5.0];
    let inf = [0.1f32, 0.1, 0.1, f32::INFINITY];
    let m0 = [100, 0, 100, 100];
    let forced = [-1, -1, -1, 3];
    let cases: Vec<(Batch, &str)> = vec![
        (Batch { mirostat: Some(&bad_mode), ..base }, "mirostat[1]: 3 is not 0 (off), 1 (v1) or 2 (v2)"),
        (Batch { mirostat: Some(&neg_mode), ..base }, "mirostat[2]"),
        (Batch { mirostat: Some(&on), mirostat_tau: Some(&nan), ..base }, "mirostat_tau[2]: NaN"),
        (Batch { mirostat: Some(&on), mirostat_eta: Some(&inf), ..base }, "mirostat_eta[3]: inf"),
        (Batch { mirostat: Some(&on), mirostat_mu: Some(&nan), ..base }, "mirostat_mu[2]"),
        (Batch { mirostat: Some(&on), mirostat_m: Some(&m0), ..base }, "mirostat_m[1]: 0 is below 1"),
        (Batch { mirostat: Some(&on), forced_tokens: Some(&forced), ..base }, "mirostat[3]"),
    ];
    let s = sampler(best_level(), 0);
    for (b, needle) in cases {
        let (mut tokens, mut mu) = (vec![-7; 4], vec![9f32; 4]);
        let err = s.draw(&b, &mut Output { mirostat_mu: Some(&mut mu), ..Output::new(&mut tokens) }).unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidArgument);
        assert!(err.message.contains(needle), "{:?} does not name {needle}", err.message);
        assert!(tokens.iter().all(|&v| v == -7) && mu.iter().all(|&v| v == 9.0), "a failed call wrote");
    }
    // A short mu output, and processed logprobs of a mirostat row.
    let b = Batch { mirostat: Some(&on), ..base };
    let (mut tokens, mut mu) = (vec![-7; 4], vec![9f32; 3]);
    let err = s.draw(&b, &mut Output { mirostat_mu: Some(&mut mu), ..Output::new(&mut tokens) }).unwrap_err();
    assert!(err.message.contains("mirostat_mu"), "{}", err.message);
    let mut lps = vec![5f32; 4];
    let mut out = Output { logprobs: Some(&mut lps), logprob_mode: LogprobMode::Processed, ..Output::new(&mut tokens) };
    let err = s.draw(&b, &mut out).unwrap_err();
    assert!(err.message.contains("mirostat"), "{}", err.message);
    assert!(tokens.iter().all(|&v| v == -7), "a failed call wrote");
    // A refused call takes no key of the stream: the next unseeded draw is the fresh sampler's.
    let fresh = draw(&sampler(best_level(), 0), &b).0;
    assert_eq!(draw(&s, &b).0, fresh);
    // A score call refuses mirostat.
    let err = s.score(&b, &[0, 1, 2, 3], &mut Output::new(&mut tokens)).unwrap_err();
    assert!(err.message.contains("mirostat"), "{}", err.message);
}
