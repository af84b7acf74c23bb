#!/usr/bin/env python3
"""Draws seeded tokens with the installed tokenrace and prints them, for comparing wheels across
architectures (scripts/build-wheels.sh runs it with each wheel: natively on x86-64, under
qemu-user for aarch64 and s390x, and the outputs must be identical).

The logits are exact binary fractions made from integers (no libm, no random generator), so
every machine starts from the same bits; every row is seeded, so the tokens are a pure function
of (logits, seed, offset) whatever the SIMD level or thread count. The first line (library path
and SIMD level) differs between machines and is not compared; every line after it is.
"""
import numpy as np

import tokenrace

VOCAB, ROWS = 4096, 8


def main():
    i = np.arange(VOCAB, dtype=np.int64)
    r = np.arange(ROWS, dtype=np.int64)[:, None]
    logits = (((i * 7919 + r * 104729) % 2048) / 128.0 - 8.0).astype(np.float32)
    s = tokenrace.Sampler(VOCAB, max_rows=ROWS, seed=1)
    print(f"# tokenrace {tokenrace.version()} from {tokenrace.library_path()}, SIMD level {s.simd_level}")
    seeds = np.arange(100, 100 + ROWS, dtype=np.uint64)
    temps = np.array([0.0, 0.5, 0.7, 1.0, 1.0, 1.3, 2.0, 0.9], np.float32)
    for offset in range(4):
        t = s.draw(logits, temperature=temps, seeds=seeds, offsets=np.full(ROWS, offset, np.uint64))
        print(f"offset {offset}:", t.tolist())
    t = s.draw(logits, temperature=1.0, seeds=seeds, offsets=7, top_k=40, top_p=0.9, min_p=0.01)
    print("filtered:", t.tolist())
    bf = s.draw(logits.astype(np.float16), temperature=temps, seeds=seeds, offsets=3)
    print("float16:", bf.tolist())
    full = s.draw_full(logits, temperature=temps, seeds=seeds, offsets=9, logprobs=2)
    print("draw_full tokens:", full.tokens.tolist())
    print("draw_full logprobs:", [float(x).hex() for x in full.logprobs])
    print("top-2 ids:", full.topn_ids.tolist())


if __name__ == "__main__":
    main()
