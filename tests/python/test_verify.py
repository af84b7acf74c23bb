"""Sampler.verify (speculative decoding) through the binding against the float64 reference of
vLLM's rejection sampling, ``ref_verify`` in tests/verify.rs (the one reference of the verify rule):

* the seeded calls of tests/fixtures/verify_cases.json, which tests/verify.rs writes with that
  reference's tokens and checks are current: with and without draft_probs, greedy and sampling
  requests, filters, draft counts including 0, float32/float16/bfloat16 logits, 1 and 2 threads;
  the emitted tokens and counts equal the reference's (requests where a decision lies within
  rounding of its threshold are marked null there and skipped);
* random calls with external uniforms and noise: strided, shared and list inputs give the tokens
  of contiguous arrays, and the workers' split the tokens of one thread;
* seeded requests: the same tokens alone, in any batch position, with any batch mates, on 1 and 2
  threads, with or without external uniforms and noise (which only unseeded requests use), and a
  pure function of (seed, offset + j);
* the output: -1 padding, counts in [1, n + 1], logprobs (shape, values, NaN padding), flags;
* bad input: ValueError/TypeError naming the argument before the call, and the library's
  InvalidArgumentError naming the field, the request and the draft.

A chi-square test of the emitted distribution is in tests/verify.rs; a light one is here too.
"""

import math
import sys

import numpy as np
import pytest

from reference import chi_square, f32_of_hex, fixture, inv_t, kept_set, log_softmax64, wilson_hilferty

GREEDY_BELOW = 1e-5


# ----------------------------------------------------------------------------------------------
# The reference's cases


def reference_cases():
    """The calls of tests/fixtures/verify_cases.json as arrays, each with ``want``: the float64
    reference's emitted tokens of every request (None: a decision near its threshold)."""
    for c in fixture("verify_cases")["calls"]:
        vocab, counts = c["vocab"], np.array(c["counts"], np.int32)
        yield dict(
            dtype=c["dtype"], x=f32_of_hex(c["logits"]).reshape(-1, vocab), counts=counts,
            drafts=np.array(c["drafts"], np.int32),
            q=None if c["q"] is None else f32_of_hex(c["q"]).reshape(-1, vocab),
            temperature=np.array(c["temperature"], np.float32), top_k=np.array(c["top_k"], np.int32),
            top_p=np.array(c["top_p"], np.float32), min_p=np.array(c["min_p"], np.float32),
            seeds=np.array(c["seeds"], np.uint64), offsets=np.array(c["offsets"], np.uint64), uniforms=None,
            noise=None, want=c["want"])


# ----------------------------------------------------------------------------------------------
# Random calls


def bf16_bits(x):
    """float32 values rounded to bfloat16 (nearest even), as the uint16 bit patterns."""
    b = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16_bits(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def round_to(dtype, x):
    if dtype == "float16":
        return x.astype(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        return from_bf16_bits(bf16_bits(x))
    return x


def softmax64(y):
    z = np.exp(y - y.max())
    return z / z.sum()


def random_call(rng, vocab, dtype="float32", with_q=None):
    """A random verify call (float32 logits already rounded to ``dtype``) and its randomness."""
    requests = int(rng.integers(1, 7))
    counts = rng.integers(0, 5, requests).astype(np.int32)
    rows = int(counts.sum()) + requests
    x = (rng.standard_normal((rows, vocab)) * rng.uniform(0.5, 3.0, (rows, 1))).astype(np.float32)
    peaked = rng.random(rows) < 0.3
    x[peaked, rng.integers(0, vocab, peaked.sum())] += 8.0
    masked = (rng.random((rows, vocab)) < 0.05) & (rng.random((rows, 1)) < 0.3)
    x[masked] = -np.inf
    x[:, 0] = np.where(np.isfinite(x[:, 0]), x[:, 0], 0.0)  # a finite logit in every row
    x = round_to(dtype, x)
    with_q = bool(rng.integers(0, 2)) if with_q is None else with_q
    drafts, q = [], []
    row = 0
    for c in counts:
        for j in range(c):
            xr = x[row + j]
            if with_q:  # a draft model close to the target, the draft drawn from it
                y = np.where(np.isfinite(xr), xr + 1.5 * rng.standard_normal(vocab), 0.0)
                qr = softmax64(y)
                if rng.random() < 0.25:  # tokens the draft never proposes
                    qr[: vocab // 3] = 0
                    qr /= qr.sum()
                drafts.append(int(min(np.searchsorted(np.cumsum(qr), rng.random(), side="right"), vocab - 1)))
                q.append(qr.astype(np.float32))
            else:  # deterministic drafts: often the target's argmax
                drafts.append(int(np.argmax(xr)) if rng.random() < 0.5 else int(rng.integers(0, vocab)))
        row += c + 1
    drafts_total = int(counts.sum())
    temperature = np.array([rng.choice([0.0, 2.0, 0.3 + rng.random(), 0.3 + rng.random(), 0.3 + rng.random()])
                            for _ in range(requests)], np.float32)
    top_k = np.where(rng.random(requests) < 0.33, rng.integers(1, 21, requests), 0).astype(np.int32)
    top_p = np.where(rng.random(requests) < 0.33, 0.5 + 0.5 * rng.random(requests), 1.0).astype(np.float32)
    min_p = np.where(rng.random(requests) < 0.25, 0.05 * rng.random(requests), 0.0).astype(np.float32)
    uniforms = (rng.integers(0, 2**53, drafts_total).astype(np.float64) + 0.5) / 2.0**53
    noise = rng.standard_exponential((rows, vocab)).astype(np.float32)
    return dict(
        x=x, counts=counts, drafts=np.array(drafts, np.int32),
        q=np.array(q, np.float32).reshape(drafts_total, vocab) if with_q else None,
        temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, uniforms=uniforms, noise=noise)


def starts(counts):
    """The first target row and the first draft of each request."""
    first_draft = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int)
    first_row = first_draft + np.arange(len(counts))
    return first_row, first_draft


def run(s, call, logits=None, **extra):
    kw = dict(draft_probs=call["q"], temperature=call["temperature"], top_k=call["top_k"], top_p=call["top_p"],
              min_p=call["min_p"], uniforms=call["uniforms"], noise=call["noise"])
    kw.update(extra)
    return s.verify(call["x"] if logits is None else logits, call["drafts"], call["counts"], **kw)


def check_shape(r, counts):
    requests, width = len(counts), (int(max(counts)) + 1 if len(counts) else 1)
    assert r.tokens.dtype == np.int32 and r.tokens.shape == (requests, width)
    assert r.counts.dtype == np.int32 and r.counts.shape == (requests,)
    assert r.flags.dtype == np.uint32 and r.flags.shape == (requests,)
    for i, n in enumerate(counts):
        c = r.counts[i]
        assert 1 <= c <= n + 1, f"request {i}: count {c} with {n} drafts"
        assert (r.tokens[i, c:] == -1).all(), f"request {i}: padding {r.tokens[i]}"
        assert (r.tokens[i, :c] >= 0).all()


@pytest.fixture
def bf16_logits(monkeypatch):
    """A function making bfloat16 logits the binding reads in place from float32 values already
    rounded to bfloat16: a torch.bfloat16 tensor, or, without torch, the test stand-in's
    (test_torch_fake.py) tensor over the bit patterns."""
    try:
        import torch

        if getattr(torch, "bfloat16", None) is None or not hasattr(torch, "from_numpy"):
            raise ImportError
        return lambda x: torch.from_numpy(np.ascontiguousarray(x)).to(torch.bfloat16)
    except ImportError:
        from test_torch_fake import make_fake_torch

        fake = make_fake_torch()
        monkeypatch.setitem(sys.modules, "torch", fake)
        return lambda x: fake.Tensor(bf16_bits(x), fake.bfloat16)


def logits_as(dtype, x, bf16_logits):
    if dtype == "float16":
        return x.astype(np.float16)
    if dtype == "bfloat16":
        return bf16_logits(x)
    return x


@pytest.mark.parametrize("threads", [1, 2])
def test_the_reference_cases_are_emitted(tokenrace, threads, bf16_logits):
    s = tokenrace.Sampler(0, max_rows=64, threads=threads, seed=3)
    compared = near = accepted = with_q = greedy = zero = 0
    dtypes = set()
    for n, call in enumerate(reference_cases()):
        dtypes.add(call["dtype"])
        logits = logits_as(call["dtype"], call["x"], bf16_logits)
        r = run(s, call, logits, seeds=call["seeds"], offsets=call["offsets"])
        check_shape(r, call["counts"])
        for i, want in enumerate(call["want"]):
            if want is None:
                near += 1
                continue
            compared += 1
            got = r.tokens[i, :r.counts[i]].tolist()
            assert got == want, (f"case {n} ({call['dtype']}) request {i}: got {got}, reference {want} (drafts "
                                 f"{call['counts'][i]}, T {call['temperature'][i]}, q {call['q'] is not None}, "
                                 f"top_k {call['top_k'][i]}, top_p {call['top_p'][i]}, min_p {call['min_p'][i]})")
            accepted += len(want) - 1
            with_q += call["q"] is not None
            greedy += call["temperature"][i] < GREEDY_BELOW
            zero += call["counts"][i] == 0
    assert dtypes == {"float32", "float16", "bfloat16"}
    assert near * 20 <= compared + near, f"{near} of {compared + near} requests near a threshold"
    # The cases exercise what they are meant to: acceptances, q, greedy requests, zero drafts.
    assert accepted > 20 and with_q > 20 and greedy > 5 and zero > 5, (accepted, with_q, greedy, zero)


def test_strided_inputs_are_read_in_place(tokenrace):
    """Target logits, q rows and noise with rows further apart than their vocab give the same
    tokens as contiguous copies."""
    rng = np.random.default_rng(11)
    s = tokenrace.Sampler(0, max_rows=64)
    for _ in range(10):
        call = random_call(rng, 200, with_q=True)
        want = run(s, call)
        def wide(a):
            big = np.full((a.shape[0], a.shape[1] + 37), np.nan, np.float32)
            big[:, :a.shape[1]] = a
            return big[:, :a.shape[1]]
        got = run(s, call, logits=wide(call["x"]), draft_probs=wide(call["q"]), noise=wide(call["noise"]))
        np.testing.assert_array_equal(got.tokens, want.tokens)
        np.testing.assert_array_equal(got.counts, want.counts)


def test_a_call_large_enough_for_the_workers(tokenrace):
    """Above a million target logits the requests are spread over the sampler's threads: the
    same tokens on 1 and 2 threads, seeded or on external randomness (tests/verify.rs checks the
    workers against the reference)."""
    rng = np.random.default_rng(19)
    call = random_call(rng, 1 << 17, with_q=True)
    while call["x"].shape[0] < 9 or len(call["counts"]) < 2:
        call = random_call(rng, 1 << 17, with_q=True)
    call["temperature"] = np.maximum(call["temperature"], 0.5)
    seeds = np.arange(len(call["counts"]), dtype=np.uint64) + 100
    got = {}
    for threads in (1, 2):
        s = tokenrace.Sampler(0, max_rows=64, threads=threads)
        got[threads] = (emitted(run(s, call)), emitted(run(s, call, seeds=seeds, offsets=7)))
    assert got[1] == got[2]


def test_noise_kinds_and_a_shared_noise_row(tokenrace):
    rng = np.random.default_rng(20)
    s = tokenrace.Sampler(0)
    call = random_call(rng, 100, with_q=True)
    want = emitted(run(s, call))
    assert emitted(run(s, call, noise=np.log(call["noise"]), noise_kind="log_exp")) == want
    one = call["noise"][0]
    tiled = emitted(run(s, call, noise=np.tile(one, (call["x"].shape[0], 1))))
    assert emitted(run(s, call, noise=one)) == tiled
    assert emitted(run(s, call, noise=one[None, :])) == tiled


def test_lists_are_accepted(tokenrace):
    rng = np.random.default_rng(12)
    s = tokenrace.Sampler(0)
    call = random_call(rng, 40, with_q=True)
    want = run(s, call)
    got = s.verify(call["x"].tolist(), call["drafts"].tolist(), call["counts"].tolist(),
                   draft_probs=call["q"].tolist(), temperature=call["temperature"].tolist(),
                   top_k=call["top_k"].tolist(), top_p=call["top_p"].tolist(), min_p=call["min_p"].tolist(),
                   uniforms=call["uniforms"].tolist(), noise=call["noise"].tolist())
    np.testing.assert_array_equal(got.tokens, want.tokens)
    # Other integer dtypes for the ids and counts are converted.
    got = run(s, call, temperature=call["temperature"])
    got64 = s.verify(call["x"], call["drafts"].astype(np.int64), call["counts"].astype(np.uint8),
                     draft_probs=call["q"], temperature=call["temperature"], top_k=call["top_k"],
                     top_p=call["top_p"], min_p=call["min_p"], uniforms=call["uniforms"], noise=call["noise"])
    np.testing.assert_array_equal(got64.tokens, got.tokens)


def test_greedy_requests_accept_while_the_drafts_are_the_argmax(tokenrace):
    vocab = 20
    x = np.array([[(i * 7 + r * 3) % vocab for i in range(vocab)] for r in range(4)], np.float32)
    am = np.argmax(x, axis=1)
    s = tokenrace.Sampler(vocab)
    for drafts, want in [([am[0], am[1], am[2]], [am[0], am[1], am[2], am[3]]),
                         ([am[0], (am[1] + 1) % vocab, am[2]], [am[0], am[1]]),
                         ([(am[0] + 1) % vocab, am[1], am[2]], [am[0]])]:
        # Greedy requests ignore q and uniforms (even ones the library would refuse).
        r = s.verify(x, drafts, [3], temperature=0.0, uniforms=[0.0, 2.0, np.nan],
                     draft_probs=np.full((3, vocab), 0.5, np.float32))
        assert r.tokens[0, :r.counts[0]].tolist() == want
        assert (r.tokens[0, r.counts[0]:] == -1).all() and r.tokens.shape == (1, 4)
        assert r.flags[0] & tokenrace.FLAG_GREEDY


def test_zero_drafts_is_a_plain_draw(tokenrace):
    """A request without drafts emits one token: the draw of its bonus row, seeded or on the
    caller's noise, as ``Sampler.draw`` of that row gives."""
    rng = np.random.default_rng(13)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    e = rng.standard_exponential((3, 64)).astype(np.float32)
    s = tokenrace.Sampler(64)
    r = s.verify(x, [], [0, 0, 0], temperature=[0.7, 1.0, 0.0], seeds=[5, 6, 7], offsets=[9, 0, 3], top_k=10)
    assert r.tokens.shape == (3, 1) and r.counts.tolist() == [1, 1, 1]
    want = s.draw(x, temperature=[0.7, 1.0, 0.0], seeds=[5, 6, 7], offsets=[9, 0, 3], top_k=10)
    np.testing.assert_array_equal(r.tokens[:, 0], want)
    r = s.verify(x, np.zeros(0, np.int32), np.zeros(3, np.int32), noise=e, top_p=0.9)
    np.testing.assert_array_equal(r.tokens[:, 0], s.draw(x, noise=e, top_p=0.9))


def test_no_requests(tokenrace):
    r = tokenrace.Sampler(8).verify(np.zeros((0, 8), np.float32), [], [])
    assert r.tokens.shape == (0, 1) and r.counts.shape == (0,) and r.flags.shape == (0,)


# ----------------------------------------------------------------------------------------------
# Seeded requests


def seeded_call(rng, with_q):
    call = random_call(rng, 500, with_q=with_q)
    while len(call["counts"]) < 4:
        call = random_call(rng, 500, with_q=with_q)
    n = len(call["counts"])
    call["temperature"] = np.maximum(call["temperature"], 0.5)
    call["seeds"] = rng.integers(0, 2**63, n, dtype=np.uint64)
    call["offsets"] = rng.integers(0, 1000, n).astype(np.uint64)
    return call


def subset(call, which):
    """The requests ``which`` of a call, in that order (per-request arrays and rows)."""
    first_row, first_draft = starts(call["counts"])
    out = {k: [] for k in call}
    for i in which:
        n, r, d = int(call["counts"][i]), first_row[i], first_draft[i]
        out["x"].append(call["x"][r:r + n + 1])
        out["noise"].append(call["noise"][r:r + n + 1])
        out["drafts"].append(call["drafts"][d:d + n])
        out["uniforms"].append(call["uniforms"][d:d + n])
        if call["q"] is not None:
            out["q"].append(call["q"][d:d + n])
        for k in ("counts", "temperature", "top_k", "top_p", "min_p", "seeds", "offsets"):
            if k in call:
                out[k].append(call[k][i:i + 1])
    res = {k: (np.concatenate(v) if v else None) for k, v in out.items()}
    res["drafts"] = res["drafts"].astype(np.int32)
    res["x"] = res["x"].reshape(-1, call["x"].shape[1])
    if res["q"] is not None:
        res["q"] = res["q"].reshape(-1, call["x"].shape[1])
    return res


def emitted(r):
    return [r.tokens[i, :r.counts[i]].tolist() for i in range(len(r.counts))]


@pytest.mark.parametrize("with_q", [False, True])
def test_seeded_requests_do_not_depend_on_the_batch(tokenrace, with_q):
    rng = np.random.default_rng([14, with_q])
    call = seeded_call(rng, with_q)
    n = len(call["counts"])
    alone = tokenrace.Sampler(0, seed=1)
    ref = [emitted(run(alone, subset(call, [i]), seeds=subset(call, [i])["seeds"],
                       offsets=subset(call, [i])["offsets"], uniforms=None, noise=None))[0] for i in range(n)]
    assert sum(len(t) for t in ref) > n, "no draft accepted: the test would not cover the later rows"
    # Together, reversed, after unseeded batch mates, with external uniforms and noise (used by
    # the mates only), on another stream and 2 threads.
    mates = random_call(rng, 500, with_q=with_q)
    order = list(range(n))[::-1]
    mixed = subset(call, order)
    m = len(mates["counts"])
    both = {k: (np.concatenate([mates[k], mixed[k]]) if mates[k] is not None else None) for k in
            ("x", "noise", "drafts", "uniforms", "q", "counts", "temperature", "top_k", "top_p", "min_p")}
    seeds = np.concatenate([np.zeros(m, np.uint64), mixed["seeds"]])
    offsets = np.concatenate([np.zeros(m, np.uint64), mixed["offsets"]])
    seeded = np.concatenate([np.zeros(m, bool), np.ones(n, bool)])
    for threads in (1, 2):
        s = tokenrace.Sampler(0, seed=7 + threads, threads=threads)
        for kw in ({}, {"uniforms": None, "noise": None}):
            got = emitted(run(s, both, seeds=seeds, offsets=offsets, seeded=seeded, **kw))[m:]
            assert got == [ref[i] for i in order], f"threads {threads} {kw}"


def test_a_seeded_request_is_a_function_of_seed_and_offset_plus_j(tokenrace):
    """Row j of a seeded request is keyed by (seed, offset + j): when its first draft is
    accepted, the request without it, at offset + 1, emits the rest; and a request whose drafts
    are all accepted draws its bonus token as ``draw`` at offset + n."""
    rng = np.random.default_rng(15)
    s = tokenrace.Sampler(0, seed=2)
    tails = bonus = 0
    for _ in range(40):
        x = (rng.standard_normal((4, 100)) * 0.5).astype(np.float32)
        x[:, 7] += 5.0  # draft 7 is likely accepted
        seed, offset = int(rng.integers(0, 2**63)), int(rng.integers(0, 10**6))
        kw = dict(temperature=0.8, seeds=seed)
        r = s.verify(x, [7, 7, 7], [3], offsets=offset, **kw)
        got = emitted(r)[0]
        if len(got) >= 2:
            tails += 1
            tail = s.verify(x[1:], [7, 7], [2], offsets=offset + 1, **kw)
            assert emitted(tail)[0] == got[1:]
        if len(got) == 4:
            bonus += 1
            assert got[3] == s.draw(x[3], offsets=offset + 3, **kw)[0]
    assert tails > 10 and bonus > 3, (tails, bonus)


def test_unseeded_requests_follow_the_samplers_stream(tokenrace):
    """Without external uniforms and noise, two samplers of the same seed give the same tokens,
    and the tokens change from call to call."""
    rng = np.random.default_rng(16)
    call = random_call(rng, 300, with_q=True)
    call["temperature"][:] = 2.0
    a, b = tokenrace.Sampler(0, seed=42), tokenrace.Sampler(0, seed=42)
    runs_a = [emitted(run(a, call, uniforms=None, noise=None)) for _ in range(8)]
    runs_b = [emitted(run(b, call, uniforms=None, noise=None)) for _ in range(8)]
    assert runs_a == runs_b
    assert len({str(r) for r in runs_a}) > 1


# ----------------------------------------------------------------------------------------------
# Outputs


@pytest.mark.parametrize("mode", ["raw", "processed"])
def test_logprobs_of_the_emitted_tokens(tokenrace, mode):
    rng = np.random.default_rng(17)
    s = tokenrace.Sampler(0, max_rows=64)
    checked = 0
    for _ in range(25):
        call = random_call(rng, 300)
        r = run(s, call, logprobs=True, logprob_mode=mode)
        plain = run(s, call)
        np.testing.assert_array_equal(r.tokens, plain.tokens)  # logprobs change nothing else
        assert r.logprobs.dtype == np.float32 and r.logprobs.shape == r.tokens.shape
        first_row, _ = starts(call["counts"])
        for i in range(len(call["counts"])):
            c = r.counts[i]
            assert np.isnan(r.logprobs[i, c:]).all()
            t = float(call["temperature"][i])
            for k in range(c):
                x = call["x"][first_row[i] + k]
                if mode == "processed" and t >= GREEDY_BELOW:
                    kept, _ = kept_set(x, t, int(call["top_k"][i]), float(call["top_p"][i]),
                                       float(call["min_p"][i]))
                    want = log_softmax64(x, t, kept)[r.tokens[i, k]]
                else:  # raw, and greedy requests in processed mode
                    want = log_softmax64(x)[r.tokens[i, k]]
                assert abs(r.logprobs[i, k] - want) <= 1e-4 * (1 + abs(want)), (i, k, r.logprobs[i, k], want)
                checked += 1
    assert checked > 80
    assert run(s, call).logprobs is None


def test_flags_or_the_rows_looked_at(tokenrace):
    x = np.zeros((4, 10), np.float32)
    x[1, 3] = np.nan  # row 1: request 0's second row, only read if its first draft is accepted
    s = tokenrace.Sampler(10)
    r = s.verify(x, [0, 0], [1, 1], temperature=0.0)  # argmax is 0: request 0 accepts, reads row 1
    assert r.counts.tolist() == [2, 2]
    assert r.flags[0] & tokenrace.FLAG_HAS_NAN and not r.flags[1] & tokenrace.FLAG_HAS_NAN
    r = s.verify(x, [5, 0], [1, 1], temperature=0.0)  # request 0 rejects at row 0: row 1 unread
    assert r.counts[0] == 1 and not r.flags[0] & tokenrace.FLAG_HAS_NAN


def test_emitted_tokens_follow_the_target_distribution(tokenrace):
    """Light version of tests/verify.rs: drafts drawn from q by the test; the first emitted token
    follows p_0 (chi-square), the first draft's acceptance rate is sum min(p_0, q_0); the same
    counts reject a verifier that forgets the residual."""
    x0 = np.array([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, 0.3, 1.2, -1.0, 0.8, -2.0, 0.1], np.float32)
    vocab, n, t = 12, 20000, 0.8
    p0 = softmax64(x0.astype(np.float64) * inv_t(t))
    q0 = softmax64(np.array([0.0, 1.0, 2.0, 0.5, 1.5, -0.5, 0.3, -1.0, 0.0, 0.2, 1.0, 0.4]))
    rng = np.random.default_rng(18)
    drafts = np.minimum(np.searchsorted(np.cumsum(q0), rng.random(n), side="right"), vocab - 1).astype(np.int32)
    x = np.tile(x0, (2 * n, 1))
    q = np.tile(q0.astype(np.float32), (n, 1))
    s = tokenrace.Sampler(vocab, max_rows=2 * n, seed=5)
    r = s.verify(x, drafts, np.ones(n, np.int32), draft_probs=q, temperature=t)
    first = np.bincount(r.tokens[:, 0], minlength=vocab).astype(np.float64)
    critical = wilson_hilferty(vocab - 1, 4.5)
    assert chi_square(first, p0) < critical
    beta = np.minimum(p0, q0).sum()
    k = (r.counts == 2).sum()
    assert abs(k - n * beta) < 5 * math.sqrt(n * beta * (1 - beta)), (k / n, beta)
    forgot = np.minimum(p0, q0) + (1 - beta) * p0
    assert chi_square(first, forgot) > critical


# ----------------------------------------------------------------------------------------------
# Bad input


VOCAB = 50
X6 = np.tile((np.arange(VOCAB) % 7).astype(np.float32), (6, 1))  # rows for counts [2, 0, 1]
DRAFTS = [3, 4, 5]
COUNTS = [2, 0, 1]


@pytest.fixture
def s(tokenrace):
    return tokenrace.Sampler(0, max_rows=16)


def uniform_q(rows=3):
    return np.full((rows, VOCAB), 1.0 / VOCAB, np.float32)


@pytest.mark.parametrize("kwargs,exc,message", [
    (dict(target_logits=X6[0]), ValueError, r"target_logits: must be 2-D"),
    (dict(target_logits=X6[None]), ValueError, r"target_logits: must be 2-D"),
    (dict(target_logits=X6[:5]), ValueError, r"target_logits: has 5 rows; .* 3 requests need 6"),
    (dict(target_logits=X6.astype(np.float64)), ValueError, r"target_logits: dtype float64 is not supported"),
    (dict(target_logits=np.asfortranarray(X6)), ValueError, r"target_logits: values inside a row must be contiguous"),
    (dict(draft_tokens=[3, 4]), ValueError, r"draft_tokens: has 2 ids, draft_counts add up to 3"),
    (dict(draft_tokens=[[3, 4, 5]]), ValueError, r"draft_tokens: must be 1-D"),
    (dict(draft_tokens=[3.0, 4.0, 5.0]), ValueError, r"draft_tokens: must be integers"),
    (dict(draft_tokens=[3, True, 5]), ValueError, r"draft_tokens\[1\]: must be an integer, got a bool"),
    (dict(draft_tokens=[3, 2**31, 5]), ValueError, r"draft_tokens\[1\]: 2147483648 does not fit in an int32"),
    (dict(draft_tokens=np.array([3, 2**40, 5])), ValueError, r"draft_tokens\[1\]: .* does not fit in an int32"),
    (dict(draft_tokens=[3, 4, -2]), ValueError,
     r"draft_tokens\[2\]: request 2, draft 0: -2 is not a token id; the only negative draft id is -1 \(vLLM's "
     r"PLACEHOLDER_TOKEN_ID"),
    (dict(draft_tokens=np.array([-2**31, 4, 5], np.int32)), ValueError,
     r"draft_tokens\[0\]: request 0, draft 0: -2147483648 is not a token id"),
    (dict(offsets=[1, 2, 3]), ValueError, r"offsets: given without seeds; .* needs seeds="),
    (dict(offsets=0), ValueError, r"offsets: given without seeds"),
    (dict(draft_counts=[2, -1, 2]), ValueError, r"draft_counts\[1\]: -1 is negative"),
    (dict(draft_counts=3), ValueError, r"draft_counts: must be 1-D"),
    (dict(draft_counts=[2.0, 0.0, 1.0]), ValueError, r"draft_counts: must be integers"),
    (dict(draft_counts=[2, 0, 2]), ValueError, r"target_logits: has 6 rows; draft_counts add up to 4"),
    (dict(draft_probs=uniform_q(2)), ValueError, r"draft_probs: has shape \(2, 50\), the call needs \(3, 50\)"),
    (dict(draft_probs=uniform_q()[:, :40]), ValueError, r"draft_probs: has shape \(3, 40\)"),
    (dict(draft_probs=uniform_q()[0]), ValueError, r"draft_probs: must be 2-D"),
    (dict(draft_probs=uniform_q().astype(np.float64)), ValueError, r"draft_probs: dtype float64 is not supported"),
    (dict(uniforms=[0.5, 0.5]), ValueError, r"uniforms: has 2 values, draft_counts add up to 3"),
    (dict(uniforms=np.full(3, 0.5, np.float32)), ValueError, r"uniforms: has dtype float32; .*float64"),
    (dict(uniforms=np.full((3, 1), 0.5)), ValueError, r"uniforms: must be 1-D"),
    (dict(uniforms=[0.5, "a", 0.5]), ValueError, r"uniforms\[1\]: must be a number"),
    (dict(noise=np.ones((6, 40), np.float32)), ValueError, r"noise: has 40 values per row, the target logits have 50"),
    (dict(noise=np.ones((5, 50), np.float32)), ValueError, r"noise: has 5 rows, the call has 6 target rows"),
    (dict(noise=np.ones((6, 50))), ValueError, r"noise: dtype float64 is not supported"),
    (dict(temperature=[1.0, 1.0]), ValueError, r"temperature: has 2 elements, the call has 3 requests"),
    (dict(top_k=np.ones((3, 1), np.int32)), ValueError, r"top_k: must be a scalar or 1-D \(one value per request\)"),
    (dict(seeds=[1, -2, 3]), ValueError, r"seeds\[1\]: -2 is not in \[0, 2\*\*64\)"),
    (dict(seeds=1, offsets=[1, 2]), ValueError, r"offsets: has 2 elements, the call has 3 requests"),
    (dict(logprobs=1), TypeError, r"logprobs: must be a bool"),
    (dict(logprob_mode="cooked"), ValueError, r"logprob_mode: 'cooked' is not one of raw, processed"),
    (dict(noise_kind="gumbel"), ValueError, r"noise_kind: 'gumbel' is not one of exp, log_exp"),
])
def test_bad_shapes_and_types_are_refused_before_the_call(s, monkeypatch, tokenrace, kwargs, exc, message):
    called = []
    real = tokenrace._verify._verify_function

    def spy():
        fn = real()
        return lambda *a: called.append(a) or fn(*a)

    monkeypatch.setattr(tokenrace._verify, "_verify_function", spy)
    args = dict(target_logits=X6, draft_tokens=DRAFTS, draft_counts=COUNTS)
    args.update(kwargs)
    with pytest.raises(exc, match=message) as e:
        s.verify(args.pop("target_logits"), args.pop("draft_tokens"), args.pop("draft_counts"), **args)
    assert not isinstance(e.value, tokenrace.TokenraceError), "refused by the library, not the binding"
    assert not called


def bad_q(where, value):
    q = uniform_q()
    q[where] = value
    return q


@pytest.mark.parametrize("kwargs,parts", [
    (dict(draft_tokens=[3, 50, 5]), ["batch.draft_tokens[1]", "request 0, draft 1", "50 is not a token id in [0, 50)"]),
    (dict(draft_probs=bad_q((1, 7), -0.01)), ["batch.draft_probs[1]", "request 0, draft 1", "token 7"]),
    (dict(draft_probs=bad_q((1, 7), np.nan)), ["batch.draft_probs[1]", "token 7"]),
    (dict(draft_probs=bad_q((2, 0), 0.5)), ["batch.draft_probs[2]", "request 2, draft 0", "not 1 within 1e-3"]),
    (dict(uniforms=[0.5, 1.0, 0.5]), ["batch.uniforms[1]", "request 0, draft 1", "(0, 1)"]),
    (dict(uniforms=[0.5, 0.5, 0.0]), ["batch.uniforms[2]", "request 2, draft 0"]),
    (dict(uniforms=[0.5, np.nan, 0.5]), ["batch.uniforms[1]", "request 0"]),
    (dict(top_p=[1.0, 1.5, 1.0]), ["batch.top_p[1]", "1.5 is not in (0, 1]"]),
    (dict(min_p=[0.0, 0.0, 2.0]), ["batch.min_p[2]"]),
    (dict(temperature=[1.0, np.nan, 1.0]), ["batch.temperature[1]"]),
    (dict(temperature=[1.0, 1.0, -1.0]), ["batch.temperature[2]"]),
    (dict(seeded=[True, False, True]), ["batch.seeded", "without seeds"]),
])
def test_bad_values_are_refused_by_the_library_naming_the_request(s, tokenrace, kwargs, parts):
    args = dict(draft_tokens=DRAFTS)
    args.update(kwargs)
    with pytest.raises(tokenrace.InvalidArgumentError) as e:
        s.verify(X6, args.pop("draft_tokens"), COUNTS, **args)
    assert isinstance(e.value, ValueError) and e.value.status == tokenrace._ffi.STATUS_INVALID_ARGUMENT
    for p in parts:
        assert p in str(e.value), f"{str(e.value)!r} lacks {p!r}"


def test_the_samplers_limits_name_the_target_logits(tokenrace):
    with pytest.raises(tokenrace.InvalidArgumentError,
                       match=r"batch.vocab: 50 differs from the sampler's vocab_size 40 \(argument target_logits\)"):
        tokenrace.Sampler(40).verify(X6, DRAFTS, COUNTS)
    with pytest.raises(tokenrace.InvalidArgumentError,
                       match=r"batch.rows: 6 exceeds the sampler's max_rows 4 \(argument target_logits\)"):
        tokenrace.Sampler(0, max_rows=4).verify(X6, DRAFTS, COUNTS)


def test_a_library_without_verify_still_loads_and_verify_says_why(tokenrace, monkeypatch):
    """``tokenrace_verify`` is new in 0.2 (same ABI version): a 0.1 library still loads, and
    ``verify`` raises UnsupportedError naming the function; a missing 0.1 function still fails."""
    ffi = tokenrace._ffi
    real = ffi.lib()

    class Old:
        def __init__(self, missing):
            self.missing = missing

        def __getattr__(self, name):
            if name == self.missing:
                raise AttributeError(name)
            return getattr(real, name)

    ffi._declare(Old("tokenrace_verify"))  # no error
    with pytest.raises(AttributeError):
        ffi._declare(Old("tokenrace_draw"))
    s = tokenrace.Sampler(0)
    monkeypatch.setattr(ffi, "_lib", Old("tokenrace_verify"))
    with pytest.raises(tokenrace.UnsupportedError, match="has no tokenrace_verify"):
        s.verify(X6, DRAFTS, COUNTS)


def test_a_closed_sampler_refuses(tokenrace):
    s = tokenrace.Sampler(0)
    s.close()
    with pytest.raises(tokenrace.ClosedError):
        s.verify(X6, DRAFTS, COUNTS)


# ----------------------------------------------------------------------------------------------
# vLLM's placeholder draft id (-1, PLACEHOLDER_TOKEN_ID)
#
# vLLM pads draft ids with -1 (padded positions, grammar-invalid drafts) and its rejection
# sampler rejects a -1 draft without indexing any probability by it: a greedy request emits the
# row's greedy token there; a sampling request emits the recovered token of any rejection, drawn
# from max(p - q, 0) with the position's q row when there are draft probabilities, from p itself
# without them (no id to leave out). So a -1 draft behaves exactly as a draft the target gives
# probability 0 (here token 63, -inf in every row), which every request rejects: the tests
# compare the two calls, and the draws they must equal.

PV = 64
NEVER = 63  # -inf in every row: probability 0, always rejected


def placeholder_rows(rng, rows=5):
    x = (rng.standard_normal((rows, PV)) * 0.5).astype(np.float32)
    x[np.arange(rows), (np.arange(rows) * 7 + 5) % 60] += 6.0  # peaks: drafts there are mostly accepted
    x[:, NEVER] = -np.inf
    return x


def peaks(x):
    return np.argmax(x, axis=1).astype(np.int32)


def with_never(drafts):
    return np.where(np.asarray(drafts) == -1, NEVER, drafts).astype(np.int32)


@pytest.mark.parametrize("with_q", [False, True])
def test_a_placeholder_draft_is_rejected_by_a_greedy_request(tokenrace, with_q):
    x = placeholder_rows(np.random.default_rng(40))
    g = peaks(x)
    s = tokenrace.Sampler(PV)
    q = np.full((4, PV), 1.0 / PV, np.float32) if with_q else None
    for drafts, want in (([g[0], -1, g[2], g[3]], [g[0], g[1]]), ([-1, g[1], g[2], g[3]], [g[0]]),
                         ([g[0], g[1], g[2], -1], [g[0], g[1], g[2], g[3]])):
        r = s.verify(x, np.array(drafts, np.int32), [4], temperature=0.0, draft_probs=q)
        assert emitted(r) == [want], drafts
        np.testing.assert_array_equal(r.tokens[0, len(want):], -1)
        twin = s.verify(x, with_never(drafts), [4], temperature=0.0, draft_probs=q)
        np.testing.assert_array_equal(r.tokens, twin.tokens)


@pytest.mark.parametrize("with_q", [False, True])
@pytest.mark.parametrize("randomness", ["seeded", "external"])
def test_a_placeholder_draft_is_rejected_by_a_sampling_request(tokenrace, with_q, randomness):
    """Every call with a -1 draft equals the call with a draft of probability 0 in its place,
    stops at the -1 at the latest, and (without q) emits there the row's own draw."""
    rng = np.random.default_rng([41, with_q])
    s = tokenrace.Sampler(PV, max_rows=64)
    stopped_at_placeholder = 0
    for trial in range(30):
        x = placeholder_rows(rng)
        g = peaks(x)
        at = int(rng.integers(0, 4))
        drafts = g[:4].copy()
        drafts[at] = -1
        q = rng.dirichlet(np.ones(PV), size=4).astype(np.float32) if with_q else None
        kw = dict(temperature=0.9, top_k=40, draft_probs=q)
        if randomness == "seeded":
            seed, offset = int(rng.integers(0, 2**63)), int(rng.integers(0, 10**6))
            kw.update(seeds=seed, offsets=offset)
        else:
            kw.update(uniforms=rng.uniform(1e-6, 1 - 1e-6, 4), noise=rng.exponential(size=(5, PV)).astype(np.float32))
        r = s.verify(x, drafts, [4], **kw)
        twin = s.verify(x, with_never(drafts), [4], **kw)
        np.testing.assert_array_equal(r.tokens, twin.tokens)
        got = emitted(r)[0]
        assert 1 <= len(got) <= at + 1 and all(0 <= t < NEVER for t in got), (drafts, got)
        assert got[:len(got) - 1] == drafts[:len(got) - 1].tolist()
        if len(got) == at + 1:
            stopped_at_placeholder += 1
            if q is None and randomness == "seeded":  # the residual is p itself: the row's own draw
                alone = s.draw(x[at], temperature=0.9, top_k=40, seeds=kw["seeds"], offsets=kw["offsets"] + at)
                assert got[at] == alone[0]
    assert stopped_at_placeholder > 10, stopped_at_placeholder


def test_placeholders_pad_a_batch_as_vllm_pads_it(tokenrace):
    """Requests of a batch padded to the same draft count with -1 (vLLM's padded drafts): each
    emits at most its real drafts + 1 tokens, and the same as alone without the padding once a
    real draft is rejected or the padding is reached."""
    rng = np.random.default_rng(42)
    x = placeholder_rows(rng, 8)
    g = peaks(x)
    drafts = np.array([g[0], g[1], -1, g[4], -1, -1], np.int32)  # request 0: 2 real drafts, request 1: 1
    s = tokenrace.Sampler(PV)
    r = s.verify(x, drafts, [3, 3], temperature=[0.0, 0.8], seeds=[1, 2], offsets=[10, 20])
    assert emitted(r)[0] == [g[0], g[1], g[2]]
    assert 1 <= r.counts[1] <= 2 and r.tokens[1, :r.counts[1]].min() >= 0


def test_other_negative_draft_ids_are_refused(tokenrace):
    s = tokenrace.Sampler(PV)
    x = placeholder_rows(np.random.default_rng(43), 3)
    for bad in (-2, -100, -2**31):
        with pytest.raises(ValueError, match=rf"draft_tokens\[1\]: request 0, draft 1: {bad} is not a token id; "
                                             r"the only negative draft id is -1"):
            s.verify(x, [0, bad], [2])


def test_offsets_without_seeds_are_refused(tokenrace):
    """An offset only keys a seeded request; given without seeds it would be ignored."""
    s = tokenrace.Sampler(0)
    with pytest.raises(ValueError, match=r"offsets: given without seeds; an offset is mixed into a seeded "
                                         r"request's seed"):
        s.verify(X6, DRAFTS, COUNTS, offsets=[5, 6, 7])
    s.verify(X6, DRAFTS, COUNTS, seeds=[1, 2, 3], offsets=[5, 6, 7])
    s.verify(X6, DRAFTS, COUNTS, seeds=[1, 2, 3], seeded=[True, False, True], offsets=[5, 6, 7])
