//! The sampling step's inputs that vLLM and SGLang have: multi-token bad words (a word bans its
//! last token where the row's output ends with the rest of it) and forced tokens (the row
//! returns a given token, its logprobs as if drawn, its noise consumed as if drawn).
//!
//! Bad words: hand-made rows at the prefix rule's edges against the float64 reference's bans,
//! seeded rows equal to the plain draw of their processed row at every SIMD level on 1 and 4
//! threads, a chi-square against the reference that rejects the two wrong rules (every word's
//! last token banned; multi-token words ignored), and refusals naming row, word and position.
//! Forced tokens: the other rows' tokens identical to a call that draws the forced row (seeded
//! and unseeded, the next call too), the forced token's logprob, rank and top-n against the
//! float64 reference in both modes, the banned-token flag, and refusals.
mod common;

use common::reference as rf;
use common::step::*;
use common::{chi2, chi2_critical, softmax64, TestRng};
use tokenrace::*;

/// Owned bad words of several rows in the batch's two-level layout.
#[derive(Clone, Default)]
struct Words {
    ids: Vec<i32>,
    word_offsets: Vec<u64>,
    row_offsets: Vec<u64>,
}

impl Words {
    fn of(rows: &[Vec<Vec<i32>>]) -> Words {
        let mut w = Words { word_offsets: vec![0], row_offsets: vec![0], ..Words::default() };
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

/// Row `r`'s processed row by the reference: `x` with the bad words' bans (after `output`) added
/// to the banned list.
fn processed(x: &[f32], output: &[i32], words: &[Vec<i32>]) -> Vec<f32> {
    let bans = rf::bad_word_bans(output, words);
    rf::effective_row(x, &rf::RowInputs { output, banned: &bans, ..rf::RowInputs::NONE })
}

/// The greedy token and the processed logprob of every token of one row with `output` and
/// `words`; checked against the reference's greedy token.
fn greedy_with_words(x: &[f32], output: &[i32], words: &[Vec<i32>]) -> (i32, Vec<f32>) {
    let vocab = x.len();
    let w = Words::of(&[words.to_vec()]);
    let oo = [0, output.len() as u64];
    let b = Batch {
        temperature: Some(&[0.0]),
        output_tokens: Some(TokenLists { ids: output, offsets: &oo }),
        bad_words: Some(w.view()),
        ..Batch::new(Logits::F32(x), 1, vocab)
    };
    let (token, full) = greedy_with_processed_row(&b);
    assert_eq!(token as usize, rf::argmax(&processed(x, output, words)), "the reference's greedy token");
    (token, full)
}

/// (output, words, the greedy token) of a hand-made row.
type PrefixCase = (&'static [i32], Vec<Vec<i32>>, i32);

#[test]
fn a_bad_word_bans_its_last_token_only_after_its_prefix() {
    let x = [0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    let top = 6;
    // (output, words, the token drawn)
    let cases: [PrefixCase; 10] = [
        // A word of one token always bans it, with or without an output.
        (&[], vec![vec![top]], 5),
        (&[1, 2], vec![vec![top]], 5),
        // A two-token word: banned only right after its first token.
        (&[1, 2], vec![vec![2, top]], 5),
        (&[2, 1], vec![vec![2, top]], top),
        // The prefix must be the output's end, not somewhere in it.
        (&[3, 4, 1], vec![vec![3, 4, top]], top),
        (&[1, 3, 4], vec![vec![3, 4, top]], 5),
        // A word longer than the output plus one never bans; as long as it, it may.
        (&[4], vec![vec![3, 4, top]], top),
        (&[3, 4], vec![vec![3, 4, top]], 5),
        // Several words: each on its own (6 by its prefix, 5 by one token; 4's prefix unmet).
        (&[0, 2], vec![vec![2, top], vec![5], vec![1, 4]], 4),
        (&[0, 1], vec![vec![0, 1, top], vec![5], vec![1, 4]], 3),
    ];
    for (output, words, want) in cases {
        let (token, full) = greedy_with_words(&x, output, &words);
        assert_eq!(token, want, "output {output:?}, words {words:?}");
        let bans = rf::bad_word_bans(output, &words);
        for (i, &lp) in full.iter().enumerate() {
            assert_eq!(lp == f32::NEG_INFINITY, bans.contains(&(i as i32)), "token {i}, output {output:?}, {words:?}");
        }
    }
    // No output list at all: the output is empty.
    let s = Sampler::new(Config::default()).unwrap();
    let w = Words::of(&[vec![vec![top], vec![0, 5]]]);
    let b = Batch { temperature: Some(&[0.0]), bad_words: Some(w.view()), ..Batch::new(Logits::F32(&x), 1, 7) };
    assert_eq!(common::draw(&s, &b).0, vec![5]);
}

/// Rows with long outputs and words whose prefixes end them (or nearly), likely tokens among
/// the banned ones, seeded: each draws the token, flags and processed logprob of the plain draw of
/// its processed row, at every level, on 1 and 4 threads, with and without a bitmask.
#[test]
fn seeded_rows_with_bad_words_draw_their_processed_row() {
    tokenrace::internals::force_participants(usize::MAX);
    for (vocab, output_len) in [(300usize, 6usize), (4096, 1500)] {
        let mut rng = TestRng::new(vocab as u64 + 7);
        let rows = 12;
        let (mut x, mut output, mut all_words) = (Vec::new(), Csr::new(), Vec::new());
        for r in 0..rows {
            let row: Vec<f32> = (0..vocab).map(|_| (rng.normal() * 2.0) as f32).collect();
            let mut order: Vec<i32> = (0..vocab as i32).collect();
            order.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]));
            let out: Vec<i32> = (0..output_len).map(|_| rng.below(vocab) as i32).collect();
            // Words ending in the likely tokens: their prefix the output's end (banned), the
            // end but one token (not banned), or a single token.
            let mut words = Vec::new();
            for (j, &last) in order[..1 + r % 4].iter().enumerate() {
                let len = 1 + (j + r) % 4;
                let mut word: Vec<i32> = out[output_len - (len - 1).min(output_len)..].to_vec();
                if (r + j) % 3 == 0 && !word.is_empty() {
                    word[0] = (word[0] + 1) % vocab as i32;
                }
                word.push(last);
                words.push(word);
            }
            x.extend_from_slice(&row);
            output.push(&out);
            all_words.push(words);
        }
        let w = Words::of(&all_words);
        let banned_rows = (0..rows).filter(|&r| !rf::bad_word_bans(output.row(r), &all_words[r]).is_empty()).count();
        assert!(banned_rows >= rows / 2, "too few rows ban anything: {banned_rows}");
        let words32 = vocab.div_ceil(32);
        let bitmask: Vec<i32> = (0..rows * words32).map(|_| (rng.u64() | rng.u64()) as i32).collect();
        for with_bitmask in [false, true] {
            let step = StepInputs {
                output: Some(output.clone()),
                bitmask: with_bitmask.then(|| (bitmask.clone(), words32)),
                ..StepInputs::default()
            };
            let plain_rows: Vec<f32> = (0..rows)
                .flat_map(|r| {
                    let bans = rf::bad_word_bans(output.row(r), &all_words[r]);
                    let p = rf::RowInputs { banned: &bans, ..step.row(r, vocab) };
                    rf::effective_row(&x[r * vocab..(r + 1) * vocab], &p)
                })
                .collect();
            let temps: Vec<f32> = (0..rows).map(|r| [0.0, 0.7, 1.0][r % 3]).collect();
            let seeds = vec![9u64; rows];
            let offsets: Vec<u64> = (0..rows as u64).collect();
            let top_k: Vec<i32> = (0..rows).map(|r| if r % 5 == 0 { 20 } else { 0 }).collect();
            let batch = |logits| Batch {
                temperature: Some(&temps),
                seeds: Some(&seeds),
                offsets: Some(&offsets),
                top_k: Some(&top_k),
                ..Batch::new(logits, rows, vocab)
            };
            let fused = Batch { bad_words: Some(w.view()), ..step.apply(batch(Logits::F32(&x))) };
            assert_fused_draws_as_plain(&fused, &batch(Logits::F32(&plain_rows)), |threads, with_logprobs, r| {
                format!("vocab {vocab}, bitmask {with_bitmask}, {threads} threads, logprobs {with_logprobs}, row {r}")
            });
        }
    }
}

/// Counts of `n` seeded draws at temperature `t` of one row with an output and bad words.
fn sample_counts(x: &[f32], output: &[i32], words: &[Vec<i32>], t: f32, n: usize) -> Vec<u64> {
    let vocab = x.len();
    let per_call = 2000;
    let s = Sampler::new(Config { seed: Some(3), max_rows: per_call, ..Config::default() }).unwrap();
    let logits: Vec<f32> = x.iter().copied().cycle().take(per_call * vocab).collect();
    let outputs = Csr::from_rows(&vec![output.to_vec(); per_call]);
    let w = Words::of(&vec![words.to_vec(); per_call]);
    let (temps, seeds) = (vec![t; per_call], vec![77u64; per_call]);
    let mut counts = vec![0u64; vocab];
    let mut done = 0;
    while done < n {
        let offsets: Vec<u64> = (done..done + per_call).map(|j| j as u64).collect();
        let b = Batch {
            temperature: Some(&temps),
            seeds: Some(&seeds),
            offsets: Some(&offsets),
            output_tokens: Some(outputs.lists()),
            bad_words: Some(w.view()),
            ..Batch::new(Logits::F32(&logits), per_call, vocab)
        };
        for t in common::draw(&s, &b).0 {
            counts[t as usize] += 1;
        }
        done += per_call;
    }
    counts
}

/// Counts of `n` draws from `p` by a plain inverse-CDF sampler: what a sampler following `p`
/// would report.
fn counts_following(p: &[f64], n: usize, seed: u64) -> Vec<u64> {
    let mut rng = TestRng::new(seed);
    let mut counts = vec![0u64; p.len()];
    let cdf: Vec<f64> = p
        .iter()
        .scan(0.0, |c, &q| {
            *c += q;
            Some(*c)
        })
        .collect();
    for _ in 0..n {
        let u = rng.f64();
        counts[cdf.iter().position(|&c| c > u).unwrap_or(p.len() - 1)] += 1;
    }
    counts
}

/// [`chi2`], where a count of a token of probability 0 rejects outright (infinite statistic).
fn chi2_or_reject(counts: &[u64], p: &[f64]) -> (f64, usize) {
    if counts.iter().zip(p).any(|(&c, &q)| c > 0 && q == 0.0) {
        return (f64::INFINITY, 1);
    }
    chi2(counts, p)
}

/// 20,000 draws of a row whose two likeliest tokens end bad words: one after a prefix the output
/// ends with (banned), one after a prefix found earlier in the output but not at its end (not
/// banned). The counts follow the reference, and a sampler that bans every word's last token,
/// or one that ignores multi-token words, fails the same test.
#[test]
fn sampled_distribution_follows_the_bad_word_rule_and_rejects_wrong_rules() {
    let vocab = 200;
    let mut rng = TestRng::new(11);
    let mut x: Vec<f32> = (0..vocab).map(|_| rng.normal() as f32).collect();
    let (first, second) = (17, 42);
    x[first] = 4.0;
    x[second] = 3.5;
    let output = [5, 6, 7, 8, 9];
    let words = vec![vec![8, 9, first as i32], vec![6, second as i32], vec![3]];
    let t = 0.9f32;
    let n = 20_000;
    let right = softmax64(&processed(&x, &output, &words), t as f64);
    let counts = sample_counts(&x, &output, &words, t, n);
    let (stat, dof) = chi2(&counts, &right);
    let crit = chi2_critical(dof, 5.0);
    eprintln!("chi-square {stat:.1} on {dof} dof (critical {crit:.1})");
    assert!(stat < crit, "the sampled distribution is not the reference's: {stat} >= {crit}");
    assert!(dof >= 20, "too few cells: {dof}");
    let every_last: Vec<i32> = words.iter().map(|w| *w.last().unwrap()).collect();
    let wrong_rules = [("every word's last token banned", every_last), ("multi-token words ignored", vec![3])];
    for (name, bans) in wrong_rules {
        let y = rf::effective_row(&x, &rf::RowInputs { banned: &bans, ..rf::RowInputs::NONE });
        let wrong = softmax64(&y, t as f64);
        let tv: f64 = right.iter().zip(&wrong).map(|(a, b)| (a - b).abs()).sum::<f64>() / 2.0;
        assert!(tv > 0.05, "{name} is too close to the rule to test (TV {tv})");
        let fake = counts_following(&wrong, n, 5);
        let (fs, fd) = chi2_or_reject(&fake, &right);
        eprintln!("{name}: total variation {tv:.3}, chi-square {fs:.1} on {fd} dof");
        assert!(fs > chi2_critical(fd, 5.0), "a sampler where {name} would pass ({fs})");
    }
}

/// Draws `b` into sentinel-filled tokens and expects INVALID_ARGUMENT naming `want`, with
/// nothing written and the sampler's stream untouched (its next draw is a fresh sampler's).
fn expect_error(b: &Batch, want: &str) {
    let s = expect_draw_error(b, want);
    let x = vec![0.0f32; 64];
    let plain = Batch::new(Logits::F32(&x), 1, 64);
    let fresh = Sampler::new(Config { seed: Some(1), ..Config::default() }).unwrap();
    assert_eq!(common::draw(&s, &plain), common::draw(&fresh, &plain), "{want}: the failed call moved the stream");
}

#[test]
fn bad_words_that_break_the_rules_are_refused_naming_row_word_and_position() {
    let x = vec![0.5f32; 3 * 10];
    let batch = |ids: &'static [i32], words: &'static [u64], rows: &'static [u64]| Batch {
        bad_words: Some(BadWords { ids, word_offsets: words, row_offsets: rows }),
        ..Batch::new(Logits::F32(&x), 3, 10)
    };
    expect_error(
        &batch(&[1, 2, 3, 10], &[0, 1, 4], &[0, 1, 1, 2]),
        "batch.bad_words_ids[2]: word 0 position 2 (entry 3): 10 is not a token id in [0, 10)",
    );
    expect_error(
        &batch(&[1, -1], &[0, 1, 2], &[0, 0, 2, 2]),
        "batch.bad_words_ids[1]: word 1 position 0 (entry 1): -1",
    );
    expect_error(&batch(&[1, 2], &[0, 1, 1, 2], &[0, 1, 2, 3]), "batch.bad_word_offsets[1]: word 1 is empty");
    expect_error(
        &batch(&[1, 2], &[0, 2, 1], &[0, 1, 2, 2]),
        "batch.bad_word_offsets[2]: 1 is below the previous offset 2",
    );
    expect_error(&batch(&[1, 2], &[0, 1, 3], &[0, 1, 2, 2]), "batch.bad_word_offsets[2]: 3 is past the end");
    expect_error(&batch(&[1, 2], &[0, 1, 2], &[0, 2, 1, 2]), "batch.bad_words_row_offsets[2]: 1 is below the previous");
    expect_error(&batch(&[1, 2], &[0, 1, 2], &[0, 1, 2, 3]), "batch.bad_words_row_offsets[3]: 3 is past the end");
    expect_error(&batch(&[1, 2], &[0, 1, 2], &[0, 1, 2]), "batch.bad_words_row_offsets: has 3 elements");
    // An id out of range is refused even where the word's prefix is not met.
    expect_error(&batch(&[4, 11], &[0, 2], &[0, 1, 1, 1]), "batch.bad_words_ids[0]: word 0 position 1 (entry 1): 11");
}

// ---------------------------------------------------------------------------------------------
// Forced tokens.
// ---------------------------------------------------------------------------------------------

/// Rows of every kind (seeded and unseeded, greedy and sampling, with filters and a step), one
/// of them forced in turn: every other row's token is the one the same call draws unforced, and
/// so is every token of the next call (the stream advanced as for a drawn row), at every level,
/// on 1 and 4 threads, with logprobs or without, a long row split into tiles among them.
#[test]
fn a_forced_row_leaves_every_other_token_as_drawn() {
    tokenrace::internals::force_participants(usize::MAX);
    for (rows, vocab) in [(8usize, 300usize), (1, 50_000), (3, 20_000)] {
        let mut rng = TestRng::new(rows as u64 * 31 + vocab as u64);
        let x: Vec<f32> = (0..rows * vocab).map(|_| (rng.normal() * 2.0) as f32).collect();
        let temps: Vec<f32> = (0..rows).map(|r| [1.0, 0.0, 0.7][r % 3]).collect();
        let seeds = vec![3u64; rows];
        let seeded: Vec<u8> = (0..rows).map(|r| (r % 2) as u8).collect();
        let top_k: Vec<i32> = (0..rows).map(|r| if r % 4 == 3 { 10 } else { 0 }).collect();
        let banned = Csr::from_rows(&(0..rows).map(|r| vec![(r * 7 % vocab) as i32]).collect::<Vec<_>>());
        common::each_level(|level| {
            for threads in [1, 4] {
                for (with_step, with_logprobs) in [(false, false), (true, false), (false, true), (true, true)] {
                    let draw = |s: &Sampler, forced: Option<&[i32]>| {
                        let b = Batch {
                            temperature: Some(&temps),
                            seeds: Some(&seeds),
                            seeded: Some(&seeded),
                            top_k: Some(&top_k),
                            banned_tokens: with_step.then(|| banned.lists()),
                            forced_tokens: forced,
                            ..Batch::new(Logits::F32(&x), rows, vocab)
                        };
                        let (mut tokens, mut lps) = (vec![-1; rows], vec![0f32; rows]);
                        let mut out = Output::new(&mut tokens);
                        if with_logprobs {
                            out.logprobs = Some(&mut lps);
                        }
                        s.draw(&b, &mut out).unwrap();
                        let next = common::draw(s, &Batch { forced_tokens: None, ..b }).0;
                        (tokens, next)
                    };
                    let drawn = draw(&Sampler::new(config(level, threads, rf::Order::TemperatureFirst)).unwrap(), None);
                    for f in 0..rows {
                        let want = ((drawn.0[f] as usize + 1 + f) % vocab) as i32;
                        let mut forced = vec![-1; rows];
                        forced[f] = want;
                        let s = Sampler::new(config(level, threads, rf::Order::TemperatureFirst)).unwrap();
                        let got = draw(&s, Some(&forced));
                        let mut expect = drawn.0.clone();
                        expect[f] = want;
                        let what = format!("rows {rows}, vocab {vocab}, {threads} threads, step {with_step}, row {f}");
                        assert_eq!(got.0, expect, "{what}: this call");
                        assert_eq!(got.1, drawn.1, "{what}: the next call");
                    }
                }
            }
        });
    }
}

/// The forced token's logprob, rank and the row's top-n, in both modes, against the float64
/// reference of the row drawn with the same temperature and filters; a forced token that the
/// step bans is returned flagged, its processed logprob -inf, its raw one finite.
#[test]
fn a_forced_token_reports_its_logprobs_as_if_drawn() {
    let vocab = 500;
    let rows = 6;
    let mut rng = TestRng::new(99);
    let x: Vec<f32> = (0..rows * vocab).map(|_| (rng.normal() * 1.5) as f32).collect();
    let temps = [1.0f32, 0.8, 0.0, 1.3, 0.6, 1.0];
    let top_k = [0, 50, 0, 0, 0, 0];
    let top_p = [1.0f32, 1.0, 1.0, 0.9, 1.0, 1.0];
    let seeds = vec![21u64; rows];
    let offsets: Vec<u64> = (0..rows as u64).collect();
    // Row 5 bans token 3, which it is forced to.
    let banned = Csr::from_rows(&[vec![], vec![], vec![], vec![], vec![], vec![3]]);
    let forced = [7, 123, 40, 499, -1, 3];
    let top_n = 4;
    for mode in [LogprobMode::Raw, LogprobMode::Processed] {
        let s = Sampler::new(Config { seed: Some(1), ..Config::default() }).unwrap();
        let b = Batch {
            temperature: Some(&temps),
            seeds: Some(&seeds),
            offsets: Some(&offsets),
            top_k: Some(&top_k),
            top_p: Some(&top_p),
            banned_tokens: Some(banned.lists()),
            forced_tokens: Some(&forced),
            ..Batch::new(Logits::F32(&x), rows, vocab)
        };
        let (tokens, flags, lps, ranks, _, tlps) = draw_with_logprobs(&s, &b, mode, top_n);
        let greedy_below = Config::default().greedy_below;
        for r in 0..rows {
            let row = &x[r * vocab..(r + 1) * vocab];
            let bans: &[i32] = if r == 5 { &[3] } else { &[] };
            let y = rf::effective_row(row, &rf::RowInputs { banned: bans, ..rf::RowInputs::NONE });
            let filters = rf::Filters { top_k: top_k[r], top_p: top_p[r], min_p: 0.0 };
            let d = rf::draw(&y, temps[r], greedy_below, rf::Noise::Inline(rf::row_key(21, r as u64)), filters);
            assert!(!d.ambiguous, "row {r}: the reference's kept set is not decided");
            let want_lp = match mode {
                LogprobMode::Raw => rf::logprobs(row, &d, rf::Mode::Raw),
                LogprobMode::Processed => rf::logprobs(&y, &d, rf::Mode::Processed),
            };
            let token = if forced[r] >= 0 { forced[r] } else { tokens[r] };
            assert_eq!(tokens[r], token, "row {r}");
            assert!(
                lp_close(lps[r], want_lp[token as usize]),
                "row {r} {mode:?}: {} vs {}",
                lps[r],
                want_lp[token as usize]
            );
            let (lo, hi) = rf::rank_range(&want_lp, token as usize);
            assert!((lo..=hi).contains(&(ranks[r] as usize)), "row {r} {mode:?}: rank {} not in {lo}..={hi}", ranks[r]);
            let top = rf::top_n(&want_lp, top_n);
            for j in 0..top_n {
                assert!(lp_close(tlps[r * top_n + j], want_lp[top[j]]), "row {r} {mode:?}: top-n {j}");
            }
            let banned_flag = flags[r] & flags::FORCED_BANNED != 0;
            assert_eq!(banned_flag, r == 5, "row {r}: the banned-token flag");
        }
        if mode == LogprobMode::Processed {
            assert_eq!(lps[5], f32::NEG_INFINITY, "a banned forced token's processed logprob");
        } else {
            assert!(lps[5].is_finite(), "a banned forced token's raw logprob");
        }
    }
}

fn lp_close(got: f32, want: f64) -> bool {
    rf::lp_close(got, want)
}

#[test]
fn forced_tokens_out_of_range_are_refused_naming_the_row() {
    let x = vec![0.5f32; 3 * 10];
    let batch = |forced: &'static [i32]| Batch { forced_tokens: Some(forced), ..Batch::new(Logits::F32(&x), 3, 10) };
    expect_error(&batch(&[-1, 10, 0]), "batch.forced_tokens[1]: 10 is not a token id in [0, 10) nor -1 (not forced)");
    expect_error(&batch(&[-2, 0, 0]), "batch.forced_tokens[0]: -2 is not a token id");
    expect_error(&batch(&[0, 1]), "batch.forced_tokens: has 2 elements");
}

// ---------------------------------------------------------------------------------------------
// Logprobs of given token ids.
// ---------------------------------------------------------------------------------------------

/// What one call reports: tokens, the sampled logprobs, the given ids' logprobs and ranks.
type GivenDraw = (Vec<i32>, Vec<f32>, Vec<f32>, Vec<i32>);

/// Draws `b` with the logprobs of the ids `given` in `mode`.
fn draw_given(s: &Sampler, b: &Batch, given: &Csr, mode: LogprobMode) -> GivenDraw {
    let rows = b.rows;
    let n = given.row_offsets_end();
    let (mut tokens, mut lps, mut glps, mut granks) = (vec![-1; rows], vec![0f32; rows], vec![0f32; n], vec![0; n]);
    let mut out = Output {
        logprobs: Some(&mut lps),
        logprob_mode: mode,
        token_logprobs: Some(&mut glps),
        token_ranks: Some(&mut granks),
        ..Output::new(&mut tokens)
    };
    s.draw(&Batch { logprob_token_ids: Some(given.lists()), ..*b }, &mut out).unwrap();
    (tokens, lps, glps, granks)
}

trait CsrEnd {
    fn row_offsets_end(&self) -> usize;
}

impl CsrEnd for Csr {
    fn row_offsets_end(&self) -> usize {
        self.lists().ids.len()
    }
}

/// Rows with a step (penalties, a banned token) and filters, and ids that are likely, unlikely,
/// banned, filtered out, repeated or the sampled one: each id's logprob and rank in both modes
/// are the float64 reference's, the sampled token's entry is bit-identical to its logprob, and
/// every level and thread count reports the same bits, a row split into tiles among them.
#[test]
fn logprobs_of_given_ids_follow_the_reference() {
    tokenrace::internals::force_participants(usize::MAX);
    for (rows, vocab, with_step) in [(6usize, 700usize, true), (6, 700, false), (1, 60_000, false)] {
        let mut rng = TestRng::new(vocab as u64 + rows as u64);
        let x: Vec<f32> = (0..rows * vocab).map(|_| (rng.normal() * 2.0) as f32).collect();
        let temps: Vec<f32> = (0..rows).map(|r| [1.0, 0.0, 0.7, 1.3, 0.9, 1.0][r % 6]).collect();
        let top_k: Vec<i32> = (0..rows).map(|r| if r % 3 == 2 { 30 } else { 0 }).collect();
        let seeds = vec![4u64; rows];
        let offsets: Vec<u64> = (0..rows as u64).collect();
        let outputs = Csr::from_rows(&(0..rows).map(|r| vec![(r * 5 % vocab) as i32, 3, 3]).collect::<Vec<_>>());
        let banned = Csr::from_rows(&(0..rows).map(|r| vec![(r * 11 % vocab) as i32]).collect::<Vec<_>>());
        let freq = vec![0.5f32; rows];
        let given = Csr::from_rows(
            &(0..rows)
                .map(|r| {
                    if r == 4 {
                        return vec![];
                    }
                    let row = &x[r * vocab..(r + 1) * vocab];
                    let best = rf::argmax(row) as i32;
                    vec![best, 0, (r * 11 % vocab) as i32, 3, best, (vocab - 1) as i32, rng.below(vocab) as i32]
                })
                .collect::<Vec<_>>(),
        );
        let step = if with_step {
            StepInputs {
                output: Some(outputs.clone()),
                frequency: Some(freq.clone()),
                banned: Some(banned.clone()),
                ..StepInputs::default()
            }
        } else {
            StepInputs::default()
        };
        let batch = || {
            step.apply(Batch {
                temperature: Some(&temps),
                seeds: Some(&seeds),
                offsets: Some(&offsets),
                top_k: Some(&top_k),
                ..Batch::new(Logits::F32(&x), rows, vocab)
            })
        };
        for mode in [LogprobMode::Raw, LogprobMode::Processed] {
            let s = Sampler::new(config(SimdLevel::Scalar, 1, rf::Order::TemperatureFirst)).unwrap();
            let first = draw_given(&s, &batch(), &given, mode);
            let greedy_below = Config::default().greedy_below;
            for r in 0..rows {
                let row = &x[r * vocab..(r + 1) * vocab];
                let y = rf::effective_row(row, &step.row(r, vocab));
                let filters = rf::Filters { top_k: top_k[r], top_p: 1.0, min_p: 0.0 };
                let d = rf::draw(&y, temps[r], greedy_below, rf::Noise::Inline(rf::row_key(4, r as u64)), filters);
                let want = match mode {
                    LogprobMode::Raw => rf::logprobs(row, &d, rf::Mode::Raw),
                    LogprobMode::Processed => rf::logprobs(&y, &d, rf::Mode::Processed),
                };
                let at = given.lists().offsets[r] as usize;
                for (j, &id) in given.row(r).iter().enumerate() {
                    let (got, rank) = (first.2[at + j], first.3[at + j] as usize);
                    let what = format!("vocab {vocab}, step {with_step}, {mode:?}, row {r}, id {id}");
                    assert!(rf::lp_close(got, want[id as usize]), "{what}: {got} vs {}", want[id as usize]);
                    let (lo, hi) = rf::rank_range(&want, id as usize);
                    assert!((lo..=hi).contains(&rank), "{what}: rank {rank} not in {lo}..={hi}");
                    if id == first.0[r] {
                        assert_eq!(got.to_bits(), first.1[r].to_bits(), "{what}: the sampled token's own logprob");
                    }
                }
            }
            common::each_level(|level| {
                for threads in [1, 4] {
                    let s = Sampler::new(config(level, threads, rf::Order::TemperatureFirst)).unwrap();
                    let got = draw_given(&s, &batch(), &given, mode);
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    let what = format!("vocab {vocab}, step {with_step}, {mode:?}, {threads} threads");
                    assert_eq!(got.0, first.0, "{what}: tokens");
                    assert_eq!(bits(&got.2), bits(&first.2), "{what}: the given ids' logprobs");
                    assert_eq!(got.3, first.3, "{what}: the given ids' ranks");
                }
            });
        }
    }
}

#[test]
fn logprobs_of_given_ids_that_break_the_rules_are_refused() {
    let x = vec![0.5f32; 3 * 10];
    let s = Sampler::new(Config { seed: Some(1), ..Config::default() }).unwrap();
    let refuse = |ids: &'static [i32], offsets: &'static [u64], n: usize, ranks: bool, want: &str| {
        let b = Batch { logprob_token_ids: Some(TokenLists { ids, offsets }), ..Batch::new(Logits::F32(&x), 3, 10) };
        let (mut tokens, mut lps, mut rk) = (vec![-7; 3], vec![7f32; n], vec![7; n]);
        let mut out = Output { token_logprobs: Some(&mut lps), ..Output::new(&mut tokens) };
        if ranks {
            out.token_ranks = Some(&mut rk);
        }
        let err = s.draw(&b, &mut out).expect_err(want);
        assert!(err.message.contains(want), "expected {want:?}, got {:?}", err.message);
        assert!(tokens.iter().all(|&t| t == -7) && lps.iter().all(|&v| v == 7.0), "{want}: a failed call wrote");
    };
    refuse(
        &[1, 2, 10],
        &[0, 1, 1, 3],
        3,
        false,
        "batch.logprob_token_ids[2]: position 1 (entry 2): 10 is not a token id",
    );
    refuse(
        &[1, 2, 3],
        &[0, 1, 1, 3],
        2,
        false,
        "out.token_logprobs: has 2 elements, the count of the batch's logprob_token_ids is 3",
    );
    refuse(&[1, 2, 3], &[0, 2, 1, 3], 3, false, "batch.logprob_token_offsets[2]: 1 is below the previous");
    let b = Batch::new(Logits::F32(&x), 3, 10);
    let (mut tokens, mut lps) = (vec![-7; 3], vec![7f32; 3]);
    let err = s.draw(&b, &mut Output { token_logprobs: Some(&mut lps), ..Output::new(&mut tokens) }).unwrap_err();
    assert!(err.message.contains("out.token_logprobs: given without the batch's logprob_token_ids"), "{err}");
    let b = Batch { logprob_token_ids: Some(TokenLists { ids: &[1], offsets: &[0, 1, 1, 1] }), ..b };
    let err = s.draw(&b, &mut Output::new(&mut tokens)).unwrap_err();
    assert!(err.message.contains("batch.logprob_token_ids: given without the output's token_logprobs"), "{err}");
    assert!(tokens.iter().all(|&t| t == -7));
}
