//! Vocabulary-sharded sampling (`Sampler::shard_top`, `shard_combine_top`, `Sampler::shard_race`,
//! `shard_finish`) against the unsharded draw of the whole rows: the same tokens and flags, bit
//! for bit, at 1 to 8 ranks with uneven slices, on every SIMD level and thread count.
mod common;

use common::*;
use tokenrace::*;

/// The settings of a call's rows.
struct Settings {
    temps: Vec<f32>,
    seeds: Vec<u64>,
    seeded: Vec<u8>,
    min_p: Vec<f32>,
}

impl Settings {
    fn random(rng: &mut TestRng, rows: usize) -> Settings {
        let temps = (0..rows).map(|_| [0.0, 0.3, 0.7, 1.0, 1.0, 1.6][rng.below(6)]).collect();
        let seeds = (0..rows).map(|_| rng.u64()).collect();
        let seeded = (0..rows).map(|_| rng.below(2) as u8).collect();
        let min_p = (0..rows).map(|_| [0.0, 0.0, 0.05, 0.3][rng.below(4)]).collect();
        Settings { temps, seeds, seeded, min_p }
    }
}

/// The unsharded draw of `rows` rows of `x` (each `vocab` long).
fn whole(s: &Sampler, x: &[f32], rows: usize, vocab: usize, st: &Settings) -> (Vec<i32>, Vec<u32>) {
    let b = Batch {
        temperature: Some(&st.temps),
        seeds: Some(&st.seeds),
        seeded: Some(&st.seeded),
        min_p: Some(&st.min_p),
        ..Batch::new(Logits::F32(x), rows, vocab)
    };
    draw(s, &b)
}

/// Rank `q`'s rows: tokens `[cuts[q], cuts[q + 1])` of every row of `x`, read in place (a row
/// stride of `vocab`).
fn rank_rows<'a>(x: &'a [f32], rows: usize, vocab: usize, cuts: &[usize], q: usize, st: &'a Settings) -> ShardRows<'a> {
    let (start, end) = (cuts[q], cuts[q + 1]);
    ShardRows {
        row_stride: vocab,
        temperature: Some(&st.temps),
        seeds: Some(&st.seeds),
        seeded: Some(&st.seeded),
        min_p: Some(&st.min_p),
        step: ShardStep::default(),
        ..ShardRows::new(&x[start..], rows, start, end - start, vocab)
    }
}

/// The sharded draw: rank q on `ranks[q]`, with the slices `cuts`; the partials combined with
/// the ranks in `order`.
fn sharded(
    ranks: &[Sampler],
    x: &[f32],
    rows: usize,
    vocab: usize,
    cuts: &[usize],
    order: &[usize],
    st: &Settings,
) -> (Vec<i32>, Vec<u32>) {
    let n = ranks.len();
    let tops: Vec<Vec<ShardPartial>> = (0..n)
        .map(|q| {
            let mut p = vec![ShardPartial::default(); rows];
            ranks[q].shard_top(&rank_rows(x, rows, vocab, cuts, q, st), &mut p).unwrap();
            p
        })
        .collect();
    let gathered: Vec<&[ShardPartial]> = order.iter().map(|&q| &tops[q][..]).collect();
    let mut combined = vec![ShardRow::default(); rows];
    shard_combine_top(&gathered, &mut combined).unwrap();
    let races: Vec<Vec<ShardPartial>> = (0..n)
        .map(|q| {
            let mut p = vec![ShardPartial::default(); rows];
            ranks[q].shard_race(&rank_rows(x, rows, vocab, cuts, q, st), &combined, &mut p).unwrap();
            p
        })
        .collect();
    let gathered: Vec<&[ShardPartial]> = order.iter().rev().map(|&q| &races[q][..]).collect();
    let (mut tokens, mut fl) = (vec![-7; rows], vec![0; rows]);
    shard_finish(&combined, &gathered, &mut tokens, Some(&mut fl)).unwrap();
    (tokens, fl)
}

/// `n` uneven slices of `[0, vocab)`: cut points at random, some on block boundaries, each
/// slice at least one token.
fn random_cuts(rng: &mut TestRng, vocab: usize, n: usize) -> Vec<usize> {
    loop {
        let mut cuts: Vec<usize> = (1..n)
            .map(|_| {
                if rng.below(3) == 0 {
                    (rng.below(vocab / 256 + 1) * 256).clamp(1, vocab - 1)
                } else {
                    1 + rng.below(vocab - 1)
                }
            })
            .collect();
        cuts.push(0);
        cuts.push(vocab);
        cuts.sort_unstable();
        cuts.dedup();
        if cuts.len() == n + 1 {
            return cuts;
        }
    }
}

fn shuffled(rng: &mut TestRng, n: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        order.swap(i, rng.below(i + 1));
    }
    order
}

fn with_threads(level: SimdLevel, seed: u64, threads: usize) -> Sampler {
    Sampler::new(Config { threads, ..sampler(level, seed).config().clone() }).unwrap()
}

#[test]
fn sharded_draws_equal_the_unsharded_draw_bit_for_bit() {
    each_level(|level| {
        for threads in [1, 4] {
            let mut rng = TestRng::new(17 + threads as u64);
            for ranks in 1..=8 {
                for vocab in [1000, 2 * 256 + 37, 4096] {
                    let rows = 12;
                    let x: Vec<f32> = (0..rows)
                        .flat_map(|_| {
                            let d = pick_dist(&mut rng);
                            gen_row(&mut rng, d, vocab)
                        })
                        .collect();
                    let cuts = random_cuts(&mut rng, vocab, ranks);
                    let order = shuffled(&mut rng, ranks);
                    let seed = rng.u64();
                    let plain = with_threads(level, seed, threads);
                    let shards: Vec<Sampler> = (0..ranks).map(|_| with_threads(level, seed, threads)).collect();
                    // Two calls: the second shows that the first advanced every stream alike.
                    for call in 0..2 {
                        let st = Settings::random(&mut rng, rows);
                        let want = whole(&plain, &x, rows, vocab, &st);
                        let got = sharded(&shards, &x, rows, vocab, &cuts, &order, &st);
                        assert_eq!(
                            got, want,
                            "{level:?} threads {threads} ranks {ranks} vocab {vocab} cuts {cuts:?} call {call}"
                        );
                    }
                }
            }
        }
    });
}

#[test]
fn every_kind_of_row_in_every_slice() {
    // Every distribution (NaN, +inf, empty, masked, ties) in every row, at slices cut inside
    // one block and at the row's ragged end.
    each_level(|level| {
        let mut rng = TestRng::new(5);
        let vocab = 777;
        for dist in DISTS {
            for cuts in [
                vec![0, 777],
                vec![0, 3, 777],
                vec![0, 100, 200, 777],
                vec![0, 256, 512, 776, 777],
                vec![0, 1, 2, 3, 700, 777],
            ] {
                let rows = 8;
                let x: Vec<f32> = (0..rows).flat_map(|_| gen_row(&mut rng, dist, vocab)).collect();
                let st = Settings::random(&mut rng, rows);
                let n = cuts.len() - 1;
                let shards: Vec<Sampler> = (0..n).map(|_| sampler(level, 3)).collect();
                let order = shuffled(&mut rng, n);
                let want = whole(&sampler(level, 3), &x, rows, vocab, &st);
                assert_eq!(sharded(&shards, &x, rows, vocab, &cuts, &order, &st), want, "{level:?} {dist:?} {cuts:?}");
            }
        }
    });
}

#[test]
fn ties_at_the_maximum_go_to_the_lowest_global_id_across_ranks() {
    let vocab = 600;
    let mut x = vec![-1.0f32; vocab];
    for i in [450, 310, 599] {
        x[i] = 2.0;
    }
    x[300] = -0.0; // a -0 in a rank whose maximum is lower does not matter
    let st = Settings { temps: vec![0.0], seeds: vec![0], seeded: vec![0], min_p: vec![0.0] };
    let shards: Vec<Sampler> = (0..3).map(|_| sampler(SimdLevel::Scalar, 1)).collect();
    let (t, f) = sharded(&shards, &x, 1, vocab, &[0, 305, 451, 600], &[2, 0, 1], &st);
    assert_eq!((t[0], f[0]), (310, flags::GREEDY));
    // Zeros of both signs at the maximum: the lowest id of either.
    let mut z = vec![f32::NEG_INFINITY; vocab];
    z[500] = 0.0;
    z[20] = -0.0;
    let (t, _) = sharded(&shards, &z, 1, vocab, &[0, 305, 451, 600], &[1, 2, 0], &st);
    assert_eq!(t[0], 20);
}

/// Chi-square of the sharded draw's counts against `p` over its support.
fn chi_square(counts: &[u64], p: &[f64]) -> f64 {
    let n: u64 = counts.iter().sum();
    counts
        .iter()
        .zip(p)
        .filter(|(_, &p)| p > 0.0)
        .map(|(&c, &p)| (c as f64 - n as f64 * p).powi(2) / (n as f64 * p))
        .sum()
}

#[test]
fn unseeded_sharded_draws_follow_the_softmax() {
    // A few heavy tokens spread over three ranks (one slice cut inside a block), unseeded rows:
    // the counts follow softmax(x / T); the same counts reject the softmax at another temperature.
    let (vocab, t) = (700usize, 0.8f32);
    let mut x = vec![f32::NEG_INFINITY; vocab];
    let heavy = [(5usize, 1.0f32), (255, 0.2), (256, 0.9), (300, -0.5), (511, 0.0), (699, 0.4)];
    for &(i, v) in &heavy {
        x[i] = v;
    }
    let rows = 500;
    let xs: Vec<f32> = (0..rows).flat_map(|_| x.iter().copied()).collect();
    let st = Settings { temps: vec![t; rows], seeds: vec![0; rows], seeded: vec![0; rows], min_p: vec![0.0; rows] };
    let shards: Vec<Sampler> = (0..3).map(|_| sampler(best_level(), 99)).collect();
    let mut counts = vec![0u64; heavy.len()];
    for _ in 0..40 {
        let (tokens, _) = sharded(&shards, &xs, rows, vocab, &[0, 255, 400, 700], &[1, 0, 2], &st);
        for tok in tokens {
            counts[heavy.iter().position(|&(i, _)| i == tok as usize).unwrap()] += 1;
        }
    }
    let softmax = |t: f64| {
        let w: Vec<f64> = heavy.iter().map(|&(_, v)| (v as f64 / t).exp()).collect();
        let s: f64 = w.iter().sum();
        w.iter().map(|w| w / s).collect::<Vec<f64>>()
    };
    // 5 degrees of freedom: 20.5 is the 0.999 quantile.
    let fit = chi_square(&counts, &softmax(t as f64));
    assert!(fit < 20.5, "chi-square {fit} for {counts:?}");
    let wrong = chi_square(&counts, &softmax(1.2 * t as f64));
    assert!(wrong > 20.5, "the test cannot tell T from 1.2 T: chi-square {wrong}");
}

#[test]
fn a_sharded_call_advances_the_key_stream_as_the_unsharded_draw() {
    // Alternating sharded and unsharded calls on one sampler per rank gives the tokens of a
    // sampler that only draws whole rows.
    let (vocab, rows) = (900, 6);
    let mut rng = TestRng::new(8);
    let plain = sampler(SimdLevel::Scalar, 4);
    let shards: Vec<Sampler> = (0..2).map(|_| sampler(SimdLevel::Scalar, 4)).collect();
    for call in 0..6 {
        let x: Vec<f32> = (0..rows).flat_map(|_| gen_row(&mut rng, Dist::Normal3, vocab)).collect();
        let st = Settings { seeded: vec![0; rows], ..Settings::random(&mut rng, rows) };
        let want = whole(&plain, &x, rows, vocab, &st);
        let got = if call % 2 == 0 {
            sharded(&shards, &x, rows, vocab, &[0, 450, 900], &[0, 1], &st)
        } else {
            let got = whole(&shards[0], &x, rows, vocab, &st);
            assert_eq!(whole(&shards[1], &x, rows, vocab, &st), got);
            got
        };
        assert_eq!(got, want, "call {call}");
    }
}

#[test]
fn bad_input_is_refused_naming_it_and_writes_nothing() {
    let (vocab, rows) = (600, 2);
    let x: Vec<f32> = (0..rows * vocab).map(|i| (i % 97) as f32 * 0.01).collect();
    let s = sampler(SimdLevel::Scalar, 2);
    let twin = sampler(SimdLevel::Scalar, 2);
    let sentinel = ShardPartial { token: 1234, ..ShardPartial::default() };
    let mut out = vec![sentinel; rows];
    // A slice past the row's end: refused, nothing written, no key taken.
    let past = ShardRows { row_stride: vocab, ..ShardRows::new(&x[500..], rows, 500, 200, vocab) };
    let err = s.shard_top(&past, &mut out).unwrap_err();
    assert!(err.message.contains("rows.vocab_start") && err.message.contains("[500, 500 + 200)"), "{}", err.message);
    assert_eq!(out, vec![sentinel; rows]);
    let err = s.shard_top(&ShardRows::new(&x, rows, 0, 0, vocab), &mut out).unwrap_err();
    assert!(err.message.contains("rows.slice_len"), "{}", err.message);
    let bad_t = [1.0, f32::NAN];
    let err = s
        .shard_top(&ShardRows { temperature: Some(&bad_t), ..ShardRows::new(&x, rows, 0, vocab, vocab) }, &mut out)
        .unwrap_err();
    assert!(err.message.contains("rows.temperature[1]"), "{}", err.message);
    assert_eq!(out, vec![sentinel; rows]);
    let a = ShardRows { row_stride: vocab, ..ShardRows::new(&x, rows, 0, 300, vocab) };
    let b = ShardRows { row_stride: vocab, ..ShardRows::new(&x[300..], rows, 300, 300, vocab) };
    let (mut pa, mut pb, mut pt) = (vec![sentinel; rows], vec![sentinel; rows], vec![sentinel; rows]);
    s.shard_top(&a, &mut pa).unwrap();
    twin.shard_top(&b, &mut pb).unwrap();
    // The refusals above took no key: the twin that never saw them agrees.
    assert_eq!(pa[0].key, pb[0].key);
    let mut combined = vec![ShardRow::default(); rows];
    let untouched = combined.clone();
    // Overlapping and missing slices.
    let err = shard_combine_top(&[&pa, &pa], &mut combined).unwrap_err();
    assert!(err.message.contains("overlaps") && err.message.contains("rank 1, row 0"), "{}", err.message);
    let err = shard_combine_top(&[&pa], &mut combined).unwrap_err();
    assert!(err.message.contains("cover [0, 300)"), "{}", err.message);
    // Partials of different rows, and of another call (its keys differ).
    let swapped = [pb[1], pb[0]];
    let err = shard_combine_top(&[&pa, &swapped], &mut combined).unwrap_err();
    assert!(err.message.contains("fingerprint") && err.message.contains("rank 1, row 0"), "{}", err.message);
    twin.shard_top(&b, &mut pt).unwrap();
    let err = shard_combine_top(&[&pa, &pt], &mut combined).unwrap_err();
    assert!(err.message.contains("key"), "{}", err.message);
    assert_eq!(combined, untouched);
    shard_combine_top(&[&pb, &pa], &mut combined).unwrap();
    // Round 1 partials where round 2's belong; a race over rows of other settings.
    let (mut tokens, mut fl) = (vec![-5; rows], vec![9; rows]);
    let err = shard_finish(&combined, &[&pa, &pb], &mut tokens, Some(&mut fl)).unwrap_err();
    assert!(err.message.contains("round 1, not 2"), "{}", err.message);
    let err = shard_finish(&combined, &[], &mut tokens, None).unwrap_err();
    assert!(err.message.contains("row 0 races"), "{}", err.message);
    let hot = [0.5, 1.0];
    let err = s.shard_race(&ShardRows { temperature: Some(&hot), ..a }, &combined, &mut pa).unwrap_err();
    assert!(err.message.contains("combined[0]") && err.message.contains("fingerprint"), "{}", err.message);
    assert_eq!((tokens, fl), (vec![-5; rows], vec![9; rows]));
    // A sampler with a pool is refused (sharded rows use inline noise).
    let pooled =
        Sampler::new(Config { noise: NoiseSource::Pool, vocab_size: vocab, max_rows: 4, ..Config::default() }).unwrap();
    let err = pooled.shard_top(&a, &mut out).unwrap_err();
    assert!(err.message.contains("pool"), "{}", err.message);
}

mod c_abi {
    //! The same calls through the C functions: the same tokens as the unsharded draw, the
    //! records' layout, and a refused call that writes nothing.
    use super::*;
    use std::mem::{offset_of, size_of};
    use tokenrace::internals::api::*;
    use tokenrace::internals::types::tokenrace_status;

    fn c_sampler(seed: u64) -> *mut tokenrace_sampler {
        let mut cfg = tokenrace_config_default();
        cfg.seed = seed;
        cfg.has_seed = 1;
        cfg.max_rows = 64;
        let mut s = std::ptr::null_mut();
        // SAFETY: a valid config and out pointer.
        assert_eq!(unsafe { tokenrace_sampler_new(&cfg, &mut s) }, tokenrace_status::Ok, "{}", last_error());
        s
    }

    fn c_rows(
        x: &[f32],
        rows: usize,
        vocab: usize,
        (start, end): (usize, usize),
        st: &Settings,
    ) -> tokenrace_shard_rows {
        tokenrace_shard_rows {
            struct_size: size_of::<tokenrace_shard_rows>() as u32,
            reserved0: 0,
            logits: x[start..].as_ptr(),
            rows,
            row_stride: vocab,
            vocab_start: start,
            slice_len: end - start,
            vocab_size: vocab,
            temperature: st.temps.as_ptr(),
            seeds: st.seeds.as_ptr(),
            offsets: std::ptr::null(),
            seeded: st.seeded.as_ptr(),
            min_p: st.min_p.as_ptr(),
            top_k: std::ptr::null(),
            top_p: std::ptr::null(),
            // SAFETY: the step's fields are pointers and integers: zero is NULL (no step).
            ..unsafe { std::mem::zeroed() }
        }
    }

    #[test]
    #[allow(clippy::needless_range_loop)] // ranks index several arrays
    fn c_filtered_sharded_draws_equal_the_unsharded_draw() {
        // top-k candidates, the cut's rounds and the race with its floors through the C calls.
        let mut rng = TestRng::new(37);
        let (vocab, rows) = (3000, 12);
        for ranks in [1, 2, 4, 7] {
            let x: Vec<f32> = (0..rows)
                .flat_map(|_| {
                    let d = pick_dist(&mut rng);
                    gen_row(&mut rng, d, vocab)
                })
                .collect();
            let st = Settings::random(&mut rng, rows);
            let f = Filters::random(&mut rng, rows, vocab);
            let cuts = random_cuts(&mut rng, vocab, ranks);
            let base = Sampler::new(Config { seed: Some(12), max_rows: 64, ..Config::default() }).unwrap();
            let want = whole_filtered(&base, &x, rows, vocab, &st, &f);
            let samplers: Vec<_> = (0..ranks).map(|_| c_sampler(12)).collect();
            let rows_of = |q: usize| tokenrace_shard_rows {
                top_k: f.top_k.as_ptr(),
                top_p: f.top_p.as_ptr(),
                ..c_rows(&x, rows, vocab, (cuts[q], cuts[q + 1]), &st)
            };
            let ok = |status: tokenrace_status| assert_eq!(status, tokenrace_status::Ok, "{}", last_error());
            let width = vocab / 2;
            let mut tops = vec![tokenrace_shard_partial::default(); ranks * rows];
            let mut cands = vec![0f32; ranks * rows * width];
            for q in 0..ranks {
                // SAFETY: valid structs, outputs of the sizes the calls write.
                unsafe {
                    ok(tokenrace_shard_top(samplers[q], &rows_of(q), tops[q * rows..].as_mut_ptr()));
                    ok(tokenrace_shard_top_k_candidates(
                        &rows_of(q),
                        width as u32,
                        cands[q * rows * width..].as_mut_ptr(),
                    ));
                }
            }
            let mut combined = vec![tokenrace_shard_row::default(); rows];
            // SAFETY: as above.
            ok(unsafe { tokenrace_shard_combine_top(tops.as_ptr(), ranks as u32, rows as u32, combined.as_mut_ptr()) });
            let mut state = vec![tokenrace_shard_cut::default(); rows];
            // SAFETY: as above.
            ok(unsafe {
                tokenrace_shard_cut_start(
                    samplers[0],
                    &rows_of(0),
                    combined.as_ptr(),
                    cands.as_ptr(),
                    ranks as u32,
                    width as u32,
                    state.as_mut_ptr(),
                )
            });
            let mut rounds = 0;
            loop {
                let mut pending = 7u32;
                // SAFETY: as above.
                ok(unsafe { tokenrace_shard_cut_pending(state.as_ptr(), rows as u32, &mut pending) });
                if pending == 0 {
                    break;
                }
                rounds += 1;
                assert!(rounds <= 8);
                let mut masses: Vec<tokenrace_shard_mass> = Vec::with_capacity(ranks * rows);
                for q in 0..ranks {
                    let mut m = vec![
                        tokenrace_shard_mass {
                            head: Default::default(),
                            mass: [0.0; 64],
                            count: [0; 64],
                            low: [0.0; 64],
                            high: [0.0; 64]
                        };
                        rows
                    ];
                    // SAFETY: as above.
                    ok(unsafe { tokenrace_shard_cut_round(samplers[q], &rows_of(q), state.as_ptr(), m.as_mut_ptr()) });
                    masses.extend(m);
                }
                // SAFETY: as above.
                ok(unsafe {
                    tokenrace_shard_cut_advance(state.as_mut_ptr(), rows as u32, masses.as_ptr(), ranks as u32)
                });
            }
            let mut races = vec![tokenrace_shard_partial::default(); ranks * rows];
            for q in 0..ranks {
                // SAFETY: as above.
                ok(unsafe {
                    tokenrace_shard_race_cut(
                        samplers[q],
                        &rows_of(q),
                        combined.as_ptr(),
                        state.as_ptr(),
                        races[q * rows..].as_mut_ptr(),
                    )
                });
            }
            let (mut tokens, mut fl) = (vec![-1; rows], vec![0u32; rows]);
            // SAFETY: as above.
            ok(unsafe {
                tokenrace_shard_finish(
                    combined.as_ptr(),
                    rows as u32,
                    races.as_ptr(),
                    ranks as u32,
                    tokens.as_mut_ptr(),
                    fl.as_mut_ptr(),
                )
            });
            assert_eq!((tokens, fl), want, "ranks {ranks} cuts {cuts:?}");
            for s in samplers {
                // SAFETY: made above, freed once.
                unsafe { tokenrace_sampler_free(s) };
            }
        }
    }

    #[test]
    fn the_records_are_laid_out_as_the_header_says() {
        assert_eq!(size_of::<tokenrace_shard_partial>(), 40);
        assert_eq!(offset_of!(tokenrace_shard_partial, fingerprint), 16);
        assert_eq!(offset_of!(tokenrace_shard_partial, vocab_size), 28);
        assert_eq!(offset_of!(tokenrace_shard_partial, key), 32);
        assert_eq!(size_of::<tokenrace_shard_row>(), 24);
        assert_eq!(offset_of!(tokenrace_shard_row, key), 16);
        // Every field where the header puts it: the 0.2 fields, then the step's block (8 bytes
        // each, from 112), appended so that a 0.2 caller's struct_size of 112 reads no step.
        let layout = [
            (offset_of!(tokenrace_shard_rows, struct_size), 0),
            (offset_of!(tokenrace_shard_rows, reserved0), 4),
            (offset_of!(tokenrace_shard_rows, logits), 8),
            (offset_of!(tokenrace_shard_rows, rows), 16),
            (offset_of!(tokenrace_shard_rows, row_stride), 24),
            (offset_of!(tokenrace_shard_rows, vocab_start), 32),
            (offset_of!(tokenrace_shard_rows, slice_len), 40),
            (offset_of!(tokenrace_shard_rows, vocab_size), 48),
            (offset_of!(tokenrace_shard_rows, temperature), 56),
            (offset_of!(tokenrace_shard_rows, seeds), 64),
            (offset_of!(tokenrace_shard_rows, offsets), 72),
            (offset_of!(tokenrace_shard_rows, seeded), 80),
            (offset_of!(tokenrace_shard_rows, min_p), 88),
            (offset_of!(tokenrace_shard_rows, top_k), 96),
            (offset_of!(tokenrace_shard_rows, top_p), 104),
            (offset_of!(tokenrace_shard_rows, prompt_ids), 112),
            (offset_of!(tokenrace_shard_rows, prompt_offsets), 120),
            (offset_of!(tokenrace_shard_rows, output_ids), 128),
            (offset_of!(tokenrace_shard_rows, output_offsets), 136),
            (offset_of!(tokenrace_shard_rows, repetition_penalty), 144),
            (offset_of!(tokenrace_shard_rows, frequency_penalty), 152),
            (offset_of!(tokenrace_shard_rows, presence_penalty), 160),
            (offset_of!(tokenrace_shard_rows, bias_ids), 168),
            (offset_of!(tokenrace_shard_rows, bias_values), 176),
            (offset_of!(tokenrace_shard_rows, bias_offsets), 184),
            (offset_of!(tokenrace_shard_rows, allowed_ids), 192),
            (offset_of!(tokenrace_shard_rows, allowed_offsets), 200),
            (offset_of!(tokenrace_shard_rows, allowed_rows), 208),
            (offset_of!(tokenrace_shard_rows, banned_ids), 216),
            (offset_of!(tokenrace_shard_rows, banned_offsets), 224),
            (offset_of!(tokenrace_shard_rows, token_bitmask), 232),
            (offset_of!(tokenrace_shard_rows, bitmask_row_stride), 240),
            (offset_of!(tokenrace_shard_rows, penalty_last_n), 248),
            (offset_of!(tokenrace_shard_rows, min_tokens), 256),
            (offset_of!(tokenrace_shard_rows, stop_ids), 264),
            (offset_of!(tokenrace_shard_rows, stop_offsets), 272),
            (offset_of!(tokenrace_shard_rows, bad_words_ids), 280),
            (offset_of!(tokenrace_shard_rows, bad_word_offsets), 288),
            (offset_of!(tokenrace_shard_rows, bad_words_row_offsets), 296),
            (offset_of!(tokenrace_shard_rows, dry_multiplier), 304),
            (offset_of!(tokenrace_shard_rows, dry_base), 312),
            (offset_of!(tokenrace_shard_rows, dry_allowed_length), 320),
            (offset_of!(tokenrace_shard_rows, dry_penalty_last_n), 328),
            (offset_of!(tokenrace_shard_rows, dry_breaker_ids), 336),
            (offset_of!(tokenrace_shard_rows, dry_breaker_offsets), 344),
            (offset_of!(tokenrace_shard_rows, dry_breakers_row_offsets), 352),
        ];
        for (i, (at, want)) in layout.iter().enumerate() {
            assert_eq!(at, want, "field {i} of tokenrace_shard_rows");
        }
        assert_eq!(size_of::<tokenrace_shard_rows>(), 360);
        assert_eq!(size_of::<tokenrace_shard_cut>(), 56);
        assert_eq!(offset_of!(tokenrace_shard_cut, above), 40);
        assert_eq!(size_of::<tokenrace_shard_mass>(), 1320);
        assert_eq!(offset_of!(tokenrace_shard_mass, mass), 40);
        assert_eq!(offset_of!(tokenrace_shard_mass, count), 552);
        assert_eq!(offset_of!(tokenrace_shard_mass, low), 808);
        assert_eq!(offset_of!(tokenrace_shard_mass, high), 1064);
    }

    /// `base` with the step of `inputs` in its step block (the same whole arrays on every rank).
    fn with_c_step(base: tokenrace_shard_rows, inputs: &StepInputs) -> tokenrace_shard_rows {
        tokenrace_shard_rows {
            prompt_ids: inputs.prompt.0.as_ptr(),
            prompt_offsets: inputs.prompt.1.as_ptr(),
            output_ids: inputs.output.0.as_ptr(),
            output_offsets: inputs.output.1.as_ptr(),
            repetition_penalty: inputs.repetition.as_ptr(),
            frequency_penalty: inputs.frequency.as_ptr(),
            presence_penalty: inputs.presence.as_ptr(),
            penalty_last_n: inputs.last_n.as_ptr(),
            bias_ids: inputs.bias.0.as_ptr(),
            bias_values: inputs.bias.1.as_ptr(),
            bias_offsets: inputs.bias.2.as_ptr(),
            allowed_ids: inputs.allowed.0.as_ptr(),
            allowed_offsets: inputs.allowed.1.as_ptr(),
            allowed_rows: inputs.allowed_rows.as_ptr(),
            banned_ids: inputs.banned.0.as_ptr(),
            banned_offsets: inputs.banned.1.as_ptr(),
            token_bitmask: inputs.bitmask.as_ptr(),
            bitmask_row_stride: 0,
            min_tokens: inputs.min_tokens.as_ptr(),
            stop_ids: inputs.stops.0.as_ptr(),
            stop_offsets: inputs.stops.1.as_ptr(),
            bad_words_ids: inputs.bad_words.0.as_ptr(),
            bad_word_offsets: inputs.bad_words.1.as_ptr(),
            bad_words_row_offsets: inputs.bad_words.2.as_ptr(),
            dry_multiplier: inputs.dry_multiplier.as_ptr(),
            ..base
        }
    }

    /// Both rounds of `rows_of(q)` for every rank through the C calls: the tokens and flags.
    fn c_two_rounds(
        samplers: &[*mut tokenrace_sampler],
        rows: usize,
        rows_of: impl Fn(usize) -> tokenrace_shard_rows,
    ) -> std::result::Result<(Vec<i32>, Vec<u32>), String> {
        let ranks = samplers.len();
        let ok = |status: tokenrace_status| if status == tokenrace_status::Ok { Ok(()) } else { Err(last_error()) };
        let mut gathered = vec![tokenrace_shard_partial::default(); ranks * rows];
        for (q, &s) in samplers.iter().enumerate() {
            // SAFETY: valid structs, `rows` records of output.
            ok(unsafe { tokenrace_shard_top(s, &rows_of(q), gathered[q * rows..].as_mut_ptr()) })?;
        }
        let mut combined = vec![tokenrace_shard_row::default(); rows];
        // SAFETY: `ranks * rows` records in, `rows` out.
        ok(unsafe {
            tokenrace_shard_combine_top(gathered.as_ptr(), ranks as u32, rows as u32, combined.as_mut_ptr())
        })?;
        for (q, &s) in samplers.iter().enumerate() {
            // SAFETY: as above.
            ok(unsafe { tokenrace_shard_race(s, &rows_of(q), combined.as_ptr(), gathered[q * rows..].as_mut_ptr()) })?;
        }
        let (mut tokens, mut fl) = (vec![-1; rows], vec![0u32; rows]);
        // SAFETY: as above.
        ok(unsafe {
            tokenrace_shard_finish(
                combined.as_ptr(),
                rows as u32,
                gathered.as_ptr(),
                ranks as u32,
                tokens.as_mut_ptr(),
                fl.as_mut_ptr(),
            )
        })?;
        Ok((tokens, fl))
    }

    #[test]
    fn c_rows_with_a_step_equal_the_unsharded_draw_and_a_0_2_struct_reads_none() {
        // The step block read through the C struct: the unsharded draw with the step; a caller
        // whose struct_size ends at 112 (0.2) gets no step (the unsharded draw without it); a bad
        // entry is refused naming its field as rows.FIELD[ROW], nothing written.
        let mut rng = TestRng::new(33);
        let (vocab, rows) = (1300, 10);
        for ranks in [1, 2, 4] {
            let x: Vec<f32> = (0..rows)
                .flat_map(|_| {
                    let d = pick_dist(&mut rng);
                    gen_row(&mut rng, d, vocab)
                })
                .collect();
            let st = Settings::random(&mut rng, rows);
            let inputs = StepInputs::random(&mut rng, rows, vocab);
            let cuts = random_cuts(&mut rng, vocab, ranks);
            let base = Sampler::new(Config { seed: Some(12), max_rows: 64, ..Config::default() }).unwrap();
            let plain = Batch {
                temperature: Some(&st.temps),
                seeds: Some(&st.seeds),
                seeded: Some(&st.seeded),
                min_p: Some(&st.min_p),
                ..Batch::new(Logits::F32(&x), rows, vocab)
            };
            let want = draw(&base, &with_step(plain, &inputs.shard_step(), vocab));
            let fresh = |_| c_sampler(12);
            let samplers: Vec<_> = (0..ranks).map(fresh).collect();
            let stepped = |q: usize| with_c_step(c_rows(&x, rows, vocab, (cuts[q], cuts[q + 1]), &st), &inputs);
            assert_eq!(c_two_rounds(&samplers, rows, stepped), Ok(want), "ranks {ranks} cuts {cuts:?}");
            let old: Vec<_> = (0..ranks).map(fresh).collect();
            let old_size = |q: usize| tokenrace_shard_rows { struct_size: 112, ..stepped(q) };
            let unstepped = whole(
                &Sampler::new(Config { seed: Some(12), max_rows: 64, ..Config::default() }).unwrap(),
                &x,
                rows,
                vocab,
                &st,
            );
            assert_eq!(c_two_rounds(&old, rows, old_size), Ok(unstepped), "a 0.2 caller reads no step");
            let bad_last_n: Vec<i32> = (0..rows as i32).map(|r| if r == 3 { -2 } else { 0 }).collect();
            let bad = |q: usize| tokenrace_shard_rows { penalty_last_n: bad_last_n.as_ptr(), ..stepped(q) };
            let refused: Vec<_> = (0..ranks).map(fresh).collect();
            let err = c_two_rounds(&refused, rows, bad).unwrap_err();
            assert!(err.starts_with("tokenrace_shard_top: rows.penalty_last_n[3]: -2 is negative"), "{err}");
            for s in samplers.into_iter().chain(old).chain(refused) {
                // SAFETY: made above, freed once.
                unsafe { tokenrace_sampler_free(s) };
            }
        }
    }

    #[test]
    fn c_sharded_draws_equal_the_unsharded_draw() {
        let mut rng = TestRng::new(31);
        let (vocab, rows) = (1500, 10);
        for ranks in [1, 3, 5] {
            let x: Vec<f32> = (0..rows)
                .flat_map(|_| {
                    let d = pick_dist(&mut rng);
                    gen_row(&mut rng, d, vocab)
                })
                .collect();
            let st = Settings::random(&mut rng, rows);
            let cuts = random_cuts(&mut rng, vocab, ranks);
            let want = whole(
                &Sampler::new(Config { seed: Some(12), max_rows: 64, ..Config::default() }).unwrap(),
                &x,
                rows,
                vocab,
                &st,
            );
            let samplers: Vec<_> = (0..ranks).map(|_| c_sampler(12)).collect();
            let mut gathered = vec![tokenrace_shard_partial::default(); ranks * rows];
            for q in 0..ranks {
                let r = c_rows(&x, rows, vocab, (cuts[q], cuts[q + 1]), &st);
                // SAFETY: valid structs, `rows` records of output.
                let status = unsafe { tokenrace_shard_top(samplers[q], &r, gathered[q * rows..].as_mut_ptr()) };
                assert_eq!(status, tokenrace_status::Ok, "{}", last_error());
            }
            let mut combined = vec![tokenrace_shard_row::default(); rows];
            // SAFETY: `ranks * rows` records in, `rows` out.
            let status = unsafe {
                tokenrace_shard_combine_top(gathered.as_ptr(), ranks as u32, rows as u32, combined.as_mut_ptr())
            };
            assert_eq!(status, tokenrace_status::Ok, "{}", last_error());
            for q in 0..ranks {
                let r = c_rows(&x, rows, vocab, (cuts[q], cuts[q + 1]), &st);
                // SAFETY: as above.
                let status = unsafe {
                    tokenrace_shard_race(samplers[q], &r, combined.as_ptr(), gathered[q * rows..].as_mut_ptr())
                };
                assert_eq!(status, tokenrace_status::Ok, "{}", last_error());
            }
            let (mut tokens, mut fl) = (vec![-1; rows], vec![0u32; rows]);
            // SAFETY: as above.
            let status = unsafe {
                tokenrace_shard_finish(
                    combined.as_ptr(),
                    rows as u32,
                    gathered.as_ptr(),
                    ranks as u32,
                    tokens.as_mut_ptr(),
                    fl.as_mut_ptr(),
                )
            };
            assert_eq!(status, tokenrace_status::Ok, "{}", last_error());
            assert_eq!((tokens, fl), want, "ranks {ranks} cuts {cuts:?}");
            // A mixed call (rank 0's round-2 partials given as round 1's) is refused, nothing written.
            let mut untouched = vec![tokenrace_shard_row { token: 77, ..Default::default() }; rows];
            // SAFETY: as above.
            let status = unsafe {
                tokenrace_shard_combine_top(gathered.as_ptr(), ranks as u32, rows as u32, untouched.as_mut_ptr())
            };
            assert_eq!(status, tokenrace_status::InvalidArgument);
            assert!(
                last_error().starts_with("tokenrace_shard_combine_top: partials[0][0] (rank 0, row 0)"),
                "{}",
                last_error()
            );
            assert!(untouched.iter().all(|r| r.token == 77));
            for s in samplers {
                // SAFETY: made above, freed once.
                unsafe { tokenrace_sampler_free(s) };
            }
        }
    }
}

#[test]
fn top_k_rows_equal_the_unsharded_draw() {
    // Each rank sends its slice's `width` largest finite values; the k-th largest of their union
    // is the row's, so the race keeps the unsharded draw's set. k at 1, inside the row, at and past
    // the count of finite values, and off (>= vocab).
    each_level(|level| {
        let mut rng = TestRng::new(41);
        for ranks in [1, 2, 3, 6] {
            let (vocab, rows) = (900, 16);
            let x: Vec<f32> = (0..rows)
                .flat_map(|_| {
                    let d = pick_dist(&mut rng);
                    gen_row(&mut rng, d, vocab)
                })
                .collect();
            let st = Settings::random(&mut rng, rows);
            let top_k: Vec<i32> = (0..rows).map(|_| [0, 1, 2, 5, 40, 450, 899, 900, -3][rng.below(9)]).collect();
            let want = draw(
                &sampler(level, 6),
                &Batch {
                    temperature: Some(&st.temps),
                    seeds: Some(&st.seeds),
                    seeded: Some(&st.seeded),
                    min_p: Some(&st.min_p),
                    top_k: Some(&top_k),
                    ..Batch::new(Logits::F32(&x), rows, vocab)
                },
            );
            let cuts = random_cuts(&mut rng, vocab, ranks);
            let shards: Vec<Sampler> = (0..ranks).map(|_| sampler(level, 6)).collect();
            let rows_of = |q: usize| ShardRows { top_k: Some(&top_k), ..rank_rows(&x, rows, vocab, &cuts, q, &st) };
            let width = 899;
            let mut tops = vec![vec![ShardPartial::default(); rows]; ranks];
            let mut cands = vec![vec![0f32; rows * width]; ranks];
            for q in 0..ranks {
                shards[q].shard_top(&rows_of(q), &mut tops[q]).unwrap();
                shard_top_k_candidates(&rows_of(q), width, &mut cands[q]).unwrap();
            }
            let mut combined = vec![ShardRow::default(); rows];
            shard_combine_top(&tops.iter().map(|p| &p[..]).collect::<Vec<_>>(), &mut combined).unwrap();
            let gathered: Vec<&[f32]> = cands.iter().rev().map(|c| &c[..]).collect();
            let mut races = vec![vec![ShardPartial::default(); rows]; ranks];
            for q in 0..ranks {
                shards[q].shard_race_top_k(&rows_of(q), &combined, &gathered, &mut races[q]).unwrap();
            }
            let (mut tokens, mut fl) = (vec![0; rows], vec![0; rows]);
            shard_finish(&combined, &races.iter().map(|p| &p[..]).collect::<Vec<_>>(), &mut tokens, Some(&mut fl))
                .unwrap();
            assert_eq!((tokens, fl), want, "{level:?} ranks {ranks} cuts {cuts:?} top_k {top_k:?}");
            // Without the candidates, a top-k row is refused; a width below a row's k too.
            let err = shards[0].shard_race(&rows_of(0), &combined, &mut races[0]).unwrap_err();
            assert!(err.message.contains("candidates") || !combined.iter().any(|r| r.races()), "{}", err.message);
            let err = shard_top_k_candidates(&rows_of(0), 3, &mut cands[0]).unwrap_err();
            assert!(err.message.contains("width: 3 is below rows.top_k["), "{}", err.message);
        }
    });
}

/// The rows' filters: top-k, top-p and min-p, each on or off per row.
struct Filters {
    top_k: Vec<i32>,
    top_p: Vec<f32>,
}

impl Filters {
    fn random(rng: &mut TestRng, rows: usize, vocab: usize) -> Filters {
        let top_k = (0..rows).map(|_| [0, 0, 1, 3, 40, (vocab / 2) as i32, vocab as i32][rng.below(7)]).collect();
        let top_p = (0..rows).map(|_| [1.0, 0.1, 0.5, 0.9, 0.95, 0.999, 0.99999][rng.below(7)]).collect();
        Filters { top_k, top_p }
    }
}

/// The sharded draw of rows with filters through the cut (top-k candidates in round 1, then
/// rounds of the cut until every row's floor is known, then the race); also the rounds of the
/// cut it took.
fn sharded_filtered(
    ranks: &[Sampler],
    x: &[f32],
    (rows, vocab): (usize, usize),
    cuts: &[usize],
    order: &[usize],
    st: &Settings,
    f: &Filters,
) -> ((Vec<i32>, Vec<u32>), usize) {
    let (drawn, rounds, _) = sharded_with_step(ranks, x, (rows, vocab), cuts, order, st, f, ShardStep::default(), None);
    (drawn, rounds)
}

/// The logprobs of the sampled tokens and the top-n ids and logprobs, rows after rows.
type Logprobs = (Vec<f32>, Vec<i32>, Vec<f32>);

/// [`sharded_filtered`] of rows with the sampling step `step` (every rank given the same whole
/// lists; none: `ShardStep::default()`), with the logprobs of `mode` and the top `top_n` when
/// asked for (their partials sent with the race's).
#[allow(clippy::too_many_arguments)]
fn sharded_with_step(
    ranks: &[Sampler],
    x: &[f32],
    (rows, vocab): (usize, usize),
    cuts: &[usize],
    order: &[usize],
    st: &Settings,
    f: &Filters,
    step: ShardStep,
    logprobs: Option<(LogprobMode, usize)>,
) -> ((Vec<i32>, Vec<u32>), usize, Option<Logprobs>) {
    let n = ranks.len();
    let rows_of = |q: usize| ShardRows {
        top_k: Some(&f.top_k),
        top_p: Some(&f.top_p),
        step,
        ..rank_rows(x, rows, vocab, cuts, q, st)
    };
    let width = f.top_k.iter().map(|&k| k.max(0) as usize).filter(|&k| k < vocab).max().unwrap_or(0);
    let mut tops = vec![vec![ShardPartial::default(); rows]; n];
    let mut cands = vec![vec![0f32; rows * width]; n];
    for q in 0..n {
        ranks[q].shard_top(&rows_of(q), &mut tops[q]).unwrap();
        shard_top_k_candidates(&rows_of(q), width, &mut cands[q]).unwrap();
    }
    let mut combined = vec![ShardRow::default(); rows];
    shard_combine_top(&order.iter().map(|&q| &tops[q][..]).collect::<Vec<_>>(), &mut combined).unwrap();
    let gathered: Vec<&[f32]> = order.iter().map(|&q| &cands[q][..]).collect();
    // Every rank computes the same states: each rank's own copy, compared.
    let mut states = vec![vec![ShardCut::default(); rows]; n];
    for q in 0..n {
        ranks[q].shard_cut_start(&rows_of(q), &combined, &gathered, &mut states[q]).unwrap();
    }
    let mut rounds = 0;
    while shard_cut_pending(&states[0]) {
        rounds += 1;
        assert!(rounds <= 9, "the cut takes at most 8 rounds");
        let masses: Vec<Vec<ShardMass>> = (0..n)
            .map(|q| {
                let mut m = vec![ShardMass::default(); rows];
                ranks[q].shard_cut_round(&rows_of(q), &states[q], &mut m).unwrap();
                m
            })
            .collect();
        for (q, state) in states.iter_mut().enumerate() {
            // Each rank gathers in its own order: the ranks' states must agree all the same.
            let view: Vec<&[ShardMass]> = (0..n).map(|i| &masses[order[(i + q) % n]][..]).collect();
            shard_cut_advance(state, &view).unwrap();
        }
        assert!(states.iter().all(|s| s == &states[0]), "the ranks' cuts differ");
    }
    let races: Vec<Vec<ShardPartial>> = (0..n)
        .map(|q| {
            let mut p = vec![ShardPartial::default(); rows];
            ranks[q].shard_race_cut(&rows_of(q), &combined, &states[q], &mut p).unwrap();
            p
        })
        .collect();
    let (mut tokens, mut fl) = (vec![-7; rows], vec![0; rows]);
    shard_finish(&combined, &races.iter().map(|p| &p[..]).collect::<Vec<_>>(), &mut tokens, Some(&mut fl)).unwrap();
    let lps = logprobs.map(|(mode, top_n)| {
        let mut parts = vec![vec![ShardLogprobPartial::default(); rows]; n];
        let mut tops = vec![vec![ShardTopEntry::default(); rows * top_n]; n];
        for q in 0..n {
            ranks[q]
                .shard_logprob_partials(
                    &rows_of(q),
                    &combined,
                    &states[q],
                    &races[q],
                    mode,
                    top_n,
                    &mut parts[q],
                    &mut tops[q],
                )
                .unwrap();
        }
        let (mut lps, mut ids, mut tlps) = (vec![0f32; rows], vec![0; rows * top_n], vec![0f32; rows * top_n]);
        shard_logprobs(
            &combined,
            &tokens,
            &order.iter().map(|&q| &parts[q][..]).collect::<Vec<_>>(),
            &order.iter().map(|&q| &tops[q][..]).collect::<Vec<_>>(),
            mode,
            top_n,
            &mut lps,
            &mut ids,
            &mut tlps,
        )
        .unwrap();
        (lps, ids, tlps)
    });
    ((tokens, fl), rounds, lps)
}

fn whole_filtered(
    s: &Sampler,
    x: &[f32],
    rows: usize,
    vocab: usize,
    st: &Settings,
    f: &Filters,
) -> (Vec<i32>, Vec<u32>) {
    let b = Batch {
        temperature: Some(&st.temps),
        seeds: Some(&st.seeds),
        seeded: Some(&st.seeded),
        min_p: Some(&st.min_p),
        top_k: Some(&f.top_k),
        top_p: Some(&f.top_p),
        ..Batch::new(Logits::F32(x), rows, vocab)
    };
    draw(s, &b)
}

#[test]
fn top_p_top_k_and_min_p_rows_equal_the_unsharded_draw() {
    // top-p's threshold from rounds of histograms over the ranks, top-k's from their candidates,
    // min-p's from the maximum: the floors of the unsharded draw, so the same tokens and flags.
    // Rows of every kind (ties, NaN, masked, peaked), large flat rows whose cut needs the value
    // splits, seeded and unseeded, 1 to 8 ranks, every level, 1 and 4 threads.
    let (mut most_rounds, mut filtered_differ) = (0, 0);
    each_level(|level| {
        for threads in [1, 4] {
            let mut rng = TestRng::new(53 + threads as u64);
            for ranks in 1..=8 {
                for vocab in [700, 5000] {
                    let rows = 14;
                    let mut x: Vec<f32> = (0..rows)
                        .flat_map(|_| {
                            let d = pick_dist(&mut rng);
                            gen_row(&mut rng, d, vocab)
                        })
                        .collect();
                    // A flat row of many near ties (thousands of tokens inside one bin).
                    for v in &mut x[..vocab] {
                        *v = (rng.f64() * 1e-3) as f32;
                    }
                    let st = Settings::random(&mut rng, rows);
                    let f = Filters::random(&mut rng, rows, vocab);
                    let cuts = random_cuts(&mut rng, vocab, ranks);
                    let order = shuffled(&mut rng, ranks);
                    let seed = rng.u64();
                    let want = whole_filtered(&with_threads(level, seed, threads), &x, rows, vocab, &st, &f);
                    let shards: Vec<Sampler> = (0..ranks).map(|_| with_threads(level, seed, threads)).collect();
                    let (got, rounds) = sharded_filtered(&shards, &x, (rows, vocab), &cuts, &order, &st, &f);
                    most_rounds = most_rounds.max(rounds);
                    // Power: the filters change tokens, so a wrong floor would show.
                    let off = Filters { top_k: vec![0; rows], top_p: vec![1.0; rows] };
                    let unfiltered = whole_filtered(&with_threads(level, seed, threads), &x, rows, vocab, &st, &off);
                    filtered_differ += unfiltered.0.iter().zip(&want.0).filter(|(a, b)| a != b).count();
                    assert_eq!(
                        got, want,
                        "{level:?} threads {threads} ranks {ranks} vocab {vocab} cuts {cuts:?} top_k {:?} top_p {:?}",
                        f.top_k, f.top_p
                    );
                }
            }
        }
    });
    assert!(most_rounds >= 3, "some row needed a split round ({most_rounds} rounds at most)");
    assert!(filtered_differ > 100, "the filters changed only {filtered_differ} tokens");
}

#[test]
#[allow(clippy::needless_range_loop)] // ranks index several arrays
fn the_cut_refuses_records_of_another_round_and_a_race_before_it_is_done() {
    let mut rng = TestRng::new(3);
    let (vocab, rows) = (1000, 4);
    let x: Vec<f32> = (0..rows * vocab).map(|_| rng.normal() as f32).collect();
    let st = Settings { temps: vec![1.0; rows], seeds: vec![5; rows], seeded: vec![1; rows], min_p: vec![0.0; rows] };
    let f = Filters { top_k: vec![0; rows], top_p: vec![0.9; rows] };
    let cuts = [0, 400, vocab];
    let s = sampler(SimdLevel::Scalar, 1);
    let rows_of = |q: usize| ShardRows {
        top_k: Some(&f.top_k),
        top_p: Some(&f.top_p),
        ..rank_rows(&x, rows, vocab, &cuts, q, &st)
    };
    let mut tops = vec![vec![ShardPartial::default(); rows]; 2];
    for q in 0..2 {
        s.shard_top(&rows_of(q), &mut tops[q]).unwrap();
    }
    let mut combined = vec![ShardRow::default(); rows];
    shard_combine_top(&[&tops[0][..], &tops[1][..]], &mut combined).unwrap();
    let mut state = vec![ShardCut::default(); rows];
    s.shard_cut_start(&rows_of(0), &combined, &[], &mut state).unwrap();
    // A top-p row races only with its cut, and only once it is done.
    let mut out = vec![ShardPartial::default(); rows];
    let err = s.shard_race(&rows_of(0), &combined, &mut out).unwrap_err();
    assert!(err.message.contains("rows.top_p[0]: a row with top-p races with its cut"), "{}", err.message);
    let err = s.shard_race_cut(&rows_of(0), &combined, &state, &mut out).unwrap_err();
    assert!(err.message.contains("cuts[0]: its cut is not done"), "{}", err.message);
    let mut m = vec![vec![ShardMass::default(); rows]; 2];
    for q in 0..2 {
        s.shard_cut_round(&rows_of(q), &state, &mut m[q]).unwrap();
    }
    let before = state.clone();
    // Rank 1's record of row 2 in row 1's place: another row's fingerprint.
    let mut wrong = m[1].clone();
    wrong.swap(1, 2);
    let err = shard_cut_advance(&mut state, &[&m[0][..], &wrong[..]]).unwrap_err();
    assert!(err.message.contains("(rank 1, row 1)") && err.message.contains("fingerprint"), "{}", err.message);
    // A missing rank leaves a gap.
    let err = shard_cut_advance(&mut state, &[&m[0][..]]).unwrap_err();
    assert!(err.message.contains("row 0") && err.message.contains("cover [0, 400)"), "{}", err.message);
    assert_eq!(state, before, "a failed advance changes nothing");
    shard_cut_advance(&mut state, &[&m[1][..], &m[0][..]]).unwrap();
    // The records of the round before are refused now.
    let err = shard_cut_advance(&mut state.clone(), &[&m[0][..], &m[1][..]]).unwrap_err();
    assert!(err.message.contains("fingerprint"), "{}", err.message);
}

#[test]
fn sharded_logprobs_and_top_n_equal_the_unsharded_within_the_mass_error() {
    // The sampled token's logprob and the top-n, RAW and PROCESSED: the unsharded draw sums Z
    // from f32 exps (relative error below 1e-5), the sharded one from exact f64 weights, so the
    // logprobs agree within 1e-5 (plus the f32 rounding of the result); the top-n ids are the
    // same. Filters on, 1 to 8 ranks, every level.
    let worst = logprobs_agree(61, false, &[LogprobMode::Raw, LogprobMode::Processed]);
    eprintln!("largest difference of a sharded logprob from the unsharded one: {worst:e}");
}

#[test]
fn processed_logprobs_of_rows_with_a_step_equal_the_unsharded_within_the_mass_error() {
    // As above, the rows carrying a step: PROCESSED logprobs are those of the processed values,
    // which every rank reads for its slice (RAW ones are refused, see the refusals' test).
    let worst = logprobs_agree(62, true, &[LogprobMode::Processed]);
    eprintln!("largest difference of a sharded logprob (with a step) from the unsharded one: {worst:e}");
}

/// The sharded logprobs and top-n of random rows (with a random step when `stepped`) in each of
/// `modes` against the unsharded draw's, 1 to 8 ranks, every level: the largest difference.
fn logprobs_agree(seed: u64, stepped: bool, modes: &[LogprobMode]) -> f64 {
    let mut worst = 0f64;
    each_level(|level| {
        let mut rng = TestRng::new(seed);
        for ranks in 1..=8 {
            let (vocab, rows, top_n) = (2000, 12, 7);
            let x: Vec<f32> = (0..rows)
                .flat_map(|_| {
                    let d = pick_dist(&mut rng);
                    gen_row(&mut rng, d, vocab)
                })
                .collect();
            let st = Settings::random(&mut rng, rows);
            let f = Filters::random(&mut rng, rows, vocab);
            let cuts = random_cuts(&mut rng, vocab, ranks);
            let order = shuffled(&mut rng, ranks);
            let inputs = stepped.then(|| StepInputs::random(&mut rng, rows, vocab));
            let step = inputs.as_ref().map_or_else(ShardStep::default, |i| i.shard_step());
            for &mode in modes {
                let whole_s = sampler(level, 8);
                let (mut tokens, mut lps) = (vec![0; rows], vec![0f32; rows]);
                let (mut ids, mut tlps) = (vec![0; rows * top_n], vec![0f32; rows * top_n]);
                let b = Batch {
                    temperature: Some(&st.temps),
                    seeds: Some(&st.seeds),
                    seeded: Some(&st.seeded),
                    min_p: Some(&st.min_p),
                    top_k: Some(&f.top_k),
                    top_p: Some(&f.top_p),
                    ..Batch::new(Logits::F32(&x), rows, vocab)
                };
                let mut out = Output {
                    logprobs: Some(&mut lps),
                    top_n,
                    topn_ids: Some(&mut ids),
                    topn_logprobs: Some(&mut tlps),
                    logprob_mode: mode,
                    ..Output::new(&mut tokens)
                };
                whole_s.draw(&with_step(b, &step, vocab), &mut out).unwrap();
                let shards: Vec<Sampler> = (0..ranks).map(|_| sampler(level, 8)).collect();
                let ((got_tokens, _), _, got) =
                    sharded_with_step(&shards, &x, (rows, vocab), &cuts, &order, &st, &f, step, Some((mode, top_n)));
                let (got_lps, got_ids, got_tlps) = got.unwrap();
                assert_eq!(got_tokens, tokens, "{level:?} ranks {ranks}");
                let mut close = |a: f32, b: f32| {
                    if a == b {
                        return true;
                    }
                    let d = (a as f64 - b as f64).abs();
                    worst = worst.max(d);
                    d <= 1e-5 + 4.0 * (a.abs().max(b.abs()) as f64) * f32::EPSILON as f64
                };
                for r in 0..rows {
                    assert!(
                        close(got_lps[r], lps[r]),
                        "{level:?} {mode:?} ranks {ranks} row {r}: {} vs {}",
                        got_lps[r],
                        lps[r]
                    );
                    for j in 0..top_n {
                        let i = r * top_n + j;
                        assert!(
                            close(got_tlps[i], tlps[i]),
                            "{level:?} {mode:?} ranks {ranks} row {r} top {j}: {} vs {}",
                            got_tlps[i],
                            tlps[i]
                        );
                        // The same ids, but for ties of logprobs that the two sums round apart.
                        if got_ids[i] != ids[i] {
                            assert!((tlps[i] as f64 - got_tlps[i] as f64).abs() <= 1e-5, "row {r} top {j}");
                            assert!(
                                (r * top_n..(r + 1) * top_n)
                                    .any(|k| (tlps[k] - tlps[i]).abs() <= 2e-5 && ids[k] == got_ids[i]),
                                "{level:?} {mode:?} ranks {ranks} row {r} top {j}: id {} vs {}",
                                got_ids[i],
                                ids[i]
                            );
                        }
                    }
                }
            }
        }
    });
    worst
}

/// A call's sampling-step inputs, random per row, in CSR form: histories drawn from a few ids
/// spread over the row (so the penalties and DRY find repeats), bias, allowed (some rows),
/// banned, a bitmask, min_tokens with stop ids, bad words and DRY.
struct StepInputs {
    prompt: (Vec<i32>, Vec<u64>),
    output: (Vec<i32>, Vec<u64>),
    repetition: Vec<f32>,
    frequency: Vec<f32>,
    presence: Vec<f32>,
    last_n: Vec<i32>,
    bias: (Vec<i32>, Vec<f32>, Vec<u64>),
    allowed: (Vec<i32>, Vec<u64>),
    allowed_rows: Vec<u8>,
    banned: (Vec<i32>, Vec<u64>),
    bitmask: Vec<i32>,
    min_tokens: Vec<i32>,
    stops: (Vec<i32>, Vec<u64>),
    bad_words: (Vec<i32>, Vec<u64>, Vec<u64>),
    dry_multiplier: Vec<f32>,
    words_per_row: usize,
}

/// CSR lists from per-row lists.
fn csr<T: Copy>(lists: &[Vec<T>]) -> (Vec<T>, Vec<u64>) {
    let mut offsets = vec![0u64];
    for l in lists {
        offsets.push(offsets.last().unwrap() + l.len() as u64);
    }
    (lists.concat(), offsets)
}

impl StepInputs {
    fn random(rng: &mut TestRng, rows: usize, vocab: usize) -> StepInputs {
        let ids = |rng: &mut TestRng, pool: &[i32], most: usize| -> Vec<i32> {
            let n = rng.below(most + 1);
            (0..n).map(|_| pool[rng.below(pool.len())]).collect()
        };
        let (mut prompt, mut output, mut allowed, mut banned, mut stops) = (vec![], vec![], vec![], vec![], vec![]);
        let (mut bias_lists, mut bias_values, mut words, mut word_lens) = (vec![], vec![], vec![], vec![]);
        for _ in 0..rows {
            let pool: Vec<i32> = (0..12).map(|_| rng.below(vocab) as i32).collect();
            prompt.push(ids(rng, &pool, 40));
            output.push(ids(rng, &pool, 30));
            let all: Vec<i32> = (0..vocab as i32).collect();
            allowed.push(ids(rng, &all, vocab / 3));
            banned.push(ids(rng, &all, 20));
            stops.push(ids(rng, &pool, 3));
            let b = ids(rng, &all, 8);
            bias_values.push(
                b.iter().map(|_| [-3.0, -0.5, 0.25, 2.0, 9.0, f32::NEG_INFINITY][rng.below(6)]).collect::<Vec<f32>>(),
            );
            bias_lists.push(b);
            // Bad words: one of one token, one of two whose head is a history token.
            let (one, two) = (pool[rng.below(12)], [pool[rng.below(12)], rng.below(vocab) as i32]);
            let row_words: Vec<Vec<i32>> = match rng.below(3) {
                0 => vec![],
                1 => vec![vec![one]],
                _ => vec![vec![one], two.to_vec()],
            };
            word_lens.push(row_words.len());
            words.extend(row_words);
        }
        let mut bad_row_offsets = vec![0u64];
        for n in &word_lens {
            bad_row_offsets.push(bad_row_offsets.last().unwrap() + *n as u64);
        }
        let (bad_ids, bad_word_offsets) = csr(&words);
        let (bias_ids, bias_offsets) = csr(&bias_lists);
        let words_per_row = vocab.div_ceil(32);
        let bitmask = (0..rows * words_per_row)
            .map(|i| {
                // Rows without a grammar (all set), and rows with about a fifth of tokens clear.
                if (i / words_per_row).is_multiple_of(3) {
                    -1
                } else {
                    (0..32).fold(0u32, |w, j| w | ((rng.below(5) != 0) as u32) << j) as i32
                }
            })
            .collect();
        let pick = |rng: &mut TestRng, from: &[f32]| (0..rows).map(|_| from[rng.below(from.len())]).collect::<Vec<_>>();
        StepInputs {
            prompt: csr(&prompt),
            output: csr(&output),
            repetition: pick(rng, &[1.0, 1.3, 0.8, 2.0]),
            frequency: pick(rng, &[0.0, 0.5, -0.3]),
            presence: pick(rng, &[0.0, 0.7, -1.0]),
            last_n: (0..rows).map(|_| [0, 5, 40][rng.below(3)]).collect(),
            bias: (bias_ids, bias_values.concat(), bias_offsets),
            allowed: csr(&allowed),
            allowed_rows: (0..rows).map(|_| (rng.below(4) == 0) as u8).collect(),
            banned: csr(&banned),
            bitmask,
            min_tokens: (0..rows).map(|_| [0, 3, 50][rng.below(3)]).collect(),
            stops: csr(&stops),
            bad_words: (bad_ids, bad_word_offsets, bad_row_offsets),
            dry_multiplier: pick(rng, &[0.0, 0.8]),
            words_per_row,
        }
    }

    fn shard_step(&self) -> ShardStep<'_> {
        fn lists(l: &(Vec<i32>, Vec<u64>)) -> Option<TokenLists<'_>> {
            Some(TokenLists { ids: &l.0, offsets: &l.1 })
        }
        ShardStep {
            prompt_tokens: lists(&self.prompt),
            output_tokens: lists(&self.output),
            repetition_penalty: Some(&self.repetition),
            frequency_penalty: Some(&self.frequency),
            presence_penalty: Some(&self.presence),
            penalty_last_n: Some(&self.last_n),
            logit_bias: Some(LogitBias { ids: &self.bias.0, values: &self.bias.1, offsets: &self.bias.2 }),
            allowed_tokens: lists(&self.allowed),
            allowed_rows: Some(&self.allowed_rows),
            banned_tokens: lists(&self.banned),
            token_bitmask: Some(TokenBitmask { words: &self.bitmask, row_stride: self.words_per_row }),
            min_tokens: Some(&self.min_tokens),
            stop_tokens: lists(&self.stops),
            bad_words: Some(BadWords {
                ids: &self.bad_words.0,
                word_offsets: &self.bad_words.1,
                row_offsets: &self.bad_words.2,
            }),
            dry_multiplier: Some(&self.dry_multiplier),
            ..ShardStep::default()
        }
    }
}

/// The batch of the whole rows with the step `step` (as the sharded call is given it).
fn with_step<'a>(b: Batch<'a>, step: &ShardStep<'a>, vocab: usize) -> Batch<'a> {
    let bitmask = step.token_bitmask.map(|m| TokenBitmask { row_stride: vocab.div_ceil(32), ..m });
    Batch {
        prompt_tokens: step.prompt_tokens,
        output_tokens: step.output_tokens,
        repetition_penalty: step.repetition_penalty,
        frequency_penalty: step.frequency_penalty,
        presence_penalty: step.presence_penalty,
        penalty_last_n: step.penalty_last_n,
        logit_bias: step.logit_bias,
        allowed_tokens: step.allowed_tokens,
        allowed_rows: step.allowed_rows,
        banned_tokens: step.banned_tokens,
        token_bitmask: bitmask,
        min_tokens: step.min_tokens,
        stop_tokens: step.stop_tokens,
        bad_words: step.bad_words,
        dry_multiplier: step.dry_multiplier,
        dry_base: step.dry_base,
        dry_allowed_length: step.dry_allowed_length,
        dry_penalty_last_n: step.dry_penalty_last_n,
        dry_breakers: step.dry_breakers,
        ..b
    }
}

#[test]
fn rows_with_a_step_equal_the_unsharded_draw_of_the_whole_rows() {
    // Each rank builds the row's step from the whole lists and reads its slice's processed
    // values: the same values the unsharded draw computes for those ids, so the same tokens and
    // flags, bit for bit. Random histories, penalties (raising and lowering), bias, allowed,
    // banned, bitmask, min_tokens, bad words and DRY; greedy and sampling rows, seeded and
    // unseeded, with min-p, top-k and top-p; 1 to 8 ranks with uneven slices; every level.
    let (mut stepped_differ, mut compared) = (0, 0);
    each_level(|level| {
        let mut rng = TestRng::new(71);
        for ranks in 1..=8 {
            for vocab in [700, 3000] {
                let rows = 12;
                let x: Vec<f32> = (0..rows)
                    .flat_map(|_| {
                        let d = pick_dist(&mut rng);
                        gen_row(&mut rng, d, vocab)
                    })
                    .collect();
                let st = Settings::random(&mut rng, rows);
                let f = Filters::random(&mut rng, rows, vocab);
                let inputs = StepInputs::random(&mut rng, rows, vocab);
                let step = inputs.shard_step();
                let cuts = random_cuts(&mut rng, vocab, ranks);
                let order = shuffled(&mut rng, ranks);
                let seed = rng.u64();
                let plain = Batch {
                    temperature: Some(&st.temps),
                    seeds: Some(&st.seeds),
                    seeded: Some(&st.seeded),
                    min_p: Some(&st.min_p),
                    top_k: Some(&f.top_k),
                    top_p: Some(&f.top_p),
                    ..Batch::new(Logits::F32(&x), rows, vocab)
                };
                let want = draw(&sampler(level, seed), &with_step(plain, &step, vocab));
                let shards: Vec<Sampler> = (0..ranks).map(|_| sampler(level, seed)).collect();
                let (got, _, _) = sharded_with_step(&shards, &x, (rows, vocab), &cuts, &order, &st, &f, step, None);
                assert_eq!(got, want, "{level:?} ranks {ranks} vocab {vocab} cuts {cuts:?}");
                // Power: the step changes tokens, so a rank that skipped it would show.
                let unstepped = draw(&sampler(level, seed), &plain);
                stepped_differ += unstepped.0.iter().zip(&want.0).filter(|(a, b)| a != b).count();
                compared += rows;
            }
        }
    });
    assert!(stepped_differ * 4 > compared, "the step changed only {stepped_differ} of {compared} tokens");
}

#[test]
fn a_step_applied_to_one_rank_only_changes_the_sharded_token() {
    // The deliberately wrong rule (a rank leaving out the step): its partials are refused
    // (the step is in the rows' fingerprints) rather than combined into another token.
    let level = best_level();
    let mut rng = TestRng::new(72);
    let (vocab, rows, ranks) = (900, 8, 3);
    let x: Vec<f32> = (0..rows * vocab).map(|_| rng.normal() as f32).collect();
    let st = Settings::random(&mut rng, rows);
    let inputs = StepInputs::random(&mut rng, rows, vocab);
    let cuts = random_cuts(&mut rng, vocab, ranks);
    let shards: Vec<Sampler> = (0..ranks).map(|_| sampler(level, 9)).collect();
    let mut tops = vec![vec![ShardPartial::default(); rows]; ranks];
    for q in 0..ranks {
        let step = if q == 1 { ShardStep::default() } else { inputs.shard_step() };
        shards[q].shard_top(&ShardRows { step, ..rank_rows(&x, rows, vocab, &cuts, q, &st) }, &mut tops[q]).unwrap();
    }
    let mut combined = vec![ShardRow::default(); rows];
    let err = shard_combine_top(&tops.iter().map(|p| &p[..]).collect::<Vec<_>>(), &mut combined).unwrap_err();
    assert!(err.message.contains("fingerprint"), "{}", err.message);
}

#[test]
fn bad_step_inputs_are_refused_naming_them_and_take_no_key() {
    let level = best_level();
    let mut rng = TestRng::new(73);
    let (vocab, rows) = (600, 4);
    let x: Vec<f32> = (0..rows * vocab).map(|_| rng.normal() as f32).collect();
    let st = Settings { temps: vec![1.0; rows], seeds: vec![0; rows], seeded: vec![0; rows], min_p: vec![0.0; rows] };
    let inputs = StepInputs::random(&mut rng, rows, vocab);
    let cuts = [0, 250, vocab];
    let bad_prompt = {
        let mut p = inputs.prompt.0.clone();
        let at = inputs.prompt.1[2] as usize;
        p.insert(at, vocab as i32);
        let mut o = inputs.prompt.1.clone();
        o[3..].iter_mut().for_each(|v| *v += 1);
        (p, o)
    };
    let bad_bias = {
        let mut b = inputs.bias.clone();
        if b.0.is_empty() {
            b = (vec![3], vec![f32::NAN], vec![0, 1, 1, 1, 1]);
        } else {
            b.1[0] = f32::NAN;
        }
        b
    };
    let short_mask = vec![-1i32; rows * vocab.div_ceil(32) - 1];
    let bad_r = vec![1.0, 0.0, 1.0, 1.0];
    let cases: Vec<(ShardStep, &str)> = vec![
        (
            ShardStep {
                prompt_tokens: Some(TokenLists { ids: &bad_prompt.0, offsets: &bad_prompt.1 }),
                ..inputs.shard_step()
            },
            "rows.prompt_ids[2]",
        ),
        (
            ShardStep {
                logit_bias: Some(LogitBias { ids: &bad_bias.0, values: &bad_bias.1, offsets: &bad_bias.2 }),
                ..inputs.shard_step()
            },
            "rows.bias_values[",
        ),
        (
            ShardStep {
                token_bitmask: Some(TokenBitmask { words: &short_mask, row_stride: vocab.div_ceil(32) }),
                ..inputs.shard_step()
            },
            "rows.token_bitmask",
        ),
        (ShardStep { repetition_penalty: Some(&bad_r), ..inputs.shard_step() }, "rows.repetition_penalty[1]"),
    ];
    for (step, name) in cases {
        for q in 0..2 {
            let s = sampler(level, 5);
            let rows_q = ShardRows { step, ..rank_rows(&x, rows, vocab, &cuts, q, &st) };
            let mut out = vec![ShardPartial { token: -9, ..ShardPartial::default() }; rows];
            let err = s.shard_top(&rows_q, &mut out).unwrap_err();
            assert!(err.message.contains(name), "rank {q}: {} lacks {name}", err.message);
            assert!(out.iter().all(|p| p.token == -9), "nothing written");
            let mut c = vec![7f32; rows * 3];
            let err = shard_top_k_candidates(&rows_q, 3, &mut c).unwrap_err();
            assert!(err.message.contains(name), "{}", err.message);
            assert!(c.iter().all(|&v| v == 7.0));
            // No key taken: the next unseeded draw is the fresh sampler's.
            let fresh = draw(&sampler(level, 5), &Batch::new(Logits::F32(&x), rows, vocab));
            assert_eq!(draw(&s, &Batch::new(Logits::F32(&x), rows, vocab)), fresh);
        }
    }
    // RAW logprobs of rows with a step are refused (the raw row's maximum is not combined).
    let s = sampler(level, 5);
    let rows_q = ShardRows { step: inputs.shard_step(), ..rank_rows(&x, rows, vocab, &cuts, 0, &st) };
    let mut parts = vec![ShardLogprobPartial::default(); rows];
    let err = s.shard_logprob_partials(&rows_q, &[], &[], &[], LogprobMode::Raw, 0, &mut parts, &mut []).unwrap_err();
    assert!(err.message.contains("RAW"), "{}", err.message);
}
