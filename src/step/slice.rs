//! The processed values of one slice of a row (a rank's slice of the vocabulary, in sharded
//! sampling): the step is built for the whole row, from the lists alone, and read for the slice's
//! global ids. A token's processed value depends only on its global id, its logit and the row's
//! lists, so these are, bit for bit, the values [`RowStep::materialize`] writes for those ids.

use super::RowStep;

impl RowStep<'_> {
    /// Writes into `out` the processed values of tokens `[start, start + x.len())` of the row,
    /// `x` their logits: the logit where the step keeps it, the touched token's value where the
    /// lists changed it (and it can still be drawn), else -inf, as the materialized row holds them.
    /// The step must not be deferred (built with `defer` off).
    pub fn write_slice(&self, x: &[f32], start: usize, out: &mut [f32]) {
        debug_assert!(!self.deferred && out.len() == x.len());
        let end = start + x.len();
        // The mask word by word (a kept word copied, a banned one filled: a slice of 76k tokens
        // tested token by token cost most of the step's time), the slice's edges inside words.
        let mut t = start;
        while t < end {
            let (w, lo) = (t / 32, t % 32);
            let n = (32 - lo).min(end - t);
            let all = if n == 32 { u32::MAX } else { (1u32 << n) - 1 };
            let bits = (self.keep[w] >> lo) & all;
            let (src, dst) = (&x[t - start..][..n], &mut out[t - start..][..n]);
            if bits == all {
                dst.copy_from_slice(src);
            } else if bits == 0 {
                dst.fill(f32::NEG_INFINITY);
            } else {
                for (j, (o, &v)) in dst.iter_mut().zip(src).enumerate() {
                    *o = if bits >> j & 1 != 0 { v } else { f32::NEG_INFINITY };
                }
            }
            t += n;
        }
        if self.touched == 0 {
            return;
        }
        for w in start / 32..end.div_ceil(32) {
            let mut bits = self.seen[w] | self.listed_bits[w];
            while bits != 0 {
                let t = w * 32 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                if t < start || t >= end {
                    continue;
                }
                let y = self.touched_value(x[t - start], t);
                // (A touched value of -inf or NaN is no override: the materialized row leaves
                // its token at -inf, the touched token's bit being clear in `keep`.)
                if y > f32::NEG_INFINITY {
                    out[t - start] = y;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::batch::{Batch, LogitBias, Logits, TokenBitmask, TokenLists};
    use crate::kernels::{best_level, kernels};
    use crate::noise::splitmix64;

    /// A small deterministic generator: `below(n)` in `[0, n)`.
    struct Gen(u64);
    impl Gen {
        fn below(&mut self, n: usize) -> usize {
            self.0 = splitmix64(self.0);
            (self.0 % n as u64) as usize
        }
    }

    #[test]
    fn every_slice_holds_the_materialized_rows_values_bit_for_bit() {
        // The rows' step (penalties raising and lowering, bias with -inf, banned ids, a bitmask)
        // read slice by slice at uneven cuts, slice edges inside and on the bitmask's words: the
        // same bits as the whole processed row. NaN and infinite logits among them.
        let k = kernels(best_level());
        let mut g = Gen(5);
        let vocab = 517;
        let x: Vec<f32> = (0..vocab)
            .map(|i| match i % 97 {
                3 => f32::NAN,
                5 => f32::INFINITY,
                _ => (g.below(2000) as f32 - 1000.0) / 100.0,
            })
            .collect();
        let history: Vec<i32> = (0..300).map(|_| g.below(60) as i32 * 8).collect();
        let (prompt, output) = history.split_at(120);
        let (prompt_offsets, output_offsets) = ([0u64, prompt.len() as u64], [0u64, output.len() as u64]);
        let bias_ids: Vec<i32> = (0..40).map(|_| g.below(vocab) as i32).collect();
        let bias_values: Vec<f32> = (0..40).map(|i| [2.5, -1.0, f32::NEG_INFINITY, 0.125][i % 4]).collect();
        let bias_offsets = [0u64, 40];
        let banned: Vec<i32> = (0..25).map(|_| g.below(vocab) as i32).collect();
        let banned_offsets = [0u64, 25];
        let words: Vec<i32> = (0..vocab.div_ceil(32)).map(|_| (g.below(1 << 31) as i32) | 0x0f0f_0f0f).collect();
        let batch = Batch {
            prompt_tokens: Some(TokenLists { ids: prompt, offsets: &prompt_offsets }),
            output_tokens: Some(TokenLists { ids: output, offsets: &output_offsets }),
            repetition_penalty: Some(&[1.4]),
            frequency_penalty: Some(&[0.3]),
            presence_penalty: Some(&[-0.6]),
            logit_bias: Some(LogitBias { ids: &bias_ids, values: &bias_values, offsets: &bias_offsets }),
            banned_tokens: Some(TokenLists { ids: &banned, offsets: &banned_offsets }),
            token_bitmask: Some(TokenBitmask { words: &words, row_stride: words.len() }),
            ..Batch::new(Logits::F32(&[]), 1, vocab)
        };
        let mut step = super::super::build(k, &batch, 0, false).unwrap().expect("the lists touch the row");
        let mut whole = Vec::new();
        step.materialize(k, &x[..], &mut whole, &mut []).unwrap();
        let step = super::super::build(k, &batch, 0, false).unwrap().unwrap();
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        for cuts in [vec![0, vocab], vec![0, 32, 33, 200, 256, vocab], vec![0, 1, 100, 101, 480, vocab - 1, vocab]] {
            for w in cuts.windows(2) {
                let mut out = vec![7.0f32; w[1] - w[0]];
                step.write_slice(&x[w[0]..w[1]], w[0], &mut out);
                assert_eq!(bits(&out), bits(&whole[w[0]..w[1]]), "slice {w:?}");
            }
        }
        // Power: a slice read at the wrong start (its ids taken as another slice's) differs.
        let mut shifted = vec![0f32; 100];
        step.write_slice(&x[100..200], 101, &mut shifted);
        assert_ne!(bits(&shifted), bits(&whole[100..200]));
    }
}
