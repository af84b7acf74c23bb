"""One sampler shared by several Python threads (ctypes releases the GIL during the call)."""

import threading

import numpy as np
import pytest


@pytest.mark.parametrize("sampler_threads", [1, 0])
def test_concurrent_draws_on_one_sampler(tokenrace, rng, sampler_threads):
    vocab, rows = 2000, 32
    s = tokenrace.Sampler(vocab, max_rows=rows, threads=sampler_threads)
    batches = [(rng.standard_normal((rows, vocab)) * 3).astype(np.float32) for _ in range(8)]
    seeds = np.arange(rows, dtype=np.uint64) + 100
    temps = np.where(np.arange(rows) % 4 == 0, 0.0, 1.0).astype(np.float32)
    expected = [s.draw(b, temperature=temps, seeds=seeds, offsets=i) for i, b in enumerate(batches)]
    errors, mismatches = [], []
    start = threading.Barrier(6)

    def worker(k):
        try:
            start.wait()
            for it in range(60):
                i = (k + it) % len(batches)
                got = s.draw(batches[i], temperature=temps, seeds=seeds, offsets=i)
                if not np.array_equal(got, expected[i]):
                    mismatches.append((k, it))
                # Unseeded rows and errors interleaved with the seeded calls.
                s.draw(batches[i][: rows // 2])
                with pytest.raises(ValueError, match=r"temperature\[1\]"):
                    s.draw(batches[i][:2], temperature=[1.0, -1.0])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert not mismatches
    st = s.stats()
    assert st["calls"] == 8 + 6 * 60 * 2 and st["rejected_calls"] == 6 * 60


def test_concurrent_unseeded_draws_are_valid(tokenrace, rng):
    s = tokenrace.Sampler(50, max_rows=64)
    x = rng.standard_normal((64, 50)).astype(np.float32)
    x[:, 25:] = -np.inf
    results = []

    def worker():
        for _ in range(100):
            results.append(s.draw(x))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    all_tokens = np.concatenate(results)
    assert all_tokens.size == 4 * 100 * 64
    assert all_tokens.max() < 25
    # 400 calls draw from the one stream: no two calls may repeat each other.
    assert len({r.tobytes() for r in results}) == len(results)
