#!/usr/bin/env python3
"""tokenrace against the samplers a user would otherwise write, in one process, on the same inputs.

Peers (each only where its package is installed):
  numpy-vllm       softmax(x/T) / Exp(1) noise drawn per call, argmax   (vLLM's random_sample in NumPy)
  numpy-ready      argmax(x/T - log_noise) with the noise already drawn (the Spyre ring buffer's form)
  torch-random     vLLM's random_sample on CPU: softmax, q.exponential_(), probs.div_(q).argmax
  torch-topk-topp  vLLM's sort-based apply_top_k_top_p (k=50, p=0.9), then random_sample
tokenrace paths: greedy, race (inline noise), race-ready (the same ready log-noise as numpy-ready),
top-k50-top-p0.9.

  python3 bench/compare.py --threads 1 --rows 1,8,32 --vocab 163840 [--json out.json]

Every number is the median of per-call wall time over --reps calls after one warm-up; the
ratio column is the peer's time over tokenrace's on the same path kind, in the same run.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "bindings", "python"))
import tokenrace  # noqa: E402

try:
    import torch
except ImportError:  # the peers that need torch are skipped
    torch = None


def peaked_logits(rows, vocab, rng):
    x = rng.normal(0.0, 3.0, size=(rows, vocab)).astype(np.float32)
    for r in range(rows):
        idx = rng.choice(vocab, 4, replace=False)
        x[r, idx] = 20.0 - np.arange(4, dtype=np.float32) * 0.7
    return x


def median_us(fn, reps, budget_s=20.0):
    fn()  # warm up
    times = []
    start = time.perf_counter()
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e6)
        if time.perf_counter() - start > budget_s and len(times) >= 3:
            break
    return float(np.median(times))


def numpy_vllm(x, t, rng):
    z = x / t
    z = z - z.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    q = rng.exponential(size=p.shape).astype(np.float32)
    return np.argmax(p / q, axis=1)


def numpy_ready(x, t, log_noise):
    return np.argmax(x / t - log_noise, axis=1)


def torch_random(x, t):
    probs = torch.softmax(x / t, dim=-1, dtype=torch.float32)
    q = torch.empty_like(probs).exponential_()
    return probs.div_(q).argmax(dim=-1)


def torch_topk_topp(x, t, k, p):
    logits = x / t
    logits_sort, logits_idx = logits.sort(dim=-1, descending=False)
    kth = logits_sort.gather(-1, (logits_sort.size(1) - k).unsqueeze(1))
    logits_sort.masked_fill_(logits_sort < kth, -float("inf"))
    probs_sort = logits_sort.softmax(dim=-1)
    probs_sum = torch.cumsum(probs_sort, dim=-1, out=probs_sort)
    mask = probs_sum <= 1 - p.unsqueeze(1)
    mask[:, -1] = False
    logits_sort.masked_fill_(mask, -float("inf"))
    logits = logits_sort.scatter(dim=-1, index=logits_idx, src=logits_sort)
    return torch_random(logits, 1.0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rows", default="1,8,32,128,256")
    ap.add_argument("--vocab", type=int, default=163840)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    if torch is not None:
        torch.set_num_threads(a.threads)
    sampler = tokenrace.Sampler(a.vocab, max_rows=256, seed=1, threads=a.threads)
    has_filters = "top_k" in tokenrace.Sampler.draw.__code__.co_varnames
    print(f"tokenrace {tokenrace.version()} ({sampler.simd_level if hasattr(sampler, 'simd_level') else tokenrace.simd_level()}), "
          f"numpy {np.__version__}, torch {torch.__version__ if torch else 'absent'}, threads {a.threads}, "
          f"{os.cpu_count()} cpus, vocab {a.vocab}")
    print(f"{'path':<22}{'rows':>6}{'us/call':>12}{'us/row':>10}{'tokenrace us/call':>19}{'peer/tokenrace':>16}")
    records = []

    def report(path, rows, us, ours):
        ratio = us / ours if ours else float("nan")
        print(f"{path:<22}{rows:>6}{us:>12.1f}{us / rows:>10.2f}{ours:>19.1f}{ratio:>16.1f}")
        records.append(dict(path=path, rows=rows, vocab=a.vocab, threads=a.threads, us_per_call=us,
                            us_per_row=us / rows, tokenrace_us_per_call=ours, ratio=ratio))

    for rows in [int(r) for r in a.rows.split(",")]:
        x = peaked_logits(rows, a.vocab, rng)
        temps = np.full(rows, 1.0, dtype=np.float32)
        log_noise = np.log(rng.exponential(size=x.shape)).astype(np.float32)
        greedy = median_us(lambda: sampler.draw(x, temperature=0.0), a.reps)
        race = median_us(lambda: sampler.draw(x, temperature=temps), a.reps)
        ready = median_us(lambda: sampler.draw(x, temperature=temps, noise=log_noise, noise_kind="log_exp"), a.reps)
        report("tokenrace-greedy", rows, greedy, greedy)
        report("tokenrace-race", rows, race, race)
        report("tokenrace-race-ready", rows, ready, ready)
        filt = None
        if has_filters:
            filt = median_us(lambda: sampler.draw(x, temperature=temps, top_k=50, top_p=0.9), a.reps)
            report("tokenrace-topk-topp", rows, filt, filt)
        reps = max(3, a.reps // 5)
        report("numpy-vllm", rows, median_us(lambda: numpy_vllm(x, 1.0, rng), reps), race)
        report("numpy-ready", rows, median_us(lambda: numpy_ready(x, 1.0, log_noise), reps), ready)
        if torch is not None:
            tx = torch.from_numpy(x)
            report("torch-random", rows, median_us(lambda: torch_random(tx, 1.0), reps), race)
            k = torch.full((rows,), 50, dtype=torch.long)
            p = torch.full((rows,), 0.9, dtype=torch.float32)
            report("torch-topk-topp", rows, median_us(lambda: torch_topk_topp(tx, 1.0, k, p), reps), filt or race)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
