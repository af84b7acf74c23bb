"""``tokenrace.torch.sample`` with the sampling step in vLLM V1's forms (``SamplingMetadata``:
padded histories, penalty tensors, ``allowed_token_ids_mask``, ``bad_words_token_ids``,
``logit_bias`` dicts), and ``Sampler.draw`` giving torch tensors back for torch input.

Every test runs on the stand-in torch of test_torch_fake.py and, where torch is installed, on
real torch as well. Each input is checked against the same seeded draw of ``Sampler.draw`` with
the library's own forms: the conversion is the only thing under test here (the step itself has
its float64 references in test_step.py)."""

import importlib
import sys

import numpy as np
import pytest

from test_torch_fake import make_fake_torch

VOCAB = 40
ROWS = 4
SEEDS = np.array([11, 12, 13, 14], np.uint64)


@pytest.fixture(params=["stand-in", "torch"])
def torch(request, monkeypatch):
    if request.param == "torch":
        module = pytest.importorskip("torch", reason="torch is not installed (the stand-in run covers the logic)")
    else:
        module = make_fake_torch()
        monkeypatch.setitem(sys.modules, "torch", module)
    return module


@pytest.fixture
def tt(tokenrace, torch):
    """``tokenrace.torch`` imported against this test's torch, and forgotten afterwards."""
    sys.modules.pop("tokenrace.torch", None)
    module = importlib.import_module("tokenrace.torch")
    yield module
    sys.modules.pop("tokenrace.torch", None)
    if getattr(tokenrace, "torch", None) is module:
        delattr(tokenrace, "torch")


@pytest.fixture
def x(rng):
    return (rng.standard_normal((ROWS, VOCAB)) * 2).astype(np.float32)


def tensor(torch, arr):
    return torch.from_numpy(np.ascontiguousarray(arr))


def padded(lists, width, pad=VOCAB):
    out = np.full((len(lists), width), pad, np.int64)
    for r, ids in enumerate(lists):
        out[r, :len(ids)] = ids
    return out


def expected(x, temperature=1.0, **step):
    """The tokens of the library's own forms: ``Sampler.draw`` on the numpy logits, seeded."""
    return np.asarray(tokenrace_module().Sampler(0).draw(x, temperature=temperature, seeds=SEEDS, **step))


def tokenrace_module():
    import tokenrace

    return tokenrace


def got(tt, torch, x, temperature=1.0, **kwargs):
    tokens = tt.sample(tensor(torch, x), temperature, seeds=SEEDS, **kwargs)
    assert isinstance(tokens, torch.Tensor) and tokens.dtype == torch.int64
    return np.asarray(tokens)


# -- torch in, torch out ------------------------------------------------------------------------


def test_sampler_draw_returns_tensors_for_tensors_and_arrays_for_arrays(tokenrace, torch, x):
    s = tokenrace.Sampler(0)
    t = tensor(torch, x)
    tokens = s.draw(t, temperature=0.5, seeds=SEEDS)
    assert isinstance(tokens, torch.Tensor) and tokens.dtype == torch.int32
    array = s.draw(x, temperature=0.5, seeds=SEEDS)
    assert type(array) is np.ndarray and array.tolist() == tokens.tolist()
    tokens, flags = s.draw(t, return_flags=True)
    assert isinstance(flags, torch.Tensor) and flags.dtype == torch.int32  # the uint32 bits
    r = s.draw_full(t, temperature=0.5, seeds=SEEDS, logprobs=2, ranks=True)
    for value in (r.tokens, r.flags, r.logprobs, r.ranks, r.topn_ids, r.topn_logprobs):
        assert isinstance(value, torch.Tensor)
    assert r.tokens.tolist() == array.tolist()
    out = tensor(torch, np.zeros((ROWS, VOCAB), np.float32))
    assert s.draw_full(t, full_logprobs="raw", out=out).full_logprobs is out
    assert type(s.draw_full(x, logprobs=1).topn_ids) is np.ndarray


def test_tensors_out_are_views_of_the_memory_written(tokenrace, torch, x):
    """A tensor result is ``torch.from_numpy`` of the array the call wrote: writing through its
    numpy view shows in the tensor (no copy between them)."""
    r = tokenrace.Sampler(0).draw_full(tensor(torch, x), logprobs=2)
    view = r.topn_ids.numpy()
    view[0, 0] = 12345
    assert int(r.topn_ids[0, 0].item()) == 12345
