"""The plain greedy draw: ``Sampler.draw(logits, temperature=0)`` with nothing else, through
``tokenrace_draw_greedy`` instead of the general batch.

Why: such a call of one row is mostly its fixed cost (a vocabulary of 163840 reads in about 7 µs
on one core), and the general path spends about 5 µs in the binding (the batch's fields, the
per-row temperature, the output struct) and 1.2 µs in the library (its ~70 fields converted and
checked) on fields a greedy call leaves unset. Here: one ``struct.pack`` of six fields, passed
as bytes (the library only reads it), a fresh output array, and one C call whose arguments are
plain addresses (a second function object for the symbol, so that ``_ffi``'s declaration keeps
the header's types).

The same tokens and flags as the general path, which also takes every call this one would
refuse (rows above ``max_rows``, another vocabulary...): its messages name ``tokenrace_draw``.
"""

from __future__ import annotations

import ctypes
import struct
from ctypes import addressof, c_char

import numpy as np

from . import _ffi
from ._arrays import _NUMPY_DTYPES
from ._call import address
from ._errors import check

# tokenrace_greedy_batch: struct_size, dtype, logits, rows, vocab, row_stride.
GREEDY_LAYOUT = struct.Struct("=IIQIIQ")
assert GREEDY_LAYOUT.size == ctypes.sizeof(_ffi.tokenrace_greedy_batch)

_entry = None  # tokenrace_draw_greedy taking addresses, or False: the library has none


def _load():
    global _entry
    lib = _ffi.lib()
    try:
        # lib[name] is a function object of its own (getattr's is shared and declared by _ffi).
        fn = lib["tokenrace_draw_greedy"]
    except AttributeError:
        _entry = False
        return _entry
    fn.restype = _ffi.status
    fn.argtypes = [_ffi.sampler_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p]
    _entry = fn
    return _entry


def plain_limits(config):
    """``(max_rows, vocab_size)`` of a sampler whose temperature 0 is greedy, else None."""
    if not config.greedy_below > 0:
        return None
    return config.max_rows, config.vocab_size


def draw_greedy(sampler, limits, logits, return_flags):
    """The tokens (with the flags, if ``return_flags``) of ``sampler.draw(logits,
    temperature=0)``, for a C-contiguous, aligned 2-D numpy array of rows the sampler takes;
    None for anything else, which the general path draws (or refuses). ``contiguous_rows``'s
    checks, inline: a function call is a sizeable part of this call."""
    dtype = _NUMPY_DTYPES.get(logits.dtype)
    if dtype is None or logits.ndim != 2:
        return None
    flags = logits.flags
    if not (flags.c_contiguous and flags.aligned):
        return None
    rows, vocab = logits.shape
    max_rows, vocab_size = limits
    if not 0 < rows <= max_rows or not 0 < vocab <= 0x7FFFFFFF or (vocab_size and vocab != vocab_size):
        return None
    fn = _entry if _entry is not None else _load()
    if not fn:
        return None
    tokens = np.empty(rows, dtype=np.int32)
    out_flags = np.empty(rows, dtype=np.uint32) if return_flags else None
    h = sampler._live_handle()
    check(fn(h.ptr, GREEDY_LAYOUT.pack(GREEDY_LAYOUT.size, dtype, address(logits), rows, vocab, vocab),
             addressof(c_char.from_buffer(tokens)), None if out_flags is None else addressof(c_char.from_buffer(out_flags))))
    del h
    if return_flags:
        return tokens, out_flags
    return tokens
