"""Row flags for NaN, +inf, empty and greedy rows."""

import numpy as np
import pytest


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("t", [0.0, 1.0])
def test_flags(tokenrace, rng, dtype, t):
    F = tokenrace
    vocab = 300
    x = rng.standard_normal((7, vocab)).astype(dtype)
    x[1, 10] = np.nan                  # NaN never wins
    x[2, [250, 40]] = np.inf           # the first +inf wins
    x[2, 5] = np.nan
    x[3] = -np.inf                     # empty: token 0
    x[4] = np.nan                      # only NaN: empty too
    x[5] = -np.inf
    x[5, 299] = -1.0                   # one live token
    x[6] = np.inf                      # all +inf: token 0
    tokens, flags = tokenrace.Sampler(vocab).draw(x, temperature=t, return_flags=True)
    g = F.FLAG_GREEDY if t == 0 else 0
    assert flags.tolist() == [
        g,
        F.FLAG_HAS_NAN | g,
        F.FLAG_HAS_POSINF | F.FLAG_HAS_NAN | g,
        F.FLAG_EMPTY | g,
        F.FLAG_EMPTY | F.FLAG_HAS_NAN | g,
        g,
        F.FLAG_HAS_POSINF | g,
    ]
    assert tokens[1] != 10 and tokens[2] == 40 and tokens[3] == 0 and tokens[4] == 0
    assert tokens[5] == 299 and tokens[6] == 0
    if t == 0:
        clean = np.where(np.isnan(x[1]), -np.inf, x[1])
        assert tokens[1] == np.argmax(clean)


def test_flags_with_external_noise(tokenrace):
    x = np.array([[0.0, np.inf, 1.0], [np.nan, 0.0, 0.0]], np.float32)
    tokens, flags = tokenrace.Sampler(3).draw(x, noise=np.ones(3, np.float32), return_flags=True)
    assert tokens[0] == 1 and flags[0] == tokenrace.FLAG_HAS_POSINF
    assert tokens[1] in (1, 2) and flags[1] == tokenrace.FLAG_HAS_NAN
    assert tokenrace.Sampler(3).stats()["nonfinite_rows"] == 0
