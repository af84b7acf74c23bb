"""The torch path of the binding and ``tokenrace.torch``, exercised without torch: a stand-in
``torch`` module whose tensors wrap numpy arrays exposes exactly the attributes the binding may
use (data_ptr, stride in elements, dtype, device.type, layout, dim, shape, element_size, detach,
float, numpy, item), plus what ``tokenrace.torch`` uses: ``nn.Module``, ``Generator`` and
``randint(..., generator=)`` (a numpy stream that counts its draws), ``from_numpy``, int and
bool dtypes (and ``tolist``/``__array__`` to read results in tests).
What the stand-in cannot show (real zero-copy bf16 tensors, torch's own generators and
``log_softmax``, the distribution against torch's arithmetic) is tested in test_torch.py and
test_greedy.py where torch is installed."""

import sys
import types

import numpy as np
import pytest


def make_fake_torch():
    torch = types.ModuleType("torch")

    class DType:
        is_complex = False

        def __init__(self, name, floating=True):
            self.name, self.is_floating_point = name, floating

        def __repr__(self):
            return f"torch.{self.name}"

    torch.float32, torch.float16, torch.bfloat16, torch.float64 = (
        DType(n) for n in ("float32", "float16", "bfloat16", "float64"))
    torch.int32, torch.int64 = DType("int32", False), DType("int64", False)
    torch.bool = DType("bool", False)
    torch.long = torch.int64
    torch.strided, torch.sparse_coo = "strided", "sparse_coo"
    np_of = {"float32": np.float32, "float16": np.float16, "float64": np.float64,
             "int32": np.int32, "int64": np.int64, "bool": np.bool_}

    class Tensor:
        def __init__(self, arr, dtype, device="cpu", layout="strided"):
            self._a, self.dtype, self.layout = arr, dtype, layout
            self.device = types.SimpleNamespace(type=device)

        shape = property(lambda self: self._a.shape)

        def data_ptr(self):
            return self._a.ctypes.data

        def stride(self, dim=None):
            strides = tuple(s // self._a.itemsize for s in self._a.strides)
            return strides if dim is None else strides[dim]

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

        def item(self):
            return self._a.item()

        def tolist(self):
            return self._a.tolist()

        def __array__(self, dtype=None, copy=None):
            return self._a if dtype is None else self._a.astype(dtype)

        def __getitem__(self, idx):
            return Tensor(self._a[idx], self.dtype, self.device.type, self.layout)

    class Generator:
        """A CPU generator: a numpy stream; ``draws`` counts the values taken from it."""

        def __init__(self, device="cpu"):
            self.device = types.SimpleNamespace(type=device)
            self.draws = 0
            self.manual_seed(0)

        def manual_seed(self, seed):
            self._rng = np.random.default_rng(seed)
            return self

        def get_state(self):
            """A copy of the whole state, as torch's (a byte tensor of the mt19937 state): the
            stream's position and the count of draws."""
            return (self._rng.bit_generator.state, self.draws)

        def set_state(self, state):
            self._rng.bit_generator.state, self.draws = state

    def randint(low, high, size, generator=None, dtype=None):
        gen = generator or torch.default_generator
        if gen.device.type != "cpu":
            raise RuntimeError("Expected a 'cpu' device type for generator")
        gen.draws += int(np.prod(size))
        return Tensor(gen._rng.integers(low, high, size=size, dtype=np.int64), torch.int64)

    class Module:
        """nn.Module's calling convention: ``module(...)`` is ``module.forward(...)``."""

        def __call__(self, *args, **kwargs):
            return self.forward(*args, **kwargs)

    Tensor.__module__ = "torch"
    torch.Tensor, torch.Generator, torch.randint = Tensor, Generator, randint
    torch.default_generator = Generator()
    torch.nn = types.SimpleNamespace(Module=Module)
    torch.tensor = lambda a, dtype=None: Tensor(np.asarray(a, np_of[(dtype or torch.float32).name]),
                                                dtype or torch.float32)
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
    assert isinstance(tokens, fake_torch.Tensor) and isinstance(flags, fake_torch.Tensor)  # torch in, torch out
    np.testing.assert_array_equal(tokens, np.argmax(base[::2, 10:200], axis=1))
    assert not np.any(np.asarray(flags) & tokenrace.FLAG_HAS_POSINF)


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


# -- tokenrace.torch on the stand-in ------------------------------------------------------------


@pytest.fixture
def tt(tokenrace, fake_torch):
    """``tokenrace.torch`` imported against the stand-in (and forgotten afterwards, so that a real
    torch, where installed, gets a fresh import)."""
    import importlib

    sys.modules.pop("tokenrace.torch", None)
    module = importlib.import_module("tokenrace.torch")
    yield module
    sys.modules.pop("tokenrace.torch", None)
    if getattr(tokenrace, "torch", None) is module:
        delattr(tokenrace, "torch")


def test_tokenrace_torch_names_torch_when_it_is_missing(tokenrace, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # what `import torch` sees without torch
    monkeypatch.delitem(sys.modules, "tokenrace.torch", raising=False)
    with pytest.raises(ImportError, match="tokenrace.torch needs PyTorch.*'torch' package is not installed"):
        import tokenrace.torch  # noqa: F401
    sys.modules.pop("tokenrace.torch", None)


def test_importing_tokenrace_does_not_import_torch():
    from conftest import run_python

    assert run_python("""
        import json, sys
        import numpy as np
        import tokenrace
        tokenrace.Sampler(8).draw(np.zeros((2, 8), np.float32), temperature=0.5, top_k=3)
        print(json.dumps("torch" in sys.modules))
    """) is False


def _logits(fake_torch, rng, rows, vocab):
    return fake_torch.from_numpy((rng.standard_normal((rows, vocab)) * 2).astype(np.float32))


def _generators(fake_torch, seeds):
    return {row: fake_torch.Generator().manual_seed(seed) for row, seed in seeds.items()}


def test_forward_native_returns_int64_tokens_and_no_logits(tt, fake_torch, rng):
    x = _logits(fake_torch, rng, 5, 40)
    sampler = tt.TopKTopPSampler()
    for call in (sampler.forward_native, sampler.forward_cpu, sampler.forward, sampler):
        tokens, processed = call(x, {}, None, None)
        assert processed is None
        assert tokens.dtype is fake_torch.int64 and tuple(tokens.shape) == (5,)
        assert ((tokens.numpy() >= 0) & (tokens.numpy() < 40)).all()


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_out_receives_the_tokens(tt, fake_torch, rng, dtype):
    x = _logits(fake_torch, rng, 4, 30)
    out = fake_torch.from_numpy(np.full(4, -1, dtype))
    gens = _generators(fake_torch, {r: 7 + r for r in range(4)})
    got, _ = tt.TopKTopPSampler().forward_native(x, gens, None, None, out=out)
    assert got is out and ((out.numpy() >= 0) & (out.numpy() < 30)).all()
    again, _ = tt.TopKTopPSampler().forward_native(x, _generators(fake_torch, {r: 7 + r for r in range(4)}),
                                                   None, None)
    np.testing.assert_array_equal(out.numpy(), again.numpy())
    for bad, what in [(fake_torch.from_numpy(np.zeros(4, np.float32)), "dtype"),
                      (fake_torch.from_numpy(np.zeros(3, np.int64)), "shape")]:
        with pytest.raises(ValueError, match=f"out: has {what}"):
            tt.TopKTopPSampler().forward_native(x, {}, None, None, out=bad)


def test_a_generator_gives_one_seed_per_step_as_vllms_cpu_path(tokenrace, tt, fake_torch, rng):
    """Row i's token is tokenrace's draw seeded with the one value vLLM's forward_cpu takes from
    the row's generator (torch.randint(0, 2**31, (1,), generator=gen)), and each step takes
    exactly one value."""
    x = _logits(fake_torch, rng, 6, 50)
    gens = _generators(fake_torch, {1: 11, 4: 12})
    twins = _generators(fake_torch, {1: 11, 4: 12})
    sampler = tt.TopKTopPSampler()
    for _step in range(3):
        tokens, _ = sampler.forward_native(x, gens, None, None)
        for row, twin in twins.items():
            seed = fake_torch.randint(0, 2**31, (1,), generator=twin, dtype=fake_torch.long).item()
            want = tokenrace.Sampler(50).draw(x.numpy()[row], seeds=seed)
            assert tokens.numpy()[row] == want[0]
            assert gens[row].draws == twin.draws
    assert [g.draws for g in gens.values()] == [3, 3]


def test_a_seeded_row_ignores_its_batch_mates(tt, fake_torch, rng):
    x = _logits(fake_torch, rng, 8, 64).numpy()
    sampler = tt.TopKTopPSampler()
    alone, _ = sampler.forward_native(fake_torch.from_numpy(x[3:4].copy()),
                                      _generators(fake_torch, {0: 99}), None, None)
    other = x.copy()
    other[[0, 1, 2, 5, 6, 7]] = rng.standard_normal((6, 64)).astype(np.float32)
    for batch in (x, other):
        mixed, _ = sampler.forward_native(fake_torch.from_numpy(batch), _generators(fake_torch, {3: 99, 6: 5}),
                                          None, None)
        assert mixed.numpy()[3] == alone.numpy()[0]


def test_k_and_p_off_values_and_a_k_of_one(tt, fake_torch, rng):
    x = _logits(fake_torch, rng, 4, 40)
    sampler = tt.TopKTopPSampler()

    def run(k, p):
        gens = _generators(fake_torch, {r: 3 * r for r in range(4)})
        return sampler.forward_native(x, gens, k, p)[0].numpy()

    plain = run(None, None)
    for k in (np.full(4, 40, np.int32), np.full(4, 1000, np.int64), np.zeros(4, np.int32), np.full(4, -1, np.int64)):
        np.testing.assert_array_equal(run(fake_torch.from_numpy(k), None), plain)
    np.testing.assert_array_equal(run(None, fake_torch.from_numpy(np.ones(4, np.float32))), plain)
    k1 = fake_torch.from_numpy(np.ones(4, np.int32))
    np.testing.assert_array_equal(run(k1, None), np.argmax(x.numpy(), axis=1))
    p_tiny = fake_torch.from_numpy(np.full(4, 1e-6, np.float32))
    np.testing.assert_array_equal(run(None, p_tiny), np.argmax(x.numpy(), axis=1))


@pytest.mark.parametrize("kwargs,message", [
    ({"use_fp64_gumbel": True}, "use_fp64_gumbel=True is not supported.*32-bit uniforms"),
    ({"logprobs_mode": "processed_logits"}, "processed_logits.*not supported.*ties"),
    ({"logprobs_mode": "processed_logprobs"}, "processed_logprobs.*not supported"),
    ({"logprobs_mode": "logits"}, "logprobs_mode: 'logits' is not one of"),
    ({"seed": 3, "sampler": "made below"}, "either sampler or its settings"),
])
def test_what_the_drop_in_refuses(tokenrace, tt, kwargs, message):
    if kwargs.get("sampler"):
        kwargs["sampler"] = tokenrace.Sampler(0)
    with pytest.raises(ValueError, match=message):
        tt.TopKTopPSampler(**kwargs)


def test_the_drop_in_keeps_the_raw_modes_and_a_given_sampler(tokenrace, tt):
    shared = tokenrace.Sampler(0, seed=4)
    for mode in ("raw_logprobs", "raw_logits"):
        s = tt.TopKTopPSampler(logprobs_mode=mode, sampler=shared)
        assert s.logprobs_mode == mode and s.sampler is shared and s.use_fp64_gumbel is False
    assert tt.TopKTopPSampler(threads=1, seed=5).sampler.seed == 5


def test_bad_inputs_are_refused(tt, fake_torch, rng):
    T = fake_torch.Tensor
    sampler = tt.TopKTopPSampler()
    cases = [
        (T(np.zeros((2, 8), np.float32), fake_torch.float32, device="cuda"), {},
         r"on device .*cuda.*pass logits.cpu\(\)"),
        (T(np.zeros((2, 8), np.float64), fake_torch.float64), {}, "dtype torch.float64 is not supported"),
        (T(np.zeros((2, 2, 8), np.float32), fake_torch.float32), {}, "2-D"),
        (T(np.zeros((2, 8), np.float32), fake_torch.float32), {5: fake_torch.Generator()}, "row 5 is outside"),
        (T(np.zeros((2, 8), np.float32), fake_torch.float32), {0: fake_torch.Generator("cuda")}, "CPU generators"),
    ]
    for logits, gens, message in cases:
        with pytest.raises(ValueError, match=message):
            sampler.forward_native(logits, gens, None, None)
    good = fake_torch.Generator()
    with pytest.raises(ValueError, match="CPU generators"):
        sampler.forward_native(cases[3][0], {0: good, 1: fake_torch.Generator("cuda")}, None, None)
    assert good.draws == 0, "a refused call advanced a generator"
    with pytest.raises(TypeError, match="torch.Tensor"):
        sampler.forward_native(np.zeros((2, 8), np.float32), {}, None, None)


def test_sample_greedy_rows_temperature_and_seeds(tokenrace, tt, fake_torch, rng):
    x = _logits(fake_torch, rng, 6, 80)
    temps = fake_torch.from_numpy(np.array([0, 0.7, 0, 1.3, 1.0, 0.5], np.float32))
    seeds = fake_torch.from_numpy(np.arange(6, dtype=np.int64) + 40)
    positions = fake_torch.from_numpy(np.full(6, 9, np.int64))
    ids = tt.sample(x, temps, seeds=seeds, positions=positions, top_k=fake_torch.from_numpy(np.full(6, 20, np.int32)))
    assert ids.dtype is fake_torch.int64
    want = tokenrace.Sampler(80).draw(x.numpy(), temperature=temps.numpy(), seeds=seeds.numpy(),
                                      offsets=9, top_k=20)
    np.testing.assert_array_equal(ids.numpy(), want)
    greedy = np.argmax(x.numpy(), axis=1)
    assert ids.numpy()[0] == greedy[0] and ids.numpy()[2] == greedy[2]


def test_sample_logprobs_triple(tt, fake_torch, rng):
    from reference import log_softmax64

    x = _logits(fake_torch, rng, 5, 60)
    temps = np.array([0, 0.8, 1.0, 2.0, 0.3], np.float32)
    ids, lp = tt.sample(x, fake_torch.from_numpy(temps), logprobs=4, min_p=0.01)
    assert isinstance(lp, tt.LogprobsTensors)
    assert lp.logprob_token_ids.dtype is fake_torch.int32 and tuple(lp.logprob_token_ids.shape) == (5, 5)
    assert lp.logprobs.dtype is fake_torch.float32 and tuple(lp.logprobs.shape) == (5, 5)
    assert lp.selected_token_ranks.dtype is fake_torch.int64 and tuple(lp.selected_token_ranks.shape) == (5,)
    for r in range(5):
        ref = log_softmax64(x.numpy()[r])  # raw: before temperature
        order = np.argsort(-ref, kind="stable")
        row_ids, row_lp = lp.logprob_token_ids.numpy()[r], lp.logprobs.numpy()[r]
        assert row_ids[0] == ids.numpy()[r]
        np.testing.assert_array_equal(row_ids[1:], order[:4])
        np.testing.assert_allclose(row_lp, ref[row_ids], atol=1e-5)
        assert lp.selected_token_ranks.numpy()[r] == (ref >= ref[row_ids[0]]).sum()
    _, whole = tt.sample(x, 1.0, logprobs=-1)
    assert tuple(whole.logprobs.shape) == (5, 61)
    _, none = tt.sample(x, 1.0, logprobs=0)
    assert tuple(none.logprob_token_ids.shape) == (5, 1)


def test_sample_refusals(tt, fake_torch, rng):
    x = _logits(fake_torch, rng, 2, 10)
    with pytest.raises(ValueError, match="generators or seeds, not both"):
        tt.sample(x, 1.0, generators={0: fake_torch.Generator()}, seeds=[1, 2])
    with pytest.raises(ValueError, match="positions: needs seeds"):
        tt.sample(x, 1.0, positions=[1, 2])
    with pytest.raises(ValueError, match=r"logprobs: 11 is not in \[0, 10\]"):
        tt.sample(x, 1.0, logprobs=11)
    with pytest.raises(TypeError, match="logprobs"):
        tt.sample(x, 1.0, logprobs=True)
    with pytest.raises(ValueError, match=r"seeds\[1\]: -3 is negative"):
        tt.sample(x, 1.0, seeds=fake_torch.from_numpy(np.array([1, -3], np.int64)))


def test_forward_native_draws_vllms_filtered_distribution(tokenrace, tt, fake_torch, rng):
    """Chi-square fit of 40000 draws with top-k 12 and top-p 0.8 to vLLM's filtered
    probabilities (its PyTorch rule, in float64); the counts must also fail the fits to the
    unfiltered and to the top-k-only distributions, so a sampler that filters wrongly fails."""
    from reference import chi_square, vllm_kept_probs, wilson_hilferty

    vocab, n = 32, 40000
    row = (rng.standard_normal(vocab) * 1.5).astype(np.float32)
    s = tt.TopKTopPSampler(sampler=tokenrace.Sampler(0, max_rows=n, seed=7))
    k = fake_torch.from_numpy(np.full(n, 12, np.int32))
    p = fake_torch.from_numpy(np.full(n, 0.8, np.float32))
    sampled, _ = s.forward_native(fake_torch.from_numpy(np.repeat(row[None, :], n, axis=0)), {}, k, p)
    counts = np.bincount(sampled.numpy(), minlength=vocab).astype(np.float64)
    want = vllm_kept_probs(row, 12, 0.8)
    support = want > 0
    assert counts[~support].sum() == 0
    critical = wilson_hilferty(int(support.sum()) - 1, 4.0)
    assert chi_square(counts[support], want[support]) < critical
    softmax = np.exp(row - row.max()) / np.exp(row - row.max()).sum()
    top_k_only = vllm_kept_probs(row, 12, 1.0)
    assert chi_square(counts, softmax) > 10 * critical
    assert chi_square(counts[top_k_only > 0], top_k_only[top_k_only > 0]) > 10 * critical


# -- tokenrace.torch.rejection_sample on the stand-in ---------------------------------------------


def _spec_batch(fake_torch, rng, counts, vocab, peak=4.0):
    """Target logits for ``counts`` (each request's draft rows, then its bonus row) and drafts that
    are often the target's argmax (so that some are accepted)."""
    rows = sum(counts) + len(counts)
    x = (rng.standard_normal((rows, vocab)) * 0.5).astype(np.float32)
    x[np.arange(rows), rng.integers(0, 3, rows)] += peak
    drafts, row = [], 0
    for c in counts:
        for j in range(c):
            drafts.append(int(np.argmax(x[row + j])) if rng.random() < 0.7 else int(rng.integers(0, vocab)))
        row += c + 1
    return fake_torch.from_numpy(x), fake_torch.from_numpy(np.array(drafts, np.int32))


def test_rejection_sample_is_sampler_verify_shaped_as_vllm(tokenrace, tt, fake_torch, rng):
    counts, vocab = [2, 0, 3, 1], 60
    x, drafts = _spec_batch(fake_torch, rng, counts, vocab)
    temps = fake_torch.from_numpy(np.array([0.8, 0.0, 1.2, 0.6], np.float32))
    seeds = fake_torch.from_numpy(np.array([11, 12, 13, 14], np.int64))
    positions = fake_torch.from_numpy(np.array([5, 0, 9, 2], np.int64))
    top_k = fake_torch.from_numpy(np.full(4, 20, np.int32))
    out = tt.rejection_sample(x, drafts, counts, temps, seeds=seeds, positions=positions, top_k=top_k,
                              sampler=tokenrace.Sampler(vocab))
    assert out.dtype is fake_torch.int32 and tuple(out.shape) == (4, 4)
    want = tokenrace.Sampler(vocab).verify(x.numpy(), drafts.numpy(), counts, temperature=temps.numpy(),
                                           seeds=seeds.numpy(), offsets=positions.numpy(), top_k=20)
    np.testing.assert_array_equal(out.numpy(), want.tokens)
    for i, c in enumerate(want.counts):
        assert (out.numpy()[i, c:] == tt.PLACEHOLDER_TOKEN_ID).all() and (out.numpy()[i, :c] >= 0).all()
    # num_draft_tokens as a tensor, a wider output, draft probabilities.
    q = np.full((sum(counts), vocab), 1.0 / vocab, np.float32)
    wide = tt.rejection_sample(x, drafts, fake_torch.from_numpy(np.array(counts, np.int64)), temps, seeds=seeds,
                               positions=positions, draft_probs=fake_torch.from_numpy(q), max_spec_len=6)
    assert tuple(wide.shape) == (4, 7) and (wide.numpy()[:, 4:] == -1).all()
    want_q = tokenrace.Sampler(vocab).verify(x.numpy(), drafts.numpy(), counts, temperature=temps.numpy(),
                                             seeds=seeds.numpy(), offsets=positions.numpy(), draft_probs=q)
    np.testing.assert_array_equal(wide.numpy()[:, :4], want_q.tokens)


def test_rejection_sample_reads_bfloat16_in_place(tokenrace, tt, fake_torch, rng):
    counts, vocab = [3, 1, 0], 40
    x, drafts = _spec_batch(fake_torch, rng, counts, vocab)
    b = x.numpy().view(np.uint32)
    bits = ((b.astype(np.uint64) + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)
    rounded = (bits.astype(np.uint32) << 16).view(np.float32)
    t = fake_torch.Tensor(bits, fake_torch.bfloat16)
    got = tt.rejection_sample(t, drafts, counts, 0.9, seeds=[1, 2, 3], sampler=tokenrace.Sampler(vocab))
    want = tokenrace.Sampler(vocab).verify(rounded, drafts.numpy(), counts, temperature=0.9, seeds=[1, 2, 3])
    np.testing.assert_array_equal(got.numpy(), want.tokens)


def test_rejection_sample_takes_one_seed_per_generator_and_call(tokenrace, tt, fake_torch, rng):
    counts, vocab = [2, 1, 2], 50
    x, drafts = _spec_batch(fake_torch, rng, counts, vocab)
    gens = _generators(fake_torch, {0: 21, 2: 22})
    twins = _generators(fake_torch, {0: 21, 2: 22})
    s = tokenrace.Sampler(vocab)
    for _step in range(3):
        out = tt.rejection_sample(x, drafts, counts, 1.0, generators=gens, sampler=s)
        seeds = np.zeros(3, np.uint64)
        for req, twin in twins.items():
            seeds[req] = fake_torch.randint(0, 2**31, (1,), generator=twin, dtype=fake_torch.long).item()
        want = s.verify(x.numpy(), drafts.numpy(), counts, seeds=seeds, seeded=[True, False, True])
        for req in twins:
            np.testing.assert_array_equal(out.numpy()[req], want.tokens[req])
    assert [g.draws for g in gens.values()] == [3, 3]


def test_rejection_sample_refusals(tokenrace, tt, fake_torch, rng):
    counts = [1, 2]
    x, drafts = _spec_batch(fake_torch, rng, counts, 30)
    T = fake_torch.Tensor
    with pytest.raises(TypeError, match="target_logits: must be a torch.Tensor"):
        tt.rejection_sample(x.numpy(), drafts, counts, 1.0)
    with pytest.raises(ValueError, match=r"target_logits: is a tensor on device .*cuda"):
        tt.rejection_sample(T(x.numpy(), fake_torch.float32, device="cuda"), drafts, counts, 1.0)
    with pytest.raises(TypeError, match="temperature: is None"):
        tt.rejection_sample(x, drafts, counts, None)
    with pytest.raises(ValueError, match=r"num_draft_tokens\[1\]: -2 is negative"):
        tt.rejection_sample(x, drafts, [1, -2], 1.0)
    with pytest.raises(ValueError, match="generators or seeds, not both"):
        tt.rejection_sample(x, drafts, counts, 1.0, generators={0: fake_torch.Generator()}, seeds=[1, 2])
    with pytest.raises(ValueError, match="positions: needs seeds"):
        tt.rejection_sample(x, drafts, counts, 1.0, positions=[1, 2])
    good = fake_torch.Generator()
    with pytest.raises(ValueError, match="generators: request 5 is outside the batch of 2 requests"):
        tt.rejection_sample(x, drafts, counts, 1.0, generators={0: good, 5: fake_torch.Generator()})
    with pytest.raises(ValueError, match="max_spec_len: 1 is smaller than the largest draft count, 2"):
        tt.rejection_sample(x, drafts, counts, 1.0, generators={0: good}, max_spec_len=1)
    assert good.draws == 0, "a refused call advanced a generator"
    with pytest.raises(ValueError, match=r"draft_tokens: has 2 ids, draft_counts add up to 3"):
        tt.rejection_sample(x, drafts[:2], counts, 1.0)
    with pytest.raises(tokenrace.InvalidArgumentError, match=r"batch.draft_tokens\[0\]: request 0, draft 0"):
        tt.rejection_sample(x, fake_torch.from_numpy(np.array([30, 0, 0], np.int32)), counts, 1.0)


# -- a refused call leaves the generators as they were ---------------------------------------------


def _twin_generators(fake_torch, seeds):
    return _generators(fake_torch, seeds), _generators(fake_torch, seeds)


def _assert_twins(fake_torch, gens, twins):
    """Each generator is where its twin is: the same count of draws and the same next values."""
    for row in gens:
        assert gens[row].draws == twins[row].draws, f"generator {row} advanced by a refused call"
        a = fake_torch.randint(0, 2**31, (3,), generator=gens[row]).numpy()
        b = fake_torch.randint(0, 2**31, (3,), generator=twins[row]).numpy()
        np.testing.assert_array_equal(a, b)


def _sample_refusals(tokenrace, fake_torch, x):
    """``(keywords, exception, message)`` of ``sample`` refusals of every kind: checked by
    tokenrace.torch before the seeds are drawn, by the draw after, and by the library."""
    T = fake_torch.from_numpy
    return [
        (dict(logprobs=11), ValueError, r"logprobs: 11 is not in \[0, 10\]"),
        (dict(logprobs=True), TypeError, "logprobs"),
        (dict(out=T(np.zeros(2, np.float32))), ValueError, "out: has dtype"),
        (dict(out=T(np.zeros(3, np.int64))), ValueError, "out: has shape"),
        (dict(sampler="no"), TypeError, "sampler: must be a tokenrace.Sampler"),
        (dict(seeds=[1, 2]), ValueError, "generators or seeds, not both"),
        (dict(extra={5: fake_torch.Generator()}), ValueError, "row 5 is outside"),
        (dict(extra={1: fake_torch.Generator("cuda")}), ValueError, "CPU generators"),
        (dict(temperature=[1.0, 1.0, 1.0]), ValueError, "temperature: has 3 elements"),
        (dict(top_k=T(np.ones((2, 2), np.int32))), ValueError, "top_k: must be a scalar or 1-D"),
        (dict(logits=fake_torch.Tensor(x.numpy().astype(np.float64), fake_torch.float64)), ValueError,
         "dtype torch.float64 is not supported"),
        (dict(top_p=0.0), tokenrace.InvalidArgumentError, r"top_p\[0\]: 0 is not in \(0, 1\]"),
        (dict(min_p=[0.0, 2.0]), tokenrace.InvalidArgumentError, r"min_p\[1\]"),
        (dict(temperature=[1.0, float("nan")]), tokenrace.InvalidArgumentError, r"temperature\[1\]"),
        (dict(sampler=tokenrace.Sampler(11)), tokenrace.InvalidArgumentError, "vocab"),
        (dict(sampler=tokenrace.Sampler(0, max_rows=1)), tokenrace.InvalidArgumentError, "max_rows"),
    ]


@pytest.mark.parametrize("logprobs", [None, 3])
def test_a_refused_sample_leaves_the_generators_as_they_were(tokenrace, tt, fake_torch, rng, logprobs):
    x = _logits(fake_torch, rng, 2, 10)
    for kwargs, exc, message in _sample_refusals(tokenrace, fake_torch, x):
        if logprobs is not None and "logprobs" in kwargs:
            continue
        gens, twins = _twin_generators(fake_torch, {0: 5, 1: 6})
        kw = dict(kwargs)
        logits = kw.pop("logits", x)
        passed = {**gens, **kw.pop("extra", {})}
        kw.setdefault("logprobs", logprobs)
        with pytest.raises(exc, match=message):
            tt.sample(logits, kw.pop("temperature", 1.0), generators=passed, **kw)
        _assert_twins(fake_torch, gens, twins)
    # The retry of a refused batch draws what it would have drawn.
    gens, twins = _twin_generators(fake_torch, {0: 5, 1: 6})
    with pytest.raises(tokenrace.InvalidArgumentError):
        tt.sample(x, 1.0, generators=gens, top_p=0.0)
    np.testing.assert_array_equal(tt.sample(x, 1.0, generators=gens).numpy(),
                                  tt.sample(x, 1.0, generators=twins).numpy())


def test_a_refused_forward_native_leaves_the_generators_as_they_were(tokenrace, tt, fake_torch, rng):
    x = _logits(fake_torch, rng, 2, 10)
    T = fake_torch.from_numpy
    sampler = tt.TopKTopPSampler(sampler=tokenrace.Sampler(10))
    cases = [
        (dict(out=T(np.zeros(2, np.float32))), ValueError, "out: has dtype"),
        (dict(k=T(np.ones(3, np.int32))), ValueError, "top_k: has 3 elements"),
        (dict(p=T(np.zeros(2, np.float32))), tokenrace.InvalidArgumentError, r"top_p\[0\]"),
        (dict(logits=_logits(fake_torch, rng, 2, 12)), tokenrace.InvalidArgumentError, "vocab"),
    ]
    for kwargs, exc, message in cases:
        gens, twins = _twin_generators(fake_torch, {0: 8, 1: 9})
        kw = dict(kwargs)
        with pytest.raises(exc, match=message):
            sampler.forward_native(kw.pop("logits", x), gens, kw.pop("k", None), kw.pop("p", None), **kw)
        _assert_twins(fake_torch, gens, twins)


def _rejection_refusals(tokenrace, fake_torch, x, drafts, counts, vocab):
    T = fake_torch.from_numpy
    q_bad = np.full((sum(counts), vocab), 1.0 / vocab, np.float32)
    q_bad[1, 0] += 0.5
    return [
        (dict(num_draft_tokens=[1, -2]), ValueError, r"num_draft_tokens\[1\]: -2 is negative"),
        (dict(max_spec_len=1), ValueError, "max_spec_len: 1 is smaller"),
        (dict(max_spec_len=2.0), TypeError, "max_spec_len: must be an integer"),
        (dict(temperature=None), TypeError, "temperature: is None"),
        (dict(sampler="no"), TypeError, "sampler: must be a tokenrace.Sampler"),
        (dict(seeds=[1, 2]), ValueError, "generators or seeds, not both"),
        (dict(extra={2: fake_torch.Generator()}), ValueError, "request 2 is outside the batch of 2 requests"),
        (dict(draft_token_ids=drafts[:2]), ValueError, "draft_tokens: has 2 ids, draft_counts add up to 3"),
        (dict(draft_token_ids=T(np.array([0, -2, 0], np.int32))), ValueError,
         r"draft_tokens\[1\]: request 1, draft 0: -2 is not a token id"),
        (dict(draft_probs=T(np.zeros((2, vocab), np.float32))), ValueError, "draft_probs: has shape"),
        (dict(target_logits=T(x.numpy()[:4])), ValueError, "target_logits: has 4 rows"),
        (dict(top_k=T(np.ones(3, np.int32))), ValueError, "top_k: has 3 elements"),
        (dict(draft_token_ids=T(np.array([0, vocab, 0], np.int32))), tokenrace.InvalidArgumentError,
         rf"batch.draft_tokens\[1\]: request 1, draft 0: {vocab} is not a token id"),
        (dict(draft_probs=T(q_bad)), tokenrace.InvalidArgumentError, r"batch.draft_probs\[1\]"),
        (dict(top_p=[1.0, 1.5]), tokenrace.InvalidArgumentError, r"batch.top_p\[1\]"),
        (dict(temperature=[1.0, -1.0]), tokenrace.InvalidArgumentError, r"batch.temperature\[1\]"),
        (dict(sampler=tokenrace.Sampler(vocab + 1)), tokenrace.InvalidArgumentError, "vocab"),
        (dict(sampler=tokenrace.Sampler(0, max_rows=4)), tokenrace.InvalidArgumentError, "max_rows"),
    ]


def test_a_refused_rejection_sample_leaves_the_generators_as_they_were(tokenrace, tt, fake_torch, rng):
    counts, vocab = [1, 2], 30
    x, drafts = _spec_batch(fake_torch, rng, counts, vocab)
    for kwargs, exc, message in _rejection_refusals(tokenrace, fake_torch, x, drafts, counts, vocab):
        gens, twins = _twin_generators(fake_torch, {0: 31, 1: 32})
        kw = dict(kwargs)
        passed = {**gens, **kw.pop("extra", {})}
        args = [kw.pop("target_logits", x), kw.pop("draft_token_ids", drafts), kw.pop("num_draft_tokens", counts),
                kw.pop("temperature", 0.9)]
        with pytest.raises(exc, match=message):
            tt.rejection_sample(*args, generators=passed, **kw)
        _assert_twins(fake_torch, gens, twins)
    gens, twins = _twin_generators(fake_torch, {0: 31, 1: 32})
    with pytest.raises(tokenrace.InvalidArgumentError):
        tt.rejection_sample(x, fake_torch.from_numpy(np.array([0, vocab, 0], np.int32)), counts, 0.9, generators=gens)
    np.testing.assert_array_equal(tt.rejection_sample(x, drafts, counts, 0.9, generators=gens).numpy(),
                                  tt.rejection_sample(x, drafts, counts, 0.9, generators=twins).numpy())


def test_one_generator_for_two_rows_is_put_back_before_both(tokenrace, tt, fake_torch, rng):
    x = _logits(fake_torch, rng, 2, 10)
    shared, twin = fake_torch.Generator().manual_seed(4), fake_torch.Generator().manual_seed(4)
    with pytest.raises(tokenrace.InvalidArgumentError):
        tt.sample(x, 1.0, generators={0: shared, 1: shared}, top_p=0.0)
    _assert_twins(fake_torch, {0: shared}, {0: twin})


def test_a_generator_that_fails_mid_draw_puts_the_others_back(tokenrace, tt, fake_torch, rng):
    x = _logits(fake_torch, rng, 3, 10)
    gens, twins = _twin_generators(fake_torch, {0: 1, 2: 3})
    broken = fake_torch.Generator()
    broken._rng = None  # its draw raises
    with pytest.raises(AttributeError):
        tt.sample(x, 1.0, generators={0: gens[0], 1: broken, 2: gens[2]})
    _assert_twins(fake_torch, gens, twins)


# -- vLLM's placeholder draft id -------------------------------------------------------------------


@pytest.mark.parametrize("greedy", [True, False])
@pytest.mark.parametrize("with_q", [False, True])
def test_rejection_sample_rejects_the_placeholder_draft(tokenrace, tt, fake_torch, greedy, with_q):
    """vLLM's test_placeholder_draft_token_rejected_random, on tokenrace: drafts [1, 99, -1]
    against rows peaked at [1, 99, 7, 9]: the two real drafts are accepted, the -1 rejected, and
    the token there is drawn from the target row (its peak holds all the mass but e^-100)."""
    vocab = 100
    x = np.zeros((4, vocab), np.float32)
    x[np.arange(4), [1, vocab - 1, 7, 9]] = 100.0
    drafts = fake_torch.from_numpy(np.array([1, vocab - 1, tt.PLACEHOLDER_TOKEN_ID], np.int64))
    q = fake_torch.from_numpy(np.full((3, vocab), 1.0 / vocab, np.float32)) if with_q else None
    gens = _generators(fake_torch, {0: 0})
    out = tt.rejection_sample(fake_torch.from_numpy(x), drafts, [3], 0.0 if greedy else 1.0, draft_probs=q,
                              generators=gens, sampler=tokenrace.Sampler(vocab))
    assert out.numpy().tolist() == [[1, vocab - 1, 7, tt.PLACEHOLDER_TOKEN_ID]]


def test_rejection_sample_refuses_other_negative_drafts(tokenrace, tt, fake_torch, rng):
    x, drafts = _spec_batch(fake_torch, rng, [2], 20)
    with pytest.raises(ValueError, match=r"draft_tokens\[0\]: request 0, draft 0: -3 is not a token id; the only "
                                         r"negative draft id is -1 \(vLLM's PLACEHOLDER_TOKEN_ID"):
        tt.rejection_sample(x, fake_torch.from_numpy(np.array([-3, 0], np.int64)), [2], 1.0)


# -- draw_full(out=) overlapping the inputs, with tensors ---------------------------------------------


def test_an_out_tensor_overlapping_the_logits_is_refused(tokenrace, fake_torch, rng):
    """Tensors as numpy arrays: an out one row ahead of (or behind) the logits in one buffer, a
    numpy out under tensor logits and the other way round, and bfloat16 logits over the bytes of a
    float32 out, are refused naming both; an out beside the logits is fine."""
    rows, vocab = 3, 40
    s = tokenrace.Sampler(vocab)
    big = rng.standard_normal((rows + 1, vocab)).astype(np.float32)
    T = fake_torch.from_numpy
    want = s.draw_full(big[:rows].copy(), temperature=0.7, seeds=3, full_logprobs="processed").full_logprobs

    def refused(logits, out, name="logits", **kw):
        before = big.copy()
        with pytest.raises(ValueError, match=rf"out: overlaps {name}: out spans bytes"):
            s.draw_full(logits, temperature=0.7, seeds=3, full_logprobs="processed", out=out, **kw)
        np.testing.assert_array_equal(big, before)

    refused(T(big)[1:], T(big)[:-1])  # out one row ahead: it would write row r before row r + 1 is read
    refused(T(big)[:-1], T(big)[1:])
    refused(T(big)[:rows], big[:rows])  # tensor logits, numpy out
    refused(big[1:], T(big)[:rows])  # numpy logits, tensor out
    bf16 = fake_torch.Tensor(big.view(np.uint16)[:rows, :vocab], fake_torch.bfloat16)  # rows 2 * vocab apart
    refused(bf16, T(big)[1:])
    x = T(big[:rows].copy())
    out = T(np.zeros((rows, vocab), np.float32))
    with pytest.raises(ValueError, match=r"out: overlaps noise: out spans bytes"):
        s.draw_full(x, temperature=0.7, full_logprobs="raw", out=out, noise=out)
    with pytest.raises(ValueError, match=r"out: overlaps temperature: out spans bytes"):
        s.draw_full(x, temperature=out[0, :rows], full_logprobs="raw", out=out)
    buf = np.zeros((2 * rows, vocab), np.float32)
    buf[:rows] = big[:rows]
    r = s.draw_full(T(buf)[:rows], temperature=0.7, seeds=3, full_logprobs="processed", out=T(buf)[rows:])
    np.testing.assert_array_equal(buf[rows:], want)
    assert r.full_logprobs.data_ptr() == buf[rows:].ctypes.data
