"""llama.cpp's mirostat (v1 and v2) through the binding: a float64 reference of llama.cpp's rule
(the kept set and the mu update), frequencies against the renormalised kept set with a power
check, mu carried from draw to draw (in place through ``mirostat_mu_out``), seeded identity of
``draw`` and ``draw_full``, and bad values that write nothing."""

import numpy as np
import pytest

from reference import wilson_hilferty


def reference(x, t, mode, tau=5.0, mu=None, m=100, nats=False):
    """llama.cpp's mirostat over every finite token of row ``x`` at temperature ``t``, in float64:
    the kept mask and each kept token's surprise (bits) in the renormalised kept set."""
    mu = 2 * tau if mu is None else mu
    x64 = x.astype(np.float64)
    inv_t = np.float64(np.float32(1 / t))
    order = [i for i in np.argsort(-x64, kind="stable") if np.isfinite(x64[i])]
    w = np.exp((x64[order] - x64[order[0]]) * inv_t)
    p = w / w.sum()
    if mode == 2:
        surprise = -np.log(p) if nats else -np.log2(p)
        take = max(int((surprise <= mu).sum()), 1)
    else:
        top = min(m, len(order))
        ti = np.log(np.arange(2, top + 1) / np.arange(1, top))
        bi = np.log(w[:top - 1] / w[1:top])
        s_hat = (ti * bi).sum() / (ti * ti).sum()
        e = s_hat - 1
        k = ((e * 2.0 ** mu) / (1 - len(x) ** -e)) ** (1 / s_hat)
        take = 1 if not k >= 1 else min(int(k), len(order))
    kept = np.zeros(len(x), bool)
    kept[order[:take]] = True
    wk = np.where(kept, np.exp((x64 - x64[order[0]]) * inv_t), 0.0)
    with np.errstate(divide="ignore"):
        surprise = -np.log2(wk / wk.sum())
    return kept, surprise


def test_tokens_and_mu_follow_the_reference_and_carry_over(tokenrace, rng):
    vocab, rows = 400, 6
    s = tokenrace.Sampler(vocab, seed=3)
    mode = np.array([1, 2, 1, 2, 2, 1], np.int32)
    tau = np.float32(3.0)
    mu = np.full(rows, 2 * tau, np.float32)
    for step in range(40):
        x = (rng.standard_normal((rows, vocab)) * 2.5).astype(np.float32)
        before = mu.copy()
        tokens = s.draw(x, temperature=0.9, seeds=7, offsets=step, mirostat=mode, mirostat_tau=tau,
                        mirostat_eta=0.2, mirostat_mu=mu, mirostat_mu_out=mu)
        for r in range(rows):
            kept, surprise = reference(x[r], 0.9, mode[r], tau=3.0, mu=float(before[r]))
            assert kept[tokens[r]], (step, r)
            want = float(before[r]) - 0.2 * (surprise[tokens[r]] - 3.0)
            assert abs(mu[r] - want) <= 1e-5 * max(1.0, abs(want)), (step, r, mu[r], want)
    # draw_full draws the same tokens and returns the same mu.
    x = (rng.standard_normal((rows, vocab)) * 2.5).astype(np.float32)
    out = np.empty(rows, np.float32)
    a = s.draw(x, temperature=0.9, seeds=9, mirostat=mode, mirostat_mu=mu, mirostat_mu_out=out)
    r = s.draw_full(x, temperature=0.9, seeds=9, mirostat=mode, mirostat_mu=mu)
    np.testing.assert_array_equal(a, r.tokens)
    np.testing.assert_array_equal(out, r.mirostat_mu)


def test_v2_frequencies_match_and_nats_are_rejected(tokenrace, rng):
    x = (rng.standard_normal(40) * 2).astype(np.float32)
    rows = 4000
    right, _ = reference(x, 0.9, 2, mu=4.0)
    wrong, _ = reference(x, 0.9, 2, mu=4.0, nats=True)
    assert (right != wrong).any() and right.sum() >= 3
    s = tokenrace.Sampler(40, max_rows=rows, seed=5)
    counts = np.zeros(40)
    for _ in range(20):
        np.add.at(counts, s.draw(np.tile(x, (rows, 1)), temperature=0.9, mirostat=2, mirostat_mu=4.0), 1)

    def chi2(kept):
        inv_t = np.float64(np.float32(1 / 0.9))
        w = np.where(kept, np.exp((x.astype(np.float64) - float(x.max())) * inv_t), 0)
        p = w / w.sum()
        if (counts[p == 0] > 0).any():
            return np.inf, 1
        e = p[p > 0] * counts.sum()
        return (((counts[p > 0] - e) ** 2) / e).sum(), int((p > 0).sum()) - 1

    stat, dof = chi2(right)
    assert stat < wilson_hilferty(dof, 5.0), (stat, dof)
    stat, dof = chi2(wrong)
    assert stat > wilson_hilferty(dof, 5.0), "v2 in nats not rejected"


def test_defaults_rows_without_mirostat_and_bad_values(tokenrace, rng):
    x = (rng.standard_normal((3, 50)) * 2).astype(np.float32)
    s = tokenrace.Sampler(50, seed=1)
    plain = s.draw(x, temperature=1.0, seeds=4)
    r = s.draw_full(x, temperature=1.0, seeds=4, mirostat=[0, 2, 0])
    assert r.tokens[0] == plain[0] and r.tokens[2] == plain[2]
    assert np.isnan(r.mirostat_mu[[0, 2]]).all() and np.isfinite(r.mirostat_mu[1])
    # A greedy row keeps its maximum (surprise 0): mu = 2 tau + eta tau with the defaults.
    r = s.draw_full(x, temperature=0, mirostat=1)
    np.testing.assert_allclose(r.mirostat_mu, 10.0 + 0.1 * 5.0, rtol=1e-6)
    out = np.full(3, 7.0, np.float32)
    for kwargs, needle in ((dict(mirostat=3), "mirostat[0]"), (dict(mirostat=1, mirostat_tau=np.nan), "mirostat_tau[0]"),
                           (dict(mirostat=2, mirostat_m=[1, 0, 1]), "mirostat_m[1]"),
                           (dict(mirostat=2, mirostat_mu=[0, 0, np.inf]), "mirostat_mu[2]")):
        with pytest.raises(tokenrace.InvalidArgumentError, match=needle.replace("[", r"\[")):
            s.draw(x, temperature=1.0, mirostat_mu_out=out, **kwargs)
        assert (out == 7.0).all(), "a failed call wrote"
    with pytest.raises(TypeError, match="mirostat_mu_out"):
        s.draw(x, mirostat=1, mirostat_mu_out=np.zeros(3))
    with pytest.raises(tokenrace.InvalidArgumentError, match="mirostat"):
        s.score(x, [0, 1, 2], mirostat=1)
