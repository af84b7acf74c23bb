"""llama.cpp's min_keep, locally typical sampling and XTC through the binding: llama.cpp's tables
(tests/test-sampling.cpp), a float64 reference of its rules, frequencies with a power check,
seeded identity, bad values, and the cached batch forgetting the fields."""

import numpy as np
import pytest

from reference import wilson_hilferty


def reference(x, t=1.0, min_keep=0, typical_p=1.0, xtc=None, top_p=1.0):
    """llama.cpp's chain typical -> top-p -> XTC (always applied when given as (p, threshold)),
    in float64 on distinct logits; returns the kept mask."""
    x64 = x.astype(np.float64)
    inv_t = np.float64(np.float32(1 / t))
    kept = list(np.argsort(-x64, kind="stable")[np.isfinite(x64[np.argsort(-x64, kind="stable")])])

    def probs(kept):
        w = np.exp((x64[kept] - x64[kept].max()) * inv_t)
        return w / w.sum()

    if typical_p < 1.0:
        p = probs(kept)
        entropy = -(p[p > 0] * np.log(p[p > 0])).sum()
        order = np.argsort(np.abs(-np.log(p) - entropy), kind="stable")
        cum, take = 0.0, len(order)
        for j, o in enumerate(order):
            cum += p[o]
            if cum > typical_p and j + 1 >= min_keep:
                take = j + 1
                break
        kept = sorted((kept[o] for o in order[:take]), key=lambda i: -x64[i])
    if top_p < 1.0:
        p = probs(kept)
        cum, take = np.cumsum(p), len(kept)
        for j in range(len(kept)):
            if cum[j] >= top_p and j + 1 >= min_keep:
                take = j + 1
                break
        kept = kept[:take]
    if xtc is not None:
        p = probs(kept)
        above = int((p >= xtc[1]).sum())
        if above >= 2 and len(kept) - (above - 1) >= min_keep:
            kept = kept[above - 1:]
    mask = np.zeros(len(x), bool)
    mask[kept] = True
    return mask


def softmax_over(x, kept, t=1.0):
    inv_t = np.float64(np.float32(1 / t))
    w = np.where(kept, np.exp((x.astype(np.float64) - x.max()) * inv_t), 0.0)
    return w / w.sum()


def drawn_set(s, x, rows=2000, **kw):
    """The tokens drawn from `rows` copies of one row."""
    return set(np.unique(s.draw(np.tile(x, (rows, 1)), **kw)).tolist())


@pytest.mark.parametrize("probs,kw,kept", [
    ([0.97, 0.01, 0.01, 0.01], {"typical_p": 0.5}, [0]),
    ([0.4, 0.2, 0.2, 0.2], {"typical_p": 0.5}, [1, 2, 3]),
    ([0.4, 0.3, 0.2, 0.1], {"xtc_probability": 1.0, "xtc_threshold": 0.09}, [3]),
    ([0.4, 0.3, 0.2, 0.1], {"xtc_probability": 1.0, "xtc_threshold": 0.19}, [2, 3]),
    ([0.4, 0.3, 0.2, 0.1], {"xtc_probability": 1.0, "xtc_threshold": 0.29}, [1, 2, 3]),
    ([0.4, 0.3, 0.2, 0.1], {"xtc_probability": 1.0, "xtc_threshold": 0.39}, [0, 1, 2, 3]),
    ([0.1, 0.2, 0.3, 0.4], {"top_p": 0.7, "min_keep": 3}, [1, 2, 3]),
    ([0.1, 0.2, 0.3, 0.4], {"min_p": 0.76, "min_keep": 2}, [2, 3]),
])
def test_llama_cpp_tables(tokenrace, probs, kw, kept):
    x = np.log(np.array(probs)).astype(np.float32)
    s = tokenrace.Sampler(4, max_rows=4000, seed=1)
    assert drawn_set(s, x, **kw) == set(kept)


def test_kept_sets_match_the_reference(tokenrace, rng):
    vocab = 200
    s = tokenrace.Sampler(vocab, max_rows=4000, seed=2)
    for trial in range(6):
        x = (rng.standard_normal(vocab) * (1.0 + trial)).astype(np.float32)
        for kw in ({"typical_p": 0.5}, {"typical_p": 0.9, "min_keep": 30}, {"typical_p": 0.7, "top_p": 0.6},
                   {"xtc_probability": 1.0, "xtc_threshold": 0.05}, {"xtc_probability": 1.0, "xtc_threshold": 0.01,
                                                                    "min_keep": 150}):
            xtc = (kw["xtc_probability"], kw["xtc_threshold"]) if "xtc_probability" in kw else None
            want = reference(x, min_keep=kw.get("min_keep", 0), typical_p=kw.get("typical_p", 1.0), xtc=xtc,
                             top_p=kw.get("top_p", 1.0))
            got = drawn_set(s, x, rows=4000, **kw)
            assert got <= set(np.flatnonzero(want).tolist()), (trial, kw)
            # Every kept token of probability >= 1/400 shows up in 4000 draws.
            p = softmax_over(x, want)
            assert set(np.flatnonzero(p > 0.0025).tolist()) <= got, (trial, kw)


def test_typical_frequencies_and_a_typical_without_min_keep_rejected(tokenrace, rng):
    vocab, rows = 40, 4000
    x = (rng.standard_normal(vocab) * 2).astype(np.float32)
    right = reference(x, t=0.9, min_keep=9, typical_p=0.3)
    wrong = reference(x, t=0.9, min_keep=0, typical_p=0.3)
    assert (right != wrong).any()
    s = tokenrace.Sampler(vocab, max_rows=rows, seed=3)
    counts = np.zeros(vocab, np.int64)
    for _ in range(10):
        counts += np.bincount(s.draw(np.tile(x, (rows, 1)), temperature=0.9, typical_p=0.3, min_keep=9),
                              minlength=vocab)
    p = softmax_over(x, right, 0.9)
    assert counts[p == 0].sum() == 0
    e = p * counts.sum()
    big = e >= 5
    stat = ((counts[big] - e[big]) ** 2 / e[big]).sum()
    assert stat < wilson_hilferty(big.sum() - 1, 5.0), stat
    # The set without min_keep gives drawn tokens probability 0.
    assert counts[~wrong].sum() > 0


def test_seeded_rows_are_identical_alone_and_in_a_batch(tokenrace, rng):
    rows, vocab = 8, 3000
    x = (rng.standard_normal((rows, vocab)) * 2).astype(np.float32)
    s = tokenrace.Sampler(vocab, max_rows=rows)
    seeds = np.arange(rows, dtype=np.uint64) + 7
    kw = {"typical_p": np.linspace(0.3, 1.0, rows).astype(np.float32), "xtc_probability": 0.5,
          "xtc_threshold": 0.001, "min_keep": 2}
    both = s.draw(x, seeds=seeds, **kw)
    np.testing.assert_array_equal(tokenrace.Sampler(vocab, max_rows=rows).draw(x, seeds=seeds, **kw), both)
    for r in range(rows):
        one = {k: (v[r] if isinstance(v, np.ndarray) else v) for k, v in kw.items()}
        assert s.draw(x[r:r + 1], seeds=seeds[r], **one)[0] == both[r]


@pytest.mark.parametrize("kw,where", [
    ({"typical_p": np.nan}, r"typical_p\[0\]"),
    ({"typical_p": 0.0}, r"typical_p\[0\]: 0 is not in \(0, 1\]"),
    ({"min_keep": [0, 0, -1, 0]}, r"min_keep\[2\]: -1 is negative"),
    ({"xtc_probability": [0.0, 1.5, 0.0, 0.0]}, r"xtc_probability\[1\]"),
    ({"xtc_threshold": np.nan}, r"xtc_threshold\[0\]"),
])
def test_bad_values_name_the_row(tokenrace, kw, where):
    s = tokenrace.Sampler(10)
    x = np.zeros((4, 10), np.float32)
    with pytest.raises(ValueError, match=where):
        s.draw(x, **kw)
    with pytest.raises(ValueError, match=where):
        s.draw_full(x, logprobs=2, **kw)
    assert s.stats()["calls"] == 0


def test_processed_logprobs_are_refused_and_raw_ones_given(tokenrace, rng):
    x = (rng.standard_normal((3, 20))).astype(np.float32)
    s = tokenrace.Sampler(20)
    with pytest.raises(ValueError, match=r"logprob_mode\[0\]"):
        s.draw_full(x, logprobs=1, logprob_mode="processed", typical_p=0.5)
    r = s.draw_full(x, logprobs=1, typical_p=0.5)
    x64 = x.astype(np.float64)
    lse = np.log(np.exp(x64 - x64.max(1, keepdims=True)).sum(1)) + x64.max(1)
    np.testing.assert_allclose(r.logprobs, x64[np.arange(3), r.tokens] - lse, atol=1e-5)


def test_off_values_and_the_next_call_forget_the_fields(tokenrace, rng):
    rows, vocab = 16, 50
    x = (rng.standard_normal((rows, vocab)) * 2).astype(np.float32)
    s = tokenrace.Sampler(vocab, max_rows=rows)
    seeds = np.arange(rows, dtype=np.uint64)
    plain = s.draw(x, seeds=seeds)
    np.testing.assert_array_equal(s.draw(x, seeds=seeds, typical_p=1.0, xtc_probability=0.0, min_keep=5), plain)
    assert not (s.draw(x, seeds=seeds, typical_p=0.2) == plain).all()
    np.testing.assert_array_equal(s.draw(x, seeds=seeds), plain)


def test_dynamic_temperature_frequencies_and_the_base_temperature_rejected(tokenrace, rng):
    vocab, rows = 30, 4000
    x = (rng.standard_normal(vocab) * 1.5).astype(np.float32)
    kept = x >= np.sort(x)[-10]
    x64 = x.astype(np.float64)
    w = np.exp(x64[kept] - x64[kept].max())
    p = w / w.sum()
    h = -(p * np.log(p)).sum()
    t, rng_, e = 0.8, 0.6, 1.3
    low = max(0.0, t - rng_)
    t_dyn = low + (t + rng_ - low) * (h / np.log(kept.sum())) ** e
    s = tokenrace.Sampler(vocab, max_rows=rows, seed=5, filter_order="filters_first")
    counts = np.zeros(vocab, np.int64)
    for _ in range(10):
        counts += np.bincount(s.draw(np.tile(x, (rows, 1)), temperature=t, top_k=10, dynatemp_range=rng_,
                                     dynatemp_exponent=e), minlength=vocab)
    assert counts[~kept].sum() == 0

    def stat(temperature):
        q = softmax_over(x, kept, temperature)
        ex = q * counts.sum()
        big = ex >= 5
        return ((counts[big] - ex[big]) ** 2 / ex[big]).sum(), big.sum() - 1

    value, dof = stat(t_dyn)
    assert value < wilson_hilferty(dof, 5.0), (value, t_dyn)
    value, dof = stat(t)
    assert value > wilson_hilferty(dof, 5.0), ("the base temperature was not rejected", value)


@pytest.mark.parametrize("kw,where", [
    ({"dynatemp_range": -1.0}, r"dynatemp_range\[0\]"),
    ({"dynatemp_range": 0.5, "dynatemp_exponent": np.nan}, r"dynatemp_exponent\[0\]"),
])
def test_bad_dynamic_temperature_names_the_row(tokenrace, kw, where):
    s = tokenrace.Sampler(10)
    with pytest.raises(ValueError, match=where):
        s.draw(np.zeros((2, 10), np.float32), **kw)
    assert s.stats()["calls"] == 0


def dry_penalties(h, multiplier, base=1.75, allowed_length=2, last_n=-1, breakers=()):
    """llama.cpp's DRY by brute force, in float64 but for the penalty's rounding to float32:
    {token: penalty} for history ``h`` (prompt then output)."""
    if multiplier == 0 or base < 1 or last_n == 0:
        return {}
    w = list(h) if last_n < 0 else list(h)[max(0, len(h) - last_n):]
    n = len(w)
    if n <= allowed_length:
        return {}
    limit = n
    for head in range(n - 1, -1, -1):
        tails = [len(b) - 1 for b in breakers
                 if b[0] == w[head] and head + len(b) - 1 < n and list(b[1:]) == w[head + 1:head + len(b)]]
        if tails:
            limit = n - 1 - head - max(tails)
            break
    if limit < allowed_length:
        return {}
    best = {}
    for i in range(n - 1):
        s = 0
        while s <= i and w[i - s] == w[n - 1 - s]:
            s += 1
        s = min(s, limit)
        if s >= allowed_length:
            best[w[i + 1]] = max(best.get(w[i + 1], 0), s)
    single = {b[0] for b in breakers if len(b) == 1}
    most = int(np.float32(88.7228391) / np.log(np.float32(base))) if base > 1.000001 else 0
    out = {}
    for t, s in best.items():
        if t not in single:
            e = s - allowed_length
            e = min(e, most) if most > 0 else e
            out[t] = float(np.float32(multiplier * float(base) ** e))
    return out


@pytest.mark.parametrize("probs,history,expected,kw", [
    # llama.cpp's test_dry cases (tests/test-sampling.cpp).
    ([0.25] * 4, [0, 1], [0.25] * 4, dict(dry_multiplier=1.0, dry_base=1.1, dry_allowed_length=2,
                                          dry_penalty_last_n=4)),
    ([0.25] * 4, [0, 1, 2, 0, 1], [0.296923, 0.296923, 0.109232, 0.296923],
     dict(dry_multiplier=1.0, dry_base=1.1, dry_allowed_length=2, dry_penalty_last_n=5)),
    ([0.2] * 5, [0, 1, 3, 4, 0, 1], [0.2] * 5,
     dict(dry_multiplier=1.0, dry_base=1.1, dry_allowed_length=2, dry_penalty_last_n=6,
          dry_sequence_breakers=[[[3]]])),
    ([0.2] * 5, [0, 1, 2, 0, 1], [0.241818, 0.241818, 0.032727, 0.241818, 0.241818],
     dict(dry_multiplier=2.0, dry_base=1.1, dry_allowed_length=2, dry_penalty_last_n=5)),
    ([0.2] * 5, [0, 1, 2, 3, 4, 0, 1], [0.2] * 5,
     dict(dry_multiplier=1.0, dry_base=1.1, dry_allowed_length=4, dry_penalty_last_n=7)),
])
def test_dry_llama_cpp_tables(tokenrace, probs, history, expected, kw):
    x = np.log(np.array(probs, np.float32))[None, :]
    s = tokenrace.Sampler(len(probs), seed=1)
    r = s.draw_full(x, output_tokens=[history], full_logprobs="processed", **kw)
    np.testing.assert_allclose(np.exp(r.full_logprobs[0]), expected, atol=1e-5)


def test_dry_matches_the_reference_and_its_frequencies_reject_a_wrong_rule(tokenrace, rng):
    vocab = 8
    x = np.linspace(0.5, -0.2, vocab).astype(np.float32)
    prompt, output = [0, 1, 2, 3, 7], [6, 4, 1, 2, 3, 5, 6, 6, 7, 4, 1, 2, 3]
    kw = dict(dry_multiplier=0.6, dry_base=1.4, dry_allowed_length=1, dry_sequence_breakers=[[[1, 2], [6, 4]]])
    pen = dry_penalties(prompt + output, 0.6, 1.4, 1, -1, [[1, 2], [6, 4]])
    assert len(pen) >= 2
    y = x.copy()
    for t, p in pen.items():
        y[t] = np.float32(y[t] - np.float32(p))
    s = tokenrace.Sampler(vocab, max_rows=4000, seed=5)
    r = s.draw_full(x[None, :], prompt_tokens=[prompt], output_tokens=[output], full_logprobs="processed",
                    **kw)
    want = y.astype(np.float64) - np.log(np.exp(y.astype(np.float64)).sum())
    np.testing.assert_allclose(r.full_logprobs[0], want, atol=1e-6)
    rows, n = 4000, 40000
    counts = np.zeros(vocab)
    for start in range(0, n, rows):
        tokens = s.draw(np.tile(x, (rows, 1)), seeds=np.full(rows, 3, np.uint64),
                        offsets=np.arange(start, start + rows, dtype=np.uint64),
                        prompt_tokens=[prompt] * rows, output_tokens=[output] * rows,
                        dry_multiplier=0.6, dry_base=1.4, dry_allowed_length=1,
                        dry_sequence_breakers=[[[1, 2], [6, 4]]] * rows)
        counts += np.bincount(tokens, minlength=vocab)

    def chi2(p):
        e = p * n
        return ((counts - e) ** 2 / e).sum()

    p = np.exp(want)
    assert chi2(p) < wilson_hilferty(vocab - 1, 4.0)
    # Wrong: the breakers ignored (the repeats count in full).
    wrong = x.astype(np.float64).copy()
    for t, q in dry_penalties(prompt + output, 0.6, 1.4, 1, -1, []).items():
        wrong[t] -= q
    wrong = np.exp(wrong) / np.exp(wrong).sum()
    assert chi2(wrong) > wilson_hilferty(vocab - 1, 4.0)


def test_dry_seeded_rows_are_identical_alone_and_in_a_batch(tokenrace, rng):
    rows, vocab = 12, 300
    x = (rng.standard_normal((rows, vocab)) * 2).astype(np.float32)
    outputs = [list(rng.integers(0, 4, 60)) * 2 for _ in range(rows)]
    s = tokenrace.Sampler(vocab, max_rows=rows)
    seeds = np.arange(rows, dtype=np.uint64) + 7
    kw = dict(dry_multiplier=[0.0, 0.8, 1.5] * 4, dry_allowed_length=1)
    batch = s.draw(x, seeds=seeds, output_tokens=outputs, **kw)
    for r in range(rows):
        one = s.draw(x[r:r + 1], seeds=seeds[r:r + 1], output_tokens=[outputs[r]],
                     dry_multiplier=kw["dry_multiplier"][r], dry_allowed_length=1)
        assert one[0] == batch[r]
    # The next call without DRY forgets it.
    np.testing.assert_array_equal(s.draw(x, seeds=seeds, output_tokens=outputs),
                                  s.draw(x, seeds=seeds, output_tokens=outputs, dry_multiplier=0.0))


@pytest.mark.parametrize("kw,where", [
    ({"dry_multiplier": [0.5, -1.0, 0.5, 0.5]}, r"dry_multiplier\[1\]: -1 is not a finite number >= 0"),
    ({"dry_multiplier": 1.0, "dry_base": np.inf}, r"dry_base\[0\]"),
    ({"dry_multiplier": 1.0, "dry_allowed_length": [2, 2, -3, 2]}, r"dry_allowed_length\[2\]: -3 is negative"),
    ({"dry_multiplier": 1.0, "dry_penalty_last_n": -5}, r"dry_penalty_last_n\[0\]"),
    ({"dry_multiplier": 1.0, "dry_sequence_breakers": [None, None, [[1, 10]], None]},
     r"dry_breaker_ids\[2\]: word 0 position 1.*10 is not a token id.*argument dry_sequence_breakers"),
])
def test_bad_dry_values_name_the_row(tokenrace, kw, where):
    s = tokenrace.Sampler(10)
    x = np.zeros((4, 10), np.float32)
    with pytest.raises(ValueError, match=where):
        s.draw(x, output_tokens=[[1, 2, 1, 2]] * 4, **kw)
    assert s.stats()["calls"] == 0
