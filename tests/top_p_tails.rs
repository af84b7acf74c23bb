//! Top-p decided after the race from the mass with bounds refined by the heaviest blocks: rows
//! whose mass sits in more peaks than a row of few heavy blocks has, so that the draw judges
//! its winner from a pass of cheap weights whose bounds the f32 exps of the heaviest blocks
//! tighten. The frequencies of the tokens drawn must be those of the float64 reference's kept
//! set, and the same counts must reject the rule that keeps one token more or one token less.
mod common;

use common::*;
use tokenrace::*;

/// The float64 reference of top-p: the tokens from the largest logit down until their mass
/// reaches `top_p` of the whole, every token tied with the last one kept too.
fn reference_kept(x: &[f32], t: f32, top_p: f64) -> Vec<bool> {
    let m = x.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let w: Vec<f64> = x.iter().map(|&v| ((v as f64 - m) / t as f64).exp()).collect();
    let z: f64 = w.iter().sum();
    let mut order: Vec<usize> = (0..x.len()).collect();
    order.sort_by(|&a, &b| x[b].total_cmp(&x[a]));
    let mut cum = 0.0;
    let mut theta = f32::NEG_INFINITY;
    for &i in &order {
        cum += w[i];
        if cum >= top_p * z {
            theta = x[i];
            break;
        }
    }
    x.iter().map(|&v| v >= theta).collect()
}

fn probs_of(x: &[f32], t: f32, kept: &[bool]) -> Vec<f64> {
    let m = x.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let w: Vec<f64> =
        x.iter().zip(kept).map(|(&v, &k)| if k { ((v as f64 - m) / t as f64).exp() } else { 0.0 }).collect();
    let z: f64 = w.iter().sum();
    w.iter().map(|&v| v / z).collect()
}

/// Chi-square of `counts` against `p`, where `p` may give 0 to tokens drawn: such a cell counts
/// as a cell of expectation 1e-9 (a rule that gives a drawn token no mass is rejected).
fn chi2_any(counts: &[u64], p: &[f64]) -> f64 {
    let n: u64 = counts.iter().sum();
    counts
        .iter()
        .zip(p)
        .filter(|&(&c, &q)| c > 0 || q > 0.0)
        .map(|(&c, &q)| {
            let e = (q * n as f64).max(1e-9);
            (c as f64 - e).powi(2) / e
        })
        .sum()
}

/// N(0, 1) and 24 peaks near 8-10 in as many blocks (more than a row of few heavy blocks has),
/// the 12 highest well above the others.
fn row(rng: &mut TestRng, vocab: usize) -> Vec<f32> {
    let mut x: Vec<f32> = (0..vocab).map(|_| rng.normal() as f32).collect();
    for j in 0..24 {
        let height = if j < 12 { 10.0 - 0.1 * j as f64 } else { 8.0 - 0.1 * (j - 12) as f64 };
        x[j * 256 * (vocab / 256 / 24) + 17 + rng.below(200)] = height as f32;
    }
    x
}

#[test]
fn top_p_from_refined_bounds_matches_the_float64_reference_by_chi_square() {
    let mut rng = TestRng::new(91);
    let (vocab, rows, calls) = (8192usize, 500usize, 40u64);
    let x = row(&mut rng, vocab);
    let all: Vec<f32> = (0..rows).flat_map(|_| x.iter().copied()).collect();
    for (t, p) in [(1.0f32, 0.9f32), (1.0, 0.8), (0.9, 0.95)] {
        let kept = reference_kept(&x, t, p as f64);
        let want = probs_of(&x, t, &kept);
        // The rules a wrong boundary would give: the first token top-p drops kept as well, and
        // the last token it keeps dropped.
        let mut order: Vec<usize> = (0..vocab).filter(|&i| kept[i]).collect();
        order.sort_by(|&a, &b| x[a].total_cmp(&x[b]));
        let last_kept = order[0];
        let first_dropped = (0..vocab).filter(|&i| !kept[i]).max_by(|&a, &b| x[a].total_cmp(&x[b])).unwrap();
        let mut more = kept.clone();
        more[first_dropped] = true;
        let mut fewer = kept.clone();
        fewer[last_kept] = false;
        each_level(|level| {
            let s = Sampler::new(Config { threads: 1, ..sampler(level, 5).config().clone() }).unwrap();
            let (temps, ps) = (vec![t; rows], vec![p; rows]);
            let refined_before = tokenrace::internals::refined_on_this_thread();
            let mut counts = vec![0u64; vocab];
            for call in 0..calls {
                let seeds: Vec<u64> = (0..rows as u64).map(|r| call * 100_000 + r).collect();
                let b = Batch {
                    temperature: Some(&temps),
                    top_p: Some(&ps),
                    seeds: Some(&seeds),
                    ..Batch::new(Logits::F32(&all), rows, vocab)
                };
                for tok in draw(&s, &b).0 {
                    counts[tok as usize] += 1;
                }
            }
            let refined = tokenrace::internals::refined_on_this_thread() - refined_before;
            let n = rows as u64 * calls;
            // The refined bounds decided a good share of the winners: the branch under test ran.
            assert!(refined * 50 >= n, "{level:?} T {t} p {p}: only {refined} of {n} winners refined");
            let (stat, dof) = chi2(&counts, &want);
            assert!(stat < chi2_critical(dof, 5.0), "{level:?} T {t} p {p}: chi2 {stat} dof {dof}");
            for (name, wrong) in [("one more", &more), ("one fewer", &fewer)] {
                let bad = chi2_any(&counts, &probs_of(&x, t, wrong));
                assert!(bad > chi2_critical(dof + 1, 5.0), "{level:?} T {t} p {p}: {name} not rejected ({bad})");
            }
        });
    }
}
