"""Keyed-noise watermarking (docs/semantics.md, "Watermarking"): ``watermark_seeds`` gives the seed
of each watermarked position from a secret and the last ``k`` tokens before it; a draw seeded with
it (offset 0) is the row's plain keyed race, so each token's distribution is unchanged.
``detect_watermark`` scores a text for a secret and returns its p-value."""

from __future__ import annotations

from ctypes import POINTER, byref, c_double, c_int32, c_uint64
from dataclasses import dataclass

import numpy as np

from . import _ffi
from ._arrays import int32_vector
from ._errors import UnsupportedError, check

_U32_MAX = 2**32 - 1


def _function(name):
    try:
        return getattr(_ffi.lib(), name)
    except AttributeError:
        raise UnsupportedError(f"{name}: the loaded library ({_ffi.library_path()}) predates watermarking; "
                               f"use a newer build") from None


def _ptr(arr, ctype):
    """A ctypes pointer to a contiguous array's data (NULL when empty)."""
    return arr.ctypes.data_as(POINTER(ctype)) if arr.size else None


def _k(k):
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k <= _U32_MAX:
        raise ValueError(f"k: must be an integer in [0, 2**32), got {k!r}")
    return int(k)


def _secret(secret, name="secret"):
    if isinstance(secret, bool) or not isinstance(secret, (int, np.integer)) or not 0 <= secret < 2**64:
        raise ValueError(f"{name}: must be an integer in [0, 2**64), got {secret!r}")
    return int(secret)


def watermark_seeds(secrets, k, histories):
    """The seeds of watermarked positions, one per row: row r's context is the last ``k`` tokens
    of ``histories[r]`` (its prompt then its output so far; fewer when shorter), its seed that of
    (``secrets[r]`` or the one ``secrets``, context). Draw row r with ``seeds=`` these and
    ``offsets=0`` to watermark it. Returns uint64 [rows]."""
    k = _k(k)
    rows = len(histories)
    if np.ndim(secrets) == 0:
        secrets = [secrets] * rows
    secrets = np.array([_secret(s, f"secrets[{i}]") for i, s in enumerate(secrets)], np.uint64)
    if secrets.size != rows:
        raise ValueError(f"secrets: has {secrets.size} values, the call has {rows} histories")
    ids = [int32_vector(h, f"histories[{i}]") for i, h in enumerate(histories)]
    offsets = np.zeros(rows + 1, np.uint64)
    offsets[1:] = np.cumsum([i.size for i in ids])
    flat = np.ascontiguousarray(np.concatenate(ids) if ids else np.zeros(0, np.int32), dtype=np.int32)
    seeds = np.zeros(rows, np.uint64)
    fn = _function("tokenrace_watermark_seeds")
    # The whole history as the output list (no prompt list): the context is its last k tokens.
    check(fn(rows, _ptr(secrets, c_uint64), k, None, None, _ptr(flat, c_int32), _ptr(offsets, c_uint64),
             _ptr(seeds, c_uint64)))
    return seeds


def watermark_verify_seeds(secrets, k, histories, drafts):
    """The seeds of the target rows of a watermarked verification, laid out as ``Sampler.verify``
    lays them out (request after request: its draft positions, then its bonus row): row j of
    request i has the seed of the position after ``histories[i]`` followed by ``drafts[i][:j]``.
    Draw the rows with these seeds (``offsets=0``) and keep the drafts with
    ``watermark_accept``: the text is the position-by-position watermarked one. Returns uint64
    [sum(len(d)) + requests]."""
    k = _k(k)
    n = len(histories)
    if len(drafts) != n:
        raise ValueError(f"drafts: {len(drafts)} lists for {n} histories")
    if np.ndim(secrets) == 0:
        secrets = [secrets] * n
    secrets = np.array([_secret(s, f"secrets[{i}]") for i, s in enumerate(secrets)], np.uint64)
    if secrets.size != n:
        raise ValueError(f"secrets: has {secrets.size} values, the call has {n} histories")
    ids = [int32_vector(h, f"histories[{i}]") for i, h in enumerate(histories)]
    offsets = np.zeros(n + 1, np.uint64)
    offsets[1:] = np.cumsum([i.size for i in ids])
    flat = np.ascontiguousarray(np.concatenate(ids) if ids else np.zeros(0, np.int32), dtype=np.int32)
    ds = [int32_vector(d, f"drafts[{i}]") for i, d in enumerate(drafts)]
    counts = np.array([d.size for d in ds], np.int32)
    dflat = np.ascontiguousarray(np.concatenate(ds) if ds else np.zeros(0, np.int32), dtype=np.int32)
    seeds = np.zeros(int(counts.sum()) + n, np.uint64)
    fn = _function("tokenrace_watermark_verify_seeds")
    check(fn(n, _ptr(secrets, c_uint64), k, None, None, _ptr(flat, c_int32), _ptr(offsets, c_uint64),
             _ptr(counts, c_int32), _ptr(dflat, c_int32), _ptr(seeds, c_uint64)))
    return seeds


def watermark_accept(drafts, drawn):
    """The tokens a request emits from its ``drafts`` and the tokens drawn at its target rows
    (``len(drafts) + 1``) with ``watermark_verify_seeds``: the drafts while each equals its
    row's drawn token, then the first drawn token that differs (the bonus row's when all match)."""
    d, t = list(drafts), list(drawn)
    if len(t) != len(d) + 1:
        raise ValueError(f"drawn: {len(t)} tokens for {len(d)} drafts (one per draft and the bonus row)")
    j = 0
    while j < len(d) and d[j] == t[j]:
        j += 1
    return d[:j] + [t[j]]


@dataclass
class Detection:
    """What ``detect_watermark`` found: ``score`` (sum of -ln(1 - U_t) over the scored tokens),
    ``scored`` (tokens whose (context, token) pair was new in the text) and ``p_value``
    (P(Gamma(scored, 1) >= score): the chance of such a score without the watermark)."""

    score: float
    scored: int
    p_value: float


def detect_watermark(secret, k, tokens, prefix=()):
    """Scores ``tokens`` (generated after ``prefix``, the prompt) for the watermark of ``secret``
    with context window ``k``. Returns a ``Detection``."""
    secret, k = _secret(secret), _k(k)
    toks = int32_vector(tokens, "tokens")
    pre = int32_vector(prefix, "prefix")
    score, scored, p = c_double(), c_uint64(), c_double()
    fn = _function("tokenrace_watermark_detect")
    check(fn(secret, k, _ptr(pre, c_int32), pre.size, _ptr(toks, c_int32), toks.size, byref(score), byref(scored),
             byref(p)))
    return Detection(score.value, int(scored.value), p.value)
