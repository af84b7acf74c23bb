//! The fused draw against float64 references, across every SIMD level this machine has.
mod common;

use common::reference as rf;
use common::*;
use tokenrace::internals::scalar_noise;
use tokenrace::internals::seeded_row_key;
use tokenrace::*;

fn to_bf16(x: &[f32]) -> Vec<Bf16> {
    x.iter().map(|&v| Bf16::from_f32(v)).collect()
}
fn to_f16(x: &[f32]) -> Vec<F16> {
    x.iter().map(|&v| F16::from_f32(v)).collect()
}

#[test]
fn inline_noise_is_exp1_to_float64_precision() {
    let mut rng = TestRng::new(1);
    let mut cases: Vec<u32> = (0..200_000).map(|_| rng.u64() as u32).collect();
    for base in [0u32, 1 << 31, u32::MAX] {
        for d in 0..300u32 {
            cases.push(base.wrapping_add(d));
            cases.push(base.wrapping_sub(d));
        }
    }
    for k in 0..32 {
        cases.push(1u32 << k);
        cases.push(u32::MAX - (1u32 << k));
    }
    for a in cases {
        let e = scalar_noise::exp(a);
        let e64 = exp_of_bits64(a);
        let rel = ((e as f64 - e64) / e64).abs();
        assert!(e > 0.0 && e.is_finite(), "E({a}) = {e}");
        assert!(rel < 6e-7, "E({a}) = {e}, float64 {e64}, relative error {rel}");
        let ln_e = scalar_noise::ln(e);
        assert!((ln_e as f64 - e64.ln()).abs() < 4e-6 + 1e-6 * e64.ln().abs(), "ln E({a})");
        let bound = scalar_noise::bound(a);
        assert!(-ln_e <= bound, "bound({a}) = {bound} < -ln E = {}", -ln_e);
        // E_min + E can only be larger, so the bound holds for the race's noise too.
        assert!(-scalar_noise::ln(e + 1e-30) <= bound);
    }
}

#[test]
fn ln_matches_float64_everywhere() {
    let mut rng = TestRng::new(2);
    for _ in 0..200_000 {
        let x = f32::from_bits((rng.u64() as u32) & 0x7fff_ffff);
        if !x.is_finite() || x == 0.0 {
            continue;
        }
        let l = scalar_noise::ln_any(x) as f64;
        let l64 = (x as f64).ln();
        assert!((l - l64).abs() <= 2.5e-7 * l64.abs().max(1.0), "ln({x:e}) = {l}, float64 {l64}");
    }
    assert_eq!(scalar_noise::ln_any(0.0), f32::NEG_INFINITY);
    assert_eq!(scalar_noise::ln_any(f32::INFINITY), f32::INFINITY);
    assert!(scalar_noise::ln_any(-1.0).is_nan());
    assert!(scalar_noise::ln_any(f32::NAN).is_nan());
}

/// The inline race's noise of token i, in float64, from the same bits: the block minimum
/// E(h1)/256 at position h2 >> 24, every other token the minimum plus its own E.
fn race_noise64(key: u64, i: usize) -> f64 {
    let (h1, h2, _) = scalar_noise::block_bits(key, (i / 256) as u32);
    let e_min = exp_of_bits64(h1) / 256.0;
    if (i % 256) as u32 == h2 >> 24 {
        e_min
    } else {
        e_min + exp_of_bits64(scalar_noise::bits(key, i as u32))
    }
}

#[test]
fn race_noise_matches_float64_and_its_block_bound() {
    let mut rng = TestRng::new(21);
    for _ in 0..40 {
        let key = rng.u64();
        let n = 256 * 6 + 17;
        let noise = scalar_noise::race_noise(key, n);
        for (i, &e) in noise.iter().enumerate() {
            let e64 = race_noise64(key, i);
            assert!(((e as f64 - e64) / e64).abs() < 6e-7, "token {i}: {e} vs {e64}");
            let (_, _, g_max) = scalar_noise::block_bits(key, (i / 256) as u32);
            assert!(-scalar_noise::ln(e) <= g_max, "token {i}: -ln E above the block bound");
        }
    }
}

#[test]
fn race_noise_is_iid_exponential_by_chi_square() {
    // 20 equiprobable bins of Exp(1), over many rows; and the position of each block's
    // minimum must be uniform, which the construction relies on.
    let mut counts = [0u64; 20];
    let mut positions = [0u64; 16];
    let mut rng = TestRng::new(22);
    for _ in 0..200 {
        let key = rng.u64();
        let noise = scalar_noise::race_noise(key, 2048);
        for block in noise.chunks(256) {
            let j = block.iter().enumerate().fold(0, |b, (i, &v)| if v < block[b] { i } else { b });
            positions[j / 16] += 1;
        }
        for &e in &noise {
            counts[(((1.0 - (-(e as f64)).exp()) * 20.0).floor() as usize).min(19)] += 1;
        }
    }
    let (stat, dof) = chi2(&counts, &[0.05; 20]);
    assert!(stat < chi2_critical(dof, 5.0), "values: chi-square {stat} on {dof} dof");
    let (stat, dof) = chi2(&positions, &[1.0 / 16.0; 16]);
    assert!(stat < chi2_critical(dof, 5.0), "minimum positions: chi-square {stat}");
}

#[test]
fn inline_noise_is_exponential_by_chi_square() {
    // 20 equiprobable bins of Exp(1): edges -ln(1 - k/20).
    let key = seeded_row_key(99, 3);
    let mut counts = [0u64; 20];
    let n = 400_000u32;
    for i in 0..n {
        let e = scalar_noise::exp(scalar_noise::bits(key, i)) as f64;
        let bin = ((1.0 - (-e).exp()) * 20.0).floor().min(19.0) as usize;
        counts[bin] += 1;
    }
    let (stat, dof) = chi2(&counts, &[0.05; 20]);
    assert!(stat < chi2_critical(dof, 5.0), "chi-square {stat} on {dof} dof");
}

/// Rows that exercise every branch: masks, NaN, +inf, empty rows, ties, odd sizes.
fn hard_rows(rng: &mut TestRng) -> Vec<(Vec<f32>, f32)> {
    let mut rows = Vec::new();
    for &vocab in &[1usize, 2, 7, 15, 16, 17, 255, 256, 257, 1000, 5003] {
        for &t in &[0.0f32, 0.05, 0.7, 1.0, 3.0] {
            let mut x = peaked_logits(rng, vocab, 3.0, 12.0);
            for v in x.iter_mut() {
                match rng.below(40) {
                    0 => *v = f32::NEG_INFINITY,
                    1 => *v = f32::NAN,
                    2 => *v = 5.0, // ties
                    _ => {}
                }
            }
            rows.push((x.clone(), t));
        }
    }
    let mut special = vec![vec![f32::NEG_INFINITY; 300], vec![f32::NAN; 40], vec![0.0; 33]];
    let mut posinf = peaked_logits(rng, 700, 3.0, 10.0);
    posinf[650] = f32::INFINITY;
    posinf[300] = f32::INFINITY;
    special.push(posinf);
    let mut mixed = vec![f32::NEG_INFINITY; 513];
    mixed[3] = f32::NAN;
    mixed[511] = -2.0;
    special.push(mixed);
    for x in special {
        rows.push((x.clone(), 1.0));
        rows.push((x, 0.0));
    }
    rows
}

fn batch_of<'a>(logits: Logits<'a>, rows: usize, vocab: usize, temps: &'a [f32]) -> Batch<'a> {
    Batch { temperature: Some(temps), ..Batch::new(logits, rows, vocab) }
}

#[test]
fn every_level_draws_the_same_tokens_as_scalar() {
    let mut rng = TestRng::new(3);
    let rows = hard_rows(&mut rng);
    for (x, t) in &rows {
        let vocab = x.len();
        let temps = [*t; 3];
        let mut noise_e = vec![0f32; vocab];
        let mut noise_l = vec![0f32; vocab];
        for i in 0..vocab {
            let e = rng.exp();
            noise_e[i] = e as f32;
            noise_l[i] = e.ln() as f32;
        }
        let three: Vec<f32> = x.iter().chain(x).chain(x).copied().collect();
        let (b16, h16) = (to_bf16(&three), to_f16(&three));
        let logits = [Logits::F32(&three), Logits::Bf16(&b16), Logits::F16(&h16)];
        let mut expected: Vec<Vec<(Vec<i32>, Vec<u32>)>> = Vec::new();
        each_level(|level| {
            let mut got = Vec::new();
            for l in logits {
                let s = sampler(level, 11);
                got.push(draw(&s, &batch_of(l, 3, vocab, &temps)));
                for (noise, kind) in [(&noise_e, NoiseKind::Exp), (&noise_l, NoiseKind::LogExp)] {
                    let b = Batch {
                        noise: Some(ExternalNoise { values: noise, kind, row_stride: 0 }),
                        ..batch_of(l, 3, vocab, &temps)
                    };
                    got.push(draw(&s, &b));
                }
            }
            if expected.is_empty() {
                expected.push(got);
            } else {
                assert_eq!(got, expected[0], "{level:?} differs from scalar on a row of vocab {vocab}, T {t}");
            }
        });
    }
}

/// The float64 race of the finite logits of `x` at `t` given `ln E` (the reference's, with its
/// near-tie rule).
fn race64_of(x: &[f32], t: f32, ln_e: impl Fn(usize) -> f64) -> rf::Race {
    let m = rf::finite_max(x);
    rf::race64(x, |i| x[i].is_finite(), |i| ((x[i] as f64 - m) / t as f64, ln_e(i)))
}

#[test]
fn race_matches_float64_reference_on_the_same_noise() {
    let mut rng = TestRng::new(4);
    let (mut compared, mut near_ties) = (0, 0);
    each_level(|level| {
        let s = sampler(level, 5);
        for case in 0..300 {
            let vocab = [50, 1000, 4099, 32000][case % 4];
            let t = [0.1f32, 0.5, 1.0, 1.7][(case / 4) % 4];
            let x = if case % 3 == 0 {
                (0..vocab).map(|_| (rng.normal() * 3.0) as f32).collect()
            } else {
                peaked_logits(&mut rng, vocab, 3.0, 20.0)
            };
            let e: Vec<f32> = (0..vocab).map(|_| rng.exp() as f32).collect();
            let ln_e: Vec<f32> = e.iter().map(|v| v.ln()).collect();
            let temps = [t];
            for (noise, kind) in [(&e, NoiseKind::Exp), (&ln_e, NoiseKind::LogExp)] {
                let b = Batch {
                    noise: Some(ExternalNoise { values: noise, kind, row_stride: vocab }),
                    ..batch_of(Logits::F32(&x), 1, vocab, &temps)
                };
                let (tok, _) = draw(&s, &b);
                let r = match kind {
                    NoiseKind::Exp => race64_of(&x, t, |i| (e[i] as f64).ln()),
                    NoiseKind::LogExp => race64_of(&x, t, |i| ln_e[i] as f64),
                };
                compared += 1;
                let tok = tok[0] as usize;
                if !r.near.is_empty() {
                    near_ties += 1;
                    assert!(
                        tok == r.token || r.near.contains(&tok),
                        "{level:?} vocab {vocab} T {t} {kind:?}: near tie"
                    );
                    continue;
                }
                assert_eq!(tok, r.token, "{level:?} vocab {vocab} T {t} {kind:?}: gap {} tolerances", r.gap);
            }
        }
    });
    assert!(near_ties * 50 < compared, "{near_ties} near ties of {compared}: the test is not testing");
}

#[test]
fn inline_race_matches_float64_reference_of_its_noise() {
    let mut rng = TestRng::new(6);
    each_level(|level| {
        let s = sampler(level, 5);
        for case in 0..200u64 {
            let vocab = [64, 1000, 4099, 32000][case as usize % 4];
            let t = [0.05f32, 0.6, 1.0, 2.5][(case / 4) as usize % 4];
            let x = if case % 2 == 0 {
                (0..vocab).map(|_| (rng.normal() * 3.0) as f32).collect::<Vec<_>>()
            } else {
                peaked_logits(&mut rng, vocab, 3.0, 20.0)
            };
            let (seed, offset) = (rng.u64(), case);
            let temps = [t];
            let b =
                Batch { seeds: Some(&[seed]), offsets: Some(&[offset]), ..batch_of(Logits::F32(&x), 1, vocab, &temps) };
            let (tok, _) = draw(&s, &b);
            let key = seeded_row_key(seed, offset);
            let r = race64_of(&x, t, |i| race_noise64(key, i).ln());
            let tok = tok[0] as usize;
            assert!(tok == r.token || r.near.contains(&tok), "{level:?} vocab {vocab} T {t}: gap {} tolerances", r.gap);
        }
    });
}

/// Draws `n` tokens from one row, `per_call` rows at a time, unseeded.
fn frequencies(s: &Sampler, x: &[f32], t: f32, n: usize, per_call: usize) -> Vec<u64> {
    let vocab = x.len();
    let rows: Vec<f32> = (0..per_call).flat_map(|_| x.iter().copied()).collect();
    let temps = vec![t; per_call];
    let mut counts = vec![0u64; vocab];
    for _ in 0..n / per_call {
        let (tok, _) = draw(s, &batch_of(Logits::F32(&rows), per_call, vocab, &temps));
        for v in tok {
            counts[v as usize] += 1;
        }
    }
    counts
}

#[test]
fn sampled_frequencies_match_softmax_by_chi_square() {
    let x: Vec<f32> = vec![1.0, f32::NEG_INFINITY, 0.5, 2.0, -1.0, 2.0, f32::NEG_INFINITY, 0.0, -3.0, 1.5, 3.0, -0.5];
    let n = 100_000;
    each_level(|level| {
        let s = sampler(level, 77);
        for &t in &[0.5f32, 1.0, 2.0] {
            let counts = frequencies(&s, &x, t, n, 1000);
            let (stat, dof) = chi2(&counts, &softmax64(&x, t as f64));
            let crit = chi2_critical(dof, 5.0);
            assert!(stat < crit, "{level:?} T {t}: chi-square {stat} >= {crit} on {dof} dof");
            // The same test rejects a sampler that is off by 5% in temperature.
            let (wrong, _) = chi2(&counts, &softmax64(&x, t as f64 * 1.05));
            assert!(wrong > crit, "{level:?} T {t}: the test cannot tell T from 1.05 T ({wrong} < {crit})");
        }
    });
}

#[test]
fn external_noise_frequencies_match_softmax() {
    let x: Vec<f32> = vec![0.3, 1.2, f32::NEG_INFINITY, -0.7, 2.2, 0.0, 1.9, -2.0];
    let mut rng = TestRng::new(8);
    each_level(|level| {
        let s = sampler(level, 1);
        for kind in [NoiseKind::Exp, NoiseKind::LogExp] {
            let (rows, calls, vocab) = (500, 120, x.len());
            let all: Vec<f32> = (0..rows).flat_map(|_| x.iter().copied()).collect();
            let mut counts = vec![0u64; vocab];
            for _ in 0..calls {
                let noise: Vec<f32> = (0..rows * vocab)
                    .map(|_| {
                        let e = rng.exp();
                        if kind == NoiseKind::Exp {
                            e as f32
                        } else {
                            e.ln() as f32
                        }
                    })
                    .collect();
                let temps = vec![0.8f32; rows];
                let b = Batch {
                    noise: Some(ExternalNoise { values: &noise, kind, row_stride: vocab }),
                    ..batch_of(Logits::F32(&all), rows, vocab, &temps)
                };
                for v in draw(&s, &b).0 {
                    counts[v as usize] += 1;
                }
            }
            let (stat, dof) = chi2(&counts, &softmax64(&x, 0.8));
            assert!(stat < chi2_critical(dof, 5.0), "{level:?} {kind:?}: chi-square {stat}");
        }
    });
}

#[test]
fn the_whole_vocabulary_is_reachable() {
    // vLLM's shared 2^20 noise table left half of a 152K vocabulary unreachable (#59786).
    let vocab = 152_064;
    let x = vec![0f32; vocab];
    let s = sampler(best_level(), 3);
    let mut buckets = vec![0u64; 32];
    let (rows, calls) = (64, 64);
    let all: Vec<f32> = (0..rows).flat_map(|_| x.iter().copied()).collect();
    for _ in 0..calls {
        for v in draw(&s, &batch_of(Logits::F32(&all), rows, vocab, &vec![1.0; rows])).0 {
            buckets[v as usize * 32 / vocab] += 1;
        }
    }
    let (stat, dof) = chi2(&buckets, &[1.0 / 32.0; 32]);
    assert!(stat < chi2_critical(dof, 5.0), "uniform logits are not drawn uniformly: {buckets:?}");
}

#[test]
fn greedy_rows_are_the_exact_argmax_with_lowest_index_ties() {
    let mut rng = TestRng::new(9);
    each_level(|level| {
        let s = sampler(level, 0);
        for case in 0..200 {
            let vocab = 1 + rng.below(3000);
            let mut x: Vec<f32> = (0..vocab).map(|_| (rng.normal() * 2.0) as f32).collect();
            let top = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            for _ in 0..3 {
                let i = rng.below(vocab);
                x[i] = top; // ties with the maximum
            }
            if case % 5 == 0 {
                x[rng.below(vocab)] = f32::NAN;
            }
            let want = x.iter().enumerate().filter(|(_, v)| !v.is_nan()).fold(
                (usize::MAX, f32::NEG_INFINITY),
                |b, (i, &v)| {
                    if v > b.1 {
                        (i, v)
                    } else {
                        b
                    }
                },
            );
            let (tok, fl) = draw(&s, &batch_of(Logits::F32(&x), 1, vocab, &[0.0]));
            assert_eq!(tok[0] as usize, want.0, "{level:?}");
            assert!(fl[0] & flags::GREEDY != 0);
        }
    });
}

#[test]
fn non_finite_logits_follow_the_rules() {
    each_level(|level| {
        let s = sampler(level, 0);
        for t in [0.0f32, 1.0] {
            let mut x = vec![f32::NAN; 40];
            x[7] = 1.0;
            let (tok, fl) = draw(&s, &batch_of(Logits::F32(&x), 1, 40, &[t]));
            assert_eq!((tok[0], fl[0] & 7), (7, flags::HAS_NAN), "NaN never wins");

            let mut x = vec![0.0f32; 40];
            x[30] = f32::INFINITY;
            x[12] = f32::INFINITY;
            x[3] = f32::NAN;
            let (tok, fl) = draw(&s, &batch_of(Logits::F32(&x), 1, 40, &[t]));
            assert_eq!((tok[0], fl[0] & 7), (12, flags::HAS_POSINF | flags::HAS_NAN), "+inf wins, lowest first");

            let x = vec![f32::NEG_INFINITY; 40];
            let (tok, fl) = draw(&s, &batch_of(Logits::F32(&x), 1, 40, &[t]));
            assert_eq!((tok[0], fl[0] & 7), (0, flags::EMPTY));

            let mut x = vec![f32::NAN; 40];
            x[5] = f32::NEG_INFINITY;
            let (tok, fl) = draw(&s, &batch_of(Logits::F32(&x), 1, 40, &[t]));
            assert_eq!((tok[0], fl[0] & 7), (0, flags::EMPTY | flags::HAS_NAN));

            let mut x = vec![f32::NEG_INFINITY; 40];
            x[39] = -1e30;
            for _ in 0..20 {
                let (tok, _) = draw(&s, &batch_of(Logits::F32(&x), 1, 40, &[t]));
                assert_eq!(tok[0], 39, "masked tokens never win");
            }
        }
    });
}

#[test]
fn tiny_and_huge_temperatures_stay_exact() {
    let x: Vec<f32> = vec![1.0, 1.0 + 1e-6, 0.5, -3.0];
    each_level(|level| {
        let s = Sampler::new(Config { greedy_below: 0.0, ..common::sampler(level, 1).config().clone() }).unwrap();
        for t in [1e-30f32, f32::MIN_POSITIVE, 1e-38] {
            let (tok, _) = draw(&s, &batch_of(Logits::F32(&x), 1, 4, &[t]));
            assert_eq!(tok[0], 1, "{level:?} T {t}: the race at a tiny T is the argmax");
        }
        let (tok, _) = draw(&s, &batch_of(Logits::F32(&x), 1, 4, &[1e30]));
        assert!((0..4).contains(&tok[0]));
    });
}

#[test]
fn seeded_rows_do_not_depend_on_the_rest_of_the_batch() {
    let mut rng = TestRng::new(10);
    let vocab = 3000;
    let target = peaked_logits(&mut rng, vocab, 2.0, 6.0);
    let mut reference = None;
    each_level(|level| {
        for (pos, rows) in [(0usize, 1usize), (5, 9), (8, 9), (0, 64)] {
            let s = sampler(level, rng.u64());
            let mut all: Vec<f32> = (0..rows * vocab).map(|_| rng.normal() as f32).collect();
            all[pos * vocab..(pos + 1) * vocab].copy_from_slice(&target);
            let mut seeds: Vec<u64> = (0..rows).map(|_| rng.u64()).collect();
            let mut offsets = vec![0u64; rows];
            let mut seeded: Vec<u8> = (0..rows).map(|r| (r % 2) as u8).collect();
            seeds[pos] = 1234;
            offsets[pos] = 17;
            seeded[pos] = 1;
            let temps: Vec<f32> = (0..rows).map(|r| [0.0, 1.0, 0.7][r % 3]).collect();
            let mut temps = temps;
            temps[pos] = 0.9;
            let b = Batch {
                seeds: Some(&seeds),
                offsets: Some(&offsets),
                seeded: Some(&seeded),
                ..batch_of(Logits::F32(&all), rows, vocab, &temps)
            };
            let tok = draw(&s, &b).0[pos];
            match reference {
                None => reference = Some(tok),
                Some(r) => assert_eq!(tok, r, "{level:?}: the seeded row moved to {pos} of {rows} and changed"),
            }
        }
    });
}

#[test]
fn seeds_and_offsets_change_the_draw() {
    let x = vec![0f32; 1000];
    let s = sampler(best_level(), 0);
    let draw_with = |seed: u64, offset: u64| {
        draw(&s, &Batch { seeds: Some(&[seed]), offsets: Some(&[offset]), ..Batch::new(Logits::F32(&x), 1, 1000) }).0[0]
    };
    let by_offset: std::collections::HashSet<i32> = (0..50).map(|o| draw_with(1, o)).collect();
    let by_seed: std::collections::HashSet<i32> = (0..50).map(|seed| draw_with(seed, 0)).collect();
    assert!(by_offset.len() > 40 && by_seed.len() > 40, "{} {}", by_offset.len(), by_seed.len());
    assert_eq!(draw_with(5, 6), draw_with(5, 6));
}

#[test]
fn unseeded_draws_are_reproducible_from_the_config_seed() {
    let x = vec![0f32; 5000];
    let all: Vec<f32> = (0..8).flat_map(|_| x.iter().copied()).collect();
    let run = |level| {
        let s = sampler(level, 42);
        (0..3).flat_map(|_| draw(&s, &Batch::new(Logits::F32(&all), 8, 5000)).0).collect::<Vec<_>>()
    };
    let first = run(SimdLevel::Scalar);
    each_level(|level| {
        assert_eq!(run(level), first, "{level:?}");
    });
}

#[test]
fn bad_arguments_name_what_is_wrong_and_write_nothing() {
    let s = sampler(best_level(), 0);
    let x = vec![0f32; 40];
    let check = |b: Batch, rows: usize, needle: &str| {
        let mut tokens = vec![-7; rows];
        let mut fl = vec![99; rows];
        let err = s.draw(&b, &mut Output { flags: Some(&mut fl), ..Output::new(&mut tokens) }).unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidArgument);
        assert!(err.message.contains(needle), "{:?} does not name {needle}", err.message);
        assert!(tokens.iter().all(|&t| t == -7) && fl.iter().all(|&f| f == 99), "a failed call wrote");
    };
    check(batch_of(Logits::F32(&x), 4, 10, &[1.0, 1.0, -0.5, 1.0]), 4, "temperature[2]");
    check(batch_of(Logits::F32(&x), 4, 10, &[1.0, f32::NAN, 1.0, 1.0]), 4, "temperature[1]");
    check(batch_of(Logits::F32(&x), 4, 10, &[1.0, 1.0, 1.0, f32::INFINITY]), 4, "temperature[3]");
    check(Batch::new(Logits::F32(&x), 5, 10), 5, "logits");
    check(Batch { row_stride: 5, ..Batch::new(Logits::F32(&x), 2, 10) }, 2, "row_stride");
    check(Batch::new(Logits::F32(&x), 1, 0), 1, "vocab");
    check(Batch { seeded: Some(&[1]), ..Batch::new(Logits::F32(&x), 1, 10) }, 1, "seeded");
    let noise = [1f32; 5];
    check(
        Batch {
            noise: Some(ExternalNoise { values: &noise, kind: NoiseKind::Exp, row_stride: 0 }),
            ..Batch::new(Logits::F32(&x), 1, 10)
        },
        1,
        "noise",
    );
    let small = Sampler::new(Config { max_rows: 2, ..Config::default() }).unwrap();
    let mut tokens = vec![0; 3];
    let err = small.draw(&Batch::new(Logits::F32(&x), 3, 10), &mut Output::new(&mut tokens)).unwrap_err();
    assert!(err.message.contains("max_rows"));
}

#[test]
fn strided_rows_read_only_their_own_elements() {
    let vocab = 100;
    let stride = 128;
    let mut all = vec![f32::INFINITY; stride * 3];
    for r in 0..3 {
        for i in 0..vocab {
            all[r * stride + i] = if i == 10 * (r + 1) { 5.0 } else { 0.0 };
        }
    }
    let s = sampler(best_level(), 0);
    let b = Batch { row_stride: stride, ..batch_of(Logits::F32(&all[..2 * stride + vocab]), 3, vocab, &[0.0; 3]) };
    assert_eq!(draw(&s, &b).0, vec![10, 20, 30]);
}

#[test]
fn thread_count_never_changes_a_token() {
    let mut rng = TestRng::new(12);
    for (rows, vocab) in [(1usize, 100_003usize), (2, 65_536), (3, 40_000), (33, 5_000)] {
        let mut all: Vec<f32> = Vec::with_capacity(rows * vocab);
        for r in 0..rows {
            let mut x = peaked_logits(&mut rng, vocab, 3.0, 15.0);
            match r % 4 {
                1 => x[vocab - 1] = f32::INFINITY,
                2 => x.iter_mut().step_by(7).for_each(|v| *v = f32::NAN),
                _ => {}
            }
            all.extend(x);
        }
        let temps: Vec<f32> = (0..rows).map(|r| [1.0, 0.0, 0.7, 1.3][r % 4]).collect();
        let seeds: Vec<u64> = (0..rows as u64).collect();
        let seeded: Vec<u8> = (0..rows).map(|r| (r % 3 == 0) as u8).collect();
        let noise: Vec<f32> = (0..vocab).map(|_| rng.exp() as f32).collect();
        let mut expected = None;
        each_level(|level| {
            // Every split of `threads` (forced: the cost model would keep small calls on one
            // thread), then the model's own choice at 7 threads.
            for (threads, forced) in
                [(1usize, usize::MAX), (2, usize::MAX), (3, usize::MAX), (4, 3), (7, usize::MAX), (7, 0)]
            {
                tokenrace::internals::force_participants(forced);
                let cfg = Config { threads, ..common::sampler(level, 9).config().clone() };
                let s = Sampler::new(cfg).unwrap();
                let plain = Batch {
                    seeds: Some(&seeds),
                    seeded: Some(&seeded),
                    ..batch_of(Logits::F32(&all), rows, vocab, &temps)
                };
                let ext = Batch {
                    noise: Some(ExternalNoise { values: &noise, kind: NoiseKind::Exp, row_stride: 0 }),
                    ..plain
                };
                let got = (draw(&s, &plain), draw(&s, &plain), draw(&s, &ext));
                match &expected {
                    None => expected = Some(got),
                    Some(e) => assert_eq!(&got, e, "{level:?}, {threads} threads ({forced}), {rows} x {vocab}"),
                }
            }
        });
    }
    tokenrace::internals::force_participants(0);
}

#[test]
fn half_precision_rows_draw_as_their_f32_values() {
    // bf16 and f16 logits are converted exactly, so they must draw what the same values in f32
    // draw, on every level, with inline and seeded noise.
    let mut rng = TestRng::new(31);
    let (rows, vocab) = (6, 3001);
    let x: Vec<f32> = (0..rows).flat_map(|_| peaked_logits(&mut rng, vocab, 3.0, 12.0)).collect();
    let temps: Vec<f32> = (0..rows).map(|r| [0.0, 0.5, 1.0][r % 3]).collect();
    let seeds: Vec<u64> = (0..rows as u64).collect();
    let seeded: Vec<u8> = (0..rows).map(|r| (r % 2) as u8).collect();
    let b16 = to_bf16(&x);
    let h16 = to_f16(&x);
    let via_b16: Vec<f32> = b16.iter().map(|v| v.to_f32()).collect();
    let via_h16: Vec<f32> = h16.iter().map(|v| v.to_f32()).collect();
    each_level(|level| {
        let run = |l: Logits| {
            let s = sampler(level, 4);
            let b = Batch { seeds: Some(&seeds), seeded: Some(&seeded), ..batch_of(l, rows, vocab, &temps) };
            (draw(&s, &b), draw(&s, &b))
        };
        assert_eq!(run(Logits::Bf16(&b16)), run(Logits::F32(&via_b16)), "{level:?} bf16");
        assert_eq!(run(Logits::F16(&h16)), run(Logits::F32(&via_h16)), "{level:?} f16");
    });
}

/// Which SIMD levels the suite exercises on this machine (scripts/test.sh prints this line):
/// the tests loop over `supported_levels()`, so a level the CPU lacks is not tested here (the
/// AVX-512 level runs on an AVX-512 host; see docs/performance.md).
#[test]
fn levels_exercised() {
    let tested: Vec<&str> = supported_levels().iter().map(|l| l.name()).collect();
    let missing: Vec<&str> = SimdLevel::ALL.iter().filter(|l| !l.is_supported()).map(|l| l.name()).collect();
    println!(
        "simd levels tested: {}; not supported by this CPU: {}",
        tested.join(", "),
        if missing.is_empty() { "none".to_string() } else { missing.join(", ") }
    );
    assert!(tested.contains(&"scalar") && tested.contains(&"portable"));
}

/// T up to FLT_MAX with logits near the ends of the f32 range: every finite
/// logit within FLT_MAX of the row's maximum takes part at its float64 rate; one further below
/// (its `x - m` is not an f32) is masked, as docs/semantics.md says.
#[test]
fn logits_at_the_ends_of_the_f32_range_at_the_largest_temperature() {
    let t = f32::MAX;
    let (rows, calls) = (4096usize, 5);
    // (row, the float64 probability of token 1).
    let d = (-0.3e38f64 - 3.0e38) / f32::MAX as f64; // about -0.97: a span just below FLT_MAX
    let cases = [([3.0e38f32, -0.3e38], d.exp() / (1.0 + d.exp())), ([3.0e38f32, -3.0e38], 0.0)];
    each_level(|level| {
        for (x, p1) in cases {
            let s = sampler(level, 5);
            let logits: Vec<f32> = (0..rows).flat_map(|_| x).collect();
            let temps = vec![t; rows];
            let mut ones = 0u64;
            for c in 0..calls as u64 {
                let seeds: Vec<u64> = (0..rows as u64).map(|r| c * rows as u64 + r).collect();
                let batch = Batch { seeds: Some(&seeds), ..batch_of(Logits::F32(&logits), rows, 2, &temps) };
                ones += draw(&s, &batch).0.iter().filter(|&&tok| tok == 1).count() as u64;
            }
            let n = (rows * calls) as f64;
            let sd = (n * p1 * (1.0 - p1)).sqrt();
            let dev = (ones as f64 - n * p1).abs();
            assert!(dev <= 5.0 * sd, "{level:?} {x:?}: token 1 drawn {ones} times of {n}, expected {:.0}", n * p1);
            // The processed logprob agrees with the float64 log-softmax (or is -inf when masked).
            let (seed, temp) = ([1u64], [t]);
            let one = Batch { seeds: Some(&seed), ..batch_of(Logits::F32(&x), 1, 2, &temp) };
            let (mut tok, mut lp) = ([-1], [0f32]);
            let mut out =
                Output { logprobs: Some(&mut lp), logprob_mode: LogprobMode::Processed, ..Output::new(&mut tok) };
            s.draw(&one, &mut out).unwrap();
            let want = if tok[0] == 1 { p1.ln() } else { (1.0 - p1).ln() };
            assert!(
                (lp[0] as f64 - want).abs() <= 1e-5 * want.abs().max(1.0),
                "{level:?} {x:?}: logprob {} vs {want}",
                lp[0]
            );
        }
    });
}

// ---------------------------------------------------------------------------------------------
// Pruning bounds: each must be an upper bound of the computed `-ln E` for every E, or a token
// whose key beats the best by less than the shortfall is skipped unread.
// ---------------------------------------------------------------------------------------------

/// f32 values of every biased exponent with the mantissa edges (0, 1, max) and samples between.
fn exponent_edges(rng: &mut TestRng) -> Vec<f32> {
    let mut out = Vec::new();
    for eb in 0u32..=254 {
        let mut mantissas = vec![0u32, 1, 2, 0x40_0000, 0x7f_fffe, 0x7f_ffff];
        mantissas.extend((0..8).map(|_| rng.u64() as u32 & 0x7f_ffff));
        out.extend(mantissas.into_iter().map(|m| f32::from_bits(eb << 23 | m)));
    }
    out
}

#[test]
fn the_external_exp_bound_holds_at_every_exponent() {
    let mut rng = TestRng::new(31);
    let mut checked = 0;
    for e in exponent_edges(&mut rng) {
        let bound = scalar_noise::exp_bound(e);
        if e < f32::MIN_POSITIVE {
            // 0 and subnormals: their ln is below -87, so no bound prunes them.
            assert_eq!(bound, f32::INFINITY, "E = {e:e}");
            continue;
        }
        // The race compares `d + bound` with the best key where the token's key is
        // `d - ln_any(E)`: the bound must dominate the computed logarithm (then f32 addition,
        // being monotone, keeps the order), and the true one.
        let computed = -scalar_noise::ln_any(e);
        let exact = -(e as f64).ln();
        assert!(bound >= computed, "E = {e:e} ({:#x}): bound {bound} < computed -ln E {computed}", e.to_bits());
        assert!(bound as f64 >= exact, "E = {e:e} ({:#x}): bound {bound} < -ln E {exact}", e.to_bits());
        // And it is tight enough to prune: within 2e-3 + 0.7 (one binade) of the truth.
        assert!((bound as f64) < exact + 0.694 + 2e-3, "E = {e:e}: bound {bound} is loose");
        checked += 1;
    }
    assert_eq!(checked, 254 * 14, "every normal exponent, 14 mantissas each");
    // Values whose key never wins get a bound that is not NaN (so nothing depends on how a NaN
    // bound compares).
    for e in [f32::INFINITY, f32::NAN, -1.0, -1e30, -0.0, f32::MAX] {
        assert!(!scalar_noise::exp_bound(e).is_nan(), "E = {e}");
    }
}

#[test]
fn the_inline_bounds_hold_at_every_exponent_edge() {
    // Token bound: over the bits `a` of every binade edge of `c = a` (U < 1/2) and `c = !a`
    // (U >= 1/2), where the bound's exponent changes.
    let mut bits = Vec::new();
    for k in 0..32u32 {
        let p = 1u64 << k;
        for c in [p - 1, p, p + 1, 2 * p - 1] {
            let c = c.min(u32::MAX as u64) as u32;
            bits.extend([c, !c, c >> 8 << 8, !(c >> 8 << 8)]);
        }
    }
    for a in bits {
        let e = scalar_noise::exp(a);
        let bound = scalar_noise::bound(a);
        assert!(-scalar_noise::ln(e) <= bound, "bits {a:#x}: bound {bound} < -ln E {}", -scalar_noise::ln(e));
        assert!(bound as f64 >= -exp_of_bits64(a).ln(), "bits {a:#x}");
    }
    // Block bound: every E of a block is fl(e_min + F) >= e_min; over every exponent of e_min
    // with the mantissa edges, and sums just above it.
    let mut rng = TestRng::new(32);
    for e_min in exponent_edges(&mut rng) {
        // e_min = E(h1) / 256 lies in [2^-41, 0.09]; test a wider range, all normal.
        if !(1e-20..=1.0).contains(&e_min) {
            continue;
        }
        let g = scalar_noise::block_bound(e_min);
        let mut y = e_min;
        for step in 0..40 {
            assert!(-scalar_noise::ln(y) <= g, "e_min {e_min:e}, E {y:e}: bound {g} < -ln E");
            y = if step < 8 { f32::from_bits(y.to_bits() + 1) } else { y * 1.5 };
        }
        assert!(g as f64 >= -(e_min as f64).ln());
    }
}

/// E = 2^100 on token 64 and E (1 + 5e-4) on token 0 (equal logits): token 64's key is the
/// larger by 5e-4, but with ln 2 rounded up in the bound of E >= 4 the bound fell 1e-3 short of
/// it and token 64 was skipped on every level. The same with equal noise and logits 4e-4 apart.
#[test]
fn large_external_e_is_never_pruned_wrongly() {
    let vocab = 100;
    let big = 2f32.powi(100);
    let mut cases = Vec::new();
    let mut e = vec![big * 4.0; vocab];
    e[0] = big * (1.0 + 5e-4);
    e[64] = big;
    cases.push((vec![0.0f32; vocab], e));
    let mut x = vec![0.0f32; vocab];
    x[64] = 4e-4;
    let mut e = vec![big * 4.0; vocab];
    (e[0], e[64]) = (big, big);
    cases.push((x, e));
    // Every binade from E = 4 up, with the winner ahead by twice the near-tie tolerance, less
    // than the `1.06e-5 k - 1e-5` that ln 2 rounded up lost at E = 2^k.
    for k in 2..127 {
        let v = 2f32.powi(k);
        let mut e = vec![v * 1.5; vocab];
        e[3] = (v as f64 * (1.0 + 2.0 * rf::NEAR_TIE * (1.0 + k as f64 * std::f64::consts::LN_2))) as f32;
        e[70] = v;
        cases.push((vec![0.0f32; vocab], e));
    }
    for (x, e) in &cases {
        let r = race64_of(x, 1.0, |i| (e[i] as f64).ln());
        assert!(r.near.is_empty());
        let ln_e: Vec<f32> = e.iter().map(|&v| ((v as f64).ln()) as f32).collect();
        let reference = rf::draw(x, 1.0, 1e-5, rf::Noise::Exp(e), rf::Filters::OFF);
        assert_eq!(reference.token, r.token);
        each_level(|level| {
            let s = sampler(level, 1);
            for (noise, kind) in [(e, NoiseKind::Exp), (&ln_e, NoiseKind::LogExp)] {
                let b = Batch {
                    noise: Some(ExternalNoise { values: noise, kind, row_stride: 0 }),
                    ..batch_of(Logits::F32(x), 1, vocab, &[1.0])
                };
                let (tok, _) = draw(&s, &b);
                assert_eq!(tok[0] as usize, r.token, "{level:?} {kind:?}: E {:e} vs {:e}", e[0], e[r.token]);
            }
        });
    }
}

// ---------------------------------------------------------------------------------------------
// The block streams and the token stream: no coincidence may hold for every key.
// ---------------------------------------------------------------------------------------------

/// Every coincidence up to `vocab` of a token's hash with a block stream's hash, and of the two
/// block streams with each other, as (what, i, b): what 0 is token i = minimum of block b, 1 token
/// i = position of block b, 2 minimum of block i = position of block b.
fn coincidences(
    vocab: usize,
    token: impl Fn(u32) -> u32,
    block: impl Fn(u32) -> (u32, u32),
) -> std::collections::HashSet<(u8, u32, u32)> {
    let nb = (vocab / 256) as u32;
    let mut streams: Vec<(u32, u8, u32)> = Vec::with_capacity(2 * nb as usize);
    for b in 0..nb {
        let (h1, h2) = block(b);
        streams.push((h1, 0, b));
        streams.push((h2, 1, b));
    }
    streams.sort_unstable();
    // A filter of the top 24 bits, so that most tokens need one lookup.
    let mut filter = vec![0u64; 1 << 18];
    for &(h, _, _) in &streams {
        filter[(h >> 14) as usize] |= 1 << ((h >> 8) & 63);
    }
    let mut found = std::collections::HashSet::new();
    let mut look = |h: u32, i: u32, of_token: bool| {
        if filter[(h >> 14) as usize] & (1 << ((h >> 8) & 63)) == 0 {
            return;
        }
        let start = streams.partition_point(|s| s.0 < h);
        for &(g, what, b) in &streams[start..] {
            if g != h {
                break;
            }
            if of_token {
                found.insert((what, i, b));
            } else if what == 1 {
                found.insert((2, i, b));
            }
        }
    };
    for t in 0..vocab as u32 {
        look(token(t), t, true);
    }
    for b in 0..nb {
        look(block(b).0, b, false);
    }
    found
}

/// The structural check: coincidences of several keys up to vocab 2^24, none shared by two keys.
fn shared_coincidences(
    vocab: usize,
    keys: &[u64],
    token: impl Fn(u64, u32) -> u32,
    block: impl Fn(u64, u32) -> (u32, u32),
) -> (Vec<usize>, usize) {
    let sets: Vec<_> = keys.iter().map(|&k| coincidences(vocab, |t| token(k, t), |b| block(k, b))).collect();
    let mut shared = 0;
    for (i, a) in sets.iter().enumerate() {
        for b in &sets[i + 1..] {
            shared += a.intersection(b).count();
        }
    }
    (sets.iter().map(|s| s.len()).collect(), shared)
}

#[test]
fn block_streams_have_no_key_independent_coincidence() {
    let keys = [seeded_row_key(1, 0), seeded_row_key(2, 7), 0, u64::MAX];
    // The library's streams, up to 2^24. Chance coincidences of 32-bit values are expected (about
    // 2^24 x 2^17 / 2^32 = 512 per key), each one an event of probability 2^-32 in a row; none
    // may recur under another key (the chance of one is 2^-24).
    let (counts, shared) = shared_coincidences(1 << 24, &keys, scalar_noise::bits, |k, b| {
        let (h1, h2, _) = scalar_noise::block_bits(k, b);
        (h1, h2)
    });
    eprintln!("coincidences up to vocab 2^24 per key {counts:?}, shared by two keys: {shared}");
    assert_eq!(shared, 0, "coincidences that hold for several keys: {counts:?}");
    assert!(counts.iter().all(|&c| (300..800).contains(&c)), "not the count of chance coincidences: {counts:?}");
    // The same check finds the salted streams' coincidences (the derivation before the block
    // keys were mixes of the row key: 31 pairs below vocab 2^22, under every key).
    let salted = |k: u64, b: u32| {
        let (lo, hi) = rf::key_words(k);
        (rf::hash32(b, lo ^ 0x6d69_6e45, hi), rf::hash32(b, lo ^ 0x706f_734a, hi))
    };
    let (_, shared) = shared_coincidences(1 << 22, &keys[..2], |k, t| rf::token_bits(k, t as usize), salted);
    assert!(shared >= 31, "the check misses the salted streams' {shared} structural coincidences");
}

/// Under the salted block streams, token 606180's hash was the minimum's hash of block 2569 in
/// every row, and among it and block 2569's 256 tokens (equal logits) it was drawn at 0.00203
/// instead of 1/257. Its rate must be 1/257, and the same test must reject the salted streams.
#[test]
fn a_token_once_tied_to_a_block_is_drawn_at_its_rate() {
    let (t_star, b_star) = (606_180usize, 2569usize);
    let block: Vec<usize> = (b_star * 256..(b_star + 1) * 256).collect();
    let n = 200_000u64;
    let p = 1.0 / 257.0;
    let z_of = |hits: u64| (hits as f64 - n as f64 * p) / (n as f64 * p * (1.0 - p)).sqrt();
    // The winner of equal logits is the smallest E; `noise(key, b)` is (E_min, j_min) of block b
    // and `own(key, i)` token i's own E.
    let rate = |noise: &dyn Fn(u64, usize) -> (f64, u32), own: &dyn Fn(u64, usize) -> f64| {
        let mut hits = 0u64;
        for j in 0..n {
            let key = seeded_row_key(0x7ace, j);
            let e_of = |i: usize, (e_min, j_min): (f64, u32)| {
                if (i % 256) as u32 == j_min {
                    e_min
                } else {
                    e_min + own(key, i)
                }
            };
            let e_star = e_of(t_star, noise(key, t_star / 256));
            let nb = noise(key, b_star);
            hits += block.iter().all(|&i| e_of(i, nb) > e_star) as u64;
        }
        hits
    };
    let lib = rate(
        &|key, b| {
            let (h1, h2, _) = scalar_noise::block_bits(key, b as u32);
            (exp_of_bits64(h1) / 256.0, h2 >> 24)
        },
        &|key, i| exp_of_bits64(scalar_noise::bits(key, i as u32)),
    );
    let salted = rate(
        &|key, b| {
            let (lo, hi) = rf::key_words(key);
            let (h1, h2) = (rf::hash32(b as u32, lo ^ 0x6d69_6e45, hi), rf::hash32(b as u32, lo ^ 0x706f_734a, hi));
            (exp_of_bits64(h1) / 256.0, h2 >> 24)
        },
        &|key, i| exp_of_bits64(rf::token_bits(key, i)),
    );
    let (z, z_salted) = (z_of(lib), z_of(salted));
    eprintln!(
        "token {t_star} among 257 equal logits, {n} rows: rate {:.5} (z {z:.2}), salted streams {:.5} (z {z_salted:.1}), \
         exact {p:.5}",
        lib as f64 / n as f64,
        salted as f64 / n as f64
    );
    assert!(z.abs() < 5.0, "token {t_star} drawn at {} instead of 1/257 (z = {z})", lib as f64 / n as f64);
    assert!(z_salted < -5.0, "the test cannot tell the salted streams' bias (z = {z_salted})");
    // The library's race draws from exactly this noise: its token is the smallest E of the 257.
    let vocab = (b_star + 1) * 256;
    let mut x = vec![f32::NEG_INFINITY; vocab];
    for &i in block.iter().chain([&t_star]) {
        x[i] = 0.0;
    }
    each_level(|level| {
        let s = sampler(level, 1);
        for j in 0..24u64 {
            let key = seeded_row_key(0x7ace, j);
            let r = race64_of(&x, 1.0, |i| race_noise64(key, i).ln());
            let b =
                Batch { seeds: Some(&[0x7ace]), offsets: Some(&[j]), ..batch_of(Logits::F32(&x), 1, vocab, &[1.0]) };
            let tok = draw(&s, &b).0[0] as usize;
            assert!(tok == r.token || r.near.contains(&tok), "{level:?} row {j}: token {tok}, reference {}", r.token);
        }
    });
}

/// docs/semantics.md, "Resolution": the range of per-token noise and of a block minimum.
#[test]
fn the_documented_noise_range_holds() {
    let (lo, hi) = (scalar_noise::exp(u32::MAX) as f64, scalar_noise::exp(0) as f64);
    let (lo64, hi64) = (-(-(2f64.powi(-33))).ln_1p(), 33.0 * std::f64::consts::LN_2);
    assert!(((lo - lo64) / lo64).abs() < 6e-7 && ((hi - hi64) / hi64).abs() < 6e-7, "E from {lo:e} to {hi}");
    assert!((lo64 - 1.164e-10).abs() < 1e-13 && (hi64 - 22.87).abs() < 5e-3);
    // The extremes are the ends: E decreases with the bits (checked on a coarse grid and the ends).
    let mut prev = f64::INFINITY;
    for a in (0..=u32::MAX).step_by(65_521).chain([u32::MAX - 1, u32::MAX]) {
        let e = scalar_noise::exp(a) as f64;
        assert!(e <= prev && (lo..=hi).contains(&e), "E({a:#x}) = {e:e}");
        prev = e;
    }
    // Block minima: E / 256, from 4.55e-13 to 0.0894; a row's value never leaves [lo/256, hi + hi/256].
    assert!((lo64 / 256.0 - 4.55e-13).abs() < 1e-15 && (hi64 / 256.0 - 0.0894).abs() < 1e-4);
    let mut rng = TestRng::new(33);
    for _ in 0..20 {
        for e in scalar_noise::race_noise(rng.u64(), 4096) {
            let e = e as f64;
            assert!(e >= lo / 256.0 * (1.0 - 1e-6) && e <= (hi + hi / 256.0) * (1.0 + 1e-6), "{e:e}");
        }
    }
    // The never-drawn thresholds the document states.
    assert!(
        (lo64 / hi64 - 5.1e-12).abs() < 5e-14 && (lo64 / 256.0 / (hi64 * (1.0 + 1.0 / 256.0)) - 2.0e-14).abs() < 5e-16
    );
}

/// A row of +0 and -0 only is uniform: every level gives every token the logprob -ln(n), raw
/// and processed, whichever zero the SIMD maximum keeps (on AVX-512 the +0 values had weight 0
/// when the maximum came out as -0; found by fuzz/draw_c_abi).
#[test]
fn a_row_of_signed_zeros_is_uniform_at_every_level() {
    for vocab in [7usize, 256, 1000, 1569] {
        for pattern in 0..4 {
            let x: Vec<f32> = (0..vocab)
                .map(|i| {
                    let negative = match pattern {
                        0 => i % 2 == 0,
                        1 => i % 3 != 1,
                        2 => (i / 256) % 2 == 0,
                        _ => (i * 7919) % 5 < 3,
                    };
                    if negative {
                        -0.0
                    } else {
                        0.0
                    }
                })
                .collect();
            let want = -(vocab as f64).ln();
            each_level(|level| {
                let s = sampler(level, 3);
                for mode in [LogprobMode::Raw, LogprobMode::Processed] {
                    let (seeds, temps) = ([7u64], [1.0f32]);
                    let batch = Batch { seeds: Some(&seeds), ..batch_of(Logits::F32(&x), 1, vocab, &temps) };
                    let (mut tok, mut lp) = ([-1], [0f32]);
                    let mut out = Output { logprobs: Some(&mut lp), logprob_mode: mode, ..Output::new(&mut tok) };
                    s.draw(&batch, &mut out).unwrap();
                    assert!(
                        (lp[0] as f64 - want).abs() < 1e-5,
                        "{level:?} vocab {vocab} pattern {pattern} {mode:?}: logprob {} instead of {want}",
                        lp[0]
                    );
                }
            });
        }
    }
}
