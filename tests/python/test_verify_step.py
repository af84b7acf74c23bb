"""Sampler.verify with the sampling step (penalties, bias, masks, bad words, min_tokens, a
bitmask per target row): each target row is judged on the processed row that a draw of it with
the request's inputs and the history ``output + drafts[:j]`` computes. Checked bit for bit
against verify (without the step) of those rows, built with ``draw_full``'s processed logits; a
greedy request accepts while its draft is the processed argmax; bad step input raises naming
the argument and request.
"""

import numpy as np
import pytest

import tokenrace

VOCAB = 300


def make_call(rng, requests=4, max_drafts=4):
    counts = rng.integers(0, max_drafts + 1, requests).astype(np.int32)
    rows = int(counts.sum()) + requests
    logits = rng.normal(0, 2, (rows, VOCAB)).astype(np.float32)
    step = {
        "prompt_tokens": [list(rng.integers(0, VOCAB, 8)) for _ in range(requests)],
        "output_tokens": [list(rng.integers(0, VOCAB, rng.integers(0, 6))) for _ in range(requests)],
        "repetition_penalty": rng.uniform(0.8, 1.6, requests).astype(np.float32),
        "frequency_penalty": rng.uniform(0, 1, requests).astype(np.float32),
        "presence_penalty": rng.uniform(0, 1, requests).astype(np.float32),
        "logit_bias": [{int(rng.integers(VOCAB)): float(rng.normal(0, 3))} for _ in range(requests)],
        "allowed_tokens": [None if i % 2 else list(range(0, VOCAB, 2)) for i in range(requests)],
        "banned_tokens": [[int(rng.integers(VOCAB))] for _ in range(requests)],
        "bad_words": [[[int(rng.integers(VOCAB)), int(rng.integers(VOCAB))]] for _ in range(requests)],
        "min_tokens": rng.integers(0, 8, requests).astype(np.int32),
        "stop_token_ids": [[int(rng.integers(VOCAB))] for _ in range(requests)],
        "token_bitmask": rng.integers(-2**31, 2**31, (rows, (VOCAB + 31) // 32)).astype(np.int32)
        | rng.integers(-2**31, 2**31, (rows, (VOCAB + 31) // 32)).astype(np.int32),
    }
    return counts, logits, step


def processed_rows(s, counts, logits, step, drafts):
    """Every target row's processed values from a greedy ``draw_full`` of it, with the history
    ``output + drafts before the row``."""
    out, row, first = [], 0, 0
    for i, n in enumerate(counts):
        for j in range(n + 1):
            history = list(step["output_tokens"][i]) + [int(d) for d in drafts[first:first + j]]
            r = s.draw_full(logits[row:row + 1], temperature=0.0, full_logprobs="processed_logits",
                            prompt_tokens=[step["prompt_tokens"][i]], output_tokens=[history],
                            repetition_penalty=step["repetition_penalty"][i:i + 1],
                            frequency_penalty=step["frequency_penalty"][i:i + 1],
                            presence_penalty=step["presence_penalty"][i:i + 1],
                            logit_bias=[step["logit_bias"][i]], allowed_tokens=[step["allowed_tokens"][i]],
                            banned_tokens=[step["banned_tokens"][i]], bad_words=[step["bad_words"][i]],
                            min_tokens=step["min_tokens"][i:i + 1], stop_token_ids=[step["stop_token_ids"][i]],
                            token_bitmask=step["token_bitmask"][row:row + 1])
            out.append(r.full_logprobs[0])
            row += 1
        first += n
    return np.array(out, np.float32)


def greedy_drafts(s, counts, logits, step, rng):
    """Drafts that are most often their row's processed argmax (so later rows are judged)."""
    drafts, first = [], 0
    for i, n in enumerate(counts):
        for j in range(n):
            y = processed_rows(s, counts, logits, step, drafts + [0] * (int(counts.sum()) - len(drafts)))
            row = int(counts[:i].sum()) + i + j
            best = int(np.argmax(y[row])) if np.isfinite(y[row]).any() else 0
            drafts.append(best if rng.random() < 0.75 else int(rng.integers(VOCAB)))
        first += n
    return np.array(drafts, np.int32)


@pytest.mark.parametrize("threads", [1, 2])
def test_verify_with_the_step_is_verify_of_the_processed_rows(threads):
    rng = np.random.default_rng(5)
    for k in range(6):
        counts, logits, step = make_call(rng)
        s = tokenrace.Sampler(0, max_rows=64, threads=threads, seed=9)
        drafts = greedy_drafts(s, counts, logits, step, rng)
        y = processed_rows(s, counts, logits, step, drafts)
        requests = len(counts)
        temperature = np.array([0.0, 0.8, 1.0, 1.2][:requests], np.float32)
        seeds = rng.integers(0, 2**63, requests).astype(np.uint64)
        kw = dict(temperature=temperature, seeds=seeds, logprobs=True, logprob_mode="processed")
        got = tokenrace.Sampler(0, max_rows=64, threads=threads).verify(logits, drafts, counts, **kw, **step)
        want = tokenrace.Sampler(0, max_rows=64, threads=threads).verify(y, drafts, counts, **kw)
        np.testing.assert_array_equal(got.tokens, want.tokens, err_msg=f"case {k}")
        np.testing.assert_array_equal(got.counts, want.counts, err_msg=f"case {k}")
        assert got.logprobs.tobytes() == want.logprobs.tobytes(), f"case {k}"
        # Greedy request 0 accepts while its draft is the processed argmax.
        n0, expect = int(counts[0]), []
        for j in range(n0 + 1):
            top = int(np.argmax(y[j]))
            expect.append(top)
            if j == n0 or drafts[j] != top:
                break
        assert list(got.tokens[0, :got.counts[0]]) == expect, f"case {k}"


def test_bad_step_input_names_the_argument_and_request():
    rng = np.random.default_rng(7)
    counts, logits, step = make_call(rng, requests=3)
    drafts = np.zeros(int(counts.sum()), np.int32)
    s = tokenrace.Sampler(0, max_rows=64)
    bad = dict(step, repetition_penalty=np.array([1.0, -1.0, 1.0], np.float32))
    with pytest.raises(tokenrace.InvalidArgumentError, match=r"repetition_penalty\[1\]"):
        s.verify(logits, drafts, counts, **bad)
    bad = dict(step, output_tokens=[[0], [VOCAB], []])
    with pytest.raises(tokenrace.InvalidArgumentError, match=r"output_ids\[1\].*output_tokens"):
        s.verify(logits, drafts, counts, **bad)
    with pytest.raises(ValueError, match="token_bitmask"):
        s.verify(logits, drafts, counts, token_bitmask=step["token_bitmask"][:1].repeat(len(logits) + 1, 0))
