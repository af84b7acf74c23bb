//! Speculative decoding: a verify call's checks, and the per-row target batch it becomes (what
//! it takes and gives back is `batch/verify.rs`).
//!
//! A verify call checks `n_i` draft tokens of each request against the target model's logits at
//! `n_i + 1` positions (the drafts' and a bonus one), by vLLM's rejection sampling
//! (`docs/semantics.md`, "Verifying draft tokens"). Its per-request parameters are expanded here
//! into a per-row [`Batch`] of the target rows, so that every target row is planned, keyed and
//! drawn exactly as a draw of that row would be: a seeded request's row `j` takes the key of
//! (seed, offset + j). The algorithm itself is `draw/verify.rs`.

use crate::batch::{
    span, validate, validate_params, validate_step_inputs, Batch, Logits, Output, VerifyBatch, VerifyOutput,
};
use crate::draw::verify::PLACEHOLDER_DRAFT;
use crate::error::{bail_batch, bail_out, Error, Owner, Result};
use crate::kernels::Kernels;
use crate::noise::{seeded_row_key, splitmix64, KeyStream, TakenKeys};

/// One request of a validated call: its target rows start at `first_row`, its drafts (and q
/// rows, and uniforms) at `first_draft`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Request {
    pub first_row: usize,
    pub first_draft: usize,
    pub drafts: usize,
}

/// The per-row parameters of the target rows, expanded from the per-request ones.
pub(crate) struct Target {
    pub requests: Vec<Request>,
    temperature: Option<Vec<f32>>,
    top_k: Option<Vec<i32>>,
    top_p: Option<Vec<f32>>,
    min_p: Option<Vec<f32>>,
    seeds: Option<Vec<u64>>,
    offsets: Option<Vec<u64>>,
    seeded: Option<Vec<u8>>,
    /// `tokens_stride` resolved.
    pub width: usize,
    /// The draft trees' shape (`None`: chains).
    pub tree: Option<Tree>,
}

/// The shape of a call's draft trees, per draft node (flat, as `draft_tokens`).
pub(crate) struct Tree {
    /// Request-local parent (-1: the root).
    pub parents: Vec<i32>,
    /// Depth: 1 for a child of the root.
    pub depth: Vec<u32>,
    /// Rank among its siblings, in index order (0: the first child).
    pub rank: Vec<u32>,
}

impl Tree {
    /// The request-local target row of node `node`'s parent (0: the root's row), the row its
    /// acceptance is judged at.
    pub fn parent_row(&self, first_draft: usize, node: usize) -> usize {
        (self.parents[first_draft + node] + 1) as usize
    }
}

/// The request layout of a call: checks the counts and the draft ids.
fn requests(b: &VerifyBatch) -> Result<Vec<Request>> {
    let n = b.requests;
    // Checked first: every draft id is judged against it.
    if b.vocab == 0 {
        bail_batch!("vocab", None, "must be at least 1");
    }
    if b.draft_counts.len() < n {
        bail_batch!("draft_counts", None, "has {} elements, the call has {n} requests", b.draft_counts.len());
    }
    let mut out = Vec::with_capacity(n);
    let (mut row, mut draft) = (0usize, 0usize);
    for (i, &c) in b.draft_counts[..n].iter().enumerate() {
        if c < 0 {
            bail_batch!("draft_counts", Some(i), "{c} is negative");
        }
        out.push(Request { first_row: row, first_draft: draft, drafts: c as usize });
        draft += c as usize;
        row += c as usize + 1;
    }
    if row != b.rows {
        bail_batch!(
            "draft_counts",
            None,
            "add up to {draft} drafts, so the {n} requests need {row} target rows (drafts + one bonus row each), but rows is {}",
            b.rows
        );
    }
    if b.draft_tokens.len() < draft {
        bail_batch!("draft_tokens", None, "has {} elements, draft_counts add up to {draft}", b.draft_tokens.len());
    }
    for (i, r) in out.iter().enumerate() {
        for j in 0..r.drafts {
            let (at, d) = (r.first_draft + j, b.draft_tokens[r.first_draft + j]);
            if (d < 0 && d != PLACEHOLDER_DRAFT) || d >= 0 && d as usize >= b.vocab {
                bail_batch!(
                    "draft_tokens",
                    Some(at),
                    "request {i}, draft {j}: {d} is not a token id in [0, {}) nor -1 (a placeholder draft, rejected)",
                    b.vocab
                );
            }
        }
    }
    Ok(out)
}

/// Checks the draft trees' parents (each -1 or an earlier node of its request, so a tree has no
/// cycle and no forward reference) and records every node's depth and sibling rank.
fn tree(b: &VerifyBatch, reqs: &[Request]) -> Result<Option<Tree>> {
    let Some(parents) = b.draft_parents else { return Ok(None) };
    let drafts = reqs.last().map_or(0, |r| r.first_draft + r.drafts);
    if parents.len() < drafts {
        bail_batch!("draft_parents", None, "has {} elements, draft_counts add up to {drafts}", parents.len());
    }
    let (mut depth, mut rank) = (vec![0u32; drafts], vec![0u32; drafts]);
    for (i, r) in reqs.iter().enumerate() {
        // Children so far of the root (index 0) and of every node (index node + 1).
        let mut children = vec![0u32; r.drafts + 1];
        for j in 0..r.drafts {
            let (at, parent) = (r.first_draft + j, parents[r.first_draft + j]);
            if parent < -1 || parent >= j as i32 {
                bail_batch!(
                    "draft_parents",
                    Some(at),
                    "request {i}, node {j}: parent {parent} is neither -1 (the root) nor an earlier node of the request (0..{j})"
                );
            }
            let slot = (parent + 1) as usize;
            depth[at] = if parent < 0 { 1 } else { depth[r.first_draft + parent as usize] + 1 };
            rank[at] = children[slot];
            children[slot] += 1;
        }
    }
    Ok(Some(Tree { parents: parents[..drafts].to_vec(), depth, rank }))
}

/// Refuses siblings whose q rows differ: siblings are independent draws from their parent's
/// one distribution, which every sibling's own q row must hold (bit for bit). Checked for the
/// sampling requests only (greedy ones ignore q).
fn check_sibling_q(b: &VerifyBatch, reqs: &[Request], tree: &Tree, sampling: impl Fn(usize) -> bool) -> Result<()> {
    let Some(q) = &b.draft_probs else { return Ok(()) };
    let row = |at: usize| &q.values[at * q.row_stride..at * q.row_stride + b.vocab];
    for (i, r) in reqs.iter().enumerate().filter(|&(i, _)| sampling(i)) {
        // The first child of each parent (the root's at index 0), whose row the others match.
        let mut first = vec![usize::MAX; r.drafts + 1];
        for j in 0..r.drafts {
            let at = r.first_draft + j;
            let slot = (tree.parents[at] + 1) as usize;
            if first[slot] == usize::MAX {
                first[slot] = j;
                continue;
            }
            let (a, c) = (row(r.first_draft + first[slot]), row(at));
            if let Some(t) = (0..b.vocab).find(|&t| a[t].to_bits() != c[t].to_bits()) {
                bail_batch!(
                    "draft_probs",
                    Some(at),
                    "request {i}, node {j}: token {t}'s probability {} differs from its sibling node {}'s {} (siblings are drawn from one distribution)",
                    c[t],
                    first[slot],
                    a[t]
                );
            }
        }
    }
    Ok(())
}

/// Checks a verify call and expands its per-request parameters; `greedy_below`, `max_rows` and
/// `vocab_size` come from the sampler.
pub(crate) fn prepare(
    k: &Kernels,
    b: &VerifyBatch,
    out: &VerifyOutput,
    (greedy_below, max_rows, vocab_size): (f32, usize, usize),
) -> Result<Target> {
    let reqs = requests(b)?;
    let tree = tree(b, &reqs)?;
    // The per-request parameters, checked by the draw's own rules as a batch of `requests` rows
    // (errors then name the request: `batch.top_p[3]`).
    let mut view = Batch::new(Logits::F32(&[]), b.requests, b.vocab);
    (view.temperature, view.top_k, view.top_p, view.min_p) = (b.temperature, b.top_k, b.top_p, b.min_p);
    (view.seeds, view.offsets, view.seeded) = (b.seeds, b.offsets, b.seeded);
    validate_params(&view)?;
    validate_verify_step(k, b)?;
    let drafts = reqs.last().map_or(0, |r| r.first_draft + r.drafts);
    let sampling = |i: usize| b.temperature.map_or(1.0, |t| t[i]) >= greedy_below;
    if let Some(u) = b.uniforms {
        if u.len() < drafts {
            bail_batch!("uniforms", None, "has {} elements, draft_counts add up to {drafts}", u.len());
        }
        // Only the uniforms a call uses are checked: those of unseeded sampling requests.
        let seeded = |i: usize| b.seeds.is_some() && b.seeded.is_none_or(|s| s[i] != 0);
        for (i, r) in reqs.iter().enumerate().filter(|&(i, _)| sampling(i) && !seeded(i)) {
            for j in 0..r.drafts {
                let x = u[r.first_draft + j];
                if !(x > 0.0 && x < 1.0) {
                    bail_batch!("uniforms", Some(r.first_draft + j), "request {i}, draft {j}: {x} is not in (0, 1)");
                }
            }
        }
    }
    if let Some(q) = &b.draft_probs {
        if q.row_stride < b.vocab {
            bail_batch!("draft_probs_row_stride", None, "{} is smaller than vocab {}", q.row_stride, b.vocab);
        }
        let need = span(drafts, b.vocab, q.row_stride, 4, "draft_probs_row_stride")?;
        if q.values.len() < need {
            bail_batch!("draft_probs", None, "has {} elements, {drafts} draft rows span {need}", q.values.len());
        }
    }
    if let Some(t) = &tree {
        check_sibling_q(b, &reqs, t, sampling)?;
    }
    let max_n = reqs.iter().map(|r| r.drafts).max().unwrap_or(0);
    let width = if out.tokens_stride == 0 { max_n + 1 } else { out.tokens_stride };
    if width < max_n + 1 {
        bail_out!("tokens_stride", None, "{width} is smaller than max(draft_counts) + 1 = {}", max_n + 1);
    }
    let need = b
        .requests
        .checked_mul(width)
        .ok_or_else(|| Error::arg(Owner::Output, "tokens_stride", None, "requests x tokens_stride overflows"))?;
    let lens = [
        ("tokens", Some(out.tokens.len())),
        ("logprobs", out.logprobs.as_ref().map(|l| l.len())),
        ("accepted_nodes", out.accepted_nodes.as_ref().map(|a| a.len())),
    ];
    for (field, len) in lens {
        if let Some(len) = len.filter(|&l| l < need) {
            bail_out!(field, None, "has {len} elements, requests x tokens_stride is {need}");
        }
    }
    for (field, len) in [("counts", Some(out.counts.len())), ("flags", out.flags.as_ref().map(|f| f.len()))] {
        if let Some(len) = len.filter(|&l| l < b.requests) {
            bail_out!(field, None, "has {len} elements, the call has {} requests", b.requests);
        }
    }
    let target = expand(b, reqs, width, tree);
    // The target rows' own checks (their count, the logits' span, the noise).
    let mut tokens = vec![0i32; b.rows];
    validate(k, &target.batch(b), &Output::new(&mut tokens), max_rows, vocab_size)?;
    Ok(target)
}

/// Checks the sampling step's inputs: the per-request ones as a batch of `requests` rows (errors
/// name the request: `batch.output_offsets[2]`), the bitmask as one of `rows` target rows.
fn validate_verify_step(k: &Kernels, b: &VerifyBatch) -> Result<()> {
    let s = &b.step;
    if !s.is_on() {
        return Ok(());
    }
    let mut view = Batch::new(Logits::F32(&[]), b.requests, b.vocab);
    (view.prompt_tokens, view.output_tokens) = (s.prompt_tokens, s.output_tokens);
    (view.repetition_penalty, view.frequency_penalty, view.presence_penalty) =
        (s.repetition_penalty, s.frequency_penalty, s.presence_penalty);
    (view.logit_bias, view.allowed_tokens, view.allowed_rows, view.banned_tokens) =
        (s.logit_bias, s.allowed_tokens, s.allowed_rows, s.banned_tokens);
    (view.bad_words, view.min_tokens, view.stop_tokens) = (s.bad_words, s.min_tokens, s.stop_tokens);
    validate_step_inputs(k, &view)?;
    let mut rows = Batch::new(Logits::F32(&[]), b.rows, b.vocab);
    rows.token_bitmask = s.token_bitmask;
    validate_step_inputs(k, &rows)
}

/// Repeats each request's value over its rows.
fn per_row<T: Copy>(reqs: &[Request], s: Option<&[T]>) -> Option<Vec<T>> {
    s.map(|s| reqs.iter().enumerate().flat_map(|(i, r)| std::iter::repeat_n(s[i], r.drafts + 1)).collect())
}

/// The position of each target row of request `r` past its offset: row `j`'s depth (the root's
/// row 0, node `j - 1`'s row its depth), which is `j` for a chain.
fn positions<'a>(r: &'a Request, tree: Option<&'a Tree>) -> impl Iterator<Item = u64> + 'a {
    (0..=r.drafts).map(move |j| match (tree, j) {
        (Some(t), 1..) => t.depth[r.first_draft + j - 1] as u64,
        _ => j as u64,
    })
}

fn expand(b: &VerifyBatch, requests: Vec<Request>, width: usize, tree: Option<Tree>) -> Target {
    let t = tree.as_ref();
    let offsets = b.offsets.map(|o| {
        requests.iter().enumerate().flat_map(|(i, r)| positions(r, t).map(move |j| o[i].wrapping_add(j))).collect()
    });
    // Offsets are per row even without per-request ones: row j of a request is at its depth.
    let offsets = offsets.or_else(|| b.seeds.map(|_| requests.iter().flat_map(|r| positions(r, t)).collect()));
    Target {
        temperature: per_row(&requests, b.temperature),
        top_k: per_row(&requests, b.top_k),
        top_p: per_row(&requests, b.top_p),
        min_p: per_row(&requests, b.min_p),
        seeds: per_row(&requests, b.seeds),
        seeded: per_row(&requests, b.seeded),
        offsets,
        requests,
        width,
        tree,
    }
}

impl Target {
    /// The target rows as a draw batch.
    pub(crate) fn batch<'a>(&'a self, b: &VerifyBatch<'a>) -> Batch<'a> {
        let mut t = Batch::new(b.logits, b.rows, b.vocab);
        t.row_stride = b.row_stride;
        t.temperature = self.temperature.as_deref();
        t.top_k = self.top_k.as_deref();
        t.top_p = self.top_p.as_deref();
        t.min_p = self.min_p.as_deref();
        t.seeds = self.seeds.as_deref();
        t.offsets = self.offsets.as_deref();
        t.seeded = self.seeded.as_deref();
        t.noise = b.noise;
        t
    }
}

/// The domain of the acceptance uniforms' keys: "accept".
const UNIFORM_DOMAIN: u64 = 0x6163_6365_7074;

/// The acceptance uniform of the draft position keyed by `key` (the key of its target row).
pub(crate) fn uniform_of_key(key: u64) -> f64 {
    uniform_of_bits(splitmix64(key ^ UNIFORM_DOMAIN) >> 11)
}

/// The domain of the uniforms of a tree node's later siblings: "sibling".
const SIBLING_DOMAIN: u64 = 0x73_6962_6c69_6e67;

/// The acceptance uniform of the sibling of rank `rank` judged at the row keyed by `key`: the
/// first child's is the chain's, [`uniform_of_key`]; a later one's from the row key mixed with
/// its rank.
pub(crate) fn sibling_uniform(key: u64, rank: u32) -> f64 {
    match rank {
        0 => uniform_of_key(key),
        _ => uniform_of_key(splitmix64(key ^ SIBLING_DOMAIN).wrapping_add(rank as u64)),
    }
}

/// A uniform in (0, 1) from 53 random bits: `(bits + 0.5) 2^-53`, centred in its cell. Above
/// 1/2 the sum rounds to an even integer (f64 holds 53 bits), and the top cell would round to
/// exactly 1: it is kept at the largest f64 below 1.
fn uniform_of_bits(bits: u64) -> f64 {
    ((bits as f64 + 0.5) * (1.0 / (1u64 << 53) as f64)).min(1.0 - f64::EPSILON / 2.0)
}

/// Every draft token's acceptance uniform (unused for greedy requests): a seeded request's from
/// its rows' keys, an unseeded one's from `uniforms` when given, else from one key of `keys`
/// per draft, in order.
/// Every draft's uniform, and the keys taken from `keys` for the unseeded ones (to give back if
/// the call is refused later).
pub(crate) fn uniforms(
    b: &VerifyBatch,
    t: &Target,
    greedy_below: f32,
    keys: &KeyStream,
) -> (Vec<f64>, Option<TakenKeys>) {
    let drafts = t.requests.last().map_or(0, |r| r.first_draft + r.drafts);
    let mut u = vec![0.5; drafts];
    let target = t.batch(b);
    let mut keyed = Vec::new();
    for (i, r) in t.requests.iter().enumerate() {
        if b.temperature.map_or(1.0, |x| x[i]) < greedy_below {
            continue;
        }
        for j in 0..r.drafts {
            let at = r.first_draft + j;
            // A node is judged at its parent's row (a chain's draft j at row j).
            let (row, rank) = match &t.tree {
                Some(tree) => (tree.parent_row(r.first_draft, j), tree.rank[at]),
                None => (j, 0),
            };
            if let Some((seed, offset)) = target.seed_of(r.first_row + row) {
                u[at] = sibling_uniform(seeded_row_key(seed, offset), rank);
            } else if let Some(ext) = b.uniforms {
                u[at] = ext[at];
            } else {
                keyed.push(at);
            }
        }
    }
    if keyed.is_empty() {
        return (u, None);
    }
    let mut k = vec![0u64; keyed.len()];
    let taken = keys.take_keys(&mut k);
    for (&at, &key) in keyed.iter().zip(&k) {
        u[at] = uniform_of_key(key);
    }
    (u, Some(taken))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniforms_are_inside_the_open_interval() {
        let top = (1u64 << 53) - 1;
        for bits in [0, 1, 1 << 52, top - 1, top] {
            let u = uniform_of_bits(bits);
            assert!(u > 0.0 && u < 1.0, "{bits}: {u}");
        }
        assert_eq!(uniform_of_bits(0), 0.5f64.powi(54));
        assert!(uniform_of_key(0) > 0.0 && uniform_of_key(0) < 1.0);
    }
}
