"""``Sampler.verify``: one ``tokenrace_verify`` call (speculative decoding), from the arrays a
Python caller holds to the versioned structs and back.

What is checked where: this module checks the shapes, dtypes and lengths of the arguments against
one another (so that the library is never handed a pointer shorter than the sizes say), and
raises ``ValueError``/``TypeError`` naming the argument before any call; it also refuses negative
draft ids other than -1 (vLLM's placeholder, which the library rejects where it stands) and
``offsets`` without ``seeds``. The library checks the values (draft ids below ``vocab``, q rows
that are probabilities summing to 1, uniforms in (0, 1), temperatures, filters) and its ``InvalidArgumentError`` names the C field, the request
and the position, e.g. ``batch.draft_tokens[4]: request 1, draft 2: 50 is not a token id in
[0, 50)``; where the field is not the argument's name, the argument is appended.

The target logits, the q rows and the noise are read in place (any row stride, values inside a
row contiguous), as ``Sampler.draw`` reads its logits; the draft ids, counts and uniforms are
passed without a copy when they are already contiguous int32 / float64 arrays.
"""

from __future__ import annotations

from ctypes import byref
from dataclasses import dataclass
from typing import Optional

import numpy as np

from . import _ffi
from ._arrays import LOGITS_DTYPES, NOISE_DTYPES, _ndim, float64_vector, int32_vector, per_row, rows_view
from ._call import (VERIFY_BATCH_LAYOUT, VERIFY_BATCH_SIZE, VERIFY_OUTPUT_LAYOUT, VERIFY_OUTPUT_SIZE,
                    VERIFY_STEP_LAYOUT, VERIFY_STEP_OFFSET, address)
from ._step import FIELD_ARGUMENTS as STEP_FIELD_ARGUMENTS
from ._step import bad_words_csr, bitmask_view, step_fields
from ._common import _choice, _offsets_without_seeds
from ._errors import InvalidArgumentError, UnsupportedError, check

_U32_MAX = 2**32 - 1

# vLLM's placeholder draft id (``PLACEHOLDER_TOKEN_ID``): a draft that is rejected where it stands.
PLACEHOLDER_TOKEN_ID = -1

# The C fields whose name is not the argument of ``Sampler.verify`` they come from.
_FIELD_ARGUMENTS = {
    "logits": "target_logits", "rows": "target_logits", "row_stride": "target_logits", "vocab": "target_logits",
    "dtype": "target_logits", "draft_probs_row_stride": "draft_probs", "noise_row_stride": "noise",
    **{field: argument for field, argument in STEP_FIELD_ARGUMENTS.items() if field not in ("penalty_last_n",)},
}

# The keyword arguments of ``Sampler.verify`` that make its sampling step, with their defaults.
STEP_ARGUMENTS = ("prompt_tokens", "output_tokens", "repetition_penalty", "frequency_penalty", "presence_penalty",
                  "logit_bias", "allowed_tokens", "banned_tokens", "token_bitmask", "bad_words", "min_tokens",
                  "stop_token_ids")


def _step_block(step, requests, rows, vocab, keep):
    """The 23 values of the verify batch's step block (``VERIFY_STEP_LAYOUT``), or None when no
    step argument is given. Lists and parameters are per request (``draw``'s forms, a request
    standing for a row); ``token_bitmask`` is per target row."""
    if all(step.get(name) is None for name in STEP_ARGUMENTS):
        return None
    f = step_fields(requests, vocab, keep, step.get("prompt_tokens"), step.get("output_tokens"),
                    step.get("repetition_penalty"), step.get("frequency_penalty"), step.get("presence_penalty"),
                    step.get("logit_bias"), step.get("allowed_tokens"), step.get("banned_tokens"), None,
                    min_tokens=step.get("min_tokens"), stop_token_ids=step.get("stop_token_ids"))
    (prompt_ids, prompt_offsets, output_ids, output_offsets, rep, freq, pres, bias_ids, bias_values, bias_offsets,
     allowed_ids, allowed_offsets, allowed_rows, banned_ids, banned_offsets, _mask, _stride, _last_n, min_n,
     stop_ids, stop_offsets) = f
    mask_ptr, mask_stride = bitmask_view(step.get("token_bitmask"), rows, vocab, "token_bitmask", keep)
    words = (0, 0, 0)
    if step.get("bad_words") is not None:
        arrays = bad_words_csr(step["bad_words"], requests)
        keep.extend(arrays)
        words = tuple(address(a) for a in arrays)
    return (prompt_ids, prompt_offsets, output_ids, output_offsets, rep, freq, pres, bias_ids, bias_values,
            bias_offsets, allowed_ids, allowed_offsets, allowed_rows, banned_ids, banned_offsets, mask_ptr,
            mask_stride, *words, min_n, stop_ids, stop_offsets)


@dataclass
class VerifyResult:
    """What ``Sampler.verify`` returns. Request i emitted ``counts[i]`` tokens (its accepted
    drafts, then one recovered or bonus token): ``tokens[i, :counts[i]]``; the rest of its row is
    -1 (vLLM's ``PLACEHOLDER_TOKEN_ID``)."""

    tokens: np.ndarray  # int32, requests x (max(draft_counts) + 1), -1 padded
    counts: np.ndarray  # int32 per request, in [1, draft_counts[i] + 1]
    flags: np.ndarray  # uint32 per request: the FLAG_* bits of every target row it looked at, or-ed
    logprobs: Optional[np.ndarray] = None  # float32 as tokens (NaN padded), with logprobs=True
    # int32 as tokens: the request-local index of each accepted draft node in path order, then -1
    accepted_nodes: Optional[np.ndarray] = None

    @property
    def accepted(self) -> np.ndarray:
        """The number of accepted drafts per request (``counts - 1``), int32."""
        return self.counts - 1


def _verify_function():
    lib = _ffi.lib()
    try:
        return lib.tokenrace_verify
    except AttributeError:
        raise UnsupportedError(f"Sampler.verify: the loaded library ({_ffi.library_path()}) has no tokenrace_verify; "
                               f"it predates tokenrace 0.2, use a newer build") from None


def _raise(status):
    """``check(status)``, naming the argument after the library's message when its C field has
    another name (``batch.logits`` comes from ``target_logits``)."""
    try:
        check(status)
    except InvalidArgumentError as e:
        message = str(e)
        for field, argument in _FIELD_ARGUMENTS.items():
            if f"batch.{field}[" in message or f"batch.{field}:" in message:
                raise InvalidArgumentError(f"{message} (argument {argument})") from None
        raise


def _per_request(value, requests, dtype, name, keep):
    if value is None:
        return 0
    arr = per_row(value, requests, dtype, name, unit="request")
    keep.append(arr)
    return address(arr)


def _parents(draft_parents, counts, drafts, keep):
    """The address of ``draft_parents`` as int32 (0: chains), its length checked; the library
    checks each parent (-1 or an earlier node of its request) and names the node."""
    if draft_parents is None:
        return 0
    parents = int32_vector(draft_parents, "draft_parents")
    if parents.size != drafts:
        raise ValueError(f"draft_parents: has {parents.size} values, draft_counts add up to {drafts} "
                         f"(one parent per draft node: -1 for a child of the root, else an earlier node)")
    keep.append(parents)
    return address(parents)


def verify(sampler, target_logits, draft_tokens, draft_counts, draft_probs, temperature, top_k, top_p, min_p,
           seeds, offsets, seeded, uniforms, noise, noise_kind, logprobs, logprob_mode, draft_parents=None,
           step=None):
    """The body of ``Sampler.verify`` (see its docstring)."""
    mode = _choice("logprob_mode", logprob_mode, _ffi.LOGPROB_MODE_NAMES)
    if not isinstance(logprobs, (bool, np.bool_)):
        raise TypeError(f"logprobs: must be a bool (whether to return each emitted token's logprob), "
                        f"got {type(logprobs).__name__}")
    kind = _choice("noise_kind", noise_kind, _ffi.NOISE_KIND_NAMES)
    fn = _verify_function()
    keep = []  # every array the structs point into, alive until the call returns

    counts = int32_vector(draft_counts, "draft_counts")
    if counts.size and counts.min() < 0:
        i = int(np.argmax(counts < 0))
        raise ValueError(f"draft_counts[{i}]: {counts[i]} is negative")
    requests = counts.size
    if requests > _U32_MAX:
        raise ValueError(f"draft_counts: {requests} requests exceed the 32-bit count of the C ABI")
    keep.append(counts)
    drafts = int(counts.sum(dtype=np.int64))
    rows = drafts + requests

    if _ndim(target_logits) != 2:
        raise ValueError(f"target_logits: must be 2-D (target rows x vocab), got {_ndim(target_logits)}-D; "
                         f"the rows are each request's draft positions, then its bonus position")
    view = rows_view(target_logits, "target_logits", LOGITS_DTYPES)
    keep.append(view.owner)
    vocab = view.vocab
    if view.rows != rows:
        raise ValueError(f"target_logits: has {view.rows} rows; draft_counts add up to {drafts} drafts, so the "
                         f"{requests} requests need {rows} (each request's draft positions, then its bonus row)")

    ids = int32_vector(draft_tokens, "draft_tokens")
    if ids.size != drafts:
        raise ValueError(f"draft_tokens: has {ids.size} ids, draft_counts add up to {drafts} "
                         f"(every request's drafts, one after the other)")
    if drafts and ids.min() < PLACEHOLDER_TOKEN_ID:
        # -1 is vLLM's placeholder draft (a padded or grammar-invalid position): the library
        # rejects the request's drafts there. Any other negative id is a caller's bug.
        i = int(np.argmax(ids < PLACEHOLDER_TOKEN_ID))
        request = int(np.searchsorted(np.cumsum(counts, dtype=np.int64), i, side="right"))
        first = i - int(counts[:request].sum(dtype=np.int64))
        raise ValueError(f"draft_tokens[{i}]: request {request}, draft {first}: {int(ids[i])} is not a token id; "
                         f"the only negative draft id is -1 (vLLM's PLACEHOLDER_TOKEN_ID: the draft is "
                         f"rejected at that position)")
    keep.append(ids)

    q_ptr = q_stride = 0
    if draft_probs is not None:
        if _ndim(draft_probs) != 2:
            raise ValueError(f"draft_probs: must be 2-D (one row of vocab probabilities per draft token), "
                             f"got {_ndim(draft_probs)}-D")
        qv = rows_view(draft_probs, "draft_probs", NOISE_DTYPES)
        if qv.rows != drafts or qv.vocab != vocab:
            raise ValueError(f"draft_probs: has shape ({qv.rows}, {qv.vocab}), the call needs ({drafts}, {vocab}): "
                             f"one row per draft token, as many values as the target logits")
        keep.append(qv.owner)
        q_ptr, q_stride = qv.ptr, qv.row_stride

    u_ptr = 0
    if uniforms is not None:
        u = float64_vector(uniforms, "uniforms")
        if u.size != drafts:
            raise ValueError(f"uniforms: has {u.size} values, draft_counts add up to {drafts} (one per draft token)")
        keep.append(u)
        u_ptr = address(u)

    noise_ptr = noise_stride = 0
    if noise is not None:
        nv = rows_view(noise, "noise", NOISE_DTYPES, broadcast_ok=True)
        if nv.vocab != vocab:
            raise ValueError(f"noise: has {nv.vocab} values per row, the target logits have {vocab}")
        if nv.ndim == 2 and nv.rows not in (1, rows):
            raise ValueError(f"noise: has {nv.rows} rows, the call has {rows} target rows (one noise row per "
                             f"target row, or 1 row, or a 1-D array, to use the same noise for every row)")
        keep.append(nv.owner)
        noise_ptr = nv.ptr
        noise_stride = 0 if nv.rows == 1 or nv.ndim == 1 else nv.row_stride

    if offsets is not None and seeds is None:
        _offsets_without_seeds("request")
    temperature = _per_request(temperature, requests, np.float32, "temperature", keep)
    top_k = _per_request(top_k, requests, np.int32, "top_k", keep)
    top_p = _per_request(top_p, requests, np.float32, "top_p", keep)
    min_p = _per_request(min_p, requests, np.float32, "min_p", keep)
    seeds = _per_request(seeds, requests, np.uint64, "seeds", keep)
    offsets = _per_request(offsets, requests, np.uint64, "offsets", keep)
    seeded = _per_request(seeded, requests, np.uint8, "seeded", keep)

    parents = _parents(draft_parents, counts, drafts, keep)
    block = _step_block(step or {}, requests, rows, vocab, keep)

    width = int(counts.max()) + 1 if requests else 1
    res = VerifyResult(
        np.empty((requests, width), dtype=np.int32),
        np.empty(requests, dtype=np.int32),
        np.zeros(requests, dtype=np.uint32),
        np.empty((requests, width), dtype=np.float32) if logprobs else None,
        np.empty((requests, width), dtype=np.int32),
    )
    batch = _ffi.tokenrace_verify_batch()
    VERIFY_BATCH_LAYOUT.pack_into(batch, 0, VERIFY_BATCH_SIZE, view.dtype, view.ptr, rows, vocab, view.row_stride,
                                  requests, 0, address(counts), address(ids), q_ptr, q_stride, temperature, top_k,
                                  top_p, min_p, seeds, offsets, seeded, u_ptr, noise_ptr, kind, 0, noise_stride,
                                  parents)
    if block is not None:
        VERIFY_STEP_LAYOUT.pack_into(batch, VERIFY_STEP_OFFSET, *block)
    out = _ffi.tokenrace_verify_output()
    VERIFY_OUTPUT_LAYOUT.pack_into(out, 0, VERIFY_OUTPUT_SIZE, mode, address(res.tokens), 0, address(res.counts),
                                   address(res.flags), address(res.logprobs) if logprobs else 0,
                                   address(res.accepted_nodes))
    h = sampler._live_handle()  # held for the call: a close() meanwhile cannot free the sampler
    status = fn(h.ptr, byref(batch), byref(out))
    if status:
        _raise(status)
    del h, keep
    return res
