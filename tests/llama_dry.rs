//! llama.cpp's DRY in the sampling step: llama.cpp's own expected tables, the fused processed
//! row against a float64 reference that finds each repeat by brute force (no Z-function), with
//! the penalties, prompt, window, breakers and masks around it, at every SIMD level on 1 and 4
//! threads; frequencies with a power check against two wrong rules; and refusals that write
//! nothing and leave the sampler's stream as it was.
mod common;

use common::reference as rf;
use common::step::*;
use common::{chi2, chi2_critical, softmax64, TestRng};
use tokenrace::*;

/// One row's DRY parameters, as the batch takes them.
#[derive(Clone, Copy, Debug)]
struct Dry {
    multiplier: f32,
    base: f32,
    allowed_length: i32,
    last_n: i32,
}

const LLAMA_DEFAULT: Dry = Dry { multiplier: 0.0, base: 1.75, allowed_length: 2, last_n: -1 };

/// Owned sequence breakers of several rows in the batch's two-level layout.
#[derive(Clone, Default)]
struct Breakers {
    ids: Vec<i32>,
    word_offsets: Vec<u64>,
    row_offsets: Vec<u64>,
}

impl Breakers {
    fn of(rows: &[Vec<Vec<i32>>]) -> Breakers {
        let mut w = Breakers { word_offsets: vec![0], row_offsets: vec![0], ..Breakers::default() };
        for row in rows {
            for word in row {
                w.ids.extend_from_slice(word);
                w.word_offsets.push(w.ids.len() as u64);
            }
            w.row_offsets.push(w.word_offsets.len() as u64 - 1);
        }
        w
    }

    fn view(&self) -> BadWords<'_> {
        BadWords { ids: &self.ids, word_offsets: &self.word_offsets, row_offsets: &self.row_offsets }
    }
}

/// What a reference gets wrong on purpose (the power checks).
#[derive(Clone, Copy, PartialEq, Debug)]
enum Rule {
    Llama,
    /// The exponent one too high (the repeat counted with the token it would add).
    ExponentPlusOne,
    /// The breakers ignored.
    NoBreakers,
}

/// DRY's (token, penalty) pairs of the history `h` (prompt ++ output), found by brute force: for
/// every end of the window, its longest common suffix with the window, compared token by token.
fn dry_reference(h: &[i32], breakers: &[Vec<i32>], d: Dry, rule: Rule) -> Vec<(usize, f32)> {
    if d.multiplier == 0.0 || d.base < 1.0 || d.last_n == 0 {
        return vec![];
    }
    let w = if d.last_n < 0 { h } else { &h[h.len().saturating_sub(d.last_n as usize)..] };
    let (len, allowed) = (w.len(), d.allowed_length as usize);
    if len <= allowed {
        return vec![];
    }
    let breakers: &[Vec<i32>] = if rule == Rule::NoBreakers { &[] } else { breakers };
    // The tokens after the last complete breaker (its longest tail at the head nearest the end).
    let mut limit = len;
    'scan: for head in (0..len).rev() {
        let mut longest: Option<usize> = None;
        for b in breakers.iter().filter(|b| b[0] == w[head]) {
            let tail = &b[1..];
            if head + tail.len() < len && tail.iter().enumerate().all(|(j, &t)| w[head + 1 + j] == t) {
                longest = Some(longest.map_or(tail.len(), |l: usize| l.max(tail.len())));
            }
        }
        if let Some(t) = longest {
            limit = len - 1 - head - t;
            break 'scan;
        }
    }
    if limit < allowed {
        return vec![];
    }
    let mut best: std::collections::BTreeMap<i32, usize> = Default::default();
    for i in 0..len - 1 {
        let mut s = 0;
        while s <= i && w[i - s] == w[len - 1 - s] {
            s += 1;
        }
        let n = s.min(limit);
        if n >= allowed {
            let e = best.entry(w[i + 1]).or_insert(0);
            *e = (*e).max(n);
        }
    }
    let single = |t: i32| breakers.iter().any(|b| b.len() == 1 && b[0] == t);
    let most = if d.base > 1.000_001 { (88.722_84f32 / d.base.ln()) as i32 } else { 0 };
    best.into_iter()
        .filter(|&(t, _)| !single(t))
        .map(|(t, n)| {
            let mut e = (n - allowed) as i32 + (rule == Rule::ExponentPlusOne) as i32;
            if most > 0 {
                e = e.min(most);
            }
            (t as usize, (d.multiplier as f64 * (d.base as f64).powf(e as f64)) as f32)
        })
        .collect()
}

/// Row `x` processed by the reference: the step's other inputs, then DRY's subtraction.
fn processed(x: &[f32], inputs: &rf::RowInputs, breakers: &[Vec<i32>], d: Dry, rule: Rule) -> Vec<f32> {
    let mut y = rf::effective_row(x, inputs);
    let h: Vec<i32> = inputs.prompt.iter().chain(inputs.output).copied().collect();
    for (t, p) in dry_reference(&h, breakers, d, rule) {
        y[t] -= p;
    }
    y
}

/// The per-row DRY arrays of a batch.
struct DryRows {
    multiplier: Vec<f32>,
    base: Vec<f32>,
    allowed_length: Vec<i32>,
    last_n: Vec<i32>,
}

impl DryRows {
    fn of(d: &[Dry]) -> DryRows {
        DryRows {
            multiplier: d.iter().map(|d| d.multiplier).collect(),
            base: d.iter().map(|d| d.base).collect(),
            allowed_length: d.iter().map(|d| d.allowed_length).collect(),
            last_n: d.iter().map(|d| d.last_n).collect(),
        }
    }

    fn apply<'a>(&'a self, breakers: &'a Breakers, b: Batch<'a>) -> Batch<'a> {
        Batch {
            dry_multiplier: Some(&self.multiplier),
            dry_base: Some(&self.base),
            dry_allowed_length: Some(&self.allowed_length),
            dry_penalty_last_n: Some(&self.last_n),
            dry_breakers: Some(breakers.view()),
            ..b
        }
    }
}

/// llama.cpp's `test_dry` cases (tests/test-sampling.cpp): logits ln(p), the history accepted
/// token by token, DRY, then the probabilities of the softmax.
#[test]
fn llama_cpp_expected_tables() {
    type Case = (&'static [f32], &'static [i32], &'static [f32], Dry, Vec<Vec<i32>>);
    let dry = |multiplier, base, allowed_length, last_n| Dry { multiplier, base, allowed_length, last_n };
    let cases: Vec<Case> = vec![
        (&[0.25; 4], &[0, 1], &[0.25; 4], dry(1.0, 1.1, 2, 4), vec![]),
        (&[0.25; 4], &[0, 1, 2, 0, 1], &[0.296923, 0.296923, 0.109232, 0.296923], dry(1.0, 1.1, 2, 5), vec![]),
        (&[0.2; 5], &[0, 1, 3, 4, 0, 1], &[0.2; 5], dry(1.0, 1.1, 2, 6), vec![vec![3]]),
        (&[0.2; 5], &[0, 1, 2, 0, 1], &[0.241818, 0.241818, 0.032727, 0.241818, 0.241818], dry(2.0, 1.1, 2, 5), vec![]),
        (&[0.2; 5], &[0, 1, 2, 3, 4, 0, 1], &[0.2; 5], dry(1.0, 1.1, 4, 7), vec![]),
    ];
    let s = Sampler::new(Config { seed: Some(1), ..Config::default() }).unwrap();
    for (probs, history, expected, d, breakers) in cases {
        let x: Vec<f32> = probs.iter().map(|p| p.ln()).collect();
        let vocab = x.len();
        let (rows, w) = (DryRows::of(&[d]), Breakers::of(std::slice::from_ref(&breakers)));
        let oo = [0, history.len() as u64];
        let b = rows.apply(
            &w,
            Batch {
                output_tokens: Some(TokenLists { ids: history, offsets: &oo }),
                ..Batch::new(Logits::F32(&x), 1, vocab)
            },
        );
        let (mut tokens, mut full) = ([-1], vec![0f32; vocab]);
        let mut out = Output {
            full_logprobs: Some(&mut full),
            full_row_stride: vocab,
            full_mode: FullMode::Processed,
            ..Output::new(&mut tokens)
        };
        s.draw(&b, &mut out).unwrap();
        for (i, (&lp, &want)) in full.iter().zip(expected).enumerate() {
            assert!((lp.exp() - want).abs() < 1e-5, "history {history:?}, {d:?}: token {i}: {} vs {want}", lp.exp());
        }
    }
}

/// Histories over few distinct tokens (long repeats), with patterns pasted in, so that most rows
/// penalise several tokens; breakers of one to three tokens, some of them in the history.
fn random_history(rng: &mut TestRng, len: usize, alphabet: i32) -> Vec<i32> {
    let mut h: Vec<i32> = Vec::with_capacity(len);
    while h.len() < len {
        if h.len() > 4 && rng.below(3) == 0 {
            let from = rng.below(h.len());
            let take = (1 + rng.below(8)).min(h.len() - from).min(len - h.len());
            let piece = h[from..from + take].to_vec();
            h.extend_from_slice(&piece);
        } else {
            h.push(rng.below(alphabet as usize) as i32);
        }
    }
    h
}

fn random_dry(rng: &mut TestRng) -> Dry {
    Dry {
        multiplier: [0.0, 0.3, 0.8, 2.5, 1.0, 0.5, 1.5, 0.2][rng.below(8)],
        base: [0.9, 1.0, 1.1, 1.75, 1.75, 3.0, 1e6][rng.below(7)],
        allowed_length: rng.below(5) as i32,
        last_n: [-1, -1, 0, 1, 3, 7, 40, 100_000][rng.below(8)],
    }
}

/// Rows of random histories, windows, breakers and DRY parameters, half with a repetition
/// penalty and a bitmask: each row's processed values (its processed full logprobs) and its
/// seeded token, flags and logprob equal those of the plain draw of the reference's processed
/// row, bit for bit, at every level, on 1 and 4 threads.
#[test]
fn seeded_rows_with_dry_draw_the_references_processed_row() {
    tokenrace::internals::force_participants(usize::MAX);
    for (vocab, max_len) in [(40usize, 30usize), (3000, 600)] {
        let mut rng = TestRng::new(vocab as u64 * 31 + 5);
        let rows = 24;
        let (mut x, mut prompt, mut output, mut all_breakers, mut dry) =
            (Vec::new(), Csr::new(), Csr::new(), Vec::new(), Vec::new());
        for r in 0..rows {
            let alphabet = [3, 5, 12][r % 3].min(vocab as i32);
            let len = if r % 6 == 5 { rng.below(4) } else { max_len / 2 + rng.below(max_len / 2) };
            let h = random_history(&mut rng, len, alphabet);
            let split = rng.below(h.len() + 1);
            let row: Vec<f32> = (0..vocab).map(|_| (rng.normal() * 1.5) as f32).collect();
            let breakers: Vec<Vec<i32>> = (0..rng.below(4))
                .map(|_| {
                    (0..1 + rng.below(3))
                        .map(|_| {
                            if rng.below(4) == 0 {
                                rng.below(alphabet as usize) as i32
                            } else {
                                alphabet + rng.below(5) as i32
                            }
                        })
                        .collect()
                })
                .collect();
            // Every other row with DRY surely on (the random parameters turn it off often).
            let mut d = random_dry(&mut rng);
            if r % 4 == 0 {
                d = Dry { multiplier: 1.0, ..LLAMA_DEFAULT };
            } else if r % 2 == 0 {
                d = Dry {
                    multiplier: 0.7,
                    base: 1.3,
                    allowed_length: (r % 3) as i32,
                    last_n: if r % 8 == 2 { 40 } else { -1 },
                };
            }
            x.extend_from_slice(&row);
            prompt.push(&h[..split]);
            output.push(&h[split..]);
            all_breakers.push(breakers);
            dry.push(d);
        }
        let h_of = |r: usize| [prompt.row(r), output.row(r)].concat();
        let penalised =
            (0..rows).filter(|&r| !dry_reference(&h_of(r), &all_breakers[r], dry[r], Rule::Llama).is_empty()).count();
        assert!(penalised >= rows / 3, "too few rows penalise a token: {penalised}");
        let (w, dry_rows) = (Breakers::of(&all_breakers), DryRows::of(&dry));
        let words32 = vocab.div_ceil(32);
        let bitmask: Vec<i32> = (0..rows * words32).map(|_| (rng.u64() | rng.u64()) as i32).collect();
        for with_penalties in [false, true] {
            let step = StepInputs {
                prompt: Some(prompt.clone()),
                output: Some(output.clone()),
                repetition: with_penalties.then(|| (0..rows).map(|r| [1.0, 1.3, 0.8][r % 3]).collect()),
                frequency: with_penalties.then(|| vec![0.1; rows]),
                bitmask: with_penalties.then(|| (bitmask.clone(), words32)),
                ..StepInputs::default()
            };
            let plain_rows: Vec<f32> = (0..rows)
                .flat_map(|r| {
                    processed(
                        &x[r * vocab..(r + 1) * vocab],
                        &step.row(r, vocab),
                        &all_breakers[r],
                        dry[r],
                        Rule::Llama,
                    )
                })
                .collect();
            let temps: Vec<f32> = (0..rows).map(|r| [0.0, 0.7, 1.0][r % 3]).collect();
            let seeds = vec![9u64; rows];
            let offsets: Vec<u64> = (0..rows as u64).collect();
            let batch = |logits| Batch {
                temperature: Some(&temps),
                seeds: Some(&seeds),
                offsets: Some(&offsets),
                ..Batch::new(logits, rows, vocab)
            };
            let mut first: Option<(Vec<i32>, Vec<u32>)> = None;
            common::each_level(|level| {
                for threads in [1, 4] {
                    let s = Sampler::new(config(level, threads, rf::Order::TemperatureFirst)).unwrap();
                    let draw = |b: &Batch| {
                        let (mut tokens, mut flags, mut lps) = (vec![-1; rows], vec![0; rows], vec![0f32; rows]);
                        let mut full = vec![0f32; rows * vocab];
                        let mut out = Output {
                            flags: Some(&mut flags),
                            logprobs: Some(&mut lps),
                            logprob_mode: LogprobMode::Processed,
                            full_logprobs: Some(&mut full),
                            full_row_stride: vocab,
                            full_mode: FullMode::Processed,
                            ..Output::new(&mut tokens)
                        };
                        s.draw(b, &mut out).unwrap();
                        (tokens, flags, lps, full)
                    };
                    let fused = draw(&dry_rows.apply(&w, step.apply(batch(Logits::F32(&x)))));
                    let plain = draw(&batch(Logits::F32(&plain_rows)));
                    for (r, d) in dry.iter().enumerate() {
                        let what = format!(
                            "vocab {vocab}, penalties {with_penalties}, {level:?}, {threads} threads, row {r} ({d:?})"
                        );
                        assert_eq!(
                            (fused.0[r], fused.1[r], fused.2[r].to_bits()),
                            (plain.0[r], plain.1[r], plain.2[r].to_bits()),
                            "{what}"
                        );
                        let (a, b) = (&fused.3[r * vocab..(r + 1) * vocab], &plain.3[r * vocab..(r + 1) * vocab]);
                        if let Some(i) = (0..vocab).find(|&i| a[i].to_bits() != b[i].to_bits()) {
                            panic!("{what}: token {i}: processed logprob {} vs the reference's {}", a[i], b[i]);
                        }
                    }
                    match &first {
                        None => first = Some((fused.0.clone(), fused.1.clone())),
                        Some(f) => assert_eq!((&fused.0, &fused.1), (&f.0, &f.1), "{level:?}, {threads} threads"),
                    }
                }
            });
        }
    }
}

/// A history of 20,000 tokens repeating one phrase: the window, not the history, bounds the
/// penalties, and the longest repeats meet the exponent's cap (a finite penalty).
#[test]
fn the_window_bounds_what_dry_reads() {
    let vocab = 100;
    let phrase = [5, 6, 7, 8, 9];
    let h: Vec<i32> = phrase.iter().copied().cycle().take(20_000).collect();
    let x: Vec<f32> = (0..vocab).map(|i| (i % 10) as f32 * 0.1).collect();
    let s = Sampler::new(Config { seed: Some(2), ..Config::default() }).unwrap();
    for last_n in [-1, 0, 3, 6, 12, 1000] {
        let d = Dry { multiplier: 0.5, last_n, ..LLAMA_DEFAULT };
        let (rows, w) = (DryRows::of(&[d]), Breakers::of(&[vec![]]));
        let oo = [0, h.len() as u64];
        let b = rows.apply(
            &w,
            Batch {
                output_tokens: Some(TokenLists { ids: &h, offsets: &oo }),
                ..Batch::new(Logits::F32(&x), 1, vocab)
            },
        );
        let (mut tokens, mut full) = ([-1], vec![0f32; vocab]);
        let mut out = Output {
            full_logprobs: Some(&mut full),
            full_row_stride: vocab,
            full_mode: FullMode::Processed,
            ..Output::new(&mut tokens)
        };
        s.draw(&b, &mut out).unwrap();
        let want = processed(&x, &rf::RowInputs { output: &h, ..rf::RowInputs::NONE }, &[], d, Rule::Llama);
        let want = softmax64(&want, 1.0);
        for i in 0..vocab {
            // (Probabilities: a capped penalty takes a value near -f32::MAX, whose f64 softmax is 0.)
            let p = (full[i] as f64).exp();
            assert!((p - want[i]).abs() < 1e-6 * want[i].max(1e-3), "last_n {last_n}: token {i}: {p} vs {}", want[i]);
        }
    }
}

/// Counts of `n` seeded draws at temperature `t` of one row with a history and breakers.
fn sample_counts(x: &[f32], h: &[i32], breakers: &[Vec<i32>], d: Dry, t: f32, n: usize) -> Vec<u64> {
    let vocab = x.len();
    let per_call = 2000;
    let s = Sampler::new(Config { seed: Some(3), max_rows: per_call, ..Config::default() }).unwrap();
    let logits: Vec<f32> = x.iter().copied().cycle().take(per_call * vocab).collect();
    let outputs = Csr::from_rows(&vec![h.to_vec(); per_call]);
    let w = Breakers::of(&vec![breakers.to_vec(); per_call]);
    let rows = DryRows::of(&vec![d; per_call]);
    let (temps, seeds) = (vec![t; per_call], vec![77u64; per_call]);
    let mut counts = vec![0u64; vocab];
    let mut done = 0;
    while done < n {
        let offsets: Vec<u64> = (done..done + per_call).map(|j| j as u64).collect();
        let b = rows.apply(
            &w,
            Batch {
                temperature: Some(&temps),
                seeds: Some(&seeds),
                offsets: Some(&offsets),
                output_tokens: Some(outputs.lists()),
                ..Batch::new(Logits::F32(&logits), per_call, vocab)
            },
        );
        for t in common::draw(&s, &b).0 {
            counts[t as usize] += 1;
        }
        done += per_call;
    }
    counts
}

/// The frequencies of a row whose history repeats phrases (two tokens penalised, their repeats
/// cut short by a two-token breaker) follow the reference;
/// the same counts reject the reference with its exponent one too high and with its breakers
/// ignored.
#[test]
fn frequencies_follow_llamas_rule_and_reject_wrong_ones() {
    let x: Vec<f32> = vec![0.5, 0.4, 0.3, 0.2, 0.1, 0.0, -0.1, -0.2];
    // "1 2 3" then "4 1 2 3 5", ... the end "4 1 2 3" repeats: 5 would extend a repeat of 4.
    let h = [0, 1, 2, 3, 7, 6, 4, 1, 2, 3, 5, 6, 6, 7, 4, 1, 2, 3];
    // The breaker "1 2" nearest the end leaves one token after it: every repeat counts as 1.
    let breakers = vec![vec![1, 2], vec![6, 4]];
    let d = Dry { multiplier: 0.6, base: 1.4, allowed_length: 1, last_n: -1 };
    let (t, n) = (1.0f32, 60_000);
    let counts = sample_counts(&x, &h, &breakers, d, t, n);
    let inputs = rf::RowInputs { output: &h, ..rf::RowInputs::NONE };
    let p_of = |rule| softmax64(&processed(&x, &inputs, &breakers, d, rule), t as f64);
    assert!(dry_reference(&h, &breakers, d, Rule::Llama).len() >= 2, "the row must penalise tokens");
    let (stat, dof) = chi2(&counts, &p_of(Rule::Llama));
    assert!(stat < chi2_critical(dof, 4.0), "llama.cpp's rule rejected: chi2 {stat} dof {dof}");
    for wrong in [Rule::ExponentPlusOne, Rule::NoBreakers] {
        let (stat, dof) = chi2(&counts, &p_of(wrong));
        assert!(stat > chi2_critical(dof, 4.0), "{wrong:?} not rejected: chi2 {stat} dof {dof}");
    }
}

/// Bad DRY inputs are refused naming the argument, the row and (for breakers) the breaker and
/// position; nothing is written and the sampler's stream is where it was.
#[test]
fn bad_dry_inputs_are_refused_and_change_nothing() {
    let vocab = 50;
    let x: Vec<f32> = (0..2 * vocab).map(|i| (i % 7) as f32).collect();
    let h = [1i32, 2, 1, 2, 1];
    let outputs = Csr::from_rows(&[h.to_vec(), h.to_vec()]);
    let good = [Dry { multiplier: 1.0, ..LLAMA_DEFAULT }; 2];
    let ok_breakers = Breakers::of(&[vec![vec![3]], vec![vec![4, 5]]]);
    let bad_breaker = Breakers::of(&[vec![vec![3]], vec![vec![4, 50]]]);
    let empty_breaker = Breakers { ids: vec![3], word_offsets: vec![0, 1, 1], row_offsets: vec![0, 1, 2] };
    let with = |f: fn(&mut Dry)| {
        let mut d = good;
        f(&mut d[1]);
        d
    };
    let cases: Vec<([Dry; 2], &Breakers, &str)> = vec![
        (with(|d| d.multiplier = -0.5), &ok_breakers, "dry_multiplier[1]: -0.5 is not a finite number >= 0"),
        (with(|d| d.multiplier = f32::NAN), &ok_breakers, "dry_multiplier[1]: NaN"),
        (with(|d| d.base = f32::INFINITY), &ok_breakers, "dry_base[1]: inf is not finite"),
        (with(|d| d.allowed_length = -1), &ok_breakers, "dry_allowed_length[1]: -1 is negative"),
        (with(|d| d.last_n = -2), &ok_breakers, "dry_penalty_last_n[1]: -2 is below -1"),
        (good, &bad_breaker, "dry_breaker_ids[1]: word 0 position 1 (entry 2): 50 is not a token id"),
        (good, &empty_breaker, "dry_breaker_offsets[1]: word 1 is empty"),
    ];
    let unseeded = |s: &Sampler| common::draw(s, &Batch::new(Logits::F32(&x), 2, vocab)).0;
    let reference = Sampler::new(Config { seed: Some(11), ..Config::default() }).unwrap();
    let want = unseeded(&reference);
    for (d, breakers, message) in cases {
        let s = Sampler::new(Config { seed: Some(11), ..Config::default() }).unwrap();
        let rows = DryRows::of(&d);
        let b = rows
            .apply(breakers, Batch { output_tokens: Some(outputs.lists()), ..Batch::new(Logits::F32(&x), 2, vocab) });
        let mut tokens = [-7; 2];
        let err = s.draw(&b, &mut Output::new(&mut tokens)).unwrap_err();
        assert!(err.to_string().contains(message), "{err} (wanted {message})");
        assert_eq!(tokens, [-7; 2], "a failed call wrote");
        assert_eq!(unseeded(&s), want, "a failed call moved the stream");
    }
}
