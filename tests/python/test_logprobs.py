"""Sampler.draw_full: logprobs (raw and processed), ranks and top-n against float64 references
(docs/semantics.md, Logprobs)."""

import numpy as np
import pytest

from reference import log_softmax64


def test_raw_logprobs_match_float64_log_softmax(tokenrace, rng):
    rows, vocab, n = 32, 1000, 8
    x = (rng.standard_normal((rows, vocab)) * 3).astype(np.float32)
    x[rng.random((rows, vocab)) < 0.05] = -np.inf
    x[rng.random((rows, vocab)) < 0.01] = np.nan
    temps = np.tile(np.array([0.0, 0.5, 1.0, 2.0], np.float32), rows // 4)
    s = tokenrace.Sampler(vocab, max_rows=rows)
    r = s.draw_full(x, temperature=temps, top_k=50, logprobs=n, ranks=True)  # raw: filters do not matter
    assert r.tokens.dtype == np.int32 and r.flags.dtype == np.uint32
    assert r.logprobs.dtype == np.float32 and r.ranks.dtype == np.int32
    assert r.topn_ids.shape == r.topn_logprobs.shape == (rows, n)
    assert r.topn_ids.dtype == np.int32 and r.topn_logprobs.dtype == np.float32
    for i in range(rows):
        ref = log_softmax64(x[i])  # NaN and -inf: -inf
        tok = r.tokens[i]
        assert np.isfinite(x[i, tok])
        assert abs(r.logprobs[i] - ref[tok]) <= 1e-5
        assert r.ranks[i] == (ref >= ref[tok]).sum()  # distinct values: no tie within rounding
        order = np.lexsort((np.arange(vocab), -ref))[:n]
        np.testing.assert_array_equal(r.topn_ids[i], order)
        np.testing.assert_allclose(r.topn_logprobs[i], ref[order], rtol=0, atol=1e-5)
    greedy = temps == 0
    np.testing.assert_array_equal(r.tokens[greedy], np.nanargmax(np.where(np.isnan(x), -np.inf, x), 1)[greedy])
    assert (r.ranks[greedy] == 1).all()


def test_ranks_count_the_reported_logprobs(tokenrace, rng):
    rows, vocab = 64, 50
    x = (rng.integers(0, 6, (rows, vocab)) * 0.5).astype(np.float32)  # many ties
    x[rng.random((rows, vocab)) < 0.1] = -np.inf
    s = tokenrace.Sampler(vocab, max_rows=rows)
    for mode in ("raw", "processed"):
        r = s.draw_full(x, temperature=0.7, top_p=0.9, logprobs=vocab, ranks=True, logprob_mode=mode)
        for i in range(rows):
            lp = np.full(vocab, np.nan, np.float32)
            lp[r.topn_ids[i]] = r.topn_logprobs[i]
            assert not np.isnan(lp).any(), "top-n over the whole vocabulary is a permutation"
            assert lp[r.tokens[i]] == r.logprobs[i]
            assert r.ranks[i] == (lp >= r.logprobs[i]).sum()


def test_top_n_is_descending_with_the_lowest_id_first_on_ties(tokenrace):
    x = np.array([[1, 3, 3, 0, 3, -np.inf, 2, np.nan],
                  [0, 0, 0, 0, 0, 0, 0, 0],
                  [-np.inf, 5, -np.inf, 4, 4, 4, np.nan, 1]], np.float32)
    s = tokenrace.Sampler(8)
    r = s.draw_full(x, temperature=0.0, logprobs=8, ranks=True)
    np.testing.assert_array_equal(r.topn_ids, [[1, 2, 4, 6, 0, 3, 5, 7],
                                               [0, 1, 2, 3, 4, 5, 6, 7],
                                               [1, 3, 4, 5, 7, 0, 2, 6]])
    for i in range(3):
        np.testing.assert_allclose(r.topn_logprobs[i], log_softmax64(x[i])[r.topn_ids[i]], atol=1e-6)
    assert np.isneginf(r.topn_logprobs[0, -2:]).all()
    np.testing.assert_array_equal(r.tokens, [1, 0, 1])
    np.testing.assert_array_equal(r.ranks, [3, 8, 1])
    r3 = s.draw_full(x, temperature=0.0, logprobs=3)
    np.testing.assert_array_equal(r3.topn_ids, r.topn_ids[:, :3])


@pytest.mark.parametrize("mode", ["raw", "processed"])
def test_posinf_empty_and_nan_rows(tokenrace, mode):
    F = tokenrace
    x = np.array([[np.inf, 0, np.inf, 1],
                  [np.inf, 0, 2, 1],
                  [-np.inf, -np.inf, -np.inf, -np.inf],
                  [np.nan, -np.inf, np.nan, -np.inf],
                  [np.nan, 1.0, -np.inf, 1.0]], np.float32)
    s = F.Sampler(4)
    r = s.draw_full(x, temperature=1.0, logprobs=2, ranks=True, logprob_mode=mode)
    np.testing.assert_array_equal(r.tokens, [0, 0, 0, 0, r.tokens[4]])
    assert r.tokens[4] in (1, 3)
    assert r.flags[0] & F.FLAG_HAS_POSINF and r.flags[2] & F.FLAG_EMPTY and r.flags[3] & F.FLAG_EMPTY
    assert r.flags[3] & F.FLAG_HAS_NAN and r.flags[4] & F.FLAG_HAS_NAN
    np.testing.assert_allclose(r.logprobs[:2], [-np.log(2), 0.0], atol=1e-6)
    assert np.isneginf(r.logprobs[2:4]).all()
    np.testing.assert_allclose(r.logprobs[4], -np.log(2), atol=1e-6)
    np.testing.assert_array_equal(r.ranks, [2, 1, 4, 4, 2])
    np.testing.assert_array_equal(r.topn_ids[:3], [[0, 2], [0, 1], [0, 1]])
    np.testing.assert_allclose(r.topn_logprobs[0], [-np.log(2)] * 2, atol=1e-6)
    assert np.isneginf(r.topn_logprobs[1, 1]) and np.isneginf(r.topn_logprobs[2]).all()


def test_draw_full_draws_what_draw_draws(tokenrace, rng):
    rows, vocab = 40, 200
    x = (rng.standard_normal((rows, vocab)) * 2).astype(np.float32)
    kw = dict(temperature=np.linspace(0, 2, rows), seeds=np.arange(rows, dtype=np.uint64), offsets=9,
              top_k=20, top_p=0.95, min_p=0.01)
    s = tokenrace.Sampler(vocab, max_rows=rows)
    tokens, flags = s.draw(x, return_flags=True, **kw)
    for mode in ("raw", "processed"):
        r = s.draw_full(x, logprob_mode=mode, ranks=True, **kw)
        np.testing.assert_array_equal(r.tokens, tokens)
        np.testing.assert_array_equal(r.flags, flags)
        assert r.topn_ids is None and r.topn_logprobs is None
        assert np.isfinite(r.logprobs).all() and (r.ranks >= 1).all()
    e = rng.exponential(size=(rows, vocab)).astype(np.float32)
    np.testing.assert_array_equal(s.draw_full(x, temperature=0.8, noise=e).tokens,
                                  s.draw(x, temperature=0.8, noise=e))


def test_draw_full_arguments(tokenrace):
    s = tokenrace.Sampler(0)
    x = np.zeros((3, 5), np.float32)
    r = s.draw_full(np.zeros((0, 5), np.float32), logprobs=2, ranks=True)
    assert r.tokens.shape == (0,) and r.topn_ids.shape == (0, 2) and r.ranks.shape == (0,)
    assert s.draw_full(x, logprobs=5).topn_ids.shape == (3, 5)
    assert s.draw_full(x).ranks is None  # ranks only when asked
    with pytest.raises(TypeError, match="ranks"):
        s.draw_full(x, ranks=1)
    with pytest.raises(ValueError, match="top_n: 6 exceeds vocab 5"):
        s.draw_full(x, logprobs=6)
    with pytest.raises(ValueError, match="logprobs"):
        s.draw_full(x, logprobs=-1)
    with pytest.raises(TypeError, match="logprobs"):
        s.draw_full(x, logprobs=True)
    with pytest.raises(TypeError, match="logprobs"):
        s.draw_full(x, logprobs=2.0)
    with pytest.raises(ValueError, match="logprob_mode"):
        s.draw_full(x, logprob_mode="cooked")
    assert s.draw_full(x, logprob_mode="PROCESSED").tokens.shape == (3,)
    assert isinstance(s.draw_full(x), tokenrace.DrawResult)
