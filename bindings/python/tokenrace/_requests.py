"""``Requests``: one ``tokenrace_requests``, the histories of the live requests kept between draws.

A runtime's histories grow by a token or a few per request and step. Passing every row's whole
prompt and output to each draw (vLLM keeps them as padded 2-D int64 tensors) costs a conversion
and a count of every history token per call; a ``Requests`` state takes each request's histories
once (``add``, converted to int32 then, never again), its new tokens after each step
(``append``), and a draw names its rows by request id::

    state = tokenrace.Requests()
    state.add(7, prompt_ids)                       # once per request
    tokens = sampler.draw(logits, repetition_penalty=1.1, requests=state, request_ids=[7])
    state.append([7], tokens)                      # the host keeps the drawn tokens
    state.remove(7)                                # when the request ends

The draw gives exactly what the same draw with ``prompt_tokens``/``output_tokens`` gives (bit
for bit). Appending the drawn tokens is the caller's step (a host may drop a drawn token, or
accept several at once after a verify call), or the draw's with ``append_to_requests=True``.

A request may also hold its sampling parameters (``set_params``, or ``add(..., **params)``):
a draw that names it takes each per-row parameter the call leaves None from its request, so a
step passes only the logits and the ids::

    state.add(7, prompt_ids, temperature=0.7, top_p=0.9, repetition_penalty=1.1, seed=42)
    tokens = sampler.draw(logits, requests=state, request_ids=[7], append_to_requests=True)
"""

from __future__ import annotations

import ctypes

import numpy as np

from . import _ffi
from ._arrays import is_torch_tensor
from ._common import _Closable, _Handle
from ._call import address
from ._errors import check

_UINT64_MAX = 2**64 - 1


def _free_requests(ptr):
    _ffi.lib().tokenrace_requests_free(ptr)


def _as_numpy(value, name):
    if is_torch_tensor(value):
        return value.detach().cpu().numpy()
    try:
        return np.asarray(value)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{name}: must be a sequence of token ids, an array or a tensor ({e})") from None


def _tokens(value, name, pad_id=None):
    """A C-contiguous int32 array of the 1-D token ids ``value`` (a list, numpy array or tensor),
    without the entries equal to ``pad_id`` (when given)."""
    arr = _as_numpy(value, name)
    if arr.ndim != 1:
        raise ValueError(f"{name}: must be 1-D (one request's tokens), got {arr.ndim}-D")
    if arr.size == 0:
        return np.empty(0, np.int32)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name}: token ids must be integers, got {arr.dtype}")
    if pad_id is not None:
        arr = arr[arr != pad_id]
        if arr.size == 0:
            return np.empty(0, np.int32)
    if arr.dtype != np.int32:
        low, high = int(arr.min()), int(arr.max())
        if low < -2**31 or high >= 2**31:
            bad = int(np.flatnonzero((arr < -2**31) | (arr >= 2**31))[0])
            raise ValueError(f"{name}[{bad}]: {int(arr[bad])} is not an int32 token id")
        arr = arr.astype(np.int32)
    return np.ascontiguousarray(arr)


def _ids(value, name):
    if type(value) is np.ndarray and value.dtype == np.uint64 and value.ndim == 1 and value.flags.c_contiguous:
        # The form the library reads, whose every value is a request id: nothing to check
        # (the range checks below cost 5-9 us a call, more than the rest of the packing).
        return value
    arr = _as_numpy(value, name)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.ndim != 1:
        raise ValueError(f"{name}: must be 1-D, got {arr.ndim}-D")
    if arr.size and arr.dtype.kind not in "iu":
        raise TypeError(f"{name}: request ids must be integers, got {arr.dtype}")
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) > _UINT64_MAX):
        bad = int(np.flatnonzero(arr < 0)[0]) if int(arr.min()) < 0 else int(np.argmax(arr))
        raise ValueError(f"{name}[{bad}]: {int(arr[bad])} is not a request id (0 .. 2**64 - 1)")
    return np.ascontiguousarray(arr, dtype=np.uint64)


def _int32_ptr(arr):
    return arr.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))


def _uint64_ptr(arr):
    return arr.ctypes.data_as(ctypes.POINTER(ctypes.c_uint64))


def _request_id(value, name="request_id"):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name}: must be an int, got {type(value).__name__}")
    if not 0 <= int(value) <= _UINT64_MAX:
        raise ValueError(f"{name}: {int(value)} is not a request id (0 .. 2**64 - 1)")
    return int(value)


_PARAM_SCALARS = {
    # name: (C field, kind)
    "temperature": ("temperature", float),
    "top_k": ("top_k", int),
    "top_p": ("top_p", float),
    "min_p": ("min_p", float),
    "top_n_sigma": ("top_n_sigma", float),
    "min_keep": ("min_keep", int),
    "typical_p": ("typical_p", float),
    "repetition_penalty": ("repetition_penalty", float),
    "frequency_penalty": ("frequency_penalty", float),
    "presence_penalty": ("presence_penalty", float),
    "penalty_last_n": ("penalty_last_n", int),
    "min_tokens": ("min_tokens", int),
}
_PARAM_LISTS = {"stop_token_ids": ("stop_ids", "stop_len"), "banned_tokens": ("banned_ids", "banned_len")}


def _params_struct(**params):
    """A ``tokenrace_request_params`` of ``params`` (see ``Requests.set_params``) and the arrays it
    points into, which must live as long as the struct is used."""
    c = _ffi.lib().tokenrace_request_params_default()
    arrays = []
    for name, value in params.items():
        if name in _PARAM_SCALARS:
            field, kind = _PARAM_SCALARS[name]
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise TypeError(f"{name}: must be a number, got {type(value).__name__}")
            if kind is int and not isinstance(value, (int, np.integer)):
                raise TypeError(f"{name}: must be an int, got {type(value).__name__}")
            if kind is int and not -2**31 <= int(value) < 2**31:
                raise ValueError(f"{name}: {int(value)} is not an int32")
            setattr(c, field, kind(value))
        elif name == "seed":
            if value is not None:
                c.seed, c.has_seed = _request_id(value, "seed"), 1
        elif name in _PARAM_LISTS:
            ptr_field, len_field = _PARAM_LISTS[name]
            ids = _tokens(value if value is not None else (), name)
            arrays.append(ids)
            setattr(c, ptr_field, _int32_ptr(ids))
            setattr(c, len_field, ids.size)
        elif name == "allowed_tokens":
            if value is not None:
                ids = _tokens(value, name)
                # (A non-NULL pointer even for no token: an empty list allows nothing.)
                storage = ids if ids.size else np.zeros(1, np.int32)
                arrays.append(storage)
                c.allowed_ids, c.allowed_len = _int32_ptr(storage), ids.size
        elif name == "logit_bias":
            bias = dict(value or {})
            ids = _tokens(np.fromiter(bias.keys(), np.int64, len(bias)), "logit_bias ids")
            values = np.ascontiguousarray(np.fromiter(bias.values(), np.float64, len(bias)), np.float32)
            arrays += [ids, values]
            c.bias_ids, c.bias_values, c.bias_len = _int32_ptr(ids), values.ctypes.data_as(
                ctypes.POINTER(ctypes.c_float)), ids.size
        else:
            raise TypeError(f"{name}: not a request parameter (see Requests.set_params)")
    return c, arrays


class Requests(_Closable):
    """The prompt and output histories of the live requests, keyed by an int id (0 .. 2**64 - 1)
    that the caller chooses; pass it to ``Sampler.draw(..., requests=state, request_ids=ids)``.

    Safe to share between threads: draws read it under a shared lock, ``add``, ``remove``,
    ``append`` and ``reset`` change it under an exclusive one. Every refused call (``ValueError``
    naming the argument, the position and the id) changes nothing.
    """

    def __init__(self):
        ptr = _ffi.requests_p()
        check(_ffi.lib().tokenrace_requests_new(ctypes.byref(ptr)))
        self._handle = _Handle(ptr, _free_requests)
        # The handle's address, as the batch's ``requests`` field takes it.
        self._address = ctypes.cast(ptr, ctypes.c_void_p).value

    def close(self):
        """Releases the state (at once, or when the draws using it return)."""
        self._handle = None

    def add(self, request_id, prompt, output=None, *, pad_id=None, **params):
        """Adds request ``request_id`` with its ``prompt`` and the ``output`` it has so far (1-D
        lists, numpy arrays or CPU/GPU tensors of token ids, converted to int32 here, once);
        entries equal to ``pad_id`` are dropped (vLLM pads its history rows with the vocab
        size). Refused when the id is live. ``params``, when given, are its sampling parameters
        (``set_params``); refused ones leave the request unadded."""
        request_id = _request_id(request_id)
        p = _tokens(prompt, "prompt", pad_id)
        o = _tokens(output if output is not None else (), "output", pad_id)
        c_params = _params_struct(**params) if params else None
        h = self._live_handle()
        check(_ffi.lib().tokenrace_requests_add(h.ptr, request_id, _int32_ptr(p), p.size, _int32_ptr(o), o.size))
        if c_params is not None:
            try:
                check(_ffi.lib().tokenrace_requests_set_params(h.ptr, request_id, ctypes.byref(c_params[0])))
            except Exception:
                # (After the error is read: the removal would replace the last error.)
                _ffi.lib().tokenrace_requests_remove(h.ptr, request_id)
                raise

    def set_params(self, request_id, **params):
        """Sets the sampling parameters of request ``request_id``, replacing any it had (none
        given: every one off). A draw that names the request takes each per-row parameter the
        call leaves None from them; the call's own argument, when given, is every row's.

        temperature (1.0), seed (None: unseeded; an int: the request's rows are seeded, at the
        call's ``offsets`` or else at the request's output length), top_k (0), top_p (1.0), min_p
        (0.0), top_n_sigma (0.0), min_keep (0), typical_p (1.0), repetition_penalty (1.0),
        frequency_penalty (0.0), presence_penalty (0.0), penalty_last_n (0), min_tokens (0),
        stop_token_ids (()), logit_bias (a dict ``{id: bias}``), allowed_tokens (None: every
        token; a list: the only ones it may draw), banned_tokens (()): each as ``Sampler.draw``
        defines it for one row. A refused value (``ValueError`` naming it, e.g. ``params.top_p:
        1.5 is not in (0, 1]``) changes nothing."""
        request_id = _request_id(request_id)
        c_params = _params_struct(**params)
        h = self._live_handle()
        check(_ffi.lib().tokenrace_requests_set_params(h.ptr, request_id, ctypes.byref(c_params[0])))

    def add_rows(self, request_ids, prompts, outputs=None, *, pad_id=None):
        """Adds one request per row of 2-D ``prompts`` (and ``outputs``), padded with ``pad_id``
        (vLLM's ``prompt_token_ids`` and ``output_token_ids`` tensors, padded with the vocab
        size), or of lists of per-request sequences. Stops at the first refused request: the
        ones before it stay added."""
        ids = _ids(request_ids, "request_ids")
        prompts = _as_numpy(prompts, "prompts") if is_torch_tensor(prompts) else prompts
        outputs = _as_numpy(outputs, "outputs") if is_torch_tensor(outputs) else outputs
        if len(prompts) != ids.size or (outputs is not None and len(outputs) != ids.size):
            raise ValueError(f"prompts/outputs: need one row per request id ({ids.size})")
        for i, request_id in enumerate(ids.tolist()):
            self.add(request_id, prompts[i], outputs[i] if outputs is not None else None, pad_id=pad_id)

    def remove(self, request_id):
        """Removes request ``request_id`` and frees its histories. Refused when it is not live."""
        request_id = _request_id(request_id)
        h = self._live_handle()
        check(_ffi.lib().tokenrace_requests_remove(h.ptr, request_id))

    def reset(self):
        """Removes every request."""
        h = self._live_handle()
        check(_ffi.lib().tokenrace_requests_reset(h.ptr))

    def append(self, request_ids, tokens, counts=None):
        """Appends new output tokens: ``tokens`` one id per request (a draw's tokens, a 1-D array
        or tensor), or one sequence per request (a verify call's accepted tokens, of any lengths).
        With ``counts``, ``tokens`` is 2-D, one row per request, and request i gets
        ``tokens[i, :counts[i]]`` (``Sampler.verify``'s ``tokens`` and ``counts`` as they are,
        read in place when int32 and C-contiguous). A request named twice gets both, in order; a
        refused call appends nothing."""
        if counts is not None:
            return self._append_strided(request_ids, tokens, counts)
        ids = _ids(request_ids, "request_ids")
        h = self._live_handle()
        if isinstance(tokens, (list, tuple)) and any(not isinstance(t, (int, np.integer)) for t in tokens):
            if len(tokens) != ids.size:
                raise ValueError(f"tokens: has {len(tokens)} lists, one per request id is {ids.size}")
            parts = [_tokens(t, f"tokens[{i}]") for i, t in enumerate(tokens)]
            flat = np.concatenate(parts) if parts else np.empty(0, np.int32)
            offsets = np.zeros(ids.size + 1, np.uint64)
            np.cumsum([p.size for p in parts], out=offsets[1:])
            status = _ffi.lib().tokenrace_requests_append(h.ptr, ids.size, _uint64_ptr(ids), _int32_ptr(flat),
                                                         _uint64_ptr(offsets))
        else:
            flat = _tokens(tokens, "tokens")
            if flat.size != ids.size:
                raise ValueError(f"tokens: has {flat.size} ids, one per request id is {ids.size}")
            status = _ffi.lib().tokenrace_requests_append(h.ptr, ids.size, _uint64_ptr(ids), _int32_ptr(flat), None)
        check(status)

    def _append_strided(self, request_ids, tokens, counts):
        ids = _ids(request_ids, "request_ids")
        rows = _as_numpy(tokens, "tokens")
        if rows.ndim != 2 or rows.shape[0] != ids.size:
            raise ValueError(f"tokens: must be 2-D with one row per request id ({ids.size}), got shape {rows.shape}")
        if rows.dtype.kind not in "iu":
            raise TypeError(f"tokens: token ids must be integers, got {rows.dtype}")
        rows = np.ascontiguousarray(rows, dtype=np.int32)
        n = _as_numpy(counts, "counts")
        if n.ndim != 1 or n.size != ids.size:
            raise ValueError(f"counts: must be 1-D with one count per request id ({ids.size})")
        if n.dtype.kind not in "iu":
            raise TypeError(f"counts: must be integers, got {n.dtype}")
        n = np.ascontiguousarray(n, dtype=np.int32)
        h = self._live_handle()
        check(_ffi.lib().tokenrace_requests_append_strided(h.ptr, ids.size, _uint64_ptr(ids), _int32_ptr(rows),
                                                           rows.shape[1], _int32_ptr(n)))

    def output_len(self, request_id):
        """How many output tokens request ``request_id`` holds (``KeyError`` when not live)."""
        request_id = _request_id(request_id)
        h = self._live_handle()
        n = ctypes.c_uint64()
        check(_ffi.lib().tokenrace_requests_output_len(h.ptr, request_id, ctypes.byref(n)))
        if n.value == _UINT64_MAX:
            raise KeyError(request_id)
        return n.value

    def __len__(self):
        h = self._live_handle()
        n = ctypes.c_uint64()
        check(_ffi.lib().tokenrace_requests_len(h.ptr, ctypes.byref(n)))
        return n.value

    def __contains__(self, request_id):
        try:
            self.output_len(request_id)
        except (KeyError, TypeError, ValueError):
            return False
        return True

    def __repr__(self):
        return "Requests(closed)" if self.closed else f"Requests({len(self)} requests)"


def pack_requests(batch, keep, requests, request_ids, rows, offset, layout):
    """Writes the batch's ``requests`` and ``request_ids`` fields at ``offset`` (``layout``: two
    addresses) for a draw that names requests; ``keep`` holds the state's handle and the ids for
    the call. One without the other is refused by the library, naming the missing field."""
    state_address = ids_address = 0
    if requests is not None:
        if not isinstance(requests, Requests):
            raise TypeError(f"requests: must be a tokenrace.Requests, got {type(requests).__name__}")
        keep.append(requests._live_handle())
        state_address = requests._address
    if request_ids is not None:
        ids = _ids(request_ids, "request_ids")
        if ids.size != rows:
            raise ValueError(f"request_ids: has {ids.size} ids, the batch has {rows} rows")
        keep.append(ids)
        ids_address = address(ids)
    layout.pack_into(batch, offset, state_address, ids_address)
