//! The fused draw against float64 references, across every SIMD level this machine has.
mod common;

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
        for level in supported_levels() {
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
        }
    }
}

#[test]
fn race_matches_float64_reference_on_the_same_noise() {
    let mut rng = TestRng::new(4);
    let (mut compared, mut near_ties) = (0, 0);
    for level in supported_levels() {
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
                let (want, gap) = match kind {
                    NoiseKind::Exp => race_ref64(&x, t as f64, |i| (e[i] as f64).ln()),
                    NoiseKind::LogExp => race_ref64(&x, t as f64, |i| ln_e[i] as f64),
                };
                compared += 1;
                if gap < 1e-6 {
                    near_ties += 1;
                    continue;
                }
                assert_eq!(tok[0] as usize, want, "{level:?} vocab {vocab} T {t} {kind:?}: gap {gap}");
            }
        }
    }
    assert!(near_ties * 50 < compared, "{near_ties} near ties of {compared}: the test is not testing");
}

#[test]
fn inline_race_matches_float64_reference_of_its_noise() {
    let mut rng = TestRng::new(6);
    for level in supported_levels() {
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
            let (want, gap) = race_ref64(&x, t as f64, |i| race_noise64(key, i).ln());
            if gap >= 1e-6 {
                assert_eq!(tok[0] as usize, want, "{level:?} vocab {vocab} T {t}");
            }
        }
    }
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
    for level in supported_levels() {
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
    }
}

#[test]
fn external_noise_frequencies_match_softmax() {
    let x: Vec<f32> = vec![0.3, 1.2, f32::NEG_INFINITY, -0.7, 2.2, 0.0, 1.9, -2.0];
    let mut rng = TestRng::new(8);
    for level in supported_levels() {
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
    }
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
    for level in supported_levels() {
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
    }
}

#[test]
fn non_finite_logits_follow_the_rules() {
    for level in supported_levels() {
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
    }
}

#[test]
fn tiny_and_huge_temperatures_stay_exact() {
    let x: Vec<f32> = vec![1.0, 1.0 + 1e-6, 0.5, -3.0];
    for level in supported_levels() {
        let s = Sampler::new(Config { greedy_below: 0.0, ..common::sampler(level, 1).config().clone() }).unwrap();
        for t in [1e-30f32, f32::MIN_POSITIVE, 1e-38] {
            let (tok, _) = draw(&s, &batch_of(Logits::F32(&x), 1, 4, &[t]));
            assert_eq!(tok[0], 1, "{level:?} T {t}: the race at a tiny T is the argmax");
        }
        let (tok, _) = draw(&s, &batch_of(Logits::F32(&x), 1, 4, &[1e30]));
        assert!((0..4).contains(&tok[0]));
    }
}

#[test]
fn seeded_rows_do_not_depend_on_the_rest_of_the_batch() {
    let mut rng = TestRng::new(10);
    let vocab = 3000;
    let target = peaked_logits(&mut rng, vocab, 2.0, 6.0);
    let mut reference = None;
    for level in supported_levels() {
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
    }
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
    for level in supported_levels() {
        assert_eq!(run(level), first, "{level:?}");
    }
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
        for level in supported_levels() {
            for threads in [1usize, 2, 3, 4, 7] {
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
                    Some(e) => assert_eq!(&got, e, "{level:?}, {threads} threads, {rows} x {vocab}"),
                }
            }
        }
    }
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
    for level in supported_levels() {
        let run = |l: Logits| {
            let s = sampler(level, 4);
            let b = Batch { seeds: Some(&seeds), seeded: Some(&seeded), ..batch_of(l, rows, vocab, &temps) };
            (draw(&s, &b), draw(&s, &b))
        };
        assert_eq!(run(Logits::Bf16(&b16)), run(Logits::F32(&via_b16)), "{level:?} bf16");
        assert_eq!(run(Logits::F16(&h16)), run(Logits::F32(&via_h16)), "{level:?} f16");
    }
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

/// T up to FLT_MAX with logits near the ends of the f32 range (issue 8, item 9): every finite
/// logit within FLT_MAX of the row's maximum takes part at its float64 rate; one further below
/// (its `x - m` is not an f32) is masked, as docs/semantics.md says.
#[test]
fn logits_at_the_ends_of_the_f32_range_at_the_largest_temperature() {
    let t = f32::MAX;
    let (rows, calls) = (4096usize, 5);
    // (row, the float64 probability of token 1).
    let d = (-0.3e38f64 - 3.0e38) / f32::MAX as f64; // about -0.97: a span just below FLT_MAX
    let cases = [([3.0e38f32, -0.3e38], d.exp() / (1.0 + d.exp())), ([3.0e38f32, -3.0e38], 0.0)];
    for level in supported_levels() {
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
    }
}
