"""Sampler.draw_full(kept_set=True, kept_bitmask=True): each row's kept set (threshold, count,
mass, xgrammar bitmask) against the float64 reference of the filters (docs/semantics.md, The kept
set), every seeded token inside its row's set, and refusals that write nothing."""

import numpy as np
import pytest

from reference import kept_set, weights


def unpack(words, vocab):
    """The kept tokens of one row's bitmask words (bit i of word j: token 32 j + i)."""
    bits = np.unpackbits(words.view(np.uint8), bitorder="little")
    return bits[:vocab].astype(bool), bits[vocab:]


def test_kept_sets_match_the_float64_reference(tokenrace, rng):
    rows, vocab = 48, 777
    x = (rng.standard_normal((rows, vocab)) * 2.5).astype(np.float32)
    x[rng.random((rows, vocab)) < 0.05] = -np.inf
    temps = np.resize(np.array([1.0, 0.7, 1.5, 0.0], np.float32), rows)
    top_k = np.resize(np.array([0, 40, 5, 0, 300, 0], np.int32), rows)
    top_p = np.resize(np.array([0.9, 1.0, 0.95, 1.0, 0.6], np.float32), rows)
    min_p = np.resize(np.array([0.0, 0.02, 0.0], np.float32), rows)
    s = tokenrace.Sampler(vocab, max_rows=rows, seed=4)
    r = s.draw_full(x, temperature=temps, top_k=top_k, top_p=top_p, min_p=min_p, seeds=np.arange(rows, dtype=np.uint64),
                    kept_set=True, kept_bitmask=True)
    assert r.kept_threshold.dtype == np.float32 and r.kept_count.dtype == np.int32
    assert r.kept_mass.dtype == np.float64 and r.kept_bitmask.dtype == np.int32
    assert r.kept_bitmask.shape == (rows, (vocab + 31) // 32)
    checked = 0
    for i in range(rows):
        greedy = temps[i] == 0
        if greedy:
            want, gap = np.isfinite(x[i]), np.inf
        else:
            want, gap = kept_set(x[i], temps[i], top_k[i], top_p[i], min_p[i])
        got, tail = unpack(r.kept_bitmask[i], vocab)
        assert not tail.any()
        assert got[r.tokens[i]], f"row {i}: the token is outside its set"
        assert r.kept_count[i] == got.sum()
        assert r.kept_threshold[i] == x[i][got].min()
        if gap < 1e-9:
            continue
        np.testing.assert_array_equal(got, want, err_msg=f"row {i}")
        w = weights(x[i], 1.0 if greedy else temps[i])
        assert abs(r.kept_mass[i] - w[want].sum() / w.sum()) <= 1e-5 * r.kept_mass[i]
        checked += 1
    assert checked > rows * 3 // 4
    # The comparison tells a wrong rule apart: the unfiltered set differs on the filtered rows.
    assert sum(unpack(r.kept_bitmask[i], vocab)[0].sum() < np.isfinite(x[i]).sum() for i in range(rows)) > rows // 2


def test_each_output_alone_and_torch(tokenrace):
    x = np.array([[1.0, -np.inf, 3.0, np.nan, 2.5, -1.0]], np.float32)
    s = tokenrace.Sampler(6, max_rows=1)
    r = s.draw_full(x, temperature=0.0, banned_tokens=[[4]], kept_bitmask=True)
    assert r.kept_threshold is None and r.kept_count is None and r.kept_mass is None
    np.testing.assert_array_equal(r.kept_bitmask, [[0b100101]])
    r = s.draw_full(x, temperature=0.0, banned_tokens=[[4]], kept_set=True)
    assert r.kept_bitmask is None
    assert (r.kept_threshold[0], r.kept_count[0], r.kept_mass[0]) == (-1.0, 3, 1.0)
    r = s.draw_full(x, temperature=0.0)  # a call without them leaves none packed
    assert r.kept_count is None
    torch = pytest.importorskip("torch")
    r = s.draw_full(torch.from_numpy(x), top_k=2, kept_set=True, kept_bitmask=True)
    assert isinstance(r.kept_mass, torch.Tensor) and r.kept_mass.dtype == torch.float64
    assert r.kept_count.tolist() == [2] and r.kept_bitmask.tolist() == [[0b10100]]


def test_refusals_write_nothing(tokenrace):
    x = np.zeros((2, 40), np.float32)
    s = tokenrace.Sampler(40, max_rows=2)
    with pytest.raises(tokenrace.InvalidArgumentError, match=r"kept_threshold\[1\].*typical_p"):
        s.draw_full(x, typical_p=[1.0, 0.5], kept_set=True)
    with pytest.raises(TypeError, match="kept_bitmask"):
        s.draw_full(x, kept_bitmask=1)
