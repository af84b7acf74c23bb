"""``Sampler``: one ``tokenrace_sampler`` and its draw and verify calls (``_verify.py``)."""

from __future__ import annotations

import math
import ctypes
from ctypes import byref
from dataclasses import dataclass
from typing import Optional

import numpy as np

from . import _ffi
from ._arrays import (LOGITS_DTYPES, NOISE_DTYPES, arrays_in, as_torch, byte_span, contiguous_rows, int32_vector,
                      is_torch_tensor, per_row, rows_view)
from ._call import (BATCH_LAYOUT, BATCH_SIZE, FLAG_SCALARS, FLOAT_SCALARS, FULL_LAYOUT, FULL_OFFSET, FULL_ZEROS,
                    GIVEN_LAYOUT, GIVEN_OFFSET, INT_SCALARS, KEPT_LAYOUT, KEPT_OFFSET, LLAMA_LAYOUT, LLAMA_OFFSET,
                    OUTPUT_LAYOUT, OUTPUT_SIZE, ORDER_LAYOUT, ORDER_OFFSET, PARITY_LAYOUT, PARITY_OFFSET, PARITY_ZEROS,
                    DRY_LAYOUT, DRY_OFFSET, DRY_ZEROS, POINTER_LAYOUT, REQUESTS_LAYOUT, REQUESTS_OFFSET,
                    APPEND_LAYOUT, APPEND_OFFSET,
                    ROW_INDEX_OFFSET, MIROSTAT_LAYOUT, MIROSTAT_OFFSET, MIROSTAT_OUT_OFFSET, MIROSTAT_ZEROS,
                    STEP_LAYOUT, STEP_OFFSET, STEP_ZEROS, TOP_N_SIGMA_OFFSET, address, pack_tokens_output,
                    release_state, take_state)
from ._common import (_choice, _Closable, _Default, _from_env, _Handle, _name_of, _offsets_without_seeds,
                      _unsigned)
from ._errors import InvalidArgumentError, check
from ._requests import pack_requests
from ._step import FIELD_ARGUMENTS, dry_fields, list_entries, parity_fields, step_fields
from ._verify import verify as _verify
from ._greedy import draw_greedy, plain_limits
from ._errors import UnsupportedError


_INT32_P = ctypes.POINTER(ctypes.c_int32)


def _score_function():
    lib = _ffi.lib()
    try:
        return lib.tokenrace_score
    except AttributeError:
        raise UnsupportedError(f"Sampler.score: the loaded library ({_ffi.library_path()}) has no tokenrace_score; "
                               f"use a newer build") from None


def _free_sampler(ptr):
    # Looked up at call time: the library is loaded once, and tests observe the call.
    _ffi.lib().tokenrace_sampler_free(ptr)


class Sampler(_Closable):
    """Samples one next token per row of logits; safe to share between threads.

    ``Sampler(vocab_size=0, max_rows=256, *, seed=None, threads=1, simd="auto",
    greedy_below=1e-5, noise="auto", filter_order="temperature_first")``

    Settings the caller does not pass come from the ``TOKENRACE_*`` environment variables
    (``docs/configuration.md``), else from the library's defaults; a value passed explicitly
    always wins, even when it equals the default. ``seed=None`` means "not passed": OS entropy
    unless ``TOKENRACE_SEED`` is set. ``vocab_size`` not passed is ``TOKENRACE_VOCAB_SIZE``, else
    0, which accepts any vocabulary size. ``filter_order``: "temperature_first" (vLLM's: min-p,
    top-k and top-p judge the tempered distribution) or "filters_first" (llama.cpp's chain: they
    judge the untempered one, and the temperature applies to the tokens they keep).
    """

    def __init__(self, vocab_size=_Default(0), max_rows=_Default(256), *, seed=None, threads=_Default(1),
                 simd=_Default("auto"), greedy_below=_Default(1e-5), noise=_Default("auto"),
                 filter_order=_Default("temperature_first")):
        lib = _ffi.lib()
        cfg = _config_from_env()
        if not isinstance(vocab_size, _Default):
            cfg.vocab_size = _unsigned("vocab_size", vocab_size, 32)
        if not isinstance(max_rows, _Default):
            cfg.max_rows = _unsigned("max_rows", max_rows, 32)
        if not isinstance(threads, _Default):
            cfg.threads = _unsigned("threads", threads, 32)
        if seed is not None:
            cfg.seed = _unsigned("seed", seed, 64)
            cfg.has_seed = 1
        if not isinstance(simd, _Default):
            cfg.simd = _choice("simd", simd, _ffi.SIMD_NAMES)
        if not isinstance(greedy_below, _Default):
            if not isinstance(greedy_below, (int, float, np.floating, np.integer)):
                raise TypeError(f"greedy_below: must be a number, got {type(greedy_below).__name__}")
            g = float(greedy_below)
            if not (math.isfinite(g) and g >= 0):
                raise ValueError(f"greedy_below: {g} is not a finite number >= 0")
            cfg.greedy_below = g
        if not isinstance(noise, _Default):
            cfg.noise = _choice("noise", noise, _ffi.NOISE_SOURCE_NAMES)
        if not isinstance(filter_order, _Default):
            cfg.filter_order = _choice("filter_order", filter_order, _ffi.FILTER_ORDER_NAMES)
        ptr = _ffi.sampler_p()
        check(lib.tokenrace_sampler_new(byref(cfg), byref(ptr)))
        self._handle = _Handle(ptr, _free_sampler)
        self._config = cfg
        self._greedy_limits = plain_limits(cfg)  # None: temperature 0 is not greedy here

    # -- lifetime ------------------------------------------------------------------------------

    def close(self):
        """Closes the sampler (idempotent): later calls on it raise ``ClosedError``. The native
        sampler is freed now, or, if calls are still running in other threads, as soon as the
        last of them returns (they finish normally)."""
        self._handle = None

    # -- settings and counters -----------------------------------------------------------------

    @property
    def vocab_size(self):
        return self._config.vocab_size

    @property
    def max_rows(self):
        return self._config.max_rows

    @property
    def threads(self):
        return self._config.threads

    @property
    def greedy_below(self):
        return self._config.greedy_below

    @property
    def filter_order(self):
        """"temperature_first" (vLLM's order) or "filters_first" (llama.cpp's)."""
        return _name_of(self._config.filter_order, _ffi.FILTER_ORDER_NAMES)

    @property
    def seed(self):
        """The seed of unseeded rows, or None for OS entropy."""
        return self._config.seed if self._config.has_seed else None

    @property
    def simd_level(self):
        """The instruction set this sampler runs: "avx512", "avx2", "neon", "vxe2", "portable" or "scalar"."""
        h = self._live_handle()
        return _ffi.lib().tokenrace_sampler_simd_level(h.ptr).decode()

    @property
    def config(self):
        """The settings the sampler was made with, as a dict (enums as their names)."""
        c = self._config
        return {
            "vocab_size": c.vocab_size, "max_rows": c.max_rows, "threads": c.threads,
            "seed": self.seed, "simd": _name_of(c.simd, _ffi.SIMD_NAMES),
            "greedy_below": float(str(np.float32(c.greedy_below))), "log_level": _name_of(c.log_level, _ffi.LOG_LEVEL_NAMES),
            "noise": _name_of(c.noise, _ffi.NOISE_SOURCE_NAMES), "pool_rows": c.pool_rows,
            "filter_order": self.filter_order,
        }

    def stats(self):
        """The sampler's counters since it was made, as a dict."""
        h = self._live_handle()
        st = _ffi.tokenrace_sampler_stats()
        check(_ffi.lib().tokenrace_sampler_get_stats(h.ptr, byref(st)))
        return {k: v for k, v in st.as_dict().items() if k not in ("struct_size", "reserved0")}

    def __repr__(self):
        if self.closed:
            return "<tokenrace.Sampler closed>"
        return (f"<tokenrace.Sampler vocab_size={self.vocab_size} max_rows={self.max_rows} "
                f"simd={self.simd_level}>")

    # -- noise pool ----------------------------------------------------------------------------

    def attach_pool(self, pool):
        """Makes the unseeded sampling rows take their noise from ``pool`` (a ``NoisePool``), one
        borrow per draw call, replacing the sampler's own pool if it had one. The sampler keeps
        the pool running until the sampler is freed, even after ``pool.close()``.

        The pool's ``vocab_size`` must equal the sampler's, the sampler's ``noise`` must be
        "auto" or "pool", and a draw with more unseeded sampling rows than the pool's capacity
        fails (all ``ValueError``).
        """
        from ._pool import NoisePool

        if not isinstance(pool, NoisePool):
            raise TypeError(f"pool: must be a tokenrace.NoisePool, got {type(pool).__name__}")
        # Both handles are held for the call: neither native object can be freed under it.
        h = self._live_handle()
        p = pool._live_handle()
        check(_ffi.lib().tokenrace_sampler_attach_pool(h.ptr, p.ptr))

    # -- drawing -------------------------------------------------------------------------------

    def _fill_batch(self, b, keep, state, logits, temperature, seeds, offsets, seeded, noise, noise_kind,
                    top_k, top_p, min_p, top_n_sigma=None, requests=None, request_ids=None, llama=None,
                    row_index=None, append_to_requests=False):
        """Writes every field of ``b`` (a ``tokenrace_batch``) for the call; returns the row
        count. ``keep`` receives the objects the struct points into; ``state`` (a ``CallState``,
        or None) lends its cached per-row arrays to scalar arguments."""
        # The common case (a C-contiguous numpy array) without building a RowsView.
        fast = contiguous_rows(logits, LOGITS_DTYPES) if type(logits) is np.ndarray else None
        if fast is not None:
            logits_ptr, dtype, rows, vocab = fast
            row_stride = vocab
            keep.append(logits)
        else:
            view = rows_view(logits, "logits", LOGITS_DTYPES)
            logits_ptr, dtype, rows, vocab, row_stride = view.ptr, view.dtype, view.rows, view.vocab, view.row_stride
            keep.append(view.owner)  # a list's converted copy, not the list
        if row_index is not None:
            # One row per entry; the logits hold the rows they read (the library sizes their span
            # from the largest entry, so one past the logits is refused here).
            beyond = row_index >= rows
            if beyond.any():
                r = int(np.argmax(beyond))
                raise ValueError(f"row_index[{r}]: {int(row_index[r])} is not a row of the logits ({rows} rows)")
            rows = len(row_index)
        # Each is the address of its per-row values, 0 (NULL) when not given; the common None is
        # tested here rather than in a call.
        # (With a request state, the offsets place the rows its seeded requests draw.)
        if offsets is not None and seeds is None and requests is None:
            _offsets_without_seeds("row")
        if temperature is not None:
            temperature = _float_rows(state and state.temperature, temperature, rows, "temperature", keep)
        if seeds is not None:
            seeds = _uint64_rows(state and state.seeds, seeds, rows, "seeds", keep)
        if offsets is not None:
            offsets = _uint64_rows(state and state.offsets, offsets, rows, "offsets", keep)
        if seeded is not None:
            seeded = _flag_rows(state and state.seeded, seeded, rows, "seeded", keep)
        if top_k is not None:
            top_k = _int32_rows(state and state.top_k, top_k, rows, "top_k", keep)
        if top_p is not None:
            top_p = _float_rows(state and state.top_p, top_p, rows, "top_p", keep)
        if min_p is not None:
            min_p = _float_rows(state and state.min_p, min_p, rows, "min_p", keep)
        kind = _ffi.NOISE_KIND_EXP if noise_kind == "exp" else _choice("noise_kind", noise_kind,
                                                                       _ffi.NOISE_KIND_NAMES)
        noise_ptr = noise_row_stride = 0
        if noise is not None:
            nv = rows_view(noise, "noise", NOISE_DTYPES, broadcast_ok=True)
            if nv.vocab != vocab:
                raise ValueError(f"noise: has {nv.vocab} values per row, the logits have {vocab}")
            if nv.ndim == 2 and nv.rows not in (1, rows):
                raise ValueError(f"noise: has {nv.rows} rows, the batch has {rows} (or pass 1 row, or "
                                 f"a 1-D array, to use the same noise for every row)")
            keep.append(nv.owner)
            noise_ptr = nv.ptr
            noise_row_stride = 0 if nv.rows == 1 or nv.ndim == 1 else nv.row_stride
        BATCH_LAYOUT.pack_into(b, 0, BATCH_SIZE, dtype, logits_ptr, rows, vocab, row_stride,
                               temperature or 0, seeds or 0, offsets or 0, seeded or 0, noise_ptr, kind, 0,
                               noise_row_stride, top_k or 0, top_p or 0, min_p or 0)
        if top_n_sigma is not None:
            top_n_sigma = _float_rows(state and state.top_n_sigma, top_n_sigma, rows, "top_n_sigma", keep)
            POINTER_LAYOUT.pack_into(b, TOP_N_SIGMA_OFFSET, top_n_sigma)
            if state is not None:
                state.sigma_packed = True
        elif state is not None and state.sigma_packed:
            POINTER_LAYOUT.pack_into(b, TOP_N_SIGMA_OFFSET, 0)
            state.sigma_packed = False
        if requests is not None or request_ids is not None:
            pack_requests(b, keep, requests, request_ids, rows, REQUESTS_OFFSET, REQUESTS_LAYOUT)
            APPEND_LAYOUT.pack_into(b, APPEND_OFFSET, 1 if append_to_requests else 0, 0)
            if state is not None:
                state.requests_packed = True
        elif append_to_requests:
            raise ValueError("append_to_requests: given without requests (there is no state to append to)")
        elif state is not None and state.requests_packed:
            REQUESTS_LAYOUT.pack_into(b, REQUESTS_OFFSET, 0, 0)
            APPEND_LAYOUT.pack_into(b, APPEND_OFFSET, 0, 0)
            state.requests_packed = False
        # Element by element: an array compared with None is an array, whose truth is ambiguous.
        if llama is not None and any(value is not None for value in llama):
            LLAMA_LAYOUT.pack_into(b, LLAMA_OFFSET, *_llama_rows(state, llama, rows, keep))
            if state is not None:
                state.llama_packed = True
        elif state is not None and state.llama_packed:
            LLAMA_LAYOUT.pack_into(b, LLAMA_OFFSET, 0, 0, 0, 0, 0, 0)
            state.llama_packed = False
        return rows

    def _batch(self, logits, temperature, seeds, offsets, seeded, noise, noise_kind,
               top_k=None, top_p=None, min_p=None, top_n_sigma=None, llama=None):
        """A ``tokenrace_batch`` of its own (not the thread's cached one) and the objects to keep
        alive with it, for callers that hold a batch beyond one call."""
        keep = []
        batch = _ffi.tokenrace_batch()
        self._fill_batch(batch, keep, None, logits, temperature, seeds, offsets, seeded, noise,
                         noise_kind, top_k, top_p, min_p, top_n_sigma, llama)
        return batch, keep

    def _run(self, batch_ptr, output_ptr):
        """Calls ``tokenrace_draw``. The handle ``h`` is held for the call, so that a ``close()`` in
        another thread meanwhile cannot free the native sampler. (The function is looked up at
        call time: tests substitute it.)"""
        h = self._live_handle()
        status = _ffi.lib().tokenrace_draw(h.ptr, batch_ptr, output_ptr)
        if status:
            _raise(status)
        del h

    def _fill_step(self, state, keep, rows, prompt_tokens, output_tokens, repetition_penalty,
                       frequency_penalty, presence_penalty, logit_bias, allowed_tokens, banned_tokens,
                       token_bitmask, penalty_last_n, min_tokens, stop_token_ids):
        """Writes the batch's step fields (``_step.py``) for a call that passes any."""
        fields = step_fields(rows, state.batch.vocab, keep, prompt_tokens, output_tokens, repetition_penalty,
                                 frequency_penalty, presence_penalty, logit_bias, allowed_tokens, banned_tokens,
                                 token_bitmask, state, penalty_last_n, min_tokens, stop_token_ids)
        state.step_packed = True
        STEP_LAYOUT.pack_into(state.batch, STEP_OFFSET, *fields)

    def _fill_dry(self, state, keep, rows, dry):
        """Writes the batch's DRY block, or zeroes it again after a call that wrote it."""
        if all(v is None for v in dry):
            if state.dry_packed:
                DRY_LAYOUT.pack_into(state.batch, DRY_OFFSET, *DRY_ZEROS)
                state.dry_packed = False
            return
        DRY_LAYOUT.pack_into(state.batch, DRY_OFFSET, *dry_fields(rows, keep, *dry))
        state.dry_packed = True

    def _fill_mirostat(self, state, keep, rows, mirostat, mu_out=None):
        """Writes the batch's mirostat block (mode, tau, eta, m, mu), or zeroes it again after a
        call that wrote it. The mu going in is copied when it shares memory with ``mu_out`` (the
        library refuses an output over an input: a caller may update its mu in place)."""
        if all(v is None for v in mirostat):
            if state.mirostat_packed:
                MIROSTAT_LAYOUT.pack_into(state.batch, MIROSTAT_OFFSET, *MIROSTAT_ZEROS)
                state.mirostat_packed = False
            return
        mode, tau, eta, m, mu = mirostat
        if mu is not None and mu_out is not None and isinstance(mu, np.ndarray) and np.shares_memory(mu, mu_out):
            mu = np.array(mu, dtype=np.float32, copy=True)
        MIROSTAT_LAYOUT.pack_into(state.batch, MIROSTAT_OFFSET,
                                  0 if mode is None else _slow_rows(mode, rows, np.int32, "mirostat", keep),
                                  0 if tau is None else _slow_rows(tau, rows, np.float32, "mirostat_tau", keep),
                                  0 if eta is None else _slow_rows(eta, rows, np.float32, "mirostat_eta", keep),
                                  0 if m is None else _slow_rows(m, rows, np.int32, "mirostat_m", keep),
                                  0 if mu is None else _slow_rows(mu, rows, np.float32, "mirostat_mu", keep))
        state.mirostat_packed = True

    def _fill_parity(self, state, keep, rows, bad_words, forced_tokens, logprob_token_ids=None):
        """Writes the batch's parity block (bad words, forced tokens, the ids of
        ``logprob_token_ids``), or zeroes it again after a call that wrote it; returns the count
        of ``logprob_token_ids`` entries."""
        if bad_words is None and forced_tokens is None and logprob_token_ids is None:
            PARITY_LAYOUT.pack_into(state.batch, PARITY_OFFSET, *PARITY_ZEROS)
            state.parity_packed = False
            return 0
        fields = parity_fields(rows, state.batch.vocab, keep, bad_words, forced_tokens, logprob_token_ids)
        PARITY_LAYOUT.pack_into(state.batch, PARITY_OFFSET, *fields)
        state.parity_packed = True
        return list_entries(fields[-1], rows) if logprob_token_ids is not None else 0

    def draw(self, logits, *, temperature=None, seeds=None, offsets=None, seeded=None, noise=None,
             noise_kind="exp", top_k=None, top_p=None, min_p=None, top_n_sigma=None, return_flags=False,
             prompt_tokens=None, output_tokens=None, repetition_penalty=None, frequency_penalty=None,
             presence_penalty=None, logit_bias=None, allowed_tokens=None, banned_tokens=None,
             token_bitmask=None, penalty_last_n=None, min_tokens=None, stop_token_ids=None, requests=None,
             request_ids=None, min_keep=None, typical_p=None, xtc_probability=None, xtc_threshold=None,
             dynatemp_range=None, dynatemp_exponent=None, bad_words=None, forced_tokens=None, order=None,
             dry_multiplier=None, dry_base=None, dry_allowed_length=None, dry_penalty_last_n=None,
             dry_sequence_breakers=None, row_index=None, mirostat=None, mirostat_tau=None, mirostat_eta=None,
             mirostat_m=None, mirostat_mu=None, mirostat_mu_out=None, append_to_requests=False):
        """Draws one token per row of ``logits``; returns an int32 array of ``rows`` tokens (a
        torch tensor when ``logits`` is one, over the same memory: no copy; the flags of
        ``return_flags`` then come as int32, the same bits).

        logits: 2-D (rows x vocab) or 1-D (one row) float32/float16 numpy array, or a CPU torch
            tensor (float32/float16/bfloat16). Read in place: rows may be any stride apart, the
            values inside a row must be contiguous.
        temperature: scalar or one per row (default 1.0); below the sampler's ``greedy_below`` a
            row takes the argmax (lowest index on ties).
        seeds, offsets: scalar or one unsigned 64-bit integer per row. A seeded row draws the same
            token whatever else is in the batch (and whichever sampler draws it). ``offsets``
            without ``seeds`` raises ValueError (it would be ignored: no row is seeded).
        seeded: boolean mask of the rows that use their seed (default: every row, when ``seeds``
            is given).
        noise: float32 noise for the unseeded sampling rows, rows x vocab, or one row (1-D or
            1 x vocab) used for every row; ``noise_kind`` says what it holds: "exp" (E ~ Exp(1))
            or "log_exp" (ln E).
        top_k: scalar or one int32 per row; k <= 0 or k >= vocab is off for the row.
        top_p: scalar or one float per row, in (0, 1]; 1 is off for the row.
        min_p: scalar or one float per row, in [0, 1]; 0 is off for the row.
        top_n_sigma: scalar or one float per row, finite; <= 0 is off for the row (llama.cpp's
            top-nσ: keeps the tokens with logit >= max - n * sigma over the row's finite logits,
            the same set before and after the temperature).
        min_keep: scalar or one int per row, n >= 0 (llama.cpp's ``min_keep``): top-p, min-p,
            typical sampling and XTC each keep at least n tokens (not top-k).
        typical_p: scalar or one float per row, in (0, 1]; 1 is off for the row (llama.cpp's
            locally typical sampling: the tokens whose -ln p is nearest the entropy, up to a mass
            above p).
        xtc_probability, xtc_threshold: scalars or one float per row, in [0, 1]; XTC is off for a
            row whose probability is 0 or threshold above 0.5 (llama.cpp's XTC: with that
            probability, when at least two tokens have p >= threshold, all of them but the least
            probable are removed). The coin comes from the row's key: a seeded row's is a pure
            function of its seed and offset; an unseeded row's comes from the sampler's stream,
            and such a row may not take ``noise``.
        dynatemp_range, dynatemp_exponent: scalars or one float per row, finite and >= 0 (range
            0: off; exponent default 1): llama.cpp's dynamic temperature, the row's temperature
            becomes ``min_T + (max_T - min_T) * (H / ln N) ** exponent`` with ``min_T = max(0,
            T - range)``, ``max_T = T + range``, H the entropy of softmax(logits) over the N tokens
            the filters keep.
            Rows with typical sampling, XTC or a dynamic temperature give raw logprobs only.
            The filters (``docs/semantics.md``, Filters) apply to sampling rows only, min-p and
            top-nσ, then top-k, then typical, then top-p, then XTC; None (the default) is off for
            every row. A value out of range
            raises ValueError naming the row (``top_p[3]: 0 is not in (0, 1]``).
        return_flags: also return the uint32 row flags (``FLAG_*`` bits).

        The rest of the sampling step, applied before the greedy choice, the temperature and the
        filters, in vLLM V1's order: masks, then logit bias, then penalties
        (``docs/semantics.md``, The sampling step). All optional (None: off); the logits are never
        changed.

        prompt_tokens, output_tokens: each row's prompt and the tokens generated so far, as a list
            of per-row ids (1-D integer arrays, tensors or lists; None or empty for a row without
            any), a CSR tuple ``(ids, offsets)`` (``rows + 1`` offsets) or a 2-D integer array
            padded as vLLM pads its prompt tensor (entries equal to vocab or negative are padding).
            Duplicates count.
        repetition_penalty: scalar or one per row, r > 0 (1: off); divides a positive logit of a
            token in the prompt or the output by r, multiplies any other by r.
        frequency_penalty, presence_penalty: scalar or one per row, finite (0: off); subtract
            ``f * count + p`` from a token that occurs ``count > 0`` times in the output.
        penalty_last_n: scalar or one int per row, n >= 0 (0, the default: every token): only the
            last n tokens of the row's prompt followed by its output count for the three
            penalties (llama.cpp's ``penalty_last_n``, except that 0 does not turn the penalties
            off and -1 is refused).
        min_tokens, stop_token_ids: min_tokens a scalar or one int per row, n >= 0 (0: off), and
            each row's stop tokens in the forms of ``prompt_tokens``: while the row's
            ``output_tokens`` (in this call; none: length 0) hold fewer than n tokens, its stop
            tokens are banned as ``banned_tokens`` bans them (vLLM's and SGLang's min_tokens).
        logit_bias: one dict ``{id: bias}`` for every row, a list of dicts (None: no bias for the
            row), or CSR ``(ids, values, offsets)``; a finite bias is added, -inf bans the token;
            biases of one id add up.
        allowed_tokens: the only tokens each row may draw: per-row id lists (None for a row: all
            allowed; an empty list allows nothing and the row is ``FLAG_EMPTY``), or the CSR or
            padded forms above (every row restricted).
        banned_tokens: tokens each row may not draw (bad words of one token, ``min_tokens``' stop
            ids), in the forms of ``prompt_tokens``.
        token_bitmask: a grammar bitmask in xgrammar's layout, read in place: int32 numpy array
            or CPU torch tensor, rows x ceil(vocab / 32) words (1-D for one row), rows any whole
            number of words apart; bit j of word w set allows token 32 w + j.
        requests, request_ids: a ``tokenrace.Requests`` state and one request id per row: row r's
            prompt and output are those of request ``request_ids[r]`` (instead of
            ``prompt_tokens``/``output_tokens``, which must then be None), with the same result
            bit for bit; and each per-row parameter this call leaves None (temperature, seeds,
            the filters, the penalties, min_tokens and stop ids, the bias, allowed and banned
            tokens) is the row's request's (``Requests.set_params``). A seeded request draws at
            ``offsets`` when given, else at its output length.
        append_to_requests: with ``requests``, append each row's drawn token to its request once
            the draw succeeds (a failed draw appends nothing); False (the default): call
            ``requests.append`` with the tokens the host keeps.
        bad_words: one entry per row, None or a list of words, each a non-empty list of token ids
            (vLLM's rule): a word bans its last token when the row's ``output_tokens`` end with
            the word's other tokens; a word of one token always bans it.
        forced_tokens: None, or one int per row: a token in [0, vocab) that the row returns (its
            logprobs, rank and top-n as if drawn; its noise consumed as a drawn row's, so the
            other rows draw what they would), or -1 to draw the row. A forced token the step bans
            is returned flagged ``FLAG_FORCED_BANNED`` (processed logprob -inf).
        order: None (the sampler's ``filter_order``), or the filter stages in the order every row
            applies them, a tuple of names among ``"top_k"``, ``"top_p"``, ``"min_p"``,
            ``"typical"``, ``"xtc"``, ``"top_n_sigma"`` and ``"temperature"`` (the dynamic one when
            ``dynatemp_range > 0``), each at most once, each on what the ones before it kept; a
            stage before ``"temperature"`` judges softmax(x), one after it softmax(x / T); the
            temperature goes last when left out; a filter a row turns on must be listed.
            ``tokenrace.TEMPERATURE_FIRST`` and ``tokenrace.FILTERS_FIRST`` are the two fixed
            orders, ``tokenrace.LLAMA_CPP_ORDER`` llama.cpp's default chain.
        dry_multiplier, dry_base, dry_allowed_length, dry_penalty_last_n: llama.cpp's DRY, scalar
            or one per row (defaults: 0 = off, 1.75, 2, -1 = the whole history): a token that
            would extend a sequence that the row's history (``prompt_tokens`` then
            ``output_tokens``, the last ``dry_penalty_last_n`` of them) already repeats, ``n >=
            dry_allowed_length`` tokens long, loses ``dry_multiplier * dry_base ** (n -
            dry_allowed_length)`` from its value, after the other penalties. Off for a row whose
            multiplier is 0, base below 1 or window 0.
        dry_sequence_breakers: one entry per row, None or a list of token sequences (llama.cpp's
            breakers, as token ids: a head, then its tail): no repeat DRY counts spans one, and the
            head of a one-token breaker is never penalised.
        row_index: None, or one logits row per row (vLLM's ``n > 1``, FlashInfer's ``indices``):
            row r reads ``logits[row_index[r]]`` in place, with its own seed, offset, parameters
            and token; the per-row arguments and the tokens then have ``len(row_index)`` rows
            (``docs/semantics.md``, Several outputs from one logits row).
        mirostat: None (off), or 0 (off), 1 (v1) or 2 (v2), scalar or one per row: llama.cpp's
            mirostat as the row's final sampler, after the temperature and every other filter. v2
            keeps the tokens whose surprise ``-log2 p`` is at most the row's mu (at least the most
            probable), v1 the k most probable, k from the Zipf exponent estimated over the
            ``mirostat_m`` most probable; the row then draws from that set renormalised, and its
            mu becomes ``mu - eta * (-log2 p(drawn) - tau)`` (``docs/semantics.md``, Mirostat).
        mirostat_tau, mirostat_eta, mirostat_m: scalar or one per row (defaults: llama.cpp's 5.0,
            0.1 and 100): the target surprise in bits, the learning rate, v1's m >= 1.
        mirostat_mu: scalar or one per row, each row's mu going in (default: ``2 * tau``, a
            sequence's first draw); pass back the mu the row's previous draw returned.
        mirostat_mu_out: None, or a writable contiguous float32 array of ``rows`` entries that
            receives each row's mu after the draw (NaN for a row without mirostat), only when the
            call succeeds. It may be the ``mirostat_mu`` array itself (updated in place).
            ``draw_full`` returns it as ``r.mirostat_mu`` instead.

        Errors (ValueError) name the argument, the row and the position: the column of a padded
        array, the index in a row's list or dict, and the entry of a CSR array.

        Speed: the CSR forms with int32 ids (and float32 bias values) go to the library as they
        are; a padded int64 array or per-row dicts are converted in numpy on every call. In
        ``bench/compare.py --step`` (32 rows x vocab 151936, 4096 + 1024 history tokens and 16
        biases per row) that conversion added 0.35-0.45 ms a call, against 0.3-1.7 ms for the
        whole fused step (``docs/performance.md``, The whole sampling step).
        """
        # The plain greedy draw (temperature 0 and nothing else) skips the general batch
        # (_greedy.py); the type is tested first, since an array compared with 0 is an array.
        if ((type(temperature) is float or type(temperature) is int) and temperature == 0
                and type(logits) is np.ndarray and self._greedy_limits is not None and noise_kind == "exp"
                and seeds is None and offsets is None and seeded is None and noise is None and top_k is None
                and top_p is None and min_p is None and top_n_sigma is None and prompt_tokens is None
                and output_tokens is None and repetition_penalty is None and frequency_penalty is None
                and presence_penalty is None and logit_bias is None and allowed_tokens is None
                and banned_tokens is None and token_bitmask is None and penalty_last_n is None
                and min_tokens is None and stop_token_ids is None and requests is None and request_ids is None
                and min_keep is None and typical_p is None and xtc_probability is None and xtc_threshold is None
                and dynatemp_range is None and dynatemp_exponent is None and bad_words is None
                and forced_tokens is None and order is None and dry_multiplier is None and dry_base is None
                and dry_allowed_length is None and dry_penalty_last_n is None and dry_sequence_breakers is None
                and row_index is None and mirostat is None and mirostat_tau is None and mirostat_eta is None
                and mirostat_m is None and mirostat_mu is None and mirostat_mu_out is None):
            drawn = draw_greedy(self, self._greedy_limits, logits, return_flags)
            if drawn is not None:
                return drawn
        index = None if row_index is None else int32_vector(row_index, "row_index")
        state = take_state()
        try:
            keep = []
            rows = self._fill_batch(state.batch, keep, state, logits, temperature, seeds, offsets, seeded,
                                    noise, noise_kind, top_k, top_p, min_p, top_n_sigma, requests, request_ids,
                                    (min_keep, typical_p, xtc_probability, xtc_threshold, dynatemp_range,
                                     dynatemp_exponent), index, append_to_requests)
            _pack_row_index(state, keep, index)
            if (prompt_tokens is None and output_tokens is None and repetition_penalty is None
                    and frequency_penalty is None and presence_penalty is None and logit_bias is None
                    and allowed_tokens is None and banned_tokens is None and token_bitmask is None
                    and penalty_last_n is None and min_tokens is None and stop_token_ids is None):
                if state.step_packed:
                    STEP_LAYOUT.pack_into(state.batch, STEP_OFFSET, *STEP_ZEROS)
                    state.step_packed = False
            else:
                self._fill_step(state, keep, rows, prompt_tokens, output_tokens, repetition_penalty,
                                    frequency_penalty, presence_penalty, logit_bias, allowed_tokens,
                                    banned_tokens, token_bitmask, penalty_last_n, min_tokens,
                                    stop_token_ids)
            if bad_words is not None or forced_tokens is not None or state.parity_packed:
                self._fill_parity(state, keep, rows, bad_words, forced_tokens)
            if order is not None or state.order_packed:
                _fill_order(state, keep, order)
            self._fill_dry(state, keep, rows, (dry_multiplier, dry_base, dry_allowed_length, dry_penalty_last_n,
                                               dry_sequence_breakers))
            if mirostat_mu_out is not None:
                mu_out = _mu_out(mirostat_mu_out, rows)
            if (mirostat is not None or mirostat_tau is not None or mirostat_eta is not None or mirostat_m is not None
                    or mirostat_mu is not None or state.mirostat_packed):
                self._fill_mirostat(state, keep, rows, (mirostat, mirostat_tau, mirostat_eta, mirostat_m, mirostat_mu),
                                    mirostat_mu_out)
            pack_tokens_output(state, state.tokens.address_for(rows),
                               state.flags.address_for(rows) if return_flags else 0)
            if mirostat_mu_out is not None:
                POINTER_LAYOUT.pack_into(state.tokens_output, MIROSTAT_OUT_OFFSET, mu_out)
                state.draw_mu_packed = True
            elif state.draw_mu_packed:
                POINTER_LAYOUT.pack_into(state.tokens_output, MIROSTAT_OUT_OFFSET, 0)
                state.draw_mu_packed = False
            # self._run(), inlined (a method call less: the fast path's cost, see _call.py)
            h = self._live_handle()
            status = _ffi.lib().tokenrace_draw(h.ptr, state.batch_ptr, state.tokens_output_ptr)
            if status:
                _raise(status)
            del h
            tokens = state.tokens.take(rows)
            if type(logits) is not np.ndarray and is_torch_tensor(logits):
                # A torch caller gets tensors: views of the arrays just taken, no second copy.
                if return_flags:
                    return as_torch(tokens), as_torch(state.flags.take(rows))
                return as_torch(tokens)
            if return_flags:
                return tokens, state.flags.take(rows)
            return tokens
        finally:
            state.in_use = False  # release_state(), inlined

    def draw_full(self, logits, *, temperature=None, seeds=None, offsets=None, seeded=None,
                  noise=None, noise_kind="exp", top_k=None, top_p=None, min_p=None, top_n_sigma=None, logprobs=0,
                  ranks=False, logprob_mode="raw", prompt_tokens=None, output_tokens=None, repetition_penalty=None,
                  frequency_penalty=None, presence_penalty=None, logit_bias=None, allowed_tokens=None,
                  banned_tokens=None, token_bitmask=None, full_logprobs=None, out=None, penalty_last_n=None,
                  min_tokens=None, stop_token_ids=None, requests=None, request_ids=None, min_keep=None,
                  typical_p=None, xtc_probability=None, xtc_threshold=None, dynatemp_range=None,
                  dynatemp_exponent=None, bad_words=None, forced_tokens=None, logprob_token_ids=None,
                  order=None, dry_multiplier=None, dry_base=None, dry_allowed_length=None,
                  dry_penalty_last_n=None, dry_sequence_breakers=None, kept_set=False, kept_bitmask=False, row_index=None,
                  mirostat=None, mirostat_tau=None, mirostat_eta=None, mirostat_m=None, mirostat_mu=None,
                  append_to_requests=False):
        """Draws like ``draw`` and also returns logprobs: a ``DrawResult`` (of torch tensors over
        the same memory when ``logits`` is a tensor, flags as int32) with

        tokens (int32), flags (uint32), logprobs (float32: the sampled token's logprob), ranks
        (int32: the count of tokens whose logprob is >= the sampled one's; only with
        ``ranks=True``, else None: a rank costs a count over the row), and, when
        ``logprobs = n > 0``, topn_ids (int32) and topn_logprobs (float32), rows x n, the n most
        probable tokens of each row by logprob descending, lowest id first on ties (None when
        n = 0). n is at most the vocabulary size.

        logprob_mode: "raw" (log_softmax of the logits as given) or "processed" (log_softmax
        after the sampling step, temperature and the filters, -inf outside the kept tokens;
        greedy rows: of the processed row at temperature 1). See ``docs/semantics.md``, Logprobs.

        full_logprobs: None, or what ``r.full_logprobs`` (float32, rows x vocab) receives for every
        token: "raw" (log_softmax of the logits as given), "processed" (log_softmax of the
        processed row, -inf outside the kept tokens) or "processed_logits" (the processed logit
        divided by T for the kept tokens, undivided in greedy rows, -inf elsewhere: vLLM's
        ``processed_logits``).
        out: a float32 array (or CPU torch tensor) of rows x vocab (1-D for one row) to write
            ``full_logprobs`` into, returned as ``r.full_logprobs``: values contiguous inside a
            row, rows any stride apart. Nothing is written if the call fails. It must share no
            memory with the inputs: an ``out`` whose address range (data pointer to the last
            element its strides reach) meets that of the logits or of any array or tensor
            argument raises ValueError naming both.

        logprob_token_ids: None, or per row the token ids whose logprobs (in ``logprob_mode``)
            ``r.token_logprobs`` receives, one per id, row after row (vLLM's ``logprob_token_ids``,
            SGLang's ``token_ids_logprobs``), in the forms of ``prompt_tokens``; with
            ``ranks=True``, ``r.token_ranks`` their ranks.

        kept_set: True also returns each row's kept set (vLLM's sampling masks, SGLang's
            ``return_sampling_masks``): ``r.kept_threshold`` (float32: the smallest kept value, in
            the values the filters judge, before the temperature; +inf when the row's +inf values
            are kept, NaN when nothing is), ``r.kept_count`` (int32) and ``r.kept_mass`` (float64:
            the share of the row's probability its kept tokens hold, at the temperature its filters
            judge it at). A row keeps exactly its finite values at or above the threshold; greedy
            rows keep every finite processed value. Refused for rows with typical_p, XTC or
            dynatemp on.
        kept_bitmask: True also returns ``r.kept_bitmask``, rows x ceil(vocab / 32) int32 words in
            xgrammar's layout (bit i of word j set: token 32 j + i is kept).
        row_index: None, or one logits row per row (vLLM's ``n > 1``, FlashInfer's ``indices``):
            row r reads ``logits[row_index[r]]`` in place, with its own seed, offset, parameters
            and outputs; the per-row arguments and the results then have ``len(row_index)`` rows
            (``docs/semantics.md``, Several outputs from one logits row).

        The sampling step's and mirostat's arguments are ``draw``'s; with ``mirostat=`` given,
        ``r.mirostat_mu`` holds each row's mu after the draw (NaN for a row without mirostat).
        """
        return self._full(None, logits, temperature=temperature, seeds=seeds, offsets=offsets, seeded=seeded,
                          noise=noise, noise_kind=noise_kind, top_k=top_k, top_p=top_p, min_p=min_p,
                          top_n_sigma=top_n_sigma, logprobs=logprobs, ranks=ranks, logprob_mode=logprob_mode,
                          prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                          repetition_penalty=repetition_penalty, frequency_penalty=frequency_penalty,
                          presence_penalty=presence_penalty, logit_bias=logit_bias,
                          allowed_tokens=allowed_tokens, banned_tokens=banned_tokens,
                          token_bitmask=token_bitmask, full_logprobs=full_logprobs, out=out,
                          penalty_last_n=penalty_last_n, min_tokens=min_tokens, stop_token_ids=stop_token_ids,
                          requests=requests, request_ids=request_ids, min_keep=min_keep, typical_p=typical_p,
                          xtc_probability=xtc_probability, xtc_threshold=xtc_threshold,
                          dynatemp_range=dynatemp_range, dynatemp_exponent=dynatemp_exponent,
                          bad_words=bad_words, forced_tokens=forced_tokens, logprob_token_ids=logprob_token_ids,
                          order=order, dry_multiplier=dry_multiplier, dry_base=dry_base,
                          dry_allowed_length=dry_allowed_length, dry_penalty_last_n=dry_penalty_last_n,
                          dry_sequence_breakers=dry_sequence_breakers, kept_set=kept_set,
                          kept_bitmask=kept_bitmask, row_index=row_index, mirostat=mirostat,
                          mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta, mirostat_m=mirostat_m,
                          mirostat_mu=mirostat_mu, append_to_requests=append_to_requests)

    def score(self, logits, target_ids, *, logprobs=0, ranks=False, mode="raw", **options):
        """Scores one target token per row, drawing nothing: returns the ``DrawResult`` that
        ``draw_full`` returns for rows that drew these tokens (``logprobs`` of the targets,
        ``ranks``, the top-n, ``token_logprobs``/``token_ranks`` of ``logprob_token_ids``,
        ``full_logprobs``, flags; ``tokens`` are the targets), bit for bit, computed by the same
        code, with no noise consumed (the sampler's stream and pool are untouched) and the rows
        spread over the sampler's threads. Prompt logprobs: one row per position, its target
        the next prompt token (thousands of positions in one call).

        target_ids: one token id per row, each in ``[0, vocab)`` (1-D integers; int32 passes
            without a copy).
        logprobs, ranks: as ``draw_full``'s. mode: ``draw_full``'s ``logprob_mode``, "raw" or
            "processed" (after the step, temperature and filters; -inf outside the kept set).
        options: ``draw_full``'s other keyword arguments (temperature, filters, the step,
            ``logprob_token_ids``, ``full_logprobs``/``out``...), but ``forced_tokens`` and
            ``noise``, which a score refuses. Seeds are read by XTC rows only (their coin).
        """
        for name in ("forced_tokens", "noise", "logprob_mode"):
            if name in options:
                raise TypeError(f"score: takes no {name} (" + (
                    "the targets are the rows' tokens)" if name == "forced_tokens" else
                    "nothing is drawn)" if name == "noise" else "use mode=)"))
        targets = int32_vector(target_ids, "target_ids")
        return self._full(targets, logits, logprobs=logprobs, ranks=ranks, logprob_mode=mode, **options)

    def _full(self, targets, logits, *, temperature=None, seeds=None, offsets=None, seeded=None,
                  noise=None, noise_kind="exp", top_k=None, top_p=None, min_p=None, top_n_sigma=None, logprobs=0,
                  ranks=False, logprob_mode="raw", prompt_tokens=None, output_tokens=None, repetition_penalty=None,
                  frequency_penalty=None, presence_penalty=None, logit_bias=None, allowed_tokens=None,
                  banned_tokens=None, token_bitmask=None, full_logprobs=None, out=None, penalty_last_n=None,
                  min_tokens=None, stop_token_ids=None, requests=None, request_ids=None, min_keep=None,
                  typical_p=None, xtc_probability=None, xtc_threshold=None, dynatemp_range=None,
                  dynatemp_exponent=None, bad_words=None, forced_tokens=None, logprob_token_ids=None,
                  order=None, dry_multiplier=None, dry_base=None, dry_allowed_length=None,
                  dry_penalty_last_n=None, dry_sequence_breakers=None, kept_set=False, kept_bitmask=False,
                  row_index=None, mirostat=None, mirostat_tau=None, mirostat_eta=None, mirostat_m=None,
                  mirostat_mu=None, append_to_requests=False):
        """``draw_full``, or ``score`` of ``targets`` (an int32 array) when they are given."""
        mode = _choice("logprob_mode", logprob_mode, _ffi.LOGPROB_MODE_NAMES)
        if isinstance(logprobs, (bool, np.bool_)):
            raise TypeError("logprobs: must be an integer (the number of top logprobs per row), got a bool")
        n = _unsigned("logprobs", logprobs, 32)
        if not isinstance(ranks, (bool, np.bool_)):
            raise TypeError(f"ranks: must be a bool (whether to return the sampled tokens' ranks), got "
                            f"{type(ranks).__name__}")
        for name, value in (("kept_set", kept_set), ("kept_bitmask", kept_bitmask)):
            if not isinstance(value, (bool, np.bool_)):
                raise TypeError(f"{name}: must be a bool, got {type(value).__name__}")
        if full_logprobs is not None:
            full_mode = _choice("full_logprobs", full_logprobs, _ffi.FULL_MODE_NAMES)
        elif out is not None:
            raise ValueError("out: given without full_logprobs (say which values it receives: "
                             "\"raw\", \"processed\" or \"processed_logits\")")
        index = None if row_index is None else int32_vector(row_index, "row_index")
        state = take_state()
        try:
            keep = []
            rows = self._fill_batch(state.batch, keep, state, logits, temperature, seeds, offsets, seeded,
                                    noise, noise_kind, top_k, top_p, min_p, top_n_sigma, requests, request_ids,
                                    (min_keep, typical_p, xtc_probability, xtc_threshold, dynatemp_range,
                                     dynatemp_exponent), index, append_to_requests)
            _pack_row_index(state, keep, index)
            if (prompt_tokens is None and output_tokens is None and repetition_penalty is None
                    and frequency_penalty is None and presence_penalty is None and logit_bias is None
                    and allowed_tokens is None and banned_tokens is None and token_bitmask is None
                    and penalty_last_n is None and min_tokens is None and stop_token_ids is None):
                if state.step_packed:
                    STEP_LAYOUT.pack_into(state.batch, STEP_OFFSET, *STEP_ZEROS)
                    state.step_packed = False
            else:
                self._fill_step(state, keep, rows, prompt_tokens, output_tokens, repetition_penalty,
                                    frequency_penalty, presence_penalty, logit_bias, allowed_tokens,
                                    banned_tokens, token_bitmask, penalty_last_n, min_tokens,
                                    stop_token_ids)
            given = 0
            if (bad_words is not None or forced_tokens is not None or logprob_token_ids is not None
                    or state.parity_packed):
                given = self._fill_parity(state, keep, rows, bad_words, forced_tokens, logprob_token_ids)
            if order is not None or state.order_packed:
                _fill_order(state, keep, order)
            self._fill_dry(state, keep, rows, (dry_multiplier, dry_base, dry_allowed_length, dry_penalty_last_n,
                                               dry_sequence_breakers))
            full = None
            if full_logprobs is not None:
                full, full_ptr, full_stride = _full_output(out, rows, state.batch.vocab)
                if out is not None:
                    _refuse_overlap(out, (
                        ("logits", logits), ("noise", noise), ("token_bitmask", token_bitmask),
                        ("temperature", temperature), ("seeds", seeds), ("offsets", offsets), ("seeded", seeded),
                        ("top_k", top_k), ("top_p", top_p), ("min_p", min_p), ("top_n_sigma", top_n_sigma),
                        ("prompt_tokens", prompt_tokens),
                        ("output_tokens", output_tokens), ("repetition_penalty", repetition_penalty),
                        ("frequency_penalty", frequency_penalty), ("presence_penalty", presence_penalty),
                        ("logit_bias", logit_bias), ("allowed_tokens", allowed_tokens),
                        ("banned_tokens", banned_tokens), ("penalty_last_n", penalty_last_n),
                        ("min_tokens", min_tokens), ("stop_token_ids", stop_token_ids), ("min_keep", min_keep),
                        ("typical_p", typical_p), ("xtc_probability", xtc_probability),
                        ("xtc_threshold", xtc_threshold), ("dynatemp_range", dynatemp_range),
                        ("dynatemp_exponent", dynatemp_exponent), ("forced_tokens", forced_tokens)))
                state.full_packed = True
                FULL_LAYOUT.pack_into(state.full_output, FULL_OFFSET, full_ptr, full_stride, full_mode, 0)
            elif state.full_packed:
                FULL_LAYOUT.pack_into(state.full_output, FULL_OFFSET, *FULL_ZEROS)
                state.full_packed = False
            # Positional: a dataclass built by keyword costs ~0.3 µs more.
            res = DrawResult(
                np.empty(rows, dtype=np.int32),  # tokens
                np.zeros(rows, dtype=np.uint32),  # flags
                np.empty(rows, dtype=np.float32),  # logprobs
                np.empty(rows, dtype=np.int32) if ranks else None,  # ranks
                np.empty((rows, n), dtype=np.int32) if n else None,  # topn_ids
                np.empty((rows, n), dtype=np.float32) if n else None,  # topn_logprobs
                full,  # full_logprobs
                np.empty(given, dtype=np.float32) if logprob_token_ids is not None else None,  # token_logprobs
                np.empty(given, dtype=np.int32) if logprob_token_ids is not None and ranks else None,  # token_ranks
            )
            miro = (mirostat, mirostat_tau, mirostat_eta, mirostat_m, mirostat_mu)
            if any(v is not None for v in miro) or state.mirostat_packed:
                self._fill_mirostat(state, keep, rows, miro)
            if mirostat is not None:
                res.mirostat_mu = np.empty(rows, dtype=np.float32)
                POINTER_LAYOUT.pack_into(state.full_output, MIROSTAT_OUT_OFFSET, address(res.mirostat_mu))
                state.mirostat_out_packed = True
            elif state.mirostat_out_packed:
                POINTER_LAYOUT.pack_into(state.full_output, MIROSTAT_OUT_OFFSET, 0)
                state.mirostat_out_packed = False
            if kept_set or kept_bitmask:
                _kept_outputs(res, rows, state.batch.vocab, kept_set, kept_bitmask)
                KEPT_LAYOUT.pack_into(state.full_output, KEPT_OFFSET, *(
                    0 if arr is None else address(arr)
                    for arr in (res.kept_threshold, res.kept_count, res.kept_mass, res.kept_bitmask)))
                state.kept_packed = True
            elif state.kept_packed:
                KEPT_LAYOUT.pack_into(state.full_output, KEPT_OFFSET, 0, 0, 0, 0)
                state.kept_packed = False
            if logprob_token_ids is not None:
                GIVEN_LAYOUT.pack_into(state.full_output, GIVEN_OFFSET, address(res.token_logprobs),
                                       address(res.token_ranks) if ranks else 0)
                state.given_packed = True
            elif state.given_packed:
                GIVEN_LAYOUT.pack_into(state.full_output, GIVEN_OFFSET, 0, 0)
                state.given_packed = False
            OUTPUT_LAYOUT.pack_into(state.full_output, 0, OUTPUT_SIZE, mode, address(res.tokens), address(res.flags),
                                    address(res.logprobs), address(res.ranks) if ranks else 0, n, 0,
                                    address(res.topn_ids) if n else 0, address(res.topn_logprobs) if n else 0)
            h = self._live_handle()  # self._run(), inlined as in draw()
            if targets is None:
                status = _ffi.lib().tokenrace_draw(h.ptr, state.batch_ptr, state.full_output_ptr)
            else:
                if len(targets) != rows:
                    raise ValueError(f"target_ids: has {len(targets)} entries, the batch has {rows} rows "
                                     f"(one target per row)")
                status = _score_function()(h.ptr, state.batch_ptr, targets.ctypes.data_as(_INT32_P), state.full_output_ptr)
            if status:
                _raise(status)
            del h
            if type(logits) is not np.ndarray and is_torch_tensor(logits):
                return _result_as_torch(res, out)
            return res
        finally:
            state.in_use = False  # release_state(), inlined

    # -- speculative decoding ------------------------------------------------------------------

    def verify(self, target_logits, draft_tokens, draft_counts, *, draft_probs=None, temperature=None,
               top_k=None, top_p=None, min_p=None, seeds=None, offsets=None, seeded=None, uniforms=None,
               noise=None, noise_kind="exp", logprobs=False, logprob_mode="raw", draft_parents=None,
               prompt_tokens=None, output_tokens=None, repetition_penalty=None, frequency_penalty=None,
               presence_penalty=None, logit_bias=None, allowed_tokens=None, banned_tokens=None, token_bitmask=None,
               bad_words=None, min_tokens=None, stop_token_ids=None):
        """Verifies draft tokens (speculative decoding) by vLLM's rejection sampling; returns a
        ``VerifyResult``. See ``docs/semantics.md``, Verifying draft tokens.

        Request i has ``n_i = draft_counts[i] >= 0`` draft tokens and ``n_i + 1`` target rows (its
        drafts' positions, then a bonus position). A greedy request (temperature below the
        sampler's ``greedy_below``) accepts each draft while it is the target row's argmax; a
        sampling request accepts draft d at row j when ``u_j < p_j(d) / q_j(d)`` (in float64),
        ``p_j`` being what a draw of row j samples from (temperature, then min-p, top-k, top-p).
        At the first rejection it emits a token drawn from ``max(p_j - q_j, 0)`` and stops; if
        every draft is accepted it emits a draw from the bonus row. So request i emits
        ``counts[i]`` tokens, 1 to ``n_i + 1``: its accepted drafts, then one more.

        target_logits: 2-D, ``sum(draft_counts) + len(draft_counts)`` rows x vocab (at most the
            sampler's ``max_rows`` rows), request after request; float32/float16 numpy arrays or
            CPU torch tensors (float32/float16/bfloat16), read in place (rows any stride apart,
            values inside a row contiguous).
        draft_tokens: flat integer ids, ``sum(draft_counts)``: every request's drafts, one after
            the other (1-D array, tensor or list; int32 is passed without a copy). -1 is vLLM's
            placeholder (``PLACEHOLDER_TOKEN_ID``): the draft is rejected where it stands (the
            request emits the token of any rejection there and stops); any other negative id
            raises ValueError.
        draft_counts: one non-negative integer per request (1-D).
        draft_probs: None (the drafts are deterministic: q is one-hot at each draft, as for
            n-gram or EAGLE drafts without probabilities), or float32, one row of ``vocab``
            probabilities per draft token (``sum(draft_counts)`` rows, each >= 0 and summing to 1
            within 1e-3; read in place).
        temperature, top_k, top_p, min_p, seeds, offsets, seeded: per request, a scalar (every
            request) or one value each, with ``draw``'s meanings and defaults; every target row
            of a request takes its request's values.
        seeds, offsets: a seeded request's acceptance uniforms and the noise of its recovered or
            bonus draw at draft position j are a pure function of (seed, offset + j): the same
            tokens whatever its batch mates, thread count or SIMD level, on every
            tensor-parallel rank. ``offsets`` is the position of the request's first draft token
            (default 0; without ``seeds`` a ValueError). Unseeded requests take keys from the
            sampler's stream.
        uniforms: float64, one per draft token (``sum(draft_counts)``), each in (0, 1): the
            acceptance uniforms of the unseeded sampling requests (None: from the sampler's
            stream). Seeded and greedy requests do not use theirs. float32 arrays are refused
            (24 random bits, not 53).
        noise: float32 noise of the unseeded sampling requests' recovered and bonus draws, one row
            per target row (a draw uses the noise of its own row), or one row shared by every
            row; ``noise_kind`` "exp" (E ~ Exp(1)) or "log_exp" (ln E), as in ``draw``.
        logprobs: also return ``r.logprobs``, each emitted token's logprob in its target row, in
            ``logprob_mode`` ("raw" or "processed", as ``draw_full``).
        draft_parents: None (each request's drafts are a chain), or a draft tree per request
            (EAGLE-style): one integer per draft node (``sum(draft_counts)``), request-local, -1
            for a child of the request's context, else the index of an earlier node of the same
            request. Row 0 of a request is then its root's target row and row ``1 + i`` node i's
            (the target after node i's path). A node's children are judged at its row in index
            order by recursive rejection sampling (``docs/semantics.md``, Draft trees); with
            ``draft_probs`` each node's row is the distribution it was drawn from, equal among
            siblings. ``r.accepted_nodes`` holds the accepted nodes in path order, then -1.
        prompt_tokens, output_tokens, repetition_penalty, frequency_penalty, presence_penalty,
            logit_bias, allowed_tokens, banned_tokens, bad_words, min_tokens, stop_token_ids: the
            sampling step applied to every target row before it judges (``docs/semantics.md``,
            The sampling step in verification), in ``draw``'s forms with one entry PER REQUEST
            (a request stands for a row). Target row j of a request is processed exactly as a
            draw of it would be with the request's inputs and the output history ``output_tokens
            + drafts[:j]`` (vLLM's rule: the penalties count the drafts before the position, bad
            words match against them, min_tokens counts them); a tree node's history is the
            output, then its ancestors' drafts and its own.
        token_bitmask: a grammar bitmask with one row PER TARGET ROW (int32, xgrammar's layout,
            ``rows x ceil(vocab / 32)``), as ``draw``'s.

        Returns a ``VerifyResult``: ``tokens`` (int32, requests x (max(draft_counts) + 1), each
        request's emitted tokens then -1, vLLM's placeholder), ``counts`` (int32 per request),
        ``flags`` (uint32 per request, the ``FLAG_*`` bits of the target rows it looked at, or-ed)
        and ``logprobs`` (float32 as ``tokens``, NaN in the padding; None unless asked).

        Shapes, dtypes and lengths that do not fit raise ``ValueError`` (or ``TypeError``) naming
        the argument before the call; bad values raise ``InvalidArgumentError`` with the library's
        message naming the field, the request and the draft (``batch.draft_probs[3]: request 1,
        draft 0: sums to 0.5, not 1 within 1e-3``). Nothing is returned from a failed call.
        """
        return _verify(self, target_logits, draft_tokens, draft_counts, draft_probs, temperature, top_k, top_p,
                      min_p, seeds, offsets, seeded, uniforms, noise, noise_kind, logprobs, logprob_mode,
                      draft_parents, step={
                          "prompt_tokens": prompt_tokens, "output_tokens": output_tokens,
                          "repetition_penalty": repetition_penalty, "frequency_penalty": frequency_penalty,
                          "presence_penalty": presence_penalty, "logit_bias": logit_bias,
                          "allowed_tokens": allowed_tokens, "banned_tokens": banned_tokens,
                          "token_bitmask": token_bitmask, "bad_words": bad_words, "min_tokens": min_tokens,
                          "stop_token_ids": stop_token_ids})


def _raise(status):
    """``check(status)``, with the argument of ``draw`` named after the library's message when it
    names a field of the sampling step (``batch.prompt_ids[3]: ...`` comes from
    ``prompt_tokens``)."""
    try:
        check(status)
    except InvalidArgumentError as e:
        message = str(e)
        for field, argument in FIELD_ARGUMENTS.items():
            if f"batch.{field}[" in message or f"batch.{field}:" in message:
                if argument != field:
                    raise InvalidArgumentError(f"{message} (argument {argument})") from None
                break
        raise


def _result_as_torch(res, out):
    """A ``DrawResult`` of numpy arrays as one of torch tensors over the same memory; an ``out``
    given for ``full_logprobs`` is returned as it is, array or tensor."""
    fields = [None if value is None else as_torch(value)
              for value in (res.tokens, res.flags, res.logprobs, res.ranks, res.topn_ids, res.topn_logprobs)]
    full = res.full_logprobs
    given = [None if value is None else as_torch(value)
             for value in (res.token_logprobs, res.token_ranks, res.kept_threshold, res.kept_count, res.kept_mass,
                           res.kept_bitmask)]
    return DrawResult(*fields, full if full is None or out is not None else as_torch(full), *given)


def _kept_outputs(res, rows, vocab, kept_set, kept_bitmask):
    """The arrays of the kept-set outputs asked for, set on ``res`` (the others stay None)."""
    if kept_set:
        res.kept_threshold = np.empty(rows, dtype=np.float32)
        res.kept_count = np.empty(rows, dtype=np.int32)
        res.kept_mass = np.empty(rows, dtype=np.float64)
    if kept_bitmask:
        res.kept_bitmask = np.empty((rows, (vocab + 31) // 32), dtype=np.int32)


def _full_output(out, rows, vocab):
    """``(array, address, row stride)`` of the full-vocabulary output: ``out`` checked, or a new
    rows x vocab float32 array."""
    if out is None:
        arr = np.empty((rows, vocab), dtype=np.float32)
        return arr, address(arr), vocab
    if not (isinstance(out, np.ndarray) or is_torch_tensor(out)):
        raise TypeError(f"out: must be a float32 numpy array or CPU torch tensor, got {type(out).__name__}")
    if isinstance(out, np.ndarray):
        if out.dtype != np.float32:
            raise ValueError(f"out: has dtype {out.dtype}; full_logprobs are written as float32")
        if not out.flags.writeable:
            raise ValueError("out: is read-only")
    view = rows_view(out, "out", NOISE_DTYPES)  # float32 only; inner-contiguous, rows apart
    want = (rows, vocab) if view.ndim == 2 else (vocab,)
    if tuple(out.shape) != want or (view.ndim == 1 and rows != 1):
        raise ValueError(f"out: has shape {tuple(out.shape)}, the batch needs ({rows}, {vocab})")
    return out, view.ptr, view.row_stride


def _refuse_overlap(out, inputs):
    """Refuses an ``out`` whose bytes meet those of any array or tensor among ``inputs`` (pairs
    of an argument's name and value): the library writes ``out`` while it reads the inputs, so
    an ``out`` over the logits (even one row ahead of them) would feed the call values it has
    written. Compared by address range (data pointer to the last element the strides reach), for
    numpy arrays and torch tensors alike."""
    span = byte_span(out)
    if span is None:
        return
    low, high = span
    for name, value in inputs:
        for arr in arrays_in(value):
            other = byte_span(arr)
            if other is not None and other[0] < high and low < other[1]:
                raise ValueError(
                    f"out: overlaps {name}: out spans bytes [{low:#x}, {high:#x}), {name} [{other[0]:#x}, "
                    f"{other[1]:#x}); the call writes out while it reads {name}, pass an out that shares no "
                    f"memory with the inputs")


# Per-row arguments, as the address the batch struct gets. A scalar of a plain type that fits the
# C type goes through the thread's cached array (``RepeatedValue``); anything else (arrays,
# lists, tensors, values to refuse) through ``per_row()``, which converts, checks and words the
# errors.

_F32_MAX = float(np.finfo(np.float32).max)


def _slow_rows(value, rows, dtype, name, keep):
    arr = per_row(value, rows, dtype, name)
    keep.append(arr)
    return address(arr)


def _float_rows(cache, value, rows, name, keep):
    # NaN and values beyond the f32 range fail the comparison: per_row() converts those as numpy does.
    if cache is not None and type(value) in FLOAT_SCALARS and -_F32_MAX <= value <= _F32_MAX:
        return cache.address_for(float(value), rows)
    return _slow_rows(value, rows, np.float32, name, keep)


def _llama_rows(state, llama, rows, keep):
    """The four pointers of llama.cpp's filters' block (0: not given)."""
    min_keep, typical_p, xtc_probability, xtc_threshold, dynatemp_range, dynatemp_exponent = llama
    return (
        0 if min_keep is None else _int32_rows(state and state.min_keep, min_keep, rows, "min_keep", keep),
        0 if typical_p is None else _float_rows(state and state.typical_p, typical_p, rows, "typical_p", keep),
        0 if xtc_probability is None else _float_rows(state and state.xtc_probability, xtc_probability, rows,
                                                      "xtc_probability", keep),
        0 if xtc_threshold is None else _float_rows(state and state.xtc_threshold, xtc_threshold, rows,
                                                    "xtc_threshold", keep),
        0 if dynatemp_range is None else _float_rows(state and state.dynatemp_range, dynatemp_range, rows,
                                                     "dynatemp_range", keep),
        0 if dynatemp_exponent is None else _float_rows(state and state.dynatemp_exponent, dynatemp_exponent,
                                                        rows, "dynatemp_exponent", keep),
    )


def _int32_rows(cache, value, rows, name, keep):
    if cache is not None and type(value) in INT_SCALARS and -2**31 <= value < 2**31:
        return cache.address_for(int(value), rows)
    return _slow_rows(value, rows, np.int32, name, keep)


def _uint64_rows(cache, value, rows, name, keep):
    if cache is not None and type(value) in INT_SCALARS and 0 <= value < 2**64:
        return cache.address_for(int(value), rows)
    return _slow_rows(value, rows, np.uint64, name, keep)


def _flag_rows(cache, value, rows, name, keep):
    if cache is not None and type(value) in FLAG_SCALARS:
        return cache.address_for(1 if value else 0, rows)
    return _slow_rows(value, rows, np.uint8, name, keep)


@dataclass
class DrawResult:
    """What ``Sampler.draw_full`` returns (one entry per row; topn_* are rows x n, or None)."""

    tokens: np.ndarray
    flags: np.ndarray
    logprobs: np.ndarray
    ranks: Optional[np.ndarray]  # with ``ranks=True``
    topn_ids: Optional[np.ndarray] = None
    topn_logprobs: Optional[np.ndarray] = None
    full_logprobs: Optional[np.ndarray] = None  # rows x vocab float32, with ``full_logprobs=`` (``out`` if given)
    # With ``logprob_token_ids=``: one logprob (float32) per id, row after row, and with
    # ``ranks=True`` one rank (int32) per id.
    token_logprobs: Optional[np.ndarray] = None
    token_ranks: Optional[np.ndarray] = None
    # With ``kept_set=True``: per row the kept set's threshold (float32), count (int32) and mass
    # (float64); with ``kept_bitmask=True``: rows x ceil(vocab / 32) int32 words.
    kept_threshold: Optional[np.ndarray] = None
    kept_count: Optional[np.ndarray] = None
    kept_mass: Optional[np.ndarray] = None
    kept_bitmask: Optional[np.ndarray] = None
    # With ``mirostat=``: each row's mu after the draw (float32; NaN for a row without mirostat),
    # the ``mirostat_mu`` of its next draw.
    mirostat_mu: Optional[np.ndarray] = None


def _mu_out(arr, rows):
    """The address of ``mirostat_mu_out``: a writable, C-contiguous float32 numpy array of
    ``rows`` entries, which receives each row's mu after the draw."""
    if not (isinstance(arr, np.ndarray) and arr.dtype == np.float32 and arr.ndim == 1 and arr.flags.c_contiguous
            and arr.flags.writeable):
        raise TypeError("mirostat_mu_out: must be a writable, contiguous 1-D float32 numpy array")
    if len(arr) != rows:
        raise ValueError(f"mirostat_mu_out: has {len(arr)} entries, the batch has {rows} rows")
    return address(arr)


def _config_from_env():
    """``tokenrace_config_from_env()`` (see ``_from_env``)."""
    return _from_env(_ffi.tokenrace_config, _ffi.lib().tokenrace_config_from_env)


def stage_ids(order) -> np.ndarray:
    """The ``tokenrace_stage`` ids of ``order`` (a tuple or list of stage names), as uint32."""
    if isinstance(order, (str, bytes)) or not hasattr(order, "__len__"):
        raise ValueError(f"order: a tuple of stage names, not {type(order).__name__}")
    if len(order) == 0:
        raise ValueError("order: lists no stage (None: the sampler's filter_order)")
    ids = np.empty(len(order), dtype=np.uint32)
    for i, name in enumerate(order):
        stage = _ffi.STAGE_IDS.get(name) if isinstance(name, str) else None
        if stage is None:
            raise ValueError(f"order[{i}]: {name!r} is not a stage (one of {', '.join(_ffi.STAGE_IDS)})")
        ids[i] = stage
    return ids


def _pack_row_index(state, keep, index):
    """Writes the batch's ``row_index`` (an int32 array, or None), or zeroes it again after a call
    that wrote it."""
    if index is not None:
        keep.append(index)
        POINTER_LAYOUT.pack_into(state.batch, ROW_INDEX_OFFSET, address(index))
        state.row_index_packed = True
    elif state.row_index_packed:
        POINTER_LAYOUT.pack_into(state.batch, ROW_INDEX_OFFSET, 0)
        state.row_index_packed = False


def _fill_order(state, keep, order):
    """Writes the batch's order block for a call that passes ``order``, or zeroes it again after a
    call that wrote it."""
    if order is None:
        ORDER_LAYOUT.pack_into(state.batch, ORDER_OFFSET, 0, 0)
        state.order_packed = False
        return
    ids = stage_ids(order)
    keep.append(ids)
    ORDER_LAYOUT.pack_into(state.batch, ORDER_OFFSET, address(ids), len(ids))
    state.order_packed = True
