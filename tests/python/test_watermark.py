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


def test_verified_text_is_the_sequential_watermarked_text(tokenrace):
    # Speculative decoding with watermark_verify_seeds and watermark_accept: the drafter proposes
    # 3 tokens (a scaled copy of the target, keyed by the same seeds), the target rows of a batch
    # of requests are drawn in one call; each request's text is its position-by-position
    # watermarked text, and is detected.
    rng = np.random.default_rng(41)
    table = toy(rng)
    drafter = 0.8 * table
    secret, k, length, n = 99, 3, 150, 3
    s = tokenrace.Sampler(table.shape[1], seed=1)
    prompts = [list(map(int, rng.integers(0, 500, 4))) for _ in range(6)]
    hist = [list(p) for p in prompts]
    accepted = 0
    while min(len(h) for h in hist) < 4 + length:
        drafts = []
        for h in hist:
            ctx, d = list(h), []
            for _ in range(n):
                seed = tokenrace.watermark_seeds(secret, k, [ctx])
                t = int(s.draw(drafter[ctx[-1] % 64][None, :], seeds=seed, offsets=0)[0])
                d.append(t)
                ctx.append(t)
            drafts.append(d)
        seeds = tokenrace.watermark_verify_seeds(secret, k, hist, drafts)
        rows = np.stack([table[p % 64] for h, d in zip(hist, drafts) for p in [h[-1], *d]])
        drawn = s.draw(rows, seeds=seeds, offsets=0)
        at = 0
        for h, d in zip(hist, drafts):
            emitted = tokenrace.watermark_accept(d, drawn[at:at + n + 1])
            at += n + 1
            accepted += len(emitted) - 1
            h.extend(int(t) for t in emitted)
    sequential = generate_from(tokenrace, table, secret, k, prompts, length)
    for h, want in zip(hist, sequential):
        assert h[4:4 + length] == want
        assert tokenrace.detect_watermark(secret, k, h[4:4 + length], prefix=h[:4]).p_value < 1e-6
    assert accepted > len(prompts) * length // 4, accepted


def generate_from(tokenrace, table, secret, k, prompts, length):
    s = tokenrace.Sampler(table.shape[1], seed=1)
    out = []
    for p in prompts:
        h = list(p)
        for _ in range(length):
            seed = tokenrace.watermark_seeds(secret, k, [h])
            h.append(int(s.draw(table[h[-1] % 64][None, :], seeds=seed, offsets=0)[0]))
        out.append(h[4:])
    return out


def test_bad_arguments_are_refused(tokenrace):
    with pytest.raises(ValueError, match=r"k: must be an integer"):
        tokenrace.watermark_seeds(1, -1, [[1]])
    with pytest.raises(ValueError, match=r"secrets: has 2 values, the call has 1 histories"):
        tokenrace.watermark_seeds([1, 2], 1, [[1]])
    with pytest.raises(tokenrace.InvalidArgumentError, match=r"tokens\[1\]: -3 is not a token id"):
        tokenrace.detect_watermark(1, 2, [4, -3])
