"""The request state (``tokenrace.Requests``): draws whose rows name requests give exactly the
tokens, flags and logprobs of the same draws with the histories passed as lists (random
histories, windows, penalties, seeded and unseeded rows, histories grown step by step and by
lists of accepted tokens); vLLM's padded 2-D int64 histories converted once; refusals that name
the argument and change nothing."""

import numpy as np
import pytest


def _random_histories(rng, rows, vocab, longest):
    prompts = [rng.integers(0, vocab, rng.integers(0, longest)).astype(np.int32) for _ in range(rows)]
    outputs = [rng.integers(0, vocab, rng.integers(0, longest // 4 + 1)).astype(np.int32) for _ in range(rows)]
    return prompts, outputs


def _padded(lists, pad):
    width = max([len(x) for x in lists] + [1])
    out = np.full((len(lists), width), pad, np.int64)
    for i, x in enumerate(lists):
        out[i, :len(x)] = x
    return out


@pytest.mark.parametrize("vocab,longest", [(100, 60), (4096, 3000), (151936, 5120)])
def test_named_rows_draw_what_lists_draw(tokenrace, vocab, longest):
    rng = np.random.default_rng(vocab)
    rows = 6
    prompts, outputs = _random_histories(rng, rows, vocab, longest)
    state = tokenrace.Requests()
    ids = [10**12 + 7 * r for r in range(rows)]
    # vLLM's form: padded int64 rows, padded with the vocab size.
    state.add_rows(ids, _padded(prompts, vocab), _padded(outputs, vocab), pad_id=vocab)
    assert len(state) == rows and all(i in state for i in ids) and 5 not in state
    a = tokenrace.Sampler(vocab, max_rows=rows, seed=3, threads=2)
    b = tokenrace.Sampler(vocab, max_rows=rows, seed=3, threads=2)
    x = rng.standard_normal((rows, vocab)).astype(np.float32) * 3
    for step in range(8):
        kw = dict(
            temperature=rng.choice([0.0, 0.7, 1.0], rows).astype(np.float32),
            seeds=rng.integers(0, 2**63, rows).astype(np.uint64) if step % 2 else None,
            repetition_penalty=rng.choice([1.0, 1.3, 0.8], rows).astype(np.float32),
            frequency_penalty=rng.choice([0.0, 0.4, -0.2], rows).astype(np.float32),
            presence_penalty=rng.choice([0.0, 0.5], rows).astype(np.float32),
            penalty_last_n=rng.choice([0, 1, 7, 100, longest], rows).astype(np.int32),
            logprobs=3, logprob_mode="processed", ranks=True,
        )
        got_lists = a.draw_full(x, prompt_tokens=list(prompts), output_tokens=list(outputs), **kw)
        got_state = b.draw_full(x, requests=state, request_ids=ids, **kw)
        for name in ("tokens", "flags", "ranks", "topn_ids"):
            np.testing.assert_array_equal(getattr(got_lists, name), getattr(got_state, name), err_msg=name)
        for name in ("logprobs", "topn_logprobs"):
            assert getattr(got_lists, name).tobytes() == getattr(got_state, name).tobytes(), name
        # draw() too, then the tokens kept: one each, or a few per request (accepted drafts).
        t_lists = a.draw(x, prompt_tokens=list(prompts), output_tokens=list(outputs), **_draw_kw(kw))
        t_state = b.draw(x, requests=state, request_ids=ids, **_draw_kw(kw))
        np.testing.assert_array_equal(t_lists, t_state)
        if step % 3 == 2:
            accepted = [rng.integers(0, vocab, rng.integers(0, 4)).astype(np.int32) for _ in range(rows)]
            state.append(ids, accepted)
            outputs = [np.concatenate([o, n]) for o, n in zip(outputs, accepted)]
        else:
            state.append(ids, t_state)
            outputs = [np.append(o, t) for o, t in zip(outputs, t_state)]
        assert [state.output_len(i) for i in ids] == [len(o) for o in outputs]


def _draw_kw(kw):
    return {k: v for k, v in kw.items() if k not in ("logprobs", "logprob_mode", "ranks")}


def test_rows_may_share_a_request_and_a_later_call_without_it_reads_none(tokenrace):
    vocab = 50
    state = tokenrace.Requests()
    state.add(1, [3, 3, 4])
    s = tokenrace.Sampler(vocab, seed=1)
    x = np.zeros((2, vocab), np.float32)
    x[:, 3] = 5.0
    x[:, 4] = 4.0
    x[:, 5] = 3.0
    # Token 3 and 4 are in the prompt: repetition 4 drops them below token 5.
    assert s.draw(x, temperature=0.0, repetition_penalty=4.0, requests=state, request_ids=[1, 1]).tolist() == [5, 5]
    # The next call of this thread names no state: nothing of the previous one stays.
    assert s.draw(x, temperature=0.0, repetition_penalty=4.0).tolist() == [3, 3]


def test_refusals_name_the_argument_and_change_nothing(tokenrace):
    vocab = 20
    state = tokenrace.Requests()
    state.add(1, np.array([1, 2], np.int64))
    state.add(2, [], [19])
    s = tokenrace.Sampler(vocab, seed=1)
    x = np.zeros((2, vocab), np.float32)
    with pytest.raises(ValueError, match=r"batch.request_ids\[1\]: request 9 is not in the requests state"):
        s.draw(x, repetition_penalty=1.2, requests=state, request_ids=[1, 9])
    with pytest.raises(ValueError, match="request_ids: given with prompt_ids"):
        s.draw(x, prompt_tokens=[[1], [2]], repetition_penalty=1.2, requests=state, request_ids=[1, 2])
    with pytest.raises(ValueError, match="batch.requests: is NULL while request_ids is given"):
        s.draw(x, request_ids=[1, 2])
    with pytest.raises(ValueError, match="batch.request_ids: is NULL while requests is given"):
        s.draw(x, requests=state)
    with pytest.raises(ValueError, match="request_ids: has 1 ids, the batch has 2 rows"):
        s.draw(x, requests=state, request_ids=[1])
    # The ids in the library's own form (uint64, contiguous) are passed as they are.
    with pytest.raises(ValueError, match="request_ids: has 1 ids, the batch has 2 rows"):
        s.draw(x, requests=state, request_ids=np.array([1], np.uint64))
    with pytest.raises(ValueError, match=r"batch.request_ids\[0\]: request 9 is not in the requests state"):
        s.draw(x, repetition_penalty=1.2, requests=state, request_ids=np.array([9, 1], np.uint64))
    with pytest.raises(TypeError, match="requests: must be a tokenrace.Requests"):
        s.draw(x, requests=object(), request_ids=[1, 2])
    # A request whose tokens lie outside the batch's vocabulary.
    small = tokenrace.Sampler(10, seed=1)
    with pytest.raises(ValueError, match=r"request_ids\[1\]: request 2's histories hold token 19, outside vocab 10"):
        small.draw(np.zeros((2, 10), np.float32), requests=state, request_ids=[1, 2])
    with pytest.raises(ValueError, match="request 1 is already in the state"):
        state.add(1, [5])
    with pytest.raises(ValueError, match=r"prompt\[1\]: -3 is not a token id"):
        state.add(3, [1, -3])
    with pytest.raises(ValueError, match=r"ids\[1\]: request 3 is not in the state"):
        state.append([1, 3], [4, 4])
    with pytest.raises(ValueError, match="tokens: has 1 ids, one per request id is 2"):
        state.append([1, 2], [4])
    with pytest.raises(ValueError, match="request 3 is not in the state"):
        state.remove(3)
    assert (len(state), state.output_len(1), state.output_len(2)) == (2, 0, 1)
    with pytest.raises(KeyError):
        state.output_len(3)
    state.reset()
    assert len(state) == 0
    state.close()
    with pytest.raises(RuntimeError, match="Requests: is closed"):
        state.add(1, [1])


def test_torch_histories_are_converted_at_add(tokenrace):
    torch = pytest.importorskip("torch")
    vocab = 64
    prompts = torch.tensor([[1, 2, 2, vocab, vocab], [5, 6, 7, 8, 9]], dtype=torch.int64)
    state = tokenrace.Requests()
    state.add_rows([7, 8], prompts, pad_id=vocab)
    assert len(state) == 2
    state.append(torch.tensor([7, 8]), torch.tensor([3, 4], dtype=torch.int32))
    assert state.output_len(7) == 1
    s1, s2 = tokenrace.Sampler(vocab, seed=2), tokenrace.Sampler(vocab, seed=2)
    x = torch.randn(2, vocab)
    want = s1.draw(x, repetition_penalty=1.5, presence_penalty=0.5,
                   prompt_tokens=[[1, 2, 2], [5, 6, 7, 8, 9]], output_tokens=[[3], [4]], seeds=[1, 2])
    got = s2.draw(x, repetition_penalty=1.5, presence_penalty=0.5, requests=state, request_ids=[7, 8], seeds=[1, 2])
    assert torch.equal(want, got)


def test_torch_sample_takes_the_state(tokenrace):
    torch = pytest.importorskip("torch")
    import tokenrace.torch as tt

    vocab, rows = 300, 4
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, vocab, generator=g) * 3
    prompts = torch.randint(0, vocab, (rows, 50), generator=g, dtype=torch.int64)
    prompts[1, 40:] = vocab  # vLLM's padding
    outputs = [[int(t) for t in torch.randint(0, vocab, (n,), generator=g)] for n in (0, 3, 7, 1)]
    state = tokenrace.Requests()
    state.add_rows(range(rows), prompts, pad_id=vocab)
    state.append(list(range(rows)), [list(o) for o in outputs])
    penalties = dict(repetition_penalties=torch.full((rows,), 1.4), frequency_penalties=torch.full((rows,), 0.3),
                     presence_penalties=torch.full((rows,), 0.2))
    a, b = tokenrace.Sampler(vocab, seed=4), tokenrace.Sampler(vocab, seed=4)
    want = tt.sample(x, 0.8, seeds=list(range(rows)), sampler=a, prompt_token_ids=prompts, output_token_ids=outputs,
                     **penalties)
    got = tt.sample(x, 0.8, seeds=list(range(rows)), sampler=b, requests=state, request_ids=torch.arange(rows),
                    **penalties)
    assert torch.equal(want, got)
    # The same step from parameters the requests hold (temperature None), the tokens appended by
    # the call: the next step's histories hold them.
    for r in range(rows):
        state.set_params(r, temperature=0.8, repetition_penalty=1.4, frequency_penalty=0.3, presence_penalty=0.2,
                         seed=r)
    offsets = [len(o) for o in outputs]
    c, d = tokenrace.Sampler(vocab, seed=4), tokenrace.Sampler(vocab, seed=4)
    for step in range(3):
        want = tt.sample(x, 0.8, seeds=list(range(rows)), positions=offsets, sampler=c, prompt_token_ids=prompts,
                         output_token_ids=outputs, **penalties)
        got = tt.sample(x, None, sampler=d, requests=state, request_ids=torch.arange(rows), append_to_requests=True)
        assert torch.equal(want, got), step
        outputs = [o + [int(t)] for o, t in zip(outputs, want)]
        offsets = [len(o) for o in outputs]
        assert [state.output_len(r) for r in range(rows)] == offsets


@pytest.mark.parametrize("vocab", [100, 32000])
def test_held_parameters_and_appending_draw_what_the_arrays_draw(tokenrace, vocab):
    """Each request holds its sampling parameters (set once) and the draw appends its own tokens:
    step after step, the tokens, flags and logprobs of a call that passes every parameter and
    history as arrays, with the seeded requests at their output lengths."""
    rng = np.random.default_rng(vocab + 1)
    rows = 6
    prompts, outputs = _random_histories(rng, rows, vocab, 80)
    ids = np.arange(rows, dtype=np.uint64) + np.uint64(2**40)
    temperature = np.array([0.0, 0.7, 1.0, 1.3, 0.9, 1.0], np.float32)
    seeds = [None, 11, None, 12, 13, None]
    top_k = np.array([0, 0, 20, 0, 5, 0], np.int32)
    top_p = np.array([1.0, 0.9, 1.0, 0.8, 1.0, 0.95], np.float32)
    min_p = np.array([0.0, 0.0, 0.05, 0.0, 0.0, 0.0], np.float32)
    rep = np.array([1.0, 1.2, 0.9, 1.0, 1.5, 1.1], np.float32)
    freq = np.array([0.0, 0.3, 0.0, -0.2, 0.0, 0.1], np.float32)
    pres = np.array([0.0, 0.0, 0.4, 0.0, 0.2, 0.0], np.float32)
    bias = [None, {3: 4.0, 5: -np.inf}, None, {7: 1.5}, None, None]
    allowed = [None, None, None, None, list(range(0, vocab, 3)), None]
    banned = [[], [1], [], [], [], [2, 4]]
    min_tokens = np.array([0, 0, 3, 0, 0, 0], np.int32)
    stops = [[], [], [int(prompts[2][0]) if len(prompts[2]) else 0], [], [], []]
    state = tokenrace.Requests()
    for r in range(rows):
        params = dict(temperature=float(temperature[r]), top_k=int(top_k[r]), top_p=float(top_p[r]),
                      min_p=float(min_p[r]), repetition_penalty=float(rep[r]), frequency_penalty=float(freq[r]),
                      presence_penalty=float(pres[r]), logit_bias=bias[r], allowed_tokens=allowed[r],
                      banned_tokens=banned[r], min_tokens=int(min_tokens[r]), stop_token_ids=stops[r])
        if seeds[r] is not None:
            params["seed"] = seeds[r]
        state.add(int(ids[r]), prompts[r], outputs[r], **params)
    a = tokenrace.Sampler(vocab, max_rows=rows, seed=3, threads=2)
    b = tokenrace.Sampler(vocab, max_rows=rows, seed=3, threads=2)
    x = rng.standard_normal((rows, vocab)).astype(np.float32) * 3
    seeded = np.array([s is not None for s in seeds])
    for step in range(6):
        got_lists = a.draw_full(
            x, temperature=temperature, seeds=np.array([s or 0 for s in seeds], np.uint64), seeded=seeded,
            offsets=np.array([len(o) for o in outputs], np.uint64), top_k=top_k, top_p=top_p, min_p=min_p,
            repetition_penalty=rep, frequency_penalty=freq, presence_penalty=pres, logit_bias=bias,
            allowed_tokens=allowed, banned_tokens=banned, min_tokens=min_tokens, stop_token_ids=stops,
            prompt_tokens=list(prompts), output_tokens=list(outputs), logprobs=2, logprob_mode="processed")
        got_state = b.draw_full(x, requests=state, request_ids=ids, logprobs=2, logprob_mode="processed",
                                append_to_requests=True)
        for name in ("tokens", "flags", "topn_ids"):
            np.testing.assert_array_equal(getattr(got_lists, name), getattr(got_state, name), err_msg=name)
        for name in ("logprobs", "topn_logprobs"):
            assert getattr(got_lists, name).tobytes() == getattr(got_state, name).tobytes(), name
        outputs = [np.append(o, t) for o, t in zip(outputs, got_lists.tokens)]
        assert [state.output_len(int(i)) for i in ids] == [len(o) for o in outputs]
    # A call's own argument is every row's: greedy everywhere.
    greedy = b.draw(x, requests=state, request_ids=ids, temperature=0.0)
    np.testing.assert_array_equal(greedy, a.draw(x, temperature=0.0, top_k=top_k, top_p=top_p, min_p=min_p,
                                                 repetition_penalty=rep, frequency_penalty=freq,
                                                 presence_penalty=pres, logit_bias=bias, allowed_tokens=allowed,
                                                 banned_tokens=banned, min_tokens=min_tokens, stop_token_ids=stops,
                                                 prompt_tokens=list(prompts), output_tokens=list(outputs)))


def test_bad_parameters_and_a_failed_appending_draw_change_nothing(tokenrace):
    state = tokenrace.Requests()
    state.add(1, [1, 2], temperature=0.0)
    with pytest.raises(ValueError, match=r"params\.top_p: 1\.5 is not in \(0, 1\]"):
        state.set_params(1, top_p=1.5)
    with pytest.raises(ValueError, match=r"params\.repetition_penalty: 0 is not a finite number > 0"):
        state.add(2, [3], repetition_penalty=0.0)
    assert 2 not in state
    with pytest.raises(TypeError, match="top_q: not a request parameter"):
        state.set_params(1, top_q=0.5)
    s = tokenrace.Sampler(10, seed=1)
    x = np.zeros((2, 10), np.float32)
    x[:, 4] = 5.0
    # The held temperature 0 survived the refusals: greedy.
    assert list(s.draw(x[:1], requests=state, request_ids=[1], append_to_requests=True)) == [4]
    assert state.output_len(1) == 1
    with pytest.raises(ValueError, match=r"request 9 is not in the requests state"):
        s.draw(x, requests=state, request_ids=[1, 9], append_to_requests=True)
    assert state.output_len(1) == 1
    with pytest.raises(ValueError, match="append_to_requests: given without requests"):
        s.draw(x, append_to_requests=True)
    # A later call without the flag appends nothing.
    s.draw(x[:1], requests=state, request_ids=[1])
    assert state.output_len(1) == 1


def test_a_verify_calls_emitted_tokens_are_appended_as_they_lie(tokenrace):
    """``append(ids, tokens, counts=)`` takes ``Sampler.verify``'s tokens and counts as they are:
    the same histories as the per-request lists, and a refused call appends nothing."""
    vocab, drafts = 500, 3
    rng = np.random.default_rng(5)
    s = tokenrace.Sampler(vocab, seed=2)
    ids = [10, 11, 12, 13]
    a, b = tokenrace.Requests(), tokenrace.Requests()
    for i in ids:
        a.add(i, [1, 2])
        b.add(i, [1, 2])
    x = rng.standard_normal((len(ids) * (drafts + 1), vocab)).astype(np.float32) * 3
    draft = rng.integers(0, vocab, len(ids) * drafts).astype(np.int32)
    r = s.verify(x, draft, [drafts] * len(ids), temperature=0.0)
    a.append(ids, [r.tokens[i, :r.counts[i]] for i in range(len(ids))])
    b.append(ids, r.tokens, counts=r.counts)
    assert [a.output_len(i) for i in ids] == [b.output_len(i) for i in ids] == [int(c) for c in r.counts]
    t = s.draw(x[:4], requests=a, request_ids=ids, repetition_penalty=2.0, temperature=0.0)
    assert list(t) == list(s.draw(x[:4], requests=b, request_ids=ids, repetition_penalty=2.0, temperature=0.0))
    with pytest.raises(ValueError, match=r"counts\[1\]: 9 is not in \[0, 4\]"):
        b.append(ids, r.tokens, counts=[1, 9, 1, 1])
    with pytest.raises(ValueError, match=r"ids\[3\]: request 99 is not in the state"):
        b.append(ids[:3] + [99], r.tokens, counts=r.counts)
    assert [b.output_len(i) for i in ids] == [int(c) for c in r.counts]
