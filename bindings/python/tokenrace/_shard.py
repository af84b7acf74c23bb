"""Vocabulary-sharded sampling (docs/semantics.md, "Sharded rows"), numpy path.

Each tensor-parallel rank holds the logits of one slice of the vocabulary. A call is two rounds;
the library moves no bytes, the caller gathers each round's partials from every rank:

    >>> p1 = shard.top(sampler, logits_slice, vocab_start, vocab_size, temperature=t)
    >>> rows = shard.combine_top([p1 of every rank])          # any rank order
    >>> p2 = shard.race(sampler, logits_slice, vocab_start, vocab_size, rows, temperature=t)
    >>> tokens, flags = shard.finish(rows, [p2 of every rank])

Rows with top-k or top-p (``top_k=``, ``top_p=``) race with the floor of their cut: round 1 also
sends ``candidates`` (top-k), then ``cut_start``, rounds of ``cut_round`` / ``cut_advance`` while
``cut_pending``, and ``race(..., cuts=)``. ``draw`` runs every round given an all-gather of bytes.

The sampling step (``prompt_tokens``, ``output_tokens``, the penalties and ``penalty_last_n``,
``logit_bias``, ``allowed_tokens``, ``banned_tokens``, ``token_bitmask``, ``min_tokens`` with
``stop_token_ids``, ``bad_words``, DRY's ``dry_*`` arguments: ``Sampler.draw``'s names and forms)
is given with the settings, for the WHOLE rows (global token ids, the bitmask of ``vocab_size``
bits a row) and the same on every rank; each rank applies what falls in its slice. ``step_block``
converts them once for the calls of one draw (``draw`` does).

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
from ._call import address, struct_layout
from ._errors import InvalidArgumentError, check
from ._step import FIELD_ARGUMENTS, bad_words_csr, dry_fields, step_fields

PARTIAL_DTYPE = np.dtype([
    ("value", "<f4"), ("token", "<i4"), ("flags", "<u4"), ("round", "<u4"), ("fingerprint", "<u4"),
    ("vocab_start", "<u4"), ("slice_len", "<u4"), ("vocab_size", "<u4"), ("key", "<u8"),
])
ROW_DTYPE = np.dtype([("top", "<f4"), ("token", "<i4"), ("flags", "<u4"), ("fingerprint", "<u4"), ("key", "<u8")])
CUT_DTYPE = np.dtype([
    ("floor", "<f4"), ("lo", "<f4"), ("hi", "<f4"), ("top_p", "<f4"), ("m", "<f4"), ("inv_t", "<f4"),
    ("phase", "<u4"), ("step", "<u4"), ("fingerprint", "<u4"), ("row", "<u4"), ("above", "<f8"), ("z", "<f8"),
])
MASS_DTYPE = np.dtype([("head", PARTIAL_DTYPE), ("mass", "<f8", 64), ("count", "<u4", 64), ("low", "<f4", 64),
                       ("high", "<f4", 64)])
LOGPROB_DTYPE = np.dtype([("head", PARTIAL_DTYPE), ("z", "<f8"), ("s", "<f4"), ("floor", "<f4"), ("posinf", "<u4"),
                          ("reserved", "<u4")])
TOP_DTYPE = np.dtype([("value", "<f4"), ("token", "<i4")])
LOGPROB_MODES = {"raw": 0, "processed": 1}
assert LOGPROB_DTYPE.itemsize == ctypes.sizeof(_ffi.tokenrace_shard_logprob_partial)
assert TOP_DTYPE.itemsize == ctypes.sizeof(_ffi.tokenrace_shard_top_entry)
assert CUT_DTYPE.itemsize == ctypes.sizeof(_ffi.tokenrace_shard_cut)
assert MASS_DTYPE.itemsize == ctypes.sizeof(_ffi.tokenrace_shard_mass)
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


# The step block of ``tokenrace_shard_rows``: ``_step.step_fields``' 21 values (the batch's step
# fields, in the same order), the bad words' three arrays, then ``_step.dry_fields``' 7 values.
SHARD_STEP_LAYOUT = struct_layout(tokenrace_shard_rows, _ffi.SHARD_STEP_FIRST)
SHARD_STEP_OFFSET = getattr(tokenrace_shard_rows, _ffi.SHARD_STEP_FIRST).offset

# The step's keyword arguments (``Sampler.draw``'s names), in the order ``step_block`` takes them.
STEP_ARGUMENTS = ("prompt_tokens", "output_tokens", "repetition_penalty", "frequency_penalty", "presence_penalty",
                  "logit_bias", "allowed_tokens", "banned_tokens", "token_bitmask", "penalty_last_n", "min_tokens",
                  "stop_token_ids", "bad_words", "dry_multiplier", "dry_base", "dry_allowed_length",
                  "dry_penalty_last_n", "dry_sequence_breakers")
_SETTINGS = ("temperature", "seeds", "offsets", "seeded", "min_p", "top_k", "top_p")


class StepBlock:
    """The step's inputs of a sharded call converted once (``step_block``): the values of the
    rows' step block and the arrays they point into."""

    __slots__ = ("rows", "vocab_size", "values", "keep")

    def __init__(self, rows, vocab_size, values, keep):
        self.rows, self.vocab_size, self.values, self.keep = rows, vocab_size, values, keep


def step_block(rows, vocab_size, **step):
    """The sampling step of ``rows`` whole rows of ``vocab_size`` tokens (``STEP_ARGUMENTS``, the
    forms of ``Sampler.draw``), converted for every call of a sharded draw: pass it as ``step=``.
    None when no argument is given (no step)."""
    unknown = set(step) - set(STEP_ARGUMENTS)
    if unknown:
        raise TypeError(f"unknown step arguments: {sorted(unknown)}")
    if all(v is None for v in step.values()):
        return None
    a = {name: step.get(name) for name in STEP_ARGUMENTS}
    keep = []
    values = step_fields(rows, vocab_size, keep, a["prompt_tokens"], a["output_tokens"], a["repetition_penalty"],
                         a["frequency_penalty"], a["presence_penalty"], a["logit_bias"], a["allowed_tokens"],
                         a["banned_tokens"], a["token_bitmask"], None, a["penalty_last_n"], a["min_tokens"],
                         a["stop_token_ids"])
    words = (0, 0, 0)
    if a["bad_words"] is not None:
        arrays = bad_words_csr(a["bad_words"], rows)
        keep.extend(arrays)
        words = tuple(address(arr) for arr in arrays)
    dry = dry_fields(rows, keep, a["dry_multiplier"], a["dry_base"], a["dry_allowed_length"],
                     a["dry_penalty_last_n"], a["dry_sequence_breakers"])
    return StepBlock(rows, vocab_size, (*values, *words, *dry), keep)


def _split(settings, rows, vocab_size):
    """The per-row settings (``_SETTINGS`` order) and the step (a ``StepBlock`` or None) of a
    call's keyword arguments: ``step=`` a prepared block, or the step's own arguments."""
    unknown = set(settings) - set(_SETTINGS) - set(STEP_ARGUMENTS) - {"step"}
    if unknown:
        raise TypeError(f"unknown settings: {sorted(unknown)}")
    step = settings.get("step")
    given = {name: settings[name] for name in STEP_ARGUMENTS if name in settings}
    if step is not None:
        if any(v is not None for v in given.values()):
            raise TypeError(f"step: given with the step's own arguments {sorted(given)}: pass one or the other")
        if not isinstance(step, StepBlock):
            raise TypeError(f"step: must be a StepBlock (shard.step_block), got {type(step).__name__}")
        if (step.rows, step.vocab_size) != (rows, int(vocab_size)):
            raise ValueError(f"step: made for {step.rows} rows of {step.vocab_size}, the call has {rows} rows of "
                             f"{vocab_size}")
    else:
        step = step_block(rows, vocab_size, **given)
    return [settings.get(n) for n in _SETTINGS], step


def _check(status):
    """``check``, naming the ``Sampler.draw`` argument a refused step field comes from."""
    try:
        check(status)
    except InvalidArgumentError as e:
        message = str(e)
        for field, argument in FIELD_ARGUMENTS.items():
            if (f"rows.{field}[" in message or f"rows.{field}:" in message) and argument != field:
                raise InvalidArgumentError(f"{message} (argument {argument})") from None
        raise


def _rows(logits, vocab_start, vocab_size, temperature, seeds, offsets, seeded, min_p, top_k=None, top_p=None,
          step=None):
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
        "k": _per_row("top_k", top_k, rows, np.int32),
        "tp": _per_row("top_p", top_p, rows, np.float32),
    }
    c = tokenrace_shard_rows()
    c.logits = _ptr(x, c_float)
    c.rows, c.slice_len = rows, n
    c.row_stride = x.strides[0] // 4 if rows > 1 else n
    c.vocab_start, c.vocab_size = int(vocab_start), int(vocab_size)
    c.temperature, c.seeds, c.offsets = _ptr(keep["t"], c_float), _ptr(keep["s"], c_uint64), _ptr(keep["o"], c_uint64)
    c.seeded, c.min_p = _ptr(keep["m"], c_uint8), _ptr(keep["p"], c_float)
    c.top_k, c.top_p = _ptr(keep["k"], ctypes.c_int32), _ptr(keep["tp"], c_float)
    if step is not None:
        SHARD_STEP_LAYOUT.pack_into(c, SHARD_STEP_OFFSET, *step.values)
        keep["step"] = step
    return c, keep


def _rows_of(logits, vocab_start, vocab_size, settings):
    """``_rows`` of a call's keyword arguments (the settings and the step)."""
    x = np.asarray(logits)
    rows = 1 if x.ndim == 1 else (x.shape[0] if x.ndim else 0)
    values, step = _split(settings, rows, vocab_size)
    return _rows(logits, vocab_start, vocab_size, *values, step=step)


def _handle(sampler):
    """The sampler's live handle (the caller keeps it for the call, so a concurrent close()
    frees nothing under it)."""
    return sampler._live_handle()


def from_bytes(data, dtype=PARTIAL_DTYPE):
    """Partials (or, with ``dtype=ROW_DTYPE``, combined rows) from the bytes of ``tobytes()``."""
    if isinstance(data, np.ndarray) and data.dtype == dtype:
        return data
    return np.frombuffer(bytes(data) if not isinstance(data, (bytes, bytearray, memoryview)) else data, dtype=dtype)


def top(sampler, logits, vocab_start, vocab_size, **settings):
    """Round 1 on this rank: one partial per row of ``logits`` (rows x slice, float32: tokens
    ``[vocab_start, vocab_start + slice)`` of rows of ``vocab_size``). Unseeded sampling rows take
    their keys from ``sampler``'s stream here, as ``sampler.draw`` of the same rows would.
    ``settings``: ``temperature``, ``seeds``, ``offsets``, ``seeded``, ``min_p``, ``top_k``,
    ``top_p`` (scalars or one per row) and the step (its arguments, or ``step=step_block(...)``)."""
    c, keep = _rows_of(logits, vocab_start, vocab_size, settings)
    out = np.zeros(c.rows, PARTIAL_DTYPE)
    h = _handle(sampler)
    _check(_fn("tokenrace_shard_top")(h.ptr, byref(c), _recs(out, _ffi.tokenrace_shard_partial)))
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


def race(sampler, logits, vocab_start, vocab_size, rows, *, cuts=None, **settings):
    """Round 2 on this rank: the race of its slice with the combined rows ``rows`` (from
    ``combine_top``) and, for rows with top-k or top-p, the floors of their finished ``cuts``;
    the same rows and settings (and step) as in round 1."""
    c, keep = _rows_of(logits, vocab_start, vocab_size, settings)
    combined = _combined(rows, c.rows)
    out = np.zeros(c.rows, PARTIAL_DTYPE)
    h = _handle(sampler)
    if cuts is None:
        _check(_fn("tokenrace_shard_race")(h.ptr, byref(c), _recs(combined, _ffi.tokenrace_shard_row),
                                          _recs(out, _ffi.tokenrace_shard_partial)))
    else:
        cu = _cuts(cuts, c.rows)
        _check(_fn("tokenrace_shard_race_cut")(h.ptr, byref(c), _recs(combined, _ffi.tokenrace_shard_row),
                                              _recs(cu, _ffi.tokenrace_shard_cut),
                                              _recs(out, _ffi.tokenrace_shard_partial)))
    del keep
    return out


def _combined(rows, n):
    combined = np.ascontiguousarray(from_bytes(rows, ROW_DTYPE))
    if len(combined) != n:
        raise ValueError(f"rows: {len(combined)} combined rows for {n} rows of logits")
    return combined


def _cuts(cuts, n):
    cu = np.array(from_bytes(cuts, CUT_DTYPE))  # a writable copy
    if len(cu) != n:
        raise ValueError(f"cuts: {len(cu)} cuts for {n} rows")
    return cu


def candidates(logits, vocab_start, vocab_size, width, **settings):
    """The top-k candidates of this rank (sent with round 1 when a row has top-k): per row the
    slice's ``width`` largest finite values, descending, -inf padded (float32 [rows, width]);
    ``width`` is at least every row's top-k and the same on every rank."""
    c, keep = _rows_of(logits, vocab_start, vocab_size, settings)
    out = np.zeros((c.rows, int(width)), np.float32)
    _check(_fn("tokenrace_shard_top_k_candidates")(byref(c), int(width), _ptr(out, c_float)))
    del keep
    return out


def cut_start(sampler, logits, vocab_start, vocab_size, rows, gathered_candidates=(), **settings):
    """The first state of every row's floor (``CUT_DTYPE``, the same on every rank) from the
    combined rows and every rank's ``candidates`` (a list, any order; empty when no row has
    top-k)."""
    c, keep = _rows_of(logits, vocab_start, vocab_size, settings)
    combined = _combined(rows, c.rows)
    cands = [np.asarray(from_bytes(g, np.float32)).reshape(-1) for g in gathered_candidates]
    width = (len(cands[0]) // c.rows if c.rows else 0) if cands else 0
    if any(len(g) != width * c.rows for g in cands):
        raise ValueError(f"candidates: the ranks sent {[len(g) for g in cands]} values for {c.rows} rows")
    stacked = np.ascontiguousarray(np.concatenate(cands)) if cands else None
    out = np.zeros(c.rows, CUT_DTYPE)
    h = _handle(sampler)
    _check(_fn("tokenrace_shard_cut_start")(h.ptr, byref(c), _recs(combined, _ffi.tokenrace_shard_row),
                                           _ptr(stacked, c_float), len(cands), width,
                                           _recs(out, _ffi.tokenrace_shard_cut)))
    del keep
    return out


def cut_pending(cuts):
    """Whether any row's cut needs another round (the same answer on every rank)."""
    return bool(np.any(from_bytes(cuts, CUT_DTYPE)["phase"] != 0))


def cut_round(sampler, logits, vocab_start, vocab_size, cuts, **settings):
    """One round of the cut on this rank: a ``MASS_DTYPE`` record per row (1320 bytes)."""
    c, keep = _rows_of(logits, vocab_start, vocab_size, settings)
    cu = _cuts(cuts, c.rows)
    out = np.zeros(c.rows, MASS_DTYPE)
    h = _handle(sampler)
    _check(_fn("tokenrace_shard_cut_round")(h.ptr, byref(c), _recs(cu, _ffi.tokenrace_shard_cut),
                                           _recs(out, _ffi.tokenrace_shard_mass)))
    del keep
    return out


def cut_advance(cuts, masses):
    """The cuts after a round, from the ``cut_round`` records of every rank (any order)."""
    parts = [from_bytes(m, MASS_DTYPE) for m in masses]
    cu = _cuts(cuts, len(from_bytes(cuts, CUT_DTYPE)))
    if any(len(p) != len(cu) for p in parts):
        raise ValueError(f"masses: the ranks sent {[len(p) for p in parts]} rows for {len(cu)}")
    stacked = np.ascontiguousarray(np.concatenate(parts)) if parts else None
    check(_fn("tokenrace_shard_cut_advance")(_recs(cu, _ffi.tokenrace_shard_cut), len(cu),
                                             _recs(stacked, _ffi.tokenrace_shard_mass), len(parts)))
    return cu


def _mode(mode):
    if mode not in LOGPROB_MODES:
        raise ValueError(f"logprobs: {mode!r} is not one of {sorted(LOGPROB_MODES)}")
    return LOGPROB_MODES[mode]


def logprob_partials(sampler, logits, vocab_start, vocab_size, rows, cuts, own_races, mode, top_n=0, **settings):
    """This rank's logprob partials (``LOGPROB_DTYPE``, one per row) and its ``top_n`` best tokens
    per row (``TOP_DTYPE`` [rows, top_n]) for the logprobs of ``mode`` ("raw" or "processed"),
    from the combined rows, the finished cuts and this rank's own ``race`` partials (None when no
    row races). Sent with the race partials."""
    c, keep = _rows_of(logits, vocab_start, vocab_size, settings)
    combined = _combined(rows, c.rows)
    cu = _cuts(cuts, c.rows)
    mine = None if own_races is None else np.ascontiguousarray(from_bytes(own_races))
    out = np.zeros(c.rows, LOGPROB_DTYPE)
    top = np.zeros((c.rows, int(top_n)), TOP_DTYPE)
    h = _handle(sampler)
    _check(_fn("tokenrace_shard_logprob_partials")(
        h.ptr, byref(c), _recs(combined, _ffi.tokenrace_shard_row), _recs(cu, _ffi.tokenrace_shard_cut),
        _recs(mine, _ffi.tokenrace_shard_partial), _mode(mode), int(top_n),
        _recs(out, _ffi.tokenrace_shard_logprob_partial), _recs(top, _ffi.tokenrace_shard_top_entry)))
    del keep
    return out, top


def logprobs(rows, tokens, partials, tops, mode, top_n=0):
    """The sampled tokens' logprobs (float32 [rows]) and the top-n ids (int32) and logprobs
    (float32) [rows, top_n] from every rank's ``logprob_partials`` (lists, any order, the same
    order in both): within 1e-5 of ``Sampler.draw_full``'s (docs/semantics.md)."""
    combined = np.ascontiguousarray(from_bytes(rows, ROW_DTYPE))
    n = len(combined)
    tok = np.ascontiguousarray(np.asarray(tokens, np.int32))
    parts = [from_bytes(p, LOGPROB_DTYPE) for p in partials]
    tp = [from_bytes(t, TOP_DTYPE).reshape(-1) for t in tops]
    if len(parts) != len(tp) or any(len(p) != n for p in parts) or any(len(t) != n * top_n for t in tp):
        raise ValueError("partials, tops: one of each per rank, for every row")
    sp = np.ascontiguousarray(np.concatenate(parts)) if parts else None
    st = np.ascontiguousarray(np.concatenate(tp)) if tp else None
    lps = np.zeros(n, np.float32)
    ids, tl = np.zeros((n, top_n), np.int32), np.zeros((n, top_n), np.float32)
    check(_fn("tokenrace_shard_logprobs")(
        _recs(combined, _ffi.tokenrace_shard_row), n, tok.ctypes.data_as(POINTER(ctypes.c_int32)),
        _recs(sp, _ffi.tokenrace_shard_logprob_partial), _recs(st, _ffi.tokenrace_shard_top_entry), len(parts),
        _mode(mode), int(top_n), _ptr(lps, c_float), ids.ctypes.data_as(POINTER(ctypes.c_int32)), _ptr(tl, c_float)))
    return lps, ids, tl


class ShardDraw(tuple):
    """What ``draw`` returns: tokens, flags and, when asked for, logprobs, topn_ids,
    topn_logprobs (else None)."""

    __slots__ = ()

    def __new__(cls, tokens, flags, logprobs=None, topn_ids=None, topn_logprobs=None):
        return tuple.__new__(cls, (tokens, flags, logprobs, topn_ids, topn_logprobs))

    tokens = property(lambda self: self[0])
    flags = property(lambda self: self[1])
    logprobs = property(lambda self: self[2])
    topn_ids = property(lambda self: self[3])
    topn_logprobs = property(lambda self: self[4])


def draw(sampler, logits, vocab_start, vocab_size, all_gather, *, logprob_mode=None, top_n=0, stats=None,
         **settings):
    """Every round of a sharded call on this rank: ``all_gather(data: bytes) -> [bytes of every
    rank]`` (the same length on every rank, called the same number of times on every rank)
    moves the bytes. Returns a ``ShardDraw``: the tokens and flags of ``finish`` and, with
    ``logprob_mode`` ("raw" or "processed"), the sampled tokens' logprobs and the ``top_n``
    (their partials travel with the race's: no extra round). ``stats``, a dict, receives the
    rounds and the bytes this rank sent per round. ``settings``: as ``top``'s, the step included
    (it adds no round and no byte: each rank applies it to its slice)."""
    sent = []

    def gather(data):
        sent.append(len(data))
        return all_gather(data)

    x = np.asarray(logits)
    rows = 1 if x.ndim == 1 else x.shape[0]
    # The step converted once for every call below.
    values, step = _split(settings, rows, vocab_size)
    settings = dict(zip(_SETTINGS, values), step=step)
    top_k = settings.get("top_k")
    k = np.zeros(rows, np.int64) if top_k is None else np.broadcast_to(np.asarray(top_k, np.int64), (rows,))
    k = k[(k > 0) & (k < vocab_size)]
    width = int(k.max()) if len(k) else 0
    mine = top(sampler, x, vocab_start, vocab_size, **settings).tobytes()
    if width:
        mine += candidates(x, vocab_start, vocab_size, width, **settings).tobytes()
    gathered = gather(mine)
    head = rows * PARTIAL_DTYPE.itemsize
    combined = combine_top([g[:head] for g in gathered])
    cands = [g[head:] for g in gathered] if width else []
    filtered = settings.get("top_p") is not None or width or logprob_mode is not None
    racing = races(combined)  # the same answer on every rank: every rank skips or none does
    partials, won, cuts = [], None, None
    if filtered and (racing or logprob_mode is not None):
        cuts = cut_start(sampler, x, vocab_start, vocab_size, combined, cands, **settings)
        while cut_pending(cuts):
            m = cut_round(sampler, x, vocab_start, vocab_size, cuts, **settings)
            cuts = cut_advance(cuts, gather(m.tobytes()))
    if racing:
        won = race(sampler, x, vocab_start, vocab_size, combined, cuts=cuts, **settings)
    if racing or logprob_mode is not None:
        mine = b"" if won is None else won.tobytes()
        if logprob_mode is not None:
            lp, tp = logprob_partials(sampler, x, vocab_start, vocab_size, combined, cuts, won, logprob_mode, top_n,
                                      **settings)
            mine += lp.tobytes() + tp.tobytes()
        gathered = gather(mine)
        cut_at = len(won.tobytes()) if won is not None else 0
        partials = [g[:cut_at] for g in gathered] if racing else []
    if stats is not None:
        stats["rounds"] = len(sent)
        stats["bytes_per_round"] = sent
    tokens, flags = finish(combined, partials)
    if logprob_mode is None:
        return ShardDraw(tokens, flags)
    lp_len = rows * LOGPROB_DTYPE.itemsize
    lps, ids, tl = logprobs(combined, tokens, [g[cut_at:cut_at + lp_len] for g in gathered],
                            [g[cut_at + lp_len:] for g in gathered], logprob_mode, top_n)
    return ShardDraw(tokens, flags, lps, ids, tl)


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
