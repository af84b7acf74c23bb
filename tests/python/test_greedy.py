"""Greedy rows are numpy.argmax (lowest index on ties), read in place from any row stride."""

import numpy as np
import pytest


def tie_heavy_logits(rng, rows, vocab, dtype):
    # Small integers: many exact ties, representable in float16 too.
    return rng.integers(-20, 20, size=(rows, vocab)).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("vocab", [1, 7, 64, 1000, 4099])
def test_greedy_is_argmax_with_lowest_index_on_ties(tokenrace, rng, dtype, vocab):
    s = tokenrace.Sampler(vocab)
    x = tie_heavy_logits(rng, 37, vocab, dtype)
    tokens, flags = s.draw(x, temperature=0.0, return_flags=True)
    assert tokens.dtype == np.int32
    np.testing.assert_array_equal(tokens, np.argmax(x, axis=1))
    assert np.all(flags == tokenrace.FLAG_GREEDY)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_greedy_on_continuous_logits(tokenrace, rng, dtype):
    s = tokenrace.Sampler(0)
    x = (rng.standard_normal((50, 3001)) * 4).astype(dtype)
    np.testing.assert_array_equal(s.draw(x, temperature=0), np.argmax(x, axis=1))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_strided_views(tokenrace, rng, dtype):
    vocab = 513
    big = tie_heavy_logits(rng, 40, 700, dtype)
    s = tokenrace.Sampler(vocab)
    for view in (big[:, :vocab], big[::2, :vocab], big[5:31:3, 100:100 + vocab], big[::-1][::-1, :vocab]):
        assert view.strides[1] == view.itemsize
        np.testing.assert_array_equal(s.draw(view, temperature=0), np.argmax(view, axis=1))
    rows_only = tie_heavy_logits(rng, 40, vocab, dtype)[::2]
    np.testing.assert_array_equal(s.draw(rows_only, temperature=0), np.argmax(rows_only, axis=1))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_no_copy_view_into_a_larger_array(tokenrace, rng, dtype):
    """The columns outside the view hold +inf: a copy with a wrong stride, or a read past the
    row, would make +inf win (and set FLAG_HAS_POSINF)."""
    vocab = 300
    big = np.full((16, 2 * vocab + 11), np.inf, dtype=dtype)
    inner = rng.standard_normal((16, vocab)).astype(dtype)
    big[:, 5:5 + vocab] = inner
    view = big[:, 5:5 + vocab]
    s = tokenrace.Sampler(vocab)
    for t in (0.0, 1.0):
        tokens, flags = s.draw(view, temperature=t, return_flags=True)
        assert not np.any(flags & tokenrace.FLAG_HAS_POSINF)
        assert np.all((tokens >= 0) & (tokens < vocab))
    np.testing.assert_array_equal(s.draw(view, temperature=0), np.argmax(inner, axis=1))
    # Every other row of the view.
    np.testing.assert_array_equal(s.draw(view[::2], temperature=0), np.argmax(inner[::2], axis=1))


def test_the_binding_passes_the_callers_pointer(tokenrace, rng, monkeypatch):
    """The struct handed to the library points into the caller's array, with its strides."""
    from tokenrace import _arrays

    big = rng.standard_normal((10, 50)).astype(np.float32)
    view = big[2::3, 4:44]
    v = _arrays.rows_view(view)
    assert v.ptr == big.ctypes.data + (2 * 50 + 4) * 4
    assert (v.rows, v.vocab, v.row_stride) == (3, 40, 150)
    assert v.owner is view


def test_greedy_threshold(tokenrace, rng):
    x = rng.standard_normal((4, 100)).astype(np.float32)
    s = tokenrace.Sampler(100, greedy_below=0.5)
    _, flags = s.draw(x, temperature=[0.0, 0.49, 0.5, 2.0], return_flags=True)
    assert (flags & tokenrace.FLAG_GREEDY).tolist() == [8, 8, 0, 0]


def test_bfloat16_numpy_if_available(tokenrace, rng):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = tie_heavy_logits(rng, 9, 77, np.float32).astype(ml_dtypes.bfloat16)
    s = tokenrace.Sampler(77)
    np.testing.assert_array_equal(s.draw(x, temperature=0), np.argmax(x.astype(np.float32), axis=1))


class TestTorch:

    @pytest.fixture(autouse=True)
    def _torch(self):
        self.torch = pytest.importorskip("torch")

    @pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
    def test_torch_zero_copy_views(self, tokenrace, rng, dtype):
        torch = self.torch
        tdtype = getattr(torch, dtype)
        base = torch.from_numpy(rng.integers(-20, 20, size=(12, 300)).astype(np.float32)).to(tdtype)
        base[:, 200:] = float("inf")
        view = base[::2, 10:200]
        s = tokenrace.Sampler(190)
        tokens, flags = s.draw(view, temperature=0, return_flags=True)
        assert isinstance(tokens, torch.Tensor) and isinstance(flags, torch.Tensor)  # torch in, torch out
        expected = np.argmax(view.float().numpy(), axis=1)
        np.testing.assert_array_equal(tokens, expected)
        assert not np.any(flags.numpy() & tokenrace.FLAG_HAS_POSINF)

    def test_torch_rejects_non_unit_inner_stride_and_3d(self, tokenrace):
        torch = self.torch
        s = tokenrace.Sampler(0)
        with pytest.raises(ValueError, match="logits"):
            s.draw(torch.zeros(4, 20)[:, ::2])
        with pytest.raises(ValueError, match="logits"):
            s.draw(torch.zeros(2, 3, 4))
        with pytest.raises(ValueError, match="logits"):
            s.draw(torch.zeros(2, 3, dtype=torch.float64))

    def test_torch_per_row_arguments_and_noise(self, tokenrace, rng):
        torch = self.torch
        s = tokenrace.Sampler(50)
        x = torch.from_numpy(rng.standard_normal((3, 50)).astype(np.float32))
        e = torch.from_numpy(rng.exponential(size=(3, 50)).astype(np.float32))
        out = s.draw(x, temperature=torch.tensor([0.0, 1.0, 1.0]), noise=e)
        ref = np.argmax(x.numpy() - np.log(e.numpy()), axis=1)
        assert out[0] == np.argmax(x.numpy()[0]) and out[1] == ref[1] and out[2] == ref[2]


def _special_rows(rng, rows, vocab, dtype):
    """Rows with ties, NaN, +inf, -inf and rows with nothing finite: every flag a greedy row gets."""
    x = tie_heavy_logits(rng, rows, vocab, np.float32)
    x[1::7, rng.integers(0, vocab, 3)] = np.nan
    x[2::7, rng.integers(0, vocab, 2)] = np.inf
    x[3::7] = -np.inf
    x[4::7] = np.nan
    x[5::7, ::2] = -np.inf
    return x.astype(dtype)


@pytest.fixture
def greedy_calls(tokenrace, monkeypatch):
    """Counts the calls of the plain greedy entry (tokenrace_draw_greedy) of the binding."""
    from tokenrace import _greedy

    real = _greedy._entry if _greedy._entry is not None else _greedy._load()
    if not real:
        pytest.skip("the library has no tokenrace_draw_greedy")
    calls = []

    def spy(*args):
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(_greedy, "_entry", spy)
    return calls


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("rows, vocab", [(1, 1), (1, 163840), (8, 32000), (37, 4099)])
def test_the_plain_greedy_call_is_the_general_paths_draw(tokenrace, rng, greedy_calls, dtype, rows, vocab):
    """temperature=0 and nothing else takes tokenrace_draw_greedy; per-row temperatures of 0
    take the general batch: the same tokens and flags."""
    x = _special_rows(rng, rows, vocab, dtype)
    s = tokenrace.Sampler(vocab, threads=2)
    tokens, flags = s.draw(x, temperature=0, return_flags=True)
    assert len(greedy_calls) == 1
    want_tokens, want_flags = s.draw(x, temperature=np.zeros(rows, np.float32), return_flags=True)
    assert len(greedy_calls) == 1
    np.testing.assert_array_equal(tokens, want_tokens)
    np.testing.assert_array_equal(flags, want_flags)
    assert tokens.dtype == np.int32 and flags.dtype == np.uint32
    np.testing.assert_array_equal(s.draw(x, temperature=0.0), want_tokens)
    assert len(greedy_calls) == 2
    finite = np.isfinite(x.astype(np.float32)).any(axis=1) | np.isposinf(x.astype(np.float32)).any(axis=1)
    np.testing.assert_array_equal(tokens[finite], np.argmax(np.nan_to_num(x.astype(np.float32), nan=-np.inf),
                                                            axis=1)[finite])
    assert (tokens[~finite] == 0).all() and (flags[~finite] & tokenrace.FLAG_EMPTY).all()
    st = s.stats()
    assert st["calls"] == 3 and st["greedy_rows"] == 3 * rows


def test_other_greedy_calls_take_the_general_path(tokenrace, rng, greedy_calls):
    """Anything but a scalar 0 with a C-contiguous numpy array and no other argument goes the
    general way, with its own rules (the same tokens)."""
    x = tie_heavy_logits(rng, 6, 100, np.float32)
    want = np.argmax(x, axis=1)
    s = tokenrace.Sampler(100)
    for tokens in (s.draw(x, temperature=np.float32(0)), s.draw(x, temperature=[0] * 6), s.draw(x[::2], temperature=0),
                   s.draw(x, temperature=0, top_k=5), s.draw(x, temperature=0, seeds=3),
                   s.draw(x, temperature=0, mirostat_mu_out=np.zeros(6, np.float32))):
        np.testing.assert_array_equal(tokens, want[:len(tokens)] if len(tokens) == 6 else want[::2])
    assert greedy_calls == []
    # Where temperature 0 is not greedy (greedy_below=0), it never goes the greedy way.
    flags = tokenrace.Sampler(100, greedy_below=0).draw(x, temperature=0, return_flags=True)[1]
    assert greedy_calls == [] and not (flags & tokenrace.FLAG_GREEDY).any()


def test_the_plain_greedy_call_keeps_the_general_errors(tokenrace, rng, greedy_calls):
    """Calls the library would refuse go the general way: the same messages as ever."""
    s = tokenrace.Sampler(100, max_rows=4)
    with pytest.raises(ValueError, match=r"tokenrace_draw: batch\.rows: 5 exceeds the sampler's max_rows 4"):
        s.draw(np.zeros((5, 100), np.float32), temperature=0)
    with pytest.raises(ValueError, match=r"tokenrace_draw: batch\.vocab: 99 differs"):
        s.draw(np.zeros((2, 99), np.float32), temperature=0)
    assert s.draw(np.zeros((0, 100), np.float32), temperature=0).shape == (0,)  # no rows: nothing drawn
    assert greedy_calls == []
    s.close()
    with pytest.raises(tokenrace.ClosedError):
        s.draw(np.zeros((1, 100), np.float32), temperature=0)


def test_a_library_without_the_greedy_entry_draws_through_the_batch(tokenrace, rng, monkeypatch):
    from tokenrace import _greedy

    monkeypatch.setattr(_greedy, "_entry", False)
    x = tie_heavy_logits(rng, 9, 300, np.float32)
    np.testing.assert_array_equal(tokenrace.Sampler(300).draw(x, temperature=0), np.argmax(x, axis=1))
