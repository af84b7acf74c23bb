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


def spy_free(monkeypatch, lib, name, on_free, only):
    """Replaces ``lib.<name>`` (a ``tokenrace_*_free``) by a wrapper that calls ``on_free(ptr)``
    when ``ptr`` is the native object ``only`` (a pointer value), then the real function.

    Frees of other objects are not reported: the collector may free, in any thread and at any
    moment, an object that an earlier test left unclosed in a reference cycle (as
    ``with pytest.raises(...) as e`` does with the test's locals)."""
    real = getattr(lib, name)

    def free(ptr):
        if pointer_value(ptr) == only:
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
    spy_free(monkeypatch, lib, "tokenrace_sampler_free", lambda ptr: freed.append(pointer_value(ptr)),
             only=pointer_value(s._handle.ptr))
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
    s = tokenrace.Sampler(16)
    spy_free(monkeypatch, lib, "tokenrace_sampler_free", lambda ptr: freed.append(pointer_value(ptr)),
             only=pointer_value(s._handle.ptr))
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
    mine = pointer_value(s._handle.ptr)
    lock = threading.Lock()
    in_flight = [0]
    frees = []  # the number of draws in progress at each free of this sampler
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
    spy_free(monkeypatch, lib, "tokenrace_sampler_free", on_free, only=mine)

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


class SamplerLedger:
    """Watches every native sampler made by a test: the draws of each in progress, and each free.

    Records a problem (instead of crashing the process) for a draw of a sampler already freed, a
    free of one already freed, and a free while draws of it are in progress. Frees of samplers it
    was not told about (earlier tests' garbage, freed by the collector) pass through."""

    def __init__(self, lib, monkeypatch):
        # Reentrant: a free may run inside a locked section, when an allocation there triggers
        # the collector in this thread.
        self.lock = threading.RLock()
        self.in_flight = {}  # pointer -> draws in progress, for each watched sampler not freed
        self.freed = set()  # watched pointers freed (forgotten again when the address is reused)
        self.problems = []
        real_draw, real_free = lib.tokenrace_draw, lib.tokenrace_sampler_free

        def draw(ptr, batch, out):
            key = pointer_value(ptr)
            with self.lock:
                if key in self.freed:
                    self.problems.append("a draw of a freed sampler")
                    raise AssertionError("a draw of a freed sampler")
                if key in self.in_flight:
                    self.in_flight[key] += 1
            try:
                return real_draw(ptr, batch, out)
            finally:
                with self.lock:
                    if key in self.in_flight:
                        self.in_flight[key] -= 1

        def free(ptr):
            key = pointer_value(ptr)
            with self.lock:
                if key in self.freed:
                    self.problems.append("a sampler freed twice")
                    return
                draws = self.in_flight.pop(key, 0)
                if draws:
                    self.problems.append(f"a sampler freed with {draws} draws of it in progress")
                    return  # leaked rather than freed under the draws: the test fails anyway
                if key is not None:
                    self.freed.add(key)
            real_free(ptr)

        monkeypatch.setattr(lib, "tokenrace_draw", draw)
        monkeypatch.setattr(lib, "tokenrace_sampler_free", free)

    def watch(self, sampler):
        key = pointer_value(sampler._handle.ptr)
        with self.lock:
            self.freed.discard(key)
            self.in_flight[key] = 0
        return sampler

    def unfreed(self):
        with self.lock:
            return len(self.in_flight)


def test_samplers_closed_by_many_threads_while_many_draw_are_freed_once(tokenrace, lib, monkeypatch, rng):
    """Round after round, drawing threads and closing threads start together on one sampler while
    another thread runs the collector over unclosed samplers left in reference cycles: every
    sampler is freed exactly once, never under a draw of it, and every draw either completes or
    raises ClosedError."""
    vocab, rows, rounds, n_drawers, n_closers = 2048, 8, 40, 4, 3
    x = rng.standard_normal((rows, vocab)).astype(np.float32)
    ledger = SamplerLedger(lib, monkeypatch)

    def garbage_sampler():
        # Unclosed and in a cycle, as a test's ``pytest.raises(...) as e`` leaves its sampler:
        # only the collector frees it, at a moment no one chooses.
        cycle = [ledger.watch(tokenrace.Sampler(16))]
        cycle.append(cycle)

    for r in range(rounds):
        s = ledger.watch(tokenrace.Sampler(vocab, max_rows=rows, threads=1 + r % 2, seed=r))
        garbage_sampler()
        start = threading.Barrier(n_drawers + n_closers + 1)
        drew = threading.Event()
        endings = [None] * n_drawers
        out_of_range = []

        def drawer(k):
            start.wait()
            try:
                while True:
                    tokens = s.draw(x, temperature=1.0)
                    if not ((tokens >= 0) & (tokens < vocab)).all():
                        out_of_range.append(tokens)
                    drew.set()
                    s.stats()
            except BaseException as e:  # ClosedError is expected; anything else is reported below
                endings[k] = e

        def closer():
            start.wait()
            drew.wait(5)
            s.close()

        def collector():
            start.wait()
            drew.wait(5)
            gc.collect()

        threads = [threading.Thread(target=drawer, args=(k,), daemon=True) for k in range(n_drawers)]
        threads += [threading.Thread(target=closer, daemon=True) for _ in range(n_closers)]
        threads.append(threading.Thread(target=collector, daemon=True))
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert not any(t.is_alive() for t in threads), f"round {r}: a thread did not stop after close()"
        assert not out_of_range, f"round {r}: a draw returned a token out of range"
        for k, e in enumerate(endings):
            assert isinstance(e, tokenrace.ClosedError), f"round {r}: thread {k} ended with {e!r}, not ClosedError"
        assert not ledger.problems, f"round {r}: {ledger.problems}"
        del s, threads
    gc.collect()
    assert not ledger.problems, ledger.problems
    assert ledger.unfreed() == 0, f"{ledger.unfreed()} samplers were never freed"


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
    pool = tokenrace.NoisePool(32, 4, seed=2)
    lease = pool.borrow(2)
    handle = pool._handle
    mine = pointer_value(handle.ptr)
    spy_free(monkeypatch, lib, "tokenrace_pool_free", lambda ptr: freed.append(pointer_value(ptr)), only=mine)
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
