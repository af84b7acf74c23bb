"""``Sampler.score`` (and ``tokenrace.torch.score``): the logprobs, ranks and top-n of given
target tokens with nothing drawn, equal bit for bit to what ``draw_full`` reports for the same
tokens, against a float64 log_softmax, with no noise consumed and refusals that name the argument
and row and write nothing."""

import numpy as np
import pytest


def log_softmax64(x):
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


@pytest.fixture
def x():
    rng = np.random.default_rng(11)
    return (rng.normal(size=(40, 257)) * 2).astype(np.float32)


@pytest.mark.parametrize("mode", ["raw", "processed"])
def test_scoring_the_drawn_tokens_gives_the_draws_values_bit_for_bit(tokenrace, x, mode):
    s = tokenrace.Sampler(0, seed=4, threads=2)
    rows = x.shape[0]
    args = dict(temperature=np.tile(np.float32([1.0, 0.7, 0.0, 1.3]), rows // 4),
                top_k=np.tile(np.int32([0, 30, 0, 5, 0]), rows // 5), top_p=0.9,
                banned_tokens=[[r % 7] for r in range(rows)],
                logprob_token_ids=[[0, r] if r % 3 == 0 else [] for r in range(rows)])
    d = s.draw_full(x, logprobs=4, ranks=True, logprob_mode=mode, **args)
    r = s.score(x, d.tokens, logprobs=4, ranks=True, mode=mode, **args)
    for name in ("tokens", "flags", "logprobs", "ranks", "topn_ids", "topn_logprobs", "token_logprobs",
                 "token_ranks"):
        np.testing.assert_array_equal(getattr(r, name).view(np.uint32) if getattr(r, name).dtype == np.float32
                                      else getattr(r, name),
                                      getattr(d, name).view(np.uint32) if getattr(d, name).dtype == np.float32
                                      else getattr(d, name), err_msg=name)


def test_prompt_logprobs_follow_the_float64_reference_and_consume_no_noise(tokenrace, x):
    s, fresh = tokenrace.Sampler(0, seed=9), tokenrace.Sampler(0, seed=9)
    rng = np.random.default_rng(2)
    targets = rng.integers(0, x.shape[1], size=x.shape[0]).astype(np.int64)
    r = s.score(x, targets, logprobs=3, ranks=True)
    want = log_softmax64(x)
    rows = np.arange(x.shape[0])
    np.testing.assert_allclose(r.logprobs, want[rows, targets], rtol=0, atol=2e-5)
    np.testing.assert_array_equal(r.tokens, targets)
    np.testing.assert_array_equal(r.ranks, (want >= want[rows, targets][:, None]).sum(axis=1))
    np.testing.assert_array_equal(r.topn_ids, np.argsort(-want, axis=1, kind="stable")[:, :3])
    np.testing.assert_array_equal(s.draw(x), fresh.draw(x))  # the stream did not move


def test_bad_scores_are_refused_naming_the_argument_and_row(tokenrace, x):
    s, fresh = tokenrace.Sampler(0, seed=9), tokenrace.Sampler(0, seed=9)
    targets = np.zeros(x.shape[0], np.int32)
    targets[5] = x.shape[1]
    with pytest.raises(tokenrace.InvalidArgumentError, match=r"target_ids: row 5: 257 is not a token id"):
        s.score(x, targets)
    with pytest.raises(ValueError, match="target_ids: has 3 entries, the batch has 40 rows"):
        s.score(x, [0, 1, 2])
    with pytest.raises(TypeError, match="forced_tokens"):
        s.score(x, np.zeros(40, np.int32), forced_tokens=np.zeros(40, np.int32))
    with pytest.raises(ValueError, match="target_ids"):
        s.score(x, np.zeros(40, np.float32))
    np.testing.assert_array_equal(s.draw(x), fresh.draw(x))
