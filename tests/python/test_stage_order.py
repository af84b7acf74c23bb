"""The caller's order of filter stages through the binding (``order=``): the two fixed orders as
stage tuples draw what the configured orders draw, top-p before and after the temperature draw
their own sets (each rejecting the other's), llama.cpp's default chain, refusals, and the cached
batch forgetting the order."""

import numpy as np
import pytest

from reference import inv_t, wilson_hilferty


def top_p_set(x, judge_t, top_p):
    """The tokens top-p keeps of softmax(x / judge_t), float64, on distinct logits."""
    x64 = x.astype(np.float64)
    order = np.argsort(-x64, kind="stable")
    w = np.exp((x64[order] - x64.max()) * inv_t(judge_t))
    cum = np.cumsum(w / w.sum())
    take = int(np.argmax(cum >= top_p)) + 1
    kept = np.zeros(len(x), bool)
    kept[order[:take]] = True
    return kept


def softmax_over(x, kept, t):
    w = np.where(kept, np.exp((x.astype(np.float64) - x.max()) * inv_t(t)), 0.0)
    return w / w.sum()


def counts_of(s, x, rows, calls, **kw):
    counts = np.zeros(len(x), np.int64)
    for _ in range(calls):
        counts += np.bincount(s.draw(np.tile(x, (rows, 1)), **kw), minlength=len(x))
    return counts


def test_presets_draw_what_the_configured_orders_draw(tokenrace, rng):
    vocab, rows = 5000, 16
    x = (rng.standard_normal((rows, vocab)) * 2).astype(np.float32)
    kw = dict(temperature=0.7, top_k=50, top_p=0.8, min_p=0.02, typical_p=0.9, min_keep=2, seeds=np.arange(rows))
    for preset, name in ((tokenrace.TEMPERATURE_FIRST, "temperature_first"),
                         (tokenrace.FILTERS_FIRST, "filters_first")):
        s = tokenrace.Sampler(vocab, max_rows=rows, seed=5, filter_order=name)
        assert (s.draw(x, order=preset, **kw) == s.draw(x, **kw)).all(), name


@pytest.mark.parametrize("order, judge", [(("top_p", "temperature"), 1.0), (("temperature", "top_p"), 0.5)])
def test_top_p_before_and_after_the_temperature(tokenrace, rng, order, judge):
    vocab, rows, t = 40, 4000, 0.5
    x = (rng.standard_normal(vocab) * 1.5).astype(np.float32)
    right, wrong = top_p_set(x, judge, 0.7), top_p_set(x, 1.5 - judge, 0.7)
    assert (right != wrong).any()
    s = tokenrace.Sampler(vocab, max_rows=rows, seed=7)
    counts = counts_of(s, x, rows, 10, temperature=t, top_p=0.7, order=order)
    p = softmax_over(x, right, t)
    assert counts[p == 0].sum() == 0
    e = p * counts.sum()
    big = e >= 5
    stat = ((counts[big] - e[big]) ** 2 / e[big]).sum()
    assert stat < wilson_hilferty(big.sum() - 1, 5.0), stat
    # The other order's set is rejected: it excludes a drawn token, or fails chi-square.
    q = softmax_over(x, wrong, t)
    if counts[q == 0].sum() == 0:
        e = q * counts.sum()
        big = e >= 5
        assert ((counts[big] - e[big]) ** 2 / e[big]).sum() > wilson_hilferty(big.sum() - 1, 5.0)


def test_llama_cpp_default_chain_is_seeded_and_differs_from_the_fixed_order(tokenrace, rng):
    vocab, rows = 3000, 64
    x = (rng.standard_normal((rows, vocab)) * 2).astype(np.float32)
    kw = dict(temperature=0.8, top_k=40, typical_p=0.8, top_p=0.6, min_p=0.12, seeds=np.arange(rows))
    s = tokenrace.Sampler(vocab, max_rows=rows, seed=9, filter_order="filters_first")
    llama = s.draw(x, order=tokenrace.LLAMA_CPP_ORDER, **kw)
    assert (llama == s.draw(x, order=list(tokenrace.LLAMA_CPP_ORDER), **kw)).all()
    for simd in ("scalar", "auto"):
        other = tokenrace.Sampler(vocab, max_rows=rows, seed=1, simd=simd, threads=4)
        assert (other.draw(x, order=tokenrace.LLAMA_CPP_ORDER, **kw) == llama).all(), simd


@pytest.mark.parametrize("order, needle", [
    (("top_p", "temprature"), "order[1]: 'temprature' is not a stage"),
    (("top_p", "temperature", "top_p"), "order[2]"),
    (("dry", "top_p"), "order[0]: stage 8 (dry) is not in this build"),
    (("temperature",), "top_p[0]"),
    ((), "order: lists no stage"),
    ("top_p", "order: a tuple of stage names"),
])
def test_bad_orders_are_refused(tokenrace, order, needle):
    s = tokenrace.Sampler(10, max_rows=4, seed=1)
    x = np.arange(40, dtype=np.float32).reshape(4, 10)
    with pytest.raises(ValueError) as e:
        s.draw(x, top_p=0.9, order=order)
    assert needle in str(e.value), str(e.value)


def test_the_next_call_forgets_the_order(tokenrace, rng):
    vocab, rows = 200, 8
    x = (rng.standard_normal((rows, vocab)) * 2).astype(np.float32)
    kw = dict(temperature=0.5, top_p=0.7, seeds=np.arange(rows))
    s = tokenrace.Sampler(vocab, max_rows=rows, seed=2)
    plain = s.draw(x, **kw)
    s.draw(x, order=("top_p", "temperature"), **kw)
    assert (s.draw(x, **kw) == plain).all()
    with pytest.raises(ValueError):
        s.draw(x, min_p=0.1, order=("top_p", "temperature"), **kw)
    assert (s.draw(x, **kw) == plain).all()
