#!/usr/bin/env python3
"""Vocabulary-sharded sampling against gathering the rows on one rank, per step.

  python3 bench/shard.py [--ranks 2,4,8] [--rows 1,8,64,256] [--vocab 151936] [--reps 5] [--json out.json]

R ranks are simulated in this one process (each with its own sampler, the same seed), so the
figures are the bytes each scheme moves and the compute each rank does; the wall time of the
collectives on a real host is not measured here.

  sharded  every rank: shard.top on its slice (vocab / R tokens), combine_top of the R partials,
           shard.race, finish. Two all_gathers of 40 bytes per row from each rank (one when every
           row is greedy). Time: the slowest rank's top + race, plus combine_top + finish (which
           every rank runs).
  gather   every rank sends its slice to rank 0 (4 bytes per token), rank 0 draws the whole rows
           (Sampler.draw, same seed: the same tokens, checked) and sends the tokens back (4 bytes
           per row per rank). Time: rank 0's draw.

Times are CPU time of the calling thread (time.thread_time), the median of --reps steps, so a
loaded machine inflates them less than wall time; the samplers run with threads=1.

  --processes  R real processes instead (spawned, one sampler each at threads=1), the bytes moved
           through shared memory by an all-gather of a barrier and a copy: the wall time of a step
           (the median over --reps, measured on rank 0 from a barrier before the step to the end of
           its last exchange) for the sharded path (``shard.draw``: every round, top-k candidates
           and top-p's cut included) and for gathering (each rank copies its slice into rank 0's
           rows, rank 0 draws, the tokens go back). Kinds: sample (T = 1), greedy, top-p 0.9 with
           top-k 50 on peaked rows, top-p 0.9 on flat rows. On a machine with fewer cores than
           ranks the processes are oversubscribed: the times then include the waits for a core.

  --step   the cost of the sampling step in the sharded path (in one process, as above): rows
           sampled at T = 1, each with a realistic step (repetition, frequency and presence
           penalties over a history of 5,120 tokens, a logit bias of 100 entries, 50 banned ids;
           CSR arrays, as an engine holds them), against the same rows without it. Each rank
           converts the step once (``shard.step_block``, timed with its rounds) and applies it to
           its slice in every round; the tokens are checked against the unsharded draw with the
           step. Prints the medians and the ratio, sharded and unsharded.
"""

import argparse
import json
import statistics
import time

import numpy as np

import tokenrace
from tokenrace import shard

PARTIAL = shard.PARTIAL_DTYPE.itemsize


def cuts_of(vocab, ranks):
    """Even slices, as a vocabulary-parallel head splits them (the last one shorter)."""
    per = -(-vocab // ranks)
    return [min(q * per, vocab) for q in range(ranks)] + [vocab]


def timed(fn):
    t = time.thread_time()
    out = fn()
    return out, time.thread_time() - t


def step(x, temps, ranks, seed):
    rows, vocab = x.shape
    cuts = cuts_of(vocab, ranks)
    samplers = [tokenrace.Sampler(vocab, max_rows=1024, seed=seed, threads=1) for _ in range(ranks)]
    slices = [np.ascontiguousarray(x[:, cuts[q]:cuts[q + 1]]) for q in range(ranks)]
    per_rank = [0.0] * ranks
    p1 = []
    for q in range(ranks):
        p, t = timed(lambda q=q: shard.top(samplers[q], slices[q], cuts[q], vocab, temperature=temps))
        p1.append(p)
        per_rank[q] += t
    rows_c, t_combine = timed(lambda: shard.combine_top(p1))
    racing = shard.races(rows_c)
    p2 = []
    if racing:
        for q in range(ranks):
            p, t = timed(lambda q=q: shard.race(samplers[q], slices[q], cuts[q], vocab, rows_c, temperature=temps))
            p2.append(p)
            per_rank[q] += t
    (tokens, _), t_finish = timed(lambda: shard.finish(rows_c, p2))
    rounds = 2 if racing else 1
    whole = tokenrace.Sampler(vocab, max_rows=1024, seed=seed, threads=1)
    want, t_gather = timed(lambda: whole.draw(x, temperature=temps))
    assert np.array_equal(tokens, want), "the sharded tokens differ from the gathered draw's"
    return {
        "sharded_s": max(per_rank) + t_combine + t_finish,
        "gather_s": t_gather,
        "rounds": rounds,
        # Bytes each rank sends per step (an all_gather: its partials to every other rank).
        "sharded_sent_per_rank": rounds * rows * PARTIAL * (ranks - 1),
        # Bytes rank 0 receives (the other slices) plus the tokens it sends back.
        "gather_bytes_rank0": rows * 4 * (vocab - (cuts[1] - cuts[0])) + rows * 4 * (ranks - 1),
        "sharded_bytes_per_row_per_rank_per_round": PARTIAL,
    }


def realistic_step(rows, vocab, g):
    """The step of ``--step`` in ``Sampler.draw``'s CSR forms: per row a history of 5,120 tokens
    (4,096 of prompt, 1,024 of output) drawn from 2,000 ids, the three penalties, a bias of 100
    entries and 50 banned ids."""
    def csr(per_row, draw):
        ids = np.concatenate([draw() for _ in range(rows)]).astype(np.int32)
        return ids, np.arange(rows + 1, dtype=np.uint64) * np.uint64(per_row)

    pool = g.integers(0, vocab, 2000)
    bias_ids, bias_offsets = csr(100, lambda: g.choice(vocab, 100, replace=False))
    return dict(
        prompt_tokens=csr(4096, lambda: g.choice(pool, 4096)),
        output_tokens=csr(1024, lambda: g.choice(pool, 1024)),
        repetition_penalty=np.full(rows, 1.1, np.float32),
        frequency_penalty=np.full(rows, 0.2, np.float32),
        presence_penalty=np.full(rows, 0.1, np.float32),
        logit_bias=(bias_ids, (g.random(len(bias_ids)) * 10 - 5).astype(np.float32), bias_offsets),
        banned_tokens=csr(50, lambda: g.choice(vocab, 50, replace=False)),
    )


def step_with(x, settings, step_args, ranks, seed):
    """One sharded step of ``x`` (as ``step``), each rank converting ``step_args`` once and
    applying it in both rounds; the unsharded draw with the same step times the gathered path and
    checks the tokens."""
    rows, vocab = x.shape
    cuts = cuts_of(vocab, ranks)
    samplers = [tokenrace.Sampler(vocab, max_rows=1024, seed=seed, threads=1) for _ in range(ranks)]
    slices = [np.ascontiguousarray(x[:, cuts[q]:cuts[q + 1]]) for q in range(ranks)]
    per_rank = [0.0] * ranks
    blocks = []
    for q in range(ranks):
        b, t = timed(lambda: shard.step_block(rows, vocab, **step_args))
        blocks.append(b)
        per_rank[q] += t
    p1 = []
    for q in range(ranks):
        p, t = timed(lambda q=q: shard.top(samplers[q], slices[q], cuts[q], vocab, step=blocks[q], **settings))
        p1.append(p)
        per_rank[q] += t
    rows_c, t_combine = timed(lambda: shard.combine_top(p1))
    p2 = []
    for q in range(ranks):
        p, t = timed(lambda q=q: shard.race(samplers[q], slices[q], cuts[q], vocab, rows_c, step=blocks[q],
                                            **settings))
        p2.append(p)
        per_rank[q] += t
    (tokens, _), t_finish = timed(lambda: shard.finish(rows_c, p2))
    whole = tokenrace.Sampler(vocab, max_rows=1024, seed=seed, threads=1)
    want, t_gather = timed(lambda: whole.draw(x, **settings, **step_args))
    assert np.array_equal(tokens, want), "the sharded tokens differ from the unsharded draw's"
    return max(per_rank) + t_combine + t_finish, t_gather


def step_cost(a):
    """``--step``: sharded rows with and without the realistic step, medians and ratios."""
    g = np.random.default_rng(0)
    rows = int(a.rows.split(",")[-1])
    x = (g.standard_normal((rows, a.vocab)) * 2).astype(np.float32)
    settings = dict(temperature=np.ones(rows, np.float32))
    with_step = realistic_step(rows, a.vocab, g)
    print(f"{rows} rows of {a.vocab}, T = 1; median of {a.reps} steps, thread CPU ms")
    print(f"{'R':>2} {'sharded':>9} {'+ step':>9} {'ratio':>6} {'unsharded':>10} {'+ step':>9} {'ratio':>6}")
    results = []
    for ranks in (int(r) for r in a.ranks.split(",")):
        plain = [step_with(x, settings, {}, ranks, rep) for rep in range(a.reps)]
        stepped = [step_with(x, settings, with_step, ranks, rep) for rep in range(a.reps)]
        r = {"ranks": ranks, "rows": rows, "vocab": a.vocab,
             "sharded_s": statistics.median(p[0] for p in plain),
             "sharded_step_s": statistics.median(p[0] for p in stepped),
             "unsharded_s": statistics.median(p[1] for p in plain),
             "unsharded_step_s": statistics.median(p[1] for p in stepped)}
        results.append(r)
        print(f"{ranks:>2} {1e3 * r['sharded_s']:>9.2f} {1e3 * r['sharded_step_s']:>9.2f} "
              f"{r['sharded_step_s'] / r['sharded_s']:>6.2f} {1e3 * r['unsharded_s']:>10.2f} "
              f"{1e3 * r['unsharded_step_s']:>9.2f} {r['unsharded_step_s'] / r['unsharded_s']:>6.2f}", flush=True)
    return results


def _proc_rank(q, ranks, rows, vocab, kind, reps, names, barrier, room):
    from multiprocessing import shared_memory

    shm = {k: shared_memory.SharedMemory(name=v) for k, v in names.items()}
    try:
        x = np.ndarray((rows, vocab), np.float32, buffer=shm["x"].buf)
        gathered = np.ndarray((rows, vocab), np.float32, buffer=shm["gathered"].buf)
        tokens_out = np.ndarray(rows, np.int32, buffer=shm["tokens"].buf)
        times = np.ndarray((2, reps), np.float64, buffer=shm["times"].buf)
        info = np.ndarray(8, np.int64, buffer=shm["info"].buf)
        cuts = cuts_of(vocab, ranks)
        mine = np.ascontiguousarray(x[:, cuts[q]:cuts[q + 1]])
        settings = KINDS[kind](rows)
        sent = []

        def all_gather(data):
            sent.append(len(data))
            base = q * room
            shm["exchange"].buf[base:base + 8] = len(data).to_bytes(8, "little")
            shm["exchange"].buf[base + 8:base + 8 + len(data)] = data
            barrier.wait()
            got = []
            for r in range(ranks):
                n = int.from_bytes(shm["exchange"].buf[r * room:r * room + 8], "little")
                got.append(bytes(shm["exchange"].buf[r * room + 8:r * room + 8 + n]))
            barrier.wait()
            return got

        for rep in range(reps):
            s = tokenrace.Sampler(vocab, max_rows=1024, seed=rep, threads=1)
            sent.clear()
            stats = {}
            barrier.wait()
            t = time.perf_counter()
            tokens = shard.draw(s, mine, cuts[q], vocab, all_gather, stats=stats, **settings).tokens
            t_sharded = time.perf_counter() - t
            barrier.wait()
            t = time.perf_counter()
            gathered[:, cuts[q]:cuts[q + 1]] = mine  # this rank's slice to rank 0
            barrier.wait()
            if q == 0:
                whole = tokenrace.Sampler(vocab, max_rows=1024, seed=rep, threads=1)
                tokens_out[:] = whole.draw(gathered, **settings)
            barrier.wait()
            back = tokens_out.copy()  # the tokens broadcast
            t_gather = time.perf_counter() - t
            assert np.array_equal(back, tokens), "the sharded tokens differ from the gathered draw's"
            if q == 0:
                times[0, rep], times[1, rep] = t_sharded, t_gather
                info[0] = stats["rounds"]
                info[1] = sum(stats["bytes_per_round"])
                info[2:2 + min(6, len(sent))] = sent[:6]
    finally:
        for m in shm.values():
            m.close()


def _peaked(rows, g):
    x = (g.standard_normal((rows, 151936)) * 2).astype(np.float32)
    for r in range(rows):
        x[r, g.integers(0, x.shape[1], 8)] = 12 + 3 * g.random(8)
    return x


KINDS = {
    "sample": lambda rows: dict(temperature=np.ones(rows, np.float32)),
    "greedy": lambda rows: dict(temperature=np.zeros(rows, np.float32)),
    "topp_peaked": lambda rows: dict(temperature=np.ones(rows, np.float32), top_p=np.full(rows, 0.9, np.float32),
                                     top_k=np.full(rows, 50, np.int32)),
    "topp_flat": lambda rows: dict(temperature=np.ones(rows, np.float32), top_p=np.full(rows, 0.9, np.float32)),
}


def processes(a):
    import multiprocessing as mp
    from multiprocessing import shared_memory

    g = np.random.default_rng(0)
    ctx = mp.get_context("spawn")
    print(f"{'kind':12} {'R':>2} {'rows':>4} {'rounds':>6} {'sharded B/rank':>14} {'gather B':>12} "
          f"{'sharded ms':>10} {'gather ms':>9}")
    results = []
    for kind in a.kinds.split(","):
        for rows in (int(r) for r in a.rows.split(",")):
            if kind == "topp_peaked":
                x = _peaked(rows, g)[:, :a.vocab]
            else:
                x = (g.standard_normal((rows, a.vocab)) * 2).astype(np.float32)
            for ranks in (int(r) for r in a.ranks.split(",")):
                room = 8 + rows * (shard.MASS_DTYPE.itemsize + 4 * 64)
                sizes = {"x": x.nbytes, "gathered": x.nbytes, "tokens": 4 * rows, "times": 16 * a.reps,
                         "info": 64, "exchange": ranks * room}
                shm = {k: shared_memory.SharedMemory(create=True, size=v) for k, v in sizes.items()}
                try:
                    np.ndarray(x.shape, np.float32, buffer=shm["x"].buf)[:] = x
                    barrier = ctx.Barrier(ranks)
                    names = {k: m.name for k, m in shm.items()}
                    procs = [ctx.Process(target=_proc_rank,
                                         args=(q, ranks, rows, a.vocab, kind, a.reps, names, barrier, room))
                             for q in range(ranks)]
                    for p in procs:
                        p.start()
                    for p in procs:
                        p.join()
                    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
                    times = np.ndarray((2, a.reps), np.float64, buffer=shm["times"].buf).copy()
                    info = np.ndarray(8, np.int64, buffer=shm["info"].buf).copy()
                finally:
                    for m in shm.values():
                        m.close()
                        m.unlink()
                cuts = cuts_of(a.vocab, ranks)
                r = {"kind": kind, "ranks": ranks, "rows": rows, "vocab": a.vocab, "rounds": int(info[0]),
                     "sharded_sent_per_rank": int(info[1]), "bytes_per_round": [int(b) for b in info[2:2 + info[0]]],
                     "gather_bytes": rows * 4 * (a.vocab - (cuts[1] - cuts[0])) + rows * 4 * (ranks - 1),
                     "sharded_s": float(np.median(times[0])), "gather_s": float(np.median(times[1]))}
                results.append(r)
                print(f"{kind:12} {ranks:>2} {rows:>4} {r['rounds']:>6} {r['sharded_sent_per_rank']:>14} "
                      f"{r['gather_bytes']:>12} {1e3 * r['sharded_s']:>10.2f} {1e3 * r['gather_s']:>9.2f}",
                      flush=True)
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="2,4,8")
    ap.add_argument("--rows", default="1,8,64,256")
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json")
    ap.add_argument("--processes", action="store_true", help="ranks as processes over shared memory")
    ap.add_argument("--kinds", default="sample,greedy,topp_peaked,topp_flat")
    ap.add_argument("--step", action="store_true", help="the cost of the sampling step in the sharded path")
    a = ap.parse_args()
    if a.processes or a.step:
        results = processes(a) if a.processes else step_cost(a)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(results, f, indent=1)
        return
    g = np.random.default_rng(0)
    results = []
    print(f"{'kind':7} {'R':>2} {'rows':>4} {'rounds':>6} {'sharded B/rank':>14} {'gather B rank0':>15} "
          f"{'sharded ms':>10} {'gather ms':>9}")
    for kind, temp in (("sample", 1.0), ("greedy", 0.0)):
        for rows in (int(r) for r in a.rows.split(",")):
            x = (g.standard_normal((rows, a.vocab)) * 2).astype(np.float32)
            temps = np.full(rows, temp, np.float32)
            for ranks in (int(r) for r in a.ranks.split(",")):
                runs = [step(x, temps, ranks, seed=rep) for rep in range(a.reps)]
                r = dict(runs[0], kind=kind, ranks=ranks, rows=rows, vocab=a.vocab,
                         sharded_s=statistics.median(x["sharded_s"] for x in runs),
                         gather_s=statistics.median(x["gather_s"] for x in runs))
                results.append(r)
                print(f"{kind:7} {ranks:>2} {rows:>4} {r['rounds']:>6} {r['sharded_sent_per_rank']:>14} "
                      f"{r['gather_bytes_rank0']:>15} {1e3 * r['sharded_s']:>10.3f} {1e3 * r['gather_s']:>9.3f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
