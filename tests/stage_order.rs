//! An order of the filter stages that the caller composes (`Batch::order`): the kept sets
//! against a float64 reference that applies llama.cpp's stages in the given order (each on what
//! the ones before it kept, renormalised; a stage after the temperature judges `softmax(x / T)`),
//! frequencies with a power check (the same stages in another order are rejected), seeded
//! bit-identity across SIMD levels and threads, the two fixed orders as lists drawing what the
//! sampler's `filter_order` draws, and refusals.
mod common;

use common::*;
use tokenrace::internals::{kept_range_in_order_at, LlamaFilters};
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

use Stage::*;

/// llama.cpp's default chain.
const LLAMA_DEFAULT: [Stage; 6] = [TopK, Typical, TopP, MinP, Xtc, Temperature];

/// Every filter setting of a row the tests use beyond `LlamaFilters`.
#[derive(Clone, Copy, Debug)]
struct Extra {
    top_n_sigma: f32,
    dynatemp_range: f32,
    dynatemp_exponent: f32,
}

const NO_EXTRA: Extra = Extra { top_n_sigma: 0.0, dynatemp_range: 0.0, dynatemp_exponent: 1.0 };

fn inv_t32(t: f32) -> f64 {
    (1.0f32 / t) as f64
}

/// The float64 reference: the stages of `order` (the temperature last when left out), each on
/// the tokens the previous ones kept (most probable first), at the current scale (1 before the
/// temperature, 1/T or 1/T' after it). Returns the kept set and the dynamic temperature.
fn reference(x: &[f32], t: f32, f: LlamaFilters, e: Extra, order: &[Stage]) -> (Vec<bool>, Option<f64>) {
    let mut kept: Vec<usize> = (0..x.len()).filter(|&i| x[i].is_finite()).collect();
    kept.sort_by(|&a, &b| x[b].total_cmp(&x[a]));
    let min_keep = f.min_keep.max(0) as usize;
    let mut scale = 1.0f64;
    let mut dynamic = None;
    let probs = |kept: &[usize], scale: f64| -> Vec<f64> {
        let m = x[kept[0]] as f64;
        let w: Vec<f64> = kept.iter().map(|&i| ((x[i] as f64 - m) * scale).exp()).collect();
        let z: f64 = w.iter().sum();
        w.iter().map(|w| w / z).collect()
    };
    let mut stages = order.to_vec();
    if !stages.contains(&Temperature) {
        stages.push(Temperature);
    }
    for s in stages {
        match s {
            TopK if f.top_k > 0 => kept.truncate(f.top_k as usize),
            TopP if f.top_p < 1.0 => {
                let p = probs(&kept, scale);
                let mut cum = 0.0;
                let take = (0..p.len())
                    .find(|&j| {
                        cum += p[j];
                        cum >= f.top_p as f64 && j + 1 >= min_keep
                    })
                    .map_or(p.len(), |j| j + 1);
                kept.truncate(take);
            }
            MinP if f.min_p > 0.0 => {
                let p = probs(&kept, scale);
                let len = (0..p.len()).take_while(|&j| p[j] >= f.min_p as f64 * p[0] || j < min_keep).count();
                kept.truncate(len.max(1));
            }
            Typical if f.typical_p < 1.0 => {
                let p = probs(&kept, scale);
                let entropy: f64 = -p.iter().filter(|&&p| p > 0.0).map(|&p| p * p.ln()).sum::<f64>();
                let score = |j: usize| (-p[j].ln() - entropy).abs();
                let mut by_score: Vec<usize> = (0..kept.len()).collect();
                by_score.sort_by(|&a, &b| score(a).total_cmp(&score(b)));
                let mut cum = 0.0;
                let take = (0..by_score.len())
                    .find(|&j| {
                        cum += p[by_score[j]];
                        cum > f.typical_p as f64 && j + 1 >= min_keep
                    })
                    .map_or(by_score.len(), |j| j + 1);
                let mut chosen: Vec<usize> = by_score[..take].iter().map(|&j| kept[j]).collect();
                chosen.sort_by(|&a, &b| x[b].total_cmp(&x[a]));
                kept = chosen;
            }
            Xtc if f.xtc_probability > 0.0 && f.xtc_threshold <= 0.5 => {
                let p = probs(&kept, scale);
                let above = p.iter().take_while(|&&q| q >= f.xtc_threshold as f64).count();
                if above >= 2 && kept.len() - (above - 1) >= min_keep {
                    kept.drain(..above - 1);
                }
            }
            TopNSigma if e.top_n_sigma > 0.0 && kept.len() > 1 => {
                let n = kept.len() as f64;
                let mean = kept.iter().map(|&i| x[i] as f64).sum::<f64>() / n;
                let var = kept.iter().map(|&i| (x[i] as f64 - mean).powi(2)).sum::<f64>() / n;
                let threshold = x[kept[0]] as f64 - e.top_n_sigma as f64 * var.sqrt();
                kept.retain(|&i| x[i] as f64 >= threshold);
            }
            Temperature => scale = inv_t32(t),
            _ => {}
        }
    }
    // A dynamic temperature: over what the whole chain keeps (temperature 1), for the draw.
    if e.dynatemp_range > 0.0 && kept.len() > 1 {
        let p = probs(&kept, 1.0);
        let entropy: f64 = -p.iter().filter(|&&p| p > 0.0).map(|&p| p * p.ln()).sum::<f64>();
        let normalized = (entropy / (kept.len() as f64).ln()).max(0.0);
        let (range, t) = (e.dynatemp_range as f64, t as f64);
        let (low, high) = ((t - range).max(0.0), t + range);
        dynamic = Some(low + (high - low) * normalized.powf(e.dynatemp_exponent as f64));
    }
    let mut set = vec![false; x.len()];
    for i in kept {
        set[i] = true;
    }
    (set, dynamic)
}

/// The library's kept set (and dynamic temperature) at `level`.
fn kept_at(
    level: SimdLevel,
    x: &[f32],
    t: f32,
    f: LlamaFilters,
    e: Extra,
    order: &[Stage],
) -> (Vec<bool>, Option<f64>) {
    let ((lo, hi), dynamic) =
        kept_range_in_order_at(level, x, t, f, (e.top_n_sigma, e.dynatemp_range, e.dynatemp_exponent), order).unwrap();
    (x.iter().map(|&v| v.is_finite() && v >= lo && v <= hi).collect(), dynamic)
}

/// Distinct random rows (no ties), some with masked tokens.
fn rows() -> Vec<Vec<f32>> {
    let mut rng = TestRng::new(211);
    let mut out = Vec::new();
    for &n in &[6usize, 40, 257, 2000] {
        for sd in [0.7, 2.5] {
            let mut x: Vec<f32> = (0..n).map(|_| (rng.normal() * sd) as f32).collect();
            if n > 40 {
                for i in (0..n).step_by(9) {
                    x[i] = if i % 2 == 0 { NINF } else { f32::NAN };
                }
            }
            out.push(x);
        }
    }
    out
}

fn orders() -> Vec<Vec<Stage>> {
    vec![
        LLAMA_DEFAULT.to_vec(),
        vec![TopP, Temperature, MinP],
        vec![Temperature, TopP, TopK],
        vec![MinP, TopNSigma, TopK, Temperature, Typical],
        vec![Xtc, TopK, Temperature, TopP, TopNSigma],
        vec![Typical, Temperature, Xtc, MinP],
        vec![Temperature, TopNSigma, MinP, TopK, Typical, TopP, Xtc],
        vec![TopNSigma, MinP, TopK, Typical, TopP, Xtc, Temperature],
        vec![TopK, MinP, Xtc, TopP],
    ]
}

fn settings() -> Vec<(LlamaFilters, Extra)> {
    let mut v = Vec::new();
    for min_keep in [0, 3] {
        for (top_k, top_p, min_p, typical_p) in [(0, 0.8f32, 0.05f32, 0.7f32), (20, 0.9, 0.0, 1.0), (30, 0.6, 0.1, 0.5)]
        {
            for (xp, xt) in [(0.0f32, 1.0f32), (1.0, 0.05)] {
                for e in [
                    NO_EXTRA,
                    Extra { top_n_sigma: 1.5, ..NO_EXTRA },
                    Extra { dynatemp_range: 0.5, dynatemp_exponent: 1.3, ..NO_EXTRA },
                ] {
                    let f = LlamaFilters {
                        top_k,
                        top_p,
                        min_p,
                        min_keep,
                        typical_p,
                        xtc_probability: xp,
                        xtc_threshold: xt,
                    };
                    v.push((f, e));
                }
            }
        }
    }
    v
}

/// The kept set equals the float64 reference's, for every order and setting, at every level and
/// at temperatures below, at and above 1; a dynamic temperature agrees to 1e-9.
#[test]
fn kept_sets_match_the_float64_reference_in_every_order_at_every_level() {
    let levels = supported_levels();
    let mut checked = 0;
    for x in &rows() {
        for order in &orders() {
            for &(f, e) in &settings() {
                for t in [0.6f32, 1.0, 1.7] {
                    let (want, want_dyn) = reference(x, t, f, e, order);
                    for &level in &levels {
                        let (got, got_dyn) = kept_at(level, x, t, f, e, order);
                        assert_eq!(got, want, "{level:?} n {} t {t} {order:?} {f:?} {e:?}", x.len());
                        match (got_dyn, want_dyn) {
                            (Some(a), Some(b)) => assert!((a - b).abs() <= 1e-9 * b.abs().max(1.0), "{a} vs {b}"),
                            (a, b) => assert_eq!(a.is_some(), b.is_some(), "dynamic temperature {a:?} vs {b:?}"),
                        }
                        checked += 1;
                    }
                }
            }
        }
    }
    assert!(checked > 1000, "{checked}");
}

struct Rows {
    t: Vec<f32>,
    top_k: Vec<i32>,
    top_p: Vec<f32>,
    min_p: Vec<f32>,
    min_keep: Vec<i32>,
    typical_p: Vec<f32>,
    xtc_probability: Vec<f32>,
    xtc_threshold: Vec<f32>,
    top_n_sigma: Vec<f32>,
    dynatemp_range: Vec<f32>,
    dynatemp_exponent: Vec<f32>,
}

impl Rows {
    fn same(rows: usize, t: f32, f: LlamaFilters, e: Extra) -> Rows {
        Rows {
            t: vec![t; rows],
            top_k: vec![f.top_k; rows],
            top_p: vec![f.top_p; rows],
            min_p: vec![f.min_p; rows],
            min_keep: vec![f.min_keep; rows],
            typical_p: vec![f.typical_p; rows],
            xtc_probability: vec![f.xtc_probability; rows],
            xtc_threshold: vec![f.xtc_threshold; rows],
            top_n_sigma: vec![e.top_n_sigma; rows],
            dynatemp_range: vec![e.dynatemp_range; rows],
            dynatemp_exponent: vec![e.dynatemp_exponent; rows],
        }
    }

    fn batch<'a>(&'a self, x: &'a [f32], vocab: usize, order: Option<&'a [Stage]>) -> Batch<'a> {
        Batch {
            temperature: Some(&self.t),
            top_k: Some(&self.top_k),
            top_p: Some(&self.top_p),
            min_p: Some(&self.min_p),
            min_keep: Some(&self.min_keep),
            typical_p: Some(&self.typical_p),
            xtc_probability: Some(&self.xtc_probability),
            xtc_threshold: Some(&self.xtc_threshold),
            top_n_sigma: Some(&self.top_n_sigma),
            dynatemp_range: Some(&self.dynatemp_range),
            dynatemp_exponent: Some(&self.dynatemp_exponent),
            order,
            ..Batch::new(Logits::F32(x), self.t.len(), vocab)
        }
    }
}

fn sampler_with(level: SimdLevel, seed: u64, threads: usize, order: FilterOrder) -> Sampler {
    Sampler::new(Config { threads, filter_order: order, ..sampler(level, seed).config().clone() }).unwrap()
}

/// Probabilities proportional to exp(x * scale) over a kept set.
fn probs_over(x: &[f32], scale: f64, kept: &[bool]) -> Vec<f64> {
    let m = x.iter().filter(|v| v.is_finite()).fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
    let w: Vec<f64> = x.iter().zip(kept).map(|(&v, &k)| if k { ((v as f64 - m) * scale).exp() } else { 0.0 }).collect();
    let z: f64 = w.iter().sum();
    w.iter().map(|w| w / z).collect()
}

/// Draws with `order` match softmax(x / T) over the reference's set for that order; the set of
/// the same stages in `other` order is rejected (a drawn token it excludes, or chi-square).
fn frequencies_match(x: &[f32], t: f32, (f, e): (LlamaFilters, Extra), order: &[Stage], other: &[Stage]) {
    let vocab = x.len();
    let per_call = 4000;
    let all: Vec<f32> = (0..per_call).flat_map(|_| x.iter().copied()).collect();
    let (right, dyn_right) = reference(x, t, f, e, order);
    let (wrong, dyn_wrong) = reference(x, t, f, e, other);
    let scale = |d: Option<f64>| d.map_or(inv_t32(t), |d| inv_t32(d as f32));
    let (want, unwanted) = (probs_over(x, scale(dyn_right), &right), probs_over(x, scale(dyn_wrong), &wrong));
    assert!(want.iter().zip(&unwanted).any(|(a, b)| (a - b).abs() > 0.02), "{order:?} vs {other:?} must differ");
    let v = Rows::same(per_call, t, f, e);
    let b = v.batch(&all, vocab, Some(order));
    each_level(|level| {
        let s = sampler(level, 19);
        let mut counts = vec![0u64; vocab];
        for _ in 0..15 {
            for tok in draw(&s, &b).0 {
                counts[tok as usize] += 1;
            }
        }
        let (stat, dof) = chi2(&counts, &want);
        assert!(stat < chi2_critical(dof, 5.0), "{level:?} {order:?}: chi2 {stat} dof {dof}");
        let excluded = counts.iter().zip(&unwanted).any(|(&c, &p)| c > 0 && p == 0.0);
        let rejected = excluded || {
            let (stat, dof) = chi2(&counts, &unwanted);
            stat > chi2_critical(dof, 5.0)
        };
        assert!(rejected, "{level:?}: {other:?} not rejected for {order:?}");
    });
}

/// top-p before the temperature judges softmax(x), after it softmax(x / T): each order draws its
/// own set, and the other order's is rejected.
#[test]
fn top_p_before_and_after_the_temperature_are_told_apart() {
    let mut rng = TestRng::new(223);
    let x: Vec<f32> = (0..40).map(|_| (rng.normal() * 1.5) as f32).collect();
    let f = (LlamaFilters { top_p: 0.7, ..OFF }, NO_EXTRA);
    frequencies_match(&x, 0.5, f, &[TopP, Temperature], &[Temperature, TopP]);
    frequencies_match(&x, 0.5, f, &[Temperature, TopP], &[TopP, Temperature]);
}

/// llama.cpp's default chain (min-p after typical and top-p: the candidates' path) against the
/// same stages in the fixed llama.cpp order, and with a dynamic temperature (drawn at T' of
/// the kept set) top-p after the temperature against top-p before it.
#[test]
fn llama_default_chain_and_a_dynamic_temperature_draw_their_sets() {
    let mut rng = TestRng::new(227);
    let x: Vec<f32> = (0..60).map(|_| (rng.normal() * 2.0) as f32).collect();
    let f = LlamaFilters { top_k: 40, typical_p: 0.8, top_p: 0.6, min_p: 0.12, min_keep: 2, ..OFF };
    let filters_first = [TopNSigma, MinP, TopK, Typical, TopP, Xtc, Temperature];
    frequencies_match(&x, 0.8, (f, NO_EXTRA), &LLAMA_DEFAULT, &filters_first);
    let e = Extra { dynatemp_range: 0.6, dynatemp_exponent: 1.0, ..NO_EXTRA };
    let f = LlamaFilters { top_p: 0.5, ..OFF };
    frequencies_match(&x, 0.9, (f, e), &[Temperature, TopP], &[TopP, Temperature]);
}

/// Whether `order` lists every stage the settings turn on (the call refuses it otherwise).
fn lists_every_filter(order: &[Stage], &(f, e): &(LlamaFilters, Extra)) -> bool {
    let on = [
        (TopK, f.top_k > 0),
        (TopP, f.top_p < 1.0),
        (MinP, f.min_p > 0.0),
        (Typical, f.typical_p < 1.0),
        (Xtc, f.xtc_probability > 0.0 && f.xtc_threshold <= 0.5),
        (TopNSigma, e.top_n_sigma > 0.0),
    ];
    on.iter().all(|&(s, on)| !on || order.contains(&s))
}

/// Seeded rows of several orders: the same tokens at every SIMD level and on 1 and 4 threads,
/// each in its reference set; the two fixed orders as lists draw what the sampler configured
/// with that order draws (a dynamic temperature too with the llama.cpp one).
#[test]
fn seeded_tokens_are_bit_identical_and_the_fixed_orders_are_presets() {
    let mut rng = TestRng::new(229);
    let (rows, vocab) = (8usize, 3000usize);
    let x: Vec<f32> = (0..rows * vocab).map(|_| (rng.normal() * 2.0) as f32).collect();
    let seeds: Vec<u64> = (0..rows as u64).map(|s| s * 7 + 1).collect();
    let settings = settings();
    for order in orders() {
        for (i, &(f, e)) in settings.iter().enumerate().step_by(5).filter(|(_, s)| lists_every_filter(&order, s)) {
            let t = [0.7f32, 1.0, 1.4][i % 3];
            let v = Rows::same(rows, t, f, e);
            let b = Batch { seeds: Some(&seeds), ..v.batch(&x, vocab, Some(&order)) };
            let want = draw(&sampler_with(SimdLevel::Scalar, 3, 1, FilterOrder::TemperatureFirst), &b).0;
            for r in 0..rows {
                let (set, _) = reference(&x[r * vocab..(r + 1) * vocab], t, f, e, &order);
                assert!(set[want[r] as usize], "row {r} drew {} outside {order:?}'s set, t {t} {f:?} {e:?}", want[r]);
            }
            each_level(|level| {
                for threads in [1, 4] {
                    for config_order in [FilterOrder::TemperatureFirst, FilterOrder::FiltersFirst] {
                        let got = draw(&sampler_with(level, 3, threads, config_order), &b).0;
                        assert_eq!(got, want, "{level:?} {threads} threads {order:?} {f:?} {e:?}");
                    }
                }
            });
        }
    }
    for (preset, config_order) in
        [(&TEMPERATURE_FIRST, FilterOrder::TemperatureFirst), (&FILTERS_FIRST, FilterOrder::FiltersFirst)]
    {
        for &(f, e) in &settings {
            // The vLLM order judges the filters at T and races at T': no list says that.
            if config_order == FilterOrder::TemperatureFirst && e.dynatemp_range > 0.0 {
                continue;
            }
            let v = Rows::same(rows, 0.7, f, e);
            let listed = Batch { seeds: Some(&seeds), ..v.batch(&x, vocab, Some(preset)) };
            let configured = Batch { order: None, ..listed };
            each_level(|level| {
                let s = sampler_with(level, 3, 1, config_order);
                assert_eq!(draw(&s, &listed).0, draw(&s, &configured).0, "{config_order:?} {f:?} {e:?}");
            });
        }
    }
}

/// A stage listed twice, a filter on whose stage the order leaves out, processed logprobs for a
/// row drawn by the list's rule: refused, naming the field and the position or row, and nothing
/// is written.
#[test]
fn bad_orders_are_refused_and_write_nothing() {
    let s = sampler(best_level(), 0);
    let x: Vec<f32> = (0..40).map(|i| (i % 7) as f32 + i as f32 * 0.01).collect();
    let v = Rows::same(4, 0.8, LlamaFilters { top_p: 0.9, ..OFF }, NO_EXTRA);
    let twice = [TopP, Temperature, TopP];
    let missing = [TopK, Temperature];
    for (order, needle) in
        [(&twice[..], "order[2]: stage top_p is listed twice"), (&missing[..], "top_p[0]: on for this row")]
    {
        let b = v.batch(&x, 10, Some(order));
        let (mut tokens, mut lps) = (vec![-7; 4], vec![5f32; 4]);
        let mut out = Output { logprobs: Some(&mut lps), ..Output::new(&mut tokens) };
        let err = s.draw(&b, &mut out).unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidArgument);
        assert!(err.message.contains(needle), "{:?} does not name {needle}", err.message);
        assert!(tokens.iter().all(|&v| v == -7) && lps.iter().all(|&v| v == 5.0), "a failed call wrote");
    }
    // top-nσ after top-k: its sigma is over the top-k set, a range of sorted candidates.
    let custom = [TopK, TopNSigma, TopP, Temperature];
    let w = Rows::same(4, 0.8, LlamaFilters { top_p: 0.9, top_k: 3, ..OFF }, Extra { top_n_sigma: 1.0, ..NO_EXTRA });
    let b = w.batch(&x, 10, Some(&custom));
    let (mut tokens, mut lps) = (vec![-7; 4], vec![5f32; 4]);
    let mut out = Output { logprobs: Some(&mut lps), logprob_mode: LogprobMode::Processed, ..Output::new(&mut tokens) };
    let err = s.draw(&b, &mut out).unwrap_err();
    assert!(err.message.contains("logprob_mode[0]"), "{}", err.message);
    assert!(tokens.iter().all(|&v| v == -7), "a failed call wrote");
}

/// A composed order whose stages each keep a top set (here top-p before min-p and top-k, the
/// temperature between them) is one floor: its PROCESSED logprobs are log_softmax(x / T) over
/// the reference's kept set, and its seeded tokens are the same at every level.
#[test]
fn a_composed_order_of_top_sets_gives_processed_logprobs() {
    let mut rng = TestRng::new(239);
    let (rows, vocab) = (16usize, 3000usize);
    let x: Vec<f32> = (0..rows * vocab).map(|_| (rng.normal() * 2.0) as f32).collect();
    let seeds: Vec<u64> = (0..rows as u64).collect();
    let order = [TopP, MinP, Temperature, TopK];
    let (t, f) = (0.6f32, LlamaFilters { top_p: 0.9, min_p: 0.05, top_k: 30, min_keep: 2, ..OFF });
    let v = Rows::same(rows, t, f, NO_EXTRA);
    let b = Batch { seeds: Some(&seeds), ..v.batch(&x, vocab, Some(&order)) };
    let mut first: Option<Vec<i32>> = None;
    each_level(|level| {
        let (mut tokens, mut lps) = (vec![-7; rows], vec![5f32; rows]);
        let mut out =
            Output { logprobs: Some(&mut lps), logprob_mode: LogprobMode::Processed, ..Output::new(&mut tokens) };
        sampler(level, 4).draw(&b, &mut out).unwrap();
        for r in 0..rows {
            let row = &x[r * vocab..(r + 1) * vocab];
            let (set, _) = reference(row, t, f, NO_EXTRA, &order);
            let want = probs_over(row, inv_t32(t), &set)[tokens[r] as usize].ln();
            assert!(set[tokens[r] as usize], "{level:?} row {r}");
            assert!((lps[r] as f64 - want).abs() < 1e-4, "{level:?} row {r}: {} vs {want}", lps[r]);
        }
        match &first {
            None => first = Some(tokens),
            Some(f) => assert_eq!(&tokens, f, "{level:?}"),
        }
    });
}

/// The C fields: `order` and `order_len` at the end of the batch; unknown and reserved ids are
/// refused with their position; NULL is the sampler's order.
#[test]
fn c_order_ids_are_checked_and_null_is_the_configured_order() {
    use std::mem::{offset_of, size_of};
    use tokenrace::internals::api::*;
    use tokenrace::internals::types::*;
    assert_eq!(offset_of!(tokenrace_batch, order), 400);
    assert_eq!(offset_of!(tokenrace_batch, order_len), 408);
    assert_eq!(offset_of!(tokenrace_batch, dry_multiplier), 416);
    for (c, s) in [
        (tokenrace_stage::TopK, TopK),
        (tokenrace_stage::TopP, TopP),
        (tokenrace_stage::MinP, MinP),
        (tokenrace_stage::Typical, Typical),
        (tokenrace_stage::Xtc, Xtc),
        (tokenrace_stage::TopNSigma, TopNSigma),
        (tokenrace_stage::Temperature, Temperature),
    ] {
        assert_eq!(c as u32, s as u32, "{s:?}");
        assert_eq!(Stage::from_id(c as u32), Some(s));
    }
    assert_eq!(RESERVED_STAGE_IDS.map(|(id, _)| id), [8, 9]);
    let mut rng = TestRng::new(233);
    let x: Vec<f32> = (0..50).map(|_| (rng.normal() * 2.0) as f32).collect();
    let (tp, t, seeds) = ([0.6f32], [0.5f32], [9u64]);
    unsafe {
        let mut s = std::ptr::null_mut();
        assert_eq!(tokenrace_sampler_new(&tokenrace_config_default(), &mut s), tokenrace_status::Ok);
        let mut b: tokenrace_batch = std::mem::zeroed();
        b.struct_size = size_of::<tokenrace_batch>() as u32;
        b.logits = x.as_ptr() as *const _;
        b.rows = 1;
        b.vocab = 50;
        b.top_p = tp.as_ptr();
        b.temperature = t.as_ptr();
        b.seeds = seeds.as_ptr();
        let mut tokens = [-7i32; 1];
        let mut o: tokenrace_output = std::mem::zeroed();
        o.struct_size = size_of::<tokenrace_output>() as u32;
        o.tokens = tokens.as_mut_ptr();
        for (ids, needle) in [
            (&[2u32, 7, 11][..], "order[2]: 11 is not a tokenrace_stage"),
            (&[8u32, 2, 7][..], "order[0]: stage 8 (dry) is not in this build"),
            (&[2u32, 9][..], "order[1]: stage 9 (mirostat)"),
        ] {
            b.order = ids.as_ptr();
            b.order_len = ids.len() as u64;
            assert_eq!(tokenrace_draw(s, &b, &mut o), tokenrace_status::InvalidArgument);
            assert!(last_error().contains(needle), "{} does not name {needle}", last_error());
            assert_eq!(tokens, [-7]);
        }
        // The same token through C and through Rust for one order; NULL is the configured order.
        let ids = [TopP as u32, Temperature as u32];
        b.order = ids.as_ptr();
        b.order_len = 2;
        assert_eq!(tokenrace_draw(s, &b, &mut o), tokenrace_status::Ok, "{}", last_error());
        let v = Rows::same(1, 0.5, LlamaFilters { top_p: 0.6, ..OFF }, NO_EXTRA);
        let rust = Batch { seeds: Some(&seeds), ..v.batch(&x, 50, Some(&[TopP, Temperature])) };
        assert_eq!(draw(&Sampler::new(Config::default()).unwrap(), &rust).0, tokens);
        b.order = std::ptr::null();
        b.order_len = 0;
        assert_eq!(tokenrace_draw(s, &b, &mut o), tokenrace_status::Ok);
        let plain = Batch { order: None, ..rust };
        assert_eq!(draw(&Sampler::new(Config::default()).unwrap(), &plain).0, tokens);
        tokenrace_sampler_free(s);
    }
}
