//! The probability-mass kernels (SIMD exp2, block sums, bounds) and what is built on them (top-p
//! thresholds, logprobs): accuracy against float64, and bit-identity across SIMD levels and
//! thread counts, including rows whose cumulative mass sits on the top-p boundary.
mod common;

use common::*;
use tokenrace::internals::hooks;
use tokenrace::internals::{kept_floor, kept_floor_at};
use tokenrace::*;

const NINF: f32 = f32::NEG_INFINITY;
const EPS_EXP2: f64 = 2.384_185_791_015_625e-7; // 2^-22, the documented bound
const BETA: f64 = 3.000_001 * 5.960_464_477_539_063e-8; // per unit |a|

#[test]
fn exp2_is_within_its_bound_everywhere() {
    // Every fractional part occurs for some t in [-1, 0] (the scaling by 2^k is exact), so a
    // dense sweep there plus random t over the whole range [-125, 0] covers the kernel.
    let mut worst = 0f64;
    let mut bits = (-1.0f32).to_bits();
    while bits > 0x8000_0000 {
        let t = f32::from_bits(bits);
        let e = (hooks::exp2(t) as f64 / (t as f64).exp2() - 1.0).abs();
        worst = worst.max(e);
        bits -= 61;
    }
    let mut rng = TestRng::new(1);
    for _ in 0..2_000_000 {
        let t = -(rng.f64() * 125.0) as f32;
        let e = (hooks::exp2(t) as f64 / (t as f64).exp2() - 1.0).abs();
        worst = worst.max(e);
    }
    for t in [0.0f32, -0.0, -0.5, -1.0, -124.5, -125.0, -1e-30, -f32::MIN_POSITIVE] {
        let e = (hooks::exp2(t) as f64 / (t as f64).exp2() - 1.0).abs();
        worst = worst.max(e);
    }
    assert_eq!(hooks::exp2(0.0), 1.0);
    assert!(worst < EPS_EXP2, "exp2 relative error {worst:e}");
    println!("exp2: worst relative error {worst:.3e} ({:.2} x 2^-24)", worst / 5.960_464_477_539_063e-8);
}

#[test]
fn exp64_is_within_1e15() {
    let mut rng = TestRng::new(2);
    let mut worst = 0f64;
    for i in 0..2_000_000 {
        let a = if i % 2 == 0 { -rng.f64() * 700.0 } else { -rng.f64() * 2.0 };
        let e = (hooks::exp64(a) / a.exp() - 1.0).abs();
        worst = worst.max(e);
    }
    assert_eq!(hooks::exp64(0.0), 1.0);
    assert!(worst < 1e-15, "exp64 relative error {worst:e}");
}

/// N(0, 3) logits with `k` tokens around 14, spread over the row (one per block or so).
fn medium_logits(rng: &mut TestRng, n: usize, k: usize) -> Vec<f32> {
    let mut x: Vec<f32> = (0..n).map(|_| (rng.normal() * 3.0) as f32).collect();
    for _ in 0..k {
        let i = rng.below(n);
        x[i] = (14.0 + rng.normal() * 1.5) as f32;
    }
    x
}

/// Random rows of every shape the kernels must handle.
fn rows(rng: &mut TestRng) -> Vec<Vec<f32>> {
    let mut out = Vec::new();
    for &n in &[1usize, 7, 16, 255, 256, 257, 1000, 4096, 70_001] {
        let mut x: Vec<f32> = (0..n).map(|_| (rng.normal() * 3.0) as f32).collect();
        out.push(x.clone());
        for i in (0..n).step_by(13) {
            x[i] = NINF;
        }
        for i in (5..n).step_by(97) {
            x[i] = f32::NAN;
        }
        out.push(x);
        out.push(peaked_logits(rng, n, 2.0, 12.0));
        out.push((0..n).map(|_| rng.below(5) as f32 * 0.25).collect());
        out.push((0..n).map(|_| (rng.normal() * 300.0) as f32).collect());
    }
    out
}

fn max_finite(x: &[f32]) -> f32 {
    x.iter().copied().filter(|v| v.is_finite()).fold(NINF, f32::max)
}

#[test]
fn f32_weights_are_bit_identical_across_levels_and_within_their_bound() {
    let mut rng = TestRng::new(3);
    for x in rows(&mut rng) {
        let m = max_finite(&x);
        if !m.is_finite() {
            continue;
        }
        for &t in &[1.0f32, 0.3, 2.5, 1e-3, 80.0] {
            let inv_t = 1.0 / t;
            let (c, lo, _) = hooks::consts(m, inv_t, NINF).unwrap();
            let want = hooks::weights(SimdLevel::Scalar, &x, m, c, lo, f32::INFINITY);
            each_level(|level| {
                let got = hooks::weights(level, &x, m, c, lo, f32::INFINITY);
                assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{level:?}");
            });
            for (i, &v) in x.iter().enumerate() {
                let a = (v as f64 - m as f64) * inv_t as f64;
                if v >= lo && v.is_finite() {
                    let err = (want[i] as f64 / a.exp()).ln().abs();
                    assert!(err <= BETA * a.abs() + EPS_EXP2, "x {v} m {m} t {t}: {err:e}");
                } else {
                    assert_eq!(want[i], 0.0);
                    // Tokens below lo weigh less than 2^-125.
                    assert!(!(v.is_finite()) || a < -86.6, "x {v} dropped at a = {a}");
                }
            }
        }
    }
}

#[test]
fn block_masses_are_bit_identical_across_levels() {
    let mut rng = TestRng::new(4);
    for x in rows(&mut rng) {
        let m = max_finite(&x);
        if !m.is_finite() {
            continue;
        }
        let bf: Vec<Bf16> = x.iter().map(|&v| Bf16::from_f32(v)).collect();
        let hf: Vec<F16> = x.iter().map(|&v| F16::from_f32(v)).collect();
        for &t in &[1.0f32, 0.5, 3.0] {
            let inv_t = 1.0 / t;
            let cut = m - 1.5 * rng.f64() as f32 * t;
            for floor in [NINF, m - 4.0 * t] {
                let (c, lo, lo64) = hooks::consts(m, inv_t, floor).unwrap();
                for kind in 0..5u8 {
                    for logits in [Logits::F32(&x), Logits::Bf16(&bf), Logits::F16(&hf)] {
                        let want = hooks::blocks(SimdLevel::Scalar, logits, m, c, lo, cut, kind);
                        each_level(|level| {
                            let got = hooks::blocks(level, logits, m, c, lo, cut, kind);
                            assert!(
                                got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                                "{level:?} kind {kind}: {got:?} vs {want:?}"
                            );
                        });
                    }
                }
                let want = hooks::blocks64(SimdLevel::Scalar, &x, m, inv_t, lo64, cut);
                each_level(|level| {
                    let got = hooks::blocks64(level, &x, m, inv_t, lo64, cut);
                    assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{level:?} f64");
                });
            }
        }
    }
}

#[test]
fn mass_and_gather_in_one_pass_match_the_separate_kernels_on_every_level() {
    let mut rng = TestRng::new(12);
    for x in rows(&mut rng) {
        let m = max_finite(&x);
        if !m.is_finite() {
            continue;
        }
        let (c, lo, _) = hooks::consts(m, 1.0, NINF).unwrap();
        for cut in [m, m - 0.5, m - 4.0] {
            let (fused, separate) = hooks::mass_gather(SimdLevel::Scalar, &x, m, c, lo, cut);
            assert_eq!(fused, separate);
            each_level(|level| {
                let (f, s) = hooks::mass_gather(level, &x, m, c, lo, cut);
                assert_eq!(f, fused, "{level:?}");
                assert_eq!(s, separate, "{level:?}");
            });
        }
    }
}

/// The split kernel (the mass below a cut and at or above it, one pass) gives bit for bit the
/// block masses of the kernels of one mass, on every level, for the f32 exps and the cheap
/// weights, with cuts at the maximum, inside the row, below every value and in the tail.
#[test]
fn mass_split_in_one_pass_matches_the_separate_kernels_on_every_level() {
    let mut rng = TestRng::new(13);
    for x in rows(&mut rng) {
        let m = max_finite(&x);
        if !m.is_finite() {
            continue;
        }
        let (c, lo, _) = hooks::consts(m, 1.0, NINF).unwrap();
        for cut in [m, m - 0.5, m - 4.0, lo.next_up(), m.next_up()] {
            if cut <= lo {
                continue;
            }
            for cheap in [false, true] {
                let (split, separate) = hooks::mass_split(SimdLevel::Scalar, &x, (m, c, lo, cut), cheap);
                assert_eq!(split, separate, "cheap {cheap} cut {cut}");
                each_level(|level| {
                    let (s, _) = hooks::mass_split(level, &x, (m, c, lo, cut), cheap);
                    assert_eq!(s, split, "{level:?} cheap {cheap} cut {cut}");
                });
            }
        }
    }
}

#[test]
fn mass_bounds_hold_and_f64_mass_is_exact() {
    let mut rng = TestRng::new(5);
    let level = best_level();
    for x in rows(&mut rng) {
        let m = max_finite(&x);
        if !m.is_finite() {
            continue;
        }
        for &t in &[1.0f32, 0.25, 4.0, 0.01] {
            let inv_t = 1.0 / t;
            for floor in [NINF, m - 10.0 * t] {
                for cut in [f32::INFINITY, m, m - 0.5 * t, m - 3.0 * t] {
                    let (c, lo, lo64) = hooks::consts(m, inv_t, floor).unwrap();
                    let want = neumaier(
                        x.iter()
                            .filter(|&&v| v.is_finite() && v >= floor && v < cut)
                            .map(|&v| ((v as f64 - m as f64) * inv_t as f64).exp()),
                    );
                    let n = x.len();
                    let s: f64 = hooks::blocks(level, Logits::F32(&x), m, c, lo, cut, 1).iter().sum();
                    let (a, b) = hooks::exp_bounds(s, n);
                    assert!(a <= want && want <= b, "exp bounds {a} {b} miss {want} (t {t} cut {cut})");
                    let s: f64 = hooks::blocks(level, Logits::F32(&x), m, c, lo, cut, 2).iter().sum();
                    let (a, b) = hooks::cheap_bounds(s, n);
                    assert!(a <= want && want <= b, "cheap bounds {a} {b} miss {want}");
                    if floor == NINF && cut == f32::INFINITY {
                        // The kinds without a mask count every token read, padding included.
                        let s: f64 = hooks::blocks(level, Logits::F32(&x), m, c, lo, cut, 3).iter().sum();
                        let (a, b) = hooks::exp_bounds(s, n + 256);
                        assert!(a <= want && want <= b, "exp (all) bounds {a} {b} miss {want}");
                        let s: f64 = hooks::blocks(level, Logits::F32(&x), m, c, lo, cut, 4).iter().sum();
                        let (a, b) = hooks::cheap_bounds(s, n + 256);
                        assert!(a <= want && want <= b, "cheap (all) bounds {a} {b} miss {want}");
                    }
                    let e: f64 = hooks::blocks64(level, &x, m, inv_t, lo64, cut).iter().sum();
                    assert!((e - want).abs() <= 1e-14 * want + 1e-290, "f64 mass {e} vs {want}");
                    if cut > lo && cut < f32::INFINITY {
                        // The split pass: the f64 sum of its two masses bounds the mass of every
                        // token (top-p's Z), and its mass above the cut that of the tokens there.
                        let z = neumaier(
                            x.iter()
                                .filter(|&&v| v.is_finite() && v >= floor)
                                .map(|&v| ((v as f64 - m as f64) * inv_t as f64).exp()),
                        );
                        let above_want = z - want;
                        for (cheap, bounds) in
                            [(false, hooks::exp_bounds as fn(f64, usize) -> (f64, f64)), (true, hooks::cheap_bounds)]
                        {
                            let ((below, above), _) = hooks::mass_split(level, &x, (m, c, lo, cut), cheap);
                            let (below, above): (f64, f64) = (below.iter().sum(), above.iter().sum());
                            let (a, b) = bounds(below + above, n);
                            assert!(a <= z && z <= b, "split Z bounds {a} {b} miss {z} (cheap {cheap}, t {t})");
                            let (a, b) = bounds(above, n);
                            let tol = 1e-14 * z;
                            assert!(
                                a <= above_want + tol && above_want <= b + tol,
                                "split above {a} {b} miss {above_want}"
                            );
                        }
                    }
                }
            }
        }
    }
}

/// A compensated f64 sum.
fn neumaier(xs: impl Iterator<Item = f64>) -> f64 {
    let (mut s, mut c) = (0f64, 0f64);
    for x in xs {
        let t = s + x;
        c += if s.abs() >= x.abs() { (s - t) + x } else { (x - t) + s };
        s = t;
    }
    s + c
}

/// The float64 reference threshold: sort the kept tokens (x >= floor) by logit, accumulate in
/// f64 until `top_p * Z`. Also returns how far (relative to Z) the target is from the nearest
/// cumulative mass around the crossing.
fn reference_top_p(x: &[f32], t: f32, floor: f32, top_p: f32) -> (f32, f64) {
    let mut v: Vec<f32> = x.iter().copied().filter(|v| v.is_finite() && *v >= floor).collect();
    v.sort_by(|a, b| b.total_cmp(a));
    let m = v[0] as f64;
    let inv_t = (1.0f32 / t) as f64;
    let w: Vec<f64> = v.iter().map(|&y| ((y as f64 - m) * inv_t).exp()).collect();
    let z: f64 = w.iter().sum();
    let target = top_p as f64 * z;
    let mut cum = 0.0;
    for (j, &y) in v.iter().enumerate() {
        let before = cum;
        cum += w[j];
        if cum >= target {
            // Tokens tied with y: the margin is to the cumulative mass around the tie group.
            let first = v.iter().position(|&u| u == y).unwrap();
            let last = v.iter().rposition(|&u| u == y).unwrap();
            let lo: f64 = w[..first].iter().sum();
            let hi: f64 = w[..=last].iter().sum();
            let _ = before;
            return (y, ((target - lo).abs().min((hi - target).abs())) / z);
        }
    }
    (*v.last().unwrap(), 0.0)
}

fn check_top_p(x: &[f32], t: f32, p: f32, mp: f32) {
    let floors: Vec<f32> = supported_levels().iter().map(|&l| kept_floor_at(l, x, t, 0, p, mp)).collect();
    assert!(floors.iter().all(|f| f.to_bits() == floors[0].to_bits()), "levels disagree: {floors:?} (t {t} p {p})");
    let min_p_floor = if mp > 0.0 { kept_floor(x, t, 0, 1.0, mp) } else { NINF };
    let (want, margin) = reference_top_p(x, t, min_p_floor, p);
    if margin > 1e-12 {
        // The kept set, not the representation of the threshold, is what must match.
        let got_set: Vec<bool> = x.iter().map(|&v| v.is_finite() && v >= floors[0]).collect();
        let want_set: Vec<bool> = x.iter().map(|&v| v.is_finite() && v >= want && v >= min_p_floor).collect();
        assert!(
            got_set == want_set,
            "threshold {} vs reference {want} (t {t} p {p} min_p {mp}, margin {margin:e})",
            floors[0]
        );
    }
}

#[test]
fn top_p_matches_float64_and_is_identical_across_levels() {
    let mut rng = TestRng::new(6);
    for n in [3usize, 100, 257, 3000, 20_000, 163_840] {
        for shape in 0..6 {
            let x: Vec<f32> = match shape {
                0 => peaked_logits(&mut rng, n, 3.0, 20.0),
                5 => medium_logits(&mut rng, n, 64),
                1 => (0..n).map(|_| (rng.normal() * 3.0) as f32).collect(),
                2 => (0..n).map(|_| (rng.normal() * 1.0) as f32).collect(),
                3 => (0..n).map(|_| rng.below(40) as f32 * 0.125).collect(),
                _ => {
                    let mut x = peaked_logits(&mut rng, n, 2.0, 9.0);
                    for i in (0..n).step_by(3) {
                        x[i] = NINF;
                    }
                    x
                }
            };
            for &t in &[1.0f32, 0.7, 1.5, 0.05] {
                for &p in &[0.9f32, 0.5, 0.99, 0.999_9, 1e-6] {
                    check_top_p(&x, t, p, 0.0);
                }
                check_top_p(&x, t, 0.95, 0.001);
            }
        }
    }
}

#[test]
fn top_p_on_the_boundary_is_identical_across_levels() {
    // top_p set (as f32) to the cumulative mass of some token: the target lands within f32
    // rounding of the boundary, where bounds cannot decide and the f64 mass must.
    let mut rng = TestRng::new(7);
    let before = tokenrace::internals::tier_counts();
    for n in [500usize, 5000, 163_840] {
        for shape in 0..4 {
            let x: Vec<f32> = match shape {
                0 => peaked_logits(&mut rng, n, 3.0, 16.0),
                3 => medium_logits(&mut rng, n, 40),
                1 => (0..n).map(|_| (rng.normal() * 3.0) as f32).collect(),
                _ => (0..n).map(|_| (rng.normal() * 0.5) as f32).collect(),
            };
            for &t in &[1.0f32, 0.8] {
                let mut v: Vec<f32> = x.clone();
                v.sort_by(|a, b| b.total_cmp(a));
                let m = v[0] as f64;
                let w: Vec<f64> = v.iter().map(|&y| ((y as f64 - m) * (1.0f32 / t) as f64).exp()).collect();
                let z: f64 = w.iter().sum();
                for &j in &[0usize, 1, 3, 10, 100, 1000, 3000] {
                    if j >= v.len() - 1 {
                        continue;
                    }
                    let cum: f64 = w[..=j].iter().sum();
                    let p = (cum / z) as f32;
                    for q in [p, f32::from_bits(p.to_bits() - 1), f32::from_bits(p.to_bits() + 1)] {
                        if q > 0.0 && q < 1.0 {
                            check_top_p(&x, t, q, 0.0);
                        }
                    }
                }
            }
        }
    }
    let after = tokenrace::internals::tier_counts();
    assert!(after[2] > before[2], "no threshold needed the f64 mass: {before:?} -> {after:?}");
    assert!(after[0] > before[0] && after[1] > before[1], "{before:?} -> {after:?}");
}

#[test]
fn top_p_tokens_and_logprobs_are_identical_across_levels_and_threads() {
    let mut rng = TestRng::new(8);
    for &(rows, vocab) in &[(3usize, 163_840usize), (7, 30_000), (2, 70_000)] {
        let mut x = Vec::new();
        for r in 0..rows {
            if r % 2 == 0 {
                x.extend(peaked_logits(&mut rng, vocab, 3.0, 18.0));
            } else {
                x.extend((0..vocab).map(|_| (rng.normal() * 3.0) as f32));
            }
        }
        let temps: Vec<f32> = (0..rows).map(|r| [1.0, 0.7, 1.3][r % 3]).collect();
        let ps: Vec<f32> = (0..rows).map(|r| [0.9, 0.95, 0.5, 0.99][r % 4]).collect();
        let ks = vec![0i32; rows];
        let mps = vec![0f32; rows];
        for mode in [LogprobMode::Raw, LogprobMode::Processed] {
            let mut first: Option<(Vec<i32>, Vec<u32>)> = None;
            each_level(|level| {
                for threads in [1usize, 3] {
                    let cfg = Config { threads, ..sampler(level, 17).config().clone() };
                    let s = Sampler::new(cfg).unwrap();
                    let b = Batch {
                        temperature: Some(&temps),
                        top_k: Some(&ks),
                        top_p: Some(&ps),
                        min_p: Some(&mps),
                        ..Batch::new(Logits::F32(&x), rows, vocab)
                    };
                    let (mut tokens, mut lps) = (vec![0; rows], vec![0f32; rows]);
                    let mut out = Output { logprobs: Some(&mut lps), logprob_mode: mode, ..Output::new(&mut tokens) };
                    s.draw(&b, &mut out).unwrap();
                    let got = (tokens, lps.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
                    match &first {
                        None => first = Some(got),
                        Some(f) => assert_eq!(&got, f, "{level:?} threads {threads} {mode:?}"),
                    }
                }
            });
            // And against float64.
            let (tokens, bits) = first.unwrap();
            for r in 0..rows {
                let row = &x[r * vocab..(r + 1) * vocab];
                let m = max_finite(row) as f64;
                let (s, floor) = match mode {
                    LogprobMode::Raw => (1.0, NINF),
                    LogprobMode::Processed => ((1.0f32 / temps[r]) as f64, kept_floor(row, temps[r], 0, ps[r], 0.0)),
                };
                let z: f64 = row.iter().filter(|&&v| v >= floor).map(|&v| ((v as f64 - m) * s).exp()).sum();
                let want = (row[tokens[r] as usize] as f64 - m) * s - z.ln();
                let got = f32::from_bits(bits[r]) as f64;
                assert!((got - want).abs() < 1e-5, "row {r} {mode:?}: {got} vs {want}");
            }
        }
    }
}

#[test]
fn top_p_with_extreme_temperatures_nan_and_min_p() {
    let mut rng = TestRng::new(9);
    for n in [5000usize, 70_000] {
        let mut x: Vec<f32> = (0..n).map(|_| (rng.normal() * 3.0) as f32).collect();
        for i in (3..n).step_by(101) {
            x[i] = f32::NAN;
        }
        for i in (7..n).step_by(53) {
            x[i] = NINF;
        }
        let peaked = {
            let mut y = x.clone();
            y[n / 3] = 30.0;
            y[n / 2] = 29.5;
            y
        };
        for row in [&x, &peaked] {
            for &t in &[1e-30f32, 1e-6, 0.01, 1.0, 100.0, 1e6, 1e30] {
                for &p in &[0.9f32, 0.5, 0.999] {
                    check_top_p(row, t, p, 0.0);
                    check_top_p(row, t, p, 0.05);
                }
            }
        }
    }
}

/// A row whose mass sits in blocks full of one value, away from the blocks with the largest
/// maxima and from the evenly spaced samples of the first cut (16 blocks) or of both cuts (16
/// and 64): the guessed cuts are too high.
fn sample_missing_row(miss_both: bool) -> Vec<f32> {
    let n = 163_840;
    let nb = n / 256;
    let sampled = |b: usize, samples: usize| b % (nb / samples) == nb / samples / 2;
    let missed = |b: usize| !(sampled(b, 16) || (miss_both && sampled(b, 64)));
    let mut x = vec![-20f32; n];
    let mut heavy = 0;
    for b in 0..nb {
        if missed(b) && b % 3 == 1 && heavy < 200 {
            for v in &mut x[b * 256..(b + 1) * 256] {
                *v = 5.0;
            }
            heavy += 1;
        }
    }
    for b in (0..nb).filter(|&b| b % 3 == 0 && missed(b)).take(16) {
        x[b * 256 + 7] = 9.0;
    }
    x
}

/// The top-p tier counters before and after checking `x`'s thresholds at three top-p values.
fn tiers_checking(x: &[f32]) -> ([u64; 5], [u64; 5]) {
    let before = tokenrace::internals::tier_counts();
    for &p in &[0.9f32, 0.5, 0.99] {
        check_top_p(x, 1.0, p, 0.0);
    }
    (before, tokenrace::internals::tier_counts())
}

#[test]
fn top_p_when_the_sample_misses_the_mass() {
    // The first cut is too high: the second, from the mass below the first, decides (a gather
    // without exps, not a gather of every token).
    let (before, after) = tiers_checking(&sample_missing_row(false));
    assert!(after[4] > before[4], "the second cut never decided: {before:?} -> {after:?}");
    // A row that the 64 evenly spaced blocks miss too: the second cut comes from the mass below
    // the first, wherever it lies, and decides.
    let (before, after) = tiers_checking(&sample_missing_row(true));
    assert!(after[4] > before[4], "the second cut never decided: {before:?} -> {after:?}");
}

#[test]
fn top_p_on_flat_heavy_tailed_rows_gathers_few_tokens() {
    // N(0, 3) at T = 0.7 over a large vocabulary: the mass sits in the maxima of hundreds of
    // blocks, about one kept token each (some 850 kept), and for about one row in ten a sampled
    // block holds a token heavy enough that the sample cannot place its cut. Such a row must
    // still gather a few thousand tokens, not the whole row, and keep what float64 keeps.
    let mut rng = TestRng::new(12);
    let n = 262_144;
    let mut most = 0;
    for _ in 0..48 {
        let x: Vec<f32> = (0..n).map(|_| (rng.normal() * 3.0) as f32).collect();
        for level in supported_levels() {
            let before = tokenrace::internals::gathered_on_this_thread();
            kept_floor_at(level, &x, 0.7, 0, 0.9, 0.0);
            most = most.max(tokenrace::internals::gathered_on_this_thread() - before);
        }
        check_top_p(&x, 0.7, 0.9, 0.0);
    }
    assert!(most < n as u64 / 16, "a row gathered {most} of {n} tokens");
}

#[test]
fn top_p_tokens_for_half_precision_rows_are_identical_across_levels_and_threads() {
    let mut rng = TestRng::new(10);
    let (rows, vocab) = (2usize, 100_000usize);
    let x: Vec<f32> =
        (0..rows * vocab).map(|i| if i % vocab == 17 { 14.0 } else { (rng.normal() * 2.5) as f32 }).collect();
    let bf: Vec<Bf16> = x.iter().map(|&v| Bf16::from_f32(v)).collect();
    let hf: Vec<F16> = x.iter().map(|&v| F16::from_f32(v)).collect();
    let temps = [1.0f32, 0.8];
    let ps = [0.9f32, 0.97];
    for logits in [Logits::Bf16(&bf), Logits::F16(&hf)] {
        let mut first: Option<(Vec<i32>, Vec<u32>)> = None;
        each_level(|level| {
            for threads in [1usize, 4] {
                let cfg = Config { threads, ..sampler(level, 23).config().clone() };
                let s = Sampler::new(cfg).unwrap();
                let b = Batch { temperature: Some(&temps), top_p: Some(&ps), ..Batch::new(logits, rows, vocab) };
                let (mut tokens, mut lps) = (vec![0; rows], vec![0f32; rows]);
                let mut out = Output {
                    logprobs: Some(&mut lps),
                    logprob_mode: LogprobMode::Processed,
                    ..Output::new(&mut tokens)
                };
                let mut got_tokens = Vec::new();
                let mut got_lps = Vec::new();
                for _ in 0..5 {
                    s.draw(&b, &mut out).unwrap();
                    got_tokens.extend_from_slice(out.tokens);
                    got_lps.extend(out.logprobs.as_deref().unwrap().iter().map(|v| v.to_bits()));
                }
                match &first {
                    None => first = Some((got_tokens, got_lps)),
                    Some(f) => assert_eq!(&(got_tokens, got_lps), f, "{level:?} threads {threads}"),
                }
            }
        });
    }
}

#[test]
fn top_p_on_many_random_rows() {
    let mut rng = TestRng::new(11);
    for i in 0..2000 {
        let n = 1 + rng.below(if i % 10 == 0 { 200_000 } else { 20_000 });
        let sd = [0.3, 1.0, 3.0, 8.0][rng.below(4)];
        let mut x: Vec<f32> = (0..n).map(|_| (rng.normal() * sd) as f32).collect();
        for _ in 0..rng.below(100) {
            let i = rng.below(n);
            x[i] = (rng.normal() * 2.0 + 4.0 * sd) as f32;
        }
        if rng.below(4) == 0 {
            // Coarse values: many ties.
            for v in &mut x {
                *v = (*v * 4.0).round() / 4.0;
            }
        }
        if rng.below(5) == 0 {
            for _ in 0..1 + n / 50 {
                let i = rng.below(n);
                x[i] = if rng.below(2) == 0 { NINF } else { f32::NAN };
            }
        }
        if !x.iter().any(|v| v.is_finite()) {
            continue;
        }
        let t = [0.2f32, 0.7, 1.0, 1.0, 1.6, 5.0][rng.below(6)];
        let p = match rng.below(4) {
            0 => 0.9,
            1 => 0.95,
            2 => rng.f64() as f32,
            _ => 1.0 - (rng.f64() * 0.01) as f32,
        };
        let mp = if rng.below(4) == 0 { 0.01 } else { 0.0 };
        if p > 0.0 && p < 1.0 {
            check_top_p(&x, t, p, mp);
        }
    }
}
