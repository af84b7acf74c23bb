"""The torch path of the binding, exercised without torch: a stand-in ``torch`` module whose
tensors wrap numpy arrays exposes exactly the attributes the binding may use (data_ptr, stride
in elements, dtype, device.type, layout, dim, shape, element_size, detach, float, numpy).
The real-torch tests in test_greedy.py run where torch is installed."""

import sys
import types

import numpy as np
import pytest


def make_fake_torch():
    torch = types.ModuleType("torch")

    class DType:
        is_floating_point, is_complex = True, False

        def __init__(self, name):
            self.name = name

        def __repr__(self):
            return f"torch.{self.name}"

    torch.float32, torch.float16, torch.bfloat16, torch.float64 = (
        DType(n) for n in ("float32", "float16", "bfloat16", "float64"))
    torch.strided, torch.sparse_coo = "strided", "sparse_coo"
    np_of = {"float32": np.float32, "float16": np.float16, "float64": np.float64}

    class Tensor:
        def __init__(self, arr, dtype, device="cpu", layout="strided"):
            self._a, self.dtype, self.layout = arr, dtype, layout
            self.device = types.SimpleNamespace(type=device)

        shape = property(lambda self: self._a.shape)

        def data_ptr(self):
            return self._a.ctypes.data

        def stride(self):
            return tuple(s // self._a.itemsize for s in self._a.strides)

        def dim(self):
            return self._a.ndim

        def element_size(self):
            return self._a.itemsize

        def is_neg(self):
            return False

        def is_conj(self):
            return False

        def detach(self):
            return self

        def float(self):
            return Tensor(self._a.astype(np.float32), torch.float32)

        def numpy(self):
            return self._a

        def __getitem__(self, idx):
            return Tensor(self._a[idx], self.dtype, self.device.type, self.layout)

    Tensor.__module__ = "torch"
    torch.Tensor = Tensor
    torch.tensor = lambda a, dtype=None: Tensor(np.asarray(a, np.float32), torch.float32)
    torch.from_numpy = lambda a: Tensor(a, getattr(torch, a.dtype.name))
    torch.np_of = np_of
    return torch


@pytest.fixture
def fake_torch(monkeypatch):
    if "torch" in sys.modules and not isinstance(sys.modules["torch"], types.ModuleType):
        pytest.skip("unexpected torch module")
    torch = make_fake_torch()
    monkeypatch.setitem(sys.modules, "torch", torch)
    return torch


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_tensor_views_are_read_in_place(tokenrace, rng, fake_torch, dtype):
    base = np.full((12, 300), np.inf, dtype)
    base[:, 10:200] = rng.integers(-20, 20, size=(12, 190))
    t = fake_torch.from_numpy(base)[::2, 10:200]
    from tokenrace import _arrays

    v = _arrays.rows_view(t)
    assert v.ptr == base.ctypes.data + 10 * base.itemsize and v.row_stride == 600 and v.vocab == 190
    tokens, flags = tokenrace.Sampler(190).draw(t, temperature=0, return_flags=True)
    np.testing.assert_array_equal(tokens, np.argmax(base[::2, 10:200], axis=1))
    assert not np.any(flags & tokenrace.FLAG_HAS_POSINF)


def test_tensor_rejections_name_the_argument(tokenrace, fake_torch):
    s = tokenrace.Sampler(0)
    T = fake_torch.Tensor
    cases = [
        (T(np.zeros((4, 20), np.float32), fake_torch.float32, device="cuda"), "cpu"),
        (T(np.zeros((4, 20), np.float32), fake_torch.float32, layout="sparse_coo"), "layout"),
        (T(np.zeros((4, 20), np.float64), fake_torch.float64), "dtype"),
        (T(np.zeros((4, 20), np.float32), fake_torch.float32)[:, ::2], "contiguous"),
        (T(np.zeros((2, 3, 4), np.float32), fake_torch.float32), "3-D"),
    ]
    for tensor, what in cases:
        with pytest.raises(ValueError, match="logits") as e:
            s.draw(tensor)
        assert what in str(e.value)
    x = np.zeros((2, 5), np.float32)
    with pytest.raises(ValueError, match="noise"):
        s.draw(x, noise=T(np.ones((2, 5), np.float32), fake_torch.float32, device="cuda"))
    with pytest.raises(ValueError, match="temperature"):
        s.draw(x, temperature=T(np.ones(2, np.float32), fake_torch.float32, device="cuda"))


def test_tensor_per_row_arguments(tokenrace, rng, fake_torch):
    x = rng.standard_normal((3, 50)).astype(np.float32)
    e = rng.exponential(size=(3, 50)).astype(np.float32)
    s = tokenrace.Sampler(50)
    out = s.draw(fake_torch.from_numpy(x), temperature=fake_torch.tensor([0.0, 1.0, 1.0]),
                 noise=fake_torch.from_numpy(e))
    ref = np.argmax(x - np.log(e), axis=1)
    assert out.tolist() == [np.argmax(x[0]), ref[1], ref[2]]
