"""``tokenrace.torch.sample`` with the rest of the sampling step: llama.cpp's filters and chain,
DRY, min_tokens with stop ids (vLLM's form), ``row_index`` (vLLM's ``n > 1``) and the kept set as
an output (vLLM's sampling mask). Each is checked against the numpy path (``Sampler.draw`` /
``draw_full`` on the same values as numpy arrays): the tokens, logprobs and kept sets are equal
bit for bit, so the conversion is the only thing under test (the rules themselves have their
references in the library's tests).

Every test runs on the stand-in torch of test_torch_fake.py and, where torch is installed, on real
torch as well (skipped with its reason otherwise)."""

import numpy as np
import pytest

import test_torch_step

# The fixtures of test_torch_step.py: the stand-in torch and real torch, and tokenrace.torch on it.
torch, tt = test_torch_step.torch, test_torch_step.tt

ROWS, VOCAB = 6, 40
SEEDS = np.arange(ROWS, dtype=np.uint64) * 5 + 1
PROMPTS = [[1, 2, 3], [4, 4], [5, 6, 5, 6], [], [7, 8, 9, 7, 8], [0, 1]]
OUTPUTS = [[1, 2], [4, 4, 4], [5], [10, 11, 10, 11], [9, 7], [0, 1, 0]]


@pytest.fixture
def x():
    values = np.random.default_rng(17).standard_normal((ROWS, VOCAB)) * 1.5
    values[:, :12] += 2.5  # the histories' tokens are likely, so that DRY and min_tokens show
    return values.astype(np.float32)


def tensor(torch, arr):
    return torch.from_numpy(np.ascontiguousarray(arr))


def numpy_path(x, temperature=1.0, seeds=SEEDS, **kwargs):
    import tokenrace

    return np.asarray(tokenrace.Sampler(0).draw(x, temperature=temperature, seeds=seeds, **kwargs))


def torch_path(tt, torch, x, temperature=1.0, seeds=SEEDS, **kwargs):
    tokens = tt.sample(tensor(torch, x), temperature, seeds=seeds, **kwargs)
    assert isinstance(tokens, torch.Tensor) and tokens.dtype == torch.int64
    return np.asarray(tokens)


def as_tensors(torch, kwargs):
    return {k: tensor(torch, v) if isinstance(v, np.ndarray) else v for k, v in kwargs.items()}


# name: the arguments, per row as numpy arrays (passed as tensors to sample) or scalars.
FILTERS = {
    "top_n_sigma": dict(top_n_sigma=np.float32([0.0, 0.3, 0.6, 1.0, 1.5, 2.0])),
    "min_keep": dict(min_keep=np.int32([0, 1, 2, 4, 6, 9]), top_p=0.05),
    "typical_p": dict(typical_p=np.float32([1.0, 0.1, 0.3, 0.5, 0.7, 0.9])),
    "xtc": dict(xtc_probability=np.float32([0.0, 1.0, 1.0, 0.5, 1.0, 1.0]),
                xtc_threshold=np.float32([0.1, 0.02, 0.05, 0.05, 0.1, 0.6])),
    "dynatemp": dict(dynatemp_range=np.float32([0.0, 0.5, 1.0, 1.5, 2.0, 3.0]),
                     dynatemp_exponent=np.float32([1.0, 0.5, 1.0, 2.0, 3.0, 1.0])),
    "order": dict(order=("top_k", "typical", "top_p", "min_p", "xtc", "temperature"), top_k=np.int32([5] * ROWS),
                  typical_p=0.8, top_p=0.9, min_p=0.05, xtc_probability=1.0, xtc_threshold=0.1),
    "dry": dict(dry_multiplier=np.float32([0.0, 50.0, 5.0, 50.0, 50.0, 20.0]),
                dry_base=np.float32([1.75, 1.75, 2.0, 1.5, 1.75, 1.75]),
                dry_allowed_length=np.int32([2, 1, 1, 2, 1, 0]), dry_penalty_last_n=np.int32([-1, -1, 4, -1, 6, -1]),
                dry_sequence_breakers=[None, [[4]], None, [[11]], [[9, 7]], None]),
}
HISTORY_FORMS = dict(prompt_token_ids=PROMPTS, output_token_ids=OUTPUTS)


@pytest.mark.parametrize("name", sorted(FILTERS))
def test_llama_filters_and_dry_equal_the_numpy_path(tt, torch, x, name):
    args = FILTERS[name]
    histories = name == "dry"
    torch_history = {k: (tensor(torch, np.array([r + [VOCAB] * (6 - len(r)) for r in v], np.int64))
                         if k == "prompt_token_ids" else v) for k, v in HISTORY_FORMS.items()} if histories else {}
    numpy_history = dict(prompt_tokens=PROMPTS, output_tokens=OUTPUTS) if histories else {}
    changed = False
    for k in range(30):
        seeds = SEEDS + np.uint64(k)
        want = numpy_path(x, 0.9, seeds, **numpy_history, **args)
        got = torch_path(tt, torch, x, 0.9, tensor(torch, seeds.astype(np.int64)), **torch_history,
                         **as_tensors(torch, args))
        np.testing.assert_array_equal(got, want, err_msg=f"seeds + {k}")
        changed |= not np.array_equal(want, numpy_path(x, 0.9, seeds, **numpy_history))
    assert changed, f"{name} changed no token"


def test_dry_reads_the_histories_without_penalties(tt, torch, x):
    """DRY alone (no penalty) still passes the histories to the library, and ``no_penalties``
    does not drop them."""
    top = np.argmax(x, axis=1)
    outputs = [[int(t), 30, int(t), 30] for t in top]  # ... t, 30 repeats: t is what would extend it
    got = torch_path(tt, torch, x, 0.0, output_token_ids=outputs, dry_multiplier=1e6, dry_allowed_length=1,
                     no_penalties=True)
    want = numpy_path(x, 0.0, output_tokens=outputs, dry_multiplier=1e6, dry_allowed_length=1)
    np.testing.assert_array_equal(got, want)
    assert not np.any(got == top)


def test_min_tokens_in_vllms_form(tt, torch, x):
    stops = {0: (5, {0, 1, 2}), 2: (1, {5}), 3: (5, set(range(12)))}  # row 2's output has 1 token: no ban
    stop_lists = [[0, 1, 2], None, [5], list(range(12)), None, None]
    counts = np.int32([5, 0, 1, 5, 0, 0])
    for k in range(30):
        seeds = SEEDS + np.uint64(k)
        want = numpy_path(x, 1.0, seeds, output_tokens=OUTPUTS, min_tokens=counts, stop_token_ids=stop_lists)
        got = torch_path(tt, torch, x, 1.0, tensor(torch, seeds.astype(np.int64)), output_token_ids=OUTPUTS,
                         min_tokens=stops)
        np.testing.assert_array_equal(got, want)
        per_row = torch_path(tt, torch, x, 1.0, tensor(torch, seeds.astype(np.int64)), output_token_ids=OUTPUTS,
                             min_tokens=tensor(torch, counts), stop_token_ids=stop_lists)
        np.testing.assert_array_equal(per_row, want)
        assert got[0] not in (0, 1, 2) and not 0 <= got[3] < 12
    # One stop list for every row.
    np.testing.assert_array_equal(
        torch_path(tt, torch, x, 0.0, output_token_ids=OUTPUTS, min_tokens=9, stop_token_ids=[int(np.argmax(x[0]))]),
        numpy_path(x, 0.0, output_tokens=OUTPUTS, min_tokens=9, stop_token_ids=[[int(np.argmax(x[0]))]] * ROWS))


def test_min_tokens_refusals_say_why(tt, torch, x):
    with pytest.raises(ValueError, match="min_tokens: needs output_token_ids"):
        tt.sample(tensor(torch, x), 1.0, min_tokens={0: (3, {1})})
    with pytest.raises(ValueError, match="stop_token_ids: given without min_tokens"):
        tt.sample(tensor(torch, x), 1.0, output_token_ids=OUTPUTS, stop_token_ids=[[1]] * ROWS)
    with pytest.raises(ValueError, match=r"min_tokens: row 6 is outside the batch of 6 rows"):
        tt.sample(tensor(torch, x), 1.0, output_token_ids=OUTPUTS, min_tokens={6: (3, {1})})
    with pytest.raises(ValueError, match=r"min_tokens: per-row counts need stop_token_ids"):
        tt.sample(tensor(torch, x), 1.0, output_token_ids=OUTPUTS, min_tokens=3)


def test_row_index_is_vllms_n_from_one_row(tt, torch, x):
    index = np.int32([0, 0, 0, 3, 3, 5, 1])
    seeds = np.arange(7, dtype=np.uint64) + 70
    temperature = np.float32([1.0, 0.8, 0.0, 1.2, 1.0, 0.7, 1.0])
    tokens, lp = tt.sample(tensor(torch, x), tensor(torch, temperature), seeds=tensor(torch, seeds.astype(np.int64)),
                           logprobs=3, row_index=tensor(torch, index), top_k=20)
    import tokenrace

    want = tokenrace.Sampler(0).draw_full(np.ascontiguousarray(x[index]), temperature=temperature, seeds=seeds,
                                          logprobs=3, ranks=True, top_k=20)
    np.testing.assert_array_equal(np.asarray(tokens), want.tokens)
    np.testing.assert_array_equal(np.asarray(lp.logprobs)[:, 0], want.logprobs)
    np.testing.assert_array_equal(np.asarray(lp.logprob_token_ids)[:, 1:], want.topn_ids)
    # Generators are per draw row; a list index works as a tensor does.
    gens = {r: torch.Generator().manual_seed(100 + r) for r in range(7)}
    gens_again = {r: torch.Generator().manual_seed(100 + r) for r in range(7)}
    a = tt.sample(tensor(torch, x), 1.0, generators=gens, row_index=index.tolist())
    b = tt.sample(tensor(torch, np.ascontiguousarray(x[index])), 1.0, generators=gens_again)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(ValueError, match=r"row_index\[1\]: 6 is not a row of the logits \(6 rows\)"):
        tt.sample(tensor(torch, x), 1.0, row_index=[0, 6])
    with pytest.raises(ValueError, match="temperature"):
        tt.sample(tensor(torch, x), tensor(torch, np.ones(ROWS, np.float32)), row_index=[0, 1])


@pytest.mark.parametrize("form", ["bool", "bitmask"])
def test_the_kept_set_as_vllms_sampling_mask(tt, torch, x, form):
    import tokenrace

    args = dict(top_k=np.int32([0, 3, 10, 40, 1, 7]), top_p=np.float32([0.9, 1.0, 0.5, 0.8, 1.0, 0.95]),
                min_p=0.02)
    temperature = np.float32([1.0, 0.7, 0.0, 1.3, 1.0, 0.9])
    tokens, logprobs, kept = tt.sample(tensor(torch, x), tensor(torch, temperature), seeds=SEEDS,
                                       sampling_mask=form, kept_values=True, **as_tensors(torch, args))
    assert logprobs is None
    want = tokenrace.Sampler(0).draw_full(x, temperature=temperature, seeds=SEEDS, kept_set=True,
                                          kept_bitmask=True, **args)
    np.testing.assert_array_equal(np.asarray(tokens), want.tokens)
    for name in ("threshold", "count", "mass"):
        got = getattr(kept, name)
        assert isinstance(got, torch.Tensor)
        np.testing.assert_array_equal(np.asarray(got), getattr(want, "kept_" + name), err_msg=name)
    mask = np.asarray(kept.mask)
    words = want.kept_bitmask
    bits = (words[:, np.arange(VOCAB) // 32].astype(np.int64) >> (np.arange(VOCAB) % 32)) & 1 == 1
    if form == "bitmask":
        assert kept.mask.dtype == torch.int32 and mask.shape == (ROWS, (VOCAB + 31) // 32)
        np.testing.assert_array_equal(mask, words)
    else:
        assert kept.mask.dtype == torch.bool and mask.shape == (ROWS, VOCAB)
        np.testing.assert_array_equal(mask, bits)
    assert bits[np.arange(ROWS), want.tokens].all()  # each row drew a kept token
    np.testing.assert_array_equal(bits.sum(axis=1), want.kept_count)
    # With logprobs: the same tokens, and the LogprobsTensors in its place; the mask alone.
    tokens2, logprobs2, kept2 = tt.sample(tensor(torch, x), tensor(torch, temperature), seeds=SEEDS, logprobs=2,
                                          sampling_mask=form, **as_tensors(torch, args))
    np.testing.assert_array_equal(np.asarray(tokens2), want.tokens)
    assert logprobs2 is not None and kept2.threshold is None and kept2.count is None
    np.testing.assert_array_equal(np.asarray(kept2.mask), mask)
    with pytest.raises(ValueError, match="sampling_mask: 'dense' is not None, 'bool'"):
        tt.sample(tensor(torch, x), 1.0, sampling_mask="dense")


def test_the_kept_set_is_refused_where_the_library_cannot_report_it(tt, torch, x):
    import tokenrace

    with pytest.raises(tokenrace.InvalidArgumentError, match="typical"):
        tt.sample(tensor(torch, x), 1.0, typical_p=0.5, sampling_mask="bool")


def test_sampler_draw_gives_tensors_for_tensor_logits(tt, torch, x):
    import tokenrace

    s = tokenrace.Sampler(0)
    t = tensor(torch, x)
    for result in (s.draw(t, seeds=SEEDS), s.draw(t, seeds=np.arange(3, dtype=np.uint64), row_index=[0, 0, 2])):
        assert isinstance(result, torch.Tensor)
    full = s.draw_full(t, seeds=SEEDS, kept_set=True, kept_bitmask=True, typical_p=None)
    for name in ("tokens", "logprobs", "kept_threshold", "kept_count", "kept_mass", "kept_bitmask"):
        assert isinstance(getattr(full, name), torch.Tensor), name


def test_score_takes_llama_filters_and_row_index(tt, torch, x):
    """``tokenrace.torch.score`` with llama.cpp's filters, the chain and row_index: the numpy
    path's ``Sampler.score`` values, bit for bit."""
    import tokenrace

    index = np.int32([0, 0, 2, 5, 5])
    targets = np.int32([1, 3, 0, 7, 2])
    args = dict(top_n_sigma=np.float32([0.0, 1.0, 2.0, 0.5, 1.5]), min_p=0.01, top_k=np.int32([0, 5, 10, 3, 20]),
                order=("top_n_sigma", "min_p", "top_k", "temperature"))
    for mode in ("raw", "processed"):
        got = tt.score(tensor(torch, x), tensor(torch, targets), logprobs=2, mode=mode, temperature=0.8,
                       row_index=tensor(torch, index), **as_tensors(torch, args))
        want = tokenrace.Sampler(0).score(np.ascontiguousarray(x[index]), targets, logprobs=2, ranks=True, mode=mode,
                                          temperature=0.8, **args)
        np.testing.assert_array_equal(np.asarray(got.logprobs)[:, 0], want.logprobs)
        np.testing.assert_array_equal(np.asarray(got.logprob_token_ids)[:, 1:], want.topn_ids)
        np.testing.assert_array_equal(np.asarray(got.selected_token_ranks), want.ranks)
    plain = tt.score(tensor(torch, x), tensor(torch, targets), mode="processed", temperature=0.8,
                     row_index=tensor(torch, index))
    assert not np.array_equal(np.asarray(plain.logprobs), np.asarray(got.logprobs))  # the filters reached it
    # typical sampling: raw logprobs only, and XTC's coin from the seeds.
    raw = tt.score(tensor(torch, x), tensor(torch, np.int32([1, 3, 0, 7, 2, 4])), typical_p=0.5,
                   xtc_probability=1.0, xtc_threshold=0.1, seeds=SEEDS, positions=SEEDS)
    assert np.asarray(raw.logprobs).shape == (ROWS, 1)
    with pytest.raises(tokenrace.InvalidArgumentError, match="typical"):
        tt.score(tensor(torch, x), tensor(torch, np.zeros(ROWS, np.int32)), mode="processed", typical_p=0.5)
