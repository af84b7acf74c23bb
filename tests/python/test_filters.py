"""top_k / top_p / min_p against a float64 reference of docs/semantics.md (Filters): the kept sets
(exactly, through the processed logprobs, and by sampling), the frequencies, bad values."""

import numpy as np
import pytest

from reference import chi_square, draw_cases, kept_set, log_softmax64, wilson_hilferty

P4 = np.array([0.1, 0.2, 0.3, 0.4])
X4 = np.log(P4).astype(np.float32)


def kept_by_logprobs(s, x, **kw):
    """The exact kept sets: the tokens whose processed logprob is finite."""
    r = s.draw_full(x, logprobs=x.shape[-1], logprob_mode="processed", **kw)
    rows = r.topn_ids.shape[0]
    kept = np.zeros((rows, x.shape[-1]), bool)
    for i in range(rows):
        kept[i, r.topn_ids[i][np.isfinite(r.topn_logprobs[i])]] = True
    return kept


# The cases of llama.cpp's test-sampling.cpp on probabilities {0.1, 0.2, 0.3, 0.4}.
LLAMA_CASES = [
    ({"top_k": 1}, [3]),
    ({"top_k": 3}, [1, 2, 3]),
    ({"top_k": 4}, [0, 1, 2, 3]),
    ({"top_k": 0}, [0, 1, 2, 3]),
    ({"top_p": 0.0001}, [3]),
    ({"top_p": 0.7}, [2, 3]),
    ({"top_p": 0.8}, [1, 2, 3]),
    ({"top_p": 1.0}, [0, 1, 2, 3]),
    ({"min_p": 0.26}, [1, 2, 3]),
    ({"min_p": 0.51}, [2, 3]),
    ({"min_p": 0.76}, [3]),
    ({"min_p": 1.0}, [3]),
    ({"min_p": 0.0}, [0, 1, 2, 3]),
    ({"top_k": 3, "top_p": 0.6}, [2, 3]),
    ({"min_p": 0.26, "top_p": 0.5}, [2, 3]),
]


@pytest.mark.parametrize("kw,ids", LLAMA_CASES, ids=[str(c[0]) for c in LLAMA_CASES])
def test_llama_cpp_cases(tokenrace, kw, ids):
    want = np.zeros(4, bool)
    want[ids] = True
    ref, _ = kept_set(X4, 1.0, kw.get("top_k", 0), kw.get("top_p", 1.0), kw.get("min_p", 0.0))
    np.testing.assert_array_equal(ref, want, err_msg="the float64 reference disagrees with llama.cpp")

    rows, calls = 8192, (150 if len(ids) == 2 else 50)  # two kept tokens: less power per draw
    s = tokenrace.Sampler(4, max_rows=rows)
    np.testing.assert_array_equal(kept_by_logprobs(s, X4[None, :], **kw)[0], want)
    x = np.tile(X4, (rows, 1))
    counts = np.zeros(4, np.int64)
    for _ in range(calls):
        counts += np.bincount(s.draw(x, **kw), minlength=4)
    assert counts[~want].sum() == 0, f"drew a filtered-out token: {counts}"
    if len(ids) > 1:
        p = P4[want] / P4[want].sum()
        critical = wilson_hilferty(len(ids) - 1, 5.0)
        stat = chi_square(counts[want], p)
        assert stat < critical, f"chi-square {stat:.1f} >= {critical:.1f}: {counts} vs {p}"
        # Power: the same counts reject the unfiltered probabilities of the kept tokens raised
        # to 1/1.1 (a 10% hotter temperature).
        q = P4[want] ** (1 / 1.1)
        wrong = chi_square(counts[want], q / q.sum())
        assert wrong > critical, f"the test cannot tell T from 1.1 T ({wrong:.1f})"


def random_rows(rng, rows, vocab):
    """Logits with many ties, masked tokens and NaN, and per-row filter settings."""
    x = (rng.integers(0, 25, (rows, vocab)) * 0.25).astype(np.float32)
    x[rng.random((rows, vocab)) < 0.1] = -np.inf
    x[rng.random((rows, vocab)) < 0.02] = np.nan
    x[:, 0] = 3.0  # at least one finite logit per row
    t = rng.uniform(0.3, 2.0, rows).astype(np.float32)
    k = rng.choice([0, -1, 1, 2, 3, 5, 10, vocab, vocab + 7], rows).astype(np.int32)
    p = np.where(rng.random(rows) < 0.3, 1.0, rng.uniform(0.05, 0.99, rows)).astype(np.float32)
    mp = np.where(rng.random(rows) < 0.3, 0.0, rng.uniform(0.001, 0.6, rows)).astype(np.float32)
    return x, t, k, p, mp


def test_kept_sets_match_the_float64_reference(tokenrace):
    """The kept sets of the rows of tests/fixtures/draw_cases.json (ties, masked tokens, NaN, every
    filter setting) are the Rust float64 reference's (tests/reference.rs); rows it leaves
    undecided (not a sampling row, or top-p's cumulative mass within rounding of top_p) are
    skipped."""
    checked = 0
    for g in draw_cases():
        rows, vocab = g["x"].shape
        s = tokenrace.Sampler(vocab, max_rows=rows)
        got = kept_by_logprobs(s, g["x"].astype(g["dtype"]), temperature=g["temperature"], top_k=g["top_k"],
                               top_p=g["top_p"], min_p=g["min_p"])
        for i, ids in enumerate(g["kept"]):
            if ids is None:
                continue
            want = np.zeros(vocab, bool)
            want[ids] = True
            np.testing.assert_array_equal(got[i], want, err_msg=f"{g['dtype']} row {i}: t={g['temperature'][i]} "
                                                                f"k={g['top_k'][i]} p={g['top_p'][i]} min_p={g['min_p'][i]}")
            checked += 1
    assert checked > 80


def test_sampled_tokens_never_leave_the_kept_set(tokenrace, rng):
    distinct, copies, calls, vocab = 32, 256, 4, 40
    x, t, k, p, mp = random_rows(rng, distinct, vocab)
    kept = np.array([kept_set(x[i], t[i], k[i], p[i], mp[i])[0] for i in range(distinct)])
    rows = distinct * copies
    s = tokenrace.Sampler(vocab, max_rows=rows)
    rep = lambda a: np.repeat(a, copies, axis=0)  # noqa: E731
    seen = np.zeros((distinct, vocab), bool)
    for _ in range(calls):
        tokens = s.draw(rep(x), temperature=rep(t), top_k=rep(k), top_p=rep(p), min_p=rep(mp))
        seen[np.repeat(np.arange(distinct), copies), tokens] = True
    outside = seen & ~kept
    assert not outside.any(), f"rows {np.flatnonzero(outside.any(1))} drew filtered-out tokens"
    assert seen.sum() > 0.8 * kept.sum()


def test_a_filtered_seeded_row_runs_the_same_race(tokenrace, rng):
    """The filters keep {x >= θ} and the race is the same (the same noise per token): a seeded
    row's token is unchanged when the unfiltered token is kept, and kept otherwise."""
    rows, vocab = 300, 64
    x, t, k, p, mp = random_rows(rng, rows, vocab)
    s = tokenrace.Sampler(vocab, max_rows=rows)
    seeds = np.arange(rows, dtype=np.uint64) * 1_000_003 + 17
    free = s.draw(x, temperature=t, seeds=seeds)
    filt = s.draw(x, temperature=t, seeds=seeds, top_k=k, top_p=p, min_p=mp)
    kept = kept_by_logprobs(s, x, temperature=t, top_k=k, top_p=p, min_p=mp)
    idx = np.arange(rows)
    assert kept[idx, filt].all()
    same = kept[idx, free]
    np.testing.assert_array_equal(filt[same], free[same])
    assert (~same).sum() > 10 and same.sum() > 10  # both cases occur


@pytest.mark.parametrize("kw", [{"top_k": 0}, {"top_k": -3}, {"top_k": 50}, {"top_k": 1000},
                                {"top_p": 1.0}, {"min_p": 0.0},
                                {"top_k": 0, "top_p": 1.0, "min_p": 0.0}])
def test_off_values_change_nothing(tokenrace, rng, kw):
    rows, vocab = 64, 50
    x = (rng.standard_normal((rows, vocab)) * 2).astype(np.float32)
    s = tokenrace.Sampler(vocab, max_rows=rows)
    seeds = np.arange(rows, dtype=np.uint64)
    temps = np.where(np.arange(rows) % 4 == 0, 0.0, 1.3)
    np.testing.assert_array_equal(s.draw(x, temperature=temps, seeds=seeds, **kw),
                                  s.draw(x, temperature=temps, seeds=seeds))


def test_per_row_and_scalar_settings_agree(tokenrace, rng):
    rows, vocab = 20, 30
    x = (rng.standard_normal((rows, vocab)) * 2).astype(np.float32)
    s = tokenrace.Sampler(vocab, max_rows=rows)
    seeds = np.arange(rows, dtype=np.uint64) + 5
    a = s.draw(x, seeds=seeds, top_k=4, top_p=0.8, min_p=0.05)
    b = s.draw(x, seeds=seeds, top_k=np.full(rows, 4, np.int64), top_p=[0.8] * rows,
               min_p=np.full(rows, 0.05, np.float64))
    np.testing.assert_array_equal(a, b)
    assert (s.draw(x, temperature=1.0, top_k=1) == x.argmax(1)).all()


X = np.zeros((4, 10), np.float32)


@pytest.mark.parametrize("kw,where", [
    ({"top_p": 0}, r"top_p\[0\]: 0 is not in \(0, 1\]"),
    ({"top_p": 1.5}, r"top_p\[0\]"),
    ({"top_p": -0.5}, r"top_p\[0\]"),
    ({"top_p": np.nan}, r"top_p\[0\]: NaN"),
    ({"top_p": [1.0, 0.5, 0.9, 0.0]}, r"top_p\[3\]"),
    ({"top_p": [1.0, np.nan, 0.9, 1.0]}, r"top_p\[1\]"),
    ({"min_p": -0.1}, r"min_p\[0\]: -0.1 is not in \[0, 1\]"),
    ({"min_p": 1.5}, r"min_p\[0\]"),
    ({"min_p": np.nan}, r"min_p\[0\]"),
    ({"min_p": [0.0, 0.0, -1e-9, 0.0]}, r"min_p\[2\]"),
])
def test_bad_values_name_the_row(tokenrace, kw, where):
    s = tokenrace.Sampler(10)
    for temps in (1.0, 0.0):  # every row is checked, greedy or not
        with pytest.raises(ValueError, match=where) as e:
            s.draw(X, temperature=temps, **kw)
        assert isinstance(e.value, tokenrace.InvalidArgumentError)
        with pytest.raises(ValueError, match=where):
            s.draw_full(X, temperature=temps, logprobs=2, **kw)
    st = s.stats()
    assert st["calls"] == 0 and st["rejected_calls"] == 4


def test_bad_types_and_shapes(tokenrace):
    s = tokenrace.Sampler(10)
    with pytest.raises(ValueError, match="top_k"):
        s.draw(X, top_k=2.5)
    with pytest.raises(ValueError, match="top_k"):
        s.draw(X, top_k=[1.0, 2.0, 3.0, 4.0])
    with pytest.raises(ValueError, match="top_k"):
        s.draw(X, top_k=True)
    with pytest.raises(ValueError, match=r"top_k\[1\].*int32"):
        s.draw(X, top_k=[1, 2**31, 1, 1])
    with pytest.raises(ValueError, match=r"top_k\[0\].*int32"):
        s.draw(X, top_k=np.array([2**40, 1, 1, 1], np.int64))
    with pytest.raises(ValueError, match="top_k.*3 elements"):
        s.draw(X, top_k=[1, 2, 3])
    with pytest.raises(ValueError, match="top_p.*5 elements"):
        s.draw(X, top_p=[0.5] * 5)
    with pytest.raises(ValueError, match="min_p"):
        s.draw(X, min_p=np.ones((4, 1)))
    with pytest.raises(ValueError, match="min_p"):
        s.draw(X, min_p=["a"] * 4)
    assert s.draw(X, top_k=np.array([1, 2, 3, 4], np.uint8)).shape == (4,)
    assert s.draw(X, top_k=-(2**31)).shape == (4,)


def test_processed_logprobs_after_temperature_and_filters(tokenrace, rng):
    rows, vocab = 100, 40
    x, t, k, p, mp = random_rows(rng, rows, vocab)
    t[::10] = 0.0  # greedy rows report the raw values
    s = tokenrace.Sampler(vocab, max_rows=rows)
    r = s.draw_full(x, temperature=t, top_k=k, top_p=p, min_p=mp, logprobs=vocab, ranks=True,
                    logprob_mode="processed")
    for i in range(rows):
        if t[i] == 0.0:
            ref = log_softmax64(x[i])
        else:
            kept, gap = kept_set(x[i], t[i], k[i], p[i], mp[i])
            if gap < 1e-9:
                continue
            ref = log_softmax64(x[i], t[i], kept)
        full = np.full(vocab, -np.inf, np.float32)
        full[r.topn_ids[i]] = r.topn_logprobs[i]
        np.testing.assert_allclose(full, ref, rtol=1e-6, atol=1e-5, err_msg=f"row {i}")
        np.testing.assert_allclose(r.logprobs[i], ref[r.tokens[i]], rtol=1e-6, atol=1e-5)
        assert r.ranks[i] == (full >= r.logprobs[i]).sum()


# ---- top-nσ (llama.cpp's top_n_sigma) ----

def sigma_threshold(x, n, spread=np.sqrt):
    """max - n * sigma over the finite logits, sigma the population standard deviation."""
    v = x[np.isfinite(x)].astype(np.float64)
    return v.max() - n * spread(((v - v.mean()) ** 2).mean())


def test_top_n_sigma_keeps_the_reference_set(tokenrace, rng):
    rows, vocab = 16, 300
    x = (rng.standard_normal((rows, vocab)) * 2).astype(np.float32)
    x[:, ::7] = -np.inf  # masked tokens stay out of the mean and sigma
    s = tokenrace.Sampler(vocab, max_rows=rows)
    for n in (0.5, 1.0, 2.5):
        for t in (0.7, 1.0, 1.6):  # the same set at every temperature: it is in logit units
            kept = kept_by_logprobs(s, x, temperature=t, top_n_sigma=n)
            for i in range(rows):
                np.testing.assert_array_equal(kept[i], x[i] >= sigma_threshold(x[i], n), f"row {i} n {n}")
    # Per row, with the other filters: the intersection, top-p over what top-nσ left.
    ns = np.array([1.0, -1.0, 0.0, 2.0] * 4, np.float32)
    kept = kept_by_logprobs(s, x, top_n_sigma=ns, top_k=np.full(rows, 5))
    for i in range(rows):
        want = np.isfinite(x[i]) if ns[i] <= 0 else x[i] >= sigma_threshold(x[i], ns[i])
        fifth = np.sort(x[i][want])[::-1][min(4, want.sum() - 1)]
        np.testing.assert_array_equal(kept[i], want & (x[i] >= fifth), f"row {i}")


def test_top_n_sigma_frequencies_and_a_wrong_sigma_rejected(tokenrace, rng):
    vocab, rows = 40, 4000
    x = (rng.standard_normal(vocab) * 2).astype(np.float32)
    right = x >= sigma_threshold(x, 1.0)
    wrong = x >= sigma_threshold(x, 1.0, spread=lambda v: v)  # the variance as sigma
    assert (right != wrong).any() and (wrong | ~right).all()
    s = tokenrace.Sampler(vocab, max_rows=rows, seed=3)
    counts = np.zeros(vocab, np.int64)
    for _ in range(10):
        counts += np.bincount(s.draw(np.tile(x, (rows, 1)), temperature=0.8, top_n_sigma=1.0), minlength=vocab)

    def probs(kept):
        inv_t = np.float64(np.float32(1 / 0.8))
        w = np.where(kept, np.exp((x.astype(np.float64) - x.max()) * inv_t), 0.0)
        return w / w.sum()

    def statistic(p):
        """Chi-square over the cells of nonzero probability, those expecting under 5 pooled."""
        assert counts[p == 0].sum() == 0, "a token of probability 0 was drawn"
        e, c = p * counts.sum(), counts.astype(np.float64)
        big = e >= 5
        stat = ((c[big] - e[big]) ** 2 / e[big]).sum()
        small = (~big) & (p > 0)
        cells = big.sum() + (1 if small.any() else 0)
        if small.any():
            stat += (c[small].sum() - e[small].sum()) ** 2 / e[small].sum()
        return stat, max(cells - 1, 1)

    stat, dof = statistic(probs(right))
    assert stat < wilson_hilferty(dof, 5.0), (stat, dof)
    stat, dof = statistic(probs(wrong))
    assert stat > wilson_hilferty(dof, 5.0), ("the wrong sigma was not rejected", stat, dof)


@pytest.mark.parametrize("kw,where", [
    ({"top_n_sigma": np.nan}, r"top_n_sigma\[0\]: NaN is not a finite number"),
    ({"top_n_sigma": np.inf}, r"top_n_sigma\[0\]"),
    ({"top_n_sigma": [1.0, 1.0, -np.inf, 1.0]}, r"top_n_sigma\[2\]"),
])
def test_bad_top_n_sigma_names_the_row(tokenrace, kw, where):
    s = tokenrace.Sampler(10)
    with pytest.raises(ValueError, match=where):
        s.draw(X, **kw)
    with pytest.raises(ValueError, match=where):
        s.draw_full(X, logprobs=2, **kw)
    assert s.stats()["calls"] == 0


def test_top_n_sigma_off_and_left_out_of_the_next_call(tokenrace, rng):
    rows, vocab = 32, 50
    x = (rng.standard_normal((rows, vocab)) * 2).astype(np.float32)
    s = tokenrace.Sampler(vocab, max_rows=rows)
    seeds = np.arange(rows, dtype=np.uint64)
    plain = s.draw(x, seeds=seeds)
    np.testing.assert_array_equal(s.draw(x, seeds=seeds, top_n_sigma=-1.0), plain)  # <= 0 is off
    assert not (s.draw(x, seeds=seeds, top_n_sigma=0.1) == plain).all()
    # The thread's cached batch forgets the pointer: the next call without it draws as before.
    np.testing.assert_array_equal(s.draw(x, seeds=seeds), plain)
