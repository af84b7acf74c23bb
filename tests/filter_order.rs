//! An order of the filter stages that the caller composes: a float64 reference that applies the
//! stages in the given order (llama.cpp's chain: each stage renormalises what the stages before
//! it kept, the temperature scales what comes after it), frequencies with a power check (a
//! different order is rejected), the two fixed orders as lists (bit-identical seeded tokens),
//! seeded bit-identity across SIMD levels and threads, and refusals.
mod common;

use common::*;
use tokenrace::*;

use Stage::*;

/// llama.cpp's default chain (its samplers that are stages here).
const LLAMA_DEFAULT: [Stage; 7] = [TopNSigma, TopK, Typical, TopP, MinP, Xtc, Temperature];

/// One row's settings (XTC's probability is 1 when its threshold is <= 0.5: always applied).
#[derive(Clone, Copy, Debug)]
struct Params {
    t: f32,
    top_k: i32,
    top_p: f32,
    min_p: f32,
    typical_p: f32,
    xtc_threshold: f32,
    top_n_sigma: f32,
    min_keep: i32,
    dynatemp_range: f32,
}

const OFF: Params = Params {
    t: 1.0,
    top_k: 0,
    top_p: 1.0,
    min_p: 0.0,
    typical_p: 1.0,
    xtc_threshold: 1.0,
    top_n_sigma: 0.0,
    min_keep: 0,
    dynatemp_range: 0.0,
};

fn inv_t(t: f32) -> f64 {
    (1.0f32 / t) as f64
}

/// The float64 reference: the stages of `order` (the temperature last when left out) whose
/// filter is on, in that order, on the kept tokens sorted by logit (rows without ties). Returns
/// the kept set and the 1/T of the draw (0: the first maximum).
fn reference(x: &[f32], order: &[Stage], p: Params) -> (Vec<bool>, f64) {
    let mut kept: Vec<usize> = (0..x.len()).filter(|&i| x[i].is_finite()).collect();
    kept.sort_by(|&a, &b| x[b].total_cmp(&x[a]));
    let min_keep = p.min_keep.max(0) as usize;
    let mut scale = 1.0f64;
    let probs = |kept: &[usize], scale: f64| -> Vec<f64> {
        let top = x[kept[0]] as f64;
        let w: Vec<f64> = kept.iter().map(|&i| ((x[i] as f64 - top) * scale).exp()).collect();
        let z: f64 = w.iter().sum();
        w.iter().map(|w| w / z).collect()
    };
    let mut stages = order.to_vec();
    if !stages.contains(&Temperature) {
        stages.push(Temperature);
    }
    for s in stages {
        match s {
            TopK if p.top_k > 0 => kept.truncate(p.top_k as usize),
            TopP if p.top_p < 1.0 => {
                let q = probs(&kept, scale);
                let mut cum = 0.0;
                let take = (0..q.len()).find(|&j| {
                    cum += q[j];
                    cum >= p.top_p as f64 && j + 1 >= min_keep
                });
                kept.truncate(take.map_or(kept.len(), |j| j + 1));
            }
            MinP if p.min_p > 0.0 => {
                let q = probs(&kept, scale);
                let len = (0..q.len()).take_while(|&j| q[j] >= p.min_p as f64 * q[0] || j < min_keep).count();
                kept.truncate(len);
            }
            Typical if p.typical_p < 1.0 => {
                let q = probs(&kept, scale);
                let entropy: f64 = -q.iter().filter(|&&q| q > 0.0).map(|&q| q * q.ln()).sum::<f64>();
                let mut by_score: Vec<usize> = (0..kept.len()).collect();
                by_score.sort_by(|&a, &b| ((-q[a].ln() - entropy).abs()).total_cmp(&(-q[b].ln() - entropy).abs()));
                let mut cum = 0.0;
                let take = (0..by_score.len()).find(|&j| {
                    cum += q[by_score[j]];
                    cum > p.typical_p as f64 && j + 1 >= min_keep
                });
                let mut chosen: Vec<usize> =
                    by_score[..take.map_or(kept.len(), |j| j + 1)].iter().map(|&o| kept[o]).collect();
                chosen.sort_by(|&a, &b| x[b].total_cmp(&x[a]));
                kept = chosen;
            }
            Xtc if p.xtc_threshold <= 0.5 => {
                let q = probs(&kept, scale);
                let above = q.iter().take_while(|&&q| q >= p.xtc_threshold as f64).count();
                if above >= 2 && kept.len() - (above - 1) >= min_keep {
                    kept.drain(..above - 1);
                }
            }
            TopNSigma if p.top_n_sigma > 0.0 => {
                let v: Vec<f64> = kept.iter().map(|&i| x[i] as f64).collect();
                let mean = v.iter().sum::<f64>() / v.len() as f64;
                let sigma = (v.iter().map(|a| (a - mean) * (a - mean)).sum::<f64>() / v.len() as f64).sqrt();
                let len = v.iter().take_while(|&&a| a >= v[0] - p.top_n_sigma as f64 * sigma).count();
                kept.truncate(len);
            }
            Temperature => scale = inv_t(p.t),
            _ => {}
        }
    }
    // A dynamic temperature: the stages after the temperature judged at the base T; the draw
    // runs at T' of the tokens the whole chain keeps (temperature 1).
    if p.dynatemp_range > 0.0 && kept.len() > 1 {
        let q = probs(&kept, 1.0);
        let entropy: f64 = -q.iter().filter(|&&q| q > 0.0).map(|&q| q * q.ln()).sum::<f64>();
        let (lo, hi) = ((p.t as f64 - p.dynatemp_range as f64).max(0.0), (p.t + p.dynatemp_range) as f64);
        let dynamic = lo + (hi - lo) * (entropy / (kept.len() as f64).ln()).max(0.0);
        if dynamic <= 0.0 {
            kept.truncate(1);
        } else {
            scale = inv_t(dynamic as f32);
        }
    }
    let mut set = vec![false; x.len()];
    for i in kept {
        set[i] = true;
    }
    (set, scale)
}

/// The probabilities of the draw: softmax at `scale` over the kept set.
fn draw_probs(x: &[f32], (kept, scale): &(Vec<bool>, f64)) -> Vec<f64> {
    let m = x.iter().zip(kept).filter(|(_, &k)| k).fold(f64::NEG_INFINITY, |a, (&v, _)| a.max(v as f64));
    let w: Vec<f64> = x.iter().zip(kept).map(|(&v, &k)| if k { ((v as f64 - m) * scale).exp() } else { 0.0 }).collect();
    let z: f64 = w.iter().sum();
    w.iter().map(|w| w / z).collect()
}

/// Per-row arrays of `rows` rows of settings `p`.
struct Rows {
    t: Vec<f32>,
    top_k: Vec<i32>,
    top_p: Vec<f32>,
    min_p: Vec<f32>,
    typical_p: Vec<f32>,
    xtc_probability: Vec<f32>,
    xtc_threshold: Vec<f32>,
    top_n_sigma: Vec<f32>,
    min_keep: Vec<i32>,
    dynatemp_range: Vec<f32>,
}

impl Rows {
    fn of(ps: &[Params]) -> Rows {
        Rows {
            t: ps.iter().map(|p| p.t).collect(),
            top_k: ps.iter().map(|p| p.top_k).collect(),
            top_p: ps.iter().map(|p| p.top_p).collect(),
            min_p: ps.iter().map(|p| p.min_p).collect(),
            typical_p: ps.iter().map(|p| p.typical_p).collect(),
            xtc_probability: ps.iter().map(|p| if p.xtc_threshold <= 0.5 { 1.0 } else { 0.0 }).collect(),
            xtc_threshold: ps.iter().map(|p| p.xtc_threshold).collect(),
            top_n_sigma: ps.iter().map(|p| p.top_n_sigma).collect(),
            min_keep: ps.iter().map(|p| p.min_keep).collect(),
            dynatemp_range: ps.iter().map(|p| p.dynatemp_range).collect(),
        }
    }

    fn batch<'a>(&'a self, x: &'a [f32], vocab: usize, order: Option<&'a [Stage]>) -> Batch<'a> {
        Batch {
            temperature: Some(&self.t),
            top_k: Some(&self.top_k),
            top_p: Some(&self.top_p),
            min_p: Some(&self.min_p),
            typical_p: Some(&self.typical_p),
            xtc_probability: Some(&self.xtc_probability),
            xtc_threshold: Some(&self.xtc_threshold),
            top_n_sigma: Some(&self.top_n_sigma),
            min_keep: Some(&self.min_keep),
            dynatemp_range: Some(&self.dynatemp_range),
            order,
            ..Batch::new(Logits::F32(x), self.t.len(), vocab)
        }
    }
}

fn sampler_with(level: SimdLevel, seed: u64, threads: usize, order: FilterOrder) -> Sampler {
    Sampler::new(Config { threads, filter_order: order, ..sampler(level, seed).config().clone() }).unwrap()
}

/// A row of distinct normal logits.
fn row(rng: &mut TestRng, vocab: usize, sd: f64) -> Vec<f32> {
    (0..vocab).map(|_| (rng.normal() * sd) as f32).collect()
}

/// Frequencies of `calls` calls of `per_call` copies of row `x` with settings `p` under `order`.
fn counts(x: &[f32], p: Params, order: &[Stage], (per_call, calls): (usize, usize)) -> Vec<u64> {
    let vocab = x.len();
    let all: Vec<f32> = (0..per_call).flat_map(|_| x.iter().copied()).collect();
    let rows = Rows::of(&vec![p; per_call]);
    let b = rows.batch(&all, vocab, Some(order));
    let s = sampler_with(best_level(), 17, 1, FilterOrder::TemperatureFirst);
    let mut counts = vec![0u64; vocab];
    for _ in 0..calls {
        for t in draw(&s, &b).0 {
            counts[t as usize] += 1;
        }
    }
    counts
}

fn passes(counts: &[u64], want: &[f64]) -> bool {
    if counts.iter().zip(want).any(|(&c, &p)| c > 0 && p == 0.0) {
        return false;
    }
    let (stat, dof) = chi2(counts, want);
    stat < chi2_critical(dof, 5.0)
}

/// Cases whose order is neither fixed order, each with a different order the power check must
/// reject.
fn cases() -> Vec<(&'static str, Vec<Stage>, Params, Vec<Stage>)> {
    vec![
        (
            "top-p after the temperature",
            vec![Temperature, TopP],
            Params { t: 2.0, top_p: 0.6, ..OFF },
            vec![TopP, Temperature],
        ),
        (
            "top-p before top-k",
            vec![TopP, TopK, Temperature],
            Params { t: 0.8, top_p: 0.7, top_k: 10, ..OFF },
            vec![TopK, TopP, Temperature],
        ),
        (
            "llama.cpp's default chain",
            LLAMA_DEFAULT.to_vec(),
            Params { t: 1.4, top_k: 30, typical_p: 0.9, top_p: 0.95, min_p: 0.05, min_keep: 3, ..OFF },
            vec![MinP, TopK, Typical, TopP, Temperature],
        ),
        (
            "min-p after typical",
            vec![Typical, MinP, Temperature],
            Params { t: 0.7, typical_p: 0.5, min_p: 0.3, ..OFF },
            vec![MinP, Typical, Temperature],
        ),
        (
            "XTC before top-k",
            vec![Xtc, TopK, Temperature],
            Params { t: 1.0, xtc_threshold: 0.05, top_k: 5, ..OFF },
            vec![TopK, Xtc, Temperature],
        ),
        (
            "top-nσ after top-k",
            vec![TopK, TopNSigma],
            Params { t: 1.2, top_k: 12, top_n_sigma: 0.8, ..OFF },
            vec![TopNSigma, TopK],
        ),
        (
            "top-p after a dynamic temperature",
            vec![TopK, Temperature, TopP],
            Params { t: 0.6, top_k: 20, top_p: 0.5, dynatemp_range: 0.4, ..OFF },
            vec![TopK, TopP, Temperature],
        ),
    ]
}

/// Each order draws softmax at its final temperature over the reference's set; the set and
/// temperature of the other order are rejected.
#[test]
fn frequencies_match_the_reference_and_another_order_is_rejected() {
    let mut rng = TestRng::new(301);
    for (name, order, p, other) in cases() {
        let x = row(&mut rng, 40, 1.5);
        let want = reference(&x, &order, p);
        let unwanted = reference(&x, &other, p);
        assert_ne!(want, unwanted, "{name}: the two orders must differ for the power check");
        let got = counts(&x, p, &order, (2000, 30));
        let (stat, dof) = chi2(&got, &draw_probs(&x, &want));
        assert!(stat < chi2_critical(dof, 5.0), "{name}: chi2 {stat} dof {dof}");
        assert!(!passes(&got, &draw_probs(&x, &unwanted)), "{name}: the order {other:?} was not rejected");
    }
}

/// Settings with every stage on, different per row.
fn mixed_params(rng: &mut TestRng, rows: usize) -> Vec<Params> {
    (0..rows)
        .map(|r| Params {
            t: [1.0, 0.7, 1.3, 0.5][r % 4],
            top_k: [0, 50, 400, 3000][rng.below(4)],
            top_p: [1.0, 0.9, 0.6][rng.below(3)],
            min_p: [0.0, 0.02, 0.1][rng.below(3)],
            typical_p: [1.0, 0.95, 0.7][rng.below(3)],
            xtc_threshold: [1.0, 0.01, 0.1][rng.below(3)],
            top_n_sigma: [0.0, 2.0, 1.0][rng.below(3)],
            min_keep: [0, 2, 20][rng.below(3)],
            dynatemp_range: [0.0, 0.0, 0.5][rng.below(3)],
        })
        .collect()
}

/// The fixed orders' lists draw, seeded, what the sampler configured with that order draws,
/// whatever the sampler's own order; and so does a shorter list in the same relative order.
#[test]
fn the_fixed_orders_are_lists_with_bit_identical_tokens() {
    let mut rng = TestRng::new(307);
    let (rows, vocab) = (48usize, 5000usize);
    let x: Vec<f32> = (0..rows).flat_map(|_| row(&mut rng, vocab, 2.0)).collect();
    let ps = mixed_params(&mut rng, rows);
    let v = Rows::of(&ps);
    let seeds: Vec<u64> = (0..rows as u64).map(|r| 40 + r).collect();
    let seeded = |order: Option<&'static [Stage]>| Batch { seeds: Some(&seeds), ..v.batch(&x, vocab, order) };
    for (fixed, list) in
        [(FilterOrder::TemperatureFirst, &TEMPERATURE_FIRST), (FilterOrder::FiltersFirst, &FILTERS_FIRST)]
    {
        let want = draw(&sampler_with(best_level(), 5, 1, fixed), &seeded(None)).0;
        for config in [FilterOrder::TemperatureFirst, FilterOrder::FiltersFirst] {
            let got = draw(&sampler_with(best_level(), 5, 1, config), &seeded(Some(list))).0;
            assert_eq!(got, want, "{fixed:?} as a list on a {config:?} sampler");
        }
    }
    // Rows with top-k and top-p alone follow llama.cpp's fixed order in its default chain.
    let only: Vec<Params> = ps.iter().map(|p| Params { top_k: p.top_k, top_p: p.top_p, t: p.t, ..OFF }).collect();
    let v = Rows::of(&only);
    let b = |order: Option<&'static [Stage]>| Batch { seeds: Some(&seeds), ..v.batch(&x, vocab, order) };
    let want = draw(&sampler_with(best_level(), 5, 1, FilterOrder::FiltersFirst), &b(None)).0;
    let got = draw(&sampler_with(best_level(), 5, 1, FilterOrder::TemperatureFirst), &b(Some(&LLAMA_DEFAULT))).0;
    assert_eq!(got, want, "llama.cpp's default chain on top-k + top-p rows");
}

/// Seeded tokens of orders that are neither fixed order: the same at every SIMD level and
/// thread count, each row alone as in the batch, and always in the reference's kept set.
#[test]
fn seeded_tokens_of_a_composed_order_do_not_depend_on_level_threads_or_batch() {
    let mut rng = TestRng::new(311);
    let (rows, vocab) = (24usize, 20_000usize);
    let x: Vec<f32> = (0..rows).flat_map(|_| row(&mut rng, vocab, 2.0)).collect();
    let ps = mixed_params(&mut rng, rows);
    let v = Rows::of(&ps);
    let seeds: Vec<u64> = (0..rows as u64).map(|r| 900 + r).collect();
    for order in [LLAMA_DEFAULT.to_vec(), vec![TopP, TopNSigma, Xtc, Temperature, MinP, Typical, TopK]] {
        let b = Batch { seeds: Some(&seeds), ..v.batch(&x, vocab, Some(&order)) };
        let mut first: Option<Vec<i32>> = None;
        each_level(|level| {
            for threads in [1usize, 4] {
                let got = draw(&sampler_with(level, 3, threads, FilterOrder::TemperatureFirst), &b).0;
                match &first {
                    None => first = Some(got),
                    Some(f) => assert_eq!(&got, f, "{order:?}: {level:?} threads {threads}"),
                }
            }
        });
        let tokens = first.unwrap();
        for r in 0..rows {
            let xr = &x[r * vocab..(r + 1) * vocab];
            let (kept, _) = reference(xr, &order, ps[r]);
            assert!(kept[tokens[r] as usize], "{order:?}: row {r} token {} outside the kept set", tokens[r]);
            let v1 = Rows::of(&ps[r..r + 1]);
            let b1 = Batch { seeds: Some(&seeds[r..r + 1]), ..v1.batch(xr, vocab, Some(&order)) };
            assert_eq!(draw(&sampler(best_level(), 99), &b1).0[0], tokens[r], "{order:?}: row {r} alone");
        }
    }
}

/// A stage listed twice, and a filter on without its stage, are refused naming the position or
/// the field and row; nothing is written and the sampler's stream does not move.
#[test]
fn bad_orders_are_refused_and_change_nothing() {
    let mut rng = TestRng::new(313);
    let vocab = 300;
    let x: Vec<f32> = (0..2).flat_map(|_| row(&mut rng, vocab, 1.0)).collect();
    let v = Rows::of(&[Params { top_k: 5, ..OFF }, Params { top_p: 0.5, ..OFF }]);
    let s = sampler(best_level(), 9);
    let twice = [TopK, TopP, TopK];
    let missing = [TopK, Temperature];
    for (order, field) in [(&twice[..], "order[2]"), (&missing[..], "top_p[1]")] {
        let mut tokens = vec![-7; 2];
        let e = s.draw(&v.batch(&x, vocab, Some(order)), &mut Output::new(&mut tokens)).unwrap_err();
        assert!(e.message.contains(field), "{order:?}: {}", e.message);
        assert_eq!(tokens, [-7, -7]);
    }
    // The refused calls took no key: the next call draws what a fresh sampler's first call draws.
    let ok = [TopP, TopK];
    let fresh = sampler(best_level(), 9);
    assert_eq!(draw(&s, &v.batch(&x, vocab, Some(&ok))).0, draw(&fresh, &v.batch(&x, vocab, Some(&ok))).0);
}

/// The C batch's order: ids checked with their position (reserved and unknown ones refused),
/// the fields after `logprob_token_offsets`, NULL as before.
#[test]
fn the_c_order_is_checked_by_position() {
    use tokenrace::internals::api::*;
    use tokenrace::internals::types::*;
    let vocab = 64u32;
    let x: Vec<f32> = (0..vocab).map(|i| (i as f32 * 0.37).sin()).collect();
    let top_p = [0.5f32];
    // SAFETY: a valid config; every pointer below covers what its sizes say.
    unsafe {
        let mut s = std::ptr::null_mut();
        assert_eq!(tokenrace_sampler_new(&tokenrace_config_default(), &mut s), tokenrace_status::Ok);
        let mut b: tokenrace_batch = std::mem::zeroed();
        b.struct_size = std::mem::size_of::<tokenrace_batch>() as u32;
        b.logits = x.as_ptr().cast();
        b.rows = 1;
        b.vocab = vocab;
        b.top_p = top_p.as_ptr();
        let mut tok = [-5i32];
        let mut o: tokenrace_output = std::mem::zeroed();
        o.struct_size = std::mem::size_of::<tokenrace_output>() as u32;
        o.tokens = tok.as_mut_ptr();
        for (ids, what) in [
            (vec![2u32, 7, 8], "order[2]: stage 8 (dry) is not in this build"),
            (vec![2, 9], "order[1]: stage 9 (mirostat) is not in this build"),
            (vec![2, 0], "order[1]: 0 is not a tokenrace_stage"),
            (vec![2, 7, 2], "order[2]: stage top_p is listed twice"),
        ] {
            b.order = ids.as_ptr();
            b.order_len = ids.len() as u64;
            assert_eq!(tokenrace_draw(s, &b, &mut o), tokenrace_status::InvalidArgument);
            assert!(last_error().contains(what), "{}", last_error());
            assert_eq!(tok, [-5]);
        }
        let ids = [tokenrace_stage::TopP as u32, tokenrace_stage::Temperature as u32];
        b.order = ids.as_ptr();
        b.order_len = 0;
        assert_eq!(tokenrace_draw(s, &b, &mut o), tokenrace_status::InvalidArgument);
        b.order_len = 2;
        assert_eq!(tokenrace_draw(s, &b, &mut o), tokenrace_status::Ok);
        assert!((0..vocab as i32).contains(&tok[0]));
        tokenrace_sampler_free(s);
    }
}
