"""The plumbing of one draw call, kept cheap: structs filled in place, per-row scalars through
cached one-value-per-row arrays, numpy asked for a pointer only for the caller's own arrays.

Why: a 1-row draw of a small vocabulary takes well under a microsecond in the library, while
building ``ctypes`` structs and numpy arrays per call and asking numpy for their pointers
(``arr.ctypes`` or ``__array_interface__``: 2-3 µs each) cost the binding ~28 µs per call. Here:

* ``BATCH_LAYOUT`` and ``OUTPUT_LAYOUT`` write every field of a ``tokenrace_batch`` or
  ``tokenrace_output`` of 0.1 in one ``struct.pack_into`` call, pointers as int addresses: setting
  fields one by one costs ~50 ns each, and a pointer field wants a ctypes pointer object
  (~1.5 µs to make); the fields added since (``STEP_LAYOUT``, ``FULL_LAYOUT``) are packed
  only by the calls that use them;
* each thread has one ``CallState``: a batch and two output structs, typed pointers to them as the
  C function takes them (made once), the cached per-row scalars and the token buffers;
* ``address()`` takes an array's address through the buffer protocol when it can.

Thread safety: a ``Sampler`` is shared between threads, so everything cached here belongs to one
thread (``threading.local``). A call that finds its thread's state in use (a draw started from a
signal handler or a finalizer in the middle of another one) uses a fresh state.
"""

from __future__ import annotations

import ctypes
import struct
import threading
from ctypes import addressof, c_char, c_float, c_int32, c_uint8, c_uint32, c_uint64, c_void_p

import numpy as np

from . import _ffi


# struct format characters of the C types of the header's structs (pointers are addresses).
_FORMAT_CHARS = {c_uint8: "B", c_int32: "i", c_uint32: "I", c_uint64: "Q", c_float: "f", c_void_p: "Q"}


def struct_layout(cls, first=None, stop=None) -> struct.Struct:
    """A ``struct.Struct`` that writes ``cls``'s fields at their offsets (pointers as addresses, 0
    for NULL), padding included, so that one ``pack_into(instance, 0, *values)`` sets every field
    of a ctypes instance of ``cls``. Checked against ctypes' own offsets.

    ``first``/``stop`` (field names) restrict it to the fields from ``first`` up to, not
    including, ``stop`` (the end of the struct when None); such a layout is packed at
    ``getattr(cls, first).offset``, and covers the padding up to ``stop`` (or to the end)."""
    assert ctypes.sizeof(c_void_p) == 8, "the layout writes pointers as 64-bit addresses"
    names = [name for name, _ in cls._fields_]
    lo = names.index(first) if first else 0
    hi = names.index(stop) if stop else len(names)
    base = getattr(cls, names[lo]).offset
    fmt, end = "=", base
    for name, ctype in cls._fields_[lo:hi]:
        field = getattr(cls, name)
        fmt += "x" * (field.offset - end)
        fmt += "Q" if issubclass(ctype, ctypes._Pointer) else _FORMAT_CHARS[ctype]
        end = field.offset + field.size
    limit = getattr(cls, stop).offset if stop else ctypes.sizeof(cls)
    fmt += "x" * (limit - end)
    layout = struct.Struct(fmt)
    assert layout.size == limit - base, cls.__name__
    return layout


# Each struct is packed in two parts: the fields of 0.1 (every call) and the fields added in 0.2
# (the sampling step's inputs, the full-vocabulary output), packed only by a call that uses them
# and zeroed again by the next call that does not (``CallState.step_packed``), so that a call
# without them costs what it did before they existed.
BATCH_LAYOUT = struct_layout(_ffi.tokenrace_batch, None, _ffi.BATCH_STEP_FIRST)
STEP_LAYOUT = struct_layout(_ffi.tokenrace_batch, _ffi.BATCH_STEP_FIRST, _ffi.BATCH_STEP_END)
STEP_OFFSET = getattr(_ffi.tokenrace_batch, _ffi.BATCH_STEP_FIRST).offset
STEP_ZEROS = (0,) * sum(1 for c in STEP_LAYOUT.format if c not in "=x")
OUTPUT_LAYOUT = struct_layout(_ffi.tokenrace_output, None, _ffi.OUTPUT_FULL_FIRST)
# top-nσ's per-row pointer, written alone by a call that passes it (``CallState.sigma_packed``).
TOP_N_SIGMA_OFFSET = _ffi.tokenrace_batch.top_n_sigma.offset
POINTER_LAYOUT = struct.Struct("=Q")
# The request state's two pointers (state, ids), written by a call that names requests
# (``CallState.requests_packed``).
REQUESTS_OFFSET = _ffi.tokenrace_batch.requests.offset
REQUESTS_LAYOUT = struct.Struct("=QQ")
# The flag that appends a draw's tokens to its requests, written with them.
APPEND_OFFSET = getattr(_ffi.tokenrace_batch, _ffi.BATCH_APPEND_FIRST).offset
APPEND_LAYOUT = struct.Struct("=II")  # the flag, then reserved1
# llama.cpp's filters' six per-row pointers (min_keep, typical_p, xtc_probability,
# xtc_threshold, dynatemp_range, dynatemp_exponent), written together by a call that passes one of
# them (``CallState.llama_packed``).
LLAMA_OFFSET = getattr(_ffi.tokenrace_batch, _ffi.BATCH_LLAMA_FIRST).offset
LLAMA_LAYOUT = struct.Struct("=QQQQQQ")
# The parity block (bad words, forced tokens), written by a call that passes either
# (``CallState.parity_packed``).
PARITY_LAYOUT = struct_layout(_ffi.tokenrace_batch, _ffi.BATCH_PARITY_FIRST, _ffi.BATCH_ORDER_FIRST)
PARITY_OFFSET = getattr(_ffi.tokenrace_batch, _ffi.BATCH_PARITY_FIRST).offset
PARITY_ZEROS = (0,) * sum(1 for c in PARITY_LAYOUT.format if c not in "=x")
# The caller's order of the filter stages (ids, count), written by a call that passes one
# (``CallState.order_packed``).
ORDER_LAYOUT = struct_layout(_ffi.tokenrace_batch, _ffi.BATCH_ORDER_FIRST, _ffi.BATCH_DRY_FIRST)
ORDER_OFFSET = getattr(_ffi.tokenrace_batch, _ffi.BATCH_ORDER_FIRST).offset
# llama.cpp's DRY (multiplier, base, allowed length, window, breakers' three arrays), written by a
# call that passes any of its arguments (``CallState.dry_packed``).
DRY_LAYOUT = struct_layout(_ffi.tokenrace_batch, _ffi.BATCH_DRY_FIRST, "row_index")
DRY_OFFSET = getattr(_ffi.tokenrace_batch, _ffi.BATCH_DRY_FIRST).offset
DRY_ZEROS = (0,) * sum(1 for c in DRY_LAYOUT.format if c not in "=x")
# The logits row of each row (``draw_full(row_index=)``), written by a call that passes it
# (``CallState.row_index_packed``).
ROW_INDEX_OFFSET = _ffi.tokenrace_batch.row_index.offset
# llama.cpp's mirostat (mode, tau, eta, m, mu), written by a call that passes any of its arguments
# (``CallState.mirostat_packed``); the output's mu after the draw is one pointer of its own
# (``CallState.mirostat_out_packed`` in draw_full's output, ``draw_mu_packed`` in draw's).
MIROSTAT_LAYOUT = struct_layout(_ffi.tokenrace_batch, _ffi.BATCH_MIROSTAT_FIRST, _ffi.BATCH_APPEND_FIRST)
MIROSTAT_OFFSET = getattr(_ffi.tokenrace_batch, _ffi.BATCH_MIROSTAT_FIRST).offset
MIROSTAT_ZEROS = (0,) * sum(1 for c in MIROSTAT_LAYOUT.format if c not in "=x")
MIROSTAT_OUT_OFFSET = getattr(_ffi.tokenrace_output, _ffi.OUTPUT_MIROSTAT_FIRST).offset
FULL_LAYOUT = struct_layout(_ffi.tokenrace_output, _ffi.OUTPUT_FULL_FIRST, _ffi.OUTPUT_GIVEN_FIRST)
FULL_OFFSET = getattr(_ffi.tokenrace_output, _ffi.OUTPUT_FULL_FIRST).offset
FULL_ZEROS = (0,) * sum(1 for c in FULL_LAYOUT.format if c not in "=x")
# The logprobs of given ids (``CallState.given_packed``).
GIVEN_LAYOUT = struct_layout(_ffi.tokenrace_output, _ffi.OUTPUT_GIVEN_FIRST, _ffi.OUTPUT_KEPT_FIRST)
GIVEN_OFFSET = getattr(_ffi.tokenrace_output, _ffi.OUTPUT_GIVEN_FIRST).offset
# The kept-set outputs (``CallState.kept_packed``).
KEPT_LAYOUT = struct_layout(_ffi.tokenrace_output, _ffi.OUTPUT_KEPT_FIRST, _ffi.OUTPUT_MIROSTAT_FIRST)
KEPT_OFFSET = getattr(_ffi.tokenrace_output, _ffi.OUTPUT_KEPT_FIRST).offset
BATCH_SIZE = ctypes.sizeof(_ffi.tokenrace_batch)
OUTPUT_SIZE = ctypes.sizeof(_ffi.tokenrace_output)
# A verify call (``Sampler.verify``) packs its structs whole, in one call each.
VERIFY_BATCH_LAYOUT = struct_layout(_ffi.tokenrace_verify_batch, stop="prompt_ids")
# The verify batch's sampling step block (since 0.3), packed at its offset when given.
VERIFY_STEP_LAYOUT = struct_layout(_ffi.tokenrace_verify_batch, first="prompt_ids")
VERIFY_STEP_OFFSET = _ffi.tokenrace_verify_batch.prompt_ids.offset
VERIFY_OUTPUT_LAYOUT = struct_layout(_ffi.tokenrace_verify_output)
VERIFY_BATCH_SIZE = ctypes.sizeof(_ffi.tokenrace_verify_batch)
VERIFY_OUTPUT_SIZE = ctypes.sizeof(_ffi.tokenrace_verify_output)


def address(arr) -> int:
    """The data address of a numpy array. The buffer protocol gives it in well under a µs for a
    writable contiguous array; anything else (read-only, strided, empty) asks numpy's
    ``__array_interface__`` (2-3 µs)."""
    try:
        return addressof(c_char.from_buffer(arr))
    except (TypeError, ValueError, BufferError):
        return arr.__array_interface__["data"][0]


class RepeatedValue:
    """A ctypes array holding one value in its first ``filled`` elements: the per-row array for a
    scalar argument, refilled only when the value changes or more rows are needed."""

    __slots__ = ("ctype", "array", "address", "value", "filled")

    def __init__(self, ctype):
        self.ctype = ctype
        self.array = None
        self.address = 0
        self.value = None
        self.filled = 0

    def address_for(self, value, rows):
        """The address of ``rows`` copies of ``value`` (already checked to fit ``ctype``)."""
        if rows > self.filled or value != self.value or type(value) is not type(self.value):
            if self.array is None or rows > len(self.array):
                self.array = (self.ctype * max(rows, 1))()
                self.address = addressof(self.array)
            if rows == 1:
                self.array[0] = value
            else:
                self.array[:rows] = [value] * rows
            self.value, self.filled = value, rows
        return self.address


class OutputBuffer:
    """A reusable ctypes array with a numpy view of it; ``take(rows)`` copies the result out."""

    __slots__ = ("ctype", "dtype", "array", "address", "view")

    def __init__(self, ctype, dtype):
        self.ctype, self.dtype = ctype, dtype
        self.array = None
        self.address = 0
        self.view = None

    def address_for(self, rows):
        if self.array is None or rows > len(self.array):
            self.array = (self.ctype * max(rows, 16))()
            self.address = addressof(self.array)
            self.view = np.frombuffer(self.array, dtype=self.dtype)
        return self.address

    def take(self, rows):
        return self.view[:rows].copy()


def pack_tokens_output(state, tokens, flags):
    """Sets ``state.tokens_output`` to write the tokens (and flags, 0: not) at these addresses."""
    if state.tokens_output_fields != (tokens, flags):
        OUTPUT_LAYOUT.pack_into(state.tokens_output, 0, OUTPUT_SIZE, _ffi.LOGPROB_MODE_RAW, tokens, flags,
                                0, 0, 0, 0, 0, 0)
        state.tokens_output_fields = (tokens, flags)


class CallState:
    """One thread's structs and buffers for draw calls (see the module doc)."""

    def __init__(self):
        self.in_use = False
        self.batch = _ffi.tokenrace_batch()
        # draw() and draw_full() have an output each: draw's holds only the addresses of the
        # token and flag buffers below, so it is packed again only when they change.
        self.tokens_output = _ffi.tokenrace_output()
        self.tokens_output_fields = None  # (tokens, flags) last packed into tokens_output
        self.full_output = _ffi.tokenrace_output()
        # Whether the batch's 0.2 fields (STEP_LAYOUT) or the full output's full-vocabulary
        # fields (FULL_LAYOUT) may hold values of an earlier call (then zeroed before reuse).
        self.step_packed = False
        self.full_packed = False
        self.sigma_packed = False
        self.requests_packed = False
        self.llama_packed = False
        self.parity_packed = False
        self.order_packed = False
        self.dry_packed = False
        self.given_packed = False
        self.kept_packed = False
        self.row_index_packed = False
        self.mirostat_packed = False
        self.mirostat_out_packed = False
        self.draw_mu_packed = False
        # The arguments of tokenrace_draw, made once rather than a byref() per call.
        self.batch_ptr = ctypes.pointer(self.batch)
        self.tokens_output_ptr = ctypes.pointer(self.tokens_output)
        self.full_output_ptr = ctypes.pointer(self.full_output)
        self.temperature = RepeatedValue(c_float)
        self.seeds = RepeatedValue(c_uint64)
        self.offsets = RepeatedValue(c_uint64)
        self.seeded = RepeatedValue(c_uint8)
        self.top_k = RepeatedValue(c_int32)
        self.top_p = RepeatedValue(c_float)
        self.min_p = RepeatedValue(c_float)
        self.top_n_sigma = RepeatedValue(c_float)
        self.min_keep = RepeatedValue(c_int32)
        self.typical_p = RepeatedValue(c_float)
        self.xtc_probability = RepeatedValue(c_float)
        self.xtc_threshold = RepeatedValue(c_float)
        self.dynatemp_range = RepeatedValue(c_float)
        self.dynatemp_exponent = RepeatedValue(c_float)
        self.repetition_penalty = RepeatedValue(c_float)
        self.frequency_penalty = RepeatedValue(c_float)
        self.presence_penalty = RepeatedValue(c_float)
        self.tokens = OutputBuffer(c_int32, np.int32)
        self.flags = OutputBuffer(c_uint32, np.uint32)


_per_thread = threading.local()


def take_state():
    """This thread's ``CallState``, marked in use (``release_state()`` unmarks it), or a fresh one
    if it is in use already."""
    state = getattr(_per_thread, "state", None)
    if state is None:
        state = _per_thread.state = CallState()
    elif state.in_use:
        state = CallState()
    state.in_use = True
    return state


def release_state(state):
    state.in_use = False


# Scalar types passed without a numpy detour, by the C type of the field. bool is not among the
# integers (``type(True) is bool``): the slow path refuses it with its own message.
FLOAT_SCALARS = frozenset((float, int, np.float32, np.float64))
INT_SCALARS = frozenset((int, np.int32, np.int64))
FLAG_SCALARS = frozenset((bool, int, np.bool_))
