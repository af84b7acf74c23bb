"""``Sampler.score``: the logprobs, ranks and top-n of given tokens, without drawing, equal to the
draw's for the same tokens and to a float64 reference; no noise used; refusals."""

import numpy as np
import pytest

VOCAB = 300
ROWS = 5


@pytest.fixture
def x(rng):
    x = (rng.standard_normal((ROWS, VOCAB)) * 3).astype(np.float32)
    x[0, 1] = x[0, 0]  # a tie
    x[1, 2] = -np.inf
    return x


def log_softmax64(x):
    z = x.astype(np.float64) - x.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def test_scores_match_the_reference_and_the_draw(tokenrace, x):
    targets = np.array([1, 0, 299, 7, 42])
    s = tokenrace.Sampler(VOCAB, seed=3)
    r = s.score(x, targets, logprobs=4, ranks=True, temperature=0.7, top_k=50,
                logprob_token_ids=[[0, 1], [], [5], [], [2]])
    np.testing.assert_array_equal(r.tokens, targets)
    ref = log_softmax64(x)
    np.testing.assert_allclose(r.logprobs, ref[np.arange(ROWS), targets], atol=1e-5)
    want_ranks = [(x[i] >= x[i, t]).sum() for i, t in enumerate(targets)]
    np.testing.assert_array_equal(r.ranks, want_ranks)
    np.testing.assert_allclose(r.token_logprobs, [ref[0, 0], ref[0, 1], ref[2, 5], ref[4, 2]], atol=1e-5)
    top = np.argsort(-x, axis=1, kind="stable")[:, :4]
    np.testing.assert_array_equal(r.topn_ids, top)
    d = s.draw_full(x, logprobs=4, ranks=True, temperature=0.7, top_k=50, forced_tokens=targets.astype(np.int32),
                    seeds=np.arange(ROWS, dtype=np.uint64), logprob_token_ids=[[0, 1], [], [5], [], [2]])
    for name in ("tokens", "flags", "logprobs", "ranks", "topn_ids", "topn_logprobs", "token_logprobs"):
        np.testing.assert_array_equal(getattr(r, name), getattr(d, name), err_msg=name)
    processed = s.score(x, targets, logprob_mode="processed", temperature=0.7, top_k=50)
    drawn = s.draw_full(x, logprob_mode="processed", temperature=0.7, top_k=50,
                        forced_tokens=targets.astype(np.int32), seeds=np.zeros(ROWS, np.uint64))
    np.testing.assert_array_equal(processed.logprobs, drawn.logprobs)


def test_a_score_uses_no_noise(tokenrace, x):
    a, twin = tokenrace.Sampler(VOCAB, seed=8), tokenrace.Sampler(VOCAB, seed=8)
    a.score(x, np.zeros(ROWS, np.int64))
    np.testing.assert_array_equal(a.draw(x), twin.draw(x))


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(targets=[1, 2]), ValueError, r"targets: has shape \(2,\), the logits have 5 rows"),
    (dict(targets=[0, 0, 0, 0, VOCAB]), ValueError, r"targets\[4\]: 300 is not a token id in \[0, 300\)"),
    (dict(targets=[0, -1, 0, 0, 0]), ValueError, r"targets\[1\]: -1 is not a token id"),
    (dict(targets=[0.5] * ROWS), TypeError, "targets: must hold integers"),
    (dict(targets=[0] * ROWS, seeds=[1] * ROWS), TypeError, "seeds is not read by a score call"),
    (dict(targets=[0] * ROWS, forced_tokens=[1] * ROWS), TypeError, "forced_tokens is not read by a score call"),
])
def test_bad_scores_are_refused(tokenrace, x, kwargs, error, message):
    s = tokenrace.Sampler(VOCAB, seed=3)
    with pytest.raises(error, match=message):
        s.score(x, **kwargs)
