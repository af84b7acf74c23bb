"""The native objects' lifetime across threads: ``close()`` while other threads are inside calls.

``Sampler.close()`` must not free the native sampler under a draw in progress (a use-after-free),
and ``NoisePool.close()`` must wake a borrow blocked under the BLOCK policy at once.

The free functions are observed by replacing them on the loaded library (the binding looks them up
at call time); ``monkeypatch`` puts the originals back.
"""

import ctypes
import gc
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


def test_close_wakes_a_borrower_blocked_under_block(tokenrace):
    """A BLOCK borrow waiting on an exhausted ring (timeout one minute) raises ClosedError as soon
    as another thread closes the pool."""
    pool = tokenrace.NoisePool(64, 2, seed=1, policy="block", timeout_ms=60000)
    held = [pool.borrow(1), pool.borrow(1)]  # the whole ring is out: nothing can be refilled
    outcome = {}

    def borrower():
        try:
            pool.borrow(1).release()
            outcome["result"] = "borrowed"
        except BaseException as e:  # checked below
            outcome["result"] = e
        outcome["at"] = time.monotonic()

    t = threading.Thread(target=borrower, daemon=True)
    t.start()
    time.sleep(0.3)
    try:
        assert t.is_alive(), f"the borrow did not block: {outcome}"
        closed_at = time.monotonic()
        pool.close()
        t.join(timeout=5)
        assert not t.is_alive(), "close() did not wake the blocked borrower"
    finally:
        # Without the fix this lets the borrower finish rather than wait out its minute.
        for lease in held:
            lease.release()
        t.join(timeout=5)
    e = outcome["result"]
    assert isinstance(e, tokenrace.ClosedError), f"the borrower got {e!r}"
    assert "shut down" in str(e)
    assert outcome["at"] - closed_at < 2.0
    with pytest.raises(tokenrace.ClosedError):
        pool.borrow(1)
    pool.close()  # idempotent


def test_a_closed_pool_is_shut_down_while_a_lease_is_out(tokenrace, lib, monkeypatch):
    """close() shuts the native pool down at once (no more borrows, even through a handle still
    held), while a lease still out keeps its memory readable and is freed with the last of them."""
    freed = []
    spy_free(monkeypatch, lib, "tokenrace_pool_free", lambda ptr: freed.append(pointer_value(ptr)))
    pool = tokenrace.NoisePool(32, 4, seed=2)
    lease = pool.borrow(2)
    handle = pool._handle
    mine = pointer_value(handle.ptr)
    noise = lease.array
    pool.close()
    # The handle is alive (the lease holds it), but the native pool refuses borrows: shut down.
    lease2 = tokenrace._ffi.tokenrace_pool_lease()
    status = lib.tokenrace_pool_borrow(handle.ptr, 1, ctypes.byref(lease2))
    assert status == tokenrace._ffi.STATUS_CLOSED
    assert np.isfinite(noise).all()
    assert mine not in freed
    lease.release()
    del lease, noise, handle
    gc.collect()  # (this may free pools that earlier tests left for the collector, too)
    assert freed.count(mine) == 1
