#!/usr/bin/env python3
"""A hash of many seeded draws, to show that a change of the draw's speed leaves every output alone.

  TOKENRACE_LIBRARY=$PWD/target/release/libtokenrace.so python3 bench/seeded_hash.py [--levels scalar,portable,avx2,avx512]

Draws seeded rows (heavy tails at peak heights 10-14, N(0, 3), N(0, 1), zipf, peaked, ties; T 0.7,
0.8, 1.0; top-p 0.9, 0.95, 0.5, min-p 0.02 + top-p 0.95, min-p 0.05, top-k 50 + top-p 0.9, greedy;
batches of 54 and single rows; 1 and 2 threads; vocabularies 32000 and 151936) through
`draw_full` with the sampled token's logprob, rank and the top 5, and the kept set (threshold,
count, mass, bitmask) on every third call; prints per level the number of draws and a 64-bit hash
(blake2b) of every token, flag, logprob, rank, top-n id and logprob and kept-set output, and
whether every level's hash is the same (exit 1 if not).
"""
import argparse
import hashlib
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "bindings", "python"))
import tokenrace  # noqa: E402


def rows_of(rng, kind, rows, vocab):
    x = rng.standard_normal((rows, vocab), dtype=np.float32)
    if kind.startswith("tail"):
        x *= 2
        h = float(kind[4:])
        for r in range(rows):
            x[r, rng.integers(vocab, size=3)] = h - rng.random(3)
    elif kind == "n3":
        x *= 3
    elif kind == "zipf":
        base = (-1.1 * np.log(np.arange(1, vocab + 1, dtype=np.float64))).astype(np.float32)
        x = np.stack([rng.permutation(base) for _ in range(rows)])
    elif kind == "peaked":
        x *= 2
        for r in range(rows):
            k = 1 + rng.integers(5)
            x[r, rng.integers(vocab, size=k)] = 15 - 3 * rng.random(k)
    elif kind == "ties":
        x = np.round(x * 6) / 2
    return np.ascontiguousarray(x, dtype=np.float32)


FILTERS = [
    dict(top_p=0.9), dict(top_p=0.95), dict(top_p=0.5), dict(min_p=0.02, top_p=0.95), dict(min_p=0.05),
    dict(top_k=50, top_p=0.9), dict(),
]
KINDS = ["tail10", "tail12", "tail14", "n3", "n1", "zipf", "peaked", "ties"]


def run(level, rows_per_case):
    h = hashlib.blake2b(digest_size=8)
    draws = 0
    call = 0
    for vocab in (32000, 151936):
        for threads in (1, 2):
            s = tokenrace.Sampler(vocab_size=vocab, threads=threads, seed=7, simd=level)
            rng = np.random.default_rng(vocab + threads)
            for kind in KINDS:
                x = rows_of(rng, kind, rows_per_case, vocab)
                for temp in (0.7, 0.8, 1.0):
                    for f in FILTERS:
                        kept = call % 3 == 0
                        call += 1
                        seeds = np.arange(rows_per_case, dtype=np.uint64) + call * 1000
                        if call % 2:
                            res = [s.draw_full(x, temperature=temp, seeds=seeds, logprobs=5, ranks=True,
                                               kept_set=kept, kept_bitmask=kept, **f)]
                        else:
                            res = [s.draw_full(x[r:r + 1], temperature=temp, seeds=seeds[r:r + 1], logprobs=5,
                                               ranks=True, kept_set=kept, kept_bitmask=kept, **f)
                                   for r in range(0, rows_per_case, 6)]
                        for r in res:
                            for arr in (r.tokens, r.flags, r.logprobs, r.ranks, r.topn_ids, r.topn_logprobs,
                                        getattr(r, "kept_threshold", None), getattr(r, "kept_count", None),
                                        getattr(r, "kept_mass", None), getattr(r, "kept_bitmask", None)):
                                if arr is not None:
                                    h.update(np.ascontiguousarray(arr).tobytes())
                            draws += len(r.tokens)
    return draws, h.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", default="scalar,portable,avx2,avx512")
    ap.add_argument("--rows", type=int, default=54, help="rows of a batch call (single-row calls: every 6th)")
    a = ap.parse_args()
    hashes = set()
    for level in a.levels.split(","):
        draws, digest = run(level, a.rows)
        print(f"{level}: {draws} draws, hash {digest}", flush=True)
        hashes.add(digest)
    print("identical at every level" if len(hashes) == 1 else "LEVELS DIFFER")
    return 0 if len(hashes) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
