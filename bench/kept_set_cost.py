#!/usr/bin/env python3
"""Per-row cost of the kept-set outputs against the plain seeded draw, through the binding.

  TOKENRACE_LIBRARY=$PWD/target/release/libtokenrace.so python3 bench/kept_set_cost.py [--reps 15]

32 rows x vocab 151936 f32, one thread: rows N(0, 4) ("peaked") and N(0, 1) ("flat"), each with
top-k 50 + top-p 0.9, top-p 0.95, min-p 0.05 and greedy; us per row (median of --reps calls) of
`draw`, of `draw_full` (which adds the sampled token's logprob), of `draw_full(kept_set=True)`
(threshold, count, mass) and with `kept_bitmask=True` too, and their ratios to `draw`. Run it with two libraries to compare them (the rows are the
same for the same --seed). `examples/kept_set_cost.rs` measures the same from Rust.
"""
import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "bindings", "python"))
import tokenrace  # noqa: E402

CASES = [
    ("top-k 50 + top-p .9", dict(temperature=1.0, top_k=50, top_p=0.9)),
    ("top-p .95", dict(temperature=1.0, top_p=0.95)),
    ("min-p .05", dict(temperature=1.0, min_p=0.05)),
    ("greedy", dict(temperature=0.0)),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    rows, vocab = 32, 151936
    s = tokenrace.Sampler(vocab_size=vocab, threads=1, seed=1, max_rows=rows)
    rng = np.random.default_rng(a.seed)
    seeds = np.arange(rows, dtype=np.uint64)

    def per_row(call):
        call()
        ts = []
        for _ in range(a.reps):
            t = time.perf_counter()
            call()
            ts.append((time.perf_counter() - t) * 1e6 / rows)
        return float(np.median(ts))

    print(f"# library {os.environ.get('TOKENRACE_LIBRARY', '(default)')}, level {tokenrace.simd_level()}, "
          f"{rows} rows x {vocab}, 1 thread, us per row (median of {a.reps} calls)")
    for profile, sd in (("peaked", 4.0), ("flat", 1.0)):
        x = (rng.standard_normal((rows, vocab), dtype=np.float32) * sd).astype(np.float32)
        for name, kw in CASES:
            d = per_row(lambda: s.draw(x, seeds=seeds, **kw))
            f = per_row(lambda: s.draw_full(x, seeds=seeds, **kw))
            k = per_row(lambda: s.draw_full(x, seeds=seeds, kept_set=True, **kw))
            b = per_row(lambda: s.draw_full(x, seeds=seeds, kept_set=True, kept_bitmask=True, **kw))
            print(f"{profile:7} {name:20} draw {d:7.1f}  draw_full {f:7.1f} ({f / d:5.2f}x)  + set {k:7.1f} "
                  f"({k / d:5.2f}x)  + bitmask {b:7.1f} ({b / d:5.2f}x)", flush=True)


if __name__ == "__main__":
    main()
