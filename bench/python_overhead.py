#!/usr/bin/env python3
"""The Python binding's cost per ``Sampler.draw`` call, on top of the native draw.

  TOKENRACE_LIBRARY=$PWD/target/release/libtokenrace.so python3 bench/python_overhead.py [--calls 20000] [--clock cpu]

For each case (1 and 32 rows, vocab 64, with and without top_k), it times
  python  ``Sampler.draw(logits, temperature=..., top_k=...)``, the call a user makes;
  native  ``tokenrace_draw`` called through ctypes on structs and arrays built once beforehand,
          i.e. the library's draw plus the bare cost of one ctypes foreign call;
  binding ``Sampler.draw`` with ``tokenrace_draw`` replaced by a Python function that returns OK
          at once: the binding's own Python code, without the ctypes call or the native draw;
and prints the medians (of --calls calls each, after a warm-up, timed in chunks of 50 calls that
alternate between the three) and python - native, the overhead that the binding's argument
handling adds. The vocabulary is tiny so that the native draw is short and the difference is the
binding's cost. On a loaded machine python - native also holds the native draw running on caches
that the Python code between calls has cooled; the binding column does not.
"""
import argparse
import contextlib
import ctypes
import os
import statistics
import sys
import time
from ctypes import POINTER, byref, c_float, c_int32

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "bindings", "python"))
import tokenrace  # noqa: E402
from tokenrace import _ffi  # noqa: E402

VOCAB = 64


def median_us(fns, calls, chunk=50, clock=time.perf_counter_ns):
    """The median per-call time of each function, in µs. The functions are timed in alternating
    chunks of ``chunk`` calls, so that a load on the machine that comes and goes weighs on all
    of them alike. A function that is a context manager is entered around each of its chunks."""
    for fn in fns:  # warm-up: caches, branch predictors, lazy imports
        with _context(fn):
            for _ in range(min(calls, 2000)):
                fn()
    samples = [[] for _ in fns]
    for _ in range(max(1, calls // chunk)):
        for fn, out in zip(fns, samples):
            with _context(fn):
                t0 = clock()
                for _ in range(chunk):
                    fn()
                out.append((clock() - t0) / chunk)
    return [statistics.median(s) / 1000.0 for s in samples]


def _context(fn):
    return fn if hasattr(fn, "__enter__") else contextlib.nullcontext()


def native_call(sampler, logits, temperature, top_k):
    """A closure calling tokenrace_draw on prepared structs (what a zero-overhead binding does)."""
    rows = logits.shape[0]
    keep = [np.full(rows, temperature, np.float32), np.empty(rows, np.int32)]
    batch = _ffi.tokenrace_batch()
    batch.dtype = _ffi.DTYPE_F32
    batch.logits = logits.ctypes.data
    batch.rows, batch.vocab, batch.row_stride = rows, VOCAB, VOCAB
    batch.temperature = keep[0].ctypes.data_as(POINTER(c_float))
    if top_k is not None:
        keep.append(np.full(rows, top_k, np.int32))
        batch.top_k = keep[-1].ctypes.data_as(POINTER(c_int32))
    out = _ffi.tokenrace_output()
    out.tokens = keep[1].ctypes.data_as(POINTER(c_int32))
    draw, ptr = _ffi.lib().tokenrace_draw, sampler._handle.ptr
    batch_ref, out_ref = byref(batch), byref(out)

    def call():
        if draw(ptr, batch_ref, out_ref) != 0:
            raise RuntimeError(ctypes.string_at(_ffi.lib().tokenrace_last_error()))

    call.keep = (keep, batch, out)
    return call


class without_the_c_call:
    """Calls ``fn`` with the library's tokenrace_draw replaced by a Python no-op (the binding looks
    the function up at call time); ``median_us`` swaps it in around each chunk of calls."""

    def __init__(self, fn):
        self.fn, self.lib, self.real = fn, _ffi.lib(), None

    def __call__(self):
        self.fn()

    def __enter__(self):
        self.real, self.lib.tokenrace_draw = self.lib.tokenrace_draw, _draw_nothing

    def __exit__(self, *exc):
        self.lib.tokenrace_draw = self.real


def _draw_nothing(sampler, batch, output):
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="wall: perf_counter; cpu: this thread's CPU time, which a busy shared machine "
                         "inflates less (no time spent preempted is counted)")
    args = ap.parse_args()
    clock = time.perf_counter_ns if args.clock == "wall" else time.thread_time_ns
    rng = np.random.default_rng(0)
    sampler = tokenrace.Sampler(VOCAB, seed=1)
    print(f"tokenrace {tokenrace.version()} ({sampler.simd_level}), vocab {VOCAB}, "
          f"median of {args.calls} calls, microseconds per call ({args.clock} clock)")
    print(f"{'case':<28} {'python':>8} {'native':>8} {'overhead':>9} {'binding':>8}")
    for rows in (1, 32):
        logits = rng.standard_normal((rows, VOCAB)).astype(np.float32)
        for top_k in (None, 8):
            def python():
                sampler.draw(logits, temperature=0.8, top_k=top_k)

            python_us, native_us, binding_us = median_us(
                [python, native_call(sampler, logits, 0.8, top_k), without_the_c_call(python)], args.calls,
                clock=clock)
            case = f"{rows} row{'s' if rows > 1 else ''}, " + ("top_k=8" if top_k else "no filter")
            print(f"{case:<28} {python_us:8.2f} {native_us:8.2f} {python_us - native_us:9.2f} {binding_us:8.2f}")


if __name__ == "__main__":
    main()
