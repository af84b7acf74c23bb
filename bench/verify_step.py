"""Speculative verification with and without the sampling step (penalties over 1,000-token
prompt and output histories): 8 requests x 4 drafts, vocab 151936, N(0, 3) rows, T 0.8, one
thread, medians of 30 calls in 3 rounds.

  TOKENRACE_LIBRARY=target/release/libtokenrace.so PYTHONPATH=bindings/python python3 bench/verify_step.py
"""
import time, numpy as np, tokenrace
R, K, V, H = 8, 4, 151936, 1000
rng = np.random.default_rng(0)
x = rng.normal(0, 3, size=(R * (K + 1), V)).astype(np.float32)
drafts = rng.integers(0, V, size=R * K).astype(np.int32)
counts = np.full(R, K, np.int32)
prompt = [rng.integers(0, V, size=H).tolist() for _ in range(R)]
output = [rng.integers(0, V, size=H).tolist() for _ in range(R)]
s = tokenrace.Sampler(V, max_rows=256, seed=1, threads=1)
plain = lambda: s.verify(x, drafts, counts, temperature=0.8)
step = lambda: s.verify(x, drafts, counts, temperature=0.8, prompt_tokens=prompt, output_tokens=output,
                        repetition_penalty=1.1, frequency_penalty=0.2, presence_penalty=0.1)
def med(f, n=30):
    f(); t = []
    for _ in range(n):
        a = time.perf_counter(); f(); t.append(time.perf_counter() - a)
    return np.median(t) * 1e6
for rnd in range(3):
    a, b = med(plain), med(step)
    print(f"round {rnd}: verify {a:.0f} us, verify + step {b:.0f} us, ratio {b / a:.2f}")
