"""Sampled tokens: the distribution against the exact softmax (chi-square), the tokens of the
Rust float64 reference's cases on external noise (tests/fixtures/draw_cases.json), seeded rows,
SIMD levels."""

import numpy as np
import pytest

from conftest import supported_simd_levels
from reference import chi_square, draw_cases, softmax64, wilson_hilferty

LOGITS = np.array([1.0, -np.inf, 0.3, 2.0, -1.0, 0.5, -np.inf, 1.5, -0.5, 0.0])


@pytest.mark.parametrize("t", [0.5, 1.0, 2.0])
def test_frequencies_match_the_exact_softmax(tokenrace, t):
    rows, calls = 8192, 100
    s = tokenrace.Sampler(LOGITS.size, max_rows=rows)
    x = np.tile(LOGITS.astype(np.float32), (rows, 1))
    counts = np.zeros(LOGITS.size, np.int64)
    for _ in range(calls):
        counts += np.bincount(s.draw(x, temperature=t), minlength=LOGITS.size)
    masked = np.isneginf(LOGITS)
    assert counts[masked].sum() == 0, "a masked (-inf) token was drawn"
    live = ~masked
    dof = int(live.sum()) - 1
    critical = wilson_hilferty(dof, 5.0)
    stat = chi_square(counts[live], softmax64(LOGITS, t)[live])
    assert stat < critical, f"T={t}: chi-square {stat:.1f} >= {critical:.1f} on {dof} dof"
    # Power: the same counts must reject a 5% different temperature.
    wrong = chi_square(counts[live], softmax64(LOGITS, 1.05 * t)[live])
    assert wrong > critical, f"T={t}: the test cannot tell T from 1.05 T ({wrong:.1f})"


def test_float16_frequencies(tokenrace):
    rows, calls, t = 8192, 40, 1.0
    s = tokenrace.Sampler(LOGITS.size, max_rows=rows)
    x16 = np.tile(LOGITS.astype(np.float16), (rows, 1))
    counts = np.zeros(LOGITS.size, np.int64)
    for _ in range(calls):
        counts += np.bincount(s.draw(x16, temperature=t), minlength=LOGITS.size)
    live = ~np.isneginf(LOGITS)
    p = softmax64(x16[0].astype(np.float64), t)[live]
    assert chi_square(counts[live], p) < wilson_hilferty(int(live.sum()) - 1, 5.0)


@pytest.mark.parametrize("kind", ["exp", "log_exp"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_external_noise_matches_float64_reference(tokenrace, kind, dtype):
    """The rows of tests/fixtures/draw_cases.json (the caller's noise, filters, every logit shape)
    draw the tokens of the Rust float64 reference (tests/reference.rs); the rows it leaves
    undecided (a near tie, a filter cut within rounding) are skipped, two at most."""
    (g,) = [g for g in draw_cases() if g["kind"] == kind and g["dtype"] == dtype]
    rows, vocab = g["x"].shape
    s = tokenrace.Sampler(vocab, max_rows=rows)
    tokens = s.draw(g["x"].astype(dtype), temperature=g["temperature"], top_k=g["top_k"], top_p=g["top_p"],
                    min_p=g["min_p"], noise=g["noise"], noise_kind=kind)
    decided = [i for i, want in enumerate(g["want"]) if want is not None]
    assert len(decided) >= rows - 2
    assert tokens[decided].tolist() == [g["want"][i] for i in decided]
    assert s.stats()["external_noise_rows"] == rows


@pytest.mark.parametrize("kind", ["exp", "log_exp"])
def test_broadcast_noise(tokenrace, rng, kind):
    """One noise row for every row, however it is shaped, draws what the row repeated draws."""
    rows, vocab = 16, 257
    x = (rng.standard_normal((rows, vocab)) * 2).astype(np.float32)
    e = rng.exponential(size=vocab).astype(np.float32)
    noise = e if kind == "exp" else np.log(e).astype(np.float32)
    s = tokenrace.Sampler(vocab)
    want = s.draw(x, temperature=0.8, noise=np.tile(noise, (rows, 1)), noise_kind=kind)
    assert len(set(want.tolist())) > 1  # the rows differ: a row read for another would show
    for n in (noise, noise[None, :], np.broadcast_to(noise, (rows, vocab))):
        tokens = s.draw(x, temperature=0.8, noise=n, noise_kind=kind)
        np.testing.assert_array_equal(tokens, want)


def test_strided_noise_view(tokenrace, rng):
    """A strided view of the noise draws what a contiguous copy draws."""
    rows, vocab = 8, 100
    x = rng.standard_normal((rows, vocab)).astype(np.float32)
    big = np.full((2 * rows, vocab + 30), np.float32(1e-38))  # near-zero E: would win if misread
    e = rng.exponential(size=(rows, vocab)).astype(np.float32)
    big[::2, 7:7 + vocab] = e
    s = tokenrace.Sampler(vocab)
    np.testing.assert_array_equal(s.draw(x, noise=big[::2, 7:7 + vocab]), s.draw(x, noise=e))


def test_seeded_rows_ignore_the_rest_of_the_batch(tokenrace, rng):
    vocab = 500
    row = (rng.standard_normal(vocab) * 2).astype(np.float32)
    s1 = tokenrace.Sampler(vocab, seed=1)
    s2 = tokenrace.Sampler(vocab, seed=2)
    alone = s1.draw(row[None, :], seeds=42, offsets=7)[0]
    for n, pos, sampler in [(5, 0, s1), (9, 4, s2), (33, 32, s1), (2, 1, s2)]:
        x = (rng.standard_normal((n, vocab)) * 2).astype(np.float32)
        x[pos] = row
        seeds = rng.integers(0, 2**63, n, dtype=np.uint64)
        seeds[pos] = 42
        offsets = rng.integers(0, 1000, n).astype(np.uint64)
        offsets[pos] = 7
        seeded = rng.random(n) < 0.5
        seeded[pos] = True
        temps = rng.uniform(0, 2, n)
        temps[pos] = 1.0
        tokens = sampler.draw(x, temperature=temps, seeds=seeds, offsets=offsets, seeded=seeded)
        assert tokens[pos] == alone
    # A different offset or seed changes the stream: not every draw is the same token.
    flat = np.zeros(vocab, np.float32)
    tokens = [s1.draw(flat, seeds=42, offsets=o)[0] for o in range(40)]
    assert len(set(tokens)) > 20
    assert len({s1.draw(flat, seeds=k)[0] for k in range(40)}) > 20


def test_sampler_seed_makes_unseeded_rows_reproducible(tokenrace, rng):
    x = rng.standard_normal((20, 300)).astype(np.float32)
    a = [tokenrace.Sampler(300, seed=9).draw(x) for _ in range(2)]
    np.testing.assert_array_equal(a[0], a[1])
    b = tokenrace.Sampler(300, seed=10).draw(x)
    assert not np.array_equal(a[0], b)
    s = tokenrace.Sampler(300, seed=9)
    s.draw(x)
    assert not np.array_equal(s.draw(x), a[0]), "the unseeded stream must advance"


def test_every_simd_level_draws_the_same_tokens(tokenrace, rng):
    levels = supported_simd_levels()
    assert "scalar" in levels
    for dtype in (np.float32, np.float16):
        x = (rng.standard_normal((48, 1031)) * 3).astype(dtype)
        x[3, 17] = np.nan
        x[5, :] = -np.inf
        x[6, 100] = np.inf
        x[7, ::3] = -np.inf
        temps = np.tile(np.array([0.0, 0.3, 1.0, 2.5], np.float32), 12)
        seeds = np.arange(48, dtype=np.uint64) * 1000003
        seeded = np.arange(48) % 3 != 0
        e = rng.exponential(size=(48, 1031)).astype(np.float32)
        results = {}
        for level in levels:
            s = tokenrace.Sampler(1031, seed=77, simd=level)
            assert s.simd_level == level
            results[level] = (
                s.draw(x, temperature=temps, seeds=seeds, seeded=seeded, return_flags=True),
                s.draw(x, temperature=temps, noise=e),
                s.draw(x, temperature=temps, noise=np.log(e), noise_kind="log_exp"),
            )
        ref = results["scalar"]
        for level, got in results.items():
            np.testing.assert_array_equal(got[0][0], ref[0][0], err_msg=f"{level} seeded/inline")
            np.testing.assert_array_equal(got[0][1], ref[0][1], err_msg=f"{level} flags")
            np.testing.assert_array_equal(got[1], ref[1], err_msg=f"{level} exp noise")
            np.testing.assert_array_equal(got[2], ref[2], err_msg=f"{level} log_exp noise")
