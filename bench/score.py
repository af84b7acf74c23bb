#!/usr/bin/env python3
"""Prompt logprobs: ``Sampler.score`` against ``draw_full`` (the drawn token's logprob) and
``draw_full(forced_tokens=)`` (the same targets through a draw), per row.

  python3 bench/score.py [--rows 512] [--vocab 32000] [--reps 7]

Times are CPU time of the calling thread (time.thread_time; the samplers run with threads=1),
the best of --reps calls, in us per row; the three calls report the same values for the same
tokens (tests/score.rs), so the difference is the race a score skips.
"""

import argparse
import time

import numpy as np

import tokenrace


def best_us_per_row(call, rows, reps):
    times = []
    for _ in range(reps):
        start = time.thread_time()
        call()
        times.append(time.thread_time() - start)
    return min(times) * 1e6 / rows


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=512)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--reps", type=int, default=7)
    a = p.parse_args()
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(a.rows, a.vocab)) * 3).astype(np.float32)
    targets = rng.integers(0, a.vocab, a.rows).astype(np.int32)
    s = tokenrace.Sampler(0, threads=1, seed=1, max_rows=max(a.rows, 256))
    print(f"{a.rows} x {a.vocab}, f32, 1 thread, us per row (best of {a.reps})")
    print("outputs | draw_full | draw_full forced | score")
    for ranks, n in ((False, 0), (True, 0), (True, 5)):
        args = dict(logprobs=n, ranks=ranks)
        d = best_us_per_row(lambda: s.draw_full(x, **args), a.rows, a.reps)
        f = best_us_per_row(lambda: s.draw_full(x, forced_tokens=targets, **args), a.rows, a.reps)
        c = best_us_per_row(lambda: s.score(x, targets, **args), a.rows, a.reps)
        what = "logprob" + (" + rank" if ranks else "") + (f" + top-{n}" if n else "")
        print(f"{what} | {d:.1f} | {f:.1f} | {c:.1f}")


if __name__ == "__main__":
    main()
