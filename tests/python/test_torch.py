"""``tokenrace.torch`` against real torch: the vLLM drop-in (``TopKTopPSampler``) and the fused
``sample()`` step. Skipped where torch is not installed (test_torch_fake.py covers the logic
with a stand-in there). References are computed in float64 with numpy, as vLLM's rules read."""

import numpy as np
import pytest

from reference import chi_square, log_softmax64, vllm_kept_probs, wilson_hilferty

torch = pytest.importorskip("torch", reason="torch is not installed (tokenrace.torch needs it; "
                                            "test_torch_fake.py covers it with a stand-in)")


@pytest.fixture(scope="module")
def tt():
    import tokenrace.torch

    return tokenrace.torch


def logits(rng, rows, vocab, scale=2.0, dtype=torch.float32):
    return torch.from_numpy((rng.standard_normal((rows, vocab)) * scale).astype(np.float32)).to(dtype)


def generators(seeds):
    return {row: torch.Generator().manual_seed(seed) for row, seed in seeds.items()}


def test_the_drop_in_is_an_nn_module_with_vllms_methods(tt, rng):
    s = tt.TopKTopPSampler("raw_logprobs")
    assert isinstance(s, torch.nn.Module)
    x = logits(rng, 5, 40)
    for call in (s.forward_native, s.forward_cpu, s.forward, s):
        sampled, processed = call(x, {}, None, None)
        assert processed is None
        assert sampled.dtype == torch.int64 and sampled.shape == (5,) and sampled.device.type == "cpu"
        assert bool(((sampled >= 0) & (sampled < 40)).all())


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_out_is_written(tt, rng, dtype):
    x = logits(rng, 6, 30)
    out = torch.full((6,), -1, dtype=dtype)
    got, _ = tt.TopKTopPSampler().forward_native(x, generators({r: r for r in range(6)}), None, None, out=out)
    assert got is out and out.dtype == dtype
    want, _ = tt.TopKTopPSampler().forward_native(x, generators({r: r for r in range(6)}), None, None)
    assert out.tolist() == want.tolist()
    ids = torch.full((6,), -1, dtype=dtype)
    assert tt.sample(x, 0.0, out=ids) is ids and ids.tolist() == torch.argmax(x, dim=1).tolist()
    with pytest.raises(ValueError, match="out: has dtype"):
        tt.sample(x, 1.0, out=torch.zeros(6, dtype=torch.float32))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_logits_are_read_in_place_from_a_strided_view(tt, tokenrace, rng, dtype):
    """No copy of the logits: the binding hands the library the view's own pointer and row
    stride, and the values outside the view (huge) are never drawn."""
    from tokenrace import _arrays

    base = torch.full((8, 300), 1e4, dtype=dtype)
    # Distinct integers (exact in every dtype): no tie, so top-k 1 keeps exactly the argmax.
    inner = torch.from_numpy(np.stack([rng.permutation(200) - 100 for _ in range(4)]).astype(np.float32)).to(dtype)
    base[::2, 10:210] = inner
    view = base[::2, 10:210]
    v = _arrays.rows_view(view)
    assert v.ptr == view.data_ptr() == base.data_ptr() + 10 * base.element_size()
    assert (v.rows, v.vocab, v.row_stride) == (4, 200, 600)
    one = torch.ones(4, dtype=torch.int32)
    sampled, _ = tt.TopKTopPSampler().forward_native(view, {}, one, None)  # top-k 1: the argmax
    assert sampled.tolist() == np.argmax(inner.float().numpy(), axis=1).tolist()
    drawn, _ = tt.TopKTopPSampler().forward_native(view, {}, None, None)
    assert bool(((drawn >= 0) & (drawn < 200)).all())


def test_k_and_p_off_conventions(tt, rng):
    x = logits(rng, 4, 50)
    s = tt.TopKTopPSampler()

    def run(k, p):
        return s.forward_native(x, generators({r: 100 + r for r in range(4)}), k, p)[0].tolist()

    plain = run(None, None)
    for k in (torch.full((4,), 50, dtype=torch.int32), torch.full((4,), 70, dtype=torch.int64),
              torch.zeros(4, dtype=torch.int32), torch.full((4,), -1, dtype=torch.int64)):
        assert run(k, None) == plain
    assert run(None, torch.ones(4, dtype=torch.float32)) == plain
    argmax = torch.argmax(x, dim=1).tolist()
    assert run(torch.ones(4, dtype=torch.int32), None) == argmax
    assert run(None, torch.full((4,), 1e-7, dtype=torch.float32)) == argmax
    mixed_k = torch.tensor([1, 50, 1, 0], dtype=torch.int64)
    got = run(mixed_k, None)
    assert got[0] == argmax[0] and got[2] == argmax[2] and got[1] == plain[1] and got[3] == plain[3]


def test_a_generator_maps_to_one_seed_per_step(tt, tokenrace, rng):
    """Each seeded row's token is tokenrace's draw seeded with the single value vLLM's
    forward_cpu takes from the row's generator (torch.randint(0, 2**31, (1,), generator=gen)),
    and the generator ends each step exactly where that one draw leaves it."""
    x = logits(rng, 5, 64)
    gens = generators({0: 1, 3: 2})
    twins = generators({0: 1, 3: 2})
    s = tt.TopKTopPSampler()
    for _step in range(3):
        sampled, _ = s.forward_native(x, gens, None, None)
        for row, twin in twins.items():
            seed = int(torch.randint(0, 2**31, (1,), generator=twin, dtype=torch.long).item())
            want = tokenrace.Sampler(64).draw(x[row].numpy(), seeds=seed)
            assert sampled[row].item() == want[0]
            assert torch.equal(gens[row].get_state(), twin.get_state())


def test_the_same_generator_state_gives_the_same_token_whatever_the_batch(tt, rng):
    x = logits(rng, 8, 128)
    s = tt.TopKTopPSampler()
    alone, _ = s.forward_native(x[5:6].clone(), generators({0: 77}), None, None)
    other = x.clone()
    other[[0, 1, 2, 3, 4, 6, 7]] = logits(rng, 7, 128)
    for batch, gens in ((x, {5: 77}), (other, {5: 77, 1: 3}), (other, {5: 77, 0: 4, 7: 9})):
        sampled, _ = s.forward_native(batch, generators(gens), None, None)
        assert sampled[5].item() == alone[0].item()
    # The generator advances: successive steps draw different seeds, hence (here) different tokens.
    gens = generators({5: 77})
    steps = [s.forward_native(x, gens, None, None)[0][5].item() for _ in range(20)]
    assert len(set(steps)) > 1


def test_forward_native_draws_the_filtered_distribution(tt, tokenrace, rng):
    """A chi-square fit of 40000 draws with top-k 12 and top-p 0.8 to vLLM's filtered
    probabilities; the same counts must fail the fit to the unfiltered distribution and to the
    top-k-only one (so the threshold has the power to catch a sampler that filters wrongly)."""
    vocab, n = 32, 40000
    row = (rng.standard_normal(vocab) * 1.5).astype(np.float32)
    x = torch.from_numpy(np.repeat(row[None, :], n, axis=0))
    s = tt.TopKTopPSampler(sampler=tokenrace.Sampler(0, max_rows=n, seed=2024))
    k = torch.full((n,), 12, dtype=torch.int32)
    p = torch.full((n,), 0.8, dtype=torch.float32)
    sampled, _ = s.forward_native(x, {}, k, p)
    counts = np.bincount(sampled.numpy(), minlength=vocab).astype(np.float64)
    want = vllm_kept_probs(row, 12, 0.8)
    support = want > 0
    assert counts[~support].sum() == 0, "a token outside vLLM's kept set was drawn"
    critical = wilson_hilferty(int(support.sum()) - 1, 4.0)
    assert chi_square(counts[support], want[support]) < critical
    softmax = np.exp(row - row.max()) / np.exp(row - row.max()).sum()
    assert chi_square(counts, softmax) > critical * 10
    top_k_only = vllm_kept_probs(row, 12, 1.0)
    assert chi_square(counts[top_k_only > 0], top_k_only[top_k_only > 0]) > critical * 10


def test_sample_greedy_rows_are_the_lowest_index_argmax(tt, rng):
    x = torch.from_numpy(rng.integers(-5, 5, size=(16, 300)).astype(np.float32))  # many ties
    temps = torch.tensor([0.0, 1.0] * 8)
    ids = tt.sample(x, temps, top_k=torch.full((16,), 3, dtype=torch.int32), top_p=torch.full((16,), 0.5))
    first_max = np.argmax(x.numpy(), axis=1)
    assert ids.dtype == torch.int64 and ids.shape == (16,)
    assert ids[::2].tolist() == first_max[::2].tolist()
    assert tt.sample(x.to(torch.bfloat16), 0.0).tolist() == first_max.tolist()


def test_sample_logprobs_triple_against_float64_log_softmax(tt, rng):
    x = logits(rng, 6, 500, scale=3.0)
    temps = torch.tensor([0.0, 0.5, 1.0, 1.5, 0.0, 2.0])
    ids, lp = tt.sample(x, temps, top_k=torch.full((6,), 40, dtype=torch.int64), logprobs=5)
    assert isinstance(lp, tt.LogprobsTensors) and lp._fields == (
        "logprob_token_ids", "logprobs", "selected_token_ranks")
    assert lp.logprob_token_ids.dtype == torch.int32 and lp.logprob_token_ids.shape == (6, 6)
    assert lp.logprobs.dtype == torch.float32 and lp.logprobs.shape == (6, 6)
    assert lp.selected_token_ranks.dtype == torch.int64 and lp.selected_token_ranks.shape == (6,)
    ref = torch.log_softmax(x.double(), dim=-1).numpy()  # raw: before temperature
    for r in range(6):
        np.testing.assert_allclose(ref[r], log_softmax64(x[r].numpy()), atol=1e-9)
        row_ids = lp.logprob_token_ids[r].numpy()
        assert row_ids[0] == ids[r].item()
        assert row_ids[1:].tolist() == np.argsort(-ref[r], kind="stable")[:5].tolist()
        np.testing.assert_allclose(lp.logprobs[r].numpy(), ref[r][row_ids], atol=1e-5)
        assert lp.selected_token_ranks[r].item() == int((ref[r] >= ref[r][row_ids[0]]).sum())


def test_sample_seeds_and_positions_are_stateless(tt, rng):
    x = logits(rng, 4, 256)
    seeds = torch.tensor([5, 6, 7, 8], dtype=torch.int64)
    at_3 = tt.sample(x, 0.9, seeds=seeds, positions=torch.full((4,), 3, dtype=torch.int64))
    assert tt.sample(x, 0.9, seeds=seeds, positions=torch.full((4,), 3, dtype=torch.int64)).tolist() == at_3.tolist()
    shuffled = tt.sample(x[[2, 0, 3, 1]], 0.9, seeds=seeds[[2, 0, 3, 1]], positions=torch.full((4,), 3))
    assert shuffled.tolist() == at_3[[2, 0, 3, 1]].tolist()
    by_position = {tuple(tt.sample(x, 0.9, seeds=seeds, positions=torch.full((4,), pos)).tolist())
                   for pos in range(12)}
    assert len(by_position) > 1


def test_sample_with_generators_matches_the_drop_in(tt, rng):
    """sample() at temperature T with generators runs the drop-in's race on logits / T: the same
    seeds, the same noise, the keys equal up to f32 rounding (no near tie in these rows)."""
    x = logits(rng, 3, 100)
    t = 0.7
    ids = tt.sample(x, t, generators=generators({0: 1, 1: 2, 2: 3}))
    scaled = x.double().div(t).float()
    via_drop_in, _ = tt.TopKTopPSampler().forward_native(scaled, generators({0: 1, 1: 2, 2: 3}), None, None)
    assert ids.tolist() == via_drop_in.tolist()


@pytest.mark.parametrize("kwargs,message", [
    ({"use_fp64_gumbel": True}, "32-bit uniforms"),
    ({"logprobs_mode": "processed_logits"}, "not supported"),
    ({"logprobs_mode": "processed_logprobs"}, "not supported"),
])
def test_the_drop_in_refuses_what_it_cannot_honour(tt, kwargs, message):
    with pytest.raises(ValueError, match=message):
        tt.TopKTopPSampler(**kwargs)


def test_device_and_dtype_refusals(tt):
    s = tt.TopKTopPSampler()
    with pytest.raises(ValueError, match="device 'meta'"):
        s.forward_native(torch.zeros(2, 8, device="meta"), {}, None, None)
    with pytest.raises(ValueError, match="dtype torch.float64 is not supported"):
        s.forward_native(torch.zeros(2, 8, dtype=torch.float64), {}, None, None)
    with pytest.raises(ValueError, match="dtype torch.int32 is not supported"):
        tt.sample(torch.zeros(2, 8, dtype=torch.int32), 1.0)
    with pytest.raises(ValueError, match="2-D"):
        s.forward_native(torch.zeros(8), {}, None, None)
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="device 'cuda"):
            s.forward_native(torch.zeros(2, 8, device="cuda"), {}, None, None)
        with pytest.raises(ValueError, match="CPU generators"):
            s.forward_native(torch.zeros(2, 8), {0: torch.Generator("cuda")}, None, None)


def _spec_batch(rng, counts, vocab):
    """Target logits for ``counts`` (each request's draft rows, then its bonus row) and drafts that
    are often the target's argmax."""
    rows = sum(counts) + len(counts)
    x = (rng.standard_normal((rows, vocab)) * 0.5).astype(np.float32)
    x[np.arange(rows), rng.integers(0, 3, rows)] += 4.0
    drafts, row = [], 0
    for c in counts:
        for j in range(c):
            drafts.append(int(np.argmax(x[row + j])) if rng.random() < 0.7 else int(rng.integers(0, vocab)))
        row += c + 1
    return torch.from_numpy(x), torch.tensor(drafts, dtype=torch.int32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rejection_sample_is_sampler_verify_shaped_as_vllm(tt, tokenrace, rng, dtype):
    counts, vocab = [2, 0, 3, 1], 64
    x, drafts = _spec_batch(rng, counts, vocab)
    x = x.to(dtype)
    temps = torch.tensor([0.8, 0.0, 1.2, 0.6])
    seeds = torch.tensor([3, 4, 5, 6], dtype=torch.int64)
    positions = torch.tensor([5, 0, 9, 2], dtype=torch.int64)
    out = tt.rejection_sample(x, drafts, counts, temps, seeds=seeds, positions=positions,
                              sampler=tokenrace.Sampler(vocab))
    assert out.dtype == torch.int32 and out.shape == (4, 4) and out.device.type == "cpu"
    want = tokenrace.Sampler(vocab).verify(x, drafts, counts, temperature=temps, seeds=seeds, offsets=positions)
    assert out.tolist() == want.tokens.tolist()
    for i, c in enumerate(want.counts.tolist()):
        assert (out[i, c:] == tt.PLACEHOLDER_TOKEN_ID).all() and (out[i, :c] >= 0).all()
    assert out[1, 0].item() == torch.argmax(x[3].float()).item()  # request 1 (greedy): no drafts, bonus row 3
    wide = tt.rejection_sample(x, drafts, torch.tensor(counts), temps, seeds=seeds, positions=positions,
                               draft_probs=torch.full((6, vocab), 1.0 / vocab), max_spec_len=5)
    assert wide.shape == (4, 6) and (wide[:, 4:] == -1).all()


def test_rejection_sample_takes_one_seed_per_generator_and_call(tt, tokenrace, rng):
    counts, vocab = [2, 1, 2], 50
    x, drafts = _spec_batch(rng, counts, vocab)
    gens = generators({0: 21, 2: 22})
    twins = generators({0: 21, 2: 22})
    s = tokenrace.Sampler(vocab)
    for _step in range(3):
        out = tt.rejection_sample(x, drafts, counts, 1.0, generators=gens, sampler=s)
        seeds = np.zeros(3, np.uint64)
        for req, twin in twins.items():
            seeds[req] = int(torch.randint(0, 2**31, (1,), generator=twin, dtype=torch.long).item())
        want = s.verify(x, drafts, counts, seeds=seeds, seeded=[True, False, True])
        for req in twins:
            assert out[req].tolist() == want.tokens[req].tolist()
            assert torch.equal(gens[req].get_state(), twins[req].get_state())


# -- a refused call leaves torch's generators as they were --------------------------------------


def _assert_twins(gens, twins):
    """Each generator has its twin's state (mt19937 and the cached normals), and draws the same."""
    for row in gens:
        assert torch.equal(gens[row].get_state(), twins[row].get_state()), f"generator {row} was advanced"
        a = torch.randint(0, 2**31, (3,), generator=gens[row], dtype=torch.long)
        b = torch.randint(0, 2**31, (3,), generator=twins[row], dtype=torch.long)
        assert a.tolist() == b.tolist()


def test_a_refused_sample_leaves_the_generators_as_they_were(tt, tokenrace, rng):
    x = logits(rng, 2, 10)
    cases = [
        (dict(logprobs=11), ValueError, r"logprobs: 11 is not in \[0, 10\]"),
        (dict(out=torch.zeros(2, dtype=torch.float32)), ValueError, "out: has dtype"),
        (dict(temperature=[1.0, 1.0, 1.0]), ValueError, "temperature: has 3 elements"),
        (dict(top_p=0.0), tokenrace.InvalidArgumentError, r"top_p\[0\]: 0 is not in \(0, 1\]"),
        (dict(min_p=torch.tensor([0.0, 2.0])), tokenrace.InvalidArgumentError, r"min_p\[1\]"),
        (dict(sampler=tokenrace.Sampler(11)), tokenrace.InvalidArgumentError, "vocab"),
        (dict(sampler=tokenrace.Sampler(0, max_rows=1)), tokenrace.InvalidArgumentError, "max_rows"),
        (dict(logprobs=3, top_p=0.0), tokenrace.InvalidArgumentError, r"top_p\[0\]"),
    ]
    for kwargs, exc, message in cases:
        gens, twins = generators({0: 5, 1: 6}), generators({0: 5, 1: 6})
        kw = dict(kwargs)
        with pytest.raises(exc, match=message):
            tt.sample(x, kw.pop("temperature", 1.0), generators=gens, **kw)
        _assert_twins(gens, twins)
    gens, twins = generators({0: 5, 1: 6}), generators({0: 5, 1: 6})
    with pytest.raises(tokenrace.InvalidArgumentError):
        tt.sample(x, 1.0, generators=gens, top_p=0.0)
    assert tt.sample(x, 1.0, generators=gens).tolist() == tt.sample(x, 1.0, generators=twins).tolist()


def test_a_refused_forward_native_leaves_the_generators_as_they_were(tt, tokenrace, rng):
    x = logits(rng, 2, 10)
    s = tt.TopKTopPSampler(sampler=tokenrace.Sampler(10))
    for k, p, exc, message in ((torch.ones(3, dtype=torch.int32), None, ValueError, "top_k: has 3 elements"),
                               (None, torch.zeros(2), tokenrace.InvalidArgumentError, r"top_p\[0\]")):
        gens, twins = generators({0: 8, 1: 9}), generators({0: 8, 1: 9})
        with pytest.raises(exc, match=message):
            s.forward_native(x, gens, k, p)
        _assert_twins(gens, twins)


def test_a_refused_rejection_sample_leaves_the_generators_as_they_were(tt, tokenrace, rng):
    counts, vocab = [1, 2], 30
    x, drafts = _spec_batch(rng, counts, vocab)
    q_bad = torch.full((3, vocab), 1.0 / vocab)
    q_bad[1, 0] += 0.5
    cases = [
        (dict(draft_token_ids=torch.tensor([0, vocab, 0], dtype=torch.int32)), tokenrace.InvalidArgumentError,
         rf"batch.draft_tokens\[1\]: request 1, draft 0: {vocab} is not a token id"),
        (dict(draft_token_ids=torch.tensor([0, -2, 0])), ValueError, r"draft_tokens\[1\]: request 1, draft 0: -2"),
        (dict(draft_token_ids=drafts[:2]), ValueError, "draft_tokens: has 2 ids"),
        (dict(draft_probs=q_bad), tokenrace.InvalidArgumentError, r"batch.draft_probs\[1\]"),
        (dict(draft_probs=torch.zeros(2, vocab)), ValueError, "draft_probs: has shape"),
        (dict(top_p=[1.0, 1.5]), tokenrace.InvalidArgumentError, r"batch.top_p\[1\]"),
        (dict(max_spec_len=1), ValueError, "max_spec_len: 1 is smaller"),
        (dict(sampler=tokenrace.Sampler(0, max_rows=4)), tokenrace.InvalidArgumentError, "max_rows"),
    ]
    for kwargs, exc, message in cases:
        gens, twins = generators({0: 31, 1: 32}), generators({0: 31, 1: 32})
        kw = dict(kwargs)
        with pytest.raises(exc, match=message):
            tt.rejection_sample(x, kw.pop("draft_token_ids", drafts), counts, 0.9, generators=gens, **kw)
        _assert_twins(gens, twins)


# -- vLLM's placeholder draft id, and draw_full(out=) over the logits --------------------------------


@pytest.mark.parametrize("greedy", [True, False])
@pytest.mark.parametrize("with_q", [False, True])
def test_rejection_sample_rejects_the_placeholder_draft(tt, tokenrace, greedy, with_q):
    """vLLM's test_placeholder_draft_token_rejected_random: drafts [1, 99, -1] (int64, as vLLM
    pads them) against rows peaked at [1, 99, 7, 9]: the real drafts are accepted, the -1 is
    rejected and the token there is the target's (its peak holds all the mass but e^-100)."""
    vocab = 100
    x = torch.zeros(4, vocab)
    x[torch.arange(4), torch.tensor([1, vocab - 1, 7, 9])] = 100.0
    drafts = torch.tensor([1, vocab - 1, tt.PLACEHOLDER_TOKEN_ID], dtype=torch.int64)
    q = torch.full((3, vocab), 1.0 / vocab) if with_q else None
    out = tt.rejection_sample(x, drafts, [3], 0.0 if greedy else 1.0, draft_probs=q,
                              generators={0: torch.Generator().manual_seed(0)}, sampler=tokenrace.Sampler(vocab))
    assert out.tolist() == [[1, vocab - 1, 7, tt.PLACEHOLDER_TOKEN_ID]]


def test_an_out_tensor_one_row_ahead_of_the_logits_is_refused(tokenrace, rng):
    big = torch.from_numpy(rng.standard_normal((4, 40)).astype(np.float32))
    before = big.clone()
    s = tokenrace.Sampler(40)
    for logits_, out in ((big[1:], big[:-1]), (big[:-1], big[1:])):
        with pytest.raises(ValueError, match=r"out: overlaps logits: out spans bytes"):
            s.draw_full(logits_, temperature=0.7, full_logprobs="processed", out=out)
        assert torch.equal(big, before)
    buf = torch.zeros(6, 40)
    buf[:3] = big[:3]
    r = s.draw_full(buf[:3], temperature=0.7, seeds=1, full_logprobs="processed", out=buf[3:])
    assert r.full_logprobs.data_ptr() == buf[3:].data_ptr()
