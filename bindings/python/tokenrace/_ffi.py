"""The C ABI of ``libtokenrace``: constants, ``ctypes`` structs, library loading, signatures.

This module mirrors ``include/tokenrace.h`` exactly (``tests/python/test_abi.py`` checks every
size, offset and constant against the C compiler and the header). It is the only place that
loads the library and declares function signatures; the rest of the package calls ``lib()``.

To add a C function: append it to ``_SIGNATURES``. To grow a struct: append its fields at the
end, as the header does (``struct_size`` tells the library which fields the caller knows).
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import os
import sys
import threading
from ctypes import POINTER, Structure, c_char_p, c_double, c_float, c_int32, c_uint8, c_uint32, c_uint64, c_void_p

# ----------------------------------------------------------------------------------------------
# Constants (#define and enums of the header)

ABI_VERSION = 1
# The version of the header this binding was written against (tokenrace.version() is the loaded
# library's).
VERSION_MAJOR, VERSION_MINOR, VERSION_PATCH = 0, 2, 0

FLAG_HAS_NAN = 1
FLAG_HAS_POSINF = 2
FLAG_EMPTY = 4
FLAG_GREEDY = 8
FLAG_FORCED_BANNED = 16

# Bins of a tokenrace_shard_mass record (sharded top-p's cut).
SHARD_CUT_BINS = 64

# enum tokenrace_status
STATUS_OK = 0
STATUS_INVALID_ARGUMENT = 1
STATUS_INVALID_CONFIG = 2
STATUS_OUT_OF_MEMORY = 3
STATUS_INTERNAL = 4
STATUS_UNSUPPORTED = 5
STATUS_TIMEOUT = 6
STATUS_CLOSED = 7

# enum tokenrace_dtype
DTYPE_F32 = 0
DTYPE_BF16 = 1
DTYPE_F16 = 2

# enum tokenrace_noise_kind
NOISE_KIND_EXP = 0
NOISE_KIND_LOG_EXP = 1

# enum tokenrace_simd
SIMD_AUTO = 0
SIMD_SCALAR = 1
SIMD_PORTABLE = 2
SIMD_AVX2 = 3
SIMD_AVX512 = 4
SIMD_NEON = 5
SIMD_VXE2 = 6

# enum tokenrace_noise_source
NOISE_SOURCE_AUTO = 0
NOISE_SOURCE_INLINE = 1
NOISE_SOURCE_POOL = 2

# enum tokenrace_pool_policy
POOL_POLICY_INLINE = 0
POOL_POLICY_BLOCK = 1

# enum tokenrace_log_level
LOG_LEVEL_OFF = 0
LOG_LEVEL_ERROR = 1
LOG_LEVEL_WARN = 2
LOG_LEVEL_INFO = 3
LOG_LEVEL_DEBUG = 4
LOG_LEVEL_TRACE = 5

# enum tokenrace_logprob_mode
LOGPROB_MODE_RAW = 0
LOGPROB_MODE_PROCESSED = 1

# enum tokenrace_full_mode
FULL_MODE_RAW = 0
FULL_MODE_PROCESSED = 1
FULL_MODE_PROCESSED_LOGITS = 2

# enum tokenrace_filter_order
FILTER_ORDER_TEMPERATURE_FIRST = 0
FILTER_ORDER_FILTERS_FIRST = 1

# enum tokenrace_stage (ids 8 and 9 are kept for DRY and mirostat: the library refuses them
# with their names until it has them)
STAGE_TOP_K = 1
STAGE_TOP_P = 2
STAGE_MIN_P = 3
STAGE_TYPICAL = 4
STAGE_XTC = 5
STAGE_TOP_N_SIGMA = 6
STAGE_TEMPERATURE = 7
STAGE_IDS = {"top_k": STAGE_TOP_K, "top_p": STAGE_TOP_P, "min_p": STAGE_MIN_P, "typical": STAGE_TYPICAL,
             "xtc": STAGE_XTC, "top_n_sigma": STAGE_TOP_N_SIGMA, "temperature": STAGE_TEMPERATURE,
             "dry": 8, "mirostat": 9}

# Python spellings of the enums that the binding accepts as strings.
SIMD_NAMES = {"auto": SIMD_AUTO, "scalar": SIMD_SCALAR, "portable": SIMD_PORTABLE,
              "avx2": SIMD_AVX2, "avx512": SIMD_AVX512, "neon": SIMD_NEON, "vxe2": SIMD_VXE2}
NOISE_SOURCE_NAMES = {"auto": NOISE_SOURCE_AUTO, "inline": NOISE_SOURCE_INLINE, "pool": NOISE_SOURCE_POOL}
NOISE_KIND_NAMES = {"exp": NOISE_KIND_EXP, "log_exp": NOISE_KIND_LOG_EXP}
LOG_LEVEL_NAMES = {"off": LOG_LEVEL_OFF, "error": LOG_LEVEL_ERROR, "warn": LOG_LEVEL_WARN,
                   "info": LOG_LEVEL_INFO, "debug": LOG_LEVEL_DEBUG, "trace": LOG_LEVEL_TRACE}
LOGPROB_MODE_NAMES = {"raw": LOGPROB_MODE_RAW, "processed": LOGPROB_MODE_PROCESSED}
POOL_POLICY_NAMES = {"inline": POOL_POLICY_INLINE, "block": POOL_POLICY_BLOCK}
FULL_MODE_NAMES = {"raw": FULL_MODE_RAW, "processed": FULL_MODE_PROCESSED,
                   "processed_logits": FULL_MODE_PROCESSED_LOGITS}
FILTER_ORDER_NAMES = {"temperature_first": FILTER_ORDER_TEMPERATURE_FIRST,
                      "filters_first": FILTER_ORDER_FILTERS_FIRST}

# ----------------------------------------------------------------------------------------------
# Structs


class _Versioned(Structure):
    """A struct whose first field is ``struct_size``; a new instance is zeroed with it set."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.struct_size = ctypes.sizeof(type(self))

    def as_dict(self):
        return {name: getattr(self, name) for name, _ in self._fields_}


class tokenrace_config(_Versioned):
    _fields_ = [
        ("struct_size", c_uint32),
        ("vocab_size", c_uint32),
        ("max_rows", c_uint32),
        ("threads", c_uint32),
        ("seed", c_uint64),
        ("has_seed", c_uint32),
        ("simd", c_uint32),
        ("greedy_below", c_float),
        ("log_level", c_uint32),
        ("noise", c_uint32),
        ("pool_rows", c_uint32),
        # since 0.2
        ("filter_order", c_uint32),
        ("reserved1", c_uint32),
    ]


class tokenrace_sampler_stats(_Versioned):
    _fields_ = [
        ("struct_size", c_uint32),
        ("reserved0", c_uint32),
        ("calls", c_uint64),
        ("rejected_calls", c_uint64),
        ("greedy_rows", c_uint64),
        ("seeded_rows", c_uint64),
        ("inline_rows", c_uint64),
        ("external_noise_rows", c_uint64),
        ("pool_rows", c_uint64),
        ("nonfinite_rows", c_uint64),
    ]


class tokenrace_batch(_Versioned):
    _fields_ = [
        ("struct_size", c_uint32),
        ("dtype", c_uint32),
        ("logits", c_void_p),
        ("rows", c_uint32),
        ("vocab", c_uint32),
        ("row_stride", c_uint64),
        ("temperature", POINTER(c_float)),
        ("seeds", POINTER(c_uint64)),
        ("offsets", POINTER(c_uint64)),
        ("seeded", POINTER(c_uint8)),
        ("noise", POINTER(c_float)),
        ("noise_kind", c_uint32),
        ("reserved0", c_uint32),
        ("noise_row_stride", c_uint64),
        ("top_k", POINTER(c_int32)),
        ("top_p", POINTER(c_float)),
        ("min_p", POINTER(c_float)),
        # since 0.2: the rest of the sampling step (``_call.STEP_LAYOUT``)
        ("prompt_ids", POINTER(c_int32)),
        ("prompt_offsets", POINTER(c_uint64)),
        ("output_ids", POINTER(c_int32)),
        ("output_offsets", POINTER(c_uint64)),
        ("repetition_penalty", POINTER(c_float)),
        ("frequency_penalty", POINTER(c_float)),
        ("presence_penalty", POINTER(c_float)),
        ("bias_ids", POINTER(c_int32)),
        ("bias_values", POINTER(c_float)),
        ("bias_offsets", POINTER(c_uint64)),
        ("allowed_ids", POINTER(c_int32)),
        ("allowed_offsets", POINTER(c_uint64)),
        ("allowed_rows", POINTER(c_uint8)),
        ("banned_ids", POINTER(c_int32)),
        ("banned_offsets", POINTER(c_uint64)),
        ("token_bitmask", POINTER(c_int32)),
        ("bitmask_row_stride", c_uint64),
        # added after 0.2.0: the penalty window (part of ``_call.STEP_LAYOUT``)
        ("penalty_last_n", POINTER(c_int32)),
        # added after 0.2.0: min_tokens
        ("min_tokens", POINTER(c_int32)),
        ("stop_ids", POINTER(c_int32)),
        ("stop_offsets", POINTER(c_uint64)),
        # added after 0.2.0: llama.cpp's top-nσ (``_call.TOP_N_SIGMA_OFFSET``)
        ("top_n_sigma", POINTER(c_float)),
        # added after 0.2.0: the request state (``_call.REQUESTS_OFFSET``)
        ("requests", ctypes.c_void_p),
        ("request_ids", POINTER(c_uint64)),
        # added after 0.2.0: llama.cpp's min_keep, typical sampling, XTC and dynamic temperature
        # (``_call.LLAMA_LAYOUT``)
        ("min_keep", POINTER(c_int32)),
        ("typical_p", POINTER(c_float)),
        ("xtc_probability", POINTER(c_float)),
        ("xtc_threshold", POINTER(c_float)),
        ("dynatemp_range", POINTER(c_float)),
        ("dynatemp_exponent", POINTER(c_float)),
        # added after 0.2.0: multi-token bad words and forced tokens (``_call.PARITY_LAYOUT``)
        ("bad_words_ids", POINTER(c_int32)),
        ("bad_word_offsets", POINTER(c_uint64)),
        ("bad_words_row_offsets", POINTER(c_uint64)),
        ("forced_tokens", POINTER(c_int32)),
        ("logprob_token_ids", POINTER(c_int32)),
        ("logprob_token_offsets", POINTER(c_uint64)),
        # added after 0.2.0: the caller's order of the filter stages (``_call.ORDER_LAYOUT``)
        ("order", POINTER(c_uint32)),
        ("order_len", c_uint64),
        # added after 0.2.0: llama.cpp's DRY (``_call.DRY_LAYOUT``)
        ("dry_multiplier", POINTER(c_float)),
        ("dry_base", POINTER(c_float)),
        ("dry_allowed_length", POINTER(c_int32)),
        ("dry_penalty_last_n", POINTER(c_int32)),
        ("dry_breaker_ids", POINTER(c_int32)),
        ("dry_breaker_offsets", POINTER(c_uint64)),
        ("dry_breakers_row_offsets", POINTER(c_uint64)),
        # added after 0.2.0: the logits row of each row (several outputs from one logits row)
        ("row_index", POINTER(c_int32)),
        # added after 0.2.0: llama.cpp's mirostat (``_call.MIROSTAT_LAYOUT``)
        ("mirostat", POINTER(c_int32)),
        ("mirostat_tau", POINTER(c_float)),
        ("mirostat_eta", POINTER(c_float)),
        ("mirostat_m", POINTER(c_int32)),
        ("mirostat_mu", POINTER(c_float)),
        # added after 0.2.0: a draw appends its tokens to the rows' requests (``_call.APPEND_OFFSET``)
        ("append_to_requests", c_uint32),
        ("reserved1", c_uint32),
    ]


class tokenrace_request_params(_Versioned):
    """A request's sampling parameters (``Requests.set_params``)."""
    _fields_ = [
        ("struct_size", c_uint32),
        ("temperature", c_float),
        ("seed", c_uint64),
        ("has_seed", c_uint32),
        ("top_k", c_int32),
        ("top_p", c_float),
        ("min_p", c_float),
        ("top_n_sigma", c_float),
        ("min_keep", c_int32),
        ("typical_p", c_float),
        ("repetition_penalty", c_float),
        ("frequency_penalty", c_float),
        ("presence_penalty", c_float),
        ("penalty_last_n", c_int32),
        ("min_tokens", c_int32),
        ("stop_ids", POINTER(c_int32)),
        ("stop_len", c_uint64),
        ("bias_ids", POINTER(c_int32)),
        ("bias_values", POINTER(c_float)),
        ("bias_len", c_uint64),
        ("allowed_ids", POINTER(c_int32)),
        ("allowed_len", c_uint64),
        ("banned_ids", POINTER(c_int32)),
        ("banned_len", c_uint64),
    ]


class tokenrace_output(_Versioned):
    _fields_ = [
        ("struct_size", c_uint32),
        ("logprob_mode", c_uint32),
        ("tokens", POINTER(c_int32)),
        ("flags", POINTER(c_uint32)),
        ("logprobs", POINTER(c_float)),
        ("ranks", POINTER(c_int32)),
        ("top_n", c_uint32),
        ("reserved0", c_uint32),
        ("topn_ids", POINTER(c_int32)),
        ("topn_logprobs", POINTER(c_float)),
        # since 0.2 (``FULL_FIELDS``)
        ("full_logprobs", POINTER(c_float)),
        ("full_row_stride", c_uint64),
        ("full_mode", c_uint32),
        ("reserved1", c_uint32),
        # added after 0.2.0: the logprobs of given ids (``_call.GIVEN_LAYOUT``)
        ("token_logprobs", POINTER(c_float)),
        ("token_ranks", POINTER(c_int32)),
        # added after 0.2.0: the kept set of each row (``_call.KEPT_LAYOUT``)
        ("kept_threshold", POINTER(c_float)),
        ("kept_count", POINTER(c_int32)),
        ("kept_mass", POINTER(c_double)),
        ("kept_bitmask", POINTER(c_int32)),
        # added after 0.2.0: mirostat's mu after the draw (``_call.MIROSTAT_OUT_OFFSET``)
        ("mirostat_mu", POINTER(c_float)),
    ]


# The first field of the batch's sampling-step part and of the output's full-vocabulary part: the
# binding packs these tails apart from the fields before them (``_call.py``).
BATCH_STEP_FIRST = "prompt_ids"
# The first field after the sampling step's part (the step's layout stops there).
BATCH_STEP_END = "top_n_sigma"
# The first of llama.cpp's filters' block (min_keep, typical_p, xtc_probability, xtc_threshold,
# dynatemp_range, dynatemp_exponent).
BATCH_LLAMA_FIRST = "min_keep"
OUTPUT_FULL_FIRST = "full_logprobs"
# The first field after the full-vocabulary part: the logprobs of given ids, packed apart.
OUTPUT_GIVEN_FIRST = "token_logprobs"
# The first field of the kept-set outputs, packed apart.
OUTPUT_KEPT_FIRST = "kept_threshold"
# The first field of the batch's parity block (bad words, forced tokens), packed apart.
BATCH_PARITY_FIRST = "bad_words_ids"
# The first field of the batch's order block (order, order_len), packed apart.
BATCH_ORDER_FIRST = "order"
# The first field of the batch's DRY block, packed apart.
BATCH_DRY_FIRST = "dry_multiplier"
# The first field of the batch's mirostat block, packed apart.
BATCH_MIROSTAT_FIRST = "mirostat"
# The output's mirostat mu, packed apart.
OUTPUT_MIROSTAT_FIRST = "mirostat_mu"
# The batch's flag that appends a draw's tokens to its requests, packed with the request state.
BATCH_APPEND_FIRST = "append_to_requests"


class tokenrace_pool_config(_Versioned):
    _fields_ = [
        ("struct_size", c_uint32),
        ("rows", c_uint32),
        ("vocab", c_uint32),
        ("kind", c_uint32),
        ("threads", c_uint32),
        ("has_seed", c_uint32),
        ("seed", c_uint64),
        ("policy", c_uint32),
        ("reserved0", c_uint32),
        ("timeout_ms", c_uint64),
    ]


class tokenrace_pool_lease(_Versioned):
    _fields_ = [
        ("struct_size", c_uint32),
        ("kind", c_uint32),
        ("values", POINTER(c_float)),
        ("rows", c_uint32),
        ("vocab", c_uint32),
        ("id", c_uint64),
        ("first_seq", c_uint64),
        ("in_ring", c_uint32),
        ("reserved0", c_uint32),
    ]


class tokenrace_pool_stats(_Versioned):
    _fields_ = [
        ("struct_size", c_uint32),
        ("reserved0", c_uint32),
        ("rows_produced", c_uint64),
        ("rows_borrowed", c_uint64),
        ("borrows_waited", c_uint64),
        ("wait_ns", c_uint64),
        ("inline_rows", c_uint64),
        ("rows_skipped", c_uint64),
    ]


class tokenrace_verify_batch(_Versioned):
    """One ``tokenrace_verify()`` call's inputs (speculative decoding, since 0.2)."""

    _fields_ = [
        ("struct_size", c_uint32),
        ("dtype", c_uint32),
        ("logits", c_void_p),
        ("rows", c_uint32),
        ("vocab", c_uint32),
        ("row_stride", c_uint64),
        ("requests", c_uint32),
        ("reserved0", c_uint32),
        ("draft_counts", POINTER(c_int32)),
        ("draft_tokens", POINTER(c_int32)),
        ("draft_probs", POINTER(c_float)),
        ("draft_probs_row_stride", c_uint64),
        ("temperature", POINTER(c_float)),
        ("top_k", POINTER(c_int32)),
        ("top_p", POINTER(c_float)),
        ("min_p", POINTER(c_float)),
        ("seeds", POINTER(c_uint64)),
        ("offsets", POINTER(c_uint64)),
        ("seeded", POINTER(c_uint8)),
        ("uniforms", POINTER(c_double)),
        ("noise", POINTER(c_float)),
        ("noise_kind", c_uint32),
        ("reserved1", c_uint32),
        ("noise_row_stride", c_uint64),
        ("draft_parents", POINTER(c_int32)),
        # The sampling step inside verification (since 0.3): per-request lists and parameters,
        # a bitmask row per target row.
        ("prompt_ids", POINTER(c_int32)),
        ("prompt_offsets", POINTER(c_uint64)),
        ("output_ids", POINTER(c_int32)),
        ("output_offsets", POINTER(c_uint64)),
        ("repetition_penalty", POINTER(c_float)),
        ("frequency_penalty", POINTER(c_float)),
        ("presence_penalty", POINTER(c_float)),
        ("bias_ids", POINTER(c_int32)),
        ("bias_values", POINTER(c_float)),
        ("bias_offsets", POINTER(c_uint64)),
        ("allowed_ids", POINTER(c_int32)),
        ("allowed_offsets", POINTER(c_uint64)),
        ("allowed_rows", POINTER(c_uint8)),
        ("banned_ids", POINTER(c_int32)),
        ("banned_offsets", POINTER(c_uint64)),
        ("token_bitmask", POINTER(c_int32)),
        ("bitmask_row_stride", c_uint64),
        ("bad_words_ids", POINTER(c_int32)),
        ("bad_word_offsets", POINTER(c_uint64)),
        ("bad_words_row_offsets", POINTER(c_uint64)),
        ("min_tokens", POINTER(c_int32)),
        ("stop_ids", POINTER(c_int32)),
        ("stop_offsets", POINTER(c_uint64)),
    ]


class tokenrace_verify_output(_Versioned):
    """Where ``tokenrace_verify()`` writes."""

    _fields_ = [
        ("struct_size", c_uint32),
        ("logprob_mode", c_uint32),
        ("tokens", POINTER(c_int32)),
        ("tokens_stride", c_uint64),
        ("counts", POINTER(c_int32)),
        ("flags", POINTER(c_uint32)),
        ("logprobs", POINTER(c_float)),
        ("accepted_nodes", POINTER(c_int32)),
    ]


class tokenrace_shard_rows(_Versioned):
    _fields_ = [
        ("struct_size", c_uint32), ("reserved0", c_uint32), ("logits", POINTER(c_float)), ("rows", ctypes.c_size_t),
        ("row_stride", ctypes.c_size_t), ("vocab_start", ctypes.c_size_t), ("slice_len", ctypes.c_size_t), ("vocab_size", ctypes.c_size_t),
        ("temperature", POINTER(c_float)), ("seeds", POINTER(c_uint64)), ("offsets", POINTER(c_uint64)),
        ("seeded", POINTER(c_uint8)), ("min_p", POINTER(c_float)), ("top_k", POINTER(c_int32)),
        ("top_p", POINTER(c_float)),
        # The sampling step of the whole rows (global ids), applied by each rank to its slice:
        # tokenrace_batch's fields of the same names (packed by _shard.py's SHARD_STEP_LAYOUT).
        ("prompt_ids", POINTER(c_int32)), ("prompt_offsets", POINTER(c_uint64)), ("output_ids", POINTER(c_int32)),
        ("output_offsets", POINTER(c_uint64)), ("repetition_penalty", POINTER(c_float)),
        ("frequency_penalty", POINTER(c_float)), ("presence_penalty", POINTER(c_float)),
        ("bias_ids", POINTER(c_int32)), ("bias_values", POINTER(c_float)), ("bias_offsets", POINTER(c_uint64)),
        ("allowed_ids", POINTER(c_int32)), ("allowed_offsets", POINTER(c_uint64)), ("allowed_rows", POINTER(c_uint8)),
        ("banned_ids", POINTER(c_int32)), ("banned_offsets", POINTER(c_uint64)), ("token_bitmask", POINTER(c_int32)),
        ("bitmask_row_stride", c_uint64), ("penalty_last_n", POINTER(c_int32)), ("min_tokens", POINTER(c_int32)),
        ("stop_ids", POINTER(c_int32)), ("stop_offsets", POINTER(c_uint64)), ("bad_words_ids", POINTER(c_int32)),
        ("bad_word_offsets", POINTER(c_uint64)), ("bad_words_row_offsets", POINTER(c_uint64)),
        ("dry_multiplier", POINTER(c_float)), ("dry_base", POINTER(c_float)), ("dry_allowed_length", POINTER(c_int32)),
        ("dry_penalty_last_n", POINTER(c_int32)), ("dry_breaker_ids", POINTER(c_int32)),
        ("dry_breaker_offsets", POINTER(c_uint64)), ("dry_breakers_row_offsets", POINTER(c_uint64)),
    ]


# The first field of the shard rows' step block.
SHARD_STEP_FIRST = "prompt_ids"


class tokenrace_shard_partial(Structure):
    """A record moved between ranks as bytes: no struct_size."""
    _fields_ = [
        ("value", c_float), ("token", c_int32), ("flags", c_uint32), ("round", c_uint32), ("fingerprint", c_uint32),
        ("vocab_start", c_uint32), ("slice_len", c_uint32), ("vocab_size", c_uint32), ("key", c_uint64),
    ]


class tokenrace_shard_row(Structure):
    """A record every rank computes from the gathered partials: no struct_size."""
    _fields_ = [("top", c_float), ("token", c_int32), ("flags", c_uint32), ("fingerprint", c_uint32), ("key", c_uint64)]


class tokenrace_shard_cut(Structure):
    """A row's filter floor in a sharded call, the same on every rank: no struct_size."""
    _fields_ = [("floor", c_float), ("lo", c_float), ("hi", c_float), ("top_p", c_float), ("m", c_float),
                ("inv_t", c_float), ("phase", c_uint32), ("step", c_uint32), ("fingerprint", c_uint32),
                ("row", c_uint32), ("above", ctypes.c_double), ("z", ctypes.c_double)]


class tokenrace_shard_logprob_partial(Structure):
    """One rank's part of a row's logprobs, moved between ranks as bytes: no struct_size."""
    _fields_ = [("head", tokenrace_shard_partial), ("z", ctypes.c_double), ("s", c_float), ("floor", c_float),
                ("posinf", c_uint32), ("reserved", c_uint32)]


class tokenrace_shard_top_entry(Structure):
    """A top-n candidate of a rank: no struct_size."""
    _fields_ = [("value", c_float), ("token", c_int32)]


class tokenrace_shard_mass(Structure):
    """A record of a round of the cut, moved between ranks as bytes: no struct_size."""
    _fields_ = [("head", tokenrace_shard_partial), ("mass", ctypes.c_double * 64), ("count", c_uint32 * 64),
                ("low", c_float * 64), ("high", c_float * 64)]


class tokenrace_sampler(Structure):
    """Opaque; only ever handled through a pointer."""


class tokenrace_pool(Structure):
    """Opaque; only ever handled through a pointer."""


class tokenrace_requests(Structure):
    """Opaque; only ever handled through a pointer."""


sampler_p = POINTER(tokenrace_sampler)
pool_p = POINTER(tokenrace_pool)
requests_p = POINTER(tokenrace_requests)

class tokenrace_greedy_batch(_Versioned):
    """The rows of ``tokenrace_draw_greedy`` (the plain greedy draw, ``_greedy.py``)."""
    _fields_ = [("struct_size", c_uint32), ("dtype", c_uint32), ("logits", c_void_p), ("rows", c_uint32),
                ("vocab", c_uint32), ("row_stride", c_uint64)]


# Every struct of the header, by its C name (the ABI test walks this).
STRUCTS = {cls.__name__: cls for cls in (tokenrace_config, tokenrace_sampler_stats,
                                         tokenrace_batch, tokenrace_output, tokenrace_pool_config,
                                         tokenrace_pool_lease, tokenrace_pool_stats, tokenrace_verify_batch,
                                         tokenrace_verify_output, tokenrace_shard_rows, tokenrace_shard_partial,
                                         tokenrace_shard_row, tokenrace_shard_cut, tokenrace_shard_mass,
                                         tokenrace_shard_logprob_partial, tokenrace_shard_top_entry,
                                         tokenrace_request_params, tokenrace_greedy_batch)}

# ----------------------------------------------------------------------------------------------
# Functions: name -> (restype, argtypes). ``status`` marks functions returning tokenrace_status.

status = ctypes.c_int  # a C enum is an int

_SIGNATURES = {
    "tokenrace_abi_version": (c_uint32, []),
    "tokenrace_version": (c_char_p, []),
    "tokenrace_last_error": (c_char_p, []),
    "tokenrace_simd_level": (c_char_p, []),
    "tokenrace_config_default": (tokenrace_config, []),
    "tokenrace_config_from_env": (status, [POINTER(tokenrace_config)]),
    "tokenrace_sampler_new": (status, [POINTER(tokenrace_config), POINTER(sampler_p)]),
    "tokenrace_sampler_free": (None, [sampler_p]),
    "tokenrace_sampler_simd_level": (c_char_p, [sampler_p]),
    "tokenrace_sampler_get_stats": (status, [sampler_p, POINTER(tokenrace_sampler_stats)]),
    "tokenrace_draw": (status, [sampler_p, POINTER(tokenrace_batch), POINTER(tokenrace_output)]),
    "tokenrace_score": (status, [sampler_p, POINTER(tokenrace_batch), POINTER(c_int32), POINTER(tokenrace_output)]),
    "tokenrace_draw_greedy": (status, [sampler_p, POINTER(tokenrace_greedy_batch), POINTER(c_int32),
                                       POINTER(c_uint32)]),
    "tokenrace_pool_config_default": (tokenrace_pool_config, []),
    "tokenrace_pool_config_from_env": (status, [POINTER(tokenrace_pool_config)]),
    "tokenrace_pool_new": (status, [POINTER(tokenrace_pool_config), POINTER(pool_p)]),
    "tokenrace_pool_free": (None, [pool_p]),
    "tokenrace_pool_shutdown": (status, [pool_p]),
    "tokenrace_pool_borrow": (status, [pool_p, c_uint32, POINTER(tokenrace_pool_lease)]),
    "tokenrace_pool_release": (status, [pool_p, POINTER(tokenrace_pool_lease)]),
    "tokenrace_pool_get_stats": (status, [pool_p, POINTER(tokenrace_pool_stats)]),
    "tokenrace_sampler_attach_pool": (status, [sampler_p, pool_p]),
    "tokenrace_verify": (status, [sampler_p, POINTER(tokenrace_verify_batch), POINTER(tokenrace_verify_output)]),
    "tokenrace_set_log_callback": (None, [ctypes.c_void_p, ctypes.c_void_p]),
    "tokenrace_watermark_seeds": (status, [c_uint32, POINTER(c_uint64), c_uint32, POINTER(c_int32),
                                           POINTER(c_uint64), POINTER(c_int32), POINTER(c_uint64),
                                           POINTER(c_uint64)]),
    "tokenrace_watermark_verify_seeds": (status, [c_uint32, POINTER(c_uint64), c_uint32, POINTER(c_int32),
                                                  POINTER(c_uint64), POINTER(c_int32), POINTER(c_uint64),
                                                  POINTER(c_int32), POINTER(c_int32), POINTER(c_uint64)]),
    "tokenrace_watermark_detect": (status, [c_uint64, c_uint32, POINTER(c_int32), c_uint64, POINTER(c_int32),
                                            c_uint64, POINTER(ctypes.c_double), POINTER(c_uint64),
                                            POINTER(ctypes.c_double)]),
    "tokenrace_requests_new": (status, [POINTER(requests_p)]),
    "tokenrace_requests_free": (None, [requests_p]),
    "tokenrace_requests_add": (status, [requests_p, c_uint64, POINTER(c_int32), c_uint64, POINTER(c_int32),
                                        c_uint64]),
    "tokenrace_requests_remove": (status, [requests_p, c_uint64]),
    "tokenrace_requests_reset": (status, [requests_p]),
    "tokenrace_requests_append": (status, [requests_p, c_uint64, POINTER(c_uint64), POINTER(c_int32),
                                           POINTER(c_uint64)]),
    "tokenrace_requests_append_strided": (status, [requests_p, c_uint64, POINTER(c_uint64), POINTER(c_int32),
                                                   c_uint64, POINTER(c_int32)]),
    "tokenrace_requests_len": (status, [requests_p, POINTER(c_uint64)]),
    "tokenrace_requests_output_len": (status, [requests_p, c_uint64, POINTER(c_uint64)]),
    "tokenrace_request_params_default": (tokenrace_request_params, []),
    "tokenrace_requests_set_params": (status, [requests_p, c_uint64, POINTER(tokenrace_request_params)]),
    "tokenrace_shard_top": (status, [sampler_p, POINTER(tokenrace_shard_rows), POINTER(tokenrace_shard_partial)]),
    "tokenrace_shard_combine_top": (status, [POINTER(tokenrace_shard_partial), c_uint32, c_uint32,
                                             POINTER(tokenrace_shard_row)]),
    "tokenrace_shard_race": (status, [sampler_p, POINTER(tokenrace_shard_rows), POINTER(tokenrace_shard_row),
                                      POINTER(tokenrace_shard_partial)]),
    "tokenrace_shard_finish": (status, [POINTER(tokenrace_shard_row), c_uint32, POINTER(tokenrace_shard_partial),
                                        c_uint32, POINTER(c_int32), POINTER(c_uint32)]),
    "tokenrace_shard_top_k_candidates": (status, [POINTER(tokenrace_shard_rows), c_uint32, POINTER(c_float)]),
    "tokenrace_shard_cut_start": (status, [sampler_p, POINTER(tokenrace_shard_rows), POINTER(tokenrace_shard_row),
                                           POINTER(c_float), c_uint32, c_uint32, POINTER(tokenrace_shard_cut)]),
    "tokenrace_shard_cut_pending": (status, [POINTER(tokenrace_shard_cut), c_uint32, POINTER(c_uint32)]),
    "tokenrace_shard_cut_round": (status, [sampler_p, POINTER(tokenrace_shard_rows), POINTER(tokenrace_shard_cut),
                                           POINTER(tokenrace_shard_mass)]),
    "tokenrace_shard_cut_advance": (status, [POINTER(tokenrace_shard_cut), c_uint32, POINTER(tokenrace_shard_mass),
                                             c_uint32]),
    "tokenrace_shard_race_cut": (status, [sampler_p, POINTER(tokenrace_shard_rows), POINTER(tokenrace_shard_row),
                                          POINTER(tokenrace_shard_cut), POINTER(tokenrace_shard_partial)]),
    "tokenrace_shard_logprob_partials": (status, [sampler_p, POINTER(tokenrace_shard_rows), POINTER(tokenrace_shard_row),
                                                  POINTER(tokenrace_shard_cut), POINTER(tokenrace_shard_partial),
                                                  c_uint32, c_uint32, POINTER(tokenrace_shard_logprob_partial),
                                                  POINTER(tokenrace_shard_top_entry)]),
    "tokenrace_shard_logprobs": (status, [POINTER(tokenrace_shard_row), c_uint32, POINTER(c_int32),
                                          POINTER(tokenrace_shard_logprob_partial), POINTER(tokenrace_shard_top_entry),
                                          c_uint32, c_uint32, c_uint32, POINTER(c_float), POINTER(c_int32),
                                          POINTER(c_float)]),
}

# ----------------------------------------------------------------------------------------------
# Logging: the library's messages go to logging.getLogger("tokenrace") (a message of the native
# module ``tokenrace::sampler`` to the logger "tokenrace.sampler"), so that ``logging``'s
# configuration shows, silences or captures them. TOKENRACE_LOG_LEVEL says which messages the
# library produces (default: warnings); with no handler configured, Python's last resort prints
# warnings and errors to stderr, as the library would.

LOG_CALLBACK = ctypes.CFUNCTYPE(None, c_uint32, c_char_p, c_char_p, ctypes.c_void_p)
_LEVELS = {1: logging.ERROR, 2: logging.WARNING, 3: logging.INFO, 4: logging.DEBUG, 5: logging.DEBUG - 5}


def _route_log(level, target, message, _user_data):
    try:
        name = (target or b"tokenrace").decode(errors="replace").replace("::", ".")
        logging.getLogger(name).log(_LEVELS.get(level, logging.WARNING), "%s",
                                    (message or b"").decode(errors="replace"))
    except Exception:  # noqa: BLE001 - nothing may propagate into the library's thread
        pass


# Kept alive for as long as the library may call it (the process).
_log_trampoline = LOG_CALLBACK(_route_log)


def _unroute_log(handle):
    # At exit, before the interpreter goes: a library thread logging later writes to stderr.
    try:
        handle.tokenrace_set_log_callback(None, None)
    except Exception:  # noqa: BLE001
        pass

# ----------------------------------------------------------------------------------------------
# Loading


def library_filename() -> str:
    if sys.platform == "darwin":
        return "libtokenrace.dylib"
    if sys.platform == "win32":
        return "tokenrace.dll"
    return "libtokenrace.so"


def bundled_paths(here) -> list:
    """The library shipped inside the package: the wheels and ``pip install .`` put it beside
    this file as ``libtokenrace.so`` (it has no Python ABI, so no ABI tag in its name); an older
    ``pip install .`` named it as setuptools-rust names an extension module
    (``libtokenrace.cpython-311-x86_64-linux-gnu.so`` and the like), which is looked for next."""
    name = library_filename()
    stem, ext = os.path.splitext(name)
    try:
        entries = sorted(os.listdir(here))
    except OSError:
        entries = []
    suffixed = [e for e in entries if e.startswith(stem + ".") and e.endswith(ext) and e != name]
    return [os.path.join(here, e) for e in [name] + suffixed]


def candidate_paths() -> list:
    """Where the library is looked for, in order (``TOKENRACE_LIBRARY`` is handled apart): the
    bundled file, then, for a package used from its source checkout, the crate's build
    directories (``CARGO_TARGET_DIR`` first, if set)."""
    name = library_filename()
    here = os.path.dirname(os.path.abspath(__file__))
    paths = bundled_paths(here)
    repo = os.path.normpath(os.path.join(here, "..", "..", ".."))
    if not os.path.isfile(os.path.join(repo, "Cargo.toml")):
        return paths
    target_dirs = []
    env_target = os.environ.get("CARGO_TARGET_DIR")
    if env_target:
        target_dirs.append(os.path.abspath(env_target))
    target_dirs.append(os.path.join(repo, "target"))
    for profile in ("release", "debug"):
        for t in target_dirs:
            p = os.path.join(t, profile, name)
            if p not in paths:
                paths.append(p)
    return paths


# Functions added since 0.1: a library without them still loads (same ABI version), and the
# binding's calls that need one raise UnsupportedError naming it (``Sampler.verify``); without
# tokenrace_set_log_callback, messages stay on stderr.
SINCE_0_2 = frozenset({"tokenrace_verify", "tokenrace_set_log_callback", "tokenrace_watermark_seeds",
                       "tokenrace_watermark_detect", "tokenrace_requests_new", "tokenrace_requests_free",
                       "tokenrace_requests_add", "tokenrace_requests_remove", "tokenrace_requests_reset",
                       "tokenrace_requests_append", "tokenrace_requests_len", "tokenrace_requests_output_len",
                       "tokenrace_shard_top", "tokenrace_shard_combine_top", "tokenrace_shard_race",
                       "tokenrace_shard_finish", "tokenrace_shard_top_k_candidates", "tokenrace_shard_cut_start",
                       "tokenrace_shard_cut_pending", "tokenrace_shard_cut_round", "tokenrace_shard_cut_advance",
                       "tokenrace_shard_race_cut", "tokenrace_shard_logprob_partials", "tokenrace_shard_logprobs",
                       "tokenrace_watermark_verify_seeds", "tokenrace_score",
                       "tokenrace_request_params_default", "tokenrace_requests_set_params",
                       "tokenrace_requests_append_strided",
                       # added after 0.2.0 (without it, greedy rows go through tokenrace_draw)
                       "tokenrace_draw_greedy"})


def _declare(handle):
    for fname, (restype, argtypes) in _SIGNATURES.items():
        try:
            f = getattr(handle, fname)
        except AttributeError:
            if fname in SINCE_0_2:
                continue
            raise
        f.restype = restype
        f.argtypes = argtypes


def _open(path):
    handle = ctypes.CDLL(path)
    try:
        _declare(handle)
    except AttributeError as e:
        raise OSError(f"{path} is not a compatible tokenrace library: {e}") from None
    abi = handle.tokenrace_abi_version()
    if abi != ABI_VERSION:
        raise OSError(f"{path} has tokenrace ABI version {abi}; this binding needs {ABI_VERSION}")
    if hasattr(handle, "tokenrace_set_log_callback"):
        handle.tokenrace_set_log_callback(ctypes.cast(_log_trampoline, ctypes.c_void_p), None)
        atexit.register(_unroute_log, handle)
    return handle


_lib = None
_lib_path = None
_lock = threading.Lock()


def lib():
    """The loaded library, with every signature declared (loaded on first use)."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        explicit = os.environ.get("TOKENRACE_LIBRARY")
        if explicit:
            if not os.path.isfile(explicit):
                raise OSError(f"TOKENRACE_LIBRARY={explicit!r}: no such file")
            handle, path = _open(explicit), explicit
        else:
            tried = candidate_paths()
            found = next((p for p in tried if os.path.isfile(p)), None)
            if found is None:
                raise OSError(
                    "tokenrace: cannot find the native library "
                    f"{library_filename()}; looked in (in order):\n  " + "\n  ".join(tried)
                    + "\nInstall the package with `pip install .` from the repository (it builds and "
                    "bundles the library), build it with `cargo build --release`, or set "
                    "TOKENRACE_LIBRARY to its path."
                )
            handle, path = _open(found), found
        _lib, _lib_path = handle, path
        return _lib


def library_path():
    """The path of the loaded library (loading it if needed)."""
    lib()
    return _lib_path
