"""NoisePool: zero-copy read-only leases, release, reproducibility, the values' distribution,
the BLOCK policy, the environment, and samplers that take their noise from a pool."""

import gc
import threading
import time
import weakref

import numpy as np
import pytest

from conftest import run_python
from reference import chi_square, softmax64, wilson_hilferty


def wait_produced(pool, rows, limit=5.0):
    """Waits until the producers made ``rows`` rows (so that a BLOCK borrow does not wait)."""
    t0 = time.monotonic()
    while pool.stats()["rows_produced"] < rows:
        assert time.monotonic() - t0 < limit, f"the producers made {pool.stats()} in {limit} s"
        time.sleep(0.001)


def collect(pool, sizes):
    """Copies of the arrays of borrows of ``sizes`` rows (each released before the next)."""
    out = []
    for n in sizes:
        with pool.borrow(n) as noise:
            out.append(noise.copy())
    return out


# -- leases -------------------------------------------------------------------------------------


def test_a_borrow_is_a_zero_copy_read_only_view(tokenrace):
    pool = tokenrace.NoisePool(100, 8, seed=1)
    lease = pool.borrow(3)
    assert (lease.rows, lease.vocab, lease.kind, lease.first_seq) == (3, 100, "log_exp", 0)
    with lease as noise:
        assert noise.shape == (3, 100) and noise.dtype == np.float32
        assert noise.flags.c_contiguous and not noise.flags.owndata
        # No copy: the array's data is the lease's memory (tokenrace_pool_lease.values).
        assert noise.ctypes.data == lease.address
        assert np.shares_memory(noise, lease.array)
        # Read-only, and numpy refuses to make it writeable (the base exports no writable buffer).
        assert not noise.flags.writeable
        with pytest.raises(ValueError):
            noise[0, 0] = 1.0
        with pytest.raises(ValueError):
            noise.flags.writeable = True
        assert np.isfinite(noise).all()
        # A second lease out at the same time: another span of memory.
        with pool.borrow(4) as other:
            a0, a1 = noise.ctypes.data, noise.ctypes.data + noise.nbytes
            b0, b1 = other.ctypes.data, other.ctypes.data + other.nbytes
            assert a1 <= b0 or b1 <= a0, "two leases out at once overlap"
            assert not np.shares_memory(noise, other)
    assert lease.released
    with pytest.raises(RuntimeError, match="released"):
        lease.array
    lease.release()  # idempotent
    assert "released" in repr(lease)


def test_no_row_is_handed_out_twice(tokenrace):
    sizes = [1, 3, 5, 7, 16, 2, 9, 4] * 4
    pool = tokenrace.NoisePool(64, 16, seed=11, kind="exp")
    spans, rows = [], []
    for n in sizes:
        lease = pool.borrow(n)
        with lease as noise:
            spans.append((lease.first_seq, lease.first_seq + n))
            rows.append(noise.copy())
    # Sequence numbers: strictly increasing, disjoint spans (a wrap skips, never repeats).
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), spans
    st = pool.stats()
    assert st["rows_borrowed"] == sum(sizes)
    assert spans[-1][1] == st["rows_borrowed"] + st["rows_skipped"]
    # The values: no row twice, and equal floats only as rarely as 32-bit noise rounded to f32
    # allows (about 1 pair in 10^4 values).
    allrows = np.concatenate(rows)
    assert len({r.tobytes() for r in allrows}) == len(allrows)
    values = allrows.ravel()
    assert values.size - np.unique(values).size <= values.size // 1000


def test_release_after_an_exception(tokenrace):
    # BLOCK: a borrow of the full capacity succeeds only if every row was given back.
    pool = tokenrace.NoisePool(50, 4, seed=2, policy="block", timeout_ms=5000)
    lease = pool.borrow(4)
    with pytest.raises(KeyError):
        with lease as noise:
            assert noise.shape == (4, 50)
            raise KeyError("boom")
    assert lease.released
    with pool.borrow(4) as noise:  # would time out if the rows were still out
        assert noise.shape == (4, 50)
    assert pool.stats()["rows_borrowed"] == 8
    # The control: with a lease still out, the same borrow cannot be served.
    short = tokenrace.NoisePool(50, 4, seed=2, policy="block", timeout_ms=50)
    held = short.borrow(4)
    with pytest.raises(tokenrace.TokenraceTimeoutError):
        short.borrow(4)
    held.release()


def test_an_array_keeps_its_lease_and_a_dropped_lease_is_released(tokenrace):
    pool = tokenrace.NoisePool(20, 2, seed=3, policy="block", timeout_ms=50)
    arr = pool.borrow(2).array  # the lease object is gone, its array is not
    with pytest.raises(tokenrace.TokenraceTimeoutError):
        pool.borrow(1)
    assert np.isfinite(arr).all()
    del arr
    gc.collect()
    pool2 = tokenrace.NoisePool(20, 2, seed=3, policy="block", timeout_ms=5000)
    pool2.borrow(2)  # dropped at once: released by its finalizer
    with pool2.borrow(2) as noise:
        assert noise.shape == (2, 20)


def test_close_and_the_native_lifetime(tokenrace):
    with tokenrace.NoisePool(30, 4, seed=4) as pool:
        lease = pool.borrow(2)
        noise = lease.array
        handle = weakref.ref(pool._handle)
    assert pool.closed and "closed" in repr(pool)
    pool.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        pool.borrow(1)
    with pytest.raises(tokenrace.ClosedError):
        pool.stats()
    # A lease out stays readable and is given back after close; its arrays keep the native pool
    # (and so their memory) alive until they are gone.
    assert np.isfinite(noise).all()
    lease.release()
    del lease
    gc.collect()
    assert handle() is not None, "the native pool was freed while an array of it was alive"
    del noise
    gc.collect()
    assert handle() is None, "the native pool outlived its last array"


def test_borrow_sizes_are_checked(tokenrace):
    pool = tokenrace.NoisePool(10, 4)
    for n in (0, 5):
        with pytest.raises(ValueError, match=f"n_rows: {n}"):
            pool.borrow(n)
    with pytest.raises(ValueError, match="n_rows"):
        pool.borrow(-1)
    with pytest.raises(TypeError, match="n_rows"):
        pool.borrow(1.5)


# -- values ------------------------------------------------------------------------------------


@pytest.mark.parametrize("threads", [1, 4])
def test_seeded_pools_are_reproducible(tokenrace, threads):
    sizes = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]
    a = collect(tokenrace.NoisePool(257, 16, seed=99, threads=threads), sizes)
    b = collect(tokenrace.NoisePool(257, 16, seed=99, threads=threads, policy="block"), sizes)
    ref = collect(tokenrace.NoisePool(257, 16, seed=99, threads=1), sizes)
    for x, y, r in zip(a, b, ref):
        np.testing.assert_array_equal(x, r)
        np.testing.assert_array_equal(y, r)
    other = collect(tokenrace.NoisePool(257, 16, seed=100, threads=threads), sizes)
    assert not np.array_equal(other[0], ref[0])


def test_a_row_is_keyed_by_its_sequence_number(tokenrace):
    """Different borrow sizes that reach the same sequence numbers get the same rows."""
    def by_seq(sizes):
        pool = tokenrace.NoisePool(64, 32, seed=5)
        rows = {}
        for n in sizes:
            lease = pool.borrow(n)
            with lease as noise:
                for r in range(n):
                    rows[lease.first_seq + r] = noise[r].copy()
        return rows

    a, b = by_seq([1, 2, 3, 4, 5, 6]), by_seq([6, 5, 4, 3, 2, 1])
    common = sorted(set(a) & set(b))
    assert len(common) >= 15
    for s in common:
        np.testing.assert_array_equal(a[s], b[s])


def test_log_exp_is_the_log_of_exp(tokenrace):
    e = collect(tokenrace.NoisePool(1024, 64, seed=7, kind="exp"), [64, 20])
    ln = collect(tokenrace.NoisePool(1024, 64, seed=7, kind="log_exp"), [64, 20])
    for x, y in zip(e, ln):
        assert (x > 0).all() and np.isfinite(x).all()
        np.testing.assert_allclose(y.astype(np.float64), np.log(x.astype(np.float64)), rtol=0, atol=1e-6)


@pytest.mark.parametrize("kind", ["exp", "log_exp"])
def test_values_are_exp1_by_chi_square(tokenrace, kind):
    bins = 20
    pool = tokenrace.NoisePool(1024, 64, seed=2024, kind=kind, threads=2)
    (v,) = collect(pool, [64])
    e = v.astype(np.float64).ravel()
    if kind == "log_exp":
        e = np.exp(e)
    edges = -np.log1p(-np.arange(1, bins) / bins)  # equiprobable bins of Exp(1)
    counts = np.bincount(np.searchsorted(edges, e), minlength=bins)
    critical = wilson_hilferty(bins - 1, 5.0)
    stat = chi_square(counts, np.full(bins, 1.0 / bins))
    assert stat < critical, f"chi-square {stat:.1f} >= {critical:.1f}"
    # Power: the same counts reject an exponential of mean 1.05.
    cdf = 1 - np.exp(-np.concatenate([[0], edges, [np.inf]]) / 1.05)
    wrong = chi_square(counts, np.diff(cdf))
    assert wrong > critical, f"cannot tell Exp(1) from mean 1.05 ({wrong:.1f})"


# -- policies ----------------------------------------------------------------------------------


def test_block_times_out_when_drained(tokenrace):
    timeout = 100
    pool = tokenrace.NoisePool(16, 2, seed=8, threads=1, policy="block", timeout_ms=timeout)
    wait_produced(pool, 2)
    a, b = pool.borrow(1), pool.borrow(1)  # the whole ring is out: nothing can be refilled
    t0 = time.monotonic()
    with pytest.raises(tokenrace.TokenraceTimeoutError, match=f"{timeout} ms") as e:
        pool.borrow(1)
    waited = time.monotonic() - t0
    assert isinstance(e.value, RuntimeError)
    assert e.value.status == tokenrace._ffi.STATUS_TIMEOUT
    assert timeout / 1000 * 0.9 <= waited < 5.0
    st = pool.stats()
    assert st["borrows_waited"] >= 1 and st["wait_ns"] >= 0.9 * timeout * 1e6
    assert st["rows_skipped"] == 1 and st["rows_borrowed"] == 2  # the failed borrow's row
    a.release()
    b.release()
    with pool.borrow(2) as noise:
        assert noise.shape == (2, 16)


def test_inline_never_waits_for_a_drained_pool(tokenrace):
    pool = tokenrace.NoisePool(16, 4, seed=9, policy="inline")
    held = pool.borrow(4)
    before = pool.stats()["inline_rows"]
    with pool.borrow(3) as noise:  # generated on this thread
        assert noise.shape == (3, 16) and np.isfinite(noise).all()
    assert pool.stats()["inline_rows"] == before + 3
    held.release()


def test_concurrent_borrowers(tokenrace):
    pool = tokenrace.NoisePool(32, 64, seed=10, threads=2, policy="block", timeout_ms=10000)
    got, errors = [], []
    start = threading.Barrier(4)

    def worker(k):
        try:
            start.wait()
            for i in range(50):
                lease = pool.borrow(1 + (k + i) % 8)
                with lease as noise:
                    got.append((lease.first_seq, noise.copy()))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    spans = sorted((s, s + len(v)) for s, v in got)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), "two borrows got the same rows"
    rows = np.concatenate([v for _, v in got])
    assert len({r.tobytes() for r in rows}) == len(rows)
    # And they are exactly the rows a single thread gets for those sequence numbers.
    ref = tokenrace.NoisePool(32, 64, seed=10)
    s0, v0 = min(got, key=lambda g: g[0])
    if s0 + len(v0) <= 64:
        with ref.borrow(s0 + len(v0)) as r:
            np.testing.assert_array_equal(r[s0:], v0)


# -- settings ----------------------------------------------------------------------------------


def test_defaults_and_explicit_settings(tokenrace):
    import inspect

    p = tokenrace.NoisePool(10)
    assert p.config == {"vocab_size": 10, "rows": 1024, "kind": "log_exp", "threads": 1, "seed": None,
                        "policy": "inline", "timeout_ms": 1000}
    q = tokenrace.NoisePool(10, 3, kind="EXP", seed=2**64 - 1, threads=2, policy="block", timeout_ms=0)
    assert q.config == {"vocab_size": 10, "rows": 3, "kind": "exp", "threads": 2, "seed": 2**64 - 1,
                        "policy": "block", "timeout_ms": 0}
    assert "NoisePool" in repr(q)
    sig = str(inspect.signature(tokenrace.NoisePool))
    assert "kind='log_exp'" in sig and "policy='inline'" in sig and "threads=1" in sig


@pytest.mark.parametrize("kwargs,name", [
    ({"vocab_size": 0}, "vocab"),
    ({"vocab_size": -1}, "vocab_size"),
    ({"rows": 0}, "rows"),
    ({"rows": 2**20 + 1}, "rows"),
    ({"kind": "gumbel"}, "kind"),
    ({"policy": "wait"}, "policy"),
    ({"threads": 0}, "threads"),
    ({"threads": 65}, "threads"),
    ({"seed": -1}, "seed"),
    ({"timeout_ms": -1}, "timeout_ms"),
    ({"timeout_ms": 3_600_001}, "timeout_ms"),
])
def test_bad_settings(tokenrace, kwargs, name):
    kw = {"vocab_size": 10, **kwargs}
    with pytest.raises(ValueError, match=name):
        tokenrace.NoisePool(**kw)


POOL_ENV_CODE = """
import json, numpy as np, tokenrace
a = tokenrace.NoisePool(16)
b = tokenrace.NoisePool(16, 3, kind="log_exp", seed=6, threads=1, policy="inline", timeout_ms=1000)
c = tokenrace.NoisePool(16)
la, lc = a.borrow(2), c.borrow(2)
with la as x, lc as y:
    same = bool(np.array_equal(x, y))
    positive = bool((x > 0).all())
print(json.dumps({"a": a.config, "b": b.config, "kind": la.kind, "same": same, "positive": positive}))
"""


def test_env_fills_in_what_is_not_passed():
    env = {"TOKENRACE_POOL_KIND": "exp", "TOKENRACE_POOL_ROWS": "7", "TOKENRACE_POOL_SEED": "5",
           "TOKENRACE_POOL_THREADS": "2", "TOKENRACE_POOL_POLICY": "block",
           "TOKENRACE_POOL_TIMEOUT_MS": "250"}
    res = run_python(POOL_ENV_CODE, env=env)
    assert res["a"] == {"vocab_size": 16, "rows": 7, "kind": "exp", "threads": 2, "seed": 5,
                        "policy": "block", "timeout_ms": 250}
    assert res["kind"] == "exp" and res["positive"]
    assert res["same"], "TOKENRACE_POOL_SEED must make the pool reproducible"
    # Passed explicitly, even as the default value, a setting wins over the environment.
    assert res["b"] == {"vocab_size": 16, "rows": 3, "kind": "log_exp", "threads": 1, "seed": 6,
                        "policy": "inline", "timeout_ms": 1000}


def test_bad_pool_variable_names_it():
    res = run_python("""
import json, tokenrace
try:
    tokenrace.NoisePool(16)
    out = {}
except ValueError as e:
    out = {"error": str(e), "type": type(e).__name__}
print(json.dumps(out))
""", env={"TOKENRACE_POOL_KIND": "gumbel"})
    assert "TOKENRACE_POOL_KIND" in res["error"] and "gumbel" in res["error"]
    assert res["type"] == "InvalidConfigError"


# -- samplers with pool noise ------------------------------------------------------------------

LOGITS = np.array([1.0, -np.inf, 0.3, 2.0, -1.0, 0.5, -np.inf, 1.5, -0.5, 0.0])


def frequencies(s, x, t, calls):
    counts = np.zeros(x.shape[1], np.int64)
    for _ in range(calls):
        counts += np.bincount(s.draw(x, temperature=t), minlength=x.shape[1])
    return counts


@pytest.mark.parametrize("source", ["own", "exp", "log_exp"])
def test_pool_noise_frequencies_match_the_exact_softmax(tokenrace, source):
    rows, calls, t = 4096, 50, 0.8
    vocab = LOGITS.size
    if source == "own":
        s = tokenrace.Sampler(vocab, max_rows=rows, noise="pool")
    else:
        s = tokenrace.Sampler(vocab, max_rows=rows)
        pool = tokenrace.NoisePool(vocab, 2 * rows, kind=source, threads=2)
        s.attach_pool(pool)
    x = np.tile(LOGITS.astype(np.float32), (rows, 1))
    counts = frequencies(s, x, t, calls)
    live = ~np.isneginf(LOGITS)
    assert counts[~live].sum() == 0, "a masked (-inf) token was drawn"
    critical = wilson_hilferty(int(live.sum()) - 1, 5.0)
    stat = chi_square(counts[live], softmax64(LOGITS, t)[live])
    assert stat < critical, f"{source}: chi-square {stat:.1f} >= {critical:.1f}"
    wrong = chi_square(counts[live], softmax64(LOGITS, 1.05 * t)[live])
    assert wrong > critical, f"{source}: the test cannot tell T from 1.05 T ({wrong:.1f})"
    st = s.stats()
    assert st["pool_rows"] == rows * calls and st["inline_rows"] == 0
    if source != "own":
        assert pool.stats()["rows_borrowed"] == rows * calls


def test_greedy_and_seeded_rows_do_not_take_pool_noise(tokenrace, rng):
    rows, vocab = 24, 300
    x = (rng.standard_normal((rows, vocab)) * 2).astype(np.float32)
    temps = np.tile(np.array([0.0, 1.0, 0.7], np.float32), rows // 3)
    seeds = np.arange(rows, dtype=np.uint64) * 7919
    seeded = (np.arange(rows) % 2 == 0)
    kw = dict(temperature=temps, seeds=seeds, offsets=3, seeded=seeded)
    inline = tokenrace.Sampler(vocab, noise="inline").draw(x, **kw)
    pooled = tokenrace.Sampler(vocab, noise="pool")
    pool = tokenrace.NoisePool(vocab, 64, seed=1)
    attached = tokenrace.Sampler(vocab)
    attached.attach_pool(pool)
    sampling_unseeded = (temps >= 1e-5) & ~seeded
    for s in (pooled, attached):
        got = s.draw(x, **kw)
        np.testing.assert_array_equal(got[~sampling_unseeded], inline[~sampling_unseeded])
        assert s.stats()["pool_rows"] == sampling_unseeded.sum()
    assert pool.stats()["rows_borrowed"] == sampling_unseeded.sum()


def test_an_attached_pool_is_the_external_noise_of_the_unseeded_rows(tokenrace, rng):
    """One borrow per call of exactly the unseeded sampling rows, used in row order: a twin pool
    borrowed alike gives the same tokens as external noise."""
    vocab = 500
    for kind in ("exp", "log_exp"):
        s = tokenrace.Sampler(vocab, max_rows=64)
        s.attach_pool(tokenrace.NoisePool(vocab, 64, seed=21, kind=kind))
        twin = tokenrace.NoisePool(vocab, 64, seed=21, kind=kind)
        plain = tokenrace.Sampler(vocab, max_rows=64)
        for n in (5, 17, 1, 40, 33):
            x = (rng.standard_normal((n, vocab)) * 3).astype(np.float32)
            with twin.borrow(n) as noise:
                want = plain.draw(x, temperature=0.9, noise=noise, noise_kind=kind)
            np.testing.assert_array_equal(s.draw(x, temperature=0.9), want)


def test_sampler_pool_settings(tokenrace):
    with pytest.raises(ValueError, match="vocab_size") as e:
        tokenrace.Sampler(0, noise="pool")
    assert isinstance(e.value, tokenrace.InvalidConfigError)
    x = np.random.default_rng(1).standard_normal((30, 50)).astype(np.float32)
    a, b = tokenrace.Sampler(50, seed=3, noise="pool"), tokenrace.Sampler(50, seed=3, noise="pool")
    np.testing.assert_array_equal(a.draw(x), b.draw(x))
    assert a.config["noise"] == "pool" and a.stats()["pool_rows"] == 30

    pool = tokenrace.NoisePool(50, 4)
    with pytest.raises(ValueError, match="inline"):
        tokenrace.Sampler(50, noise="inline").attach_pool(pool)
    with pytest.raises(ValueError, match="vocab"):
        tokenrace.Sampler(51).attach_pool(pool)
    with pytest.raises(TypeError, match="NoisePool"):
        tokenrace.Sampler(50).attach_pool(object())
    s = tokenrace.Sampler(50)
    s.attach_pool(pool)
    with pytest.raises(ValueError, match="5"):
        s.draw(x[:5])  # more unseeded sampling rows than the pool holds
    assert s.draw(x[:5], temperature=[0, 1, 1, 1, 1]).shape == (5,)
    # The sampler keeps an attached pool running after the pool is closed.
    pool.close()
    assert s.draw(x[:4]).shape == (4,)
    with pytest.raises(tokenrace.ClosedError):
        tokenrace.Sampler(50).attach_pool(pool)


def test_a_fork_child_gets_closed_error():
    res = run_python("""
import json, os, tokenrace
pool = tokenrace.NoisePool(16, 4, seed=1)
with pool.borrow(1):
    pass
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    try:
        pool.borrow(1)
        msg = "no error"
    except tokenrace.ClosedError as e:
        msg = "ClosedError: " + str(e)
    except BaseException as e:
        msg = type(e).__name__ + ": " + str(e)
    os.write(w, msg.encode())
    os._exit(0)
os.close(w)
msg = os.read(r, 4096).decode()
os.waitpid(pid, 0)
with pool.borrow(2) as noise:  # the parent's pool still works
    ok = noise.shape == (2, 16)
print(json.dumps({"child": msg, "parent_ok": ok}))
""")
    assert res["child"].startswith("ClosedError") and "fork" in res["child"], res["child"]
    assert res["parent_ok"]
