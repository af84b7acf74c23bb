//! The kept set of each row as an output (threshold, count, mass, xgrammar bitmask) against a
//! float64 reference of the filters (top-k, top-p, min-p, top-nσ) and the step's masks, the
//! same bit for bit at every SIMD level, thread count and filter order's own set, every seeded
//! token inside its row's set, and refusals that write nothing.
mod common;

use common::reference::{self as rf, Order, RowInputs};
use common::*;
use tokenrace::*;

const NINF: f32 = f32::NEG_INFINITY;

/// What a draw reported of its rows' kept sets.
#[derive(Clone, Debug, PartialEq)]
struct Reported {
    tokens: Vec<i32>,
    threshold_bits: Vec<u32>,
    count: Vec<i32>,
    mass_bits: Vec<u64>,
    bits: Vec<i32>,
}

impl Reported {
    fn mass(&self, r: usize) -> f64 {
        f64::from_bits(self.mass_bits[r])
    }
    fn threshold(&self, r: usize) -> f32 {
        f32::from_bits(self.threshold_bits[r])
    }
    fn keeps(&self, r: usize, words: usize, i: usize) -> bool {
        (self.bits[r * words + i / 32] as u32 >> (i % 32)) & 1 == 1
    }
}

fn draw_kept(s: &Sampler, b: &Batch) -> Reported {
    let (rows, words) = (b.rows, b.vocab.div_ceil(32));
    let mut tokens = vec![-1; rows];
    let (mut threshold, mut count, mut mass) = (vec![0f32; rows], vec![0i32; rows], vec![0f64; rows]);
    let mut bits = vec![-1i32; rows * words];
    s.draw(
        b,
        &mut Output {
            kept_threshold: Some(&mut threshold),
            kept_count: Some(&mut count),
            kept_mass: Some(&mut mass),
            kept_bitmask: Some(&mut bits),
            ..Output::new(&mut tokens)
        },
    )
    .unwrap();
    Reported {
        tokens,
        threshold_bits: threshold.iter().map(|t| t.to_bits()).collect(),
        count,
        mass_bits: mass.iter().map(|m| m.to_bits()).collect(),
        bits,
    }
}

/// The float64 reference of one row's kept set: its processed values `y`, drawn at `t` (greedy:
/// every finite value), the filters judged at `filter_inv_t`. `None` when a cut lies within
/// rounding of a threshold.
struct RefKept {
    kept: Vec<bool>,
    threshold: f32,
    mass: f64,
}

fn reference(y: &[f32], greedy: bool, filter_inv_t: f64, f: rf::Filters, sigma: f32) -> Option<RefKept> {
    if y.contains(&f32::INFINITY) {
        return Some(RefKept {
            kept: y.iter().map(|&v| v == f32::INFINITY).collect(),
            threshold: f32::INFINITY,
            mass: 1.0,
        });
    }
    let m = rf::finite_max(y);
    if !m.is_finite() {
        return Some(RefKept { kept: vec![false; y.len()], threshold: f32::NAN, mass: 0.0 });
    }
    let (kept, ambiguous) = if greedy {
        (y.iter().map(|v| v.is_finite()).collect(), false)
    } else {
        rf::filter_set_with_sigma(y, m, filter_inv_t, f, sigma)
    };
    if ambiguous {
        return None;
    }
    let s = if greedy { 1.0 } else { filter_inv_t };
    let w = |v: f32| ((v as f64 - m) * s).exp();
    let all: f64 = y.iter().filter(|v| v.is_finite()).map(|&v| w(v)).sum();
    let kept_mass: f64 = (0..y.len()).filter(|&i| kept[i]).map(|i| w(y[i])).sum();
    let threshold = (0..y.len()).filter(|&i| kept[i]).map(|i| y[i]).fold(f32::INFINITY, f32::min);
    Some(RefKept { kept, threshold, mass: kept_mass / all })
}

/// Per-row settings of the reference batch, cycled over the rows.
const TEMPS: [f32; 7] = [1.0, 0.7, 1.5, 0.0, 2.0, 0.3, 1.0];
const TOP_K: [i32; 7] = [0, 50, 5, 0, 0, 1000, 3];
const TOP_P: [f32; 7] = [1.0, 0.9, 0.95, 1.0, 0.8, 0.5, 1.0];
const MIN_P: [f32; 7] = [0.0, 0.0, 0.05, 0.1, 0.01, 0.0, 0.0];
const SIGMA: [f32; 7] = [0.0, 0.0, 0.0, 0.0, 2.0, 1.0, 0.0];

/// Rows of `vocab` values (peaked, flat, with -inf, NaN, +inf, empty) and the step's masks: a
/// bitmask for every row (rows 3k keep 4 tokens of 5), banned ids on rows 4k + 1, a bias on rows
/// 4k + 2 (+3 on token 1, -inf on token 2).
struct Case {
    x: Vec<f32>,
    rows: usize,
    vocab: usize,
    words: Vec<i32>,
    banned: Vec<i32>,
    banned_offsets: Vec<u64>,
    bias_ids: Vec<i32>,
    bias_values: Vec<f32>,
    bias_offsets: Vec<u64>,
}

impl Case {
    fn new(rng: &mut TestRng, rows: usize, vocab: usize) -> Case {
        let mut x = Vec::new();
        for r in 0..rows {
            let mut row = match r % 5 {
                0 | 3 => peaked_logits(rng, vocab, 3.0, 12.0),
                _ => (0..vocab).map(|_| (rng.normal() * 2.0) as f32).collect(),
            };
            match r {
                8 => row[vocab / 2] = f32::INFINITY,
                9 => row.iter_mut().for_each(|v| *v = NINF),
                10 => row.iter_mut().step_by(3).for_each(|v| *v = f32::NAN),
                _ => {}
            }
            x.extend(row);
        }
        let per_row = vocab.div_ceil(32);
        let mut words = vec![-1i32; rows * per_row];
        for r in (0..rows).step_by(3) {
            for i in (0..vocab).filter(|i| (i * 7 + r) % 5 == 0) {
                words[r * per_row + i / 32] &= !(1 << (i % 32));
            }
        }
        let (mut banned, mut banned_offsets) = (Vec::new(), vec![0u64]);
        let (mut bias_ids, mut bias_values, mut bias_offsets) = (Vec::new(), Vec::new(), vec![0u64]);
        for r in 0..rows {
            if r % 4 == 1 {
                banned.extend([0, (vocab / 3) as i32, (vocab - 1) as i32]);
            }
            if r % 4 == 2 && vocab > 2 {
                bias_ids.extend([1, 2]);
                bias_values.extend([3.0, NINF]);
            }
            banned_offsets.push(banned.len() as u64);
            bias_offsets.push(bias_ids.len() as u64);
        }
        Case { x, rows, vocab, words, banned, banned_offsets, bias_ids, bias_values, bias_offsets }
    }

    fn inputs(&self, r: usize) -> RowInputs<'_> {
        let per_row = self.vocab.div_ceil(32);
        let (b0, b1) = (self.banned_offsets[r] as usize, self.banned_offsets[r + 1] as usize);
        let (s0, s1) = (self.bias_offsets[r] as usize, self.bias_offsets[r + 1] as usize);
        RowInputs {
            banned: &self.banned[b0..b1],
            bias_ids: &self.bias_ids[s0..s1],
            bias_values: &self.bias_values[s0..s1],
            bitmask: Some(&self.words[r * per_row..(r + 1) * per_row]),
            ..RowInputs::NONE
        }
    }

    fn batch<'a>(&'a self, settings: &'a Settings, seeds: &'a [u64]) -> Batch<'a> {
        Batch {
            temperature: Some(&settings.temps),
            top_k: Some(&settings.k),
            top_p: Some(&settings.p),
            min_p: Some(&settings.mp),
            top_n_sigma: Some(&settings.sigma),
            seeds: Some(seeds),
            token_bitmask: Some(TokenBitmask { words: &self.words, row_stride: self.vocab.div_ceil(32) }),
            banned_tokens: Some(TokenLists { ids: &self.banned, offsets: &self.banned_offsets }),
            logit_bias: Some(LogitBias { ids: &self.bias_ids, values: &self.bias_values, offsets: &self.bias_offsets }),
            ..Batch::new(Logits::F32(&self.x), self.rows, self.vocab)
        }
    }
}

struct Settings {
    temps: Vec<f32>,
    k: Vec<i32>,
    p: Vec<f32>,
    mp: Vec<f32>,
    sigma: Vec<f32>,
}

impl Settings {
    fn cycled(rows: usize) -> Settings {
        Settings {
            temps: (0..rows).map(|r| TEMPS[r % 7]).collect(),
            k: (0..rows).map(|r| TOP_K[r % 7]).collect(),
            p: (0..rows).map(|r| TOP_P[r % 7]).collect(),
            mp: (0..rows).map(|r| MIN_P[r % 7]).collect(),
            sigma: (0..rows).map(|r| SIGMA[r % 7]).collect(),
        }
    }
}

fn sampler_with(level: SimdLevel, threads: usize, order: FilterOrder) -> Sampler {
    Sampler::new(Config { threads, filter_order: order, ..sampler(level, 5).config().clone() }).unwrap()
}

/// Checks row `r` of `got` against the reference; false when the reference's cut is undecided.
fn matches_reference(case: &Case, settings: &Settings, got: &Reported, r: usize, order: Order) -> bool {
    let (vocab, words) = (case.vocab, case.vocab.div_ceil(32));
    let x = &case.x[r * vocab..(r + 1) * vocab];
    let y = rf::effective_row(x, &case.inputs(r));
    let t = settings.temps[r];
    let filter_inv_t = if order == Order::TemperatureFirst { rf::inv_t32(t) } else { 1.0 };
    let f = rf::Filters { top_k: settings.k[r], top_p: settings.p[r], min_p: settings.mp[r] };
    let Some(want) = reference(&y, t == 0.0, filter_inv_t, f, settings.sigma[r]) else { return false };
    let what = format!("row {r} vocab {vocab} t {t} {f:?} sigma {} {order:?}", settings.sigma[r]);
    let got_kept: Vec<bool> = (0..vocab).map(|i| got.keeps(r, words, i)).collect();
    assert_eq!(got_kept, want.kept, "{what}: kept set");
    assert_eq!(got.count[r] as usize, want.kept.iter().filter(|&&k| k).count(), "{what}: count");
    let tail = (vocab..words * 32).all(|i| !got.keeps(r, words, i));
    assert!(tail, "{what}: bits past the vocabulary are set");
    let (gt, wt) = (got.threshold(r), want.threshold);
    assert!(gt.to_bits() == wt.to_bits() || (gt.is_nan() && wt.is_nan()), "{what}: threshold {gt} vs {wt}");
    let (gm, wm) = (got.mass(r), want.mass);
    assert!((gm - wm).abs() <= 1e-5 * wm, "{what}: mass {gm} vs {wm}");
    true
}

/// The kept set of every row equals the float64 reference's (rows with step masks, every
/// filter, both orders, greedy, +inf, empty and NaN rows), the same bits at every SIMD level and
/// at 1 and 4 threads, and every token lies in its row's set. The comparison tells the orders
/// apart (the power check): the other order's reference differs on some rows.
#[test]
fn kept_sets_match_the_float64_reference_at_every_level_and_thread_count() {
    let mut rng = TestRng::new(17);
    let (mut checked, mut told_apart) = (0, 0);
    for &(rows, vocab) in &[(14usize, 37usize), (14, 1000), (14, 20_003)] {
        let case = Case::new(&mut rng, rows, vocab);
        let settings = Settings::cycled(rows);
        let seeds: Vec<u64> = (0..rows as u64).map(|r| 1000 + r).collect();
        let b = case.batch(&settings, &seeds);
        for (order, ref_order, other) in [
            (FilterOrder::TemperatureFirst, Order::TemperatureFirst, Order::FiltersFirst),
            (FilterOrder::FiltersFirst, Order::FiltersFirst, Order::TemperatureFirst),
        ] {
            let mut first: Option<Reported> = None;
            each_level(|level| {
                for threads in [1usize, 4] {
                    let got = draw_kept(&sampler_with(level, threads, order), &b);
                    match &first {
                        Some(f) => assert_eq!(&got, f, "{level:?} threads {threads} {order:?} {rows}x{vocab}"),
                        None => first = Some(got),
                    }
                }
            });
            let got = first.unwrap();
            let words = vocab.div_ceil(32);
            for r in 0..rows {
                let empty = r == 9;
                assert!(empty || got.keeps(r, words, got.tokens[r] as usize), "row {r}: token outside its set");
                if matches_reference(&case, &settings, &got, r, ref_order) {
                    checked += 1;
                }
                let x = &case.x[r * vocab..(r + 1) * vocab];
                let y = rf::effective_row(x, &case.inputs(r));
                let t = settings.temps[r];
                let inv = if other == Order::TemperatureFirst { rf::inv_t32(t) } else { 1.0 };
                let f = rf::Filters { top_k: settings.k[r], top_p: settings.p[r], min_p: settings.mp[r] };
                if let Some(w) = reference(&y, t == 0.0, inv, f, settings.sigma[r]) {
                    told_apart += usize::from((0..vocab).any(|i| w.kept[i] != got.keeps(r, words, i)));
                }
            }
        }
    }
    assert!(checked >= 70, "{checked} rows checked");
    assert!(told_apart >= 5, "the other order's kept sets matched almost everywhere ({told_apart})");
}

/// Seeded draws of one row always lie in the set the draw reports, and the set does not depend
/// on the seed; asking for the kept set changes no token.
#[test]
fn seeded_draws_lie_in_the_reported_set_and_keep_their_tokens() {
    let mut rng = TestRng::new(23);
    let vocab = 5000;
    let row = peaked_logits(&mut rng, vocab, 3.0, 10.0);
    let rows = 400;
    let x: Vec<f32> = (0..rows).flat_map(|_| row.iter().copied()).collect();
    let seeds: Vec<u64> = (0..rows as u64).collect();
    let words = vocab.div_ceil(32);
    for &(t, k, p, mp) in
        &[(1.0f32, 0i32, 0.9f32, 0.0f32), (0.8, 40, 1.0, 0.0), (1.2, 0, 1.0, 0.05), (1.0, 30, 0.8, 0.01)]
    {
        let (temps, ks, ps, mps) = (vec![t; rows], vec![k; rows], vec![p; rows], vec![mp; rows]);
        let b = Batch {
            temperature: Some(&temps),
            top_k: Some(&ks),
            top_p: Some(&ps),
            min_p: Some(&mps),
            seeds: Some(&seeds),
            ..Batch::new(Logits::F32(&x), rows, vocab)
        };
        each_level(|level| {
            let s = sampler(level, 3);
            let got = draw_kept(&s, &b);
            assert_eq!(got.tokens, draw(&s, &b).0, "{level:?}: the kept outputs changed the tokens");
            for r in 0..rows {
                assert!(got.keeps(r, words, got.tokens[r] as usize), "{level:?} row {r}");
                assert_eq!(got.bits[r * words..(r + 1) * words], got.bits[..words], "{level:?} row {r}");
                assert_eq!((got.count[r], got.mass_bits[r]), (got.count[0], got.mass_bits[0]));
            }
            assert!(got.count[0] > 1 && got.mass(0) < 1.0, "{level:?}: {} {}", got.count[0], got.mass(0));
        });
    }
}

/// Each output alone is accepted (NULL: not wanted), and the greedy rows report every finite
/// processed value (vLLM's `isfinite(processed_logits)`), mass 1.
#[test]
fn each_output_alone_and_greedy_rows() {
    let x = [1.0f32, NINF, 3.0, f32::NAN, 2.5, -1.0];
    let temps = [0.0f32];
    let banned = [4i32];
    let offsets = [0u64, 1];
    let b = Batch {
        temperature: Some(&temps),
        banned_tokens: Some(TokenLists { ids: &banned, offsets: &offsets }),
        ..Batch::new(Logits::F32(&x), 1, 6)
    };
    let s = sampler(best_level(), 1);
    let mut tokens = [-1];
    let mut count = [0];
    s.draw(&b, &mut Output { kept_count: Some(&mut count), ..Output::new(&mut tokens) }).unwrap();
    assert_eq!((tokens, count), ([2], [3]));
    let mut threshold = [0.0f32];
    s.draw(&b, &mut Output { kept_threshold: Some(&mut threshold), ..Output::new(&mut tokens) }).unwrap();
    assert_eq!(threshold, [-1.0]);
    let mut mass = [0.0f64];
    s.draw(&b, &mut Output { kept_mass: Some(&mut mass), ..Output::new(&mut tokens) }).unwrap();
    assert_eq!(mass, [1.0]);
    let mut bits = [0i32];
    s.draw(&b, &mut Output { kept_bitmask: Some(&mut bits), ..Output::new(&mut tokens) }).unwrap();
    assert_eq!(bits, [0b100101]);
}

/// Bad kept outputs are refused naming the field (and the row), with nothing written and the
/// sampler's stream untouched.
#[test]
fn refusals_write_nothing() {
    let (rows, vocab) = (3usize, 70usize);
    let x: Vec<f32> = (0..rows * vocab).map(|i| (i % 11) as f32 * 0.3).collect();
    let typical = [1.0f32, 0.5, 1.0];
    let plain = Batch::new(Logits::F32(&x), rows, vocab);
    let with_typical = Batch { typical_p: Some(&typical), ..plain };
    let cases: [(&Batch, [usize; 4], &str); 5] = [
        (&plain, [rows - 1, rows, rows, rows * 3], "kept_threshold"),
        (&plain, [rows, rows - 1, rows, rows * 3], "kept_count"),
        (&plain, [rows, rows, 1, rows * 3], "kept_mass"),
        (&plain, [rows, rows, rows, rows * 3 - 1], "kept_bitmask"),
        (&with_typical, [rows, rows, rows, rows * 3], "kept_threshold[1]"),
    ];
    for (b, [nt, nc, nm, nb], want) in cases {
        let s = sampler(best_level(), 8);
        let (mut tokens, mut t, mut c, mut m, mut bits) =
            (vec![-7; rows], vec![9.0f32; nt], vec![9; nc], vec![9.0f64; nm], vec![9; nb]);
        let err = s
            .draw(
                b,
                &mut Output {
                    kept_threshold: Some(&mut t),
                    kept_count: Some(&mut c),
                    kept_mass: Some(&mut m),
                    kept_bitmask: Some(&mut bits),
                    ..Output::new(&mut tokens)
                },
            )
            .expect_err(want);
        assert_eq!(err.kind, ErrorKind::InvalidArgument, "{want}: {err}");
        assert!(err.to_string().contains(want), "{want}: {err}");
        assert!(tokens.iter().all(|&v| v == -7) && t.iter().all(|&v| v == 9.0) && c.iter().all(|&v| v == 9));
        assert!(m.iter().all(|&v| v == 9.0) && bits.iter().all(|&v| v == 9), "{want}: written");
        // The unseeded stream did not move: the next draw is a fresh sampler's first.
        assert_eq!(draw(&s, &plain).0, draw(&sampler(best_level(), 8), &plain).0, "{want}: the stream moved");
    }
}
