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
        for (j, (o, &v)) in out.iter_mut().zip(x).enumerate() {
            *o = if self.kept(start + j) { v } else { f32::NEG_INFINITY };
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
