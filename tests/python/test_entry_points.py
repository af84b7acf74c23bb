"""Every per-row argument of ``Sampler.draw`` and ``draw_full`` as a numpy array: row r of a
varying array draws what a one-row call with that row's value as a scalar draws (every row is
seeded, so a row's token depends on its own inputs only), a constant array draws what the scalar
draws, and the argument reaches the library (the batch draws differently without it). And
``Sampler.draw(row_index=)``: the tokens of ``draw_full(row_index=)``, bit for bit."""

import numpy as np
import pytest

ROWS, VOCAB = 12, 48
SEEDS = np.arange(ROWS, dtype=np.uint64) * 7 + 3
HISTORY = [[1, 2, 3, 1, 2], [4, 4, 4], [5, 6, 7, 5, 6], [8, 9], [1, 2, 1, 2, 1], [3, 3],
           [10, 11, 10, 11], [12], [2, 2, 2, 2], [13, 14, 13], [0, 1, 0], [5, 5]]


def logits():
    x = np.random.default_rng(31).standard_normal((ROWS, VOCAB)) * 1.5
    x[:, :15] += 3.0  # the histories' tokens are likely, so that the penalties and DRY show
    return x.astype(np.float32)


# name: (per-row values, the arguments the parameter needs to act). The values differ between
# rows and include each parameter's "off" value somewhere, so that both branches are taken.
PER_ROW = {
    "temperature": (np.float32([0.0, 0.5, 1.0, 1.5] * 3), {}),
    "offsets": (np.uint64(np.arange(ROWS) * 11), {}),
    "seeded": (np.uint8([1] * ROWS), {}),
    "top_k": (np.int32([0, 1, 2, 5, 10, 48, 3, 4, 6, 7, 8, 9]), {}),
    "top_p": (np.float32([1.0, 0.1, 0.3, 0.5, 0.7, 0.9] * 2), {}),
    "min_p": (np.float32([0.0, 0.05, 0.1, 0.2, 0.4, 0.6] * 2), {}),
    "top_n_sigma": (np.float32([0.0, 0.2, 0.5, 1.0, 1.5, 2.0] * 2), {}),
    "min_keep": (np.int32([0, 1, 2, 3, 5, 8] * 2), {"top_p": 0.05}),
    "typical_p": (np.float32([1.0, 0.1, 0.2, 0.4, 0.6, 0.8] * 2), {}),
    "xtc_probability": (np.float32([0.0, 1.0, 0.5, 1.0, 0.9, 1.0] * 2), {"xtc_threshold": 0.05}),
    "xtc_threshold": (np.float32([0.6, 0.01, 0.05, 0.1, 0.02, 0.03] * 2), {"xtc_probability": 1.0}),
    "dynatemp_range": (np.float32([0.0, 0.5, 1.0, 2.0, 3.0, 0.8] * 2), {}),
    "dynatemp_exponent": (np.float32([1.0, 0.0, 0.5, 2.0, 4.0, 8.0] * 2), {"dynatemp_range": 2.0}),
    "repetition_penalty": (np.float32([1.0, 1e4, 2.0, 1e4, 0.5, 1e4] * 2), {"output_tokens": HISTORY}),
    "frequency_penalty": (np.float32([0.0, 30.0, 1.0, 30.0, -1.0, 30.0] * 2), {"output_tokens": HISTORY}),
    "presence_penalty": (np.float32([0.0, 30.0, 1.0, 30.0, -1.0, 30.0] * 2), {"output_tokens": HISTORY}),
    "penalty_last_n": (np.int32([0, 1, 2, 1, 1, 2] * 2), {"output_tokens": HISTORY, "frequency_penalty": 30.0}),
    "min_tokens": (np.int32([0, 9, 9, 0, 9, 9] * 2), {
        "output_tokens": HISTORY, "stop_token_ids": [list(range(0, VOCAB, 2))] * ROWS}),
    "forced_tokens": (np.int32([-1, 0, 5, -1, 47, 3] * 2), {}),
    "dry_multiplier": (np.float32([0.0, 50.0, 10.0, 50.0, 50.0, 50.0] * 2), {"output_tokens": HISTORY}),
    "dry_base": (np.float32([0.5, 1.75, 3.0, 2.0, 1.0, 1.75] * 2), {
        "output_tokens": HISTORY, "dry_multiplier": 50.0}),
    "dry_allowed_length": (np.int32([0, 1, 2, 0, 1, 3] * 2), {"output_tokens": HISTORY, "dry_multiplier": 50.0}),
    "dry_penalty_last_n": (np.int32([-1, 0, 2, 3, -1, 4] * 2), {"output_tokens": HISTORY, "dry_multiplier": 50.0}),
}


def calls(tokenrace):
    """``(name, draw)`` of the two entry points, each returning the tokens as numpy."""
    def draw(x, **kwargs):
        return np.asarray(tokenrace.Sampler(0, seed=1).draw(x, seeds=kwargs.pop("seeds", SEEDS), **kwargs))

    def draw_full(x, **kwargs):
        return np.asarray(tokenrace.Sampler(0, seed=1).draw_full(x, seeds=kwargs.pop("seeds", SEEDS), **kwargs).tokens)

    return (("draw", draw), ("draw_full", draw_full))


def one_row(args, r):
    """``args`` of the batch restricted to row r (per-row lists and arrays cut to their row)."""
    out = {}
    for name, value in args.items():
        if isinstance(value, np.ndarray) and value.shape == (ROWS,):
            out[name] = value[r:r + 1]
        elif isinstance(value, list) and len(value) == ROWS:
            out[name] = value[r:r + 1]
        else:
            out[name] = value
    return out


@pytest.mark.parametrize("name", sorted(PER_ROW))
def test_every_per_row_argument_takes_a_numpy_array(tokenrace, name):
    values, needs = PER_ROW[name]
    x = logits()
    for entry, draw in calls(tokenrace):
        batch = draw(x, **needs, **{name: values})
        for r in range(ROWS):
            scalar = values[r].item()
            alone = draw(x[r:r + 1], **one_row(needs, r), seeds=SEEDS[r:r + 1], **{name: scalar})
            assert alone[0] == batch[r], f"{entry}: {name}[{r}] = {scalar}"
        constant = np.full(ROWS, values[1], values.dtype)
        np.testing.assert_array_equal(draw(x, **needs, **{name: constant}),
                                      draw(x, **needs, **{name: values[1].item()}),
                                      err_msg=f"{entry}: {name} as one value")
        if name not in ("seeded",):  # seeded=1 for every row is the default with seeds
            # Over a few seed sets, some token differs from the draw without the argument.
            assert any(not np.array_equal(draw(x, seeds=SEEDS + k, **needs, **{name: values}),
                                          draw(x, seeds=SEEDS + k, **needs)) for k in range(200)), \
                f"{entry}: {name} changed no token"


def test_request_ids_take_a_numpy_array(tokenrace):
    x = logits()
    requests = tokenrace.Requests()
    for r, history in enumerate(HISTORY):
        requests.add(100 + r, [], history)
    ids = np.uint64(100 + np.arange(ROWS)[::-1])  # row r reads request 100 + ROWS - 1 - r
    for entry, draw in calls(tokenrace):
        got = draw(x, requests=requests, request_ids=ids, frequency_penalty=30.0)
        want = draw(x, output_tokens=HISTORY[::-1], frequency_penalty=30.0)
        np.testing.assert_array_equal(got, want, err_msg=entry)
    requests.close()


def test_draw_takes_row_index(tokenrace):
    x = logits()[:3]
    index = np.int32([0, 0, 0, 2, 1, 2, 0])
    seeds = np.arange(7, dtype=np.uint64) + 50
    args = dict(temperature=np.float32([1.0, 0.8, 0.0, 1.1, 1.0, 0.7, 1.3]), top_k=20, seeds=seeds)
    a, b, c = (tokenrace.Sampler(0, seed=2) for _ in range(3))
    got, flags = a.draw(x, row_index=index, return_flags=True, **args)
    np.testing.assert_array_equal(got, b.draw(np.ascontiguousarray(x[index]), **args))
    np.testing.assert_array_equal(got, c.draw_full(x, row_index=list(index), **args).tokens)
    assert got.shape == (7,) and flags.shape == (7,)
    # The next call, without an index, reads row r for row r (the cached struct was reset).
    np.testing.assert_array_equal(a.draw(x, seeds=seeds[:3]), b.draw(x, seeds=seeds[:3]))
    with pytest.raises(ValueError, match=r"row_index\[1\]: 3 is not a row of the logits \(3 rows\)"):
        a.draw(x, row_index=[0, 3])
    with pytest.raises(ValueError, match="temperature"):
        a.draw(x, row_index=[0, 0, 1, 1], temperature=np.float32([1, 1, 1]))
