#!/usr/bin/env python3
"""The score call against the plain draw and draw_full with logprobs, us per row (64 x 151936,
1 thread, medians of 15 calls, 3 interleaved rounds):

  TOKENRACE_LIBRARY=$PWD/target/release/libtokenrace.so PYTHONPATH=bindings/python python3 bench/score.py
"""
import time, numpy as np, tokenrace
rows, vocab = 64, 151936
rng = np.random.default_rng(0)
x = (rng.standard_normal((rows, vocab)) * 3).astype(np.float32)
t = rng.integers(0, vocab, rows)
s = tokenrace.Sampler(vocab, seed=1, threads=1)
def med(f, n=15):
    ts = []
    for _ in range(n):
        a = time.perf_counter(); f(); ts.append(time.perf_counter() - a)
    return np.median(ts) * 1e6 / rows
for rnd in range(3):
    d = med(lambda: s.draw(x))
    f = med(lambda: s.draw_full(x, logprobs=20, ranks=True))
    sc = med(lambda: s.score(x, t, logprobs=20, ranks=True))
    print(f"round {rnd}: us/row draw {d:.1f}  draw_full(20, ranks) {f:.1f}  score(20, ranks) {sc:.1f}  score/draw_full {sc/f:.2f}")
