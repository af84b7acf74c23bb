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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="2,4,8")
    ap.add_argument("--rows", default="1,8,64,256")
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json")
    a = ap.parse_args()
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
