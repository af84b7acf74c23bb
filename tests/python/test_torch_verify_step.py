"""``tokenrace.torch.rejection_sample`` with vLLM's sampling step (padded prompt/output id
tensors with the vocabulary size as padding, per-request penalties, ``allowed_token_ids_mask``,
``bad_words_token_ids``, ``logit_bias`` dicts, a grammar bitmask per target row): the tokens of
``Sampler.verify`` given the same step in the binding's forms, whose rows are checked bit for bit
against draws in tests/python/test_verify_step.py and tests/verify_step.rs.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (tokenrace.torch needs it)")

VOCAB = 64


@pytest.fixture(scope="module")
def tt():
    import tokenrace.torch

    return tokenrace.torch


def _call(rng, counts):
    rows = sum(counts) + len(counts)
    x = (rng.standard_normal((rows, VOCAB)) * 1.5).astype(np.float32)
    drafts = rng.integers(0, VOCAB, sum(counts)).astype(np.int32)
    # Drafts often the raw argmax, so that later positions are judged.
    row = 0
    for i, c in enumerate(counts):
        first = sum(counts[:i])
        for j in range(c):
            if rng.random() < 0.7:
                drafts[first + j] = int(np.argmax(x[row + j]))
        row += c + 1
    return torch.from_numpy(x), torch.from_numpy(drafts)


def _padded(lists, width):
    out = np.full((len(lists), width), VOCAB, np.int64)
    for r, ids in enumerate(lists):
        out[r, :len(ids)] = ids
    return torch.from_numpy(out)


def test_rejection_sample_applies_vllms_step_per_position(tt, rng):
    import tokenrace

    for k in range(5):
        counts = [int(c) for c in rng.integers(0, 5, 4)]
        x, drafts = _call(rng, counts)
        requests, rows = len(counts), x.shape[0]
        prompts = [list(rng.integers(0, VOCAB, rng.integers(1, 9))) for _ in range(requests)]
        outputs = [[int(t) for t in rng.integers(0, VOCAB, rng.integers(0, 5))] for _ in range(requests)]
        rep = torch.tensor(rng.uniform(0.8, 1.5, requests), dtype=torch.float32)
        freq = torch.tensor(rng.uniform(0, 1.5, requests), dtype=torch.float32)
        pres = torch.tensor(rng.uniform(0, 1.5, requests), dtype=torch.float32)
        mask = torch.zeros(requests, VOCAB, dtype=torch.bool)
        mask[1, ::3] = True  # request 1 may not emit every third token
        bad = {0: [[int(drafts[0]) if counts[0] else 5, 7], [9]], 2: [[11]]}
        bias = [{3: 2.0}, None, {4: -float("inf")}, {5: 1.5}]
        words = (VOCAB + 31) // 32
        grammar = (rng.integers(-2**31, 2**31, (rows, words)) | rng.integers(-2**31, 2**31, (rows, words)))
        grammar = torch.from_numpy(grammar.astype(np.int32))
        temps = torch.tensor([0.0, 0.9, 1.0, 1.3], dtype=torch.float32)
        seeds = [int(s) for s in rng.integers(0, 2**62, requests)]
        got = tt.rejection_sample(x, drafts, counts, temps, seeds=seeds, prompt_token_ids=_padded(prompts, 10),
                                  output_token_ids=outputs, repetition_penalties=rep, frequency_penalties=freq,
                                  presence_penalties=pres, allowed_token_ids_mask=mask, bad_words_token_ids=bad,
                                  logit_bias=bias, token_bitmask=grammar, sampler=tokenrace.Sampler(0))
        # The same step in the binding's forms: the allowed mask as one bitmask row per target
        # row, combined with the grammar's.
        allowed_words = np.zeros((rows, words), np.int32)
        row = 0
        for i, c in enumerate(counts):
            allowed = ~mask[i].numpy()
            bits = np.zeros(words * 32, bool)
            bits[:VOCAB] = allowed
            packed = np.packbits(bits, bitorder="little").view("<i4").astype(np.int32)
            allowed_words[row:row + c + 1] = packed
            row += c + 1
        want = tokenrace.Sampler(0).verify(
            x.numpy(), drafts.numpy(), np.array(counts, np.int32), temperature=temps.numpy(),
            seeds=np.array(seeds, np.uint64), prompt_tokens=prompts, output_tokens=outputs,
            repetition_penalty=rep.numpy(), frequency_penalty=freq.numpy(), presence_penalty=pres.numpy(),
            logit_bias=[b or {} for b in bias], token_bitmask=allowed_words & grammar.numpy(),
            bad_words=[bad.get(i) for i in range(requests)])
        assert got.tolist() == torch.from_numpy(want.tokens).tolist(), f"case {k}"
        # Without the step the tokens differ somewhere across the cases (the step matters).
        plain = tt.rejection_sample(x, drafts, counts, temps, seeds=seeds, sampler=tokenrace.Sampler(0))
        if k == 0:
            differs = got.tolist() != plain.tolist()
        else:
            differs = differs or got.tolist() != plain.tolist()
    assert differs, "the step changed no token in any case"


def test_a_refused_step_leaves_the_generators_as_they_were(tt, rng):
    counts = [2, 1]
    x, drafts = _call(rng, counts)
    gens = {0: torch.Generator().manual_seed(5)}
    state = gens[0].get_state()
    with pytest.raises(Exception, match=r"repetition_penalty\[1\]"):
        tt.rejection_sample(x, drafts, counts, 0.9, generators=gens, repetition_penalties=torch.tensor([1.0, -1.0]),
                            output_token_ids=[[1], [2]])
    assert torch.equal(gens[0].get_state(), state)
