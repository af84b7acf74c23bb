"""Bad input raises ValueError naming the argument (or row); nothing is written."""

import numpy as np
import pytest


@pytest.fixture
def s(tokenrace):
    return tokenrace.Sampler(0, max_rows=16)


X = np.zeros((4, 10), np.float32)


def test_negative_temperature_names_the_row(s, tokenrace):
    with pytest.raises(ValueError, match=r"temperature\[2\]") as e:
        s.draw(X, temperature=[1.0, 0.5, -0.1, 1.0])
    assert isinstance(e.value, tokenrace.InvalidArgumentError)
    assert e.value.status == tokenrace._ffi.STATUS_INVALID_ARGUMENT
    with pytest.raises(ValueError, match=r"temperature\[3\]"):
        s.draw(X, temperature=[1.0, 0.5, 1.0, np.nan])
    with pytest.raises(ValueError, match=r"temperature\[0\]"):
        s.draw(X, temperature=np.inf)


@pytest.mark.parametrize("arg,value", [
    ("temperature", [1.0, 1.0]),
    ("seeds", [1, 2, 3, 4, 5]),
    ("offsets", [1]),
    ("seeded", [True] * 3),
])
def test_per_row_length(s, arg, value):
    kwargs = {arg: value}
    if arg in ("offsets", "seeded"):
        kwargs["seeds"] = 1
    with pytest.raises(ValueError, match=arg):
        s.draw(X, **kwargs)


def test_per_row_shape_and_type(s):
    with pytest.raises(ValueError, match="temperature"):
        s.draw(X, temperature=np.ones((4, 1)))
    with pytest.raises(ValueError, match=r"seeds\[1\]"):
        s.draw(X, seeds=[1, -2, 3, 4])
    with pytest.raises(ValueError, match="seeds"):
        s.draw(X, seeds=-1)
    with pytest.raises(ValueError, match="seeds"):
        s.draw(X, seeds=[0.5, 1, 2, 3])
    with pytest.raises(ValueError, match="seeds"):
        s.draw(X, seeds=[2**64, 1, 2, 3])
    with pytest.raises(ValueError, match="temperature"):
        s.draw(X, temperature=["a"] * 4)
    with pytest.raises(ValueError, match="seeded"):
        s.draw(X, seeded=[True] * 4)  # without seeds
    assert s.draw(X, seeds=[2**64 - 1, 0, 1, 2]).shape == (4,)


def test_noise_shape(s):
    with pytest.raises(ValueError, match="noise"):
        s.draw(X, noise=np.ones(9, np.float32))
    with pytest.raises(ValueError, match="noise"):
        s.draw(X, noise=np.ones((4, 11), np.float32))
    with pytest.raises(ValueError, match="noise"):
        s.draw(X, noise=np.ones((3, 10), np.float32))
    with pytest.raises(ValueError, match="noise"):
        s.draw(X, noise=np.ones((4, 10), np.float64))
    with pytest.raises(ValueError, match="noise"):
        s.draw(X, noise=np.ones((4, 20), np.float32)[:, ::2])
    with pytest.raises(ValueError, match="noise_kind"):
        s.draw(X, noise=np.ones(10, np.float32), noise_kind="gumbel")


def test_logits_shape_dtype_and_layout(s):
    with pytest.raises(ValueError, match="logits.*3-D"):
        s.draw(np.zeros((2, 3, 4), np.float32))
    with pytest.raises(ValueError, match="logits"):
        s.draw(np.float32(1.0))
    with pytest.raises(ValueError, match="logits.*contiguous"):
        s.draw(np.zeros((4, 20), np.float32)[:, ::2])
    with pytest.raises(ValueError, match="logits.*contiguous"):
        s.draw(np.zeros((10, 4), np.float32).T)
    with pytest.raises(ValueError, match="logits.*float64"):
        s.draw(np.zeros((4, 10), np.float64))
    with pytest.raises(ValueError, match="logits.*int"):
        s.draw(np.zeros((4, 10), np.int32))
    with pytest.raises(ValueError, match="logits.*byte order"):
        s.draw(np.zeros((4, 10), ">f4"))
    with pytest.raises(ValueError, match="logits.*negative"):
        s.draw(np.zeros((4, 10), np.float32)[::-1])
    with pytest.raises(ValueError, match="logits.*overlap"):
        s.draw(np.broadcast_to(np.zeros(10, np.float32), (4, 10)))
    unaligned = np.zeros(161, np.uint8)[1:].view(np.float32).reshape(4, 10)
    with pytest.raises(ValueError, match="logits.*aligned"):
        s.draw(unaligned)
    with pytest.raises(ValueError, match="vocab"):
        s.draw(np.zeros((4, 0), np.float32))


def test_sampler_limits(tokenrace):
    s = tokenrace.Sampler(10, max_rows=3)
    with pytest.raises(ValueError, match="rows.*max_rows 3"):
        s.draw(np.zeros((4, 10), np.float32))
    with pytest.raises(ValueError, match="vocab"):
        s.draw(np.zeros((2, 11), np.float32))


def test_nothing_is_written_on_failure(tokenrace, monkeypatch):
    """A failed draw leaves the outputs untouched (the binding raises; no partial result)."""
    s = tokenrace.Sampler(10)
    before = s.stats()
    with pytest.raises(ValueError):
        s.draw(X, temperature=[1, 1, 1, -1])
    after = s.stats()
    assert after["calls"] == before["calls"] and after["rejected_calls"] == before["rejected_calls"] + 1


@pytest.mark.parametrize("kwargs,name", [
    ({"simd": "avx9000"}, "simd"),
    ({"simd": 3}, "simd"),
    ({"noise": "poool"}, "noise"),
    ({"max_rows": 0}, "max_rows"),
    ({"max_rows": -1}, "max_rows"),
    ({"max_rows": 2**21}, "max_rows"),
    ({"threads": 5000}, "threads"),
    ({"greedy_below": -1.0}, "greedy_below"),
    ({"greedy_below": float("nan")}, "greedy_below"),
    ({"seed": -5}, "seed"),
    ({"seed": 2**64}, "seed"),
])
def test_bad_settings(tokenrace, kwargs, name):
    with pytest.raises(ValueError, match=name):
        tokenrace.Sampler(10, **kwargs)


def test_bad_vocab_size(tokenrace):
    with pytest.raises(ValueError, match="vocab_size"):
        tokenrace.Sampler(-1)
    with pytest.raises(ValueError, match="vocab_size"):
        tokenrace.Sampler(2**31)
    with pytest.raises(TypeError, match="vocab_size"):
        tokenrace.Sampler(10.5)


def test_status_mapping(tokenrace):
    from tokenrace import _errors, _ffi

    assert issubclass(tokenrace.InvalidArgumentError, ValueError)
    assert issubclass(tokenrace.InvalidConfigError, ValueError)
    for cls in (tokenrace.UnsupportedError, tokenrace.InternalError, tokenrace.OutOfMemoryError,
                tokenrace.TokenraceTimeoutError, tokenrace.ClosedError):
        assert issubclass(cls, RuntimeError) and not issubclass(cls, ValueError)
    for status in range(1, 8):
        with pytest.raises(tokenrace.TokenraceError) as e:
            _errors.check(status)
        assert e.value.status == status
    _errors.check(_ffi.STATUS_OK)
    with pytest.raises(tokenrace.TokenraceError, match="unknown status 99"):
        _errors.check(99)


def test_offsets_without_seeds_are_refused(s):
    """An offset only keys a seeded row; without seeds every row is unseeded and the offsets
    would be ignored."""
    for call in (s.draw, s.draw_full):
        with pytest.raises(ValueError, match=r"offsets: given without seeds; an offset is mixed into a seeded row's "
                                             r"seed \(e.g. its position\), so it needs seeds="):
            call(X, temperature=1.0, offsets=[1, 2, 3, 4])
        with pytest.raises(ValueError, match="offsets: given without seeds"):
            call(X, offsets=7)
    assert s.draw(X, seeds=3, offsets=7).shape == (4,)
    assert s.draw(X, seeds=[3, 4, 5, 6], seeded=[True, False, True, False], offsets=7).shape == (4,)
