"""The native objects' lifetime across threads: ``close()`` while other threads are inside calls.

``Sampler.close()`` must not free the native sampler under a draw in progress (a use-after-free).

The free functions are observed by replacing them on the loaded library (the binding looks them up
at call time); ``monkeypatch`` puts the originals back.
"""

import ctypes
import threading
import time

import numpy as np
import pytest

V = 32000
ROWS = 64


def pointer_value(ptr):
    return ctypes.cast(ptr, ctypes.c_void_p).value


@pytest.fixture
def lib(tokenrace):
    return tokenrace._ffi.lib()


def spy_free(monkeypatch, lib, name, on_free):
    """Replaces ``lib.<name>`` (a ``tokenrace_*_free``) by a wrapper that calls ``on_free(ptr)``
    and then the real function."""
    real = getattr(lib, name)

    def free(ptr):
        on_free(ptr)
        real(ptr)

    monkeypatch.setattr(lib, name, free)


def test_close_during_a_draw_frees_the_sampler_only_after_the_draw(tokenrace, lib, monkeypatch, rng):
    """Deterministic: ``close()`` runs inside the draw call (as another thread's would), and the
    native sampler must still be alive when the real ``tokenrace_draw`` runs."""
    x = rng.standard_normal((4, 500)).astype(np.float32)
    seeds = np.arange(4, dtype=np.uint64) + 10
    want = tokenrace.Sampler(500).draw(x, temperature=0.8, seeds=seeds)

    s = tokenrace.Sampler(500)
    freed, drawn = [], []
    spy_free(monkeypatch, lib, "tokenrace_sampler_free", lambda ptr: freed.append(pointer_value(ptr)))
    real_draw = lib.tokenrace_draw

    def draw(ptr, batch, out):
        s.close()
        if freed:
            # Calling the real draw now would read freed memory: fail instead.
            raise AssertionError("close() freed the native sampler while a draw was using it")
        drawn.append(pointer_value(ptr))
        return real_draw(ptr, batch, out)

    monkeypatch.setattr(lib, "tokenrace_draw", draw)
    tokens = s.draw(x, temperature=0.8, seeds=seeds)
    np.testing.assert_array_equal(tokens, want)
    assert s.closed
    # Freed once, the pointer the draw used, as soon as the draw returned.
    assert drawn and freed == drawn
    with pytest.raises(tokenrace.ClosedError, match="Sampler: is closed"):
        s.draw(x)
    with pytest.raises(tokenrace.ClosedError):
        s.stats()
    s.close()  # idempotent
    assert freed == drawn


def test_closing_an_idle_sampler_frees_it_at_once(tokenrace, lib, monkeypatch):
    freed = []
    spy_free(monkeypatch, lib, "tokenrace_sampler_free", lambda ptr: freed.append(pointer_value(ptr)))
    s = tokenrace.Sampler(16)
    s.draw(np.zeros((1, 16), np.float32))
    s.close()
    assert len(freed) == 1
    s.close()
    assert len(freed) == 1


@pytest.mark.parametrize("sampler_threads", [1, 4])
def test_close_while_threads_draw(tokenrace, lib, monkeypatch, rng, sampler_threads):
    """Several threads draw on a large batch in a loop while the main thread closes the sampler:
    every draw either succeeds or raises ClosedError, nothing crashes, and the native sampler is
    freed once, with no draw in progress."""
    x = rng.standard_normal((ROWS, V)).astype(np.float32)
    s = tokenrace.Sampler(V, max_rows=ROWS, threads=sampler_threads, seed=1)
    lock = threading.Lock()
    in_flight = [0]
    frees = []  # the number of draws in progress at each free
    real_draw = lib.tokenrace_draw

    def draw(ptr, batch, out):
        with lock:
            in_flight[0] += 1
        try:
            return real_draw(ptr, batch, out)
        finally:
            with lock:
                in_flight[0] -= 1

    def on_free(_ptr):
        with lock:
            frees.append(in_flight[0])

    monkeypatch.setattr(lib, "tokenrace_draw", draw)
    spy_free(monkeypatch, lib, "tokenrace_sampler_free", on_free)

    n_threads = 4
    done = [0] * n_threads
    endings = [None] * n_threads
    bad = []

    def worker(k):
        try:
            while True:
                tokens = s.draw(x, temperature=1.0)
                if not ((tokens >= 0) & (tokens < V)).all():
                    bad.append(tokens)
                done[k] += 1
        except BaseException as e:  # ClosedError is expected; anything else is reported below
            endings[k] = e

    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(n_threads)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    # Close only once every thread has drawn and a draw is running right now.
    while not (all(done) and in_flight[0] > 0):
        assert time.monotonic() < deadline, f"the drawing threads did not get going: {done}"
        time.sleep(0.0005)
    s.close()
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "a drawing thread did not stop after close()"
    assert not bad, "a draw returned a token out of range"
    for k, e in enumerate(endings):
        assert isinstance(e, tokenrace.ClosedError), f"thread {k} ended with {e!r}, not ClosedError"
    assert frees == [0], f"the native sampler was freed {len(frees)} times, with {frees} draws in progress"
