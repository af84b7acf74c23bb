#!/usr/bin/env python3
"""Per-row times of the filtered draw, to find slow rows: a serving step waits for its slowest.

  TOKENRACE_LIBRARY=$PWD/target/release/libtokenrace.so python3 bench/row_tail.py [--rows 256] [--check]

For each distribution of logits (flat normal rows at sigmas 1, 3 and 6, each at temperatures 0.5,
0.7 and 1.0; zipf; peaked; many ties; a heavy tail: N(0, 2) and three peaks near 10, 12 or 14,
at temperatures 0.8 and 1.0), vocabulary (32000, 151936, 262144) and filter (top-p 0.9,
top-p 0.95, top-k 50 with top-p 0.9, min-p 0.05, min-p 0.02 with top-p 0.95), it draws `--rows`
fresh rows at 1 thread, once each as a single row and in batches of 32, and prints per cell the
median, 99th percentile and maximum of the per-row time (a batch's per-row time is its call time
/ 32, so a batch's max is the slowest batch) and max / median; for batches also b/s, their
median against the single rows' (a batch of ordinary rows that holds a slow one is slow
throughout; single rows are timed with the row in the cache from the call before, the 32 rows
of a batch at the larger vocabularies do not fit in it). Every time is the minimum of `--repeats` calls (after one warm-up call), and the rows (batches)
slower than twice the median are timed again as many times, later, which keeps the noise of a
shared machine out of the tail but not a row that is slow every time. With --check the exit
status is 1 when some cell's max / median exceeds --limit (4).
"""
import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "bindings", "python"))
import tokenrace  # noqa: E402

BATCH = 32
VOCABS = (32000, 151936, 262144)


def normal(sigma):
    def make(rng, rows, vocab):
        return (rng.standard_normal((rows, vocab), dtype=np.float32) * sigma).astype(np.float32)
    return make


def zipf(rng, rows, vocab):
    # p ∝ rank^-1.1, the ranks shuffled over the vocabulary.
    base = (-1.1 * np.log(np.arange(1, vocab + 1, dtype=np.float64))).astype(np.float32)
    return np.stack([rng.permutation(base) for _ in range(rows)])


def peaked(rng, rows, vocab):
    # A model's usual row: N(0, 2) and a few logits near 15.
    x = rng.standard_normal((rows, vocab), dtype=np.float32) * 2
    for r in range(rows):
        k = 1 + rng.integers(5)
        x[r, rng.integers(vocab, size=k)] = 15 - 3 * rng.random(k)
    return x


def heavy_tail(height):
    # N(0, 2) and three peaks near `height`: at T 0.8-1 the tail holds a third to half of the
    # mass, so top-p 0.9-0.95 keeps tens of thousands of tokens and its threshold lies deep in
    # the tail, where the f32 bounds of the mass below the cut may straddle two tokens.
    def make(rng, rows, vocab):
        x = rng.standard_normal((rows, vocab), dtype=np.float32) * 2
        for r in range(rows):
            x[r, rng.integers(vocab, size=3)] = height - rng.random(3)
        return x
    return make


def ties(rng, rows, vocab):
    # N(0, 3) on a grid of 0.5: large groups of equal logits, the maximum included.
    return np.round(rng.standard_normal((rows, vocab), dtype=np.float32) * 6) / 2


# (name, generator, temperature)
DISTS = [(f"normal s{s} T{t}", normal(s), t) for s in (1, 3, 6) for t in (0.5, 0.7, 1.0)]
DISTS += [("zipf T1", zipf, 1.0), ("peaked T1", peaked, 1.0), ("ties T0.7", ties, 0.7)]
DISTS += [(f"tail h{h} T{t}", heavy_tail(h), t) for h in (10, 12, 14) for t in (0.8, 1.0)]

FILTERS = [
    ("p0.9", dict(top_p=0.9)),
    ("p0.95", dict(top_p=0.95)),
    ("k50 p0.9", dict(top_k=50, top_p=0.9)),
    ("minp0.05", dict(min_p=0.05)),
    ("minp0.02 p0.95", dict(min_p=0.02, top_p=0.95)),
]


def best_of(call, repeats):
    call()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - t0)
    return best


def times_of(calls, repeats):
    """The best of `repeats` calls of each; those slower than twice the median timed again."""
    t = np.array([best_of(c, repeats) for c in calls])
    for i in np.flatnonzero(t > 2 * np.median(t)):
        t[i] = min(t[i], best_of(calls[i], repeats))
    return t


def stats(us):
    us = np.asarray(us)
    med = float(np.median(us))
    return med, float(np.percentile(us, 99)), float(us.max()), float(us.max() / med)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=256, help="rows per distribution and vocabulary (a multiple of 32)")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per row or batch; the minimum counts")
    ap.add_argument("--vocab", type=int, action="append", help="only these vocabularies (repeatable)")
    ap.add_argument("--dist", action="append", help="only distributions whose name contains this (repeatable)")
    ap.add_argument("--filter", action="append", help="only filters named exactly so (repeatable)")
    ap.add_argument("--limit", type=float, default=4.0, help="max / median allowed by --check")
    ap.add_argument("--check", action="store_true", help="exit 1 when a cell's max / median exceeds --limit")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeded", action="store_true",
                    help="seed each row (its index): every call of a row draws the same token the same way, "
                         "so the minimum of the repeats keeps a draw's slow path (unseeded, a row's repeats "
                         "draw afresh and the minimum keeps its fastest draw)")
    a = ap.parse_args()
    rows = max(BATCH, a.rows // BATCH * BATCH)
    vocabs = a.vocab or VOCABS
    dists = [d for d in DISTS if not a.dist or any(s in d[0] for s in a.dist)]
    filters = [f for f in FILTERS if not a.filter or f[0] in a.filter]
    print(f"# tokenrace {tokenrace.__version__ if hasattr(tokenrace, '__version__') else ''} "
          f"library {os.environ.get('TOKENRACE_LIBRARY', '(default)')}")
    print(f"# {rows} rows per distribution and vocabulary, 1 thread, min of {a.repeats} calls"
          f"{' (seeded rows)' if a.seeded else ''}; "
          f"times per row in microseconds; batch: {BATCH} rows a call, time / {BATCH}")
    print(f"{'distribution':<16} {'vocab':>6} {'filter':<15} {'mode':<6} "
          f"{'median':>8} {'p99':>8} {'max':>8} {'max/med':>7} {'b/s':>6}")
    rng = np.random.default_rng(a.seed)
    worst = []
    t_start = time.perf_counter()
    for vocab in vocabs:
        s = tokenrace.Sampler(vocab_size=vocab, threads=1, seed=1)
        for name, make, temp in dists:
            x = make(rng, rows, vocab)
            for fname, kw in filters:
                seeds = np.arange(rows, dtype=np.uint64) if a.seeded else None

                def seeds_of(lo, hi):
                    return None if seeds is None else seeds[lo:hi]
                single = times_of([lambda r=r: s.draw(x[r:r + 1], temperature=temp, seeds=seeds_of(r, r + 1), **kw)
                                   for r in range(rows)], a.repeats)
                batch = times_of([lambda b=b: s.draw(x[b:b + BATCH], temperature=temp, seeds=seeds_of(b, b + BATCH),
                                                     **kw)
                                  for b in range(0, rows, BATCH)], a.repeats) / BATCH
                single_median = float(np.median(single))
                for mode, times in (("single", single), ("batch", batch)):
                    med, p99, mx, ratio = stats(times * 1e6)
                    flag = "  <--" if ratio > a.limit else ""
                    vs = f" {np.median(times) / single_median:6.2f}" if mode == "batch" else ""
                    print(f"{name:<16} {vocab:>6} {fname:<15} {mode:<6} "
                          f"{med:8.1f} {p99:8.1f} {mx:8.1f} {ratio:7.2f}{vs}{flag}", flush=True)
                    worst.append((ratio, name, vocab, fname, mode))
    worst.sort(reverse=True)
    cells = len(worst)
    over = [w for w in worst if w[0] > a.limit]
    print(f"# {cells} cells, {rows * len(vocabs) * len(dists)} distinct rows, {time.perf_counter() - t_start:.0f} s; "
          f"{len(over)} cells with max/median above {a.limit}")
    for ratio, name, vocab, fname, mode in worst[:5]:
        print(f"# worst: {ratio:.2f}x  {name}, vocab {vocab}, {fname}, {mode}")
    if a.check and over:
        sys.exit(1)


if __name__ == "__main__":
    main()
