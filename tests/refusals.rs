//! A refused call changes nothing: the sampler's key stream, its pool and its counters of drawn
//! rows are as they were, so a serving engine that rejects a batch and retries it gets the
//! tokens it would have got. Every kind of refusal of a draw and of a verify, each against a twin
//! sampler that never saw it, at 1, 4 and all threads, on inline noise and on an attached pool.
mod common;

use common::*;
use std::sync::Arc;
use tokenrace::*;

const VOCAB: usize = 3000;
const ROWS: usize = 6;

fn twin(threads: usize, pool: bool) -> Sampler {
    let s =
        Sampler::new(Config { seed: Some(77), threads, max_rows: 64, vocab_size: VOCAB, ..Config::default() }).unwrap();
    if pool {
        let p =
            NoisePool::new(PoolConfig { rows: 16, vocab: VOCAB, seed: Some(5), threads: 1, ..PoolConfig::default() })
                .unwrap();
        s.attach_pool(Arc::new(p)).unwrap();
    }
    s
}

/// The inputs of a valid draw of unseeded sampling rows with every list of the sampling step;
/// each refusal below breaks one thing of it.
struct Inputs {
    logits: Vec<f32>,
    ids: Vec<i32>,
    offsets: Vec<u64>,
    bias_ids: Vec<i32>,
    bias_values: Vec<f32>,
    penalty: Vec<f32>,
    temperature: Vec<f32>,
    top_p: Vec<f32>,
    bitmask: Vec<i32>,
}

impl Inputs {
    fn new() -> Inputs {
        let mut rng = TestRng::new(3);
        let logits = (0..ROWS * VOCAB).map(|_| (rng.normal() * 2.0) as f32).collect();
        let ids: Vec<i32> = (0..ROWS * 5).map(|_| rng.below(VOCAB) as i32).collect();
        Inputs {
            logits,
            offsets: (0..=ROWS as u64).map(|r| r * 5).collect(),
            bias_ids: ids.iter().map(|&i| (i + 7) % VOCAB as i32).collect(),
            bias_values: (0..ids.len()).map(|i| (i % 3) as f32 * 0.5).collect(),
            ids,
            penalty: vec![1.2; ROWS],
            temperature: vec![0.9; ROWS],
            top_p: vec![0.95; ROWS],
            bitmask: vec![-1; ROWS * VOCAB.div_ceil(32)],
        }
    }

    fn batch(&self) -> Batch<'_> {
        let lists = TokenLists { ids: &self.ids, offsets: &self.offsets };
        Batch {
            temperature: Some(&self.temperature),
            top_p: Some(&self.top_p),
            output_tokens: Some(lists),
            prompt_tokens: Some(lists),
            repetition_penalty: Some(&self.penalty),
            frequency_penalty: Some(&self.penalty),
            logit_bias: Some(LogitBias { ids: &self.bias_ids, values: &self.bias_values, offsets: &self.offsets }),
            banned_tokens: Some(TokenLists { ids: &self.ids[..3], offsets: &[0, 0, 0, 3, 3, 3, 3] }),
            token_bitmask: Some(TokenBitmask { words: &self.bitmask, row_stride: VOCAB.div_ceil(32) }),
            ..Batch::new(Logits::F32(&self.logits), ROWS, VOCAB)
        }
    }
}

/// A named way of making the inputs bad in one place.
type Refusal = (&'static str, Box<dyn Fn(&mut Inputs)>);

/// Each way a draw is refused: the inputs made bad in one place.
fn refusals() -> Vec<Refusal> {
    vec![
        (
            "an output id past the vocabulary (checked by the rows' tasks)",
            Box::new(|i: &mut Inputs| i.ids[17] = VOCAB as i32),
        ),
        ("a negative list id", Box::new(|i: &mut Inputs| i.ids[29] = -3)),
        ("a bias id past the vocabulary", Box::new(|i: &mut Inputs| i.bias_ids[3] = VOCAB as i32 + 5)),
        ("a bad penalty", Box::new(|i: &mut Inputs| i.penalty[4] = -1.0)),
        ("a bad temperature", Box::new(|i: &mut Inputs| i.temperature[2] = f32::NAN)),
        ("a bad top-p", Box::new(|i: &mut Inputs| i.top_p[5] = 1.5)),
        ("decreasing offsets", Box::new(|i: &mut Inputs| i.offsets[3] = 2)),
        ("a bias that is NaN", Box::new(|i: &mut Inputs| i.bias_values[8] = f32::NAN)),
    ]
}

/// Tokens of `calls` good draws (unseeded, so they take keys or pool rows), and the counters.
fn good_draws(s: &Sampler, calls: usize) -> (Vec<i32>, u64, u64) {
    let inputs = Inputs::new();
    let mut all = Vec::new();
    for _ in 0..calls {
        let mut tokens = vec![-1; ROWS];
        s.draw(&inputs.batch(), &mut Output::new(&mut tokens)).unwrap();
        all.extend(tokens);
    }
    let st = s.stats();
    let borrowed = s.pool().map_or(0, |p| p.stats().rows_borrowed);
    (all, st.inline_rows + st.pool_rows, borrowed)
}

#[test]
fn a_refused_draw_leaves_the_stream_and_the_pool_as_they_were() {
    for threads in [1, 4, 0] {
        for pool in [false, true] {
            for (what, spoil) in refusals() {
                let (refused, twin_sampler) = (twin(threads, pool), twin(threads, pool));
                // One good call first, so that the refusal comes mid-stream.
                good_draws(&refused, 1);
                good_draws(&twin_sampler, 1);
                let mut bad = Inputs::new();
                spoil(&mut bad);
                let mut tokens = vec![-7; ROWS];
                let result = refused.draw(&bad.batch(), &mut Output::new(&mut tokens));
                let e = result.expect_err(what);
                assert_eq!(e.kind, ErrorKind::InvalidArgument, "{what}: {e}");
                assert!(tokens.iter().all(|&t| t == -7), "{what}: written on error");
                let (a, b) = (good_draws(&refused, 3), good_draws(&twin_sampler, 3));
                assert_eq!(a, b, "{what}: threads {threads}, pool {pool}: the refusal changed later draws");
            }
        }
    }
}

/// A valid verify call of unseeded sampling requests (drafts with q rows) and one with a q row
/// that is not a distribution (found while the rows are verified, after they were keyed).
#[test]
fn a_refused_verify_leaves_the_stream_and_the_pool_as_they_were() {
    let counts = [2, 1, 3];
    let drafts = [5, 9, 11, 12, 13, 14];
    let rows = drafts.len() + counts.len();
    let mut rng = TestRng::new(8);
    let logits: Vec<f32> = (0..rows * VOCAB).map(|_| (rng.normal() * 2.0) as f32).collect();
    let good_q = vec![1.0 / VOCAB as f32; drafts.len() * VOCAB];
    let mut bad_q = good_q.clone();
    bad_q[4 * VOCAB + 10] = -0.5;
    let bad_ids = [5, 9, 11, VOCAB as i32, 13, 14];
    let verify = |s: &Sampler, q: &[f32], ids: &[i32]| -> Result<Vec<i32>> {
        let b = VerifyBatch {
            draft_probs: Some(DraftProbs { values: q, row_stride: VOCAB }),
            ..VerifyBatch::new(Logits::F32(&logits), VOCAB, &counts, ids)
        };
        let (mut tokens, mut n) = (vec![-7; 3 * 4], vec![-7; 3]);
        s.verify(&b, &mut VerifyOutput::new(&mut tokens, &mut n))?;
        Ok(tokens)
    };
    for threads in [1, 4, 0] {
        for pool in [false, true] {
            for (what, q, ids) in [("a bad q row", &bad_q, &drafts), ("a bad draft id", &good_q, &bad_ids)] {
                let (refused, twin_sampler) = (twin(threads, pool), twin(threads, pool));
                verify(&refused, &good_q, &drafts).unwrap();
                verify(&twin_sampler, &good_q, &drafts).unwrap();
                assert!(verify(&refused, q, ids).is_err(), "{what}");
                let after = |s: &Sampler| {
                    let v: Vec<Vec<i32>> = (0..3).map(|_| verify(s, &good_q, &drafts).unwrap()).collect();
                    (v, good_draws(s, 2), s.pool().map_or(0, |p| p.stats().rows_borrowed))
                };
                assert_eq!(after(&refused), after(&twin_sampler), "{what}: threads {threads}, pool {pool}");
            }
        }
    }
}
