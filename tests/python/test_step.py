"""The sampling step through ``Sampler.draw``/``draw_full`` (docs/semantics.md, The
sampling step): token histories, penalties, logit bias, allowed and banned tokens, grammar
bitmasks, in every input form the binding takes, against a row materialised in numpy.

The reference (``effective_rows``) applies the spec's steps 1-4 literally, in float32, over the
whole vocabulary: masks (allowed list, bitmask, banned list: -inf), the bias (summed in list
order, -inf bans), the repetition penalty (y > 0: y / r, else y * r, for tokens of the prompt or
the output), then frequency and presence (y - f * count, then - p, for tokens of the output).
A draw with the step's arguments must give exactly the tokens of a plain draw (no step
arguments) on that row, with the same seeds, the same external noise or the same stream; its
full-vocabulary logprobs must be the raw ones of the given row, the float64 log_softmax of the
processed row, and the processed row divided by T."""

import numpy as np
import pytest

from reference import inv_t
from test_torch_fake import fake_torch  # noqa: F401  (the fixture: a stand-in torch module)


# -- the reference ------------------------------------------------------------------------------


def bitmask_allows(words, vocab):
    """Bit i of a row of xgrammar words, for i < vocab, as booleans."""
    u = np.asarray(words).view(np.uint32)
    i = np.arange(vocab)
    return ((u[i >> 5] >> (i & 31).astype(np.uint32)) & 1).astype(bool)


def effective_row(x, *, prompt=(), output=(), r=1.0, f=0.0, p=0.0, bias=(), allowed=None, banned=(),
                  bitmask=None, last_n=0, stop=(), min_tokens=0):
    """The processed row y of one row of logits ``x`` (spec steps 1-4, float32, every token).

    ``bias``: (id, value) pairs in list order; ``allowed``: None (unrestricted) or ids;
    ``bitmask``: None or the row's int32 words; ``last_n``: the penalty window (0: every token),
    the last ``last_n`` tokens of prompt + output, each keeping the list it came from; ``stop``
    tokens are banned while ``output`` is shorter than ``min_tokens``."""
    vocab = x.shape[0]
    if len(output) < min_tokens:
        banned = list(banned) + list(stop)
    if last_n:
        history = [(False, t) for t in prompt] + [(True, t) for t in output]
        window = history[max(0, len(history) - last_n):]
        prompt = [t for from_output, t in window if not from_output]
        output = [t for from_output, t in window if from_output]
    y = np.asarray(x, np.float32).astype(np.float32, copy=True)
    masked = np.zeros(vocab, bool)
    if allowed is not None:
        masked |= ~np.isin(np.arange(vocab), np.asarray(allowed, np.int64))
    if bitmask is not None:
        masked |= ~bitmask_allows(bitmask, vocab)
    for i in banned:
        masked[i] = True
    # 2. bias: the f32 sum of the id's values in list order; any -inf bans
    total = {}
    banned_by_bias = set()
    for i, v in bias:
        v = np.float32(v)
        if v == -np.inf:
            banned_by_bias.add(int(i))
        else:
            total[int(i)] = np.float32(total.get(int(i), np.float32(0)) + v)
    for i, b in total.items():
        y[i] = np.float32(y[i] + b)
    for i in banned_by_bias:
        y[i] = -np.inf
    # 3. repetition, for tokens of the prompt or the output
    r = np.float32(r)
    if r != 1:
        for i in sorted(set(int(t) for t in prompt) | set(int(t) for t in output)):
            y[i] = np.float32(y[i] / r) if y[i] > 0 else np.float32(y[i] * r)
    # 4. frequency then presence, for tokens of the output (two f32 subtractions)
    f, p = np.float32(f), np.float32(p)
    counts = np.bincount(np.asarray(list(output), np.int64), minlength=vocab) if len(output) else np.zeros(vocab, int)
    for i in np.flatnonzero(counts):
        y[i] = np.float32(y[i] - np.float32(f * np.float32(counts[i])))
        y[i] = np.float32(y[i] - p)
    y[masked] = -np.inf  # 1. a masked token is -inf whatever the steps above did
    return y


def effective_rows(x, case):
    rows = x.shape[0]
    out = np.empty((rows, x.shape[1]), np.float32)
    for i in range(rows):
        out[i] = effective_row(
            x[i].astype(np.float32), prompt=case.prompt[i] or (), output=case.output[i] or (), r=case.r[i],
            f=case.f[i], p=case.p[i], bias=list((case.bias[i] or {}).items()), allowed=case.allowed[i],
            banned=case.banned[i] or (), bitmask=None if case.bitmask is None else case.bitmask[i],
            last_n=case.last_n[i], stop=case.stop[i] or (), min_tokens=case.min_tokens[i])
    return out


def log_softmax64(z):
    """float64 log_softmax over the finite entries of z (-inf elsewhere)."""
    z = np.asarray(z, np.float64)
    fin = np.isfinite(z)
    out = np.full(z.shape, -np.inf)
    if fin.any():
        top = z[fin].max()
        out[fin] = z[fin] - (top + np.log(np.exp(z[fin] - top).sum()))
    return out


def whole_row_logprobs(result, vocab):
    """The top-n logprobs of a draw_full(logprobs=vocab) scattered back to token order."""
    rows = result.tokens.shape[0]
    lp = np.full((rows, vocab), np.nan, np.float32)
    for i in range(rows):
        lp[i, result.topn_ids[i]] = result.topn_logprobs[i]
    assert not np.isnan(lp).any()
    return lp


# -- a random batch that uses every input ---------------------------------------------------------


class Case:
    """Per-row inputs in the canonical form (lists of Python ints, dicts), and the batch's
    sampling arguments."""

    def __init__(self, rng, rows, vocab, *, bitmask=True, allowed=True):
        self.rows, self.vocab = rows, vocab
        x = (rng.standard_normal((rows, vocab)) * 2).astype(np.float32)
        x[rng.random((rows, vocab)) < 0.02] = 0.0  # zeros: the repetition rule multiplies them
        x[rng.random((rows, vocab)) < 0.01] = -np.inf
        self.x = x
        top = np.argsort(-x, axis=1)[:, :24]  # the likely tokens, so that every step matters

        def some(i, n, hot=0.6):
            ids = np.where(rng.random(n) < hot, rng.choice(top[i], n), rng.integers(0, vocab, n))
            return [int(t) for t in ids]

        self.prompt = [some(i, int(rng.integers(0, 40))) for i in range(rows)]
        self.output = [some(i, int(rng.integers(0, 30))) + some(i, 3) for i in range(rows)]  # duplicates
        self.prompt[1] = None
        self.output[2] = []
        self.r = [float(v) for v in rng.choice([1.0, 1.3, 0.6, 2.5], rows)]
        self.f = [float(v) for v in rng.choice([0.0, 0.2, -0.5, 1.5], rows)]
        self.p = [float(v) for v in rng.choice([0.0, 0.1, 1.0, -0.3], rows)]
        self.bias = []
        for i in range(rows):
            ids = some(i, 6)
            d = {t: float(np.float32(rng.uniform(-6, 6))) for t in ids}
            if i % 3 == 0:
                d[int(top[i, 0])] = -np.inf
            self.bias.append(d)
        self.bias[3] = None
        self.allowed = [None] * rows
        if allowed:
            for i in range(0, rows, 2):
                self.allowed[i] = sorted(set(some(i, vocab // 2, hot=0.3)))
        self.banned = [some(i, 2) for i in range(rows)]
        self.banned[4] = None
        self.bitmask = None
        if bitmask:
            words = -(-vocab // 32)
            bits = rng.random((rows, words * 32)) < 0.8
            self.bitmask = np.packbits(bits.reshape(rows, words, 32)[:, :, ::-1], axis=2).view(">u4").astype(
                np.uint32).view(np.int32).reshape(rows, words)
        self.temperature = np.array([[0.0, 0.7, 1.0, 1.5][i % 4] for i in range(rows)], np.float32)
        self.seeds = np.arange(rows, dtype=np.uint64) * 7919 + 11
        # The penalty window: none, inside the output, across both histories, longer than both.
        self.last_n = [int(v) for v in rng.choice([0, 1, 5, 20, 1000], rows)]
        # min_tokens around each row's output length; stop lists holding likely tokens.
        self.min_tokens = [max(0, len(self.output[i] or ()) + int(rng.integers(-1, 2))) for i in range(rows)]
        self.stop = [some(i, 3, hot=0.9) for i in range(rows)]
        self.stop[5] = None

    def kwargs(self):
        """The step's arguments in the canonical form (lists and dicts)."""
        return dict(prompt_tokens=self.prompt, output_tokens=self.output, repetition_penalty=self.r,
                    frequency_penalty=self.f, presence_penalty=self.p, logit_bias=self.bias,
                    allowed_tokens=self.allowed, banned_tokens=self.banned, token_bitmask=self.bitmask,
                    penalty_last_n=self.last_n, min_tokens=self.min_tokens, stop_token_ids=self.stop)


def test_bitmask_helper_matches_the_layout(rng):
    """The test's bitmask construction: bit j of word w is token 32 w + j."""
    case = Case(rng, 6, 70)
    words = case.bitmask.view(np.uint32)
    for i in range(6):
        for t in range(70):
            assert bitmask_allows(case.bitmask[i], 70)[t] == bool((words[i, t // 32] >> (t % 32)) & 1)


# -- equal tokens and full-vocabulary values --------------------------------------------------------


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("filter_order", ["temperature_first", "filters_first"])
def test_tokens_equal_a_plain_draw_on_the_processed_row(tokenrace, rng, threads, dtype, filter_order):
    rows, vocab = 16, 1003  # not a multiple of 32: the bitmask's last word is partial
    case = Case(rng, rows, vocab)
    x = case.x.astype(dtype)
    y = effective_rows(x, case)
    s = tokenrace.Sampler(vocab, max_rows=rows, threads=threads, seed=21, filter_order=filter_order)
    plain_s = tokenrace.Sampler(vocab, max_rows=rows, threads=threads, seed=21, filter_order=filter_order)
    filters = [dict(), dict(top_k=20), dict(top_p=0.8), dict(min_p=0.05, top_k=50, top_p=0.9)]
    changed = 0
    for extra in filters:
        # seeded rows
        got, flags = s.draw(x, temperature=case.temperature, seeds=case.seeds, return_flags=True, **extra,
                            **case.kwargs())
        want, want_flags = plain_s.draw(y, temperature=case.temperature, seeds=case.seeds, return_flags=True,
                                        **extra)
        np.testing.assert_array_equal(got, want, err_msg=f"seeded, {extra}")
        np.testing.assert_array_equal(flags, want_flags, err_msg=f"flags, {extra}")
        changed += int((got != s.draw(x, temperature=case.temperature, seeds=case.seeds, **extra)).sum())
        # unseeded rows: two samplers of one seed hand out the same keys in row order
        got = s.draw(x, temperature=case.temperature, **extra, **case.kwargs())
        want = plain_s.draw(y, temperature=case.temperature, **extra)
        np.testing.assert_array_equal(got, want, err_msg=f"stream, {extra}")
        # external noise
        e = rng.exponential(size=(rows, vocab)).astype(np.float32)
        got = s.draw(x, temperature=case.temperature, noise=e, **extra, **case.kwargs())
        want = plain_s.draw(y, temperature=case.temperature, noise=e, **extra)
        np.testing.assert_array_equal(got, want, err_msg=f"noise, {extra}")
    assert changed >= rows, "the step's arguments should change many tokens; the test would not see them ignored"


def test_greedy_rows_take_the_argmax_of_the_processed_row(tokenrace, rng):
    case = Case(rng, 12, 300)
    y = effective_rows(case.x, case)
    s = tokenrace.Sampler(300)
    got, flags = s.draw(case.x, temperature=0.0, return_flags=True, **case.kwargs())
    fin = np.where(np.isfinite(y), y, -np.inf)
    np.testing.assert_array_equal(got, np.argmax(fin, axis=1))
    assert (flags & tokenrace.FLAG_GREEDY).all()


@pytest.mark.parametrize("filter_order", ["temperature_first", "filters_first"])
def test_full_logprobs_raw_processed_and_processed_logits(tokenrace, rng, filter_order):
    rows, vocab = 12, 517
    case = Case(rng, rows, vocab)
    x, y = case.x, effective_rows(case.x, case)
    s = tokenrace.Sampler(vocab, max_rows=rows, filter_order=filter_order)
    t = case.temperature
    args = dict(temperature=t, seeds=case.seeds, **case.kwargs())
    # raw: the logprobs of the logits as given, whatever the step does
    raw = s.draw_full(x, full_logprobs="raw", **args)
    plain_raw = s.draw_full(x, temperature=t, seeds=case.seeds, logprobs=vocab)
    assert raw.full_logprobs.dtype == np.float32 and raw.full_logprobs.shape == (rows, vocab)
    np.testing.assert_array_equal(raw.full_logprobs, whole_row_logprobs(plain_raw, vocab))
    # processed, no filters: float64 log_softmax of (y - m) * inv_t over the finite y
    proc = s.draw_full(x, full_logprobs="processed", **args)
    np.testing.assert_array_equal(proc.tokens, s.draw(y, temperature=t, seeds=case.seeds))
    for i in range(rows):
        fin = np.isfinite(y[i])
        if not fin.any():
            continue
        scale = 1.0 if t[i] == 0 else inv_t(t[i])
        z = np.where(fin, (y[i].astype(np.float64) - y[i][fin].max()) * scale, -np.inf)
        np.testing.assert_allclose(proc.full_logprobs[i], log_softmax64(z), rtol=0, atol=1e-5, err_msg=f"row {i}")
        assert np.array_equal(np.isfinite(proc.full_logprobs[i]), fin)
    # processed logits: y / T on the kept tokens (y in greedy rows), -inf elsewhere
    logits = s.draw_full(x, full_logprobs="processed_logits", **args)
    for i in range(rows):
        fin = np.isfinite(y[i])
        want = np.full(vocab, -np.inf, np.float32)
        want[fin] = y[i][fin] if t[i] == 0 else y[i][fin] / np.float32(t[i])
        np.testing.assert_array_equal(logits.full_logprobs[i], want, err_msg=f"row {i}")
    for r in (raw, proc, logits):
        np.testing.assert_array_equal(r.tokens, raw.tokens)


@pytest.mark.parametrize("filter_order", ["temperature_first", "filters_first"])
def test_processed_full_logprobs_with_filters(tokenrace, rng, filter_order):
    """With filters the kept set is the plain draw's on the processed row; the values are the
    float64 log_softmax over it; in filters_first order the kept set is the one of T = 1."""
    rows, vocab = 8, 400
    case = Case(rng, rows, vocab)
    x, y = case.x, effective_rows(case.x, case)
    t = np.array([0.5, 2.0, 1.0, 3.0] * 2, np.float32)
    s = tokenrace.Sampler(vocab, filter_order=filter_order)
    flt = dict(top_k=40, top_p=0.7)
    got = s.draw_full(x, temperature=t, seeds=case.seeds, full_logprobs="processed", logprobs=vocab,
                      logprob_mode="processed", **flt, **case.kwargs())
    plain = s.draw_full(y, temperature=t, seeds=case.seeds, logprobs=vocab, logprob_mode="processed", **flt)
    np.testing.assert_array_equal(got.tokens, plain.tokens)
    np.testing.assert_array_equal(got.full_logprobs, whole_row_logprobs(got, vocab))
    kept = np.isfinite(whole_row_logprobs(plain, vocab))
    np.testing.assert_array_equal(np.isfinite(got.full_logprobs), kept)
    if filter_order == "filters_first":
        at_one = s.draw_full(y, temperature=1.0, logprobs=vocab, logprob_mode="processed", **flt)
        np.testing.assert_array_equal(kept, np.isfinite(whole_row_logprobs(at_one, vocab)))
    for i in range(rows):
        m = y[i][np.isfinite(y[i])].max()
        z = np.where(kept[i], (y[i].astype(np.float64) - m) * inv_t(t[i]), -np.inf)
        np.testing.assert_allclose(got.full_logprobs[i], log_softmax64(z), rtol=0, atol=1e-5)


def test_the_two_filter_orders_keep_different_sets(tokenrace, rng):
    """At T = 3 with top-p 0.5, temperature first keeps more tokens than filters first (which
    judges the sharper untempered distribution)."""
    x = (rng.standard_normal((1, 200)) * 3).astype(np.float32)
    sets = {}
    for order in ("temperature_first", "filters_first"):
        s = tokenrace.Sampler(200, filter_order=order)
        assert s.filter_order == order and s.config["filter_order"] == order
        r = s.draw_full(x, temperature=3.0, top_p=0.5, full_logprobs="processed", repetition_penalty=1.0)
        sets[order] = np.isfinite(r.full_logprobs[0])
    assert sets["filters_first"].sum() < sets["temperature_first"].sum()
    assert (sets["filters_first"] <= sets["temperature_first"]).all()


# -- every input form -------------------------------------------------------------------------------


def csr(lists, ids_dtype=np.int32, offsets_dtype=np.uint64):
    ids = np.concatenate([np.asarray(r or [], np.int64) for r in lists]).astype(ids_dtype)
    offsets = np.concatenate([[0], np.cumsum([len(r or []) for r in lists])]).astype(offsets_dtype)
    return ids, offsets


def padded(lists, vocab, pad, dtype=np.int64):
    width = max(len(r or []) for r in lists) + 3
    out = np.full((len(lists), width), pad, dtype)
    for i, r in enumerate(lists):
        out[i, :len(r or [])] = r or []
    return out


def bias_csr(dicts, ids_dtype=np.int32, values_dtype=np.float32, offsets_dtype=np.uint64):
    ids = [k for d in dicts for k in (d or {})]
    values = [v for d in dicts for v in (d or {}).values()]
    offsets = np.concatenate([[0], np.cumsum([len(d or {}) for d in dicts])])
    return (np.array(ids, ids_dtype), np.array(values, values_dtype), offsets.astype(offsets_dtype))


def _list_forms(lists, vocab):
    """Every form of a per-row id list argument, by name."""
    return {
        "lists of ints": lists,
        "lists of int32 arrays": [None if r is None else np.array(r, np.int32) for r in lists],
        "lists of int64 arrays and tuples": [None if r is None else (np.array(r, np.int64) if i % 2 else tuple(r))
                                             for i, r in enumerate(lists)],
        "csr int32/uint64": csr(lists),
        "csr int64/int64": csr(lists, np.int64, np.int64),
        "csr uint16/int32": csr(lists, np.uint16, np.int32),
        "padded with vocab": padded(lists, vocab, vocab),
        "padded with -1": padded(lists, vocab, -1),
        "padded int32 with -7": padded(lists, vocab, -7, np.int32),
    }


@pytest.mark.parametrize("argument", ["prompt_tokens", "output_tokens", "banned_tokens"])
def test_every_form_of_a_token_list(tokenrace, rng, argument):
    case = Case(rng, 8, 260, bitmask=False, allowed=False)
    base = case.kwargs()
    s = tokenrace.Sampler(260)
    want = s.draw(effective_rows(case.x, case), temperature=case.temperature, seeds=case.seeds)
    lists = base[argument]
    for name, form in _list_forms(lists, 260).items():
        args = dict(base, **{argument: form})
        got = s.draw(case.x, temperature=case.temperature, seeds=case.seeds, **args)
        np.testing.assert_array_equal(got, want, err_msg=f"{argument} as {name}")


def test_every_form_of_allowed_tokens(tokenrace, rng):
    """Per-row lists with None rows (unrestricted) set allowed_rows; the CSR and padded forms
    restrict every row, so they are compared on a batch where every row has a list."""
    case = Case(rng, 8, 260, bitmask=False)
    s = tokenrace.Sampler(260)
    want = s.draw(effective_rows(case.x, case), temperature=case.temperature, seeds=case.seeds)
    for form in (case.allowed, [None if r is None else np.array(r, np.int64) for r in case.allowed]):
        got = s.draw(case.x, temperature=case.temperature, seeds=case.seeds, **dict(case.kwargs(), allowed_tokens=form))
        np.testing.assert_array_equal(got, want)
    case.allowed = [r if r is not None else list(range(0, 260, 3)) for r in case.allowed]
    want = s.draw(effective_rows(case.x, case), temperature=case.temperature, seeds=case.seeds)
    for name, form in _list_forms(case.allowed, 260).items():
        got = s.draw(case.x, temperature=case.temperature, seeds=case.seeds, **dict(case.kwargs(), allowed_tokens=form))
        np.testing.assert_array_equal(got, want, err_msg=name)
    # no row restricted: as if not given
    none = s.draw(case.x, temperature=case.temperature, seeds=case.seeds,
                  **dict(case.kwargs(), allowed_tokens=[None] * 8))
    case.allowed = [None] * 8
    np.testing.assert_array_equal(none, s.draw(effective_rows(case.x, case), temperature=case.temperature,
                                               seeds=case.seeds))


def test_every_form_of_logit_bias(tokenrace, rng):
    case = Case(rng, 8, 260, bitmask=False, allowed=False)
    s = tokenrace.Sampler(260)
    want = s.draw(effective_rows(case.x, case), temperature=case.temperature, seeds=case.seeds)
    forms = {
        "dicts": case.bias,
        "dicts with numpy keys and values": [None if d is None else {np.int64(k): np.float64(v) for k, v in d.items()}
                                             for d in case.bias],
        "csr": bias_csr(case.bias),
        "csr int64 ids, float64 values, int64 offsets": bias_csr(case.bias, np.int64, np.float64, np.int64),
        "csr int16 ids, uint32 offsets": bias_csr(case.bias, np.int16, np.float32, np.uint32),
    }
    for name, form in forms.items():
        got = s.draw(case.x, temperature=case.temperature, seeds=case.seeds, **dict(case.kwargs(), logit_bias=form))
        np.testing.assert_array_equal(got, want, err_msg=name)
    # one dict for every row
    one = {3: 2.5, 17: -np.inf, int(np.argmax(case.x[0])): -4.0}
    case.bias = [one] * 8
    want = s.draw(effective_rows(case.x, case), temperature=case.temperature, seeds=case.seeds)
    got = s.draw(case.x, temperature=case.temperature, seeds=case.seeds, **dict(case.kwargs(), logit_bias=one))
    np.testing.assert_array_equal(got, want)


def test_csr_bias_pairs_of_one_id_add_up_in_order(tokenrace, rng):
    x = rng.standard_normal((1, 64)).astype(np.float32)
    pairs = [(5, 0.1), (9, 3.0), (5, 1e8), (5, -1e8), (9, -np.inf), (9, 1.0), (20, 0.5), (20, 0.25)]
    ids = np.array([i for i, _ in pairs], np.int32)
    values = np.array([v for _, v in pairs], np.float32)
    y = effective_row(x[0], bias=pairs)
    assert y[9] == -np.inf and y[5] == np.float32(np.float32(np.float32(0.1) + np.float32(1e8)) - np.float32(1e8)) + x[0, 5]
    s = tokenrace.Sampler(64)
    r = s.draw_full(x, temperature=1.0, logit_bias=(ids, values, np.array([0, 8])), full_logprobs="processed_logits")
    np.testing.assert_array_equal(r.full_logprobs[0], y)


def test_torch_tensors_for_every_argument(tokenrace, rng, fake_torch):
    case = Case(rng, 8, 260)
    s = tokenrace.Sampler(260)
    y = effective_rows(case.x, case)
    want = s.draw(y, temperature=case.temperature, seeds=case.seeds)
    T = fake_torch.from_numpy

    def tensors(lists):
        return [None if r is None else T(np.array(r, np.int64)) for r in lists]

    ids, offsets = csr(case.output, np.int64, np.int64)
    bias = bias_csr(case.bias, np.int64, np.float32, np.int64)
    args = dict(prompt_tokens=T(padded(case.prompt, 260, 260)), output_tokens=(T(ids), T(offsets)),
                repetition_penalty=T(np.array(case.r, np.float32)), frequency_penalty=T(np.array(case.f, np.float32)),
                presence_penalty=T(np.array(case.p, np.float32)), logit_bias=tuple(T(a) for a in bias),
                allowed_tokens=tensors(case.allowed), banned_tokens=tensors(case.banned),
                token_bitmask=T(case.bitmask), penalty_last_n=T(np.array(case.last_n, np.int32)),
                min_tokens=T(np.array(case.min_tokens, np.int64)), stop_token_ids=tensors(case.stop))
    got = s.draw(T(case.x), temperature=T(case.temperature), seeds=T(case.seeds.astype(np.int64)), **args)
    np.testing.assert_array_equal(got, want)
    out = T(np.full((8, 260), 7.0, np.float32))
    r = s.draw_full(T(case.x), temperature=T(case.temperature), seeds=T(case.seeds.astype(np.int64)),
                    full_logprobs="processed_logits", out=out, **args)
    assert r.full_logprobs is out
    fin = np.isfinite(y)
    np.testing.assert_array_equal(np.isfinite(out.numpy()), fin)


def test_torch_bitmask_refusals(tokenrace, fake_torch):
    s = tokenrace.Sampler(64)
    x = np.zeros((2, 64), np.float32)
    T = fake_torch.Tensor
    cases = [
        (T(np.zeros((2, 2), np.int64), fake_torch.int64), "dtype torch.int64 is not supported"),
        (T(np.zeros((2, 2), np.int32), fake_torch.int32, device="cuda"), "cpu"),
        (T(np.zeros((2, 2), np.int32), fake_torch.int32, layout="sparse_coo"), "layout"),
        (T(np.zeros((2, 4), np.int32), fake_torch.int32)[:, ::2], "contiguous"),
    ]
    for tensor, what in cases:
        with pytest.raises(ValueError, match="token_bitmask") as e:
            s.draw(x, token_bitmask=tensor)
        assert what in str(e.value)


# -- the bitmask is read in place ------------------------------------------------------------------


def test_bitmask_is_read_in_place_at_any_row_stride(tokenrace, rng):
    from tokenrace import _step

    rows, vocab = 4, 100  # 4 words, the last holds 4 tokens
    words = 4
    big = np.zeros((2 * rows, words + 3), np.int32)
    view = big[::2, 1:1 + words]
    keep = []
    ptr, stride = _step.bitmask_view(view, rows, vocab, "token_bitmask", keep)
    assert ptr == big.ctypes.data + 4 and stride == 2 * (words + 3) and keep[0] is view
    x = rng.standard_normal((rows, vocab)).astype(np.float32)
    s = tokenrace.Sampler(vocab)
    allowed_token = [7, 40, 99, 64]  # 99: a bit of the partial last word
    for i, t in enumerate(allowed_token):
        big[2 * i, 1 + t // 32] = np.uint32(1 << (t % 32)).view(np.int32) if t % 32 == 31 else 1 << (t % 32)
    big[1::2] = -1  # the rows between are all ones: never read
    got, flags = s.draw(x, temperature=1.0, token_bitmask=view, return_flags=True)
    assert got.tolist() == allowed_token and not (flags & tokenrace.FLAG_EMPTY).any()
    # bits past the vocabulary are ignored: set them all, the draw is unchanged
    big[::2, 1 + 3] |= np.int32(-16)  # bits 4..31 of the last word: tokens 100..127
    np.testing.assert_array_equal(s.draw(x, temperature=1.0, token_bitmask=view), allowed_token)
    # the memory is read at the call: a change shows
    big[0, 1] = 1 << 3
    assert s.draw(x, temperature=1.0, token_bitmask=view)[0] == 3
    # a single row as 1-D, an all-ones mask is unconstrained
    assert s.draw(x[1], temperature=1.0, token_bitmask=view[1])[0] == 40
    ones = np.full((rows, words), -1, np.int32)
    np.testing.assert_array_equal(s.draw(x, seeds=5, token_bitmask=ones), s.draw(x, seeds=5))


def test_bitmask_refusals(tokenrace):
    s = tokenrace.Sampler(100)
    x = np.zeros((2, 100), np.float32)
    cases = [
        (np.zeros((2, 4), np.int64), "dtype int64 is not supported"),
        (np.zeros((2, 4), np.uint32), "dtype uint32 is not supported"),
        (np.zeros((2, 3), np.int32), "has 3 words per row, vocab 100 needs ceil(100 / 32) = 4"),
        (np.zeros((3, 4), np.int32), "has 3 rows, the batch has 2"),
        (np.zeros((2, 8), np.int32)[:, ::2], "contiguous"),
        (np.zeros(4, np.int32), "1-D (one row), the batch has 2 rows"),
        (np.zeros((2, 2, 4), np.int32), "2-D"),
        (np.zeros((4, 4), np.int32)[::-2], "overlap or run backwards"),
        ([[0] * 4] * 2, "must be an int32 numpy array"),
    ]
    for value, message in cases:
        with pytest.raises((ValueError, TypeError), match="token_bitmask") as e:
            s.draw(x, token_bitmask=value)
        assert message in str(e.value), str(e.value)


# -- edge cases ----------------------------------------------------------------------------------------


def test_edge_cases_of_the_step(tokenrace):
    s = tokenrace.Sampler(8)
    x = np.array([[2.0, 0.0, -1.0, 1.0, -np.inf, 0.5, 3.0, -2.0]], np.float32)
    # repetition on positive, zero and negative logits; a token in both prompt and output counts once
    # for the repetition penalty; duplicates in the output count
    kw = dict(prompt_tokens=[[0, 1, 2, 6]], output_tokens=[[6, 6, 2, 5]], repetition_penalty=2.0,
              frequency_penalty=0.5, presence_penalty=0.25)
    r = s.draw_full(x, temperature=1.0, full_logprobs="processed_logits", **kw)
    want = effective_row(x[0], prompt=[0, 1, 2, 6], output=[6, 6, 2, 5], r=2.0, f=0.5, p=0.25)
    np.testing.assert_array_equal(r.full_logprobs[0], want)
    np.testing.assert_array_equal(want, np.float32([1.0, 0.0, -2.75, 1.0, -np.inf, -0.5, 0.25, -2.0]))
    # an empty allowed list allows nothing: the row is EMPTY, token 0 (in range)
    tokens, flags = s.draw(x, allowed_tokens=[[]], return_flags=True)
    assert tokens[0] == 0 and flags[0] & tokenrace.FLAG_EMPTY
    # -inf bias on the only finite token
    one = np.array([[-np.inf, 1.0, -np.inf, -np.inf, -np.inf, -np.inf, -np.inf, -np.inf]], np.float32)
    tokens, flags = s.draw(one, logit_bias={1: -np.inf}, return_flags=True)
    assert flags[0] & tokenrace.FLAG_EMPTY
    # bias on a masked token does not unmask it
    tokens = s.draw(x, temperature=0.0, banned_tokens=[[6]], logit_bias={6: 100.0, 4: 100.0})
    assert tokens[0] == 0
    # greedy rows with penalties: the argmax of the penalised row
    assert s.draw(x, temperature=0.0, output_tokens=[[6]], frequency_penalty=3.0)[0] == 0


def test_empty_and_none_rows_change_nothing(tokenrace, rng):
    x = rng.standard_normal((3, 50)).astype(np.float32)
    s = tokenrace.Sampler(50)
    plain = s.draw(x, seeds=[1, 2, 3])
    for kw in (dict(prompt_tokens=[None, [], None], repetition_penalty=3.0),
               dict(output_tokens=([], [0, 0, 0, 0]), frequency_penalty=1.0, presence_penalty=1.0),
               dict(logit_bias=[None, {}, None]), dict(logit_bias={}), dict(banned_tokens=[[], None, []]),
               dict(allowed_tokens=[None, None, None]), dict(repetition_penalty=1.0, frequency_penalty=0.0)):
        np.testing.assert_array_equal(s.draw(x, seeds=[1, 2, 3], **kw), plain, err_msg=str(kw))


# -- errors: argument, row, position; nothing written ------------------------------------------------


ERRORS = [
    # (arguments, a regular expression the message must match)
    (dict(prompt_tokens=[[1, 2], [3, 4, 64]]),
     r"batch\.prompt_ids\[1\]: position 2 \(entry 4\): 64 is not a token id in \[0, 64\).*argument prompt_tokens"),
    (dict(output_tokens=[[1], [1, -1]]), r"batch\.output_ids\[1\]: position 1 \(entry 2\): -1 is not a token id.*output_tokens"),
    (dict(banned_tokens=[[], [5, 70]]), r"banned_ids\[1\]: position 1 \(entry 1\): 70 .*banned_tokens"),
    (dict(allowed_tokens=[None, [99]]), r"allowed_ids\[1\]: position 0 .*99.*allowed_tokens"),
    (dict(prompt_tokens=[[1], [2, 3, 2**31]]),
     r"^prompt_tokens\[1\]: position 2: 2147483648 is not a token id \(it does not fit in an int32\)"),
    (dict(prompt_tokens=[[1], [2, 3, 2**70]]), r"^prompt_tokens\[1\]: position 2: 1180591620717411303424"),
    (dict(prompt_tokens=[[1], [2, 3.5]]), r"^prompt_tokens\[1\]: must be integers"),
    (dict(prompt_tokens=[[1], [True]]), r"^prompt_tokens\[1\]: must be integers, got booleans"),
    (dict(prompt_tokens=[[1]]), r"^prompt_tokens: has 1 rows, the batch has 2"),
    (dict(output_tokens=(np.array([1, 2, 3, 2**40]), np.array([0, 1, 4]))),
     r"^output_tokens\[1\]: position 2 \(entry 3\): 1099511627776 is not a token id \(it does not fit"),
    (dict(output_tokens=(np.array([1, 2, 3]), np.array([0, 2]))),
     r"^output_tokens: has 2 offsets, the batch of 2 rows needs 3"),
    (dict(output_tokens=(np.array([1, 2, 3]), np.array([0, 2, 1]))),
     r"^output_tokens: offsets\[2\]: 1 is below the previous offset 2"),
    (dict(output_tokens=(np.array([1, 2, 3]), np.array([0, 2, 5]))),
     r"^output_tokens: offsets\[2\]: 5 is past the end of the 3 entries"),
    (dict(output_tokens=(np.array([1, 2, 3]), np.array([-1, 2, 3]))), r"^output_tokens: offsets\[0\]: -1 is negative"),
    (dict(output_tokens=(np.array([1, 2, 300]), np.array([0, 2, 3]))),
     r"batch\.output_ids\[1\]: position 0 \(entry 2\): 300 is not a token id.*output_tokens"),
    (dict(output_tokens=(np.array([1.0]), np.array([0, 1, 1]))), r"^output_tokens ids: must be integers"),
    (dict(output_tokens=(np.array([1]),)), r"^output_tokens: a tuple is read as CSR \(ids, offsets\)"),
    (dict(prompt_tokens=np.array([[1, 64, 65], [2, -1, 64]])),
     r"^prompt_tokens\[0\]: position 2: 65 is not a token id in \[0, 64\) \(nor padding: 64 or negative\)"),
    (dict(prompt_tokens=np.array([[1, 2]])), r"^prompt_tokens: has 1 rows, the batch has 2"),
    (dict(prompt_tokens=np.array([1, 2])), r"^prompt_tokens: an array must be 2-D"),
    (dict(prompt_tokens=np.zeros((2, 2), np.float32)), r"^prompt_tokens: must be integers, got dtype float32"),
    (dict(prompt_tokens="abc"), r"^prompt_tokens: must be a list of per-row ids"),
    (dict(logit_bias={3: np.inf}),
     r"batch\.bias_values\[0\]: position 0 \(entry 0\): inf is not a bias \(finite, or -inf to ban\).*logit_bias"),
    (dict(logit_bias=[{1: 1.0}, {3: 1.0, 4: np.nan}]), r"bias_values\[1\]: position 1 \(entry 2\): NaN.*logit_bias"),
    (dict(logit_bias=[None, {3: 1.0, 64: 1.0}]), r"bias_ids\[1\]: position 1 \(entry 1\): 64 is not a token id"),
    (dict(logit_bias=[None, {3: 1.0, 2**31: 1.0}]), r"^logit_bias\[1\]: position 1: 2147483648 is not a token id"),
    (dict(logit_bias=[None, {"a": 1.0}]), r"^logit_bias\[1\]: position 0: the key 'a' is not a token id"),
    (dict(logit_bias=[None, {1: "x"}]), r"^logit_bias\[1\]: position 0 \(id 1\): the bias 'x' is not a number"),
    (dict(logit_bias=[None, {1: 1e300}]), r"^logit_bias\[1\]: position 0 \(id 1\): the bias 1e\+300 does not fit in a float32"),
    (dict(logit_bias=(np.array([1, 2]), np.array([0.5, 1e300]), np.array([0, 1, 2]))),
     r"^logit_bias\[1\]: position 0 \(entry 1\): the bias 1e\+300 does not fit in a float32"),
    (dict(logit_bias=(np.array([1, 2]), np.array([0.5, 1.0], np.float16), np.array([0, 1, 2]))),
     r"^logit_bias: values must be float32 or float64, got dtype float16"),
    (dict(logit_bias=(np.array([1, 2]), np.array([0.5]), np.array([0, 1, 2]))), r"^logit_bias: has 2 ids and 1 values"),
    (dict(logit_bias=[{1: 1.0}]), r"^logit_bias: has 1 rows, the batch has 2"),
    (dict(logit_bias=[{1: 1.0}, [1, 2]]), r"^logit_bias\[1\]: must be a dict"),
    (dict(logit_bias=5), r"^logit_bias: must be a dict"),
    (dict(repetition_penalty=[1.0, 0.0]), r"batch\.repetition_penalty\[1\]: 0 is not a finite number > 0"),
    (dict(repetition_penalty=-1.0), r"batch\.repetition_penalty\[0\]: -1 is not a finite number > 0"),
    (dict(frequency_penalty=[0.0, np.inf]), r"batch\.frequency_penalty\[1\]: inf is not finite"),
    (dict(presence_penalty=[np.nan, 0.0]), r"batch\.presence_penalty\[0\]: NaN is not finite"),
    (dict(presence_penalty=[1.0, 2.0, 3.0]), r"^presence_penalty: has 3 elements, the batch has 2 rows"),
    (dict(penalty_last_n=[0, -1]), r"batch\.penalty_last_n\[1\]: -1 is negative"),
    (dict(penalty_last_n=[1, 2, 3]), r"^penalty_last_n: has 3 elements, the batch has 2 rows"),
    (dict(penalty_last_n=[1.5, 2]), r"^penalty_last_n: must be integers"),
    (dict(min_tokens=[-2, 0]), r"batch\.min_tokens\[0\]: -2 is negative"),
    # Lists already in the C form go to the library as they are; it refuses offsets that
    # decrease, naming the field, the offset and the argument.
    (dict(prompt_tokens=(np.array([1, 2, 3], np.int32), np.array([0, 2, 1], np.uint64))),
     r"batch\.prompt_offsets\[2\]: 1 is below the previous offset 2.*prompt_tokens"),
    (dict(logit_bias=(np.array([1, 2], np.int32), np.array([0.5, 1.0], np.float32), np.array([0, 2, 1], np.uint64))),
     r"batch\.bias_offsets\[2\]: 1 is below the previous offset 2.*logit_bias"),
    (dict(min_tokens=3, stop_token_ids=[[1], [2, 64]]),
     r"batch\.stop_ids\[1\]: position 1 \(entry 2\): 64 is not a token id.*stop_token_ids"),
]


@pytest.mark.parametrize("kwargs,pattern", ERRORS, ids=[p[:40] for _, p in ERRORS])
def test_errors_name_the_argument_row_and_position_and_write_nothing(tokenrace, rng, kwargs, pattern):
    s = tokenrace.Sampler(64)
    x = rng.standard_normal((2, 64)).astype(np.float32)
    with pytest.raises((ValueError, TypeError), match=pattern):
        s.draw(x, **kwargs)
    out = np.full((2, 64), 123.0, np.float32)
    with pytest.raises((ValueError, TypeError), match=pattern):
        s.draw_full(x, full_logprobs="raw", out=out, **kwargs)
    assert (out == 123.0).all(), "a failed call wrote to out"
    # the sampler and this thread's cached structs still work
    np.testing.assert_array_equal(s.draw(x, temperature=0), np.argmax(x, axis=1))


def test_library_errors_are_invalid_argument_errors(tokenrace):
    s = tokenrace.Sampler(8)
    with pytest.raises(tokenrace.InvalidArgumentError) as e:
        s.draw(np.zeros((1, 8), np.float32), prompt_tokens=[[9]])
    assert e.value.status == tokenrace._ffi.STATUS_INVALID_ARGUMENT


# -- the full-vocabulary output -------------------------------------------------------------------------


def test_full_logprobs_into_a_strided_out(tokenrace, rng):
    rows, vocab = 3, 70
    x = rng.standard_normal((rows, vocab)).astype(np.float32)
    s = tokenrace.Sampler(vocab)
    big = np.full((rows * 2, vocab + 5), 9.0, np.float32)
    out = big[::2, 2:2 + vocab]
    r = s.draw_full(x, seeds=[1, 2, 3], full_logprobs="raw", out=out)
    assert r.full_logprobs is out
    want = s.draw_full(x, seeds=[1, 2, 3], full_logprobs="raw").full_logprobs
    np.testing.assert_array_equal(out, want)
    untouched = np.ones(big.shape, bool)
    untouched[::2, 2:2 + vocab] = False
    assert (big[untouched] == 9.0).all(), "values outside the rows' vocab were written"
    one = np.zeros(vocab, np.float32)
    assert s.draw_full(x[0], full_logprobs="raw", out=one).full_logprobs is one
    np.testing.assert_array_equal(one, want[0])


@pytest.mark.parametrize("out,message", [
    (np.zeros((3, 70), np.float64), "out: has dtype float64"),
    (np.zeros((3, 71), np.float32), r"out: has shape \(3, 71\), the batch needs \(3, 70\)"),
    (np.zeros((2, 70), np.float32), r"out: has shape \(2, 70\)"),
    (np.zeros(70, np.float32), r"out: has shape \(70,\), the batch needs \(3, 70\)"),
    (np.zeros((3, 140), np.float32)[:, ::2], "out: values inside a row must be contiguous"),
    (np.zeros((6, 70), np.float32)[::-2], "out: has a negative row stride"),
    ([[0.0] * 70] * 3, "out: must be a float32 numpy array"),
])
def test_out_refusals(tokenrace, out, message):
    s = tokenrace.Sampler(70)
    with pytest.raises((ValueError, TypeError), match=message):
        s.draw_full(np.zeros((3, 70), np.float32), full_logprobs="raw", out=out)


def test_out_and_full_logprobs_misuse(tokenrace):
    s = tokenrace.Sampler(10)
    x = np.zeros((2, 10), np.float32)
    ro = np.zeros((2, 10), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="out: is read-only"):
        s.draw_full(x, full_logprobs="raw", out=ro)
    with pytest.raises(ValueError, match="out: given without full_logprobs"):
        s.draw_full(x, out=np.zeros((2, 10), np.float32))
    with pytest.raises(ValueError, match="full_logprobs: 'logits' is not one of raw, processed, processed_logits"):
        s.draw_full(x, full_logprobs="logits")
    with pytest.raises(ValueError, match=r"out: overlaps logits: out spans bytes \[0x"):
        s.draw_full(x, full_logprobs="raw", out=x)
    with pytest.raises(ValueError, match="filter_order: 'vllm' is not one of"):
        tokenrace.Sampler(10, filter_order="vllm")


def test_nothing_is_written_when_the_library_refuses(tokenrace, rng):
    """A call the library refuses (an id out of range in the last row) leaves every output as it
    was: out=, and no result is returned."""
    x = rng.standard_normal((4, 40)).astype(np.float32)
    s = tokenrace.Sampler(40)
    out = np.full((4, 40), -3.0, np.float32)
    with pytest.raises(ValueError, match=r"banned_ids\[3\]"):
        s.draw_full(x, full_logprobs="processed", out=out, banned_tokens=[[1], [2], [3], [40]])
    assert (out == -3.0).all()


def test_a_seeded_row_with_the_step_ignores_its_batch_mates(tokenrace, rng):
    case = Case(rng, 8, 300)
    s = tokenrace.Sampler(300, threads=2)
    batch = s.draw(case.x, temperature=0.9, seeds=case.seeds, **case.kwargs())
    for r in (0, 3, 7):
        one = dict(prompt_tokens=[case.prompt[r]], output_tokens=[case.output[r]], repetition_penalty=case.r[r],
                   frequency_penalty=case.f[r], presence_penalty=case.p[r], logit_bias=[case.bias[r]],
                   allowed_tokens=[case.allowed[r]], banned_tokens=[case.banned[r]], token_bitmask=case.bitmask[r],
                   penalty_last_n=case.last_n[r], min_tokens=case.min_tokens[r], stop_token_ids=[case.stop[r]])
        alone = s.draw(case.x[r], temperature=0.9, seeds=case.seeds[r], **one)
        assert alone[0] == batch[r], f"row {r}"


@pytest.mark.parametrize("dtype,vocab", [(np.int8, 100), (np.int8, 200), (np.int8, 300), (np.int16, 40000),
                                         (np.int16, 70000), (np.int32, 70000)])
@pytest.mark.parametrize("pad", ["-1", "min"])
def test_padded_histories_of_narrow_dtypes(tokenrace, dtype, vocab, pad):
    """Negative entries are padding in every signed dtype and at every vocab: an int8 array with
    vocab > 128 (int16: > 32768) has negative entries whose unsigned view is below vocab, and they
    must not be read as ids (-1 as int8 is 255, an id at vocab 300; -100 is 156, at vocab 200)."""
    rng = np.random.default_rng([50, vocab])
    info = np.iinfo(dtype)
    fill = -1 if pad == "-1" else int(info.min)
    top = min(vocab, int(info.max) + 1)
    lists = [rng.integers(0, top, size=n).tolist() for n in (3, 0, 7, 1)]
    x = rng.standard_normal((4, vocab)).astype(np.float32)
    s = tokenrace.Sampler(vocab)
    kw = dict(temperature=1.0, seeds=1, full_logprobs="processed", repetition_penalty=1.3, presence_penalty=2.0)
    want = s.draw_full(x, prompt_tokens=lists[::-1], output_tokens=lists, **kw)
    got = s.draw_full(x, prompt_tokens=padded(lists[::-1], vocab, fill, dtype),
                      output_tokens=padded(lists, vocab, fill, dtype), **kw)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    np.testing.assert_array_equal(got.full_logprobs, want.full_logprobs)
    banned = s.draw(x, temperature=0.0, banned_tokens=padded([[int(i)] for i in np.argmax(x, axis=1) % top], vocab,
                                                             fill, dtype))
    assert (banned != np.argmax(x, axis=1) % top).all()


def test_out_overlapping_any_input_is_refused(tokenrace, rng):
    """``draw_full(out=)``: an out whose bytes meet those of any input (the logits, one row ahead
    or behind included, the noise, a per-row array, a list's ids, the bitmask) is refused naming
    both, before anything is written; an out beside the logits in one buffer is fine."""
    rows, vocab = 3, 40
    s = tokenrace.Sampler(vocab)
    big = rng.standard_normal((rows + 1, vocab)).astype(np.float32)
    x = big[:rows].copy()
    want = s.draw_full(x, temperature=0.7, seeds=3, full_logprobs="processed").full_logprobs

    def refused(name, logits, out, **kw):
        before_out, before_logits = out.copy(), logits.copy()
        with pytest.raises(ValueError, match=rf"out: overlaps {name}: out spans bytes \[0x[0-9a-f]+, 0x[0-9a-f]+\), "
                                             rf"{name} \[0x[0-9a-f]+, 0x[0-9a-f]+\)"):
            s.draw_full(logits, **{"temperature": 0.7, "seeds": 3, "full_logprobs": "processed", "out": out, **kw})
        np.testing.assert_array_equal(out, before_out)
        np.testing.assert_array_equal(logits, before_logits)

    refused("logits", big[1:], big[:-1])  # out one row ahead of the logits
    refused("logits", big[:-1], big[1:])  # one row behind
    refused("logits", x, x)
    wide = np.zeros((rows, 2 * vocab), np.float32)
    wide[:, :vocab] = x
    refused("logits", wide[:, :vocab], wide[:, vocab:])  # interleaved rows: the spans meet
    out = np.zeros((rows, vocab), np.float32)
    refused("noise", x, out, noise=out)
    refused("temperature", x, out, temperature=out.reshape(-1)[:rows])
    refused("prompt_tokens", x, out, prompt_tokens=(out.view(np.int32).reshape(-1)[:4],
                                                    np.array([0, 1, 2, 4], np.uint64)), repetition_penalty=1.2)
    refused("output_tokens", x, out, output_tokens=[None, out.view(np.int32)[1, :2], None], presence_penalty=1.0)
    refused("token_bitmask", x, out, token_bitmask=out.view(np.int32)[:, :2])
    buf = np.zeros((2 * rows, vocab), np.float32)  # logits and out side by side in one buffer
    buf[:rows] = x
    r = s.draw_full(buf[:rows], temperature=0.7, seeds=3, full_logprobs="processed", out=buf[rows:])
    assert r.full_logprobs is not None and np.shares_memory(r.full_logprobs, buf)
    np.testing.assert_array_equal(buf[rows:], want)


def test_the_penalty_window_counts_the_last_tokens_of_prompt_then_output(tokenrace):
    # Token 0 in the prompt, token 1 in the output; halved by the repetition penalty, both fall
    # below token 2. Window 1 holds the output's token alone.
    s = tokenrace.Sampler(4)
    x = np.array([[5.0, 4.9, 3.0, 0.0]], np.float32)
    kwargs = dict(temperature=0.0, prompt_tokens=[[0]], output_tokens=[[1]], repetition_penalty=2.0)
    assert s.draw(x, penalty_last_n=1, **kwargs)[0] == 0
    assert s.draw(x, penalty_last_n=2, **kwargs)[0] == 2
    assert s.draw(x, penalty_last_n=0, **kwargs)[0] == 2
    assert s.draw(x, **kwargs)[0] == 2
    # A window alone (no history) changes nothing, and a later call without it has none.
    assert s.draw(x, temperature=0.0, penalty_last_n=[3])[0] == 0
    assert s.draw_full(x, penalty_last_n=np.array([1], np.int32), **kwargs).tokens[0] == 0
    assert s.draw_full(x, **kwargs).tokens[0] == 2


def test_min_tokens_bans_the_stop_tokens_until_the_output_is_long_enough(tokenrace):
    s = tokenrace.Sampler(4)
    x = np.array([[1.0, 5.0, 4.0, 3.0]], np.float32)
    for output, want in (([], 2), ([0, 0], 2), ([0, 0, 0], 1)):
        got = s.draw(x, temperature=0.0, output_tokens=[output], min_tokens=3, stop_token_ids=[[1]])
        assert got[0] == want, output
    r = s.draw_full(x, temperature=0.0, min_tokens=[1], stop_token_ids=[[1]], full_logprobs="processed")
    assert r.tokens[0] == 2 and r.full_logprobs[0, 1] == -np.inf
    # The CSR form, and a later call without the arguments bans nothing.
    got = s.draw(x, temperature=0.0, min_tokens=1, stop_token_ids=(np.array([1], np.int32), np.array([0, 1], np.uint64)))
    assert got[0] == 2
    assert s.draw(x, temperature=0.0)[0] == 1
