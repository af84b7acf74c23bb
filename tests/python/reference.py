"""Float64 references and statistics shared by the tests (written as literally as the rules in
docs/semantics.md read)."""

import json
import math
import pathlib

import numpy as np

FIXTURES = pathlib.Path(__file__).resolve().parent.parent / "fixtures"


def fixture(name):
    """The cases the Rust float64 reference wrote to tests/fixtures/<name>.json (tests/reference.rs
    and tests/verify.rs write them and fail when they are not current): the one reference of the
    rules, which these tests check the binding against instead of porting it."""
    return json.loads((FIXTURES / f"{name}.json").read_text())


def f32_of_hex(bits):
    """The float32 values of a fixture's string of big-endian bit patterns in hex."""
    return np.frombuffer(bytes.fromhex(bits), ">f4").astype(np.float32)


def draw_cases():
    """The groups of tests/fixtures/draw_cases.json as arrays: rows of one dtype on one kind of
    external noise, with filters; ``want`` the reference's token of each row and ``kept`` its kept
    token ids (None where the reference leaves the row undecided)."""
    for g in fixture("draw_cases")["groups"]:
        vocab = g["vocab"]
        yield dict(
            dtype=g["dtype"], kind=g["kind"], x=f32_of_hex(g["logits"]).reshape(-1, vocab),
            noise=f32_of_hex(g["noise"]).reshape(-1, vocab), temperature=np.array(g["temperature"], np.float32),
            top_k=np.array(g["top_k"], np.int32), top_p=np.array(g["top_p"], np.float32),
            min_p=np.array(g["min_p"], np.float32), want=g["want"], kept=g["kept"])


def softmax64(x, t):
    z = np.where(np.isneginf(x), -np.inf, np.asarray(x, np.float64) / t)
    z = z - z.max()
    e = np.exp(z)
    return e / e.sum()


def chi_square(counts, probs):
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def wilson_hilferty(dof, z):
    """Upper critical value of chi-square(dof) at a standard-normal quantile z."""
    a = 2.0 / (9.0 * dof)
    return dof * (1.0 - a + z * math.sqrt(a)) ** 3


def inv_t(t):
    """fl32(1/T), capped at FLT_MAX, as float64."""
    with np.errstate(divide="ignore", over="ignore"):
        i = np.float32(1.0) / np.float32(t)
    return float(i) if np.isfinite(i) else float(np.finfo(np.float32).max)


def weights(x, t):
    """exp((x_i - m) * inv_t) in float64 over the finite logits (0 elsewhere)."""
    x = np.asarray(x, np.float32)
    fin = np.isfinite(x)
    m = float(x[fin].max().astype(np.float64))
    w = np.zeros(x.size)
    w[fin] = np.exp((x[fin].astype(np.float64) - m) * inv_t(t))
    return w


def kept_set(x, t, top_k=0, top_p=1.0, min_p=0.0):
    """The tokens the filters keep (min-p, then top-k, then top-p), as a boolean mask, and the
    smallest relative gap between top-p's cumulative mass and its threshold (to skip rows that
    sit on the boundary within rounding)."""
    x = np.asarray(x, np.float32)
    n = x.size
    w = weights(x, t)
    kept = np.isfinite(x)
    gap = math.inf
    if min_p > 0:
        z = w[kept].sum()
        pmax = (w[kept] / z).max()
        kept &= ~(w / z < np.float64(np.float32(min_p)) * pmax)
    if 0 < top_k < n:
        v = np.sort(x[kept])[::-1]
        if v.size > top_k:
            kept &= x >= v[top_k - 1]
    p = float(np.float32(top_p))
    if p < 1.0:
        idx = np.flatnonzero(kept)
        idx = idx[np.argsort(-x[idx], kind="stable")]
        z = w[idx].sum()
        cum = 0.0
        thr = x[idx[-1]]
        for i in idx:
            cum += w[i] / z
            gap = min(gap, abs(cum - p) / p)
            if cum >= p:
                thr = x[i]
                break
        kept &= x >= thr
    return kept, gap


def log_softmax64(x, t=1.0, kept=None):
    """log_softmax((x - m) * inv_t) in float64 over the finite logits (and ``kept``); -inf
    elsewhere."""
    x = np.asarray(x, np.float32)
    mask = np.isfinite(x) if kept is None else (kept & np.isfinite(x))
    m = float(x[np.isfinite(x)].max())
    z = np.full(x.size, -np.inf)
    z[mask] = (x[mask].astype(np.float64) - m) * inv_t(t)
    top = z[mask].max()
    return z - (top + np.log(np.exp(z[mask] - top).sum()))


def vllm_kept_probs(x, k, p):
    """float64 probabilities after vLLM's PyTorch top-k (keep logits >= the k-th largest) then
    top-p (ascending sort, drop where the cumulative mass <= 1 - p, keep the largest), for a row
    without ties."""
    x = np.asarray(x, np.float64)
    kept = x >= np.sort(x)[::-1][k - 1]
    w = np.where(kept, np.exp(x - x.max()), 0.0)
    order = np.argsort(w)
    cum = np.cumsum(w[order] / w.sum())
    drop = cum <= 1 - p
    drop[-1] = False
    w[order[drop]] = 0.0
    return w / w.sum()
