//! llama.cpp's min_keep, locally typical sampling and XTC against a float64 reference written as
//! llama.cpp's rules read (each filter renormalises what the previous one left), llama.cpp's own
//! expected tables, frequencies (with a power check against a wrong rule), seeded bit-identity
//! across SIMD levels, threads and filter orders, and refusals.
mod common;

use common::*;
use tokenrace::internals::{kept_range_at, LlamaFilters};
use tokenrace::*;

const NINF: f32 = f32::NEG_INFINITY;

const OFF: LlamaFilters = LlamaFilters {
    top_k: 0,
    top_p: 1.0,
    min_p: 0.0,
    min_keep: 0,
    typical_p: 1.0,
    xtc_probability: 0.0,
    xtc_threshold: 1.0,
};

/// What the reference's XTC does when it applies; the power checks swap in a wrong one.
#[derive(Clone, Copy, PartialEq)]
enum Xtc {
    /// llama.cpp's: remove every token with p >= threshold but the least probable.
    KeepLeast,
    /// Wrong: remove them all but the most probable.
    KeepMost,
}

/// The float64 reference: llama.cpp's chain in tokenrace's order (min-p, top-k, typical, top-p,
/// XTC, XTC always applied when on), on the probabilities of `x` at 1/T `inv_t`. Rows without
/// ties (the race keeps tied values together; llama.cpp's sorts split them by chance).
/// `typical_min_keep`: the min_keep typical sampling honours (the power check sets 0).
fn reference(x: &[f32], inv_t: f64, f: LlamaFilters, typical_min_keep: usize, xtc: Xtc) -> Vec<bool> {
    let n = x.len();
    let m = x.iter().filter(|v| v.is_finite()).fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
    let w: Vec<f64> = x.iter().map(|&v| if v.is_finite() { ((v as f64 - m) * inv_t).exp() } else { 0.0 }).collect();
    let min_keep = f.min_keep.max(0) as usize;
    // The kept tokens, most probable first.
    let mut kept: Vec<usize> = (0..n).filter(|&i| x[i].is_finite()).collect();
    kept.sort_by(|&a, &b| x[b].total_cmp(&x[a]));
    let probs = |kept: &[usize]| -> Vec<f64> {
        let z: f64 = kept.iter().map(|&i| w[i]).sum();
        kept.iter().map(|&i| w[i] / z).collect()
    };
    if f.min_p > 0.0 {
        let p = probs(&kept);
        let len = (0..kept.len()).take_while(|&j| p[j] >= f.min_p as f64 * p[0] || j < min_keep).count();
        kept.truncate(len);
    }
    if f.top_k > 0 && (f.top_k as usize) < kept.len() {
        kept.truncate(f.top_k as usize);
    }
    if f.typical_p < 1.0 {
        let p = probs(&kept);
        let entropy: f64 = -p.iter().filter(|&&p| p > 0.0).map(|&p| p * p.ln()).sum::<f64>();
        let mut order: Vec<usize> = (0..kept.len()).collect();
        order.sort_by(|&a, &b| ((-p[a].ln() - entropy).abs()).total_cmp(&(-p[b].ln() - entropy).abs()));
        let mut cum = 0.0;
        let mut take = order.len();
        for (j, &o) in order.iter().enumerate() {
            cum += p[o];
            if cum > f.typical_p as f64 && j + 1 >= typical_min_keep {
                take = j + 1;
                break;
            }
        }
        let mut chosen: Vec<usize> = order[..take].iter().map(|&o| kept[o]).collect();
        chosen.sort_by(|&a, &b| x[b].total_cmp(&x[a]));
        kept = chosen;
    }
    if f.top_p < 1.0 {
        let p = probs(&kept);
        let mut cum = 0.0;
        let mut take = kept.len();
        for (j, &q) in p.iter().enumerate() {
            cum += q;
            if cum >= f.top_p as f64 && j + 1 >= min_keep {
                take = j + 1;
                break;
            }
        }
        kept.truncate(take);
    }
    if f.xtc_probability > 0.0 && f.xtc_threshold <= 0.5 {
        let p = probs(&kept);
        let above = p.iter().take_while(|&&q| q >= f.xtc_threshold as f64).count();
        if above >= 2 && kept.len() - (above - 1) >= min_keep {
            match xtc {
                Xtc::KeepLeast => drop(kept.drain(..above - 1)),
                Xtc::KeepMost => drop(kept.drain(1..above)),
            }
        }
    }
    let mut set = vec![false; n];
    for i in kept {
        set[i] = true;
    }
    set
}

fn inv_t(t: f32) -> f64 {
    (1.0f32 / t) as f64
}

/// The library's kept set at `level`.
fn kept_at(level: SimdLevel, x: &[f32], t: f32, f: LlamaFilters) -> Vec<bool> {
    let (lo, hi) = kept_range_at(level, x, t, f).unwrap();
    x.iter().map(|&v| v.is_finite() && v >= lo && v <= hi).collect()
}

/// Probabilities proportional to exp(x / T) over a kept set.
fn probs_over(x: &[f32], t: f32, kept: &[bool]) -> Vec<f64> {
    let m = x.iter().filter(|v| v.is_finite()).fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
    let w: Vec<f64> =
        x.iter().zip(kept).map(|(&v, &k)| if k { ((v as f64 - m) * inv_t(t)).exp() } else { 0.0 }).collect();
    let z: f64 = w.iter().sum();
    w.iter().map(|w| w / z).collect()
}

/// Distinct random rows (no ties), some with masked tokens.
fn rows() -> Vec<Vec<f32>> {
    let mut rng = TestRng::new(101);
    let mut out = Vec::new();
    for &n in &[5usize, 12, 40, 255, 257, 1000, 4000] {
        for sd in [0.5, 2.0, 5.0] {
            let mut x: Vec<f32> = (0..n).map(|_| (rng.normal() * sd) as f32).collect();
            if n > 12 {
                for i in (0..n).step_by(7) {
                    x[i] = if i % 2 == 0 { NINF } else { f32::NAN };
                }
            }
            out.push(x);
        }
    }
    out
}

fn settings() -> Vec<LlamaFilters> {
    let mut v = Vec::new();
    for min_keep in [0, 1, 3, 50] {
        for typical_p in [1.0f32, 0.9, 0.5, 0.2] {
            for (xp, xt) in [(0.0f32, 1.0f32), (1.0, 0.1), (1.0, 0.02), (0.5, 0.5)] {
                for (top_k, top_p, min_p) in [(0, 1.0f32, 0.0f32), (20, 0.9, 0.0), (0, 0.8, 0.05)] {
                    let f = LlamaFilters {
                        top_k,
                        top_p,
                        min_p,
                        min_keep,
                        typical_p,
                        xtc_probability: xp,
                        xtc_threshold: xt,
                    };
                    v.push(f);
                }
            }
        }
    }
    v
}

/// The kept set equals the float64 reference's for every setting, at every level, alone and in
/// the chain with top-k, top-p and min-p, at temperatures below, at and above 1.
#[test]
fn kept_sets_match_the_float64_reference_at_every_level() {
    let levels = supported_levels();
    let mut checked = 0;
    for x in &rows() {
        for f in settings() {
            for t in [1.0f32, 0.7, 1.6] {
                let want = reference(x, inv_t(t), f, f.min_keep.max(0) as usize, Xtc::KeepLeast);
                for &level in &levels {
                    assert_eq!(kept_at(level, x, t, f), want, "{level:?} t {t} {f:?} n {}", x.len());
                }
                checked += 1;
            }
        }
    }
    assert!(checked > 3000, "{checked}");
}

/// llama.cpp's own tables (tests/test-sampling.cpp): logits ln p, the probabilities left.
#[test]
fn llama_cpp_expected_tables() {
    let check = |probs: &[f32], f: LlamaFilters, expected: &[f32]| {
        let x: Vec<f32> = probs.iter().map(|p| p.ln()).collect();
        let kept = kept_at(best_level(), &x, 1.0, f);
        let got: Vec<f64> = probs_over(&x, 1.0, &kept).into_iter().filter(|&p| p > 0.0).collect();
        let total: f32 = expected.iter().sum();
        let mut want: Vec<f64> = expected.iter().map(|&e| (e / total) as f64).collect();
        let mut got_sorted = got.clone();
        got_sorted.sort_by(|a, b| b.total_cmp(a));
        want.sort_by(|a, b| b.total_cmp(a));
        assert_eq!(got_sorted.len(), want.len(), "{probs:?} {f:?}: kept {got:?}");
        for (g, w) in got_sorted.iter().zip(&want) {
            assert!((g - w).abs() < 1e-5, "{probs:?} {f:?}: {got:?} != {want:?}");
        }
    };
    let typical = |p| LlamaFilters { typical_p: p, ..OFF };
    check(&[0.97, 0.01, 0.01, 0.01], typical(0.5), &[0.97]);
    check(&[0.4, 0.2, 0.2, 0.2], typical(0.5), &[0.2, 0.2, 0.2]);
    let xtc = |p, t| LlamaFilters { xtc_probability: p, xtc_threshold: t, ..OFF };
    let p = [0.4, 0.3, 0.2, 0.1];
    check(&p, xtc(0.99, 0.09), &[0.1]);
    check(&p, xtc(0.99, 0.19), &[0.2, 0.1]);
    check(&p, xtc(0.99, 0.29), &[0.3, 0.2, 0.1]);
    check(&p, xtc(0.99, 0.39), &[0.4, 0.3, 0.2, 0.1]);
    // top-p and min-p with min_keep (llama.cpp's sampler queue runs them with min_keep 1).
    let q = [0.1, 0.2, 0.3, 0.4];
    check(&q, LlamaFilters { top_p: 0.7, min_keep: 1, ..OFF }, &[0.4, 0.3]);
    check(&q, LlamaFilters { top_p: 0.7, min_keep: 3, ..OFF }, &[0.4, 0.3, 0.2]);
    check(&q, LlamaFilters { min_p: 0.76, min_keep: 1, ..OFF }, &[0.4]);
    check(&q, LlamaFilters { min_p: 0.76, min_keep: 2, ..OFF }, &[0.4, 0.3]);
    check(&q, LlamaFilters { min_p: 0.26, min_keep: 4, ..OFF }, &[0.4, 0.3, 0.2, 0.1]);
    // min_keep does not hold top-k back (llama.cpp's top-k has none).
    check(&q, LlamaFilters { top_k: 1, min_keep: 3, ..OFF }, &[0.4]);
}

fn llama_batch<'a>(x: &'a [f32], rows: usize, vocab: usize, v: &'a LlamaRows) -> Batch<'a> {
    Batch {
        temperature: Some(&v.t),
        min_keep: Some(&v.min_keep),
        typical_p: Some(&v.typical_p),
        xtc_probability: Some(&v.xtc_probability),
        xtc_threshold: Some(&v.xtc_threshold),
        ..Batch::new(Logits::F32(x), rows, vocab)
    }
}

struct LlamaRows {
    t: Vec<f32>,
    min_keep: Vec<i32>,
    typical_p: Vec<f32>,
    xtc_probability: Vec<f32>,
    xtc_threshold: Vec<f32>,
}

impl LlamaRows {
    fn same(rows: usize, t: f32, f: LlamaFilters) -> LlamaRows {
        LlamaRows {
            t: vec![t; rows],
            min_keep: vec![f.min_keep; rows],
            typical_p: vec![f.typical_p; rows],
            xtc_probability: vec![f.xtc_probability; rows],
            xtc_threshold: vec![f.xtc_threshold; rows],
        }
    }
}

fn counts_of(s: &Sampler, b: &Batch, vocab: usize, calls: usize) -> Vec<u64> {
    let mut counts = vec![0u64; vocab];
    for _ in 0..calls {
        for tok in draw(s, b).0 {
            counts[tok as usize] += 1;
        }
    }
    counts
}

fn sampler_with(level: SimdLevel, seed: u64, threads: usize, order: FilterOrder) -> Sampler {
    Sampler::new(Config { threads, filter_order: order, ..sampler(level, seed).config().clone() }).unwrap()
}

/// Typical sampling's frequencies match softmax(x / T) over the reference's set in both orders
/// (`filters_first` judges at T = 1, llama.cpp's chain `typical -> temp -> dist`); the set that
/// ignores min_keep is rejected.
#[test]
fn typical_frequencies_match_and_a_typical_without_min_keep_is_rejected() {
    let mut rng = TestRng::new(103);
    let vocab = 40;
    let x: Vec<f32> = (0..vocab).map(|_| (rng.normal() * 2.0) as f32).collect();
    let per_call = 4000;
    let all: Vec<f32> = (0..per_call).flat_map(|_| x.iter().copied()).collect();
    let f = LlamaFilters { typical_p: 0.3, min_keep: 9, ..OFF };
    let t = 0.9f32;
    for order in [FilterOrder::TemperatureFirst, FilterOrder::FiltersFirst] {
        let judge = if order == FilterOrder::FiltersFirst { 1.0 } else { inv_t(t) };
        let right = reference(&x, judge, f, 9, Xtc::KeepLeast);
        let wrong = reference(&x, judge, f, 0, Xtc::KeepLeast);
        assert_ne!(right, wrong, "min_keep must matter for the power check");
        let (want, unwanted) = (probs_over(&x, t, &right), probs_over(&x, t, &wrong));
        let v = LlamaRows::same(per_call, t, f);
        let b = llama_batch(&all, per_call, vocab, &v);
        let counts = counts_of(&sampler_with(best_level(), 7, 1, order), &b, vocab, 20);
        let (stat, dof) = chi2(&counts, &want);
        assert!(stat < chi2_critical(dof, 5.0), "{order:?}: chi2 {stat} dof {dof}");
        // The wrong rule is rejected: it gives a drawn token probability 0, or fails chi-square.
        let unwanted_drawn = counts.iter().zip(&unwanted).any(|(&c, &p)| c > 0 && p == 0.0);
        assert!(
            unwanted_drawn || chi2(&counts, &unwanted).0 > chi2_critical(chi2(&counts, &unwanted).1, 5.0),
            "{order:?}: typical without min_keep not rejected"
        );
    }
}

/// XTC's frequencies match the mixture (probability q: the reference's set, else the set
/// before XTC), and neither XTC keeping the most probable token nor a coin of the wrong
/// probability passes.
#[test]
fn xtc_frequencies_match_the_mixture_and_wrong_rules_are_rejected() {
    let mut rng = TestRng::new(107);
    let vocab = 30;
    let x: Vec<f32> = (0..vocab).map(|_| (rng.normal() * 1.5) as f32).collect();
    let per_call = 4000;
    let all: Vec<f32> = (0..per_call).flat_map(|_| x.iter().copied()).collect();
    let (q, t) = (0.3f32, 1.0f32);
    let f = LlamaFilters { xtc_probability: q, xtc_threshold: 0.08, ..OFF };
    let plain = probs_over(&x, t, &reference(&x, 1.0, OFF, 0, Xtc::KeepLeast));
    let mixture = |xtc: Xtc, q: f64| -> Vec<f64> {
        let cut = probs_over(&x, t, &reference(&x, 1.0, f, 0, xtc));
        cut.iter().zip(&plain).map(|(c, p)| q * c + (1.0 - q) * p).collect()
    };
    assert_ne!(mixture(Xtc::KeepLeast, 1.0), plain, "XTC must cut this row");
    let v = LlamaRows::same(per_call, t, f);
    let b = llama_batch(&all, per_call, vocab, &v);
    each_level(|level| {
        let counts = counts_of(&sampler(level, 11), &b, vocab, 20);
        let (stat, dof) = chi2(&counts, &mixture(Xtc::KeepLeast, q as f64));
        assert!(stat < chi2_critical(dof, 5.0), "{level:?}: chi2 {stat} dof {dof}");
        for (wrong, what) in [
            (mixture(Xtc::KeepMost, q as f64), "keeping the most probable"),
            (mixture(Xtc::KeepLeast, 0.7), "a coin of 1 - q"),
        ] {
            let (stat, dof) = chi2(&counts, &wrong);
            assert!(stat > chi2_critical(dof, 5.0), "{level:?}: XTC {what} not rejected");
        }
    });
}

/// Seeded rows: the same tokens at every SIMD level, on 1 and 4 threads, in rows of a step
/// (banned tokens) or without; each token in its reference set; a seeded row's token does not
/// depend on the other rows of its call.
#[test]
fn seeded_tokens_do_not_depend_on_level_threads_or_batch() {
    let mut rng = TestRng::new(109);
    let (rows, vocab) = (6usize, 20_000usize);
    let x: Vec<f32> = (0..rows * vocab).map(|_| (rng.normal() * 2.0) as f32).collect();
    let v = LlamaRows {
        t: vec![1.0, 0.8, 1.3, 1.0, 0.6, 1.0],
        min_keep: vec![0, 5, 1, 40, 0, 2],
        typical_p: vec![0.9, 1.0, 0.5, 0.95, 1.0, 0.7],
        xtc_probability: vec![0.0, 1.0, 0.5, 0.0, 0.5, 1.0],
        xtc_threshold: vec![1.0, 0.001, 0.002, 0.1, 0.001, 0.0005],
    };
    let seeds: Vec<u64> = (0..rows as u64).map(|r| 1000 + r).collect();
    let offsets: Vec<u64> = (0..rows as u64).map(|r| r * 3).collect();
    let banned: Vec<i32> = (0..rows).flat_map(|_| (0..vocab as i32).step_by(3)).collect();
    let per = (vocab as u64).div_ceil(3);
    let ban_offsets: Vec<u64> = (0..=rows as u64).map(|r| r * per).collect();
    let plain = Batch { seeds: Some(&seeds), offsets: Some(&offsets), ..llama_batch(&x, rows, vocab, &v) };
    let stepped = Batch { banned_tokens: Some(TokenLists { ids: &banned, offsets: &ban_offsets }), ..plain };
    for (name, b) in [("plain", plain), ("banned", stepped)] {
        let mut first: Option<Vec<i32>> = None;
        each_level(|level| {
            for threads in [1usize, 4] {
                let got = draw(&sampler_with(level, 3, threads, FilterOrder::TemperatureFirst), &b).0;
                match &first {
                    None => first = Some(got),
                    Some(f) => assert_eq!(&got, f, "{name}: {level:?} threads {threads}"),
                }
            }
        });
        let tokens = first.unwrap();
        for (r, &tok) in tokens.iter().enumerate() {
            let mut row = x[r * vocab..(r + 1) * vocab].to_vec();
            if name == "banned" {
                for i in (0..vocab).step_by(3) {
                    row[i] = NINF;
                }
            }
            // XTC's coin may or may not apply: the token lies in one of the two sets.
            let f = LlamaFilters { min_keep: v.min_keep[r], typical_p: v.typical_p[r], ..OFF };
            let with_xtc =
                LlamaFilters { xtc_probability: v.xtc_probability[r], xtc_threshold: v.xtc_threshold[r], ..f };
            let a = reference(&row, inv_t(v.t[r]), f, f.min_keep as usize, Xtc::KeepLeast);
            let c = reference(&row, inv_t(v.t[r]), with_xtc, f.min_keep as usize, Xtc::KeepLeast);
            assert!(a[tok as usize] || c[tok as usize], "{name}: row {r} token {tok} outside its sets");
        }
        // Each row alone draws its token of the whole batch.
        for r in 0..rows {
            let v1 = LlamaRows {
                t: vec![v.t[r]],
                min_keep: vec![v.min_keep[r]],
                typical_p: vec![v.typical_p[r]],
                xtc_probability: vec![v.xtc_probability[r]],
                xtc_threshold: vec![v.xtc_threshold[r]],
            };
            let row = &x[r * vocab..(r + 1) * vocab];
            let (s1, o1) = ([seeds[r]], [offsets[r]]);
            let single_ban_offsets = [0u64, per];
            let mut b1 = Batch { seeds: Some(&s1), offsets: Some(&o1), ..llama_batch(row, 1, vocab, &v1) };
            if name == "banned" {
                b1.banned_tokens = Some(TokenLists { ids: &banned[..per as usize], offsets: &single_ban_offsets });
            }
            assert_eq!(draw(&sampler(best_level(), 99), &b1).0[0], tokens[r], "{name}: row {r} alone");
        }
    }
}

/// Unseeded XTC rows: their coin comes from the sampler's stream (the row's key), on a sampler
/// with a noise pool too; a refused call leaves the stream as it was.
#[test]
fn unseeded_xtc_rows_take_the_stream_and_a_refused_call_changes_nothing() {
    let mut rng = TestRng::new(113);
    let (rows, vocab) = (4usize, 3000usize);
    let x: Vec<f32> = (0..rows * vocab).map(|_| (rng.normal() * 2.0) as f32).collect();
    let f = LlamaFilters { xtc_probability: 0.5, xtc_threshold: 0.002, typical_p: 0.9, ..OFF };
    let v = LlamaRows::same(rows, 1.0, f);
    let b = llama_batch(&x, rows, vocab, &v);
    let bad_p = [0.5f32, 0.5, f32::NAN, 0.5];
    let bad = Batch { xtc_probability: Some(&bad_p), ..b };
    let (a, c) = (sampler(best_level(), 21), sampler(best_level(), 21));
    let mut tokens = vec![-1; rows];
    assert!(c.draw(&bad, &mut Output::new(&mut tokens)).is_err());
    assert_eq!(tokens, vec![-1; rows], "a refused call wrote");
    for _ in 0..3 {
        assert_eq!(draw(&a, &b).0, draw(&c, &b).0);
    }
    let pooled = Sampler::new(Config { pool_rows: 64, ..sampler(best_level(), 21).config().clone() }).unwrap();
    for _ in 0..3 {
        for (r, tok) in draw(&pooled, &b).0.into_iter().enumerate() {
            let row = &x[r * vocab..(r + 1) * vocab];
            let a = reference(row, 1.0, LlamaFilters { xtc_probability: 0.0, ..f }, 0, Xtc::KeepLeast);
            let c = reference(row, 1.0, f, 0, Xtc::KeepLeast);
            assert!(a[tok as usize] || c[tok as usize], "pooled row {r} token {tok}");
        }
    }
}

/// Bad values name the field and row; nothing is written. Caller noise on an unseeded XTC row
/// and processed logprobs of a row with typical sampling are refused as well.
#[test]
fn bad_values_name_the_field_and_row_and_write_nothing() {
    let s = sampler(best_level(), 0);
    let x: Vec<f32> = (0..40).map(|i| (i % 7) as f32 + i as f32 * 0.01).collect();
    let v = LlamaRows::same(4, 1.0, OFF);
    let base = llama_batch(&x, 4, 10, &v);
    let (nk, tp, xp, xt) =
        ([0i32, 0, -1, 0], [1.0f32, f32::NAN, 1.0, 1.0], [0.0f32, 0.0, 0.0, 1.5], [1.0f32, -0.5, 1.0, 1.0]);
    let (tp0, xpn) = ([0.0f32, 1.0, 1.0, 1.0], [0.0f32, f32::NAN, 0.0, 0.0]);
    for (b, needle) in [
        (Batch { min_keep: Some(&nk), ..base }, "min_keep[2]: -1 is negative"),
        (Batch { typical_p: Some(&tp), ..base }, "typical_p[1]: NaN is not in (0, 1]"),
        (Batch { typical_p: Some(&tp0), ..base }, "typical_p[0]"),
        (Batch { xtc_probability: Some(&xp), ..base }, "xtc_probability[3]"),
        (Batch { xtc_probability: Some(&xpn), ..base }, "xtc_probability[1]"),
        (Batch { xtc_threshold: Some(&xt), ..base }, "xtc_threshold[1]"),
    ] {
        let (mut tokens, mut lps) = (vec![-7; 4], vec![5f32; 4]);
        let mut out = Output { logprobs: Some(&mut lps), ..Output::new(&mut tokens) };
        let err = s.draw(&b, &mut out).unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidArgument);
        assert!(err.message.contains(needle), "{:?} does not name {needle}", err.message);
        assert!(tokens.iter().all(|&v| v == -7) && lps.iter().all(|&v| v == 5.0), "a failed call wrote");
    }
    let on = LlamaRows::same(4, 1.0, LlamaFilters { xtc_probability: 1.0, xtc_threshold: 0.1, ..OFF });
    let noise = vec![1.0f32; 40];
    let noisy = Batch {
        noise: Some(ExternalNoise { values: &noise, kind: NoiseKind::Exp, row_stride: 10 }),
        ..llama_batch(&x, 4, 10, &on)
    };
    let mut tokens = vec![-7; 4];
    let err = s.draw(&noisy, &mut Output::new(&mut tokens)).unwrap_err();
    assert!(err.message.contains("xtc_probability[0]") && err.message.contains("noise"), "{}", err.message);
    let typical = LlamaRows::same(4, 1.0, LlamaFilters { typical_p: 0.5, ..OFF });
    let b = llama_batch(&x, 4, 10, &typical);
    let mut lps = vec![5f32; 4];
    let mut out = Output { logprobs: Some(&mut lps), logprob_mode: LogprobMode::Processed, ..Output::new(&mut tokens) };
    let err = s.draw(&b, &mut out).unwrap_err();
    assert!(err.message.contains("logprob_mode[0]"), "{}", err.message);
    // Raw logprobs are given: log_softmax of the row as given.
    let mut out = Output { logprobs: Some(&mut lps), ..Output::new(&mut tokens) };
    s.draw(&b, &mut out).unwrap();
    for r in 0..4 {
        let row = &x[r * 10..(r + 1) * 10];
        let want = softmax64(row, 1.0)[tokens[r] as usize].ln();
        assert!((lps[r] as f64 - want).abs() < 1e-5, "row {r}: {} vs {want}", lps[r]);
    }
}

/// Off values change nothing: typical_p 1, XTC probability 0 or threshold > 0.5, min_keep
/// alone: the tokens of the same call without the fields.
#[test]
fn off_values_draw_what_the_plain_call_draws() {
    let mut rng = TestRng::new(127);
    let (rows, vocab) = (8usize, 5000usize);
    let x: Vec<f32> = (0..rows * vocab).map(|_| (rng.normal() * 2.0) as f32).collect();
    let seeds: Vec<u64> = (0..rows as u64).collect();
    let t = vec![0.9f32; rows];
    let plain = Batch { seeds: Some(&seeds), temperature: Some(&t), ..Batch::new(Logits::F32(&x), rows, vocab) };
    let want = draw(&sampler(best_level(), 1), &plain).0;
    for f in [
        OFF,
        LlamaFilters { min_keep: 30, ..OFF },
        LlamaFilters { xtc_probability: 1.0, xtc_threshold: 0.51, ..OFF },
        LlamaFilters { xtc_probability: 0.0, xtc_threshold: 0.1, ..OFF },
    ] {
        let v = LlamaRows::same(rows, 0.9, f);
        let b = Batch { seeds: Some(&seeds), ..llama_batch(&x, rows, vocab, &v) };
        assert_eq!(draw(&sampler(best_level(), 1), &b).0, want, "{f:?}");
    }
}

/// The C fields: one block at the end, after the request state's, read only by callers whose
/// struct_size reaches them.
#[test]
fn c_fields_follow_the_request_state_and_older_callers_do_not_read_them() {
    use std::mem::{offset_of, size_of};
    use tokenrace::internals::api::*;
    use tokenrace::internals::types::*;
    let at = offset_of!(tokenrace_batch, request_ids);
    assert_eq!(offset_of!(tokenrace_batch, min_keep), at + 8);
    assert_eq!(offset_of!(tokenrace_batch, typical_p), at + 16);
    assert_eq!(offset_of!(tokenrace_batch, xtc_probability), at + 24);
    assert_eq!(offset_of!(tokenrace_batch, xtc_threshold), at + 32);
    assert_eq!(offset_of!(tokenrace_batch, dynatemp_range), at + 40);
    assert_eq!(offset_of!(tokenrace_batch, dynatemp_exponent), at + 48);
    assert_eq!(offset_of!(tokenrace_batch, bad_words_ids), at + 56);
    let x = [0.0f32, 0.5, 1.0, 3.0];
    let (xp, xt) = ([1.0f32], [0.03f32]); // every p >= 0.03: XTC keeps the least probable alone
    unsafe {
        let mut cfg = tokenrace_config_default();
        cfg.has_seed = 1;
        cfg.seed = 5;
        let mut s = std::ptr::null_mut();
        assert_eq!(tokenrace_sampler_new(&cfg, &mut s), tokenrace_status::Ok);
        let mut b: tokenrace_batch = std::mem::zeroed();
        b.struct_size = size_of::<tokenrace_batch>() as u32;
        b.logits = x.as_ptr() as *const _;
        b.rows = 1;
        b.vocab = 4;
        b.xtc_probability = xp.as_ptr();
        b.xtc_threshold = xt.as_ptr();
        let mut tokens = [0i32; 1];
        let mut o: tokenrace_output = std::mem::zeroed();
        o.struct_size = size_of::<tokenrace_output>() as u32;
        o.tokens = tokens.as_mut_ptr();
        for _ in 0..50 {
            assert_eq!(tokenrace_draw(s, &b, &mut o), tokenrace_status::Ok, "{}", last_error());
            assert_eq!(tokens, [0]);
        }
        b.struct_size = offset_of!(tokenrace_batch, min_keep) as u32;
        let mut seen_other = false;
        for _ in 0..50 {
            assert_eq!(tokenrace_draw(s, &b, &mut o), tokenrace_status::Ok);
            seen_other |= tokens[0] != 0;
        }
        assert!(seen_other, "the fields were read past struct_size");
        tokenrace_sampler_free(s);
    }
}

/// llama.cpp's dynamic temperature in float64: the kept set's entropy at T = 1, normalised by
/// ln N; `normalise`: false for the wrong rule of the power check (H not divided by ln N).
fn dynamic_temperature(x: &[f32], kept: &[bool], t: f64, range: f64, exponent: f64, normalise: bool) -> f64 {
    let m = x.iter().zip(kept).filter(|(_, &k)| k).fold(f64::NEG_INFINITY, |a, (&v, _)| a.max(v as f64));
    let w: Vec<f64> = x.iter().zip(kept).filter(|(_, &k)| k).map(|(&v, _)| (v as f64 - m).exp()).collect();
    let z: f64 = w.iter().sum();
    let h: f64 = -w.iter().map(|w| w / z).filter(|&p| p > 0.0).map(|p| p * p.ln()).sum::<f64>();
    let n = w.len() as f64;
    let normalised = if normalise { h / n.ln() } else { h };
    let low = (t - range).max(0.0);
    low + (t + range - low) * normalised.powf(exponent)
}

/// The dynamic temperature's frequencies match softmax(x / T') over the kept set (`filters_first`:
/// llama.cpp's chain `top_k -> temp_ext -> dist`), and reject the base temperature and an
/// entropy not normalised by ln N.
#[test]
fn dynamic_temperature_frequencies_match_and_wrong_rules_are_rejected() {
    let mut rng = TestRng::new(131);
    let vocab = 30;
    let x: Vec<f32> = (0..vocab).map(|_| (rng.normal() * 1.5) as f32).collect();
    let per_call = 4000;
    let all: Vec<f32> = (0..per_call).flat_map(|_| x.iter().copied()).collect();
    let (t, range, exponent) = (0.8f32, 0.6f32, 1.3f32);
    let kept = reference(&x, 1.0, LlamaFilters { top_k: 10, ..OFF }, 0, Xtc::KeepLeast);
    let at = |t: f64| probs_over(&x, t as f32, &kept);
    let right = dynamic_temperature(&x, &kept, t as f64, range as f64, exponent as f64, true);
    let unnormalised = dynamic_temperature(&x, &kept, t as f64, range as f64, exponent as f64, false);
    let v = LlamaRows::same(per_call, t, OFF);
    let (k, r, e) = (vec![10i32; per_call], vec![range; per_call], vec![exponent; per_call]);
    let b = Batch {
        top_k: Some(&k),
        dynatemp_range: Some(&r),
        dynatemp_exponent: Some(&e),
        ..llama_batch(&all, per_call, vocab, &v)
    };
    each_level(|level| {
        let counts = counts_of(&sampler_with(level, 13, 1, FilterOrder::FiltersFirst), &b, vocab, 20);
        let (stat, dof) = chi2(&counts, &at(right));
        assert!(stat < chi2_critical(dof, 5.0), "{level:?}: T' {right}: chi2 {stat} dof {dof}");
        for (wrong, what) in [(t as f64, "the base temperature"), (unnormalised, "an unnormalised entropy")] {
            let (stat, dof) = chi2(&counts, &at(wrong));
            assert!(stat > chi2_critical(dof, 5.0), "{level:?}: {what} ({wrong} vs {right}) not rejected");
        }
    });
}

/// Dynamic temperature rows: the same seeded tokens at every level and thread count, range 0 is
/// off, and bad values are refused naming the row.
#[test]
fn dynamic_temperature_rows_are_seeded_and_checked() {
    let mut rng = TestRng::new(137);
    let (rows, vocab) = (4usize, 20_000usize);
    let x: Vec<f32> = (0..rows * vocab).map(|_| (rng.normal() * 2.0) as f32).collect();
    let seeds: Vec<u64> = (0..rows as u64).collect();
    let v = LlamaRows::same(rows, 0.9, LlamaFilters { typical_p: 0.95, ..OFF });
    let (range, exponent) = ([0.5f32, 1.0, 0.0, 2.0], [1.0f32, 0.5, 1.0, 2.0]);
    let b = Batch {
        seeds: Some(&seeds),
        dynatemp_range: Some(&range),
        dynatemp_exponent: Some(&exponent),
        ..llama_batch(&x, rows, vocab, &v)
    };
    let mut first: Option<Vec<i32>> = None;
    each_level(|level| {
        for threads in [1usize, 4] {
            let got = draw(&sampler_with(level, 3, threads, FilterOrder::TemperatureFirst), &b).0;
            match &first {
                None => first = Some(got),
                Some(f) => assert_eq!(&got, f, "{level:?} threads {threads}"),
            }
        }
    });
    let without = Batch { dynatemp_range: None, dynatemp_exponent: None, ..b };
    assert_eq!(draw(&sampler(best_level(), 3), &without).0[2], first.unwrap()[2], "range 0 is off");
    let s = sampler(best_level(), 0);
    for (field, values, row) in [
        ("dynatemp_range", [0.5f32, f32::NAN, 0.5, 0.5], 1),
        ("dynatemp_range", [0.5, 0.5, -0.1, 0.5], 2),
        ("dynatemp_exponent", [1.0, 1.0, 1.0, f32::INFINITY], 3),
        ("dynatemp_exponent", [-1.0, 1.0, 1.0, 1.0], 0),
    ] {
        let bad = if field == "dynatemp_range" {
            Batch { dynatemp_range: Some(&values), ..b }
        } else {
            Batch { dynatemp_exponent: Some(&values), ..b }
        };
        let mut tokens = vec![-7; rows];
        let err = s.draw(&bad, &mut Output::new(&mut tokens)).unwrap_err();
        assert!(err.message.contains(&format!("{field}[{row}]")), "{}", err.message);
        assert_eq!(tokens, vec![-7; rows], "a failed call wrote");
    }
}
