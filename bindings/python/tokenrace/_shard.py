"""Vocabulary-sharded sampling (docs/semantics.md, "Sharded rows"), numpy path.

Each tensor-parallel rank holds the logits of one slice of the vocabulary. A call is two rounds;
the library moves no bytes, the caller gathers each round's partials from every rank:

    >>> p1 = shard.top(sampler, logits_slice, vocab_start, vocab_size, temperature=t)
    >>> rows = shard.combine_top([p1 of every rank])          # any rank order
    >>> p2 = shard.race(sampler, logits_slice, vocab_start, vocab_size, rows, temperature=t)
    >>> tokens, flags = shard.finish(rows, [p2 of every rank])

The tokens and flags are those of ``sampler.draw`` over the whole rows, bit for bit. A partial
is a numpy structured array (``PARTIAL_DTYPE``, 40 bytes a row); ``bytes(p)`` / ``p.tobytes()``
and back with ``from_bytes`` for a transport of bytes. Every rank passes the same per-row
settings, and its sampler (made with the same seed, without a pool) makes the same calls.
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, byref, c_float, c_uint8, c_uint64

import numpy as np

from . import _ffi
from ._errors import check

PARTIAL_DTYPE = np.dtype([
    ("value", "<f4"), ("token", "<i4"), ("flags", "<u4"), ("round", "<u4"), ("fingerprint", "<u4"),
    ("vocab_start", "<u4"), ("slice_len", "<u4"), ("vocab_size", "<u4"), ("key", "<u8"),
])
ROW_DTYPE = np.dtype([("top", "<f4"), ("token", "<i4"), ("flags", "<u4"), ("fingerprint", "<u4"), ("key", "<u8")])
assert PARTIAL_DTYPE.itemsize == ctypes.sizeof(_ffi.tokenrace_shard_partial)
assert ROW_DTYPE.itemsize == ctypes.sizeof(_ffi.tokenrace_shard_row)
tokenrace_shard_rows = _ffi.tokenrace_shard_rows


def _fn(name):
    try:
        return getattr(_ffi.lib(), name)
    except AttributeError:
        raise RuntimeError(f"{name}: the loaded library {_ffi.library_path()} predates sharded sampling") from None


def _recs(arr, record):
    """A records array (or None) as a pointer to the C record type."""
    return None if arr is None else arr.ctypes.data_as(POINTER(record))


def _ptr(arr, ctype):
    return None if arr is None else arr.ctypes.data_as(POINTER(ctype))


def _per_row(name, values, rows, dtype):
    """``values`` (a scalar or one per row) as a contiguous array of ``rows``, or None."""
    if values is None:
        return None
    a = np.asarray(values, dtype=dtype)
    if a.ndim > 1 or (a.ndim == 1 and len(a) != rows):
        raise ValueError(f"{name}: {a.shape} values for {rows} rows")
    return np.ascontiguousarray(np.broadcast_to(a, (rows,)))


def _rows(logits, vocab_start, vocab_size, temperature, seeds, offsets, seeded, min_p):
    x = np.asarray(logits)
    if x.dtype != np.float32:
        raise TypeError(f"logits: sharded rows are float32, got {x.dtype}")
    if x.ndim == 1:
        x = x[None, :]
    if x.ndim != 2:
        raise ValueError(f"logits: must be 1-D or 2-D (rows, slice), got shape {x.shape}")
    if x.strides[1] != 4 or x.strides[0] % 4:
        x = np.ascontiguousarray(x)
    rows, n = x.shape
    keep = {
        "x": x,
        "t": _per_row("temperature", temperature, rows, np.float32),
        "s": _per_row("seeds", seeds, rows, np.uint64),
        "o": _per_row("offsets", offsets, rows, np.uint64),
        "m": _per_row("seeded", seeded, rows, np.uint8),
        "p": _per_row("min_p", min_p, rows, np.float32),
    }
    c = tokenrace_shard_rows()
    c.logits = _ptr(x, c_float)
    c.rows, c.slice_len = rows, n
    c.row_stride = x.strides[0] // 4 if rows > 1 else n
    c.vocab_start, c.vocab_size = int(vocab_start), int(vocab_size)
    c.temperature, c.seeds, c.offsets = _ptr(keep["t"], c_float), _ptr(keep["s"], c_uint64), _ptr(keep["o"], c_uint64)
    c.seeded, c.min_p = _ptr(keep["m"], c_uint8), _ptr(keep["p"], c_float)
    return c, keep


def _handle(sampler):
    """The sampler's live handle (the caller keeps it for the call, so a concurrent close()
    frees nothing under it)."""
    return sampler._live_handle()


def from_bytes(data, dtype=PARTIAL_DTYPE):
    """Partials (or, with ``dtype=ROW_DTYPE``, combined rows) from the bytes of ``tobytes()``."""
    if isinstance(data, np.ndarray) and data.dtype == dtype:
        return data
    return np.frombuffer(bytes(data) if not isinstance(data, (bytes, bytearray, memoryview)) else data, dtype=dtype)


def top(sampler, logits, vocab_start, vocab_size, *, temperature=None, seeds=None, offsets=None, seeded=None,
        min_p=None):
    """Round 1 on this rank: one partial per row of ``logits`` (rows x slice, float32: tokens
    ``[vocab_start, vocab_start + slice)`` of rows of ``vocab_size``). Unseeded sampling rows take
    their keys from ``sampler``'s stream here, as ``sampler.draw`` of the same rows would."""
    c, keep = _rows(logits, vocab_start, vocab_size, temperature, seeds, offsets, seeded, min_p)
    out = np.zeros(c.rows, PARTIAL_DTYPE)
    h = _handle(sampler)
    check(_fn("tokenrace_shard_top")(h.ptr, byref(c), _recs(out, _ffi.tokenrace_shard_partial)))
    del keep
    return out


def combine_top(partials):
    """The round-1 partials of every rank (a list, any order; arrays or bytes) combined: one
    ``ROW_DTYPE`` record per row (the row's maximum, first-max token, flags, key)."""
    parts = [from_bytes(p) for p in partials]
    rows = len(parts[0]) if parts else 0
    if any(len(p) != rows for p in parts):
        raise ValueError(f"partials: the ranks sent {[len(p) for p in parts]} rows")
    stacked = np.ascontiguousarray(np.concatenate(parts)) if parts else np.zeros(0, PARTIAL_DTYPE)
    out = np.zeros(rows, ROW_DTYPE)
    check(_fn("tokenrace_shard_combine_top")(_recs(stacked, _ffi.tokenrace_shard_partial), len(parts), rows,
                                             _recs(out, _ffi.tokenrace_shard_row)))
    return out


def race(sampler, logits, vocab_start, vocab_size, rows, *, temperature=None, seeds=None, offsets=None, seeded=None,
         min_p=None):
    """Round 2 on this rank: the race of its slice with the combined rows ``rows`` (from
    ``combine_top``); the same rows and settings as in round 1."""
    c, keep = _rows(logits, vocab_start, vocab_size, temperature, seeds, offsets, seeded, min_p)
    combined = np.ascontiguousarray(from_bytes(rows, ROW_DTYPE))
    if len(combined) != c.rows:
        raise ValueError(f"rows: {len(combined)} combined rows for {c.rows} rows of logits")
    out = np.zeros(c.rows, PARTIAL_DTYPE)
    h = _handle(sampler)
    check(_fn("tokenrace_shard_race")(h.ptr, byref(c), _recs(combined, _ffi.tokenrace_shard_row),
                                      _recs(out, _ffi.tokenrace_shard_partial)))
    del keep
    return out


def races(rows):
    """Whether any row needs round 2 (a sampling row with a finite maximum); when none does,
    ``finish(rows, [])`` needs no second exchange (``race`` still runs on every rank for nothing)."""
    r = from_bytes(rows, ROW_DTYPE)
    return bool(np.any(((r["flags"] & _ffi.FLAG_GREEDY) == 0) & np.isfinite(r["top"])))


def finish(rows, partials):
    """The tokens (int32) and flags (uint32) of every row from the combined rows and the
    round-2 partials of every rank (any order; ``[]`` when no row races)."""
    combined = np.ascontiguousarray(from_bytes(rows, ROW_DTYPE))
    n = len(combined)
    parts = [from_bytes(p) for p in partials]
    if any(len(p) != n for p in parts):
        raise ValueError(f"partials: the ranks sent {[len(p) for p in parts]} rows for {n}")
    stacked = np.ascontiguousarray(np.concatenate(parts)) if parts else None
    tokens, flags = np.zeros(n, np.int32), np.zeros(n, np.uint32)
    check(_fn("tokenrace_shard_finish")(
        _recs(combined, _ffi.tokenrace_shard_row), n, _recs(stacked, _ffi.tokenrace_shard_partial), len(parts),
        tokens.ctypes.data_as(POINTER(ctypes.c_int32)), flags.ctypes.data_as(POINTER(ctypes.c_uint32))))
    return tokens, flags
