"""Keyed-noise watermarking through the binding (the statistics are tests/watermark.rs): the seeds
of ``watermark_seeds`` make ``Sampler.draw`` watermark its rows; 200-token texts of a toy model
drawn with them are detected at p < 1e-6 by ``detect_watermark``; the same texts checked with
another secret, and texts sampled without the watermark, are not; repeated (context, token)
pairs are scored once; bad arguments are refused naming them."""

import numpy as np
import pytest


def toy(rng, vocab=500, rows=64):
    x = (2 * rng.standard_normal((rows, vocab))).astype(np.float32)
    for r in range(rows):
        x[r, rng.integers(0, vocab, 4)] = 4 + 8 * r / rows
    return x


def generate(tokenrace, table, secret, k, texts, length, rng):
    s = tokenrace.Sampler(table.shape[1], seed=1)
    hist = [list(rng.integers(0, table.shape[1], 4)) for _ in range(texts)]
    for _ in range(length):
        seeds = tokenrace.watermark_seeds(secret, k, hist)
        logits = np.stack([table[h[-1] % table.shape[0]] for h in hist])
        for h, t in zip(hist, s.draw(logits, seeds=seeds, offsets=0)):
            h.append(int(t))
    return [(h[:4], h[4:]) for h in hist]


def test_watermarked_texts_are_detected(tokenrace):
    rng = np.random.default_rng(40)
    table = toy(rng)
    texts = generate(tokenrace, table, 1234, 3, 10, 200, rng)
    for prompt, text in texts:
        d = tokenrace.detect_watermark(1234, 3, text, prefix=prompt)
        assert d.p_value < 1e-6 and 0 < d.scored <= 200, d
        assert tokenrace.detect_watermark(1235, 3, text, prefix=prompt).p_value > 1e-6
    # Texts sampled by numpy from the same rows, without the watermark.
    low = 0
    for _ in range(200):
        prev, text = int(rng.integers(0, 500)), []
        for _ in range(200):
            x = table[prev % table.shape[0]].astype(np.float64)
            p = np.exp(x - x.max())
            prev = int(rng.choice(500, p=p / p.sum()))
            text.append(prev)
        low += tokenrace.detect_watermark(1234, 3, text).p_value < 0.05
    assert low <= 10 + 5 * np.sqrt(200 * 0.05 * 0.95), low


def test_seeds_match_the_context_rule(tokenrace):
    # The context is the last k tokens: histories that share them share the seed.
    a = tokenrace.watermark_seeds(7, 2, [[1, 2, 3], [9, 2, 3], [2, 3], [3]])
    assert a[0] == a[1] == a[2] != a[3]
    assert tokenrace.watermark_seeds([7, 8], 2, [[2, 3], [2, 3]]).tolist()[0] != \
        tokenrace.watermark_seeds([7, 8], 2, [[2, 3], [2, 3]]).tolist()[1]
    d = tokenrace.detect_watermark(9, 1, [5, 5, 5, 5])
    assert d.scored == 2


def test_bad_arguments_are_refused(tokenrace):
    with pytest.raises(ValueError, match=r"k: must be an integer"):
        tokenrace.watermark_seeds(1, -1, [[1]])
    with pytest.raises(ValueError, match=r"secrets: has 2 values, the call has 1 histories"):
        tokenrace.watermark_seeds([1, 2], 1, [[1]])
    with pytest.raises(tokenrace.InvalidArgumentError, match=r"tokens\[1\]: -3 is not a token id"):
        tokenrace.detect_watermark(1, 2, [4, -3])
