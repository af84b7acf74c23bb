//! Draft trees (speculative decoding, `docs/semantics.md`, "Draft trees"): `Sampler::verify`
//! with `draft_parents`.
//!
//! - A chain given as a tree (parent `i - 1`) gives today's outputs bit for bit: tokens, counts,
//!   flags and logprobs, on random calls of every kind (seeded, external uniforms and noise, the
//!   sampler's stream; greedy and sampling; with and without q; filters), at every SIMD level,
//!   on 1 and 4 threads; its accepted nodes are 0, 1, ...
//! - Random trees (seeded requests, or the caller's uniforms and noise) match a float64 reference of recursive rejection sampling
//!   (the residual kept dense in f64, the recovered race over it on the row's noise), except
//!   requests with a decision within rounding of its threshold (counted).
//! - The first emitted token follows p (chi-square), with q (siblings drawn from q) and with
//!   deterministic drafts; the same counts reject a rule that forgets the residual update.
//! - Greedy requests accept the first child equal to the argmax.
//! - Seeded tree requests give the same outputs alone or in any batch, at every level, on 1 and
//!   4 threads.
//! - Bad trees are refused naming the node; nothing is written and the stream is unchanged.
//!
//! `cargo test --test verify_tree -- --nocapture` prints the counts.
mod common;

use common::reference as rf;
use common::verify::{
    external_randomness, ref_accept, ref_recovered, ref_uniform, sampler, Call, Params, Source, GREEDY_BELOW,
};
use common::{chi2, chi2_critical, draw_from, each_level, gen_row, pick_dist, TestRng};
use tokenrace::*;

/// The domain of the sibling uniforms' keys (docs/semantics.md): "sibling" (the first sibling's
/// is the "accept" uniform of `common::verify`).
const SIBLING_DOMAIN: u64 = 0x73_6962_6c69_6e67;

/// The uniform of the sibling of rank `rank` judged at the row keyed `key`.
fn ref_sibling_uniform(key: u64, rank: usize) -> f64 {
    match rank {
        0 => ref_uniform(key),
        _ => ref_uniform(rf::splitmix64(key ^ SIBLING_DOMAIN).wrapping_add(rank as u64)),
    }
}

/// A draft model close to row `x`: `x` perturbed, softmaxed.
fn near_q(rng: &mut TestRng, x: &[f32]) -> Vec<f64> {
    let y: Vec<f32> = x.iter().map(|&v| if v.is_finite() { v + 1.5 * rng.normal() as f32 } else { 0.0 }).collect();
    common::softmax64(&y, 1.0)
}

/// Elements `which` of `s`, in that order.
fn pick<T: Copy>(s: &[T], which: &[usize]) -> Vec<T> {
    which.iter().map(|&i| s[i]).collect()
}

/// Random draft trees (`Source::Seeded`: every request seeded).
impl Call {
    /// `chain`: every request's parents are `i - 1`.
    fn random(rng: &mut TestRng, source: Source, vocab: usize, chain: bool) -> Call {
        let requests = 1 + rng.below(5);
        let counts: Vec<i32> = (0..requests).map(|_| rng.below(6) as i32).collect();
        let rows: usize = counts.iter().map(|&c| c as usize + 1).sum();
        let mut logits = Vec::with_capacity(rows * vocab);
        for _ in 0..rows {
            let x = if rng.below(3) == 0 {
                common::peaked_logits(rng, vocab, 2.0, 8.0)
            } else {
                let dist = pick_dist(rng);
                gen_row(rng, dist, vocab)
            };
            logits.extend_from_slice(&x);
        }
        let with_q = rng.below(2) == 0;
        let (mut parents, mut drafts, mut q) = (Vec::new(), Vec::new(), Vec::new());
        let mut row = 0;
        for &c in &counts {
            let c = c as usize;
            // One q per parent slot (root 0, node j at j + 1): siblings share it.
            let slot_q: Vec<Vec<f64>> =
                (0..=c).map(|s| near_q(rng, &logits[(row + s) * vocab..(row + s + 1) * vocab])).collect();
            for j in 0..c {
                let parent = if chain || j == 0 { j as i32 - 1 } else { rng.below(j + 1) as i32 - 1 };
                parents.push(parent);
                let slot = (parent + 1) as usize;
                let x = &logits[(row + slot) * vocab..(row + slot + 1) * vocab];
                let d = if with_q {
                    q.extend(slot_q[slot].iter().map(|&v| v as f32));
                    draw_from(rng, &slot_q[slot])
                } else if rng.below(2) == 0 {
                    rf::argmax(x)
                } else {
                    rng.below(vocab)
                };
                drafts.push(if rng.below(25) == 0 { -1 } else { d as i32 });
            }
            row += c + 1;
        }
        let drafts_total = drafts.len();
        let params = Params::random(rng, requests);
        let seeded = (0..requests).map(|_| (source == Source::Seeded) as u8).collect();
        let external = external_randomness(rng, source, drafts_total, rows * vocab);
        Call::new(vocab, counts, parents, drafts, logits, with_q.then_some(q), params, seeded, external)
    }

    fn batch(&self, tree: bool) -> VerifyBatch<'_> {
        VerifyBatch { draft_parents: tree.then_some(&self.parents[..]), ..self.chain_batch(Logits::F32(&self.logits)) }
    }

    /// Requests `which` as a call of their own (seeded requests keep their outputs).
    fn only(&self, which: &[usize]) -> Call {
        let v = self.vocab;
        let (rows, drafts) = self.first_rows();
        let mut c = Call { counts: vec![], parents: vec![], drafts: vec![], logits: vec![], ..self.clone() };
        let mut q = self.q.as_ref().map(|_| Vec::new());
        for &i in which {
            let n = self.counts[i] as usize;
            c.counts.push(n as i32);
            c.parents.extend_from_slice(&self.parents[drafts[i]..drafts[i] + n]);
            c.drafts.extend_from_slice(&self.drafts[drafts[i]..drafts[i] + n]);
            c.logits.extend_from_slice(&self.logits[rows[i] * v..(rows[i] + n + 1) * v]);
            if let (Some(q), Some(all)) = (q.as_mut(), &self.q) {
                q.extend_from_slice(&all[drafts[i] * v..(drafts[i] + n) * v]);
            }
        }
        c.q = q;
        (c.temperature, c.top_k) = (pick(&self.temperature, which), pick(&self.top_k, which));
        (c.top_p, c.min_p) = (pick(&self.top_p, which), pick(&self.min_p, which));
        (c.seeds, c.offsets, c.seeded) =
            (pick(&self.seeds, which), pick(&self.offsets, which), pick(&self.seeded, which));
        c
    }
}

/// Everything a call writes.
#[derive(Debug, PartialEq)]
struct Written {
    tokens: Vec<i32>,
    counts: Vec<i32>,
    flags: Vec<u32>,
    logprobs: Vec<u32>,
    nodes: Vec<i32>,
    width: usize,
}

impl Written {
    fn request(&self, i: usize) -> (&[i32], &[i32]) {
        let (w, c) = (self.width, self.counts[i] as usize);
        (&self.tokens[i * w..i * w + c], &self.nodes[i * w..i * w + c - 1])
    }
}

fn try_verify(s: &Sampler, b: &VerifyBatch) -> Result<Written> {
    let width = b.draft_counts.iter().copied().max().unwrap_or(0) as usize + 1;
    let mut tokens = vec![-7; b.requests * width];
    let mut counts = vec![-7; b.requests];
    let mut flags = vec![7u32; b.requests];
    let mut logprobs = vec![7.0f32; b.requests * width];
    let mut nodes = vec![-7; b.requests * width];
    let mut out = VerifyOutput {
        flags: Some(&mut flags),
        logprobs: Some(&mut logprobs),
        accepted_nodes: Some(&mut nodes),
        ..VerifyOutput::new(&mut tokens, &mut counts)
    };
    s.verify(b, &mut out)?;
    let logprobs = logprobs.iter().map(|l| l.to_bits()).collect();
    Ok(Written { tokens, counts, flags, logprobs, nodes, width })
}

fn verify(s: &Sampler, b: &VerifyBatch) -> Written {
    try_verify(s, b).unwrap()
}

#[test]
fn a_chain_given_as_a_tree_verifies_bit_for_bit_as_today() {
    let mut rng = TestRng::new(0xc4a1_0001);
    let mut requests = 0;
    each_level(|level| {
        for threads in [1, 4] {
            for source in [Source::Seeded, Source::External, Source::Stream] {
                for _ in 0..8 {
                    let vocab = [40, 300, 1000, 2500][rng.below(4)];
                    let call = Call::random(&mut rng, source, vocab, true);
                    let stream = rng.u64();
                    let chain = verify(&sampler(level, threads, stream), &call.batch(false));
                    let tree = verify(&sampler(level, threads, stream), &call.batch(true));
                    let what = format!("{level:?} threads {threads} {source:?} vocab {vocab}");
                    assert_eq!(chain.tokens, tree.tokens, "{what}: tokens");
                    assert_eq!(chain.counts, tree.counts, "{what}: counts");
                    assert_eq!(chain.flags, tree.flags, "{what}: flags");
                    assert_eq!(chain.logprobs, tree.logprobs, "{what}: logprobs");
                    assert_eq!(chain.nodes, tree.nodes, "{what}: accepted nodes");
                    for i in 0..call.counts.len() {
                        let (_, nodes) = tree.request(i);
                        assert!(nodes.iter().enumerate().all(|(j, &n)| n == j as i32), "{what}: {nodes:?}");
                        requests += 1;
                    }
                }
            }
        }
    });
    // Calls large enough for the workers (a million logits).
    for source in [Source::Seeded, Source::External, Source::Stream] {
        let call = Call::random(&mut rng, source, 100_000, true);
        for threads in [1, 4] {
            let chain = verify(&sampler(best_level(), threads, 8), &call.batch(false));
            assert_eq!(chain, verify(&sampler(best_level(), threads, 8), &call.batch(true)), "{source:?} {threads}");
            requests += call.counts.len();
        }
    }
    println!("chains as trees: {requests} requests bit-identical");
}

/// The reference of one request's tree (seeded, or on the caller's uniforms and noise): its emitted tokens and accepted nodes, or `None`
/// when a decision lies within rounding of its threshold.
fn ref_tree(call: &Call, i: usize) -> Option<(Vec<i32>, Vec<i32>)> {
    let v = call.vocab;
    let (rows, firsts) = call.first_rows();
    let (r0, d0, n) = (rows[i], firsts[i], call.counts[i] as usize);
    let parents = &call.parents[d0..d0 + n];
    let depth = |node: i32| {
        let (mut d, mut at) = (0, node);
        while at >= 0 {
            d += 1;
            at = parents[at as usize];
        }
        d as u64
    };
    let t = call.temperature[i];
    let filters = rf::Filters { top_k: call.top_k[i], top_p: call.top_p[i], min_p: call.min_p[i] };
    let (mut tokens, mut nodes) = (Vec::new(), Vec::new());
    let mut node = -1i32;
    loop {
        let row = (node + 1) as usize;
        let x = &call.logits[(r0 + row) * v..(r0 + row + 1) * v];
        let key = rf::row_key(call.seeds[i], call.offsets[i] + depth(node));
        // Unseeded requests of these calls take the caller's noise (one row per target row).
        let external = call.noise.as_ref().filter(|_| call.seeded[i] == 0);
        let noise = match external {
            Some(e) => rf::Noise::Exp(&e[(r0 + row) * v..(r0 + row + 1) * v]),
            None => rf::Noise::Inline(key),
        };
        let drawn = rf::draw(x, t, GREEDY_BELOW, noise, filters);
        if drawn.ambiguous {
            return None;
        }
        let children: Vec<usize> = (0..n).filter(|&c| parents[c] == node).collect();
        if children.is_empty() {
            if !drawn.near.is_empty() {
                return None;
            }
            tokens.push(drawn.token as i32);
            return Some((tokens, nodes));
        }
        if drawn.kept.is_empty() {
            // Greedy, +inf or empty: the first child holding the row's token is accepted.
            tokens.push(drawn.token as i32);
            match children.iter().find(|&&c| call.drafts[d0 + c] == drawn.token as i32) {
                Some(&c) => {
                    nodes.push(c as i32);
                    node = c as i32;
                    continue;
                }
                None => return Some((tokens, nodes)),
            }
        }
        let m = rf::finite_max(x);
        let w: Vec<f64> =
            (0..v).map(|k| if drawn.kept[k] { ((x[k] as f64 - m) * drawn.inv_t).exp() } else { 0.0 }).collect();
        let z: f64 = w.iter().sum();
        let mut r: Vec<f64> = w.iter().map(|w| w / z).collect();
        let q = call.q.as_ref().map(|q| &q[(d0 + children[0]) * v..(d0 + children[0] + 1) * v]);
        let mut accepted = None;
        for (rank, &c) in children.iter().enumerate() {
            let d = call.drafts[d0 + c];
            let u = match (&call.uniforms, call.seeded[i]) {
                (Some(u), 0) => u[d0 + c],
                _ => ref_sibling_uniform(key, rank),
            };
            if d >= 0 {
                let d = d as usize;
                let (rd, qd) = (r[d], q.map_or(1.0, |q| q[d] as f64));
                if ref_accept(rd, qd, u)? {
                    accepted = Some((c, d));
                    break;
                }
            }
            // Rejected: r <- max(r - q, 0) normalized (one-hot q: the draft leaves r).
            let resid: Vec<f64> = match q {
                Some(q) => (0..v).map(|k| (r[k] - q[k] as f64).max(0.0)).collect(),
                None => (0..v).map(|k| if k as i32 == d { 0.0 } else { r[k] }).collect(),
            };
            let s: f64 = resid.iter().sum();
            if s > 0.0 {
                r = resid.iter().map(|x| x / s).collect();
            }
        }
        if let Some((c, d)) = accepted {
            tokens.push(d as i32);
            nodes.push(c as i32);
            node = c as i32;
            continue;
        }
        let ln_e = |k: usize| match noise {
            rf::Noise::Exp(e) if e[k] > 0.0 => (e[k] as f64).ln(),
            rf::Noise::Exp(_) => f64::NAN,
            _ => rf::inline_noise(key, k).ln(),
        };
        let race = match q {
            // One-hot q: the row's own race over what is left of r.
            None => rf::race64(x, |k| r[k] > 0.0, |k| ((x[k] as f64 - m) * drawn.inv_t, ln_e(k))),
            Some(_) => rf::race64(x, |k| r[k] > 0.0, |k| (r[k].ln(), ln_e(k))),
        };
        tokens.push(ref_recovered(&race, &drawn)?);
        return Some((tokens, nodes));
    }
}

#[test]
fn random_trees_match_the_float64_reference() {
    let mut rng = TestRng::new(0x7ee5_0002);
    let (mut compared, mut near, mut branching) = (0, 0, 0);
    each_level(|level| {
        for threads in [1, 4] {
            for _ in 0..12 {
                let vocab = [40, 300, 1000, 2500][rng.below(4)];
                // Seeded requests, or the caller's uniforms (one per node) and noise.
                let source = if rng.below(2) == 0 { Source::Seeded } else { Source::External };
                let call = Call::random(&mut rng, source, vocab, false);
                let got = verify(&sampler(level, threads, 5), &call.batch(true));
                for i in 0..call.counts.len() {
                    compared += 1;
                    let Some((tokens, nodes)) = ref_tree(&call, i) else {
                        near += 1;
                        continue;
                    };
                    let (t, n) = got.request(i);
                    let what = format!("{level:?} threads {threads} request {i} q {}", call.q.is_some());
                    assert_eq!((t, n), (&tokens[..], &nodes[..]), "{what}: parents {:?}", call.parents);
                    // Paths through a later sibling (one accepted after a rejection).
                    let local = &call.parents[call.first_rows().1[i]..];
                    let later = |x: i32| (0..x as usize).any(|e| local[e] == local[x as usize]);
                    branching += usize::from(n.iter().any(|&x| later(x)));
                }
            }
        }
    });
    // A large vocabulary, on the workers.
    for _ in 0..3 {
        let call = Call::random(&mut rng, Source::Seeded, 100_000, false);
        let got = verify(&sampler(best_level(), 4, 5), &call.batch(true));
        for i in 0..call.counts.len() {
            compared += 1;
            match ref_tree(&call, i) {
                Some((tokens, nodes)) => assert_eq!(got.request(i), (&tokens[..], &nodes[..]), "vocab 100000"),
                None => near += 1,
            }
        }
    }
    println!("trees: {compared} requests compared with the reference, {near} near a threshold, {branching} through a later sibling");
    assert!(near * 50 <= compared, "{near} of {compared} near a threshold");
    assert!(branching > 0, "no path went through a later sibling");
}

/// Softmax of `x / t` (no filters).
fn target_probs(x: &[f32], t: f32) -> Vec<f64> {
    let inv_t = rf::inv_t32(t);
    let m = rf::finite_max(x);
    let w: Vec<f64> = x.iter().map(|&v| ((v as f64 - m) * inv_t).exp()).collect();
    let z: f64 = w.iter().sum();
    w.iter().map(|w| w / z).collect()
}

/// The first token's law under a wrong rule that forgets the residual update: every child is
/// judged against p itself, the recovered token drawn from `max(p - q, 0)` of the first
/// rejection only. With q: `m` children drawn from q; without: the fixed `drafts`.
fn forgetful_law(p: &[f64], q: Option<&[f64]>, m: usize, drafts: &[usize]) -> Vec<f64> {
    let vocab = p.len();
    match q {
        Some(q) => {
            let both: Vec<f64> = (0..vocab).map(|x| p[x].min(q[x])).collect();
            let beta: f64 = both.iter().sum();
            let rest = (1.0 - beta).powi(m as i32 - 1);
            (0..vocab).map(|x| both[x] * (1.0 - (1.0 - beta).powi(m as i32)) / beta + rest * (p[x] - both[x])).collect()
        }
        None => {
            let mut law = vec![0.0; vocab];
            let mut none = 1.0;
            for &d in drafts {
                law[d] += none * p[d];
                none *= 1.0 - p[d];
            }
            let left: f64 = (0..vocab).filter(|x| !drafts.contains(x)).map(|x| p[x]).sum();
            for x in (0..vocab).filter(|x| !drafts.contains(x)) {
                law[x] += none * p[x] / left;
            }
            law
        }
    }
}

#[test]
fn the_first_token_follows_p_for_random_trees() {
    let vocab = 12;
    let x0: Vec<f32> = vec![2.0, 1.5, 1.0, 0.5, 0.0, -0.5, 0.3, 1.2, -1.0, 0.8, -2.0, 0.1];
    let t = 0.8;
    let p0 = target_probs(&x0, t);
    let q0 = common::softmax64(&[0.0f32, 1.0, 2.0, 0.5, 1.5, -0.5, 0.3, -1.0, 0.0, 0.2, 1.0, 0.4], 1.0);
    let s = sampler(best_level(), 2, 77);
    let mut rng = TestRng::new(0xd157_0003);
    let fixed = [0usize, 1, 7];
    for with_q in [true, false] {
        let per_call = 600;
        let mut first = vec![0u64; vocab];
        // Trees: the root's 3 children (drawn from q0, or the fixed drafts), a random shape below.
        for _ in 0..40 {
            let (mut parents, mut drafts, mut q, mut logits, mut counts) = (vec![], vec![], vec![], vec![], vec![]);
            for _ in 0..per_call {
                let n = 3 + rng.below(3);
                counts.push(n as i32);
                logits.extend_from_slice(&x0);
                for j in 0..n {
                    let parent = if j < 3 { -1 } else { rng.below(3) as i32 };
                    parents.push(parent);
                    let d = match (with_q, parent) {
                        (true, -1) => draw_from(&mut rng, &q0),
                        (false, -1) => fixed.get(j).copied().expect("the root has 3 children"),
                        _ => rng.below(vocab),
                    };
                    drafts.push(d as i32);
                    // Below the root, q is uniform (the children of one node share it).
                    q.extend((0..vocab).map(|x| if parent < 0 { q0[x] as f32 } else { 1.0 / vocab as f32 }));
                    let row: Vec<f32> = (0..vocab).map(|_| rng.normal() as f32).collect();
                    logits.extend_from_slice(&row);
                }
            }
            let temperature = vec![t; per_call];
            let b = VerifyBatch {
                temperature: Some(&temperature),
                draft_parents: Some(&parents),
                draft_probs: with_q.then(|| DraftProbs { values: &q, row_stride: vocab }),
                ..VerifyBatch::new(Logits::F32(&logits), vocab, &counts, &drafts)
            };
            let out = verify(&s, &b);
            for i in 0..per_call {
                first[out.tokens[i * out.width] as usize] += 1;
            }
        }
        let crit = |dof| chi2_critical(dof, 5.0);
        let (x2, dof) = chi2(&first, &p0);
        println!("with q {with_q}: first token vs p0: chi2 {x2:.1} (dof {dof}, critical {:.1})", crit(dof));
        assert!(x2 < crit(dof), "with q {with_q}: the first token does not follow p0: {x2} (dof {dof})");
        let wrong = forgetful_law(&p0, with_q.then_some(&q0[..]), 3, &fixed);
        let (x2, dof) = chi2(&first, &wrong);
        println!("power: a rule that forgets the residual update: chi2 {x2:.1} (critical {:.1})", crit(dof));
        assert!(x2 > crit(dof), "with q {with_q}: the counts cannot tell a rule that forgets the residual: {x2}");
    }
}

#[test]
fn greedy_trees_accept_the_first_child_equal_to_the_argmax() {
    let vocab = 50;
    let mut rng = TestRng::new(0x9eed_0004);
    each_level(|level| {
        let s = sampler(level, 1, 3);
        for _ in 0..40 {
            // The root's children: two non-argmax tokens, then the argmax twice (the first wins).
            let rows: Vec<Vec<f32>> = (0..6).map(|_| (0..vocab).map(|_| rng.normal() as f32).collect()).collect();
            let top = rf::argmax(&rows[0]) as i32;
            let other = |k: i32| (top + k) % vocab as i32;
            let drafts = [other(1), other(2), top, top, other(3)];
            let parents = [-1, -1, -1, -1, 2];
            let logits: Vec<f32> = rows.concat();
            let (counts, temperature) = ([5], [0.0f32]);
            let b = VerifyBatch {
                temperature: Some(&temperature),
                draft_parents: Some(&parents),
                ..VerifyBatch::new(Logits::F32(&logits), vocab, &counts, &drafts)
            };
            let out = verify(&s, &b);
            let (tokens, nodes) = out.request(0);
            // Node 2's row is row 3; node 4 is accepted when it is that row's argmax.
            let next = rf::argmax(&rows[3]) as i32;
            if drafts[4] == next {
                assert_eq!((tokens, nodes), (&[top, next, rf::argmax(&rows[5]) as i32][..], &[2, 4][..]));
            } else {
                assert_eq!((tokens, nodes), (&[top, next][..], &[2][..]));
            }
        }
    });
}

#[test]
fn seeded_trees_do_not_depend_on_the_batch_threads_or_level() {
    let mut rng = TestRng::new(0x5eed_0005);
    let mut call = Call::random(&mut rng, Source::Seeded, 700, false);
    while call.counts.len() < 3 {
        call = Call::random(&mut rng, Source::Seeded, 700, false);
    }
    let reference = verify(&sampler(SimdLevel::Scalar, 1, 1), &call.batch(true));
    let want = |i: usize| reference.request(i);
    // Unseeded batch mates, with q when the call has it.
    let mut mates = Call::random(&mut rng, Source::Stream, 700, false);
    while mates.q.is_some() != call.q.is_some() {
        mates = Call::random(&mut rng, Source::Stream, 700, false);
    }
    each_level(|level| {
        for threads in [1, 4] {
            let s = sampler(level, threads, 11 + threads as u64);
            for i in 0..call.counts.len() {
                let one = call.only(&[i]);
                let got = verify(&s, &one.batch(true));
                assert_eq!(got.request(0), want(i), "{level:?} threads {threads}: request {i} alone");
            }
            // In reverse order after the mates.
            let rev: Vec<usize> = (0..call.counts.len()).rev().collect();
            let tail = call.only(&rev);
            let mut both = mates.clone();
            both.counts.extend_from_slice(&tail.counts);
            both.parents.extend_from_slice(&tail.parents);
            both.drafts.extend_from_slice(&tail.drafts);
            both.logits.extend_from_slice(&tail.logits);
            if let (Some(a), Some(b)) = (&mut both.q, &tail.q) {
                a.extend_from_slice(b);
            }
            both.temperature.extend_from_slice(&tail.temperature);
            both.top_k.extend_from_slice(&tail.top_k);
            both.top_p.extend_from_slice(&tail.top_p);
            both.min_p.extend_from_slice(&tail.min_p);
            both.seeds.extend_from_slice(&tail.seeds);
            both.offsets.extend_from_slice(&tail.offsets);
            both.seeded.extend_from_slice(&tail.seeded);
            let got = verify(&s, &both.batch(true));
            for (k, &i) in rev.iter().enumerate() {
                assert_eq!(
                    got.request(mates.counts.len() + k),
                    want(i),
                    "{level:?} threads {threads}: request {i} in a batch"
                );
            }
        }
    });
}

#[test]
fn bad_trees_are_refused_naming_the_node_and_nothing_changes() {
    let vocab = 30;
    let mut rng = TestRng::new(0xbad_0006);
    let counts = [2, 4];
    let logits: Vec<f32> = (0..8 * vocab).map(|_| rng.normal() as f32).collect();
    let drafts = [1, 2, 3, 4, 5, 6];
    let good = [-1, -1, -1, 0, 0, 2];
    let q: Vec<f32> = vec![1.0 / vocab as f32; 6 * vocab];
    let cases: Vec<(Vec<i32>, &[&str])> = vec![
        (vec![-1, -1, -1, 0, 3, 2], &["batch.draft_parents[4]", "request 1, node 2", "parent 3"]),
        (vec![-1, -1, -1, 0, 2, 2], &["batch.draft_parents[4]", "request 1, node 2", "parent 2"]),
        (vec![-1, 1, -1, 0, 0, 2], &["batch.draft_parents[1]", "request 0, node 1", "parent 1"]),
        (vec![-1, -1, -1, 0, 0, -2], &["batch.draft_parents[5]", "request 1, node 3", "parent -2"]),
    ];
    let call = |s: &Sampler, parents: &[i32], q: Option<&[f32]>| {
        let b = VerifyBatch {
            draft_parents: Some(parents),
            draft_probs: q.map(|q| DraftProbs { values: q, row_stride: vocab }),
            ..VerifyBatch::new(Logits::F32(&logits), vocab, &counts, &drafts)
        };
        try_verify(s, &b)
    };
    let expect = |e: Error, want: &[&str]| {
        let text = e.to_string();
        assert!(want.iter().all(|w| text.contains(w)), "{text}: wanted {want:?}");
    };
    let (refused, twin) = (sampler(best_level(), 1, 9), sampler(best_level(), 1, 9));
    for (parents, want) in &cases {
        expect(call(&refused, parents, None).unwrap_err(), want);
    }
    expect(call(&refused, &good[..5], None).unwrap_err(), &["batch.draft_parents", "has 5 elements"]);
    // Siblings (nodes 1 and 2 of request 1) with different q rows.
    let mut unequal = q.clone();
    unequal[4 * vocab + 4] += 0.01;
    unequal[4 * vocab + 5] -= 0.01;
    let want = ["batch.draft_probs[4]", "request 1, node 2", "token 4", "sibling node 1"];
    expect(call(&refused, &good, Some(&unequal)).unwrap_err(), &want);
    // Nothing written (try_verify's buffers are checked by a direct call) and the stream unchanged.
    let mut tokens = vec![-7; 10];
    let mut n = vec![-7; 2];
    let bad = [-1, 0, -1, 5, 0, 0];
    let b =
        VerifyBatch { draft_parents: Some(&bad), ..VerifyBatch::new(Logits::F32(&logits), vocab, &counts, &drafts) };
    assert!(refused.verify(&b, &mut VerifyOutput::new(&mut tokens, &mut n)).is_err());
    assert!(tokens.iter().chain(&n).all(|&t| t == -7));
    assert_eq!(call(&refused, &good, Some(&q)).unwrap(), call(&twin, &good, Some(&q)).unwrap());
}
