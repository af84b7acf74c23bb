//! The sampling step inside a verify call (penalties, bias, masks, bad words, min_tokens, the
//! per-target-row bitmask): each target row is judged on exactly the processed row that a draw
//! of it with the same inputs computes, its output history being the request's output followed
//! by the drafts before its position (a tree node's: its ancestors' drafts and its own).
//!
//! - the processed rows of the reference (`rf::effective_row` with bad words, in f32 as the spec
//!   says) equal a draw's processed logits bit for bit;
//! - a verify call with the step gives bit-identical tokens, counts, accepted nodes and processed
//!   logprobs to a verify call without it on those processed rows, at every SIMD level, on 1
//!   and 4 threads, for chains and trees, seeded, unseeded and greedy requests; raw logprobs are
//!   the caller's rows';
//! - greedy requests accept while the draft is the processed argmax;
//! - a chi-square test of the second emitted token (given the first draft accepted) against the
//!   processed row whose frequency/presence penalties count that draft, rejecting the rule
//!   that leaves the draft out (power check);
//! - bad inputs are refused naming the argument and request, with nothing written.

mod common;

use common::reference as rf;
use common::step::{BiasCsr, Csr};
use common::{chi2, chi2_critical, each_level, TestRng};
use tokenrace::*;

/// One verify call with step inputs.
#[derive(Clone, Debug)]
struct Case {
    vocab: usize,
    counts: Vec<i32>,
    drafts: Vec<i32>,
    parents: Option<Vec<i32>>,
    logits: Vec<f32>,
    temperature: Vec<f32>,
    top_k: Vec<i32>,
    seeds: Vec<u64>,
    seeded: Vec<u8>,
    q: Option<Vec<f32>>,
    prompt: Csr,
    output: Csr,
    repetition: Vec<f32>,
    frequency: Vec<f32>,
    presence: Vec<f32>,
    bias: BiasCsr,
    allowed: Csr,
    allowed_rows: Vec<u8>,
    banned: Csr,
    /// (ids, word offsets, row offsets).
    bad_words: (Vec<i32>, Vec<u64>, Vec<u64>),
    min_tokens: Vec<i32>,
    stops: Csr,
    /// One bitmask row per target row (`words` words each).
    bitmask: Option<Vec<i32>>,
}

impl Case {
    fn requests(&self) -> usize {
        self.counts.len()
    }
    fn first_row(&self, i: usize) -> usize {
        self.counts[..i].iter().map(|&c| c as usize + 1).sum()
    }
    fn first_draft(&self, i: usize) -> usize {
        self.counts[..i].iter().map(|&c| c as usize).sum()
    }
    fn words(&self) -> usize {
        self.vocab.div_ceil(32)
    }

    /// The output history of request `i`'s local target row `j`: its output, then the drafts of
    /// the path to the row.
    fn history(&self, i: usize, j: usize) -> Vec<i32> {
        let fd = self.first_draft(i);
        let mut path = Vec::new();
        let mut node = j as i32 - 1;
        while node >= 0 {
            path.push(self.drafts[fd + node as usize]);
            node = match &self.parents {
                Some(p) => p[fd + node as usize],
                None => node - 1,
            };
        }
        path.reverse();
        let mut h = self.output.row(i).to_vec();
        h.extend(path.into_iter().filter(|&t| t >= 0));
        h
    }

    /// The bad words of request `i`.
    fn words_of(&self, i: usize) -> Vec<&[i32]> {
        let (ids, wo, ro) = &self.bad_words;
        (ro[i] as usize..ro[i + 1] as usize).map(|k| &ids[wo[k] as usize..wo[k + 1] as usize]).collect()
    }

    /// The reference's processed row of request `i`'s local target row `j` (the spec's steps in
    /// f32, written independently of the library; bad words ban the last token of every word
    /// whose prefix ends the history).
    fn reference_row(&self, i: usize, j: usize) -> Vec<f32> {
        let r = self.first_row(i) + j;
        let hist = self.history(i, j);
        let mut banned = self.banned.row(i).to_vec();
        for w in self.words_of(i) {
            let (prefix, last) = w.split_at(w.len() - 1);
            if hist.ends_with(prefix) {
                banned.push(last[0]);
            }
        }
        let (bias_ids, bias_values) = self.bias.row(i);
        let inputs = rf::RowInputs {
            prompt: self.prompt.row(i),
            output: &hist,
            repetition: self.repetition[i],
            frequency: self.frequency[i],
            presence: self.presence[i],
            last_n: 0,
            bias_ids,
            bias_values,
            allowed: (self.allowed_rows[i] != 0).then(|| self.allowed.row(i)),
            banned: &banned,
            bitmask: self.bitmask.as_ref().map(|m| &m[r * self.words()..(r + 1) * self.words()]),
            stop: self.stops.row(i),
            min_tokens: self.min_tokens[i],
        };
        rf::effective_row(&self.logits[r * self.vocab..(r + 1) * self.vocab], &inputs)
    }

    /// Every target row's processed values (the reference's).
    fn processed(&self) -> Vec<f32> {
        (0..self.requests())
            .flat_map(|i| (0..=self.counts[i] as usize).flat_map(move |j| self.reference_row(i, j)))
            .collect()
    }

    /// The processed row of request `i`'s local target row `j` as a greedy draw of it with the
    /// same step inputs reports it (its processed logits).
    fn drawn_row(&self, s: &Sampler, i: usize, j: usize) -> Vec<f32> {
        let (v, r) = (self.vocab, self.first_row(i) + j);
        let hist = self.history(i, j);
        let one = |c: &Csr| Csr::from_rows(&[c.row(i).to_vec()]);
        let (prompt, output) = (one(&self.prompt), Csr::from_rows(&[hist]));
        let (allowed, banned, stops) = (one(&self.allowed), one(&self.banned), one(&self.stops));
        let mut bias = BiasCsr::new();
        let (ids, values) = self.bias.row(i);
        bias.push(&ids.iter().copied().zip(values.iter().copied()).collect::<Vec<_>>());
        let (wids, wo, ro) = &self.bad_words;
        let row_offsets = [ro[i], ro[i + 1]];
        let bitmask = self.bitmask.as_ref().map(|m| &m[r * self.words()..(r + 1) * self.words()]);
        let b = Batch {
            temperature: Some(&[0.0]),
            prompt_tokens: Some(prompt.lists()),
            output_tokens: Some(output.lists()),
            repetition_penalty: Some(&self.repetition[i..i + 1]),
            frequency_penalty: Some(&self.frequency[i..i + 1]),
            presence_penalty: Some(&self.presence[i..i + 1]),
            logit_bias: Some(bias.bias()),
            allowed_tokens: Some(allowed.lists()),
            allowed_rows: Some(&self.allowed_rows[i..i + 1]),
            banned_tokens: Some(banned.lists()),
            bad_words: Some(BadWords { ids: wids, word_offsets: wo, row_offsets: &row_offsets }),
            min_tokens: Some(&self.min_tokens[i..i + 1]),
            stop_tokens: Some(stops.lists()),
            token_bitmask: bitmask.map(|w| TokenBitmask { words: w, row_stride: self.words() }),
            ..Batch::new(Logits::F32(&self.logits[r * v..(r + 1) * v]), 1, v)
        };
        let (mut token, mut full) = ([0i32], vec![0f32; v]);
        let mut out = Output {
            full_logprobs: Some(&mut full),
            full_row_stride: v,
            full_mode: FullMode::ProcessedLogits,
            ..Output::new(&mut token)
        };
        s.draw(&b, &mut out).unwrap();
        full
    }

    /// The verify call over `logits`, with the step or without.
    fn batch<'a>(
        &'a self,
        logits: &'a [f32],
        with_step: bool,
        words: &'a (Vec<i32>, Vec<u64>, Vec<u64>),
    ) -> VerifyBatch<'a> {
        let step = VerifyStep {
            prompt_tokens: Some(self.prompt.lists()),
            output_tokens: Some(self.output.lists()),
            repetition_penalty: Some(&self.repetition),
            frequency_penalty: Some(&self.frequency),
            presence_penalty: Some(&self.presence),
            logit_bias: Some(self.bias.bias()),
            allowed_tokens: Some(self.allowed.lists()),
            allowed_rows: Some(&self.allowed_rows),
            banned_tokens: Some(self.banned.lists()),
            bad_words: Some(BadWords { ids: &words.0, word_offsets: &words.1, row_offsets: &words.2 }),
            min_tokens: Some(&self.min_tokens),
            stop_tokens: Some(self.stops.lists()),
            token_bitmask: self.bitmask.as_ref().map(|m| TokenBitmask { words: m, row_stride: self.words() }),
        };
        VerifyBatch {
            temperature: Some(&self.temperature),
            top_k: Some(&self.top_k),
            seeds: Some(&self.seeds),
            seeded: Some(&self.seeded),
            draft_probs: self.q.as_ref().map(|q| DraftProbs { values: q, row_stride: self.vocab }),
            draft_parents: self.parents.as_deref(),
            step: if with_step { step } else { VerifyStep::default() },
            ..VerifyBatch::new(Logits::F32(logits), self.vocab, &self.counts, &self.drafts)
        }
    }
}

/// What a verify call gave.
#[derive(Debug, PartialEq)]
struct Got {
    tokens: Vec<i32>,
    counts: Vec<i32>,
    nodes: Vec<i32>,
    /// Logprobs as bits (NaN padding compares).
    logprobs: Vec<u32>,
    flags: Vec<u32>,
}

fn run(s: &Sampler, b: &VerifyBatch, mode: LogprobMode) -> Result<Got> {
    let (n, width) = (b.requests, b.draft_counts.iter().map(|&c| c as usize).max().unwrap_or(0) + 1);
    let (mut tokens, mut counts, mut nodes) = (vec![-7; n * width], vec![-7; n], vec![-7; n * width]);
    let (mut logprobs, mut flags) = (vec![7.0f32; n * width], vec![7u32; n]);
    let mut out = VerifyOutput {
        flags: Some(&mut flags),
        logprobs: Some(&mut logprobs),
        logprob_mode: mode,
        accepted_nodes: Some(&mut nodes),
        ..VerifyOutput::new(&mut tokens, &mut counts)
    };
    s.verify(b, &mut out)?;
    Ok(Got { tokens, counts, nodes, logprobs: logprobs.iter().map(|x| x.to_bits()).collect(), flags })
}

const STREAM_SEED: u64 = 0x5eed_0f5e_7e9a;

fn sampler_at(level: SimdLevel, threads: usize) -> Sampler {
    let simd = common::step::choice_of(level);
    Sampler::new(Config { simd, threads, seed: Some(STREAM_SEED), max_rows: 4096, ..Config::default() }).unwrap()
}

/// The index of the largest value (the lowest of a tie), or None when nothing is finite.
fn argmax(y: &[f32]) -> Option<usize> {
    let m = y.iter().copied().filter(|x| !x.is_nan()).fold(f32::NEG_INFINITY, f32::max);
    (m > f32::NEG_INFINITY).then(|| y.iter().position(|&x| x == m).unwrap())
}

/// A random case: `requests` requests of up to `max_drafts` drafts, every step input on; a
/// draft is most often its row's processed argmax (so later positions are reached), else any
/// token. `tree`: random parents (one-hot drafts).
fn make_case(rng: &mut TestRng, vocab: usize, requests: usize, max_drafts: usize, tree: bool) -> Case {
    let counts: Vec<i32> = (0..requests).map(|_| rng.below(max_drafts + 1) as i32).collect();
    let rows: usize = counts.iter().map(|&c| c as usize + 1).sum();
    let mut logits = Vec::with_capacity(rows * vocab);
    for _ in 0..rows {
        logits.extend((0..vocab).map(|_| (rng.normal() * 2.0) as f32));
    }
    let pick = |rng: &mut TestRng, n: usize| -> Vec<i32> { (0..n).map(|_| rng.below(vocab) as i32).collect() };
    let (mut prompt, mut output, mut allowed, mut banned, mut stops) =
        (Csr::new(), Csr::new(), Csr::new(), Csr::new(), Csr::new());
    let mut bias = BiasCsr::new();
    let (mut wids, mut wo, mut ro) = (Vec::new(), vec![0u64], vec![0u64]);
    let mut allowed_rows = Vec::new();
    for _ in 0..requests {
        let len = 5 + rng.below(20);
        let p = pick(rng, len);
        prompt.push(&p);
        let len = rng.below(12);
        let o = pick(rng, len);
        output.push(&o);
        let b: Vec<(i32, f32)> = (0..rng.below(6))
            .map(|_| {
                (
                    rng.below(vocab) as i32,
                    if rng.below(8) == 0 { f32::NEG_INFINITY } else { (rng.normal() * 3.0) as f32 },
                )
            })
            .collect();
        bias.push(&b);
        let restricted = rng.below(4) == 0;
        allowed_rows.push(restricted as u8);
        allowed.push(&if restricted { pick(rng, vocab / 2) } else { Vec::new() });
        let len = rng.below(4);
        banned.push(&pick(rng, len));
        let len = 1 + rng.below(3);
        stops.push(&pick(rng, len));
        // Bad words: one token, and two-token words whose prefix is an output token (so some
        // match once a draft or the output ends with it).
        for _ in 0..rng.below(4) {
            let len = 1 + rng.below(3);
            let mut w = pick(rng, len);
            if len > 1 && !o.is_empty() {
                w[len - 2] = o[rng.below(o.len())];
            }
            wids.extend_from_slice(&w);
            wo.push(wids.len() as u64);
        }
        ro.push((wo.len() - 1) as u64);
    }
    let f = |rng: &mut TestRng, p: f64, scale: f64| if rng.f64() < p { (rng.normal() * scale) as f32 } else { 0.0 };
    let mut case = Case {
        vocab,
        counts: counts.clone(),
        drafts: vec![0; counts.iter().sum::<i32>() as usize],
        parents: None,
        logits,
        temperature: (0..requests).map(|_| [0.0, 0.7, 1.0, 1.3][rng.below(4)]).collect(),
        top_k: (0..requests).map(|_| if rng.below(3) == 0 { 1 + rng.below(vocab) as i32 } else { 0 }).collect(),
        seeds: (0..requests).map(|_| rng.u64()).collect(),
        seeded: (0..requests).map(|_| rng.below(2) as u8).collect(),
        q: None,
        prompt,
        output,
        repetition: (0..requests).map(|_| if rng.below(2) == 0 { 0.5 + rng.f64() as f32 * 1.5 } else { 1.0 }).collect(),
        frequency: (0..requests).map(|_| f(rng, 0.6, 1.0)).collect(),
        presence: (0..requests).map(|_| f(rng, 0.6, 1.0)).collect(),
        bias,
        allowed,
        allowed_rows,
        banned,
        bad_words: (wids, wo, ro),
        min_tokens: (0..requests).map(|_| rng.below(16) as i32).collect(),
        stops,
        bitmask: None,
    };
    if rng.below(2) == 0 {
        let words = case.words();
        let mut m: Vec<i32> = (0..rows * words).map(|_| rng.u64() as i32 | rng.u64() as i32).collect();
        // Rows the bitmask leaves whole.
        for r in 0..rows {
            if rng.below(3) == 0 {
                m[r * words..(r + 1) * words].fill(-1);
            }
        }
        case.bitmask = Some(m);
    }
    for i in 0..requests {
        let (fd, n) = (case.first_draft(i), case.counts[i] as usize);
        if tree {
            let parents: Vec<i32> = (0..n).map(|j| rng.below(j + 1) as i32 - 1).collect();
            case.parents.get_or_insert_with(Vec::new).extend(parents);
        } else if let Some(parents) = case.parents.as_mut() {
            parents.extend((0..n as i32).map(|j| j - 1));
        }
        for j in 0..n {
            // Node j is judged at its parent's row (row 0: the root).
            let parent_row = match &case.parents {
                Some(p) => (p[fd + j] + 1) as usize,
                None => j,
            };
            let row = case.reference_row(i, parent_row);
            case.drafts[fd + j] = match argmax(&row) {
                Some(t) if rng.below(4) != 0 => t as i32,
                _ => rng.below(vocab) as i32,
            };
        }
    }
    if !tree && rng.below(2) == 0 {
        let drafts = case.drafts.len();
        let mut q = vec![0f32; drafts * vocab];
        for (d, row) in q.chunks_mut(vocab).enumerate() {
            let w: Vec<f64> = (0..vocab).map(|_| rng.exp()).collect();
            let s: f64 = w.iter().sum();
            row.iter_mut().zip(&w).for_each(|(x, w)| *x = (w / s) as f32);
            row[case.drafts[d] as usize] += 0.3;
            let s: f32 = row.iter().sum();
            row.iter_mut().for_each(|x| *x /= s);
        }
        case.q = Some(q);
    }
    case
}

#[test]
fn reference_rows_are_the_draws_processed_rows() {
    let mut rng = TestRng::new(11);
    let s = sampler_at(SimdLevel::Scalar, 1);
    for k in 0..12 {
        let case = make_case(&mut rng, [50, 257, 1000][k % 3], 3, 4, k % 2 == 1);
        for i in 0..case.requests() {
            for j in 0..=case.counts[i] as usize {
                let (want, got) = (case.reference_row(i, j), case.drawn_row(&s, i, j));
                for t in 0..case.vocab {
                    assert_eq!(got[t].to_bits(), want[t].to_bits(), "case {k} request {i} row {j} token {t}");
                }
            }
        }
    }
}

/// Verify with the step equals verify of the processed rows (no step), bit for bit, and raw
/// logprobs are those of the caller's rows.
fn check_equivalence(case: &Case, s: &Sampler, fresh: &dyn Fn() -> Sampler, what: &str) {
    let processed = case.processed();
    let words = case.bad_words.clone();
    let with = case.batch(&case.logits, true, &words);
    let without = case.batch(&processed, false, &words);
    let got = run(s, &with, LogprobMode::Processed).unwrap();
    let want = run(&fresh(), &without, LogprobMode::Processed).unwrap();
    assert_eq!(got.tokens, want.tokens, "{what}: tokens");
    assert_eq!(got.counts, want.counts, "{what}: counts");
    assert_eq!(got.nodes, want.nodes, "{what}: accepted nodes");
    assert_eq!(got.logprobs, want.logprobs, "{what}: processed logprobs");
    // (The caller's rows hold no NaN: the flags are the processed rows'.)
    assert_eq!(got.flags, want.flags, "{what}: flags");
    // Raw logprobs: of the caller's rows, at the same tokens.
    let raw = run(&fresh(), &with, LogprobMode::Raw).unwrap();
    assert_eq!(raw.tokens, got.tokens, "{what}: tokens with raw logprobs");
    let width = case.counts.iter().map(|&c| c as usize).max().unwrap_or(0) + 1;
    for i in 0..case.requests() {
        for e in 0..raw.counts[i] as usize {
            let token = raw.tokens[i * width + e];
            // The emitted token's row: a chain's e-th; a tree's, its path's.
            let local = if e == 0 { 0 } else { raw.nodes[i * width + e - 1] as usize + 1 };
            let r = case.first_row(i) + local;
            let x = &case.logits[r * case.vocab..(r + 1) * case.vocab];
            let want = rf::logprobs(x, &forced(x), rf::Mode::Raw)[token as usize];
            let got = f32::from_bits(raw.logprobs[i * width + e]);
            assert!(rf::lp_close(got, want), "{what}: request {i} emitted {e}: raw logprob {got}, want {want}");
        }
    }
}

fn forced(x: &[f32]) -> rf::Drawn {
    rf::draw(x, 0.0, 1e-5, rf::Noise::Inline(0), rf::Filters::OFF)
}

#[test]
fn verify_with_the_step_is_verify_of_the_processed_rows() {
    let mut rng = TestRng::new(23);
    let cases: Vec<Case> =
        (0..16).map(|k| make_case(&mut rng, [64, 300, 1000, 4099][k % 4], 1 + k % 5, 5, k % 3 == 2)).collect();
    let levels = each_level(|level| {
        for threads in [1, 4] {
            for (k, case) in cases.iter().enumerate() {
                let s = sampler_at(level, threads);
                let what = format!("{level:?}, {threads} threads, case {k}");
                check_equivalence(case, &s, &|| sampler_at(level, threads), &what);
            }
        }
    });
    assert!(!levels.is_empty());
}

#[test]
fn a_large_call_on_the_workers_matches_one_thread() {
    // 12 requests of 4 drafts over 96,000 tokens: over a million logits, so verified on the
    // workers by request.
    let mut rng = TestRng::new(31);
    let case = make_case(&mut rng, 96_000, 12, 4, false);
    let words = case.bad_words.clone();
    let b = case.batch(&case.logits, true, &words);
    let one = run(&sampler_at(SimdLevel::Scalar, 1), &b, LogprobMode::Processed).unwrap();
    each_level(|level| {
        let four = run(&sampler_at(level, 4), &b, LogprobMode::Processed).unwrap();
        assert_eq!(four, one, "{level:?}");
    });
    check_equivalence(&case, &sampler_at(SimdLevel::Scalar, 4), &|| sampler_at(SimdLevel::Scalar, 4), "large");
}

#[test]
fn greedy_requests_accept_while_the_draft_is_the_processed_argmax() {
    let mut rng = TestRng::new(41);
    for k in 0..20 {
        let mut case = make_case(&mut rng, 500, 4, 5, false);
        case.temperature.fill(0.0);
        case.q = None;
        let words = case.bad_words.clone();
        let got =
            run(&sampler_at(SimdLevel::Scalar, 1), &case.batch(&case.logits, true, &words), LogprobMode::Raw).unwrap();
        let width = case.counts.iter().map(|&c| c as usize).max().unwrap_or(0) + 1;
        for i in 0..case.requests() {
            let fd = case.first_draft(i);
            let mut want = Vec::new();
            for j in 0..=case.counts[i] as usize {
                let top = argmax(&case.reference_row(i, j)).unwrap_or(0) as i32;
                want.push(top);
                if j == case.counts[i] as usize || case.drafts[fd + j] != top {
                    break;
                }
            }
            assert_eq!(&got.tokens[i * width..i * width + want.len()], &want[..], "case {k} request {i}");
            assert_eq!(got.counts[i] as usize, want.len(), "case {k} request {i}");
        }
    }
}

/// The second emitted token of a request whose first draft is accepted is drawn from the
/// processed row whose penalties count that draft: chi-square against it passes, and against
/// the row that leaves the draft out (a wrong rule) fails.
#[test]
fn the_second_token_follows_the_row_that_counts_the_draft() {
    let vocab = 12;
    // Row 0 all but certain to accept draft 3; row 1 (the bonus row) favours token 3 too, which
    // the presence and frequency penalties lower once the draft counts.
    let mut logits = vec![0f32; 2 * vocab];
    logits[3] = 9.0;
    for t in 0..vocab {
        logits[vocab + t] = 0.2 * t as f32;
    }
    logits[vocab + 3] = 2.5;
    let (counts, drafts) = ([1], [3]);
    let output = Csr::from_rows(&[vec![5]]);
    let (freq, pres) = ([0.8f32], [0.7f32]);
    let b = VerifyBatch {
        step: VerifyStep {
            output_tokens: Some(output.lists()),
            frequency_penalty: Some(&freq),
            presence_penalty: Some(&pres),
            ..VerifyStep::default()
        },
        ..VerifyBatch::new(Logits::F32(&logits), vocab, &counts, &drafts)
    };
    let s = sampler_at(SimdLevel::Scalar, 1);
    let mut hist = vec![0u64; vocab];
    let mut n = 0u64;
    for _ in 0..40_000 {
        let got = run(&s, &b, LogprobMode::Raw).unwrap();
        if got.counts[0] == 2 {
            hist[got.tokens[1] as usize] += 1;
            n += 1;
        }
    }
    assert!(n > 39_000, "the draft was accepted {n} times");
    let row = |history: &[i32]| -> Vec<f64> {
        let inputs = rf::RowInputs { output: history, frequency: freq[0], presence: pres[0], ..rf::RowInputs::NONE };
        common::softmax64(&rf::effective_row(&logits[vocab..], &inputs), 1.0)
    };
    let (stat, dof) = chi2(&hist, &row(&[5, 3]));
    assert!(stat < chi2_critical(dof, 5.0), "the right rule: chi2 {stat} with {dof} dof");
    let (wrong, dof) = chi2(&hist, &row(&[5]));
    assert!(wrong > chi2_critical(dof, 5.0), "the rule without the draft passed: chi2 {wrong}");
}

#[test]
fn bad_step_inputs_are_refused_naming_the_request_and_nothing_is_written() {
    let mut rng = TestRng::new(53);
    let case = make_case(&mut rng, 100, 3, 3, false);
    let words = case.bad_words.clone();
    let s = sampler_at(SimdLevel::Scalar, 1);
    let expect = |b: &VerifyBatch, parts: &[&str]| {
        let (n, width) = (case.requests(), case.counts.iter().map(|&c| c as usize).max().unwrap() + 1);
        let (mut tokens, mut counts) = (vec![-7; n * width], vec![-7; n]);
        let e = s.verify(b, &mut VerifyOutput::new(&mut tokens, &mut counts)).unwrap_err();
        for p in parts {
            assert!(e.to_string().contains(p), "{e} lacks {p}");
        }
        assert!(tokens.iter().chain(&counts).all(|&t| t == -7), "{e}: something was written");
    };
    let base = case.batch(&case.logits, true, &words);
    let bad_rep = [1.0, -2.0, 1.0];
    expect(
        &VerifyBatch { step: VerifyStep { repetition_penalty: Some(&bad_rep), ..base.step }, ..base },
        &["batch.repetition_penalty[1]", "-2"],
    );
    let mut out_ids = case.output.clone();
    out_ids.ids.push(0);
    let last = out_ids.ids.len() - 1;
    out_ids.ids[last] = 100;
    let n = case.output.offsets.len();
    out_ids.offsets[n - 1] += 1;
    expect(
        &VerifyBatch { step: VerifyStep { output_tokens: Some(out_ids.lists()), ..base.step }, ..base },
        &["output_ids", "[2]", "100"],
    );
    let short = [1.0f32; 2];
    expect(
        &VerifyBatch { step: VerifyStep { frequency_penalty: Some(&short), ..base.step }, ..base },
        &["frequency_penalty"],
    );
    let mask = vec![-1i32; 4];
    expect(
        &VerifyBatch {
            step: VerifyStep { token_bitmask: Some(TokenBitmask { words: &mask, row_stride: 4 }), ..base.step },
            ..base
        },
        &["token_bitmask"],
    );
}

/// The C entry point reads every step field where the header says: a call through it gives what
/// the Rust call gives (every request seeded, so the two samplers' streams do not matter), and a
/// bias list without its offsets is refused.
#[test]
fn the_c_verify_batch_carries_the_step() {
    use tokenrace::internals::api::*;
    use tokenrace::internals::types::*;
    let mut rng = TestRng::new(67);
    for k in 0..6 {
        let mut case = make_case(&mut rng, 700, 4, 4, k % 2 == 1);
        case.seeded.fill(1);
        let words = case.bad_words.clone();
        let want =
            run(&sampler_at(SimdLevel::Scalar, 1), &case.batch(&case.logits, true, &words), LogprobMode::Processed)
                .unwrap();
        let mut sampler = std::ptr::null_mut();
        // SAFETY: a default config and a writable out pointer.
        assert_eq!(unsafe { tokenrace_sampler_new(&tokenrace_config_default(), &mut sampler) }, tokenrace_status::Ok);
        // SAFETY: all-zero is valid for these structs (integers and NULL pointers).
        let (mut b, mut o): (tokenrace_verify_batch, tokenrace_verify_output) =
            unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
        b.struct_size = std::mem::size_of::<tokenrace_verify_batch>() as u32;
        b.logits = case.logits.as_ptr() as *const _;
        (b.rows, b.vocab, b.requests) = (case.processed().len() as u32 / 700, 700, case.requests() as u32);
        (b.draft_counts, b.draft_tokens) = (case.counts.as_ptr(), case.drafts.as_ptr());
        b.draft_parents = case.parents.as_ref().map_or(std::ptr::null(), |p| p.as_ptr());
        b.draft_probs = case.q.as_ref().map_or(std::ptr::null(), |q| q.as_ptr());
        (b.temperature, b.top_k) = (case.temperature.as_ptr(), case.top_k.as_ptr());
        (b.seeds, b.seeded) = (case.seeds.as_ptr(), case.seeded.as_ptr());
        (b.prompt_ids, b.prompt_offsets) = (case.prompt.ids.as_ptr(), case.prompt.offsets.as_ptr());
        (b.output_ids, b.output_offsets) = (case.output.ids.as_ptr(), case.output.offsets.as_ptr());
        b.repetition_penalty = case.repetition.as_ptr();
        (b.frequency_penalty, b.presence_penalty) = (case.frequency.as_ptr(), case.presence.as_ptr());
        (b.bias_ids, b.bias_values, b.bias_offsets) =
            (case.bias.ids.as_ptr(), case.bias.values.as_ptr(), case.bias.offsets.as_ptr());
        (b.allowed_ids, b.allowed_offsets) = (case.allowed.ids.as_ptr(), case.allowed.offsets.as_ptr());
        b.allowed_rows = case.allowed_rows.as_ptr();
        (b.banned_ids, b.banned_offsets) = (case.banned.ids.as_ptr(), case.banned.offsets.as_ptr());
        b.token_bitmask = case.bitmask.as_ref().map_or(std::ptr::null(), |m| m.as_ptr());
        (b.bad_words_ids, b.bad_word_offsets, b.bad_words_row_offsets) =
            (words.0.as_ptr(), words.1.as_ptr(), words.2.as_ptr());
        b.min_tokens = case.min_tokens.as_ptr();
        (b.stop_ids, b.stop_offsets) = (case.stops.ids.as_ptr(), case.stops.offsets.as_ptr());
        let (n, width) = (case.requests(), case.counts.iter().map(|&c| c as usize).max().unwrap_or(0) + 1);
        let (mut tokens, mut counts, mut nodes) = (vec![-7; n * width], vec![-7; n], vec![-7; n * width]);
        let (mut logprobs, mut flags) = (vec![7.0f32; n * width], vec![7u32; n]);
        o.struct_size = std::mem::size_of::<tokenrace_verify_output>() as u32;
        o.logprob_mode = tokenrace_logprob_mode::Processed as u32;
        (o.tokens, o.counts, o.accepted_nodes) = (tokens.as_mut_ptr(), counts.as_mut_ptr(), nodes.as_mut_ptr());
        (o.logprobs, o.flags) = (logprobs.as_mut_ptr(), flags.as_mut_ptr());
        // SAFETY: every pointer covers what the batch's sizes say.
        assert_eq!(unsafe { tokenrace_verify(sampler, &b, &mut o) }, tokenrace_status::Ok, "{}", common::last_error());
        let got = Got { tokens, counts, nodes, logprobs: logprobs.iter().map(|x| x.to_bits()).collect(), flags };
        assert_eq!(got, want, "case {k}");
        // Bias ids without their offsets: refused, nothing written.
        b.bias_offsets = std::ptr::null();
        let before = (got.tokens.clone(), got.counts.clone());
        // SAFETY: as above.
        assert_eq!(unsafe { tokenrace_verify(sampler, &b, &mut o) }, tokenrace_status::InvalidArgument);
        assert!(common::last_error().contains("bias_offsets"), "{}", common::last_error());
        // SAFETY: the output arrays are alive (o points into them).
        let after = unsafe {
            (std::slice::from_raw_parts(o.tokens, n * width).to_vec(), std::slice::from_raw_parts(o.counts, n).to_vec())
        };
        assert_eq!(after, before);
        // SAFETY: made by tokenrace_sampler_new, freed once.
        unsafe { tokenrace_sampler_free(sampler) };
    }
}
