"""``draw_full(row_index=)``: several outputs from one logits row, each the draw of a copy of
its logits row (own seed, parameters and outputs), bit for bit; a later call without it reads
row r again; refusals name the entry."""

import numpy as np
import pytest


@pytest.fixture
def x():
    return (np.random.default_rng(4).normal(size=(3, 200)) * 2).astype(np.float32)


def test_each_output_is_the_draw_of_a_copy_of_its_row(tokenrace, x):
    index = np.array([0, 0, 0, 2, 1, 2, 0], np.int32)
    args = dict(temperature=np.float32([1.0, 0.8, 0.0, 1.1, 1.0, 0.7, 1.3]), top_k=20, top_p=0.9,
                seeds=np.arange(7, dtype=np.uint64) + 50, logprobs=3, ranks=True, logprob_mode="processed")
    a, b = tokenrace.Sampler(0, seed=2), tokenrace.Sampler(0, seed=2)
    got = a.draw_full(x, row_index=index, **args)
    want = b.draw_full(np.ascontiguousarray(x[index]), **args)
    for name in ("tokens", "flags", "logprobs", "ranks", "topn_ids", "topn_logprobs"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
    # The next calls, without an index, read row r for row r (the cached struct was reset).
    np.testing.assert_array_equal(a.draw(x, seeds=np.uint64([1, 2, 3])), b.draw(x, seeds=np.uint64([1, 2, 3])))
    np.testing.assert_array_equal(a.draw_full(x, seeds=np.uint64([1, 2, 3])).tokens,
                                  b.draw_full(x, seeds=np.uint64([1, 2, 3])).tokens)


def test_bad_row_indices_are_refused_naming_the_entry(tokenrace, x):
    s = tokenrace.Sampler(0)
    with pytest.raises(ValueError, match=r"row_index\[1\]: 3 is not a row of the logits \(3 rows\)"):
        s.draw_full(x, row_index=[0, 3])
    with pytest.raises(tokenrace.InvalidArgumentError, match=r"batch.row_index\[0\]: -1 is not a logits row"):
        s.draw_full(x, row_index=[-1, 0])
    with pytest.raises(ValueError, match="temperature"):
        s.draw_full(x, row_index=[0, 0, 1, 1], temperature=np.float32([1, 1, 1]))
