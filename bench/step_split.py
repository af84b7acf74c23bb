"""The sampling step, one input at a time: each row of the table is a draw with only
that input (or all of them), timed against the plain draw of the same logits in the same run.
The inputs are bench/compare.py's --step inputs (32 rows x vocab 151936, 4096 prompt + 1024
output tokens per row, 16 biased ids, a bitmask allowing 10% that keeps each row's likeliest
tokens). With --history N the histories hold N - O prompt + O output tokens (--output O,
default 1024; a reasoning model's long output: --history 28000 --output 27000); the
"requests" cases name the rows of a tokenrace.Requests state holding them instead of passing
the lists.

  TOKENRACE_LIBRARY=$PWD/target/release/libtokenrace.so python3 bench/step_split.py [--threads 1] [--reps 30] [--history 5120] [--output 1024]
"""
import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import compare  # noqa: E402  (puts the binding on the path too)
import tokenrace  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--history", type=int, default=5120, help="prompt + output tokens a row")
    ap.add_argument("--output", type=int, default=1024, help="of which output tokens")
    a = ap.parse_args()
    rows, vocab = 32, 151936
    rng = np.random.default_rng(0)
    x = compare.peaked_logits(rows, vocab, rng)
    prompt, output, bias_ids, bias_values, bitmask, _ = compare.step_inputs(rows, vocab, a.history - a.output, a.output, 16, 0.10, rng)
    x[np.arange(rows)[:, None], bias_ids[:, :2]] = 20.0  # as compare.py: allowed and likely
    sampler = tokenrace.Sampler(vocab, max_rows=256, seed=1, threads=a.threads)
    bias = (np.ascontiguousarray(bias_ids.reshape(-1), np.int32), bias_values.reshape(-1),
            np.arange(rows + 1, dtype=np.uint64) * np.uint64(16))
    hist = dict(prompt_tokens=compare.csr_of(prompt), output_tokens=compare.csr_of(output))
    pen = dict(hist, repetition_penalty=1.1, frequency_penalty=0.2, presence_penalty=0.1)
    state = tokenrace.Requests()
    ids = np.arange(rows, dtype=np.uint64) + np.uint64(1 << 40)
    state.add_rows(ids, prompt, output, pad_id=vocab)
    held = dict(requests=state, request_ids=ids, repetition_penalty=1.1, frequency_penalty=0.2, presence_penalty=0.1)
    holding = tokenrace.Requests()
    holding.add_rows(ids, prompt, output, pad_id=vocab)
    for r, i in enumerate(ids.tolist()):
        holding.set_params(i, temperature=1.0, repetition_penalty=1.1, frequency_penalty=0.2, presence_penalty=0.1,
                           logit_bias=dict(zip(bias_ids[r].tolist(), bias_values[r].tolist())))
    own = dict(requests=holding, request_ids=ids)
    cases = {"plain": {}, "bitmask": dict(token_bitmask=bitmask), "bias": dict(logit_bias=bias),
             "repetition": dict(hist, repetition_penalty=1.1), "penalties": pen,
             "everything": dict(pen, logit_bias=bias, token_bitmask=bitmask),
             "requests-penalties": held, "requests-everything": dict(held, logit_bias=bias, token_bitmask=bitmask),
             "held-everything": dict(own, token_bitmask=bitmask)}
    times = {k: [] for k in cases}
    for _ in range(a.reps):  # interleaved, so that a load on the machine weighs on every case alike
        for k, kw in cases.items():
            t = time.perf_counter()
            # (The held cases' temperature is their requests'.)
            sampler.draw(x, **({} if kw.get("requests") is holding else {"temperature": 1.0}), **kw)
            times[k].append(time.perf_counter() - t)
    growing = tokenrace.Requests()
    growing.add_rows(ids, prompt, output, pad_id=vocab)
    tokens = sampler.draw(x, temperature=1.0)
    appends = []
    for _ in range(a.reps):
        t = time.perf_counter()
        growing.append(ids, tokens)
        appends.append(time.perf_counter() - t)
    base = np.median(times["plain"])
    for k, v in times.items():
        print(f"{k:<20}{np.median(v) * 1e6:>10.0f} us {np.median(v) / base:>6.2f}x plain")
    print(f"{'append (32 tokens)':<20}{np.median(appends) * 1e6:>10.1f} us")


if __name__ == "__main__":
    main()
