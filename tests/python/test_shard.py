"""Vocabulary-sharded sampling from Python (tokenrace.shard, tokenrace.torch.sample_sharded):
the tokens and flags of ``Sampler.draw_full`` over the whole rows, bit for bit, with the ranks
in one process, in separate processes exchanging partials through shared memory, and over
torch.distributed (gloo)."""

import multiprocessing as mp
import os
from multiprocessing import shared_memory

import numpy as np
import pytest

import tokenrace
from tokenrace import shard

VOCAB = 3000


def batch(rows, seed=0):
    g = np.random.default_rng(seed)
    x = (g.standard_normal((rows, VOCAB)) * 3).astype(np.float32)
    x[0, 17] = np.nan
    x[1 % rows, 2999] = np.inf
    x[2 % rows, :] = -np.inf
    x[3 % rows, 1500:] = np.nan
    settings = dict(
        temperature=g.choice([0.0, 0.6, 1.0, 1.4], size=rows).astype(np.float32),
        seeds=g.integers(0, 2**63, size=rows, dtype=np.uint64),
        seeded=(g.random(rows) < 0.5).astype(np.uint8),
        min_p=g.choice([0.0, 0.1], size=rows).astype(np.float32),
    )
    return x, settings


def unsharded(x, settings, seed):
    s = tokenrace.Sampler(VOCAB, max_rows=64, seed=seed)
    r = s.draw_full(x, **settings)
    return np.asarray(r.tokens), np.asarray(r.flags)


def sharded_in_process(x, settings, cuts, seed, order):
    ranks = [tokenrace.Sampler(VOCAB, max_rows=64, seed=seed) for _ in range(len(cuts) - 1)]
    sl = [x[:, cuts[q]:cuts[q + 1]] for q in range(len(ranks))]
    p1 = [shard.top(ranks[q], sl[q], cuts[q], VOCAB, **settings).tobytes() for q in range(len(ranks))]
    rows = shard.combine_top([p1[q] for q in order])
    p2 = [shard.race(ranks[q], sl[q], cuts[q], VOCAB, rows, **settings) for q in range(len(ranks))]
    return shard.finish(rows, [p2[q] for q in reversed(order)])


@pytest.mark.parametrize("cuts", [[0, 3000], [0, 1000, 3000], [0, 1, 256, 1999, 3000], [0, 300, 301, 700, 2048, 2900, 3000]])
def test_numpy_shards_equal_the_unsharded_draw(cuts):
    for call in range(3):
        x, st = batch(9, seed=call)
        order = list(np.random.default_rng(call).permutation(len(cuts) - 1))
        tokens, flags = sharded_in_process(x, st, cuts, 5, order)
        want_t, want_f = unsharded(x, st, 5)
        assert np.array_equal(tokens, want_t) and np.array_equal(flags, want_f), (cuts, call)


def filters(rows, seed=0):
    """Per-row top-k and top-p, each on or off, for ``batch``'s rows."""
    g = np.random.default_rng(100 + seed)
    return dict(top_k=g.choice([0, 1, 5, 50, 1500], size=rows).astype(np.int32),
                top_p=g.choice([1.0, 0.3, 0.9, 0.99, 0.99999], size=rows).astype(np.float32))


def threaded_draws(x, settings, cuts, make_sampler):
    """``shard.draw`` on every rank, each in a thread, gathering through a barrier: the tokens
    and flags of every rank, and rank 0's stats."""
    import threading

    ranks = len(cuts) - 1
    barrier = threading.Barrier(ranks)
    board = [None] * ranks
    results, stats = [None] * ranks, {}

    def run(q):
        def all_gather(data):
            board[q] = data
            barrier.wait()
            got = list(board)
            barrier.wait()  # every rank read before any writes the next round
            return got

        s = make_sampler()
        results[q] = shard.draw(s, x[:, cuts[q]:cuts[q + 1]], cuts[q], VOCAB, all_gather,
                                stats=stats if q == 0 else None, **settings)

    threads = [threading.Thread(target=run, args=(q,)) for q in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results, stats


@pytest.mark.parametrize("simd", ["scalar", "portable", "avx2", "avx512"])
@pytest.mark.parametrize("threads", [1, 4])
def test_top_k_top_p_and_min_p_shards_equal_the_unsharded_draw(simd, threads):
    # The cut's rounds (top-p), the ranks' candidates (top-k) and min-p's floor: the unsharded
    # draw's tokens and flags, seeded and unseeded rows, 1 to 8 ranks, every level.
    try:
        tokenrace.Sampler(VOCAB, simd=simd)
    except tokenrace.TokenraceError:
        pytest.skip(f"{simd} is not supported here")
    rng = np.random.default_rng(7)
    most = 0
    for ranks in range(1, 9):
        x, st = batch(12, seed=ranks)
        x[4] = (rng.random(VOCAB) * 1e-3).astype(np.float32)  # thousands of tokens in one bin
        settings = dict(st, **filters(12, seed=ranks))
        inner = np.sort(rng.choice(np.arange(1, VOCAB), size=ranks - 1, replace=False))
        cuts = [0, *map(int, inner), VOCAB]
        make = lambda: tokenrace.Sampler(VOCAB, max_rows=64, seed=9, simd=simd, threads=threads)  # noqa: E731
        want = make().draw_full(x, **settings)
        results, stats = threaded_draws(x, settings, cuts, make)
        for q, (tokens, flags, *_) in enumerate(results):
            assert np.array_equal(tokens, np.asarray(want.tokens)), (ranks, q, cuts)
            assert np.array_equal(flags, np.asarray(want.flags)), (ranks, q, cuts)
        most = max(most, stats["rounds"])
    assert most >= 4, most  # top, a cut round or more, race


@pytest.mark.parametrize("mode", ["raw", "processed"])
def test_sharded_logprobs_are_within_1e5_of_the_unsharded(mode):
    rng = np.random.default_rng(11)
    for ranks in (1, 2, 3, 5, 8):
        x, st = batch(10, seed=20 + ranks)
        settings = dict(st, **filters(10, seed=ranks))
        inner = np.sort(rng.choice(np.arange(1, VOCAB), size=ranks - 1, replace=False))
        cuts = [0, *map(int, inner), VOCAB]
        make = lambda: tokenrace.Sampler(VOCAB, max_rows=64, seed=4)  # noqa: E731
        want = make().draw_full(x, logprobs=6, logprob_mode=mode, **settings)
        import threading

        barrier, board, results = threading.Barrier(ranks), [None] * ranks, [None] * ranks

        def run(q):
            def all_gather(data):
                board[q] = data
                barrier.wait()
                got = list(board)
                barrier.wait()
                return got
            results[q] = shard.draw(make(), x[:, cuts[q]:cuts[q + 1]], cuts[q], VOCAB, all_gather,
                                    logprob_mode=mode, top_n=6, **settings)

        threads = [threading.Thread(target=run, args=(q,)) for q in range(ranks)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        for r in results:
            assert np.array_equal(r.tokens, np.asarray(want.tokens))
            a, b = r.logprobs, np.asarray(want.logprobs)
            fin = np.isfinite(b)
            assert np.array_equal(fin, np.isfinite(a)) and np.array_equal(a[~fin], b[~fin])
            assert np.all(np.abs(a[fin] - b[fin]) <= 1e-5 + 4 * np.finfo(np.float32).eps * np.abs(b[fin]))
            ta, tb = r.topn_logprobs, np.asarray(want.topn_logprobs)
            fin = np.isfinite(tb)
            assert np.all(np.abs(ta[fin] - tb[fin]) <= 1e-5 + 4 * np.finfo(np.float32).eps * np.abs(tb[fin]))
            assert np.mean(r.topn_ids == np.asarray(want.topn_ids)) > 0.98


def test_partials_of_another_call_are_refused():
    x, st = batch(4)
    a, b = tokenrace.Sampler(VOCAB, seed=1), tokenrace.Sampler(VOCAB, seed=2)
    p0 = shard.top(a, x[:, :1000], 0, VOCAB, **st)
    p1 = shard.top(b, x[:, 1000:], 1000, VOCAB, **st)  # another stream: other keys
    if (st["seeded"] == 1).all() or (st["temperature"] == 0).all():
        pytest.skip("every row keyed by its seed")
    with pytest.raises(tokenrace.InvalidArgumentError, match=r"rank 1, row \d+\): its key"):
        shard.combine_top([p0, p1])
    with pytest.raises(tokenrace.InvalidArgumentError, match="rows.vocab_start"):
        shard.top(a, x[:, :1000], 2500, VOCAB, **st)


def step_inputs(rows, seed=0):
    """A sampling step for ``batch``'s rows in ``Sampler.draw``'s forms, global ids spread over
    the whole row (so every slice holds some): histories of a few repeated ids over 5,000
    tokens or fewer, the three penalties with a window, a bias (with -inf), allowed lists (some
    rows), banned lists, a grammar bitmask, min_tokens with stop ids, bad words and DRY."""
    g = np.random.default_rng(300 + seed)
    pools = [g.integers(0, VOCAB, 16) for _ in range(rows)]
    pick = lambda r, n: [int(t) for t in g.choice(pools[r], n)]  # noqa: E731
    words = (VOCAB + 31) // 32
    bitmask = g.integers(-(2**31), 2**31, (rows, words), dtype=np.int64).astype(np.int32) | 0x11111111
    bitmask[::3] = -1  # rows without a grammar
    return dict(
        prompt_tokens=[pick(r, int(g.integers(0, 5000))) for r in range(rows)],
        output_tokens=[pick(r, int(g.integers(0, 40))) for r in range(rows)],
        repetition_penalty=g.choice([1.0, 1.3, 0.8], rows).astype(np.float32),
        frequency_penalty=g.choice([0.0, 0.5, -0.3], rows).astype(np.float32),
        presence_penalty=g.choice([0.0, 0.7, -1.0], rows).astype(np.float32),
        penalty_last_n=g.choice([0, 7, 64], rows).astype(np.int32),
        logit_bias=[{int(t): float(g.choice([-3.0, 2.0, 9.0, -np.inf])) for t in g.integers(0, VOCAB, 6)}
                    for _ in range(rows)],
        allowed_tokens=[None if r % 4 else [int(t) for t in g.integers(0, VOCAB, 900)] for r in range(rows)],
        banned_tokens=[[int(t) for t in g.integers(0, VOCAB, 20)] for _ in range(rows)],
        token_bitmask=bitmask,
        min_tokens=g.choice([0, 3, 50], rows).astype(np.int32),
        stop_token_ids=[pick(r, 2) for r in range(rows)],
        bad_words=[[[pick(r, 1)[0]], [pick(r, 1)[0], int(g.integers(0, VOCAB))]] for r in range(rows)],
        dry_multiplier=g.choice([0.0, 0.8], rows).astype(np.float32),
    )


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_shards_with_a_step_equal_the_unsharded_draw_with_it(ranks):
    # Each rank applies the whole rows' step to its slice: the unsharded draw with the same step,
    # tokens and flags bit for bit, seeded, unseeded and greedy rows, with and without filters,
    # uneven slices; the step prepared once (step=) or given as arguments to every call.
    rng = np.random.default_rng(40 + ranks)
    differ = 0
    for call in range(3):
        rows = 10
        x, st = batch(rows, seed=60 + call)
        settings = dict(st, **filters(rows, seed=call)) if call else st
        step = step_inputs(rows, seed=call)
        inner = np.sort(rng.choice(np.arange(1, VOCAB), size=ranks - 1, replace=False))
        cuts = [0, *map(int, inner), VOCAB]
        make = lambda: tokenrace.Sampler(VOCAB, max_rows=64, seed=13)  # noqa: E731
        want = make().draw_full(x, **settings, **step)
        results, stats = threaded_draws(x, dict(settings, **step), cuts, make)
        for q, (tokens, flags, *_) in enumerate(results):
            assert np.array_equal(tokens, np.asarray(want.tokens)), (ranks, q, cuts, call)
            assert np.array_equal(flags, np.asarray(want.flags)), (ranks, q, cuts, call)
        # The plain two rounds, the step given as its arguments to each call.
        if call == 0:
            tokens, flags = sharded_in_process(x, dict(settings, **step), cuts, 13, list(range(ranks)))
            assert np.array_equal(tokens, np.asarray(want.tokens)) and np.array_equal(flags, np.asarray(want.flags))
            block = shard.step_block(rows, VOCAB, **step)
            tokens, _ = sharded_in_process(x, dict(settings, step=block), cuts, 13, list(range(ranks)))
            assert np.array_equal(tokens, np.asarray(want.tokens))
        # Power: the step changes tokens (a rank that left it out would show).
        differ += int(np.sum(np.asarray(make().draw_full(x, **settings).tokens) != np.asarray(want.tokens)))
    assert differ >= 8, differ


def test_processed_logprobs_with_a_step_and_its_refusals():
    # PROCESSED logprobs of rows with a step: the unsharded ones within 1e-5; RAW ones are refused
    # (they need the raw row's mass); a bad step entry is refused naming the draw's argument.
    rows, ranks = 8, 3
    x, st = batch(rows, seed=70)
    step = step_inputs(rows, seed=5)
    cuts = [0, 1234, 1235, VOCAB]
    make = lambda: tokenrace.Sampler(VOCAB, max_rows=64, seed=21)  # noqa: E731
    want = make().draw_full(x, logprobs=4, logprob_mode="processed", **st, **step)
    results, _ = threaded_draws(x, dict(st, **step, logprob_mode="processed", top_n=4), cuts, make)
    for r in results:
        assert np.array_equal(r.tokens, np.asarray(want.tokens))
        a, b = r.logprobs, np.asarray(want.logprobs)
        fin = np.isfinite(b)
        assert np.array_equal(fin, np.isfinite(a))
        assert np.all(np.abs(a[fin] - b[fin]) <= 1e-5 + 4 * np.finfo(np.float32).eps * np.abs(b[fin]))
    samplers = [make() for _ in range(ranks)]
    p1 = [shard.top(samplers[q], x[:, cuts[q]:cuts[q + 1]], cuts[q], VOCAB, **st, **step) for q in range(ranks)]
    combined = shard.combine_top(p1)
    s = samplers[0]
    cu = shard.cut_start(s, x[:, :cuts[1]], 0, VOCAB, combined, **st, **step)
    with pytest.raises(tokenrace.InvalidArgumentError, match="RAW logprobs of rows with a step"):
        shard.logprob_partials(s, x[:, :cuts[1]], 0, VOCAB, combined, cu, None, "raw", **st, **step)
    bad = dict(step, prompt_tokens=[[0]] * 2 + [[VOCAB]] + [[1]] * (rows - 3))
    with pytest.raises(tokenrace.InvalidArgumentError, match=r"rows\.prompt_ids\[2\].*\(argument prompt_tokens\)"):
        shard.top(make(), x[:, :cuts[1]], 0, VOCAB, **st, **bad)
    with pytest.raises(TypeError, match="unknown settings"):
        shard.top(make(), x[:, :cuts[1]], 0, VOCAB, **st, forced_tokens=[1] * rows)


# --- ranks in separate processes, partials exchanged through shared memory -------------------

PARTIAL = shard.PARTIAL_DTYPE.itemsize


def _rank(q, ranks, cuts, rows, seed, names, barrier):
    xs = shared_memory.SharedMemory(name=names["x"])
    ex = shared_memory.SharedMemory(name=names["exchange"])
    res = shared_memory.SharedMemory(name=names["result"])
    try:
        x = np.ndarray((rows, VOCAB), np.float32, buffer=xs.buf)
        _, st = batch(rows)  # the settings are the runtime's, the same on every rank
        mine = np.array(x[:, cuts[q]:cuts[q + 1]])  # this rank's slice only
        s = tokenrace.Sampler(VOCAB, max_rows=64, seed=seed)
        slot = lambda r: slice(r * rows * PARTIAL, (r + 1) * rows * PARTIAL)  # noqa: E731
        ex.buf[slot(q)] = shard.top(s, mine, cuts[q], VOCAB, **st).tobytes()
        barrier.wait()
        combined = shard.combine_top([bytes(ex.buf[slot(r)]) for r in range(ranks)])
        barrier.wait()  # every rank read round 1 before any overwrites it
        ex.buf[slot(q)] = shard.race(s, mine, cuts[q], VOCAB, combined, **st).tobytes()
        barrier.wait()
        tokens, flags = shard.finish(combined, [bytes(ex.buf[slot(r)]) for r in range(ranks)])
        out = np.ndarray((ranks, 2, rows), np.int64, buffer=res.buf)
        out[q, 0], out[q, 1] = tokens, flags
    finally:
        for m in (xs, ex, res):
            m.close()


@pytest.mark.parametrize("ranks", [2, 3])
def test_ranks_in_processes_over_shared_memory(ranks):
    rows, seed = 8, 77
    x, st = batch(rows)
    cuts = [0, 1111, 3000] if ranks == 2 else [0, 700, 2049, 3000]
    shms = {
        "x": shared_memory.SharedMemory(create=True, size=x.nbytes),
        "exchange": shared_memory.SharedMemory(create=True, size=ranks * rows * PARTIAL),
        "result": shared_memory.SharedMemory(create=True, size=ranks * 2 * rows * 8),
    }
    try:
        np.ndarray(x.shape, np.float32, buffer=shms["x"].buf)[:] = x
        ctx = mp.get_context("spawn")
        barrier = ctx.Barrier(ranks)
        names = {k: m.name for k, m in shms.items()}
        procs = [ctx.Process(target=_rank, args=(q, ranks, cuts, rows, seed, names, barrier)) for q in range(ranks)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
        assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
        got = np.ndarray((ranks, 2, rows), np.int64, buffer=shms["result"].buf).copy()
    finally:
        for m in shms.values():
            m.close()
            m.unlink()
    want_t, want_f = unsharded(x, st, seed)
    for q in range(ranks):
        assert np.array_equal(got[q, 0], want_t) and np.array_equal(got[q, 1], want_f), q


def _filtered_rank(q, ranks, cuts, rows, seed, names, barrier, room, with_step=False):
    xs = shared_memory.SharedMemory(name=names["x"])
    ex = shared_memory.SharedMemory(name=names["exchange"])
    res = shared_memory.SharedMemory(name=names["result"])
    try:
        x = np.ndarray((rows, VOCAB), np.float32, buffer=xs.buf)
        _, st = batch(rows)
        settings = dict(st, **filters(rows), **(step_inputs(rows) if with_step else {}))
        mine = np.array(x[:, cuts[q]:cuts[q + 1]])

        def all_gather(data):
            # Each rank's slot: its length, then its bytes.
            base = q * room
            ex.buf[base:base + 8] = len(data).to_bytes(8, "little")
            ex.buf[base + 8:base + 8 + len(data)] = data
            barrier.wait()
            got = []
            for r in range(ranks):
                n = int.from_bytes(ex.buf[r * room:r * room + 8], "little")
                got.append(bytes(ex.buf[r * room + 8:r * room + 8 + n]))
            barrier.wait()
            return got

        s = tokenrace.Sampler(VOCAB, max_rows=64, seed=seed)
        tokens, flags, *_ = shard.draw(s, mine, cuts[q], VOCAB, all_gather, **settings)
        out = np.ndarray((ranks, 2, rows), np.int64, buffer=res.buf)
        out[q, 0], out[q, 1] = tokens, flags
    finally:
        for m in (xs, ex, res):
            m.close()


@pytest.mark.parametrize("with_step", [False, True])
@pytest.mark.parametrize("ranks", [2, 4])
def test_filtered_ranks_in_processes_over_shared_memory(ranks, with_step):
    rows, seed = 8, 78
    x, st = batch(rows)
    room = 8 + rows * (shard.MASS_DTYPE.itemsize + 4 * 1500)
    cuts = [0, 1111, 3000] if ranks == 2 else [0, 700, 2049, 2050, 3000]
    shms = {
        "x": shared_memory.SharedMemory(create=True, size=x.nbytes),
        "exchange": shared_memory.SharedMemory(create=True, size=ranks * room),
        "result": shared_memory.SharedMemory(create=True, size=ranks * 2 * rows * 8),
    }
    try:
        np.ndarray(x.shape, np.float32, buffer=shms["x"].buf)[:] = x
        ctx = mp.get_context("spawn")
        barrier = ctx.Barrier(ranks)
        names = {k: m.name for k, m in shms.items()}
        procs = [ctx.Process(target=_filtered_rank, args=(q, ranks, cuts, rows, seed, names, barrier, room, with_step))
                 for q in range(ranks)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
        assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
        got = np.ndarray((ranks, 2, rows), np.int64, buffer=shms["result"].buf).copy()
    finally:
        for m in shms.values():
            m.close()
            m.unlink()
    want_t, want_f = unsharded(x, dict(st, **filters(rows), **(step_inputs(rows) if with_step else {})), seed)
    for q in range(ranks):
        assert np.array_equal(got[q, 0], want_t) and np.array_equal(got[q, 1], want_f), q


# --- torch.distributed (gloo) ------------------------------------------------------------------

def torch_step(rows, seed=0):
    """A sampling step in ``tokenrace.torch.sample``'s (vLLM's) forms for ``batch``'s rows."""
    import torch

    g = np.random.default_rng(500 + seed)
    prompt = np.full((rows, 300), VOCAB, np.int64)  # padded with the vocabulary size, as vLLM pads
    for r in range(rows):
        n = int(g.integers(0, 300))
        prompt[r, :n] = g.choice(g.integers(0, VOCAB, 12), n)
    mask = np.zeros((rows, VOCAB), bool)
    mask[1::4] = g.random((len(range(1, rows, 4)), VOCAB)) < 0.7  # True: NOT allowed
    return dict(
        prompt_token_ids=torch.from_numpy(prompt),
        output_token_ids=[[int(t) for t in g.choice(prompt[r, :5], 6)] if prompt[r, 0] < VOCAB else [] for r in
                          range(rows)],
        repetition_penalties=torch.from_numpy(g.choice([1.0, 1.5], rows).astype(np.float32)),
        frequency_penalties=torch.from_numpy(g.choice([0.0, 0.4], rows).astype(np.float32)),
        presence_penalties=torch.from_numpy(g.choice([0.0, -0.5], rows).astype(np.float32)),
        allowed_token_ids_mask=torch.from_numpy(mask),
        bad_words_token_ids={0: [[int(prompt[0, 0] % VOCAB)]], 2: [[5, 6], [7]]},
        logit_bias=[{int(t): 5.0 for t in g.integers(0, VOCAB, 3)} if r % 2 else None for r in range(rows)],
        min_tokens={1: (30, [int(prompt[1, 0] % VOCAB), 11])},
    )


def stepped_call(st, f, call):
    """``sample``'s arguments of call 0 (every row seeded) and call 1 (unseeded: the sampler's
    stream) with a step, the same for ``sample_sharded``."""
    args = dict(temperature=st["temperature"], min_p=st["min_p"], top_k=f["top_k"], top_p=f["top_p"],
                **torch_step(8, seed=call))
    if call == 0:
        args["seeds"] = st["seeds"]
    return args


def _torch_rank(q, ranks, cuts, port, result_name, with_step=False):
    import torch
    import torch.distributed as dist

    import tokenrace.torch as ttorch

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=q, world_size=ranks)
    res = shared_memory.SharedMemory(name=result_name)
    try:
        x, st = batch(8)
        s = tokenrace.Sampler(VOCAB, max_rows=64, seed=31)
        out = np.ndarray((ranks, 2, 8), np.int64, buffer=res.buf)
        f = filters(8)
        for call in range(2):
            if with_step:
                args = stepped_call(st, f, call)
            else:
                temps = st["temperature"] if call == 0 else np.zeros(8, np.float32)  # the second call: greedy only
                args = dict(temperature=temps, min_p=st["min_p"], top_k=f["top_k"], top_p=f["top_p"],
                            seeds=st["seeds"], seeded=st["seeded"])
            temps = args.pop("temperature")
            tokens = ttorch.sample_sharded(torch.from_numpy(x[:, cuts[q]:cuts[q + 1]].copy()), cuts[q], VOCAB, temps,
                                           sampler=s, **args)
            assert tokens.dtype == torch.int64
            out[q, call] = tokens.numpy()
    finally:
        res.close()
        dist.destroy_process_group()


@pytest.mark.parametrize("with_step", [False, True])
@pytest.mark.parametrize("ranks", [2, 3])
def test_sample_sharded_over_gloo(ranks, with_step):
    try:
        import torch  # noqa: F401
        import torch.distributed as dist
    except ImportError:
        pytest.skip("torch is not installed: tokenrace.torch.sample_sharded needs torch.distributed "
                    "(run with /work/venv-torch)")
    if not dist.is_available():
        pytest.skip("this torch build has no torch.distributed")
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cuts = [0, 1500, 3000] if ranks == 2 else [0, 999, 2100, 3000]
    res = shared_memory.SharedMemory(create=True, size=ranks * 2 * 8 * 8)
    try:
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=_torch_rank, args=(q, ranks, cuts, port, res.name, with_step))
                 for q in range(ranks)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(180)
        assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
        got = np.ndarray((ranks, 2, 8), np.int64, buffer=res.buf).copy()
    finally:
        res.close()
        res.unlink()
    x, st = batch(8)
    if with_step:
        # The unsharded torch.sample of the gathered rows with the same step: the same tokens.
        import tokenrace.torch as ttorch

        s = tokenrace.Sampler(VOCAB, max_rows=64, seed=31)
        f = filters(8)
        want0, want1 = (ttorch.sample(torch.from_numpy(x), sampler=s, **stepped_call(st, f, call)).numpy()
                        for call in range(2))
        plain = tokenrace.Sampler(VOCAB, max_rows=64, seed=31).draw_full(
            x, **dict(st, **f, seeded=np.ones(8, np.uint8))).tokens
        assert np.sum(np.asarray(plain) != want0) >= 2, "the step changes tokens (power)"
    else:
        s = tokenrace.Sampler(VOCAB, max_rows=64, seed=31)
        st = dict(st, **filters(8))
        want0 = np.asarray(s.draw_full(x, **st).tokens)
        want1 = np.asarray(s.draw_full(x, **dict(st, temperature=np.zeros(8, np.float32))).tokens)
    for q in range(ranks):
        assert np.array_equal(got[q, 0], want0) and np.array_equal(got[q, 1], want1), q


def test_sample_sharded_refuses_what_is_not_sharded_naming_it():
    torch = pytest.importorskip("torch")
    import tokenrace.torch as ttorch

    x = torch.zeros((2, 100))
    with pytest.raises(ValueError, match=r"^request_ids: the request state is not sharded"):
        ttorch.sample_sharded(x, 0, 300, 1.0, requests=object(), request_ids=[0, 1])
    with pytest.raises(ValueError, match=r"^forced_tokens: "):
        ttorch.sample_sharded(x, 0, 300, 1.0, forced_tokens=[1, 2])
    with pytest.raises(TypeError, match="unexpected keyword argument 'repetition_penalty'"):
        ttorch.sample_sharded(x, 0, 300, 1.0, repetition_penalty=1.2)  # sample's name is ..._penalties
