//! Keyed-noise watermarking (`docs/semantics.md`, "Watermarking"): a watermarked position is a
//! seeded row of seed `watermark_seed(secret, context)` and offset 0.
//!
//! - `token_noise` is the race's own noise: on rows of equal logits the draw returns the token of
//!   the smallest `token_noise`, at every SIMD level.
//! - Each watermarked token follows its row exactly (chi-square), and the same counts reject a
//!   sampler at T = 0.9 and one that ignores the logits.
//! - 200-token texts of a toy model with realistic rows, watermarked at T = 1, are detected at
//!   p < 1e-6; texts sampled without the watermark, or checked with another secret, give
//!   p-values whose rates below 0.01 and 0.1 are within binomial bands (the false positive rate).
//! - The detector's cost per token is printed.
//!
//! `cargo test --test watermark -- --nocapture` prints the numbers.
mod common;

use common::{chi2, chi2_critical, each_level, TestRng};
use tokenrace::internals::seeded_row_key;
use tokenrace::*;

fn sampler(level: SimdLevel, seed: u64) -> Sampler {
    common::sampler(level, seed)
}

/// Draws one token per row of `logits` (`vocab` wide), row `r` seeded with `seeds[r]`, offset 0.
fn draw_seeded(s: &Sampler, logits: &[f32], vocab: usize, seeds: &[u64]) -> Vec<i32> {
    let offsets = vec![0u64; seeds.len()];
    let mut b = Batch::new(Logits::F32(logits), seeds.len(), vocab);
    (b.seeds, b.offsets) = (Some(seeds), Some(&offsets[..]));
    let mut tokens = vec![-1; seeds.len()];
    s.draw(&b, &mut Output::new(&mut tokens)).unwrap();
    tokens
}

#[test]
fn token_noise_is_the_race_noise() {
    let (vocab, rows) = (700, 300);
    let logits = vec![0.0f32; vocab * rows];
    let seeds: Vec<u64> = (0..rows as u64).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15)).collect();
    each_level(|level| {
        let got = draw_seeded(&sampler(level, 1), &logits, vocab, &seeds);
        for (r, &seed) in seeds.iter().enumerate() {
            let key = seeded_row_key(seed, 0);
            let e: Vec<f64> = (0..vocab).map(|i| token_noise(key, i)).collect();
            let least = (0..vocab).min_by(|&a, &b| e[a].total_cmp(&e[b])).unwrap();
            assert_eq!(got[r], least as i32, "{level:?} row {r}");
        }
    });
}

fn softmax(x: &[f32], t: f64) -> Vec<f64> {
    let m = x.iter().fold(f64::NEG_INFINITY, |a, &v| a.max(v as f64));
    let w: Vec<f64> = x.iter().map(|&v| ((v as f64 - m) / t).exp()).collect();
    let z: f64 = w.iter().sum();
    w.iter().map(|w| w / z).collect()
}

#[test]
fn each_watermarked_token_follows_its_row() {
    let x0: Vec<f32> = vec![2.0, 1.5, 1.0, 0.5, 0.0, -0.5, 0.3, 1.2, -1.0, 0.8, -2.0, 0.1];
    let vocab = x0.len();
    let p = softmax(&x0, 1.0);
    let s = sampler(best_level(), 3);
    let mut rng = TestRng::new(0x3a7e_0001);
    let mut counts = vec![0u64; vocab];
    let per_call = 4000;
    let logits: Vec<f32> = x0.iter().copied().cycle().take(vocab * per_call).collect();
    for _ in 0..15 {
        // Each position's context: 4 random tokens of a 1000-token vocabulary.
        let seeds: Vec<u64> = (0..per_call)
            .map(|_| {
                let context: Vec<i32> = (0..4).map(|_| rng.below(1000) as i32).collect();
                watermark_seed(0x005e_c2e7, &context)
            })
            .collect();
        for t in draw_seeded(&s, &logits, vocab, &seeds) {
            counts[t as usize] += 1;
        }
    }
    let (x2, dof) = chi2(&counts, &p);
    let crit = chi2_critical(dof, 5.0);
    println!("watermarked tokens vs p: chi2 {x2:.1} (dof {dof}, critical {crit:.1})");
    assert!(x2 < crit, "watermarked tokens do not follow the row: {x2}");
    let sharper = softmax(&x0, 0.9);
    let uniform = vec![1.0 / vocab as f64; vocab];
    for (name, wrong) in [("draws at T = 0.9", &sharper), ("ignores the logits", &uniform)] {
        let (x2, dof) = chi2(&counts, wrong);
        println!("power: a sampler that {name}: chi2 {x2:.1} (critical {:.1})", chi2_critical(dof, 5.0));
        assert!(x2 > chi2_critical(dof, 5.0), "the counts cannot tell a sampler that {name}");
    }
}

/// A toy language model: the next token's logits are row `prev % ROWS` of a table of rows
/// shaped like a model's (N(0, 2) and a few tokens near a peak of 8 to 16: a mean entropy of
/// about 2 nats, which the test prints).
struct Toy {
    vocab: usize,
    table: Vec<Vec<f32>>,
}

const ROWS: usize = 256;

impl Toy {
    fn new(rng: &mut TestRng, vocab: usize) -> Toy {
        let table =
            (0..ROWS).map(|r| common::peaked_logits(rng, vocab, 2.0, 8.0 + 8.0 * (r as f64 / ROWS as f64))).collect();
        Toy { vocab, table }
    }

    /// The mean entropy of the rows at T = 1, in nats.
    fn mean_entropy(&self) -> f64 {
        let h = |x: &[f32]| -softmax(x, 1.0).iter().filter(|&&p| p > 0.0).map(|p| p * p.ln()).sum::<f64>();
        self.table.iter().map(|x| h(x)).sum::<f64>() / ROWS as f64
    }

    fn row(&self, prev: i32) -> &[f32] {
        &self.table[prev as usize % ROWS]
    }

    /// `texts` watermarked texts of `len` tokens after 4-token prompts, drawn by the sampler.
    fn watermarked(
        &self,
        s: &Sampler,
        rng: &mut TestRng,
        secret: u64,
        k: usize,
        texts: usize,
        len: usize,
    ) -> Vec<(Vec<i32>, Vec<i32>)> {
        let mut history: Vec<Vec<i32>> =
            (0..texts).map(|_| (0..4).map(|_| rng.below(self.vocab) as i32).collect()).collect();
        for _ in 0..len {
            let seeds: Vec<u64> = history.iter().map(|h| watermark_seed(secret, watermark_context(h, k))).collect();
            let logits: Vec<f32> = history.iter().flat_map(|h| self.row(*h.last().unwrap()).iter().copied()).collect();
            for (h, t) in history.iter_mut().zip(draw_seeded(s, &logits, self.vocab, &seeds)) {
                h.push(t);
            }
        }
        history.into_iter().map(|h| (h[..4].to_vec(), h[4..].to_vec())).collect()
    }

    /// The watermarked text of `len` tokens after `prompt`, drawn position by position.
    fn watermarked_from(&self, s: &Sampler, secret: u64, k: usize, prompt: &[i32], len: usize) -> Vec<i32> {
        let mut h = prompt.to_vec();
        for _ in 0..len {
            let seed = watermark_seed(secret, watermark_context(&h, k));
            h.push(draw_seeded(s, self.row(*h.last().unwrap()), self.vocab, &[seed])[0]);
        }
        h[prompt.len()..].to_vec()
    }

    /// A text sampled exactly from the model by the test's own generator (no watermark).
    fn plain(&self, rng: &mut TestRng, len: usize) -> (Vec<i32>, Vec<i32>) {
        let prompt: Vec<i32> = (0..4).map(|_| rng.below(self.vocab) as i32).collect();
        let mut prev = prompt[3];
        let text = (0..len)
            .map(|_| {
                let p = softmax(self.row(prev), 1.0);
                let mut u = rng.f64();
                let t = p.iter().position(|&w| {
                    u -= w;
                    u < 0.0
                });
                prev = t.unwrap_or(self.vocab - 1) as i32;
                prev
            })
            .collect();
        (prompt, text)
    }
}

/// The count of p-values below `alpha` is within 5 standard deviations of `n alpha`.
fn rate_is_nominal(p_values: &[f64], alpha: f64, what: &str) {
    let n = p_values.len() as f64;
    let below = p_values.iter().filter(|&&p| p < alpha).count() as f64;
    let sd = (n * alpha * (1.0 - alpha)).sqrt();
    println!("{what}: {below} of {n} below {alpha} (expected {:.1} +- {sd:.1})", n * alpha);
    assert!((below - n * alpha).abs() <= 5.0 * sd, "{what}: {below} of {n} below {alpha}");
}

#[test]
fn watermarked_texts_are_detected_and_others_are_not() {
    let (secret, k, len) = (0xddba_115e_c2e7_u64, 4, 200);
    let mut rng = TestRng::new(0x3a7e_0002);
    let toy = Toy::new(&mut rng, 1000);
    let s = sampler(best_level(), 7);
    println!("toy model: mean entropy {:.2} nats per token", toy.mean_entropy());
    let marked = toy.watermarked(&s, &mut rng, secret, k, 40, len);
    let mut worst: f64 = 0.0;
    for (prompt, text) in &marked {
        let d = detect_watermark(secret, k, prompt, text);
        worst = worst.max(d.p_value);
        assert!(d.p_value < 1e-6, "a watermarked text: {d:?}");
        assert!(d.scored as usize <= len);
    }
    println!("40 watermarked texts of {len} tokens: the largest p-value {worst:.3e}");
    // Without the watermark: texts sampled exactly from the model, and the watermarked texts
    // checked with another secret. Each p-value is then uniform; each text is checked with a
    // secret of its own, so that the texts are independent trials (texts of a low-entropy model
    // share many (context, token) pairs, whose uniforms one secret would share too).
    let plain: Vec<(Vec<i32>, Vec<i32>)> = (0..2000).map(|_| toy.plain(&mut rng, len)).collect();
    let secret_of = |i: usize| secret ^ (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let start = std::time::Instant::now();
    let p_plain: Vec<f64> =
        plain.iter().enumerate().map(|(i, (p, t))| detect_watermark(secret_of(i), k, p, t).p_value).collect();
    let per_token = start.elapsed().as_secs_f64() / (plain.len() * len) as f64;
    println!("detector: {:.0} ns per token ({} texts of {len})", per_token * 1e9, plain.len());
    for alpha in [0.01, 0.1] {
        rate_is_nominal(&p_plain, alpha, "unwatermarked texts");
    }
    assert!(p_plain.iter().all(|&p| p >= 1e-6), "an unwatermarked text passed for watermarked");
    let more = toy.watermarked(&s, &mut rng, secret, k, 1000, len);
    let p_other: Vec<f64> =
        more.iter().enumerate().map(|(i, (p, t))| detect_watermark(secret_of(i), k, p, t).p_value).collect();
    rate_is_nominal(&p_other, 0.1, "watermarked texts checked with another secret");
}

#[test]
fn repeated_context_token_pairs_are_scored_once() {
    let (secret, k) = (9, 1);
    // With k = 1: ([], 5), then ([5], 5) five times: two pairs scored.
    let text = [5, 5, 5, 5, 5, 5];
    let d = detect_watermark(secret, k, &[], &text);
    assert_eq!(d.scored, 2);
    assert_eq!(d.score, detect_watermark(secret, k, &[], &text[..2]).score);
    // The same text after a prompt ending in 5: the first context is [5] too, one pair scored.
    assert_eq!(detect_watermark(secret, k, &[7, 5], &text).scored, 1);
    assert_eq!(detect_watermark(secret, k, &[], &[]).p_value, 1.0);
}

/// Speculative decoding of `len` tokens after `prompt` with watermarked verification: the
/// drafter (`draft`, another model) proposes `n` tokens position by position, keyed by the same
/// watermark seeds; the target rows of the drafts and the bonus row are drawn in one call with
/// `watermark_verify_seeds` (or, for the power check, `wrong_seeds`), and `watermark_accept`
/// keeps the matching drafts. Returns the text and the count of accepted drafts.
#[allow(clippy::too_many_arguments)]
fn speculative(
    s: &Sampler,
    target: &Toy,
    draft: &Toy,
    (secret, k): (u64, usize),
    prompt: &[i32],
    n: usize,
    len: usize,
    wrong_seeds: bool,
) -> (Vec<i32>, usize) {
    let mut history = prompt.to_vec();
    let mut accepted = 0;
    while history.len() < prompt.len() + len {
        let mut drafts = Vec::new();
        let mut ctx = history.clone();
        for _ in 0..n {
            let seed = watermark_seed(secret, watermark_context(&ctx, k));
            let t = draw_seeded(s, draft.row(*ctx.last().unwrap()), draft.vocab, &[seed])[0];
            drafts.push(t);
            ctx.push(t);
        }
        let mut seeds = watermark_verify_seeds(secret, k, &history, &drafts);
        if wrong_seeds {
            // One seed per request, as a seeded verify would key its rows: every row alike.
            let first = seeds[0];
            seeds.iter_mut().for_each(|x| *x = first);
        }
        let prevs: Vec<i32> = std::iter::once(*history.last().unwrap()).chain(drafts.iter().copied()).collect();
        let logits: Vec<f32> = prevs.iter().flat_map(|&p| target.row(p).iter().copied()).collect();
        let drawn = draw_seeded(s, &logits, target.vocab, &seeds);
        let emitted = watermark_accept(&drafts, &drawn);
        accepted += emitted.len() - 1;
        history.extend(emitted);
    }
    history.truncate(prompt.len() + len);
    (history[prompt.len()..].to_vec(), accepted)
}

#[test]
fn watermarked_verification_emits_the_sequential_watermarked_text() {
    // The target rows of the drafts keyed by the contexts prompt ++ output ++ drafts[..j]: the
    // speculative text is, token for token, the position-by-position watermarked draw (so it has
    // its distribution and its watermark), at every level; keying every row of a request with one
    // seed (a per-request seed, as a seeded verify) gives other texts.
    let (secret, k, len) = (0x5eed_u64, 4, 120);
    let mut rng = TestRng::new(0x3a7e_0003);
    let target = Toy::new(&mut rng, 1000);
    let draft = Toy { vocab: 1000, table: target.table.iter().map(|r| r.iter().map(|&x| x * 0.8).collect()).collect() };
    each_level(|level| {
        let s = sampler(level, 2);
        let mut rng = TestRng::new(91);
        let (mut accepted, mut differ) = (0, 0);
        for _ in 0..10 {
            let prompt: Vec<i32> = (0..4).map(|_| rng.below(1000) as i32).collect();
            let sequential = target.watermarked_from(&s, secret, k, &prompt, len);
            let (text, a) = speculative(&s, &target, &draft, (secret, k), &prompt, 4, len, false);
            assert_eq!(text, sequential, "{level:?}");
            accepted += a;
            let (wrong, _) = speculative(&s, &target, &draft, (secret, k), &prompt, 4, len, true);
            differ += (wrong != sequential) as usize;
        }
        println!("{level:?}: {accepted} drafts accepted of {} tokens", 10 * len);
        assert!(accepted > 10 * len / 4, "the drafter keyed by the same seeds agrees often");
        assert_eq!(differ, 10, "a per-request seed does not give the sequential text");
    });
}

#[test]
fn verified_watermarked_texts_are_detected() {
    let (secret, k, len) = (0xddba_115e_c2e7_u64, 4, 200);
    let mut rng = TestRng::new(0x3a7e_0004);
    let target = Toy::new(&mut rng, 1000);
    let draft = Toy { vocab: 1000, table: target.table.iter().map(|r| r.iter().map(|&x| x * 0.8).collect()).collect() };
    let s = sampler(best_level(), 3);
    let mut worst: f64 = 0.0;
    for i in 0..20 {
        let prompt: Vec<i32> = (0..4).map(|_| rng.below(1000) as i32).collect();
        let (text, _) = speculative(&s, &target, &draft, (secret, k), &prompt, 4, len, false);
        let d = detect_watermark(secret, k, &prompt, &text);
        worst = worst.max(d.p_value);
        assert!(d.p_value < 1e-6, "a verified watermarked text: {d:?}");
        let other = detect_watermark(secret ^ (i + 1), k, &prompt, &text);
        assert!(other.p_value > 1e-6, "another secret: {other:?}");
    }
    println!("20 verified watermarked texts of {len} tokens: the largest p-value {worst:.3e}");
}

#[test]
fn c_verify_seeds_are_the_rust_ones_and_bad_counts_are_refused() {
    use tokenrace::internals::api::tokenrace_watermark_verify_seeds;
    use tokenrace::internals::types::tokenrace_status;
    let secrets = [5u64, 6];
    let (prompt, prompt_off) = ([1, 2, 3, 4, 5], [0u64, 3, 5]);
    let (output, output_off) = ([7, 8], [0u64, 2, 2]);
    let (counts, drafts) = ([2, 0], [9, 10]);
    let mut seeds = [0u64; 4];
    // SAFETY: every array as long as the call says.
    let status = unsafe {
        tokenrace_watermark_verify_seeds(
            2,
            secrets.as_ptr(),
            3,
            prompt.as_ptr(),
            prompt_off.as_ptr(),
            output.as_ptr(),
            output_off.as_ptr(),
            counts.as_ptr(),
            drafts.as_ptr(),
            seeds.as_mut_ptr(),
        )
    };
    assert_eq!(status, tokenrace_status::Ok);
    let mut want = watermark_verify_seeds(5, 3, &[1, 2, 3, 7, 8], &[9, 10]);
    want.extend(watermark_verify_seeds(6, 3, &[4, 5], &[]));
    assert_eq!(seeds.to_vec(), want);
    // Row j's seed is the seed of the position after history ++ drafts[..j].
    assert_eq!(want[2], watermark_seed(5, &[8, 9, 10]));
    let bad = [2, -1];
    let mut untouched = [7u64; 4];
    // SAFETY: as above.
    let status = unsafe {
        tokenrace_watermark_verify_seeds(
            2,
            secrets.as_ptr(),
            3,
            prompt.as_ptr(),
            prompt_off.as_ptr(),
            output.as_ptr(),
            output_off.as_ptr(),
            bad.as_ptr(),
            drafts.as_ptr(),
            untouched.as_mut_ptr(),
        )
    };
    assert_eq!(status, tokenrace_status::InvalidArgument);
    assert_eq!(untouched, [7; 4]);
}
