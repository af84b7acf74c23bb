//! Speculative decoding: `Sampler::verify` against a float64 reference of vLLM's
//! rejection sampling written in the simplest form (the target distribution `p` from the
//! reference draw's kept set, the ratio and the comparison in f64, the residual race over
//! `max(p - q, 0)` in f64 on the same noise), plus the distribution it must produce.
//!
//! - Random calls: mixed draft counts (0 included), greedy and sampling requests, with and
//!   without q, filters, every logit shape of `common::gen_row`, f32/bf16/f16, every SIMD level,
//!   threads 1 and 2; seeded requests, external uniforms and noise, and the sampler's stream
//!   (followed by the reference: target rows first, then the drafts' uniforms). Emitted tokens and
//!   counts equal the reference's, except requests where a decision lies within rounding of
//!   its threshold (counted: a handful at most).
//! - Distribution: drafts drawn from q by the test; the first emitted token follows p_0
//!   (chi-square), the first draft's acceptance rate is sum min(p_0, q_0) (binomial band), the
//!   second token given an accepted first follows p_1; the same counts reject a verifier that
//!   forgets the residual and one that compares against p instead of p / q.
//! - Seeded requests: the same outputs at every batch position, with any batch mates, on 1 and
//!   2 threads and at every SIMD level.
//! - Bad input: an error naming the argument, request and position, and nothing written.
//!
//! `cargo test --test verify -- --nocapture` prints the counts.
mod common;

use common::reference as rf;
use common::verify::{
    external_randomness, ref_accept, ref_recovered, ref_uniform, sampler, Call, Params, Source, GREEDY_BELOW,
};
use common::{chi2, chi2_critical, draw_from, each_level, gen_row, pick_dist, TestRng};
use tokenrace::*;

const STREAM_SEED: u64 = 0x005e_ed0f_5bec_0010;

fn ln_e(noise: rf::Noise, i: usize) -> f64 {
    match noise {
        rf::Noise::Inline(key) => rf::inline_noise(key, i).ln(),
        rf::Noise::Exp(v) => {
            let e = v[i] as f64;
            if e > 0.0 {
                e.ln()
            } else {
                f64::NAN
            }
        }
        rf::Noise::LogExp(v) => v[i] as f64,
    }
}

/// One request as the reference takes it.
struct RefRequest<'a> {
    rows: Vec<&'a [f32]>,
    drafts: &'a [i32],
    q: Option<Vec<&'a [f32]>>,
    uniforms: Vec<f64>,
    noise: Vec<rf::Noise<'a>>,
    temperature: f32,
    filters: rf::Filters,
}

/// The reference verification of one request: its emitted tokens, or `None` when a decision lies
/// within rounding of its threshold (an acceptance ratio within 1e-9 of its uniform, a race or a
/// filter cut near a tie), where an exact implementation may go either way.
fn ref_verify(r: &RefRequest) -> Option<Vec<i32>> {
    let mut out = Vec::new();
    for (j, &x) in r.rows.iter().enumerate() {
        let drawn = rf::draw(x, r.temperature, GREEDY_BELOW, r.noise[j], r.filters);
        if drawn.ambiguous {
            return None;
        }
        let Some(&d) = r.drafts.get(j) else {
            // The bonus row: a plain draw.
            if !drawn.near.is_empty() {
                return None;
            }
            out.push(drawn.token as i32);
            return Some(out);
        };
        let d = d as usize;
        if drawn.kept.is_empty() {
            // Greedy, +inf or empty: p is a point mass at the row's token.
            out.push(drawn.token as i32);
            if drawn.token == d {
                continue;
            }
            return Some(out);
        }
        let m = rf::finite_max(x);
        let w: Vec<f64> =
            (0..x.len()).map(|i| if drawn.kept[i] { ((x[i] as f64 - m) * drawn.inv_t).exp() } else { 0.0 }).collect();
        let z: f64 = w.iter().sum();
        let p: Vec<f64> = w.iter().map(|w| w / z).collect();
        let q = |i: usize| r.q.as_ref().map_or((i == d) as u8 as f64, |q| q[j][i] as f64);
        let (pd, qd, u) = (p[d], q(d), r.uniforms[j]);
        if ref_accept(pd, qd, u)? {
            out.push(d as i32);
            continue;
        }
        let resid: Vec<f64> = (0..x.len()).map(|i| (p[i] - q(i)).max(0.0)).collect();
        let race = if r.q.is_none() {
            // One-hot q: the residual is p without d; its race is the row's own race without d.
            let t = r.temperature as f64;
            rf::race64(x, |i| drawn.kept[i] && i != d, |i| ((x[i] as f64 - m) / t, ln_e(r.noise[j], i)))
        } else {
            rf::race64(x, |i| resid[i] > 0.0, |i| (resid[i].ln(), ln_e(r.noise[j], i)))
        };
        out.push(ref_recovered(&race, &drawn)?);
        return Some(out);
    }
    unreachable!("the bonus row returns")
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Dtype {
    F32,
    Bf16,
    F16,
}

/// Rounds values to what a dtype holds (so that the reference sees the logits the library reads).
fn round_to(d: Dtype, x: &mut [f32]) {
    for v in x.iter_mut() {
        *v = match d {
            Dtype::F32 => *v,
            Dtype::Bf16 => Bf16::from_f32(*v).to_f32(),
            Dtype::F16 => F16::from_f32(*v).to_f32(),
        };
    }
}

/// Random chains (`Source::Seeded`: most sampling requests seeded, some not) and everything the
/// reference needs.
impl Call {
    fn random(rng: &mut TestRng, dtype: Dtype, source: Source, vocab: usize) -> Call {
        let requests = 1 + rng.below(6);
        let counts: Vec<i32> = (0..requests).map(|_| rng.below(5) as i32).collect();
        let rows: usize = counts.iter().map(|&c| c as usize + 1).sum();
        let mut logits = Vec::with_capacity(rows * vocab);
        for _ in 0..rows {
            let dist = pick_dist(rng);
            let mut x =
                if rng.below(3) == 0 { common::peaked_logits(rng, vocab, 2.0, 8.0) } else { gen_row(rng, dist, vocab) };
            round_to(dtype, &mut x);
            logits.extend_from_slice(&x);
        }
        let with_q = rng.below(2) == 0;
        let drafts_total: usize = counts.iter().map(|&c| c as usize).sum();
        let mut q = Vec::new();
        let mut drafts = Vec::new();
        let mut row = 0;
        for &c in &counts {
            for j in 0..c as usize {
                let x = &logits[(row + j) * vocab..(row + j + 1) * vocab];
                if with_q {
                    // A draft model close to the target: the target row perturbed, softmaxed.
                    let y: Vec<f32> =
                        x.iter().map(|&v| if v.is_finite() { v + 1.5 * rng.normal() as f32 } else { 0.0 }).collect();
                    let mut qr = common::softmax64(&y, 1.0);
                    if rng.below(4) == 0 {
                        // Some tokens the draft never proposes.
                        for v in qr.iter_mut().take(vocab / 3) {
                            *v = 0.0;
                        }
                        let s: f64 = qr.iter().sum();
                        qr.iter_mut().for_each(|v| *v /= s);
                    }
                    let qf: Vec<f32> = qr.iter().map(|&v| v as f32).collect();
                    // The draft drawn from q (inverse CDF).
                    let mut u = rng.f64();
                    let mut d = vocab - 1;
                    for (i, &p) in qr.iter().enumerate() {
                        if u < p {
                            d = i;
                            break;
                        }
                        u -= p;
                    }
                    drafts.push(d as i32);
                    q.extend_from_slice(&qf);
                } else {
                    // Deterministic drafts: often the target's argmax, else any token.
                    let d = if rng.below(2) == 0 { rf::argmax(x) } else { rng.below(vocab) };
                    drafts.push(d as i32);
                }
            }
            row += c as usize + 1;
        }
        let params = Params::random(rng, requests);
        let seeded = (0..requests).map(|_| (source == Source::Seeded && rng.below(4) != 0) as u8).collect();
        let external = external_randomness(rng, source, drafts_total, rows * vocab);
        Call::new(vocab, counts, Vec::new(), drafts, logits, with_q.then_some(q), params, seeded, external)
    }

    /// The reference's emitted tokens of every request (None: a decision near its threshold),
    /// following a sampler whose stream was seeded with `stream_seed`.
    fn reference(&self, stream_seed: u64) -> Vec<Option<Vec<i32>>> {
        let v = self.vocab;
        let greedy = |i: usize| self.temperature[i] < GREEDY_BELOW;
        let mut stream = rf::KeyStream::new(stream_seed);
        // The sampler keys the unseeded sampling target rows first, in row order, then the
        // unseeded drafts' uniforms, in draft order.
        let (mut row_keys, mut first_rows, mut first_drafts) = (Vec::new(), Vec::new(), Vec::new());
        let (mut row, mut draft) = (0, 0);
        for (i, &c) in self.counts.iter().enumerate() {
            first_rows.push(row);
            first_drafts.push(draft);
            for j in 0..=c as usize {
                let key = if self.seeded[i] != 0 {
                    Some(rf::row_key(self.seeds[i], self.offsets[i] + j as u64))
                } else if greedy(i) || self.noise.is_some() {
                    None
                } else {
                    Some(stream.next())
                };
                row_keys.push(key);
            }
            row += c as usize + 1;
            draft += c as usize;
        }
        let mut uniforms = vec![0.5; draft];
        for (i, &c) in self.counts.iter().enumerate() {
            for j in 0..c as usize {
                let at = first_drafts[i] + j;
                uniforms[at] = if self.seeded[i] != 0 {
                    ref_uniform(row_keys[first_rows[i] + j].unwrap())
                } else if greedy(i) {
                    0.5
                } else if let Some(u) = &self.uniforms {
                    u[at]
                } else {
                    ref_uniform(stream.next())
                };
            }
        }
        (0..self.counts.len())
            .map(|i| {
                let (r0, d0, n) = (first_rows[i], first_drafts[i], self.counts[i] as usize);
                let rows = (r0..=r0 + n).map(|r| &self.logits[r * v..(r + 1) * v]).collect();
                let noise = (r0..=r0 + n)
                    .map(|r| match (row_keys[r], &self.noise) {
                        (Some(k), _) => rf::Noise::Inline(k),
                        (None, Some(e)) => rf::Noise::Exp(&e[r * v..(r + 1) * v]),
                        (None, None) => rf::Noise::Inline(0), // greedy: unused
                    })
                    .collect();
                ref_verify(&RefRequest {
                    rows,
                    drafts: &self.drafts[d0..d0 + n],
                    q: self.q.as_ref().map(|q| (d0..d0 + n).map(|d| &q[d * v..(d + 1) * v]).collect()),
                    uniforms: uniforms[d0..d0 + n].to_vec(),
                    noise,
                    temperature: self.temperature[i],
                    filters: rf::Filters { top_k: self.top_k[i], top_p: self.top_p[i], min_p: self.min_p[i] },
                })
            })
            .collect()
    }
}

/// A call's output: tokens (requests x width) and counts.
fn verify(s: &Sampler, b: &VerifyBatch) -> (Vec<i32>, Vec<i32>, usize) {
    let width = b.draft_counts.iter().copied().max().unwrap_or(0) as usize + 1;
    let mut tokens = vec![-7; b.requests * width];
    let mut counts = vec![-7; b.requests];
    s.verify(b, &mut VerifyOutput::new(&mut tokens, &mut counts)).unwrap();
    (tokens, counts, width)
}

fn with_logits<R>(dtype: Dtype, x: &[f32], f: impl FnOnce(Logits) -> R) -> R {
    match dtype {
        Dtype::F32 => f(Logits::F32(x)),
        Dtype::Bf16 => {
            let y: Vec<Bf16> = x.iter().map(|&v| Bf16::from_f32(v)).collect();
            f(Logits::Bf16(&y))
        }
        Dtype::F16 => {
            let y: Vec<F16> = x.iter().map(|&v| F16::from_f32(v)).collect();
            f(Logits::F16(&y))
        }
    }
}

/// Checks one call's output against the reference; returns (requests compared, near ties).
fn check_call(call: &Call, dtype: Dtype, level: SimdLevel, threads: usize, what: &str) -> (usize, usize) {
    let s = sampler(level, threads, STREAM_SEED);
    let (tokens, counts, width) = with_logits(dtype, &call.logits, |l| verify(&s, &call.chain_batch(l)));
    let want = call.reference(STREAM_SEED);
    let mut near = 0;
    for (i, w) in want.iter().enumerate() {
        let got = &tokens[i * width..(i + 1) * width];
        let c = counts[i] as usize;
        assert!(c >= 1 && c <= call.counts[i] as usize + 1, "{what}: request {i}: count {c}");
        assert!(got[c..].iter().all(|&t| t == -1), "{what}: request {i}: padding {got:?}");
        match w {
            None => near += 1,
            Some(w) => assert_eq!(
                &got[..c],
                &w[..],
                "{what}: request {i} (drafts {:?}, T {}, q {})",
                &call.drafts,
                call.temperature[i],
                call.q.is_some()
            ),
        }
    }
    (want.len(), near)
}

#[test]
fn random_calls_match_the_float64_reference() {
    let mut rng = TestRng::new(0x7e51_f1ed);
    let (mut compared, mut near) = (0, 0);
    for dtype in [Dtype::F32, Dtype::Bf16, Dtype::F16] {
        each_level(|level| {
            for threads in [1, 2] {
                for source in [Source::Seeded, Source::External, Source::Stream] {
                    for _ in 0..6 {
                        let vocab = [40, 300, 1000, 2500][rng.below(4)];
                        let call = Call::random(&mut rng, dtype, source, vocab);
                        let what = format!("{dtype:?} {level:?} threads {threads} {source:?} vocab {vocab}");
                        let (c, n) = check_call(&call, dtype, level, threads, &what);
                        compared += c;
                        near += n;
                    }
                }
            }
        });
    }
    println!("verify: {compared} requests compared with the reference, {near} near a threshold");
    assert!(near * 50 <= compared, "{near} of {compared} requests near a threshold");
}

#[test]
fn a_large_vocabulary_matches_the_reference() {
    // Calls of 7 rows or more at this vocabulary are large enough for the workers: with 2
    // threads and fewer than 8 requests every target row is judged as a task of its own
    // (`speculative` in `draw/verify.rs`), with more, every request.
    let mut rng = TestRng::new(0xb16_70ca);
    for source in [Source::Seeded, Source::External, Source::Stream] {
        for _ in 0..2 {
            let call = Call::random(&mut rng, Dtype::F32, source, 151_936);
            for threads in [1, 2] {
                let what = format!("vocab 151936 {source:?} threads {threads} drafts {:?}", call.counts);
                let (c, n) = check_call(&call, Dtype::F32, best_level(), threads, &what);
                assert!(n < c);
            }
        }
    }
}

/// Softmax of `x * inv_t` over the tokens the reference filters keep.
fn target_probs(x: &[f32], t: f32, f: rf::Filters) -> Vec<f64> {
    let inv_t = rf::inv_t32(t);
    let m = rf::finite_max(x);
    let (kept, ambiguous) = rf::filter_set(x, m, inv_t, f);
    assert!(!ambiguous);
    let w: Vec<f64> = (0..x.len()).map(|i| if kept[i] { ((x[i] as f64 - m) * inv_t).exp() } else { 0.0 }).collect();
    let z: f64 = w.iter().sum();
    w.iter().map(|w| w / z).collect()
}

#[test]
fn emitted_tokens_follow_the_target_distribution() {
    let vocab = 12;
    let x0: Vec<f32> = vec![2.0, 1.5, 1.0, 0.5, 0.0, -0.5, 0.3, 1.2, -1.0, 0.8, -2.0, 0.1];
    let x1: Vec<f32> = vec![0.0, -1.0, 2.5, 0.5, 1.0, -0.5, 0.0, 0.2, 1.4, -1.0, 0.6, 0.0];
    let (t, f) = (0.8, rf::Filters { top_k: 10, top_p: 1.0, min_p: 0.0 });
    let (p0, p1) = (target_probs(&x0, t, f), target_probs(&x1, t, f));
    // A draft model that favours other tokens than the target.
    let q0: Vec<f64> = {
        let y = [0.0f32, 1.0, 2.0, 0.5, 1.5, -0.5, 0.3, -1.0, 0.0, 0.2, 1.0, 0.4];
        common::softmax64(&y, 1.0)
    };
    let q1: Vec<f64> = common::softmax64(&[1.0, 0.0, 0.5, 2.0, 0.0, 0.5, -1.0, 0.2, 0.4, 0.0, 0.0, 1.0], 1.0);
    let s = sampler(best_level(), 2, 99);
    let mut rng = TestRng::new(4242);
    let per_call = 1300;
    let (mut first, mut second) = (vec![0u64; vocab], vec![0u64; vocab]);
    let (mut accepted, mut trials) = (0u64, 0u64);
    let mut first_no_q = vec![0u64; vocab];
    for _ in 0..16 {
        let counts = vec![2i32; per_call];
        let mut logits = Vec::new();
        let (mut drafts, mut q) = (Vec::new(), Vec::new());
        for _ in 0..per_call {
            logits.extend_from_slice(&x0);
            logits.extend_from_slice(&x1);
            logits.extend_from_slice(&x0); // bonus row
            drafts.push(draw_from(&mut rng, &q0) as i32);
            drafts.push(draw_from(&mut rng, &q1) as i32);
            q.extend(q0.iter().map(|&v| v as f32));
            q.extend(q1.iter().map(|&v| v as f32));
        }
        let temperature = vec![t; per_call];
        let top_k = vec![f.top_k; per_call];
        let base = VerifyBatch {
            temperature: Some(&temperature),
            top_k: Some(&top_k),
            ..VerifyBatch::new(Logits::F32(&logits), vocab, &counts, &drafts)
        };
        let b = VerifyBatch { draft_probs: Some(DraftProbs { values: &q, row_stride: vocab }), ..base };
        let (tokens, c, w) = verify(&s, &b);
        for i in 0..per_call {
            first[tokens[i * w] as usize] += 1;
            trials += 1;
            if c[i] >= 2 {
                accepted += 1;
                second[tokens[i * w + 1] as usize] += 1;
            }
        }
        // The same drafts as deterministic ones (no q): the first token still follows p_0.
        let (tokens, _, w) = verify(&s, &base);
        for i in 0..per_call {
            first_no_q[tokens[i * w] as usize] += 1;
        }
    }
    let crit = |dof| chi2_critical(dof, 5.0);
    let (x2, dof) = chi2(&first, &p0);
    println!("first token vs p0: chi2 {x2:.1} (dof {dof}, critical {:.1})", crit(dof));
    assert!(x2 < crit(dof), "the first emitted token does not follow p0: {x2} (dof {dof})");
    let (x2, dof) = chi2(&first_no_q, &p0);
    println!("first token without q vs p0: chi2 {x2:.1} (dof {dof})");
    assert!(x2 < crit(dof), "without q, the first emitted token does not follow p0: {x2}");
    let (x2, dof) = chi2(&second, &p1);
    println!("second token vs p1: chi2 {x2:.1} (dof {dof})");
    assert!(x2 < crit(dof), "the second emitted token does not follow p1: {x2}");
    let beta: f64 = p0.iter().zip(&q0).map(|(p, q)| p.min(*q)).sum();
    let (n, k) = (trials as f64, accepted as f64);
    let sd = (n * beta * (1.0 - beta)).sqrt();
    println!("first draft accepted {k} of {n} (expected {:.0} +- {sd:.0})", n * beta);
    assert!((k - n * beta).abs() < 5.0 * sd, "acceptance rate {} against {beta}", k / n);
    // Power: the verifier that forgets the residual (redraws from p on rejection), and the one
    // that accepts with probability p(d) instead of p(d) / q(d), are rejected by these counts.
    let forgot: Vec<f64> = (0..vocab).map(|x| p0[x].min(q0[x]) + (1.0 - beta) * p0[x]).collect();
    let against_p: Vec<f64> = {
        let acc: Vec<f64> = (0..vocab).map(|x| q0[x] * p0[x]).collect();
        let rest = 1.0 - acc.iter().sum::<f64>();
        let resid: Vec<f64> = (0..vocab).map(|x| (p0[x] - q0[x]).max(0.0)).collect();
        let rs: f64 = resid.iter().sum();
        (0..vocab).map(|x| acc[x] + rest * resid[x] / rs).collect()
    };
    for (name, wrong) in [("forgets the residual", &forgot), ("compares against p", &against_p)] {
        let (x2, dof) = chi2(&first, wrong);
        println!("power: a verifier that {name}: chi2 {x2:.1} (dof {dof}, critical {:.1})", crit(dof));
        assert!(x2 > crit(dof), "the counts cannot tell a verifier that {name}: {x2}");
    }
}

#[test]
fn seeded_requests_do_not_depend_on_the_batch_threads_or_level() {
    let mut rng = TestRng::new(0x5eed);
    let call = Call::random_seeded(&mut rng);
    let reference = {
        let s = sampler(SimdLevel::Scalar, 1, 1);
        let (t, c, w) = verify(&s, &call.chain_batch(Logits::F32(&call.logits)));
        (0..call.counts.len()).map(|i| t[i * w..i * w + c[i] as usize].to_vec()).collect::<Vec<_>>()
    };
    each_level(|level| {
        for threads in [1, 2] {
            let s = sampler(level, threads, 7 + threads as u64);
            // Each request alone, then after unseeded batch mates in reverse order.
            for (i, want) in reference.iter().enumerate() {
                let one = call.only(&[i]);
                let (t, c, _) = verify(&s, &one.chain_batch(Logits::F32(&one.logits)));
                assert_eq!(&t[..c[0] as usize], &want[..], "{level:?} threads {threads}: request {i} alone");
            }
            let order: Vec<usize> = (0..call.counts.len()).rev().collect();
            let mut mixed = call.only(&order);
            let mut mate = Call::random(&mut rng, Dtype::F32, Source::Stream, call.vocab);
            mate.seeded.iter_mut().for_each(|s| *s = 0);
            mixed.append(&mate);
            let (t, c, w) = verify(&s, &mixed.chain_batch(Logits::F32(&mixed.logits)));
            for (pos, &i) in order.iter().enumerate() {
                assert_eq!(
                    &t[pos * w..pos * w + c[pos] as usize],
                    &reference[i][..],
                    "{level:?} threads {threads}: request {i} at {pos}"
                );
            }
        }
    });
}

impl Call {
    /// Sampling requests with seeds and drafts that are sometimes accepted.
    fn random_seeded(rng: &mut TestRng) -> Call {
        let mut c = Call::random(rng, Dtype::F32, Source::Seeded, 2000);
        while c.counts.len() < 4 {
            let more = Call::random(rng, Dtype::F32, Source::Seeded, 2000);
            if more.q.is_some() == c.q.is_some() {
                c.append(&more);
            }
        }
        c.seeded.iter_mut().for_each(|s| *s = 1);
        c.temperature.iter_mut().for_each(|t| *t = t.max(0.5));
        c
    }

    /// The requests `which`, in that order.
    fn only(&self, which: &[usize]) -> Call {
        let v = self.vocab;
        let (first_row, first_draft) = self.first_rows();
        let mut out = Call {
            counts: vec![],
            parents: vec![],
            drafts: vec![],
            logits: vec![],
            q: self.q.as_ref().map(|_| vec![]),
            temperature: vec![],
            top_k: vec![],
            top_p: vec![],
            min_p: vec![],
            seeds: vec![],
            offsets: vec![],
            seeded: vec![],
            uniforms: self.uniforms.as_ref().map(|_| vec![]),
            noise: self.noise.as_ref().map(|_| vec![]),
            vocab: v,
        };
        for &i in which {
            let n = self.counts[i] as usize;
            out.counts.push(self.counts[i]);
            out.drafts.extend_from_slice(&self.drafts[first_draft[i]..first_draft[i] + n]);
            out.logits.extend_from_slice(&self.logits[first_row[i] * v..(first_row[i] + n + 1) * v]);
            if let (Some(q), Some(oq)) = (&self.q, out.q.as_mut()) {
                oq.extend_from_slice(&q[first_draft[i] * v..(first_draft[i] + n) * v]);
            }
            if let (Some(u), Some(ou)) = (&self.uniforms, out.uniforms.as_mut()) {
                ou.extend_from_slice(&u[first_draft[i]..first_draft[i] + n]);
            }
            if let (Some(e), Some(oe)) = (&self.noise, out.noise.as_mut()) {
                oe.extend_from_slice(&e[first_row[i] * v..(first_row[i] + n + 1) * v]);
            }
            out.temperature.push(self.temperature[i]);
            out.top_k.push(self.top_k[i]);
            out.top_p.push(self.top_p[i]);
            out.min_p.push(self.min_p[i]);
            out.seeds.push(self.seeds[i]);
            out.offsets.push(self.offsets[i]);
            out.seeded.push(self.seeded[i]);
        }
        out
    }

    /// Appends `other`'s requests (same vocab; q kept only if both have it).
    fn append(&mut self, other: &Call) {
        assert_eq!(self.vocab, other.vocab);
        match (self.q.as_mut(), other.q.as_ref()) {
            (Some(q), Some(oq)) => q.extend_from_slice(oq),
            (Some(q), None) => {
                // One-hot rows for the other call's deterministic drafts.
                for &d in &other.drafts {
                    let mut row = vec![0f32; self.vocab];
                    row[d as usize] = 1.0;
                    q.extend_from_slice(&row);
                }
            }
            // The other's q is dropped: its drafts become deterministic.
            (None, _) => {}
        }
        self.counts.extend_from_slice(&other.counts);
        self.drafts.extend_from_slice(&other.drafts);
        self.logits.extend_from_slice(&other.logits);
        self.temperature.extend_from_slice(&other.temperature);
        self.top_k.extend_from_slice(&other.top_k);
        self.top_p.extend_from_slice(&other.top_p);
        self.min_p.extend_from_slice(&other.min_p);
        self.seeds.extend_from_slice(&other.seeds);
        self.offsets.extend_from_slice(&other.offsets);
        self.seeded.extend_from_slice(&other.seeded);
        self.uniforms = None;
        self.noise = None;
    }
}

#[test]
fn bad_input_is_refused_naming_the_request_and_nothing_is_written() {
    let vocab = 50;
    let counts = vec![2, 0, 1];
    let drafts = vec![3, 4, 5];
    let logits: Vec<f32> = (0..6 * vocab).map(|i| (i % 7) as f32).collect();
    let mut q: Vec<f32> = vec![1.0 / vocab as f32; 3 * vocab];
    let s = sampler(best_level(), 1, 1);
    let try_call = |b: &VerifyBatch, stride: usize| -> Error {
        let mut tokens = vec![-7; 3 * stride.max(3)];
        let mut counts_out = vec![-7; 3];
        let mut out = VerifyOutput { tokens_stride: stride, ..VerifyOutput::new(&mut tokens, &mut counts_out) };
        let e = s.verify(b, &mut out).unwrap_err();
        assert!(tokens.iter().all(|&t| t == -7) && counts_out.iter().all(|&c| c == -7), "written on error: {e}");
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
        e
    };
    let base = VerifyBatch::new(Logits::F32(&logits), vocab, &counts, &drafts);
    let expect = |e: Error, parts: &[&str]| {
        for p in parts {
            assert!(e.message.contains(p), "{:?} lacks {p:?}", e.message);
        }
    };
    let bad_drafts = vec![3, 50, 5];
    expect(
        try_call(&VerifyBatch { draft_tokens: &bad_drafts, ..base }, 0),
        &["batch.draft_tokens[1]", "request 0, draft 1", "50"],
    );
    let neg = vec![3, 4, -2];
    expect(
        try_call(&VerifyBatch { draft_tokens: &neg, ..base }, 0),
        &["batch.draft_tokens[2]", "request 2, draft 0", "-2 is not a token id", "nor -1"],
    );
    let no_vocab = VerifyBatch { vocab: 0, ..base };
    expect(try_call(&no_vocab, 0), &["batch.vocab", "at least 1"]);
    expect(try_call(&VerifyBatch { rows: 7, ..base }, 0), &["batch.draft_counts", "6 target rows", "rows is 7"]);
    let negative_count = vec![2, -1, 1];
    expect(try_call(&VerifyBatch { draft_counts: &negative_count, ..base }, 0), &["batch.draft_counts[1]", "negative"]);
    q[vocab + 7] = -0.01;
    let b = VerifyBatch { draft_probs: Some(DraftProbs { values: &q, row_stride: vocab }), ..base };
    expect(try_call(&b, 0), &["batch.draft_probs[1]", "request 0, draft 1", "token 7"]);
    q[vocab + 7] = f32::NAN;
    expect(
        try_call(&VerifyBatch { draft_probs: Some(DraftProbs { values: &q, row_stride: vocab }), ..base }, 0),
        &["batch.draft_probs[1]", "token 7"],
    );
    q[vocab + 7] = 1.0 / vocab as f32;
    q[2 * vocab] = 0.5;
    expect(
        try_call(&VerifyBatch { draft_probs: Some(DraftProbs { values: &q, row_stride: vocab }), ..base }, 0),
        &["batch.draft_probs[2]", "request 2, draft 0", "not 1 within 1e-3"],
    );
    q[2 * vocab] = 1.0 / vocab as f32;
    let short = &q[..2 * vocab];
    expect(
        try_call(&VerifyBatch { draft_probs: Some(DraftProbs { values: short, row_stride: vocab }), ..base }, 0),
        &["batch.draft_probs"],
    );
    let u = vec![0.5, 1.0, 0.5];
    expect(
        try_call(&VerifyBatch { uniforms: Some(&u), ..base }, 0),
        &["batch.uniforms[1]", "request 0, draft 1", "(0, 1)"],
    );
    let u0 = vec![0.5, 0.5, 0.0];
    expect(try_call(&VerifyBatch { uniforms: Some(&u0), ..base }, 0), &["batch.uniforms[2]", "request 2"]);
    let top_p = vec![1.0, 1.5, 1.0];
    expect(try_call(&VerifyBatch { top_p: Some(&top_p), ..base }, 0), &["batch.top_p[1]"]);
    let temp = vec![1.0, f32::NAN, 1.0];
    expect(try_call(&VerifyBatch { temperature: Some(&temp), ..base }, 0), &["batch.temperature[1]"]);
    expect(try_call(&base, 2), &["out.tokens_stride", "3"]);
    // Greedy requests ignore their uniforms and q rows.
    let greedy = vec![0.0f32; 3];
    q[2 * vocab] = 0.5;
    let b = VerifyBatch {
        temperature: Some(&greedy),
        uniforms: Some(&u0),
        draft_probs: Some(DraftProbs { values: &q, row_stride: vocab }),
        ..base
    };
    let (_, c, _) = verify(&s, &b);
    assert!(c.iter().all(|&c| c >= 1));
}

#[test]
fn greedy_requests_accept_while_the_drafts_are_the_argmax() {
    let vocab = 20;
    let rows: Vec<Vec<f32>> = (0..4).map(|r| (0..vocab).map(|i| ((i * 7 + r * 3) % vocab) as f32).collect()).collect();
    let argmax: Vec<i32> = rows.iter().map(|x| rf::argmax(x) as i32).collect();
    let logits: Vec<f32> = rows.concat();
    let s = sampler(best_level(), 1, 1);
    let greedy = [0.0f32];
    for (drafts, want) in [
        (vec![argmax[0], argmax[1], argmax[2]], vec![argmax[0], argmax[1], argmax[2], argmax[3]]),
        (vec![argmax[0], (argmax[1] + 1) % vocab as i32, argmax[2]], vec![argmax[0], argmax[1]]),
        (vec![(argmax[0] + 1) % vocab as i32, argmax[1], argmax[2]], vec![argmax[0]]),
    ] {
        let counts = [3];
        let b = VerifyBatch {
            temperature: Some(&greedy),
            ..VerifyBatch::new(Logits::F32(&logits), vocab, &counts, &drafts)
        };
        let (t, c, _) = verify(&s, &b);
        assert_eq!(&t[..c[0] as usize], &want[..], "drafts {drafts:?}");
        assert!(t[c[0] as usize..].iter().all(|&t| t == -1));
    }
}

/// vLLM's placeholder draft id, -1 (`PLACEHOLDER_TOKEN_ID`): rejected without reading anything
/// by its id, the token drawn as for a rejected draft whose target probability is 0 (from p
/// without q, from max(p - q, 0) with q), the request stopping there. Checked against exactly
/// that draft (a token whose logit is -inf), greedy and sampled, seeded, with and without q, at
/// every level, and a padded batch as vLLM builds it.
#[test]
fn a_placeholder_draft_is_rejected_as_a_draft_of_probability_zero() {
    let vocab = 300;
    let counts = [3, 2];
    let mut rng = TestRng::new(41);
    let mut logits: Vec<f32> = (0..7 * vocab).map(|_| (rng.normal() * 2.0) as f32).collect();
    let zero = 17; // a token no row can draw
    for r in 0..7 {
        logits[r * vocab + zero] = f32::NEG_INFINITY;
    }
    let argmax: Vec<i32> = (0..7).map(|r| rf::argmax(&logits[r * vocab..(r + 1) * vocab]) as i32).collect();
    let q: Vec<f32> = (0..5 * vocab).map(|i| ((i * 31 % 97) + 1) as f32).collect();
    let q: Vec<f32> =
        q.chunks(vocab).flat_map(|row| row.iter().map(|&x| x / row.iter().sum::<f32>()).collect::<Vec<_>>()).collect();
    let seeds = [11u64, 12];
    each_level(|level| {
        let s = sampler(level, 1, 3);
        for temperature in [0.0f32, 0.8] {
            for with_q in [false, true] {
                let t = [temperature; 2];
                // Request 0: its first draft accepted when greedy, then the placeholder.
                let with = |drafts: &[i32]| {
                    let b = VerifyBatch {
                        temperature: Some(&t),
                        seeds: Some(&seeds),
                        draft_probs: with_q.then_some(DraftProbs { values: &q, row_stride: vocab }),
                        ..VerifyBatch::new(Logits::F32(&logits), vocab, &counts, drafts)
                    };
                    verify(&s, &b)
                };
                let placeholder = with(&[argmax[0], -1, 5, -1, -1]);
                let zero_drafts = with(&[argmax[0], zero as i32, 5, zero as i32, zero as i32]);
                assert_eq!(placeholder, zero_drafts, "{level:?}, T {temperature}, q {with_q}");
                let (tokens, c, width) = placeholder;
                // Nothing after the placeholder, and never the placeholder itself.
                assert!(c[0] <= 2 && c[1] == 1, "{c:?}");
                assert!(tokens.iter().all(|&t| t == -1 || (0..vocab as i32).contains(&t) && t != zero as i32));
                if temperature == 0.0 {
                    assert_eq!(&tokens[..2], &[argmax[0], argmax[1]]);
                    assert_eq!(tokens[width], argmax[4]);
                }
            }
        }
    });
}

/// The rows a verify call reads whose logits are not all finite count in `nonfinite_rows`, as a
/// draw of those rows counts them.
#[test]
fn verify_counts_the_nonfinite_rows_it_reads() {
    let vocab = 64;
    let mut logits: Vec<f32> = (0..4 * vocab).map(|i| (i % 13) as f32).collect();
    logits[5] = f32::NAN; // request 0's draft row
    logits[3 * vocab..].fill(f32::NEG_INFINITY); // request 1's bonus row: empty
                                                 // Each draft is its row's argmax, so both bonus rows are read too.
    let drafts = [rf::argmax(&logits[..vocab]) as i32, rf::argmax(&logits[2 * vocab..3 * vocab]) as i32];
    let counts = [1, 1];
    let s = sampler(best_level(), 1, 1);
    let greedy = [0.0f32; 2];
    let b =
        VerifyBatch { temperature: Some(&greedy), ..VerifyBatch::new(Logits::F32(&logits), vocab, &counts, &drafts) };
    assert_eq!(verify(&s, &b).1, [2, 2]);
    assert_eq!(s.stats().nonfinite_rows, 2);
}

/// A call large enough for the workers (its q rows are checked as tasks of their own, before
/// the requests): the error is the serial call's, the lowest failing request's first failing
/// q row, whatever the threads, and nothing is written.
#[test]
fn the_workers_report_the_first_bad_q_row_as_a_serial_call_would() {
    let vocab = 65_536;
    let counts = vec![2, 2, 2, 2, 2, 2, 2, 2];
    let drafts: Vec<i32> = (0..16).map(|i| i * 3).collect();
    let logits: Vec<f32> = (0..24 * vocab).map(|i| ((i * 7919) % 1013) as f32 * 0.01).collect();
    let mut q = vec![1.0 / vocab as f32; 16 * vocab];
    // Request 3's second row (flat draft 7) has a NaN, request 3's first row (draft 6) does not
    // sum to 1, and request 5's first row (draft 10) has a negative value.
    q[7 * vocab + 11] = f32::NAN;
    q[6 * vocab + 5] = 0.5;
    q[10 * vocab] = -1.0;
    let b = VerifyBatch {
        draft_probs: Some(DraftProbs { values: &q, row_stride: vocab }),
        ..VerifyBatch::new(Logits::F32(&logits), vocab, &counts, &drafts)
    };
    for threads in [1, 2, 4] {
        let s = sampler(best_level(), threads, 1);
        let mut tokens = vec![-7; 8 * 3];
        let mut counts_out = vec![-7; 8];
        let e = s.verify(&b, &mut VerifyOutput::new(&mut tokens, &mut counts_out)).unwrap_err();
        assert!(tokens.iter().all(|&t| t == -7) && counts_out.iter().all(|&c| c == -7), "written on error: {e}");
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
        for part in ["batch.draft_probs[6]", "request 3, draft 0", "not 1 within 1e-3"] {
            assert!(e.message.contains(part), "threads {threads}: {:?} lacks {part:?}", e.message);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The cases the Python suite checks its binding against
// ---------------------------------------------------------------------------------------------

/// Where the verify cases live: seeded calls and this file's reference tokens, read by
/// `tests/python/test_verify.py` so that the verify rule has one float64 reference, this one.
const VERIFY_CASES: &str = "tests/fixtures/verify_cases.json";
/// Calls per logits type; small vocabularies keep the committed file small.
const CASES_PER_DTYPE: usize = 8;

/// Random calls with every request seeded (no stream, no external randomness: the tokens are a
/// function of the call alone), `CASES_PER_DTYPE` of each logits type.
fn verify_case_calls() -> Vec<(Dtype, Call)> {
    let mut rng = TestRng::new(0x0f1c_57e5);
    let mut calls = Vec::new();
    for dtype in [Dtype::F32, Dtype::Bf16, Dtype::F16] {
        for k in 0..CASES_PER_DTYPE {
            let mut call = Call::random(&mut rng, dtype, Source::Seeded, [16, 40, 96][k % 3]);
            call.seeded.iter_mut().for_each(|s| *s = 1);
            calls.push((dtype, call));
        }
    }
    calls
}

/// The cases and their reference tokens as JSON (the bit-exact writers of `common::fixtures`).
fn verify_cases_json() -> String {
    let calls: Vec<String> = verify_case_calls()
        .iter()
        .map(|(dtype, call)| {
            let name = match dtype {
                Dtype::F32 => "float32",
                Dtype::Bf16 => "bfloat16",
                Dtype::F16 => "float16",
            };
            call_json(call, name, &call.reference(STREAM_SEED))
        })
        .collect();
    format!(
        "{{\n\"about\": \"seeded verify calls and the float64 reference's tokens (null: a decision within \
         rounding of its threshold); written by tests/verify.rs: TOKENRACE_BLESS=1 cargo test --test verify \
         committed_verify_cases\",\n\"calls\": [\n{}\n]\n}}\n",
        calls.join(",\n")
    )
}

fn call_json(call: &Call, dtype: &str, want: &[Option<Vec<i32>>]) -> String {
    use common::fixtures::{floats, hex, list, or_null};
    let tokens = want.iter().map(|w| or_null(w.as_ref(), |w| list(w))).collect::<Vec<_>>();
    format!(
        "{{\"dtype\": \"{dtype}\", \"vocab\": {}, \"counts\": {}, \"drafts\": {}, \"temperature\": {}, \"top_k\": {}, \
         \"top_p\": {}, \"min_p\": {}, \"seeds\": {}, \"offsets\": {}, \"want\": [{}],\n \"logits\": {},\n \"q\": {}}}",
        call.vocab,
        list(&call.counts),
        list(&call.drafts),
        floats(&call.temperature),
        list(&call.top_k),
        floats(&call.top_p),
        floats(&call.min_p),
        list(&call.seeds),
        list(&call.offsets),
        tokens.join(", "),
        hex(&call.logits),
        or_null(call.q.as_deref(), hex),
    )
}

/// The committed cases are what this file's reference says today (`TOKENRACE_BLESS=1` rewrites
/// them), and the library emits them: a change of the rule changes the file, and the Python
/// suite follows.
#[test]
fn committed_verify_cases_are_current() {
    common::fixtures::check_committed(
        VERIFY_CASES,
        &verify_cases_json(),
        "cargo test --test verify committed_verify_cases",
    );
    // The library agrees with the cases, as the Python suite will check through its binding.
    for (k, (dtype, call)) in verify_case_calls().iter().enumerate() {
        check_call(call, *dtype, supported_levels()[0], 1, &format!("{dtype:?} case {k}"));
    }
}
