#!/usr/bin/env python3
"""Each input of the sampling step alone, through the Python binding: bench/compare.py's
batch (32 rows x vocab 151936, 4096 + 1024 history ids a row, 16 biased ids, a bitmask allowing
10%), drawn with one input at a time and with all of them, at 1 and 16 threads, and the cost of
the binding's conversion of the step's fields (``step_fields``) alone.

    TOKENRACE_LIBRARY=target/release/libtokenrace.so python3 bench/step_inputs.py

Medians of 7 rounds of 30 calls (min in parentheses), us a call.
"""
import os
import sys
import time
import timeit

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "bindings", "python"))
import compare  # noqa: E402
import tokenrace  # noqa: E402
from tokenrace import _call, _step  # noqa: E402


def main():
    rows, vocab = 32, 151936
    rng = np.random.default_rng(0)
    x = compare.peaked_logits(rows, vocab, rng)
    prompt, output, bias_ids, bias_values, bitmask, _ = compare.step_inputs(rows, vocab, 4096, 1024, 16, 0.1, rng)
    x[np.arange(rows)[:, None], bias_ids[:, :2]] = 20.0  # as compare.py: allowed and likely
    bias = (np.ascontiguousarray(bias_ids.reshape(-1), np.int32), bias_values.reshape(-1),
            np.arange(rows + 1, dtype=np.uint64) * np.uint64(16))
    p, o = compare.csr_of(prompt), compare.csr_of(output)
    penalties = dict(repetition_penalty=1.1, frequency_penalty=0.2, presence_penalty=0.1)
    full = dict(temperature=1.0, prompt_tokens=p, output_tokens=o, logit_bias=bias, token_bitmask=bitmask, **penalties)
    variants = {
        "plain": dict(temperature=1.0),
        "all": full,
        "all but the bias": {k: v for k, v in full.items() if k != "logit_bias"},
        "all but the bitmask": {k: v for k, v in full.items() if k != "token_bitmask"},
        "bitmask": dict(temperature=1.0, token_bitmask=bitmask),
        "histories": dict(temperature=1.0, prompt_tokens=p, output_tokens=o, **penalties),
        "bias": dict(temperature=1.0, logit_bias=bias),
    }
    state = _call.CallState()

    def fields():
        _step.step_fields(rows, vocab, [], p, o, 1.1, 0.2, 0.1, bias, None, None, bitmask, state)

    print(f"step_fields {min(timeit.repeat(fields, number=500, repeat=5)) / 500 * 1e6:.1f} us")
    for threads in (1, 16):
        s = tokenrace.Sampler(vocab, max_rows=256, seed=1, threads=threads)
        for name, args in variants.items():
            for _ in range(20):
                s.draw(x, **args)
            times = []
            for _ in range(7):
                start = time.perf_counter()
                for _ in range(30):
                    s.draw(x, **args)
                times.append((time.perf_counter() - start) / 30 * 1e6)
            print(f"threads {threads:2d} {name:20s} {np.median(times):8.1f} us (min {min(times):.1f})")


if __name__ == "__main__":
    main()
