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
    """``tokenrace.torch`` imported against this test's torch; afterwards the module that was
    imported before (other tests' modules hold it) is put back."""
    before_module, before_attr = sys.modules.pop("tokenrace.torch", None), getattr(tokenrace, "torch", None)
    module = importlib.import_module("tokenrace.torch")
    yield module
    sys.modules.pop("tokenrace.torch", None)
    if before_module is not None:
        sys.modules["tokenrace.torch"] = before_module
    if before_attr is not None:
        tokenrace.torch = before_attr
    elif getattr(tokenrace, "torch", None) is module:
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


# -- each input against Sampler.draw ------------------------------------------------------------

PROMPTS = [[1, 2, 3], [], [5, 5, 6, 7, 8], [0]]
OUTPUTS = [[3, 3], [9], [], [1, 2, 3, 4]]


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_penalties_with_padded_histories(tt, torch, x, temperature):
    rep = np.array([1.5, 1.0, 2.0, 0.8], np.float32)
    freq = np.array([0.5, 0.0, 1.0, 0.2], np.float32)
    pres = np.array([0.1, 0.3, 0.0, 0.4], np.float32)
    want = expected(x, temperature, prompt_tokens=PROMPTS, output_tokens=OUTPUTS, repetition_penalty=rep,
                    frequency_penalty=freq, presence_penalty=pres)
    vllm_forms = dict(prompt_token_ids=tensor(torch, padded(PROMPTS, 6)), repetition_penalties=tensor(torch, rep),
                      frequency_penalties=tensor(torch, freq), presence_penalties=tensor(torch, pres))
    for output in (OUTPUTS, tensor(torch, padded(OUTPUTS, 5))):  # vLLM's list of lists, or padded
        np.testing.assert_array_equal(got(tt, torch, x, temperature, output_token_ids=output, **vllm_forms), want)
    # no_penalties (vLLM's flag) skips them, histories and all.
    np.testing.assert_array_equal(got(tt, torch, x, temperature, output_token_ids=OUTPUTS, no_penalties=True,
                                      **vllm_forms), expected(x, temperature))


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_the_penalty_window_reaches_the_draw(tt, torch, x, temperature):
    rep = np.array([1.5, 1.0, 2.0, 0.8], np.float32)
    freq = np.array([0.5, 0.0, 1.0, 0.2], np.float32)
    for last_n in (2, np.array([1, 0, 3, 2], np.int32)):
        want = expected(x, temperature, prompt_tokens=PROMPTS, output_tokens=OUTPUTS, repetition_penalty=rep,
                        frequency_penalty=freq, penalty_last_n=last_n)
        tokens = got(tt, torch, x, temperature, prompt_token_ids=tensor(torch, padded(PROMPTS, 6)),
                     output_token_ids=OUTPUTS, repetition_penalties=tensor(torch, rep),
                     frequency_penalties=tensor(torch, freq), penalty_last_n=last_n)
        np.testing.assert_array_equal(tokens, want)


def test_a_greedy_row_sees_the_penalty(tt, torch, x):
    top = int(np.argmax(x[0]))
    tokens = got(tt, torch, x, 0.0, output_token_ids=[[top], [], [], []],
                 frequency_penalties=tensor(torch, np.array([1000.0, 0, 0, 0], np.float32)))
    assert tokens[0] != top and tokens[0] == np.argsort(x[0])[-2]


def test_allowed_token_ids_mask_is_vllms_negated_mask(tt, torch, x):
    allowed = [[3, 7, 30], None, [0], None]
    mask = np.zeros((ROWS, VOCAB), bool)  # vLLM V1: True where a token is NOT allowed
    for r, ids in enumerate(allowed):
        if ids is not None:
            mask[r] = True
            mask[r, ids] = False
    for temperature in (0.0, 1.0):
        tokens = got(tt, torch, x, temperature, allowed_token_ids_mask=tensor(torch, mask))
        np.testing.assert_array_equal(tokens, expected(x, temperature, allowed_tokens=allowed))
        assert tokens[0] in allowed[0] and tokens[2] == 0


@pytest.mark.parametrize("vocab", [31, 32, 33, 100])
def test_the_mask_packs_at_every_vocab_width(tt, torch, rng, vocab):
    x = rng.standard_normal((2, vocab)).astype(np.float32)
    mask = rng.random((2, vocab)) < 0.7
    mask[:, vocab - 1] = False  # the last word's last bit
    want = np.asarray(tokenrace_module().Sampler(0).draw(
        x, temperature=0.0, allowed_tokens=[np.flatnonzero(~m) for m in mask]))
    assert np.asarray(tt.sample(tensor(torch, x), 0.0, allowed_token_ids_mask=tensor(torch, mask))).tolist() == \
        want.tolist()


def test_the_mask_and_a_grammar_bitmask_both_restrict(tt, torch, x):
    mask = np.zeros((ROWS, VOCAB), bool)
    mask[:, :10] = True  # ids 0-9 not allowed
    words = np.full((ROWS, 2), -1, np.int32)  # every token allowed by the grammar ...
    words[:, 0] = ~np.int32(1 << 12)  # ... but 12
    both = words.copy()
    both[:, 0] &= ~np.int32((1 << 10) - 1)
    tokens = got(tt, torch, x, 1.0, allowed_token_ids_mask=tensor(torch, mask), token_bitmask=tensor(torch, words))
    np.testing.assert_array_equal(tokens, expected(x, 1.0, token_bitmask=both))
    np.testing.assert_array_equal(got(tt, torch, x, 1.0, token_bitmask=tensor(torch, words)),
                                  expected(x, 1.0, token_bitmask=words))
    assert words[0, 0] == ~np.int32(1 << 12)  # the caller's bitmask is not written


def test_bad_words_by_vllms_prefix_rule(tt, torch, x):
    outputs = [[1, 2, 3], [4], [], [7, 8]]
    bad_words = {
        0: [[5], [2, 3, 9], [3, 10], [1, 3, 11]],  # 5; 9 (output ends with 2 3); 10 (ends with 3); not 11
        1: [[4, 12], [4, 4, 13]],  # 12; not 13 (the output is shorter than the prefix)
        2: [[14, 15], [16]],  # not 15 (no output yet); 16
    }
    bans = [[5, 9, 10], [12], [16], None]
    for output in (outputs, tensor(torch, padded(outputs, 4))):
        for temperature in (0.0, 1.0):
            np.testing.assert_array_equal(
                got(tt, torch, x, temperature, output_token_ids=output, bad_words_token_ids=bad_words),
                expected(x, temperature, banned_tokens=bans))
    # One-token words need no history.
    np.testing.assert_array_equal(got(tt, torch, x, 0.0, bad_words_token_ids={3: [[int(np.argmax(x[3]))]]}),
                                  expected(x, 0.0, banned_tokens=[None, None, None, [int(np.argmax(x[3]))]]))


def test_logit_bias_dicts(tt, torch, x):
    bias = [{3: 5.0, 7: -float("inf")}, None, {0: 100.0}, {}]
    for temperature in (0.0, 1.0):
        tokens = got(tt, torch, x, temperature, logit_bias=bias)
        np.testing.assert_array_equal(tokens, expected(x, temperature, logit_bias=bias))
    assert tokens[2] == 0


def test_every_input_at_once_with_logprobs_and_generators(tt, torch, x):
    step = dict(prompt_token_ids=tensor(torch, padded(PROMPTS, 6)), output_token_ids=OUTPUTS,
                repetition_penalties=tensor(torch, np.full(ROWS, 1.3, np.float32)),
                frequency_penalties=tensor(torch, np.full(ROWS, 0.4, np.float32)),
                presence_penalties=tensor(torch, np.full(ROWS, 0.2, np.float32)),
                allowed_token_ids_mask=tensor(torch, np.arange(VOCAB)[None, :].repeat(ROWS, 0) >= 35),
                bad_words_token_ids={0: [[3, 4]], 3: [[4, 5], [6]]}, logit_bias=[{1: 2.0}, None, None, {2: -1.0}])
    gens = {r: torch.Generator().manual_seed(100 + r) for r in range(ROWS)}
    twins = {r: torch.Generator().manual_seed(100 + r) for r in range(ROWS)}
    tokens, lp = tt.sample(tensor(torch, x), 0.8, generators=gens, logprobs=2, **step)
    seeds = np.array([int(torch.randint(0, 2**31, (1,), generator=twins[r], dtype=torch.long).item())
                      for r in range(ROWS)], np.uint64)
    want = tokenrace_module().Sampler(0).draw_full(
        x, temperature=0.8, seeds=seeds, logprobs=2, ranks=True, prompt_tokens=PROMPTS, output_tokens=OUTPUTS,
        repetition_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.2,
        allowed_tokens=[list(range(35))] * ROWS, banned_tokens=[[4], None, None, [5, 6]],
        logit_bias=[{1: 2.0}, None, None, {2: -1.0}])
    np.testing.assert_array_equal(np.asarray(tokens), want.tokens)
    np.testing.assert_array_equal(np.asarray(lp.logprob_token_ids)[:, 1:], want.topn_ids)
    np.testing.assert_array_equal(np.asarray(lp.selected_token_ranks), want.ranks)


def log_softmax64(x):
    z = x.astype(np.float64)
    z = z - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def test_forced_tokens_return_their_token_with_its_logprob(tt, torch, x):
    forced = np.array([-1, 7, -1, 0], np.int64)
    tokens, lp = tt.sample(tensor(torch, x), 0.8, seeds=tensor(torch, SEEDS.astype(np.int64)),
                           forced_tokens=tensor(torch, forced), logprobs=1)
    tokens = np.asarray(tokens)
    # The forced rows return their token, the drawn rows what they draw without any forced row.
    free = expected(x, temperature=0.8)
    np.testing.assert_array_equal(tokens, np.where(forced >= 0, forced, free))
    # Raw logprobs: of the logits as given, the forced token's as if it had been drawn.
    ref = log_softmax64(x)
    np.testing.assert_allclose(np.asarray(lp.logprobs)[:, 0], ref[np.arange(ROWS), tokens], atol=1e-5)
    ranks = np.asarray(lp.selected_token_ranks)
    for r in range(ROWS):
        assert ranks[r] == 1 + int((x[r] > x[r, tokens[r]]).sum()), r


def test_logprob_token_ids_in_vllms_layout(tt, torch, x):
    given = [[3, 5, 3], None, [39], []]
    tokens, lp = tt.sample(tensor(torch, x), 1.0, seeds=tensor(torch, SEEDS.astype(np.int64)), logprobs=2,
                           logprob_token_ids=given)
    ids, values = np.asarray(lp.logprob_token_ids), np.asarray(lp.logprobs)
    assert ids.shape == (ROWS, 4) and values.shape == (ROWS, 4)
    ref = log_softmax64(x)
    np.testing.assert_array_equal(ids[:, 0], np.asarray(tokens))
    np.testing.assert_array_equal(np.asarray(tokens), expected(x))
    for r, g in enumerate(given):
        if g:
            np.testing.assert_array_equal(ids[r, 1:1 + len(g)], g)
            np.testing.assert_allclose(values[r, 1:1 + len(g)], ref[r, g], atol=1e-5)
            assert (ids[r, 1 + len(g):] == 0).all() and np.isneginf(values[r, 1 + len(g):]).all()
        else:
            top = np.argsort(-x[r], kind="stable")[:2]
            np.testing.assert_array_equal(ids[r, 1:3], top)
            np.testing.assert_allclose(values[r, 1:3], ref[r, top], atol=1e-5)
            assert ids[r, 3] == 0 and np.isneginf(values[r, 3])
    # The dict form and no top-n: width 1 + the longest list.
    _, lp2 = tt.sample(tensor(torch, x), 1.0, seeds=tensor(torch, SEEDS.astype(np.int64)),
                       logprob_token_ids={2: [1, 2]})
    assert np.asarray(lp2.logprob_token_ids).shape == (ROWS, 3)
    np.testing.assert_allclose(np.asarray(lp2.logprobs)[2, 1:], ref[2, [1, 2]], atol=1e-5)
    assert np.isneginf(np.asarray(lp2.logprobs)[[0, 1, 3], 1:]).all()


def test_logprob_token_ids_as_csr_tensors_equal_the_lists(tt, torch, x):
    given = [[3, 5, 3], [], [39], [0]]
    ids = tensor(torch, np.array([3, 5, 3, 39, 0], np.int32))
    offsets = tensor(torch, np.array([0, 3, 3, 4, 5], np.int64))
    seeds = tensor(torch, SEEDS.astype(np.int64))
    want = tt.sample(tensor(torch, x), 1.0, seeds=seeds, logprobs=2, logprob_token_ids=given)
    got = tt.sample(tensor(torch, x), 1.0, seeds=seeds, logprobs=2, logprob_token_ids=(ids, offsets))
    np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))
    for a, b in zip(got[1], want[1]):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(ValueError, match="logprob_token_ids: has 4 offsets"):
        tt.sample(tensor(torch, x), 1.0, logprob_token_ids=(ids, offsets[:4]))


def test_score_gives_prompt_logprobs_in_vllms_layout_equal_to_the_draws(tt, torch, tokenrace, x):
    seeds = tensor(torch, SEEDS.astype(np.int64))
    tokens, lp = tt.sample(tensor(torch, x), 1.0, seeds=seeds, logprobs=3)
    scored = tt.score(tensor(torch, x), tokens, logprobs=3)
    for a, b in zip(scored, lp):
        assert isinstance(a, torch.Tensor)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    targets = np.array([0, 39, 7, 7])
    ref = log_softmax64(x)
    s = tt.score(tensor(torch, x), tensor(torch, targets), logprobs=0)
    np.testing.assert_array_equal(np.asarray(s.logprob_token_ids)[:, 0], targets)
    np.testing.assert_allclose(np.asarray(s.logprobs)[:, 0], ref[np.arange(ROWS), targets], atol=1e-5)
    ranks = (ref >= ref[np.arange(ROWS), targets][:, None]).sum(axis=1)
    np.testing.assert_array_equal(np.asarray(s.selected_token_ranks), ranks)
    g = tt.score(tensor(torch, x), tensor(torch, targets), logprob_token_ids={1: [2, 4]})
    np.testing.assert_allclose(np.asarray(g.logprobs)[1, 1:], ref[1, [2, 4]], atol=1e-5)
    with pytest.raises(tokenrace.InvalidArgumentError, match=r"target_ids: row 1: 40 is not a token id"):
        tt.score(tensor(torch, x), tensor(torch, np.array([0, 40, 0, 0])))


def test_bad_forced_tokens_and_given_ids_are_refused_and_put_the_generators_back(tt, torch, tokenrace, x):
    for kwargs, error, message in [
        (dict(forced_tokens=[-1, VOCAB, -1, -1]), tokenrace.InvalidArgumentError, r"forced_tokens\[1\]"),
        (dict(logprob_token_ids=[[1], [VOCAB], [], []]), tokenrace.InvalidArgumentError, r"logprob_token_ids"),
        (dict(logprob_token_ids=[[1]]), ValueError, r"logprob_token_ids: has 1 rows, logits have 4"),
        (dict(logprob_token_ids={4: [1]}), ValueError, r"logprob_token_ids: key 4 is not a row"),
    ]:
        gens = {1: torch.Generator().manual_seed(5)}
        twin = torch.Generator().manual_seed(5)
        with pytest.raises(error, match=message):
            tt.sample(tensor(torch, x), 1.0, generators=gens, **kwargs)
        assert torch.randint(0, 2**31, (1,), generator=gens[1], dtype=torch.long).item() == \
            torch.randint(0, 2**31, (1,), generator=twin, dtype=torch.long).item(), kwargs


# -- refusals -----------------------------------------------------------------------------------


def _step_refusals(torch):
    bad_prompt = padded(PROMPTS, 6)
    bad_prompt[2, 1] = VOCAB + 1
    return [
        (dict(prompt_token_ids=tensor(torch, bad_prompt), frequency_penalties=0.5),
         r"prompt_token_ids\[2\]: position 1: 41 is not a token id"),
        (dict(output_token_ids=[[1], [2, VOCAB], [], []], frequency_penalties=0.5),
         r"output_token_ids\[1\]: position 1: 40 is not a token id in \[0, 40\)"),
        (dict(output_token_ids=[[1]], presence_penalties=0.5), r"output_token_ids: has 1 rows, the batch has 4"),
        (dict(output_token_ids="abc", presence_penalties=0.5), "output_token_ids: must be"),
        (dict(allowed_token_ids_mask=tensor(torch, np.zeros((ROWS, VOCAB), np.int32))),
         "allowed_token_ids_mask: has dtype .*torch.bool"),
        (dict(allowed_token_ids_mask=tensor(torch, np.zeros((ROWS, VOCAB - 1), bool))),
         r"allowed_token_ids_mask: has shape \(4, 39\), the logits need \(4, 40\)"),
        (dict(allowed_token_ids_mask=np.zeros((ROWS, VOCAB), bool)), "allowed_token_ids_mask: must be a torch.Tensor"),
        (dict(allowed_token_ids_mask=tensor(torch, np.zeros((ROWS, VOCAB), bool)),
              token_bitmask=tensor(torch, np.zeros((ROWS, 1), np.int32))),
         r"token_bitmask: has shape \(4, 1\), the logits need \(4, 2\)"),
        (dict(bad_words_token_ids={4: [[1]]}), "bad_words_token_ids: row 4 is outside the batch of 4 rows"),
        (dict(bad_words_token_ids={1: [[1], []]}), r"bad_words_token_ids\[1\]\[1\]: must be a non-empty list"),
        (dict(bad_words_token_ids={1: [[1, VOCAB]]}, output_token_ids=OUTPUTS),
         r"bad_words_token_ids\[1\]\[0\]: position 1: 40 is not a token id"),
        (dict(bad_words_token_ids={0: [[1, 2]]}), r"bad_words_token_ids\[0\]\[0\]: a word of 2 tokens needs "
                                                  r"output_token_ids"),
        (dict(bad_words_token_ids=[[1]]), "bad_words_token_ids: must be a dict"),
        (dict(logit_bias={1: 1.0}), "logit_bias: must be a list of one dict"),
        (dict(logit_bias=[{1: 1.0}]), "logit_bias: has 1 rows, the batch has 4"),
    ]


def test_bad_step_inputs_are_refused_naming_the_argument_before_the_generators_move(tt, torch, x):
    for kwargs, message in _step_refusals(torch):
        gens = {0: torch.Generator().manual_seed(5)}
        twin = torch.Generator().manual_seed(5)
        with pytest.raises((ValueError, TypeError), match=message):
            tt.sample(tensor(torch, x), 1.0, generators=gens, **kwargs)
        draw = torch.randint(0, 2**31, (1,), generator=gens[0], dtype=torch.long).item()
        assert draw == torch.randint(0, 2**31, (1,), generator=twin, dtype=torch.long).item(), kwargs


def test_a_step_the_library_refuses_puts_the_generators_back(tt, torch, tokenrace, x):
    for kwargs, message in [
        (dict(repetition_penalties=tensor(torch, np.array([1.0, 0.0, 1.0, 1.0], np.float32))),
         r"repetition_penalty\[1\]"),
        (dict(logit_bias=[None, {3: float("nan")}, None, None]), r"logit_bias"),
    ]:
        gens = {1: torch.Generator().manual_seed(5)}
        twin = torch.Generator().manual_seed(5)
        with pytest.raises(tokenrace.InvalidArgumentError, match=message):
            tt.sample(tensor(torch, x), 1.0, generators=gens, **kwargs)
        assert torch.randint(0, 2**31, (1,), generator=gens[1], dtype=torch.long).item() == \
            torch.randint(0, 2**31, (1,), generator=twin, dtype=torch.long).item()


def test_rejection_sample_refuses_a_bad_step_input_naming_it(tt, torch, x):
    gens = {0: torch.Generator().manual_seed(5)}
    twin = torch.Generator().manual_seed(5)
    target = tensor(torch, x[:3])
    drafts = tensor(torch, np.array([1, 2], np.int64))
    vocab = x.shape[1]
    with pytest.raises(ValueError, match="logit_bias"):
        tt.rejection_sample(target, drafts, [2], 1.0, generators=gens, logit_bias=[{vocab + 5: 1.0}])
    # A refused call draws nothing from the caller's generators.
    assert torch.randint(0, 2**31, (1,), generator=gens[0], dtype=torch.long).item() == \
        torch.randint(0, 2**31, (1,), generator=twin, dtype=torch.long).item()
    out = tt.rejection_sample(target, drafts, [2], 1.0, no_penalties=True)  # nothing to apply
    assert tuple(out.shape) == (1, 3)


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
    array_out = np.zeros((ROWS, VOCAB), np.float32)
    assert s.draw_full(t, full_logprobs="raw", out=array_out).full_logprobs is array_out  # as given
    assert isinstance(s.draw_full(t, full_logprobs="raw").full_logprobs, torch.Tensor)
    assert type(s.draw_full(x, logprobs=1).topn_ids) is np.ndarray


def test_tensors_out_are_views_of_the_memory_written(tokenrace, torch, x):
    """A tensor result is ``torch.from_numpy`` of the array the call wrote: writing through its
    numpy view shows in the tensor (no copy between them)."""
    r = tokenrace.Sampler(0).draw_full(tensor(torch, x), logprobs=2)
    view = r.topn_ids.numpy()
    view[0, 0] = 12345
    assert int(r.topn_ids[0, 0].item()) == 12345


# -- against vLLM V1's own rule, in torch ---------------------------------------------------------


def vllm_processed_logits(torch, logits, prompt, output, rep, freq, pres, mask, bad_bans, bias):
    """What vLLM V1's ``Sampler.forward`` makes of the logits before ``sample`` (its order and
    arithmetic, written out in torch): the allowed mask, the bad words' bans, the logit bias, then
    the penalties (``apply_penalties``: repetition on prompt or output tokens, then frequency and
    presence on output counts)."""
    x = logits.clone()
    x.masked_fill_(mask, float("-inf"))
    for row, ids in enumerate(bad_bans):
        x[row, ids] = float("-inf")
    for row, d in enumerate(bias):
        for token, value in (d or {}).items():
            x[row, token] += value
    rows, vocab = x.shape
    seen = torch.zeros(rows, vocab + 1, dtype=torch.bool)
    counts = torch.zeros(rows, vocab + 1, dtype=torch.int64)
    seen.scatter_(1, prompt, True)  # the padding id (vocab) lands in the extra column
    counts.scatter_add_(1, output, torch.ones_like(output))
    seen, counts = seen[:, :vocab] | (counts[:, :vocab] > 0), counts[:, :vocab]
    r = rep[:, None].expand_as(x)
    x = torch.where(seen, torch.where(x > 0, x / r, x * r), x)
    x -= freq[:, None] * counts
    x -= pres[:, None] * (counts > 0)
    return x


def test_greedy_tokens_are_those_of_vllms_own_rule(tt, torch, rng):
    if not hasattr(torch, "where"):
        pytest.skip("the stand-in torch has no tensor arithmetic to write vLLM's rule in")
    rows, vocab = 16, 300
    logits = torch.from_numpy((rng.standard_normal((rows, vocab)) * 3).astype(np.float32))
    lengths = rng.integers(0, 40, size=(2, rows))
    prompts = [rng.integers(0, vocab, n).tolist() for n in lengths[0]]
    outputs = [rng.integers(0, vocab, n).tolist() for n in lengths[1]]
    prompt = torch.from_numpy(padded(prompts, 40, vocab))
    output = torch.from_numpy(padded(outputs, 40, vocab))
    rep = torch.from_numpy(rng.uniform(0.5, 2.0, rows).astype(np.float32))
    freq = torch.from_numpy(rng.uniform(-1, 1, rows).astype(np.float32))
    pres = torch.from_numpy(rng.uniform(-1, 1, rows).astype(np.float32))
    mask = torch.from_numpy(rng.random((rows, vocab)) < 0.3)
    mask[::3] = False  # rows without allowed_token_ids
    bias = [None if r % 4 else {int(t): float(v) for t, v in zip(rng.integers(0, vocab, 5), rng.normal(0, 3, 5))}
            for r in range(rows)]
    bad_words = {r: [[int(rng.integers(0, vocab))], outputs[r][-1:] + [int(rng.integers(0, vocab))]]
                 for r in range(0, rows, 2) if outputs[r]}
    bad_bans = [[words[0][0], words[1][-1]] if (words := bad_words.get(r)) else [] for r in range(rows)]
    want = vllm_processed_logits(torch, logits, prompt, output, rep, freq, pres, mask, bad_bans, bias).argmax(dim=1)
    got = tt.sample(logits, 0.0, prompt_token_ids=prompt, output_token_ids=outputs, repetition_penalties=rep,
                    frequency_penalties=freq, presence_penalties=pres, allowed_token_ids_mask=mask,
                    bad_words_token_ids=bad_words, logit_bias=bias)
    assert got.tolist() == want.tolist()
