"""The inputs of the sampling step before the filters (token histories, penalties, logit bias,
allowed and banned tokens, a grammar bitmask) in the forms Python callers hold them, turned into
the CSR arrays and pointers of ``tokenrace_batch`` (``docs/semantics.md``, The sampling step).

What is converted and what is checked where:

* The C form is CSR: ``ids`` (int32) and ``rows + 1`` ``offsets`` (uint64), bias values float32.
  Arrays already in that form (C-contiguous, native order) are passed without a copy.
* This module checks what the library cannot: that the arrays cover what their offsets say (the
  library reads as many entries as the last offset names), that offsets are non-negative and
  non-decreasing, and that every id fits an int32 (a wider id would wrap). Errors name the
  argument, the row and the position in the caller's own layout (the column of a padded 2-D
  array, the index in a row's list, the entry of a CSR array).
* The library checks the rest (ids in ``[0, vocab)``, finite penalties, ``r > 0``, biases
  finite or -inf) and names ``batch.FIELD[ROW]: position P (entry E)``; in list and CSR forms
  its row and position are the caller's. ``FIELD_ARGUMENTS`` maps its field names to the
  arguments of ``Sampler.draw``.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping

import numpy as np

from ._arrays import _torch_to_numpy, is_torch_tensor, per_row
from ._call import FLOAT_SCALARS, address

_I32_MIN, _I32_MAX = -(2**31), 2**31 - 1
_F32_MAX = float(np.finfo(np.float32).max)

# The C fields of the batch, by the argument of ``Sampler.draw`` they come from (for messages).
FIELD_ARGUMENTS = {
    "prompt_ids": "prompt_tokens", "prompt_offsets": "prompt_tokens",
    "output_ids": "output_tokens", "output_offsets": "output_tokens",
    "bias_ids": "logit_bias", "bias_values": "logit_bias", "bias_offsets": "logit_bias",
    "allowed_ids": "allowed_tokens", "allowed_offsets": "allowed_tokens", "allowed_rows": "allowed_tokens",
    "banned_ids": "banned_tokens", "banned_offsets": "banned_tokens",
    "token_bitmask": "token_bitmask", "bitmask_row_stride": "token_bitmask",
    "repetition_penalty": "repetition_penalty", "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty", "penalty_last_n": "penalty_last_n",
    "min_tokens": "min_tokens", "stop_ids": "stop_token_ids", "stop_offsets": "stop_token_ids",
    "bad_words_ids": "bad_words", "bad_word_offsets": "bad_words", "bad_words_row_offsets": "bad_words",
    "forced_tokens": "forced_tokens",
    "logprob_token_ids": "logprob_token_ids", "logprob_token_offsets": "logprob_token_ids",
    "dry_breaker_ids": "dry_sequence_breakers", "dry_breaker_offsets": "dry_sequence_breakers",
    "dry_breakers_row_offsets": "dry_sequence_breakers",
}

_EMPTY_IDS = np.zeros(0, np.int32)


def step_fields(rows, vocab, keep, prompt_tokens, output_tokens, repetition_penalty, frequency_penalty,
                    presence_penalty, logit_bias, allowed_tokens, banned_tokens, token_bitmask, state=None,
                    penalty_last_n=None, min_tokens=None, stop_token_ids=None):
    """The 21 values of the batch's step fields (``_call.STEP_LAYOUT``, in header order:
    addresses, 0 for NULL, the bitmask's row stride, then the penalty window and min_tokens'
    fields); every array they point into is
    appended to ``keep``. ``state`` (a ``CallState``, or None) lends its cached per-row arrays
    to scalar penalties."""
    prompt = token_lists(prompt_tokens, rows, vocab, "prompt_tokens", keep)
    output = token_lists(output_tokens, rows, vocab, "output_tokens", keep)
    rep = _penalty(repetition_penalty, rows, "repetition_penalty", keep, state and state.repetition_penalty)
    freq = _penalty(frequency_penalty, rows, "frequency_penalty", keep, state and state.frequency_penalty)
    pres = _penalty(presence_penalty, rows, "presence_penalty", keep, state and state.presence_penalty)
    bias = logit_bias_csr(logit_bias, rows, "logit_bias", keep)
    allowed = token_lists(allowed_tokens, rows, vocab, "allowed_tokens", keep, rows_mask=True)
    banned = token_lists(banned_tokens, rows, vocab, "banned_tokens", keep)
    mask_ptr, mask_stride = bitmask_view(token_bitmask, rows, vocab, "token_bitmask", keep)
    last_n = _int32_per_row(penalty_last_n, rows, "penalty_last_n", keep)
    min_n = _int32_per_row(min_tokens, rows, "min_tokens", keep)
    stops = token_lists(stop_token_ids, rows, vocab, "stop_token_ids", keep)
    return (prompt[0], prompt[1], output[0], output[1], rep, freq, pres, bias[0], bias[1], bias[2],
            allowed[0], allowed[1], allowed[2], banned[0], banned[1], mask_ptr, mask_stride, last_n,
            min_n, stops[0], stops[1])


def parity_fields(rows, vocab, keep, bad_words=None, forced_tokens=None, logprob_token_ids=None):
    """The 6 values of the batch's parity block (``_call.PARITY_LAYOUT``: bad words' ids, word
    offsets, row offsets, forced tokens, the ids and offsets of ``logprob_token_ids``),
    addresses or 0 for NULL; the arrays are appended to ``keep``."""
    words = bad_words_csr(bad_words, rows) if bad_words is not None else None
    fields = (0, 0, 0) if words is None else tuple(_addr(a, keep) for a in words)
    forced = _int32_per_row(forced_tokens, rows, "forced_tokens", keep)
    given = token_lists(logprob_token_ids, rows, vocab, "logprob_token_ids", keep)
    return (*fields, forced, *given)


def dry_fields(rows, keep, multiplier, base, allowed_length, penalty_last_n, breakers):
    """The 7 values of the batch's DRY block (``_call.DRY_LAYOUT``: multiplier, base, allowed
    length, window, then the breakers' ids, offsets and row offsets), addresses or 0 for NULL;
    the arrays are appended to ``keep``."""
    floats = tuple(0 if v is None else _addr(per_row(v, rows, np.float32, name), keep)
                   for v, name in ((multiplier, "dry_multiplier"), (base, "dry_base")))
    ints = (_int32_per_row(allowed_length, rows, "dry_allowed_length", keep),
            _int32_per_row(penalty_last_n, rows, "dry_penalty_last_n", keep))
    words = bad_words_csr(breakers, rows, "dry_sequence_breakers") if breakers is not None else None
    lists = (0, 0, 0) if words is None else tuple(_addr(a, keep) for a in words)
    return (*floats, *ints, *lists)


def list_entries(offsets_address, rows):
    """The entry count of a CSR list (its last offset) from the address of its ``rows + 1``
    offsets, as ``token_lists`` gave it (the array is kept alive by the caller)."""
    return ctypes.c_uint64.from_address(offsets_address + 8 * rows).value


def bad_words_csr(value, rows, name="bad_words"):
    """``bad_words`` (one entry per row: None or a list of words, each a non-empty list of token
    ids) as the library's two-level CSR: ``(int32 ids, uint64 word offsets, uint64 row offsets)``.
    The library checks each id against the vocabulary, naming row, word and position."""
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, (list, tuple)):
        raise TypeError(f"{name}: must be a list of one list of words (or None) per row, got "
                        f"{type(value).__name__}")
    if len(value) != rows:
        raise ValueError(f"{name}: has {len(value)} rows, the batch has {rows}")
    ids, word_offsets, row_offsets = [], [0], [0]
    for r, words in enumerate(value):
        for w, word in enumerate(words or ()):
            if is_torch_tensor(word):
                word = _torch_to_numpy(word, f"{name}[{r}][{w}]")
            word = np.asarray(word)
            if word.ndim != 1 or word.size == 0 or not np.issubdtype(word.dtype, np.integer):
                raise ValueError(f"{name}[{r}][{w}]: must be a non-empty list of token ids")
            wide = (word < _I32_MIN) | (word > _I32_MAX)
            if wide.any():
                p = int(np.argmax(wide))
                raise ValueError(f"{name}[{r}][{w}]: position {p}: {int(word[p])} does not fit an int32 token id")
            ids.extend(int(t) for t in word)
            word_offsets.append(len(ids))
        row_offsets.append(len(word_offsets) - 1)
    return (np.array(ids, np.int32), np.array(word_offsets, np.uint64), np.array(row_offsets, np.uint64))


def _int32_per_row(value, rows, name, keep):
    """The address of a per-row int32 argument (``penalty_last_n``, ``min_tokens``: the library
    refuses negative values, naming the row), 0 for None."""
    if value is None:
        return 0
    arr = per_row(value, rows, np.int32, name)
    return _addr(arr, keep)


def _penalty(value, rows, name, keep, cache=None):
    if value is None:
        return 0
    # A scalar (the common case) from the thread's cached array, refilled only when it changes;
    # NaN and values beyond the f32 range fail the comparison and go through per_row().
    if cache is not None and type(value) in FLOAT_SCALARS and -_F32_MAX <= value <= _F32_MAX:
        return cache.address_for(float(value), rows)
    arr = per_row(value, rows, np.float32, name)
    keep.append(arr)
    return address(arr)


def _addr(arr, keep):
    keep.append(arr)
    return address(arr)


# -- token lists --------------------------------------------------------------------------------


def token_lists(value, rows, vocab, name, keep, rows_mask=False):
    """``(ids address, offsets address[, rows mask address])`` of a list argument, 0s for None.

    ``rows_mask`` (allowed_tokens): a per-row list form with ``None`` rows gives the uint8 mask of
    the rows that carry a list (NULL when every row does); every row of the CSR and padded forms
    carries one."""
    if value is None:
        return (0, 0, 0) if rows_mask else (0, 0)
    fast = _csr_as_given(value, rows, keep)
    if fast is not None:
        return (*fast, 0) if rows_mask else fast
    present = None
    if isinstance(value, tuple):
        ids, offsets = _csr_lists(value, rows, name)
    elif is_torch_tensor(value) or isinstance(value, np.ndarray):
        ids, offsets = _padded(value, rows, vocab, name)
    elif isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__len__"):
        raise TypeError(f"{name}: must be a list of per-row ids, a CSR tuple (ids, offsets) or a 2-D "
                        f"padded array, got {type(value).__name__}")
    else:
        ids, offsets, present = _per_row_lists(value, rows, name)
    if rows_mask:
        if present is not None and not present.all():
            if not present.any():
                return 0, 0, 0  # no row is restricted: as if not given
            return _addr(ids, keep), _addr(offsets, keep), _addr(present.view(np.uint8), keep)
        return _addr(ids, keep), _addr(offsets, keep), 0
    return _addr(ids, keep), _addr(offsets, keep)


def _csr_as_given(value, rows, keep, values_dtype=None):
    """The addresses of a CSR tuple already in the C form, 1-D C-contiguous numpy arrays: int32
    ids, (with ``values_dtype``) values of that dtype as many as the ids, and ``rows + 1`` uint64
    offsets (their count and last offset checked), appended to ``keep``, in a few numpy calls
    (the general path took 4-6 us a list). None for anything else, which the general path
    converts or words the error of. The ids' range and the offsets' order are the library's to
    check."""
    if type(value) is not tuple or len(value) != (2 if values_dtype is None else 3):
        return None
    ids, off = value[0], value[-1]
    if not (_c_form(ids, np.int32) and _c_form(off, np.uint64) and off.shape[0] == rows + 1):
        return None
    n = ids.shape[0]
    if values_dtype is not None and not (_c_form(value[1], values_dtype) and value[1].shape[0] == n):
        return None
    if int(off[rows]) > n:
        return None
    # Offsets that decrease are the library's to refuse (it names the field, row and offset):
    # checking them here too cost 2-3 us a list a call.
    return tuple(_addr(a, keep) for a in value)


def _c_form(arr, dtype):
    return type(arr) is np.ndarray and arr.dtype == dtype and arr.ndim == 1 and arr.flags.c_contiguous


def _int_array(obj, name):
    """A 1-D numpy array of integers from an array, a tensor or a sequence (not copied when it is
    one already)."""
    if is_torch_tensor(obj):
        obj = _torch_to_numpy(obj, name)
    if isinstance(obj, np.ndarray):
        arr = obj
    else:
        try:
            arr = np.asarray(obj)
        except (OverflowError, ValueError, TypeError) as e:
            raise ValueError(f"{name}: must be integers ({e})") from None
        if arr.size == 0:
            arr = arr.astype(np.int64).reshape(-1)
        elif arr.dtype == object:
            arr = _object_ints(arr, name)
    if arr.ndim != 1:
        raise ValueError(f"{name}: must be 1-D, got shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        if arr.dtype.kind == "b":
            raise ValueError(f"{name}: must be integers, got booleans")
        raise ValueError(f"{name}: must be integers, got dtype {arr.dtype}")
    return arr


def _object_ints(arr, name):
    """A sequence numpy kept as objects (Python ints beyond int64, mixed types)."""
    flat = arr.reshape(-1)
    for j, v in enumerate(flat.tolist()):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise ValueError(f"{name}: position {j}: {v!r} is not an integer")
        if not _I32_MIN <= int(v) <= _I32_MAX:
            return _position_error(name, j, int(v))
    return arr.astype(np.int64)


def _position_error(name, j, v, entry=None):
    where = f"position {j}" if entry is None else f"position {j} (entry {entry})"
    raise ValueError(f"{name}: {where}: {v} is not a token id (it does not fit in an int32)")


def _as_int32(arr, name, entry_base=None):
    """``arr`` (1-D integers) as a contiguous int32 array; an entry that does not fit raises,
    naming its position (``name`` already names the row)."""
    if arr.dtype == np.int32:
        return np.ascontiguousarray(arr)
    if arr.size and (arr.dtype.itemsize > 4 or arr.dtype == np.uint32):
        bad = (arr > _I32_MAX) if arr.dtype.kind == "u" else ((arr < _I32_MIN) | (arr > _I32_MAX))
        if bad.any():
            j = int(np.argmax(bad))
            _position_error(name, j, int(arr[j]), None if entry_base is None else entry_base + j)
    return np.ascontiguousarray(arr, dtype=np.int32)


def _offsets(obj, rows, name, length):
    """CSR offsets as contiguous uint64, checked: ``rows + 1`` entries, non-negative,
    non-decreasing, the last within the ``length`` entries of the id (and value) arrays."""
    off = _int_array(obj, f"{name} offsets")
    if off.shape[0] != rows + 1:
        raise ValueError(f"{name}: has {off.shape[0]} offsets, the batch of {rows} rows needs {rows + 1}")
    if off.dtype.kind == "i" and off.min() < 0:
        r = int(np.argmax(off < 0))
        raise ValueError(f"{name}: offsets[{r}]: {int(off[r])} is negative")
    off = np.ascontiguousarray(off, dtype=np.uint64)
    if rows:
        dec = off[1:] < off[:-1]
        if dec.any():
            r = int(np.argmax(dec)) + 1
            raise ValueError(f"{name}: offsets[{r}]: {int(off[r])} is below the previous offset "
                             f"{int(off[r - 1])} (offsets must not decrease)")
    if int(off[rows]) > length:
        raise ValueError(f"{name}: offsets[{rows}]: {int(off[rows])} is past the end of the {length} entries")
    return off


def _row_of(offsets, entry):
    """The row whose range holds ``entry`` (offsets checked non-decreasing)."""
    return int(np.searchsorted(offsets, np.uint64(entry), side="right")) - 1


def _csr_ids(ids, offsets, name):
    """CSR ids as int32; an entry that does not fit and that a row covers raises naming
    ``name[row]``, its position in the row and its entry."""
    if ids.dtype == np.int32:
        return np.ascontiguousarray(ids)
    rows = offsets.shape[0] - 1
    lo, hi = int(offsets[0]), int(offsets[rows])
    covered = ids[lo:hi]
    if covered.size and (covered.dtype.itemsize > 4 or covered.dtype == np.uint32):
        bad = (covered > _I32_MAX) if covered.dtype.kind == "u" else ((covered < _I32_MIN) | (covered > _I32_MAX))
        if bad.any():
            entry = lo + int(np.argmax(bad))
            r = _row_of(offsets, entry)
            _position_error(f"{name}[{r}]", entry - int(offsets[r]), int(ids[entry]), entry)
    out = np.zeros(ids.shape[0], np.int32)  # entries outside every row are never read
    out[lo:hi] = covered
    return out


def _csr_lists(value, rows, name):
    if len(value) != 2:
        raise ValueError(f"{name}: a tuple is read as CSR (ids, offsets), got {len(value)} elements "
                         f"(per-row ids go in a list)")
    ids = _int_array(value[0], f"{name} ids")
    offsets = _offsets(value[1], rows, name, ids.shape[0])
    return _csr_ids(ids, offsets, name), offsets


def _padded(value, rows, vocab, name):
    """A 2-D array padded as vLLM pads its prompt tensor: entries equal to ``vocab`` or negative
    are padding; any other entry outside ``[0, vocab)`` raises, naming its row and column."""
    if is_torch_tensor(value):
        value = _torch_to_numpy(value, name)
    if value.ndim != 2:
        raise ValueError(f"{name}: an array must be 2-D (rows x positions, padded with {vocab} or negative "
                         f"values), got shape {value.shape}; pass one row's ids as a list ([ids])")
    if value.shape[0] != rows:
        raise ValueError(f"{name}: has {value.shape[0]} rows, the batch has {rows}")
    if value.dtype.kind not in "iu":
        raise ValueError(f"{name}: must be integers, got dtype {value.dtype}")
    # Negative entries are padding. Seen as unsigned, a negative entry of a b-bit dtype is at
    # least 2**(b - 1), so when vocab is no larger one comparison finds the ids; a narrower
    # dtype (int8 with vocab > 128, int16 with vocab > 32768) needs the sign tested apart, or its
    # padding would read as ids. An entry above vocab (not padding) is an error.
    if value.dtype.kind == "i" and vocab <= 2 ** (8 * value.dtype.itemsize - 1):
        keep = value.view(np.dtype(f"u{value.dtype.itemsize}")) < vocab
    elif value.dtype.kind == "i":
        keep = (value >= 0) & (value < vocab)
    else:
        keep = value < vocab
    if keep.all():  # no padding at all: every row is full
        ids = np.ascontiguousarray(value, dtype=np.int32).reshape(-1)
        return ids, np.arange(rows + 1, dtype=np.uint64) * np.uint64(value.shape[1])
    bad = value > vocab
    if bad.any():
        r, j = (int(v) for v in np.argwhere(bad)[0])
        raise ValueError(f"{name}[{r}]: position {j}: {int(value[r, j])} is not a token id in [0, {vocab}) "
                         f"(nor padding: {vocab} or negative)")
    ids = np.ascontiguousarray(value[keep], dtype=np.int32)
    offsets = np.zeros(rows + 1, np.uint64)
    np.cumsum(keep.sum(axis=1), out=offsets[1:])
    return ids, offsets


def _per_row_lists(value, rows, name):
    """Per-row ids (None or empty allowed): ``(ids, offsets, present)``, ``present`` the bool
    mask of the rows that are not None."""
    if len(value) != rows:
        raise ValueError(f"{name}: has {len(value)} rows, the batch has {rows}")
    fast = _per_row_lists_at_once(value, rows)
    if fast is not None:
        return fast
    parts, lengths = [], np.zeros(rows + 1, np.uint64)
    present = np.ones(rows, bool)
    for r, item in enumerate(value):
        if item is None:
            present[r] = False
            continue
        arr = _as_int32(_int_array(item, f"{name}[{r}]"), f"{name}[{r}]")
        if arr.shape[0]:
            parts.append(arr)
        lengths[r + 1] = arr.shape[0]
    ids = np.concatenate(parts) if parts else _EMPTY_IDS
    return ids, np.cumsum(lengths, dtype=np.uint64), present


def _per_row_lists_at_once(value, rows):
    """The common cases of ``_per_row_lists`` in a few numpy calls for the whole batch: every row
    None or a 1-D integer numpy array, or every row None or a list/tuple of Python ints, all ids
    fitting an int32. None for anything else (or anything wrong), which the per-row loop then
    converts or words the error of."""
    present = np.fromiter((item is not None for item in value), bool, rows)
    items = [item for item in value if item is not None]
    if not items:
        return _EMPTY_IDS, np.zeros(rows + 1, np.uint64), present
    if type(items[0]) is not np.ndarray:
        if not all(type(a) is list or type(a) is tuple for a in items):
            return None
        try:  # numpy infers the dtype: int64 for Python ints (float, bool or object otherwise)
            items = [np.asarray(a) if a else _EMPTY_IDS for a in items]
        except (OverflowError, ValueError, TypeError):
            return None
    if not all(type(a) is np.ndarray and a.ndim == 1 and a.dtype.kind in "iu" for a in items):
        return None
    flat = np.concatenate(items) if len(items) > 1 else items[0]
    if flat.dtype.kind not in "iu":  # int64 with uint64 concatenates to float64
        return None
    if flat.dtype != np.int32 and flat.size:
        if flat.dtype.kind == "u":
            if flat.max() > _I32_MAX:
                return None
        elif flat.min() < _I32_MIN or flat.max() > _I32_MAX:
            return None
    lengths = np.zeros(rows + 1, np.uint64)
    lengths[1:][present] = [len(a) for a in items]
    return np.ascontiguousarray(flat, dtype=np.int32), np.cumsum(lengths, dtype=np.uint64), present


# -- logit bias ---------------------------------------------------------------------------------


def logit_bias_csr(value, rows, name, keep):
    """``(ids, values, offsets)`` addresses of the logit bias, 0s for None. Forms: one mapping
    {id: bias} for every row, a list of mappings (None: no bias for the row), or CSR
    ``(ids, values, offsets)`` (ids and offsets of any integer dtype, values float32/float64)."""
    if value is None:
        return 0, 0, 0
    fast = _csr_as_given(value, rows, keep, np.float32)
    if fast is not None:
        return fast
    if isinstance(value, Mapping):
        ids, values = _bias_pairs(value, name)
        n = ids.shape[0]
        ids, values = np.tile(ids, rows), np.tile(values, rows)
        offsets = np.arange(rows + 1, dtype=np.uint64) * np.uint64(n)
    elif isinstance(value, tuple):
        if len(value) != 3:
            raise ValueError(f"{name}: a tuple is read as CSR (ids, values, offsets), got {len(value)} "
                             f"elements (per-row dicts go in a list)")
        ids = _int_array(value[0], f"{name} ids")
        values = _bias_values(value[1], name)
        if values.shape[0] != ids.shape[0]:
            raise ValueError(f"{name}: has {ids.shape[0]} ids and {values.shape[0]} values")
        offsets = _offsets(value[2], rows, name, ids.shape[0])
        ids = _csr_ids(ids, offsets, name)
        values = _f32_values(values, offsets, name)
    elif isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or isinstance(value, np.ndarray):
        raise TypeError(f"{name}: must be a dict {{id: bias}}, a list of them (one per row) or a CSR tuple "
                        f"(ids, values, offsets), got {type(value).__name__}")
    else:
        if len(value) != rows:
            raise ValueError(f"{name}: has {len(value)} rows, the batch has {rows}")
        fast = _bias_dicts_at_once(value, rows)
        if fast is not None:
            ids, values, offsets = fast
        else:
            id_parts, value_parts = [], []
            lengths = np.zeros(rows + 1, np.uint64)
            for r, d in enumerate(value):
                if d is None:
                    continue
                if not isinstance(d, Mapping):
                    raise TypeError(f"{name}[{r}]: must be a dict {{id: bias}} or None, got {type(d).__name__}")
                ids_r, values_r = _bias_pairs(d, f"{name}[{r}]")
                id_parts.append(ids_r)
                value_parts.append(values_r)
                lengths[r + 1] = ids_r.shape[0]
            ids = np.concatenate(id_parts) if id_parts else _EMPTY_IDS
            values = np.concatenate(value_parts) if value_parts else np.zeros(0, np.float32)
            offsets = np.cumsum(lengths, dtype=np.uint64)
    return _addr(ids, keep), _addr(values, keep), _addr(offsets, keep)


def _bias_dicts_at_once(dicts, rows):
    """A list of dicts (or None) of Python int keys and Python float/int values, all fitting
    int32 and float32, in a few numpy calls; None for anything else, which the per-pair loop
    converts or words the error of."""
    present = [d for d in dicts if d is not None]
    if not all(type(d) is dict for d in present):
        return None
    keys = [k for d in present for k in d]
    vals = [v for d in present for v in d.values()]
    if not (all(type(k) is int for k in keys) and all(type(v) is float or type(v) is int for v in vals)):
        return None
    try:
        ids = np.array(keys, dtype=np.int64)
        values = np.array(vals, dtype=np.float64)
    except OverflowError:
        return None
    if ids.size and (ids.min() < _I32_MIN or ids.max() > _I32_MAX):
        return None
    with np.errstate(over="ignore"):
        values32 = values.astype(np.float32)
    if (np.isinf(values32) & np.isfinite(values)).any():
        return None
    lengths = np.zeros(rows + 1, np.uint64)
    lengths[1:] = [0 if d is None else len(d) for d in dicts]
    return ids.astype(np.int32), values32, np.cumsum(lengths, dtype=np.uint64)


def _bias_pairs(d, name):
    """One row's {id: bias} as int32 ids and float32 values, in the dict's order (the positions
    the library's messages count)."""
    ids = np.empty(len(d), np.int32)
    values = np.empty(len(d), np.float32)
    for j, (k, v) in enumerate(d.items()):
        if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)):
            raise ValueError(f"{name}: position {j}: the key {k!r} is not a token id (an integer)")
        if not _I32_MIN <= int(k) <= _I32_MAX:
            _position_error(name, j, int(k))
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise ValueError(f"{name}: position {j} (id {int(k)}): the bias {v!r} is not a number")
        f = float(v)
        if abs(f) > _F32_MAX and f == f and abs(f) != float("inf"):
            raise ValueError(f"{name}: position {j} (id {int(k)}): the bias {f} does not fit in a float32")
        ids[j] = int(k)
        values[j] = f
    return ids, values


def _bias_values(obj, name):
    if is_torch_tensor(obj):
        obj = _torch_to_numpy(obj, name)
    arr = obj if isinstance(obj, np.ndarray) else np.asarray(obj, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name}: values must be 1-D, got shape {arr.shape}")
    if arr.dtype not in (np.float32, np.float64):
        raise ValueError(f"{name}: values must be float32 or float64, got dtype {arr.dtype}")
    return arr


def _f32_values(values, offsets, name):
    if values.dtype == np.float32:
        return np.ascontiguousarray(values)
    with np.errstate(over="ignore"):
        out = values.astype(np.float32)
    overflow = np.isinf(out) & np.isfinite(values)
    if overflow.any():
        entry = int(np.argmax(overflow))
        rows = offsets.shape[0] - 1
        if int(offsets[0]) <= entry < int(offsets[rows]):
            r = _row_of(offsets, entry)
            raise ValueError(f"{name}[{r}]: position {entry - int(offsets[r])} (entry {entry}): the bias "
                             f"{float(values[entry])} does not fit in a float32")
    return out


# -- grammar bitmask ----------------------------------------------------------------------------


def bitmask_view(value, rows, vocab, name, keep):
    """``(address, row stride in words)`` of a grammar bitmask read in place: int32, rows x
    ceil(vocab / 32) words (a 1-D array for a batch of one row), words contiguous inside a row,
    rows any whole number of words apart. ``(0, 0)`` for None."""
    if value is None:
        return 0, 0
    words = -(-vocab // 32)
    if (type(value) is np.ndarray and value.dtype == np.int32 and value.shape == (rows, words)
            and value.flags.c_contiguous and value.flags.aligned and rows > 1):
        # The common form (xgrammar's rows x words, C order): its checks below hold by
        # construction, and their stride arithmetic cost 2-3 us a call.
        keep.append(value)
        return address(value), words
    if is_torch_tensor(value):
        import torch

        if value.device.type != "cpu":
            raise ValueError(f"{name}: is a tensor on device '{value.device}'; pass {name}.cpu()")
        if value.layout != torch.strided:
            raise ValueError(f"{name}: has layout {value.layout}; only dense (strided) tensors are supported")
        if value.dtype != torch.int32:
            raise ValueError(f"{name}: dtype {value.dtype} is not supported; a bitmask is torch.int32 words "
                             f"(xgrammar's layout)")
        shape, strides, ptr = tuple(value.shape), tuple(value.stride()), value.data_ptr()
        if ptr % 4:
            raise ValueError(f"{name}: is not aligned to its 4-byte words; pass {name}.clone()")
    elif isinstance(value, np.ndarray):
        if value.dtype != np.int32:
            raise ValueError(f"{name}: dtype {value.dtype} is not supported; a bitmask is int32 words "
                             f"(xgrammar's layout)")
        if not value.flags.aligned:
            raise ValueError(f"{name}: is not aligned to its 4-byte words; pass a copy")
        shape = value.shape
        strides = tuple(s // 4 if s % 4 == 0 else None for s in value.strides)
        if None in strides:
            raise ValueError(f"{name}: its strides {value.strides} are not whole 4-byte words")
        ptr = address(value)
    else:
        raise TypeError(f"{name}: must be an int32 numpy array or CPU torch tensor (rows x ceil(vocab / 32) "
                        f"words), got {type(value).__name__}")
    if len(shape) == 1:
        if rows != 1:
            raise ValueError(f"{name}: is 1-D (one row), the batch has {rows} rows")
        shape, strides = (1,) + shape, (shape[0],) + strides
    elif len(shape) != 2:
        raise ValueError(f"{name}: must be 2-D (rows x words) or 1-D (one row), got shape {shape}")
    if shape[0] != rows:
        raise ValueError(f"{name}: has {shape[0]} rows, the batch has {rows}")
    if shape[1] != words:
        raise ValueError(f"{name}: has {shape[1]} words per row, vocab {vocab} needs ceil({vocab} / 32) = {words}")
    if words > 1 and strides[1] != 1:
        raise ValueError(f"{name}: words inside a row must be contiguous (inner stride {strides[1]} words); "
                         f"pass a contiguous copy")
    stride = 0 if rows == 1 else strides[0]
    if rows > 1 and stride < words:
        raise ValueError(f"{name}: rows overlap or run backwards (row stride {stride} words, {words} words per "
                         f"row); pass a contiguous copy")
    keep.append(value)
    return ptr, stride
