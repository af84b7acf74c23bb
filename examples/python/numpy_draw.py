#!/usr/bin/env python3
"""Sampling next tokens from numpy logits with tokenrace.

Run it from anywhere once ``tokenrace`` is importable (installed, or ``bindings/python`` on
PYTHONPATH) and can find its native library (beside the package, in the crate's target/, or in
TOKENRACE_LIBRARY):

    PYTHONPATH=bindings/python python3 examples/python/numpy_draw.py
"""
import numpy as np

import tokenrace

VOCAB, ROWS = 1000, 4


def main():
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((ROWS, VOCAB)) * 3).astype(np.float32)  # read in place, never copied
    sampler = tokenrace.Sampler(VOCAB, max_rows=64, seed=1)
    print(f"tokenrace {tokenrace.version()}, SIMD level {sampler.simd_level}")

    # One temperature per row; T = 0 is greedy (the argmax, lowest index on ties).
    temperature = np.array([0.0, 0.7, 1.0, 0.0], np.float32)
    tokens = sampler.draw(logits, temperature=temperature)
    greedy_ok = tokens[0] == logits[0].argmax() and tokens[3] == logits[3].argmax()
    print("tokens:", tokens.tolist())
    print("greedy rows are the argmax:", bool(greedy_ok))

    # Seeded rows: a pure function of (seed, offset), whatever else is in the batch.
    seeds, positions = np.array([11, 12, 13, 14], np.uint64), np.full(ROWS, 5, np.uint64)
    first = sampler.draw(logits, temperature=0.8, seeds=seeds, offsets=positions)
    alone = sampler.draw(logits[2:3], temperature=0.8, seeds=13, offsets=5)
    print("seeded row 2 is the same alone as in the batch:", bool(first[2] == alone[0]))

    # Filters, in vLLM's order after temperature: min-p, then top-k, then top-p.
    filtered = sampler.draw(logits, temperature=1.0, top_k=50, top_p=0.9, min_p=0.01)
    top50 = np.argsort(-logits, axis=1)[:, :50]
    print("filtered tokens are among each row's top 50:",
          all(t in row for t, row in zip(filtered.tolist(), top50.tolist())))

    # Logprobs of the sampled tokens and the top 3 (raw: log_softmax of the logits as given).
    result = sampler.draw_full(logits, temperature=temperature, logprobs=3)
    shifted = logits.astype(np.float64) - logits.max(axis=1, keepdims=True)
    reference = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    sampled = reference[np.arange(ROWS), result.tokens]
    print("sampled logprobs match float64 log_softmax:", bool(np.allclose(result.logprobs, sampled, atol=1e-5)))
    print("top-3 ids per row:", result.topn_ids.tolist())


if __name__ == "__main__":
    main()
