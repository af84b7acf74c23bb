//! min-p / top-k / top-p and logprobs against float64 references written as literally as the
//! rules read, across every SIMD level and thread count.
mod common;

use common::*;
use std::collections::BTreeMap;
use tokenrace::internals::{kept_floor, kept_floor_at};
use tokenrace::*;

fn inv_t(t: f32) -> f64 {
    let i = 1.0f32 / t;
    (if i.is_finite() { i } else { f32::MAX }) as f64
}

/// The float64 reference's kept set: temperature, min-p, top-k, top-p, each applied literally.
fn reference_kept(x: &[f32], t: f32, top_k: i32, top_p: f32, min_p: f32) -> Vec<bool> {
    let n = x.len();
    let w = weights(x, t);
    let mut kept: Vec<bool> = x.iter().map(|v| v.is_finite()).collect();
    // min-p on the probabilities: drop p_i < min_p * p_max.
    if min_p > 0.0 {
        let z: f64 = (0..n).filter(|&i| kept[i]).map(|i| w[i]).sum();
        let pmax = (0..n).filter(|&i| kept[i]).map(|i| w[i] / z).fold(0.0, f64::max);
        for i in 0..n {
            if kept[i] && w[i] / z < min_p as f64 * pmax {
                kept[i] = false;
            }
        }
    }
    // top-k: keep logits >= the k-th largest kept one.
    if top_k > 0 && (top_k as usize) < n {
        let mut v: Vec<f32> = (0..n).filter(|&i| kept[i]).map(|i| x[i]).collect();
        v.sort_by(|a, b| b.total_cmp(a));
        if v.len() > top_k as usize {
            let kth = v[top_k as usize - 1];
            for i in 0..n {
                kept[i] &= x[i] >= kth;
            }
        }
    }
    // top-p: sort descending, cumulate renormalised probabilities until they reach p.
    if top_p < 1.0 {
        let mut idx: Vec<usize> = (0..n).filter(|&i| kept[i]).collect();
        idx.sort_by(|&a, &b| x[b].total_cmp(&x[a]));
        let z: f64 = idx.iter().map(|&i| w[i]).sum();
        let mut cum = 0.0;
        let mut thr = x[*idx.last().unwrap()];
        for &i in &idx {
            cum += w[i] / z;
            if cum >= top_p as f64 {
                thr = x[i];
                break;
            }
        }
        for i in 0..n {
            kept[i] &= x[i] >= thr;
        }
    }
    kept
}

/// Unnormalised weights exp((x - m) * inv_t) in f64 (0 for non-finite logits).
fn weights(x: &[f32], t: f32) -> Vec<f64> {
    let m = x.iter().filter(|v| v.is_finite()).fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
    let it = inv_t(t);
    x.iter().map(|&v| if v.is_finite() { ((v as f64 - m) * it).exp() } else { 0.0 }).collect()
}

/// The renormalised probabilities over a kept set.
fn probs_of(x: &[f32], t: f32, kept: &[bool]) -> Vec<f64> {
    let w = weights(x, t);
    let z: f64 = (0..x.len()).filter(|&i| kept[i]).map(|i| w[i]).sum();
    (0..x.len()).map(|i| if kept[i] { w[i] / z } else { 0.0 }).collect()
}

fn kept_of(x: &[f32], t: f32, k: i32, p: f32, mp: f32) -> Vec<bool> {
    let floor = kept_floor(x, t, k, p, mp);
    x.iter().map(|&v| v.is_finite() && v >= floor).collect()
}

fn check_kept(x: &[f32], t: f32, k: i32, p: f32, mp: f32) {
    let want = reference_kept(x, t, k, p, mp);
    let got = kept_of(x, t, k, p, mp);
    assert_eq!(got, want, "x={x:?} t={t} k={k} p={p} min_p={mp}");
    if k > 0 {
        // top-k gathers its candidates with each level's SIMD gather: every level, one floor.
        let floors: Vec<u32> = supported_levels().iter().map(|&l| kept_floor_at(l, x, t, k, p, mp).to_bits()).collect();
        assert!(floors.iter().all(|&f| f == floors[0]), "levels disagree: {floors:?} (t {t} k {k} p {p} min_p {mp})");
    }
}

const NINF: f32 = f32::NEG_INFINITY;

fn hand_rows() -> Vec<Vec<f32>> {
    vec![
        vec![1.0, 2.0, 3.0, 4.0],
        vec![2.0, 2.0, 2.0, 2.0, 1.0],
        vec![0.5, 3.0, 3.0, NINF, 1.0, f32::NAN, 3.0, -2.0, 0.0],
        vec![NINF, 5.0, NINF, 4.0, 4.0, 4.0, f32::NAN, 1.0],
        vec![10.0, 9.5, 9.5, 9.0, -1e30, 0.0, 0.0, -5.0, 10.0],
        vec![7.0],
        vec![1.0, f32::NAN, NINF],
        vec![3.0, 1.0, -1.0, 0.5, 0.5, 2.0, 2.0, 3.0, -3.0, 1.5],
    ]
}

#[test]
fn kept_sets_match_the_float64_reference_on_hand_made_rows() {
    let mut rows = hand_rows();
    let mut rng = TestRng::new(5);
    for &n in &[50usize, 300, 1000, 3000] {
        // Few distinct values (many ties), in blocks that are partly masked.
        let mut x: Vec<f32> = (0..n).map(|_| (rng.below(12) as f32) * 0.5).collect();
        for i in (0..n).step_by(7) {
            x[i] = NINF;
        }
        rows.push(x);
        rows.push(peaked_logits(&mut rng, n, 3.0, 15.0));
    }
    for x in &rows {
        for &t in &[1.0f32, 0.5, 2.0, 1e-6, 1e6, 1e-30, 1e30] {
            for &k in &[0, 1, 2, 3, 5, 50, 1000, -1] {
                for &p in &[1.0f32, 0.9, 0.5, 0.3, 1e-9, 0.999] {
                    for &mp in &[0.0f32, 0.05, 0.3, 0.9, 1.0] {
                        check_kept(x, t, k, p, mp);
                    }
                }
            }
        }
    }
}

fn as_map(x: &[f32], probs: &[f64]) -> BTreeMap<usize, f64> {
    let _ = x;
    probs.iter().enumerate().filter(|(_, &p)| p > 0.0).map(|(i, &p)| (i, p)).collect()
}

fn check_map(got: &BTreeMap<usize, f64>, want: &[(usize, f64)], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: {got:?} vs {want:?}");
    for &(i, p) in want {
        let g = got.get(&i).copied().unwrap_or_else(|| panic!("{what}: id {i} missing from {got:?}"));
        assert!((g - p).abs() < 1e-5, "{what}: id {i} has {g}, expected {p}");
    }
}

#[test]
fn llama_cpp_test_sampling_cases() {
    let x: Vec<f32> = [0.1f32, 0.2, 0.3, 0.4].iter().map(|p| p.ln()).collect();
    let run = |k: i32, p: f32, mp: f32| {
        let kept = kept_of(&x, 1.0, k, p, mp);
        assert_eq!(kept, reference_kept(&x, 1.0, k, p, mp));
        as_map(&x, &probs_of(&x, 1.0, &kept))
    };
    let all = [(0, 0.1), (1, 0.2), (2, 0.3), (3, 0.4)];
    check_map(&run(1, 1.0, 0.0), &[(3, 1.0)], "top_k 1");
    check_map(&run(3, 1.0, 0.0), &[(3, 4.0 / 9.0), (2, 3.0 / 9.0), (1, 2.0 / 9.0)], "top_k 3");
    check_map(&run(4, 1.0, 0.0), &all, "top_k 4");
    check_map(&run(0, 1.0, 0.0), &all, "top_k 0");
    check_map(&run(0, 1e-9, 0.0), &[(3, 1.0)], "top_p tiny");
    check_map(&run(0, 0.7, 0.0), &[(3, 0.571429), (2, 0.428571)], "top_p 0.7");
    check_map(&run(0, 0.8, 0.0), &[(3, 4.0 / 9.0), (2, 3.0 / 9.0), (1, 2.0 / 9.0)], "top_p 0.8");
    check_map(&run(0, 1.0, 0.0), &all, "top_p 1");
    for mp in [0.0f32, 0.24] {
        check_map(&run(0, 1.0, mp), &all, "min_p low");
    }
    for mp in [0.26f32, 0.49] {
        check_map(&run(0, 1.0, mp), &[(1, 2.0 / 9.0), (2, 3.0 / 9.0), (3, 4.0 / 9.0)], "min_p 0.26/0.49");
    }
    for mp in [0.51f32, 0.74] {
        check_map(&run(0, 1.0, mp), &[(2, 3.0 / 7.0), (3, 4.0 / 7.0)], "min_p 0.51/0.74");
    }
    for mp in [0.76f32, 1.0] {
        check_map(&run(0, 1.0, mp), &[(3, 1.0)], "min_p 0.76/1");
    }
}

fn filtered_batch<'a>(
    x: &'a [f32],
    rows: usize,
    vocab: usize,
    temps: &'a [f32],
    k: &'a [i32],
    p: &'a [f32],
    mp: &'a [f32],
) -> Batch<'a> {
    Batch {
        temperature: Some(temps),
        top_k: Some(k),
        top_p: Some(p),
        min_p: Some(mp),
        ..Batch::new(Logits::F32(x), rows, vocab)
    }
}

#[test]
fn sampled_frequencies_match_the_filtered_distribution() {
    let mut rng = TestRng::new(11);
    let vocab = 40;
    let x: Vec<f32> = (0..vocab).map(|_| (rng.normal() * 1.5) as f32).collect();
    let per_call = 4000;
    let all: Vec<f32> = (0..per_call).flat_map(|_| x.iter().copied()).collect();
    let cases = [(0.8f32, 10i32, 1.0f32, 0.0f32), (1.0, 0, 0.8, 0.0), (1.3, 0, 1.0, 0.1), (1.0, 20, 0.9, 0.02)];
    each_level(|level| {
        let s = sampler(level, 77);
        for &(t, k, p, mp) in &cases {
            let want = probs_of(&x, t, &reference_kept(&x, t, k, p, mp));
            let (temps, ks, ps, mps) = (vec![t; per_call], vec![k; per_call], vec![p; per_call], vec![mp; per_call]);
            let b = filtered_batch(&all, per_call, vocab, &temps, &ks, &ps, &mps);
            let mut counts = vec![0u64; vocab];
            for _ in 0..40 {
                for tok in draw(&s, &b).0 {
                    counts[tok as usize] += 1;
                }
            }
            let (stat, dof) = chi2(&counts, &want);
            assert!(stat < chi2_critical(dof, 5.0), "{level:?} {t} {k} {p} {mp}: chi2 {stat} dof {dof}");
            // The same counts reject the unfiltered distribution (pooling its zero cells).
            let unf = softmax64(&x, t as f64);
            let mut stat_u = 0.0;
            let n: u64 = counts.iter().sum();
            for (c, q) in counts.iter().zip(&unf) {
                let e = q * n as f64;
                stat_u += (*c as f64 - e).powi(2) / e;
            }
            assert!(stat_u > chi2_critical(vocab - 1, 5.0), "{level:?}: unfiltered not rejected ({stat_u})");
        }
    });
}

#[test]
fn tokens_do_not_depend_on_simd_level_or_threads() {
    let mut rng = TestRng::new(21);
    for &(rows, vocab) in &[(2usize, 70_000usize), (8, 20_000), (5, 3001)] {
        let mut x = Vec::new();
        for _ in 0..rows {
            x.extend(peaked_logits(&mut rng, vocab, 3.0, 14.0));
        }
        let temps: Vec<f32> = (0..rows).map(|r| [1.0, 0.7, 1.5, 0.0][r % 4]).collect();
        let ks: Vec<i32> = (0..rows).map(|r| [50, 0, 1000, 3][r % 4]).collect();
        let ps: Vec<f32> = (0..rows).map(|r| [0.9, 0.95, 1.0, 0.5][r % 4]).collect();
        let mps: Vec<f32> = (0..rows).map(|r| [0.0, 0.01, 0.001, 0.0][r % 4]).collect();
        let b = filtered_batch(&x, rows, vocab, &temps, &ks, &ps, &mps);
        let mut first: Option<Vec<i32>> = None;
        each_level(|level| {
            for threads in [1usize, 3] {
                let cfg = Config { threads, ..sampler(level, 9).config().clone() };
                let s = Sampler::new(cfg).unwrap();
                let got: Vec<i32> = (0..4).flat_map(|_| draw(&s, &b).0).collect();
                // Every token lies in its row's kept set.
                for (j, &tok) in got.iter().enumerate() {
                    let r = j % rows;
                    let row = &x[r * vocab..(r + 1) * vocab];
                    if temps[r] > 0.0 {
                        assert!(kept_of(row, temps[r], ks[r], ps[r], mps[r])[tok as usize], "row {r} token {tok}");
                    }
                }
                match &first {
                    None => first = Some(got),
                    Some(f) => assert_eq!(&got, f, "{level:?} threads {threads} {rows}x{vocab}"),
                }
            }
        });
    }
}

/// A row with top-k or top-p (and min-p or not) on a peaked row may race first and decide its
/// filters for the winner alone; a call asking for processed logprobs computes the threshold
/// first (one asking for raw ones need not). All must give the same token for the same seed, at
/// every level, both filter orders, f32 and bf16; and every token lies in the reference's kept
/// set. The rows put the top-p and top-k boundaries
/// among the peaks (the winner is often the first token they drop) and below them.
#[test]
fn filters_decided_after_the_race_give_the_tokens_of_the_threshold() {
    let mut rng = TestRng::new(41);
    let (rows, vocab) = (48usize, 20_003usize);
    let mut x = Vec::new();
    for r in 0..rows {
        // Peaked enough that the draw races first at every temperature here (few heavy blocks).
        let mut row = peaked_logits(&mut rng, vocab, 1.0, 12.0);
        // Every third row: four near-equal peaks in one block, so that top-p 0.5-0.8 and top-k
        // 2-3 cut between them, and top-k counts the tokens above the winner in that block.
        if r % 3 == 0 {
            for (j, i) in [(0, 5002), (1, 5003), (2, 5004), (3, 5010)] {
                row[i] = 12.0 - 0.25 * j as f32;
            }
        }
        x.extend(row);
    }
    let temps: Vec<f32> = (0..rows).map(|r| [1.0, 0.7, 1.2, 0.9][r % 4]).collect();
    let ps: Vec<f32> = (0..rows).map(|r| [0.9, 0.5, 0.75, 0.99, 0.3, 0.95, 1.0][r % 7]).collect();
    let mps: Vec<f32> = (0..rows).map(|r| [0.0, 0.0, 0.02, 0.0, 0.2][r % 5]).collect();
    let ks: Vec<i32> = (0..rows).map(|r| [3, 2, 0, 2, 50, 1][r % 6]).collect();
    let b16: Vec<Bf16> = x.iter().map(|&v| Bf16::from_f32(v)).collect();
    let x16: Vec<f32> = b16.iter().map(|v| v.to_f32()).collect();
    for order in [FilterOrder::TemperatureFirst, FilterOrder::FiltersFirst] {
        each_level(|level| {
            let s = Sampler::new(Config { filter_order: order, ..sampler(level, 3).config().clone() }).unwrap();
            for (logits, values) in [(Logits::F32(&x), &x), (Logits::Bf16(&b16), &x16)] {
                for call in 0..12u64 {
                    let seeds: Vec<u64> = (0..rows as u64).map(|r| call * 1000 + r).collect();
                    let b = Batch { seeds: Some(&seeds), ..filtered_batch(&x, rows, vocab, &temps, &ks, &ps, &mps) };
                    let b = Batch { logits, ..b };
                    let plain = draw(&s, &b).0;
                    // Processed logprobs read the floor (computed first); raw ones do not.
                    for mode in [LogprobMode::Processed, LogprobMode::Raw] {
                        let (mut tokens, mut lps) = (vec![-1; rows], vec![0f32; rows]);
                        let lp = Some(&mut lps[..]);
                        s.draw(&b, &mut Output { logprobs: lp, logprob_mode: mode, ..Output::new(&mut tokens) })
                            .unwrap();
                        assert_eq!(plain, tokens, "{order:?} {level:?} {mode:?} call {call}");
                    }
                    for (r, &tok) in plain.iter().enumerate() {
                        let row = &values[r * vocab..(r + 1) * vocab];
                        let t = if order == FilterOrder::FiltersFirst { 1.0 } else { temps[r] };
                        let kept = kept_of(row, t, ks[r], ps[r], mps[r]);
                        assert!(kept[tok as usize], "{order:?} {level:?} row {r} token {tok}");
                    }
                }
            }
        });
    }
}

/// Top-p without top-k on rows whose tail holds much of the mass (N(0, 2) and four peaks near
/// 9-11 at T 0.8-1.2: many heavy blocks) is decided after the race from two passes of mass
/// over the row: the tokens are those of the threshold (processed logprobs compute it first)
/// and lie in the float64 reference's kept set, at every level, with and without min-p, for
/// top-p values whose kept set the race's winner often misses (0.3, 0.5) and values near 1
/// (a winner the mass shows dropped is raced again above, without the threshold).
#[test]
fn top_p_decided_after_the_race_from_the_mass_gives_the_tokens_of_the_threshold() {
    let mut rng = TestRng::new(43);
    let (rows, vocab) = (40usize, 20_003usize);
    let mut x = Vec::new();
    for _ in 0..rows {
        x.extend(peaked_logits(&mut rng, vocab, 2.0, 11.0));
    }
    let temps: Vec<f32> = (0..rows).map(|r| [0.8, 1.0, 1.2, 0.9][r % 4]).collect();
    let ps: Vec<f32> = (0..rows).map(|r| [0.9, 0.5, 0.95, 0.3, 0.99, 0.75, 0.999][r % 7]).collect();
    let mps: Vec<f32> = (0..rows).map(|r| [0.0, 0.0, 0.02, 0.0, 0.001][r % 5]).collect();
    let ks = vec![0i32; rows];
    for order in [FilterOrder::TemperatureFirst, FilterOrder::FiltersFirst] {
        each_level(|level| {
            let s =
                Sampler::new(Config { filter_order: order, threads: 1, ..sampler(level, 3).config().clone() }).unwrap();
            let mut outside_without_filter = 0;
            let dropped_before = tokenrace::internals::dropped_on_this_thread();
            for call in 0..6u64 {
                let seeds: Vec<u64> = (0..rows as u64).map(|r| call * 1000 + r).collect();
                let b = Batch { seeds: Some(&seeds), ..filtered_batch(&x, rows, vocab, &temps, &ks, &ps, &mps) };
                let plain = draw(&s, &b).0;
                let (mut tokens, mut lps) = (vec![-1; rows], vec![0f32; rows]);
                let lp = Some(&mut lps[..]);
                let mut out = Output { logprobs: lp, logprob_mode: LogprobMode::Processed, ..Output::new(&mut tokens) };
                s.draw(&b, &mut out).unwrap();
                assert_eq!(plain, tokens, "{order:?} {level:?} call {call}");
                // The same seeds without top-p: the winners it must reject (the power of the
                // kept-set check below).
                let unfiltered = draw(&s, &Batch { top_p: None, ..b }).0;
                for (r, &tok) in plain.iter().enumerate() {
                    let row = &x[r * vocab..(r + 1) * vocab];
                    let t = if order == FilterOrder::FiltersFirst { 1.0 } else { temps[r] };
                    let kept = kept_of(row, t, 0, ps[r], mps[r]);
                    assert!(kept[tok as usize], "{order:?} {level:?} row {r} token {tok}");
                    outside_without_filter += usize::from(!kept[unfiltered[r] as usize]);
                }
            }
            assert!(outside_without_filter >= 20, "{level:?}: only {outside_without_filter} winners outside top-p");
            // Winners that top-p drops are found from the mass, and the row races again above
            // them: that path ran (and gave the threshold's tokens, checked above).
            let dropped = tokenrace::internals::dropped_on_this_thread() - dropped_before;
            assert!(dropped >= 10, "{level:?}: only {dropped} winners shown dropped by the mass");
        });
    }
}

/// log_softmax in f64 over a kept set (and scale), -inf outside.
fn log_softmax64(x: &[f32], scale: f64, kept: &[bool]) -> Vec<f64> {
    let m = x.iter().filter(|v| v.is_finite()).fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
    let z: f64 = (0..x.len()).filter(|&i| kept[i]).map(|i| ((x[i] as f64 - m) * scale).exp()).sum();
    (0..x.len()).map(|i| if kept[i] { (x[i] as f64 - m) * scale - z.ln() } else { f64::NEG_INFINITY }).collect()
}

fn close(a: f32, b: f64) -> bool {
    (a as f64 == b) || (a as f64 - b).abs() < 1e-5
}

#[test]
fn logprobs_ranks_and_top_n_match_float64() {
    let mut rng = TestRng::new(31);
    let vocab = 3000;
    let rows = 4;
    let mut x = Vec::new();
    for _ in 0..rows {
        x.extend(peaked_logits(&mut rng, vocab, 2.0, 9.0));
    }
    x[vocab + 5] = f32::NAN;
    x[2 * vocab + 7] = NINF;
    let temps = [1.0f32, 0.7, 0.0, 1.6];
    let ks = [0i32, 40, 5, 0];
    let ps = [0.9f32, 1.0, 0.5, 0.95];
    let mps = [0.0f32, 0.0, 0.0, 0.01];
    let b = filtered_batch(&x, rows, vocab, &temps, &ks, &ps, &mps);
    let top_n = 25;
    each_level(|level| {
        for mode in [LogprobMode::Raw, LogprobMode::Processed] {
            let s = sampler(level, 3);
            let (mut tokens, mut lps, mut ranks) = (vec![0; rows], vec![0f32; rows], vec![0; rows]);
            let (mut ids, mut tlps) = (vec![0; rows * top_n], vec![0f32; rows * top_n]);
            let mut out = Output {
                logprobs: Some(&mut lps),
                ranks: Some(&mut ranks),
                top_n,
                topn_ids: Some(&mut ids),
                topn_logprobs: Some(&mut tlps),
                logprob_mode: mode,
                ..Output::new(&mut tokens)
            };
            s.draw(&b, &mut out).unwrap();
            for r in 0..rows {
                let row = &x[r * vocab..(r + 1) * vocab];
                let greedy = temps[r] == 0.0;
                let (scale, kept) = if mode == LogprobMode::Processed && !greedy {
                    (inv_t(temps[r]), reference_kept(row, temps[r], ks[r], ps[r], mps[r]))
                } else {
                    (1.0, row.iter().map(|v| v.is_finite()).collect())
                };
                let want = log_softmax64(row, scale, &kept);
                let tok = tokens[r] as usize;
                assert!(close(lps[r], want[tok]), "{level:?} {mode:?} row {r}: {} vs {}", lps[r], want[tok]);
                let rank = want.iter().filter(|&&l| l >= want[tok]).count();
                assert_eq!(ranks[r] as usize, rank, "{level:?} {mode:?} row {r} rank");
                let mut order: Vec<usize> = (0..vocab).collect();
                order.sort_by(|&a, &b| want[b].total_cmp(&want[a]).then(a.cmp(&b)));
                for j in 0..top_n {
                    assert_eq!(ids[r * top_n + j] as usize, order[j], "{level:?} {mode:?} row {r} top {j}");
                    assert!(close(tlps[r * top_n + j], want[order[j]]), "row {r} top {j} logprob");
                }
            }
        }
    });
}

#[test]
fn logprobs_of_special_rows() {
    let s = sampler(best_level(), 1);
    let vocab = 6;
    let x = [
        0.0,
        f32::INFINITY,
        1.0,
        f32::INFINITY,
        f32::NAN,
        2.0, // two +inf
        NINF,
        NINF,
        f32::NAN,
        NINF,
        NINF,
        NINF, // empty
    ];
    let (mut tokens, mut lps, mut ranks) = (vec![0; 2], vec![0f32; 2], vec![0; 2]);
    let mut out = Output { logprobs: Some(&mut lps), ranks: Some(&mut ranks), ..Output::new(&mut tokens) };
    s.draw(&Batch::new(Logits::F32(&x), 2, vocab), &mut out).unwrap();
    assert_eq!(tokens, [1, 0]);
    assert!((lps[0] - (-(2f32).ln())).abs() < 1e-7);
    assert_eq!(ranks[0], 2);
    assert_eq!(lps[1], NINF);
    assert_eq!(ranks[1], vocab as i32);
}

#[test]
fn bad_filter_values_name_the_row_and_write_nothing() {
    let s = sampler(best_level(), 0);
    let x = vec![0f32; 40];
    let t = [1.0f32; 4];
    let check = |k: [i32; 4], p: [f32; 4], mp: [f32; 4], needle: &str| {
        let b = filtered_batch(&x, 4, 10, &t, &k, &p, &mp);
        let (mut tokens, mut lps) = (vec![-7; 4], vec![5f32; 4]);
        let mut out = Output { logprobs: Some(&mut lps), ..Output::new(&mut tokens) };
        let err = s.draw(&b, &mut out).unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidArgument);
        assert!(err.message.contains(needle), "{:?} does not name {needle}", err.message);
        assert!(tokens.iter().all(|&v| v == -7) && lps.iter().all(|&v| v == 5.0), "a failed call wrote");
    };
    let (k, p, mp) = ([0; 4], [1.0f32; 4], [0.0f32; 4]);
    check(k, [1.0, 1.0, 1.0, 0.0], mp, "top_p[3]");
    check(k, [1.0, f32::NAN, 1.0, 1.0], mp, "top_p[1]");
    check(k, [1.0, 1.0, 1.5, 1.0], mp, "top_p[2]");
    check(k, [-0.5, 1.0, 1.0, 1.0], mp, "top_p[0]");
    check(k, p, [0.0, 0.0, -0.1, 0.0], "min_p[2]");
    check(k, p, [0.0, 1.01, 0.0, 0.0], "min_p[1]");
    check(k, p, [f32::NAN, 0.0, 0.0, 0.0], "min_p[0]");
    // Output lengths.
    let b = Batch::new(Logits::F32(&x), 4, 10);
    let (mut tokens, mut ids) = (vec![-7; 4], vec![0; 7]);
    let mut out = Output { top_n: 2, topn_ids: Some(&mut ids), ..Output::new(&mut tokens) };
    assert!(s.draw(&b, &mut out).unwrap_err().message.contains("topn_ids"));
    let mut out = Output { top_n: 11, ..Output::new(&mut tokens) };
    assert!(s.draw(&b, &mut out).unwrap_err().message.contains("top_n"));
    assert!(tokens.iter().all(|&v| v == -7));
}

#[test]
fn c_abi_draw_with_filters_and_logprobs() {
    use tokenrace::internals::api::*;
    use tokenrace::internals::types::*;
    let vocab = 4u32;
    let x: Vec<f32> = [0.1f32, 0.2, 0.3, 0.4, 0.1, 0.2, 0.3, 0.4].iter().map(|p| p.ln()).collect();
    let temps = [1.0f32, 1.0];
    let top_k = [3i32, 0];
    let top_p = [1.0f32, 0.7];
    let min_p = [0.0f32, 0.0];
    unsafe {
        let mut cfg = tokenrace_config_default();
        cfg.has_seed = 1;
        cfg.seed = 5;
        let mut s = std::ptr::null_mut();
        assert_eq!(tokenrace_sampler_new(&cfg, &mut s), tokenrace_status::Ok);
        let mut b: tokenrace_batch = std::mem::zeroed();
        b.struct_size = std::mem::size_of::<tokenrace_batch>() as u32;
        b.logits = x.as_ptr() as *const _;
        b.rows = 2;
        b.vocab = vocab;
        b.temperature = temps.as_ptr();
        b.top_k = top_k.as_ptr();
        b.top_p = top_p.as_ptr();
        b.min_p = min_p.as_ptr();
        let (mut tokens, mut lps, mut ranks) = ([0i32; 2], [0f32; 2], [0i32; 2]);
        let (mut ids, mut tlps) = ([0i32; 4], [0f32; 4]);
        let mut o: tokenrace_output = std::mem::zeroed();
        o.struct_size = std::mem::size_of::<tokenrace_output>() as u32;
        o.logprob_mode = tokenrace_logprob_mode::Processed as u32;
        o.tokens = tokens.as_mut_ptr();
        o.logprobs = lps.as_mut_ptr();
        o.ranks = ranks.as_mut_ptr();
        o.top_n = 2;
        o.topn_ids = ids.as_mut_ptr();
        o.topn_logprobs = tlps.as_mut_ptr();
        for _ in 0..50 {
            assert_eq!(tokenrace_draw(s, &b, &mut o), tokenrace_status::Ok);
            assert!(tokens[0] >= 1 && tokens[1] >= 2, "{tokens:?}");
            assert_eq!(ids, [3, 2, 3, 2]);
            assert!((tlps[0] - (4f32 / 9.0).ln()).abs() < 1e-5 && (tlps[2] - (4f32 / 7.0).ln()).abs() < 1e-5);
            assert!((lps[1] - if tokens[1] == 3 { (4f32 / 7.0).ln() } else { (3f32 / 7.0).ln() }).abs() < 1e-5);
            assert_eq!(ranks[1], 4 - tokens[1]);
        }
        // A bad value fails naming the row; nothing is written.
        let bad = [1.0f32, 0.0];
        b.top_p = bad.as_ptr();
        tokens = [-9; 2];
        assert_eq!(tokenrace_draw(s, &b, &mut o), tokenrace_status::InvalidArgument);
        let msg = std::ffi::CStr::from_ptr(tokenrace_last_error()).to_string_lossy().into_owned();
        assert!(msg.contains("top_p[1]"), "{msg}");
        assert_eq!(tokens, [-9; 2]);
        tokenrace_sampler_free(s);
    }
}

// ---- top-nσ (llama.cpp's `top_n_sigma`) ----

use common::reference as rf;
use tokenrace::internals::kept_floor_with_sigma_at;

/// The reference's kept set with top-nσ `n` and the other filters `(k, p, min_p)`, judged at
/// temperature `t` (the vLLM order), and whether a cut lies within rounding of a threshold.
fn sigma_reference(x: &[f32], t: f32, (k, p, mp): (i32, f32, f32), n: f32) -> (Vec<bool>, bool) {
    let m = rf::finite_max(x);
    if !m.is_finite() {
        return (x.iter().map(|v| v.is_finite()).collect(), false);
    }
    rf::filter_set_with_sigma(x, m, inv_t(t), rf::Filters { top_k: k, top_p: p, min_p: mp }, n)
}

fn sigma_rows() -> Vec<Vec<f32>> {
    let mut rows = hand_rows();
    rows.push(vec![1.0, NINF, 3.0, f32::NAN]); // mean 2, sigma 1: n = 1.5 keeps x >= 1.5
    let mut rng = TestRng::new(37);
    for &n in &[40usize, 255, 256, 257, 1000, 5000] {
        rows.push((0..n).map(|_| (rng.normal() * 2.0) as f32).collect());
        let mut x = peaked_logits(&mut rng, n, 3.0, 12.0);
        for i in (0..n).step_by(5) {
            x[i] = NINF; // masked tokens stay out of the mean and sigma
        }
        rows.push(x);
    }
    rows
}

/// The kept set equals the float64 reference's (one with sigma summed in index order), alone and
/// with the other filters, and the floor is the same bit for bit at every SIMD level.
#[test]
fn top_n_sigma_kept_sets_match_the_float64_reference_at_every_level() {
    let levels = supported_levels();
    let mut checked = 0;
    for x in &sigma_rows() {
        for &n in &[0.0f32, -1.0, 0.25, 1.0, 1.5, 2.0, 3.0, 1e6] {
            for &t in &[1.0f32, 0.5, 2.0] {
                for &(k, p, mp) in &[(0, 1.0f32, 0.0f32), (3, 1.0, 0.0), (0, 0.9, 0.0), (0, 1.0, 0.05), (50, 0.8, 0.01)]
                {
                    let floors: Vec<f32> =
                        levels.iter().map(|&l| kept_floor_with_sigma_at(l, x, t, (k, p, mp), n)).collect();
                    assert!(floors.iter().all(|f| f.to_bits() == floors[0].to_bits()), "levels disagree: {floors:?}");
                    let (want, ambiguous) = sigma_reference(x, t, (k, p, mp), n);
                    if ambiguous {
                        continue;
                    }
                    let got: Vec<bool> = x.iter().map(|&v| v.is_finite() && v >= floors[0]).collect();
                    assert_eq!(got, want, "n {n} t {t} k {k} p {p} min_p {mp} x {:?}", &x[..x.len().min(12)]);
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 1000, "{checked}");
    // The hand-checked row: mean 2, sigma 1 over {1, 3}.
    let x = [1.0f32, NINF, 3.0, f32::NAN];
    assert_eq!(kept_floor_with_sigma_at(best_level(), &x, 1.0, (0, 1.0, 0.0), 1.5), 1.5);
    assert_eq!(kept_floor_with_sigma_at(best_level(), &x, 1.0, (0, 1.0, 0.0), 0.0), NINF);
}

fn sigma_batch<'a>(x: &'a [f32], rows: usize, vocab: usize, temps: &'a [f32], n: &'a [f32]) -> Batch<'a> {
    Batch { temperature: Some(temps), top_n_sigma: Some(n), ..Batch::new(Logits::F32(x), rows, vocab) }
}

fn sampler_with(level: SimdLevel, seed: u64, threads: usize, order: FilterOrder) -> Sampler {
    Sampler::new(Config { threads, filter_order: order, ..sampler(level, seed).config().clone() }).unwrap()
}

#[test]
fn top_n_sigma_tokens_do_not_depend_on_simd_level_threads_or_order() {
    let mut rng = TestRng::new(41);
    for &(rows, vocab) in &[(4usize, 50_000usize), (8, 3001)] {
        let mut x = Vec::new();
        for _ in 0..rows {
            x.extend((0..vocab).map(|_| (rng.normal() * 2.5) as f32));
        }
        let temps: Vec<f32> = (0..rows).map(|r| [1.0, 0.7, 1.5, 0.0][r % 4]).collect();
        let n: Vec<f32> = (0..rows).map(|r| [2.0, 3.0, 1.0, 2.5][r % 4]).collect();
        let b = sigma_batch(&x, rows, vocab, &temps, &n);
        let mut first: Option<Vec<i32>> = None;
        each_level(|level| {
            for threads in [1usize, 4] {
                // top-nσ is in logit units: both orders keep one set, and draw one token.
                for order in [FilterOrder::TemperatureFirst, FilterOrder::FiltersFirst] {
                    let s = sampler_with(level, 9, threads, order);
                    let got: Vec<i32> = (0..4).flat_map(|_| draw(&s, &b).0).collect();
                    for (j, &tok) in got.iter().enumerate() {
                        let r = j % rows;
                        let row = &x[r * vocab..(r + 1) * vocab];
                        let (kept, _) = sigma_reference(row, temps[r].max(1.0), (0, 1.0, 0.0), n[r]);
                        assert!(temps[r] == 0.0 || kept[tok as usize], "row {r} token {tok}");
                    }
                    match &first {
                        None => first = Some(got),
                        Some(f) => assert_eq!(&got, f, "{level:?} threads {threads} {order:?} {rows}x{vocab}"),
                    }
                }
            }
        });
    }
}

/// The frequencies match softmax(x / T) over the reference's kept set in both orders (in
/// `filters_first`, llama.cpp's chain `top_n_sigma -> temp -> dist`), and reject the set a wrong
/// sigma (the variance, without the square root) would keep.
#[test]
fn top_n_sigma_frequencies_match_the_reference_and_reject_a_wrong_sigma() {
    let mut rng = TestRng::new(43);
    let vocab = 40;
    let x: Vec<f32> = (0..vocab).map(|_| (rng.normal() * 2.0) as f32).collect();
    let per_call = 4000;
    let all: Vec<f32> = (0..per_call).flat_map(|_| x.iter().copied()).collect();
    let kept_at = |threshold: f64| -> Vec<bool> { x.iter().map(|&v| v as f64 >= threshold).collect() };
    each_level(|level| {
        for &(t, n) in &[(0.8f32, 1.0f32), (1.3, 0.7)] {
            let right = kept_at(rf::top_n_sigma_threshold(&x, n as f64).unwrap());
            let wrong = kept_at(rf::top_n_sigma_threshold_with(&x, n as f64, |v| v).unwrap());
            assert_ne!(right, wrong, "the wrong sigma must keep another set for the power check");
            assert!(right.iter().zip(&wrong).all(|(r, w)| !r || *w), "a sigma > 1: the wrong set holds the right one");
            let (want, unwanted) = (probs_of(&x, t, &right), probs_of(&x, t, &wrong));
            for order in [FilterOrder::TemperatureFirst, FilterOrder::FiltersFirst] {
                let s = sampler_with(level, 77, 1, order);
                let (temps, ns) = (vec![t; per_call], vec![n; per_call]);
                let b = sigma_batch(&all, per_call, vocab, &temps, &ns);
                let mut counts = vec![0u64; vocab];
                for _ in 0..20 {
                    for tok in draw(&s, &b).0 {
                        counts[tok as usize] += 1;
                    }
                }
                let (stat, dof) = chi2(&counts, &want);
                assert!(stat < chi2_critical(dof, 5.0), "{level:?} {order:?} t {t} n {n}: chi2 {stat} dof {dof}");
                let (stat_wrong, dof_wrong) = chi2(&counts, &unwanted);
                assert!(stat_wrong > chi2_critical(dof_wrong, 5.0), "{level:?} {order:?}: wrong sigma not rejected");
            }
        }
    });
}

/// Masked tokens (banned: -inf after the sampling step) are left out of the mean and sigma, as
/// llama.cpp leaves out -inf: the kept set is the reference's over the processed row.
#[test]
fn top_n_sigma_judges_the_processed_row() {
    let mut rng = TestRng::new(47);
    let vocab = 600;
    let x: Vec<f32> = (0..vocab).map(|_| (rng.normal() * 2.0) as f32).collect();
    let banned: Vec<i32> = (0..vocab as i32).filter(|i| i % 3 == 0).collect();
    let offsets = [0u64, banned.len() as u64];
    let (temps, n) = ([1.0f32], [1.0f32]);
    let b = Batch {
        banned_tokens: Some(TokenLists { ids: &banned, offsets: &offsets }),
        ..sigma_batch(&x, 1, vocab, &temps, &n)
    };
    let mut processed = x.clone();
    for &i in &banned {
        processed[i as usize] = NINF;
    }
    let (kept, ambiguous) = sigma_reference(&processed, 1.0, (0, 1.0, 0.0), 1.0);
    let (with_masked, _) = sigma_reference(&x, 1.0, (0, 1.0, 0.0), 1.0);
    assert!(!ambiguous);
    let mut seen = vec![false; vocab];
    each_level(|level| {
        let s = sampler(level, 3);
        for _ in 0..2000 {
            let tok = draw(&s, &b).0[0] as usize;
            assert!(kept[tok], "{level:?}: token {tok} outside the kept set");
            seen[tok] = true;
        }
    });
    // The sigma of the whole row would keep other tokens: some drawn tokens tell the two apart,
    // or the kept sets differ at least.
    let unmasked_kept: Vec<bool> = (0..vocab).map(|i| with_masked[i] && processed[i].is_finite()).collect();
    assert!(unmasked_kept != kept || seen.iter().filter(|&&s| s).count() > 1);
}

#[test]
fn bad_top_n_sigma_values_name_the_row_and_write_nothing() {
    let s = sampler(best_level(), 0);
    let x: Vec<f32> = (0..40).map(|i| (i % 7) as f32).collect();
    let t = [1.0f32; 4];
    for (n, needle) in [
        ([1.0f32, f32::NAN, 1.0, 1.0], "top_n_sigma[1]"),
        ([1.0, 1.0, 1.0, f32::INFINITY], "top_n_sigma[3]"),
        ([f32::NEG_INFINITY, 1.0, 1.0, 1.0], "top_n_sigma[0]"),
    ] {
        let b = sigma_batch(&x, 4, 10, &t, &n);
        let (mut tokens, mut lps) = (vec![-7; 4], vec![5f32; 4]);
        let mut out = Output { logprobs: Some(&mut lps), ..Output::new(&mut tokens) };
        let err = s.draw(&b, &mut out).unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidArgument);
        assert!(err.message.contains(needle), "{:?} does not name {needle}", err.message);
        assert!(tokens.iter().all(|&v| v == -7) && lps.iter().all(|&v| v == 5.0), "a failed call wrote");
    }
    // A negative n (or 0) is off, as in llama.cpp: the same tokens as without top-nσ.
    let b = sigma_batch(&x, 4, 10, &t, &[-1.0, 0.0, -0.5, 0.0]);
    let plain = Batch { temperature: Some(&t), ..Batch::new(Logits::F32(&x), 4, 10) };
    assert_eq!(draw(&sampler(best_level(), 5), &b).0, draw(&sampler(best_level(), 5), &plain).0);
}

/// The C field: applied at the full struct size, ignored by a caller whose struct_size ends
/// before it, and a size ending inside it is refused naming it.
#[test]
fn c_abi_top_n_sigma_and_its_struct_size() {
    use tokenrace::internals::api::*;
    use tokenrace::internals::types::*;
    let vocab = 4u32;
    let x = [0.0f32, 1.0, 2.0, 3.0]; // mean 1.5, sigma sqrt(1.25): n = 1 keeps 2 and 3
    let n = [1.0f32];
    unsafe {
        let mut cfg = tokenrace_config_default();
        cfg.has_seed = 1;
        cfg.seed = 5;
        let mut s = std::ptr::null_mut();
        assert_eq!(tokenrace_sampler_new(&cfg, &mut s), tokenrace_status::Ok);
        let mut b: tokenrace_batch = std::mem::zeroed();
        b.struct_size = std::mem::size_of::<tokenrace_batch>() as u32;
        b.logits = x.as_ptr() as *const _;
        b.rows = 1;
        b.vocab = vocab;
        b.top_n_sigma = n.as_ptr();
        let mut tokens = [0i32; 1];
        let mut o: tokenrace_output = std::mem::zeroed();
        o.struct_size = std::mem::size_of::<tokenrace_output>() as u32;
        o.tokens = tokens.as_mut_ptr();
        let mut seen_low = false;
        for _ in 0..200 {
            assert_eq!(tokenrace_draw(s, &b, &mut o), tokenrace_status::Ok);
            assert!(tokens[0] >= 2, "{tokens:?}");
        }
        // An older caller's struct ends before the field: it is not read.
        b.struct_size = std::mem::offset_of!(tokenrace_batch, top_n_sigma) as u32;
        for _ in 0..200 {
            assert_eq!(tokenrace_draw(s, &b, &mut o), tokenrace_status::Ok);
            seen_low |= tokens[0] < 2;
        }
        assert!(seen_low, "the field was read past struct_size");
        b.struct_size = std::mem::offset_of!(tokenrace_batch, top_n_sigma) as u32 + 4;
        tokens = [-9];
        assert_eq!(tokenrace_draw(s, &b, &mut o), tokenrace_status::InvalidArgument);
        let msg = std::ffi::CStr::from_ptr(tokenrace_last_error()).to_string_lossy().into_owned();
        assert!(msg.contains("inside field top_n_sigma"), "{msg}");
        // A bad value names the field and row; nothing is written.
        b.struct_size = std::mem::size_of::<tokenrace_batch>() as u32;
        let bad = [f32::NAN];
        b.top_n_sigma = bad.as_ptr();
        assert_eq!(tokenrace_draw(s, &b, &mut o), tokenrace_status::InvalidArgument);
        let msg = std::ffi::CStr::from_ptr(tokenrace_last_error()).to_string_lossy().into_owned();
        assert!(msg.contains("top_n_sigma[0]"), "{msg}");
        assert_eq!(tokens, [-9]);
        tokenrace_sampler_free(s);
    }
}
