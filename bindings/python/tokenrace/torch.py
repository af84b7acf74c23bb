"""tokenrace for PyTorch: vLLM's CPU sampling steps on tokenrace, reading CPU tensors in place.

``TopKTopPSampler``
    A drop-in for vLLM's ``vllm.v1.sample.ops.topk_topp_sampler.TopKTopPSampler``:
    ``forward_native(logits, generators, k, p)`` and ``forward_cpu`` (the same) return
    ``(sampled int64 [rows], None)``. vLLM calls it with logits already divided by the
    temperature (``Sampler.sample`` applies the temperature, then min-p, then calls it), so it
    draws at T = 1 from the logits as given, after top-k and top-p.
``sample(logits, temperature, ...)``
    The fused step that replaces vLLM's ``Sampler.sample`` (and, given the sampling step's
    inputs in the forms of vLLM V1's ``SamplingMetadata``, everything ``Sampler.forward`` does
    before it: the allowed-token mask, bad words, logit bias and penalties): raw logits in,
    greedy rows (T < the sampler's ``greedy_below``, 1e-5 as vLLM's ``_SAMPLING_EPS``),
    temperature, min-p, top-k, top-p and the draw in one native call, optionally with the
    logprobs triple of vLLM's ``LogprobsTensors``.
``score(logits, target_ids, ...)``
    Prompt logprobs: the logprob, rank and top-n of one target token per row, nothing drawn.
``rejection_sample(target_logits, draft_token_ids, num_draft_tokens, temperature, ...)``
    The verification step of speculative decoding, with the shape of vLLM's
    ``RejectionSampler.forward`` output: int32 ``[batch, max_spec_len + 1]``, each request's
    accepted drafts and its recovered or bonus token, padded with -1 (vLLM's
    ``PLACEHOLDER_TOKEN_ID``). One native call (``Sampler.verify``) does the target
    distributions, the acceptance tests, the recovered and the bonus draws.

Seeds: vLLM gives each seeded request a ``torch.Generator``; per step its CPU path draws one value
from it (``torch.randint(0, 2**31, (1,), generator=gen)``) as the row's seed. So do these
functions: that value becomes the row's tokenrace seed (offset 0), so a seeded request draws the
same tokens whatever its batch mates are, and the same generator state gives the same token.
Unseeded rows take keys from the tokenrace sampler's own stream (not torch's global RNG). A
refused call leaves every generator as it was: its state is saved before the draw and put back
when the call fails, so a retried batch draws the same seeds.

Tokens are not bit-identical to vLLM's (different noise), only identically distributed. What
tokenrace cannot honour is refused, not approximated: ``use_fp64_gumbel=True`` (tokenrace's
uniforms have 32 bits), the processed logprobs modes (vLLM's kept set differs from tokenrace's on
ties and rounding at the top-p boundary, so the masked logits would not be exactly vLLM's), GPU
tensors and dtypes other than float32, bfloat16 and float16.
"""

from __future__ import annotations

try:
    import torch
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "tokenrace.torch needs PyTorch, and the 'torch' package is not installed "
        "(pip install torch); the rest of tokenrace works without it, on numpy arrays") from error

import inspect
import threading
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from ._arrays import int32_vector
from ._sampler import Sampler
from ._step import _padded, _per_row_lists, _row_of

__all__ = ["KeptSet", "LogprobsTensors", "PLACEHOLDER_TOKEN_ID", "TopKTopPSampler", "rejection_sample", "sample",
           "sample_sharded", "score"]

# vLLM's padding of the rejection sampler's output (``rejection_sampler.PLACEHOLDER_TOKEN_ID``).
PLACEHOLDER_TOKEN_ID = -1

LOGPROBS_MODES = ("raw_logprobs", "raw_logits", "processed_logits", "processed_logprobs")
PROCESSED_LOGPROBS_MODES = ("processed_logits", "processed_logprobs")

# vLLM's CPU path draws each seeded row's per-step seed as torch.randint(0, 2**31).
_SEED_BOUND = 2**31


class LogprobsTensors(NamedTuple):
    """The logprobs of a step, laid out as vLLM's ``LogprobsTensors``: column 0 is the sampled
    token, columns 1..n the n most probable tokens (descending, lowest id first on ties)."""

    logprob_token_ids: "torch.Tensor"  # [rows, n + 1] int32 (vLLM casts its ids to int32)
    logprobs: "torch.Tensor"  # [rows, n + 1] float32
    selected_token_ranks: "torch.Tensor"  # [rows] int64: count of tokens with logprob >= the sampled one's


class KeptSet(NamedTuple):
    """Each row's kept set (docs/semantics.md, The kept set), as ``sample(sampling_mask=,
    kept_values=)`` returns it; a part not asked for is None."""

    mask: "torch.Tensor | None"  # bool [rows, vocab] (True: kept), or int32 [rows, ceil(vocab / 32)] words
    threshold: "torch.Tensor | None"  # float32 [rows]: the smallest kept value, before the temperature
    count: "torch.Tensor | None"  # int32 [rows]
    mass: "torch.Tensor | None"  # float64 [rows]: the share of the row's probability kept


SAMPLING_MASK_FORMS = ("bool", "bitmask")


def _make_sampler(sampler, threads, seed, simd, max_rows):
    settings = {name: value for name, value in
                (("threads", threads), ("seed", seed), ("simd", simd), ("max_rows", max_rows))
                if value is not None}
    if sampler is None:
        return Sampler(0, **settings)  # vocab 0: any vocabulary size
    if not isinstance(sampler, Sampler):
        raise TypeError(f"sampler: must be a tokenrace.Sampler, got {type(sampler).__name__}")
    if settings:
        raise ValueError(f"pass either sampler or its settings ({', '.join(settings)}), not both: "
                         f"the settings of an existing sampler are fixed")
    return sampler


def _check_logits(logits, name="logits"):
    """The row count of a 2-D CPU tensor; the dtype and layout are checked by the binding."""
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"{name}: must be a torch.Tensor, got {type(logits).__name__}")
    if logits.device.type != "cpu":
        raise ValueError(f"{name}: is a tensor on device '{logits.device}'; tokenrace samples on the "
                         f"host, pass {name}.cpu() (or keep vLLM's own sampler for device tensors)")
    if logits.dim() != 2:
        raise ValueError(f"{name}: must be 2-D [rows, vocab], got shape {tuple(logits.shape)}")
    return logits.shape[0]


def generator_seeds(generators, rows, unit="row"):
    """The per-row ``(seeds, seeded)`` arrays for vLLM's per-request generators, or
    ``(None, None)`` without any: each row in ``generators`` draws one value from its generator,
    exactly as vLLM's ``forward_cpu`` does (``torch.randint(0, 2**31, (1,), generator=gen)``),
    which advances the generator by one draw per step; the other rows are unseeded. (``unit``:
    what a row is called in messages, "request" for ``rejection_sample``.) The generators are
    checked before any of them advances; a caller whose call may still fail afterwards uses
    ``_GeneratorDraws`` instead, which also puts them back."""
    draws = _GeneratorDraws(generators, rows, unit)
    return draws.seeds, draws.seeded


class _GeneratorDraws:
    """The seeds of one call drawn from vLLM's per-request generators, and the generators' states
    from before the draws: a call that fails afterwards (a value the binding or the library
    refuses, e.g. a draft id outside the vocabulary or a q row that does not sum to 1) puts every
    generator back with ``restore()``, so a refused call leaves them exactly as they were and a
    retried batch draws the same seeds.

    Why restore rather than draw last: the seeds are inputs of the native call, and the library's
    value checks (ids against the vocabulary, q rows summed in its fixed order, filter values, the
    row limit, memory) cannot all be repeated here exactly and without a second pass over the
    data. The cost is one ``get_state()`` per seeded row per call (a copy of the generator's
    state). While the call runs, no other thread may draw from these generators (vLLM's are one
    request's, used by the engine's thread)."""

    __slots__ = ("seeds", "seeded", "_saved")

    def __init__(self, generators, rows, unit="row"):
        self.seeds = self.seeded = None
        self._saved = ()
        if not generators:
            return
        for row, generator in generators.items():  # all checked before any generator advances
            if isinstance(row, bool) or not isinstance(row, (int, np.integer)) or not 0 <= row < rows:
                raise ValueError(f"generators: {unit} {row!r} is outside the batch of {rows} {unit}s")
            if not isinstance(generator, torch.Generator):
                raise TypeError(f"generators[{row}]: must be a torch.Generator, got {type(generator).__name__}")
            if generator.device.type != "cpu":
                raise ValueError(f"generators[{row}]: is a generator on device '{generator.device}'; "
                                 f"tokenrace draws the seeds of CPU generators")
        # Every state is saved before the first draw: a generator given for two rows is put back
        # to its state before both.
        self._saved = [(generator, generator.get_state()) for generator in generators.values()]
        seeds = np.zeros(rows, dtype=np.uint64)
        seeded = np.zeros(rows, dtype=np.uint8)
        try:
            for row, generator in generators.items():
                seeds[row] = int(torch.randint(0, _SEED_BOUND, (1,), generator=generator, dtype=torch.long).item())
                seeded[row] = 1
        except BaseException:
            self.restore()
            raise
        self.seeds, self.seeded = seeds, seeded

    def restore(self):
        """Puts every generator back to its state before the draws."""
        for generator, state in reversed(self._saved):
            generator.set_state(state)


def _check_out(out, rows):
    """Checks ``out`` (None, or an int64/int32 CPU tensor [rows] to write the token ids into)
    before the call: a call refused for its ``out`` changes nothing."""
    if out is None:
        return
    if not isinstance(out, torch.Tensor) or out.device.type != "cpu":
        raise ValueError("out: must be a CPU torch.Tensor")
    if out.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"out: has dtype {out.dtype}; token ids are written as torch.int64 or torch.int32")
    if tuple(out.shape) != (rows,):
        raise ValueError(f"out: has shape {tuple(out.shape)}, the batch needs ({rows},)")


def _as_numpy(value):
    """A result of ``Sampler.draw``/``draw_full`` (torch tensors for tensor logits) as numpy, over
    the same memory."""
    return value.numpy() if isinstance(value, torch.Tensor) else value


def _tokens_tensor(tokens, out):
    """The int32 tokens (numpy, or a tensor over numpy memory) as vLLM's int64 tensor, or written
    into ``out`` (checked by ``_check_out`` before the call)."""
    tokens = _as_numpy(tokens)
    if out is None:
        return torch.from_numpy(tokens.astype(np.int64))
    out.detach().numpy()[...] = tokens  # a view of out's memory: numpy widens int32 to int64 in place
    return out


class TopKTopPSampler(torch.nn.Module):
    """vLLM's ``TopKTopPSampler`` on tokenrace (see the module doc).

    ``TopKTopPSampler(logprobs_mode="raw_logprobs", use_fp64_gumbel=False, *, sampler=None,
    threads=None, seed=None, simd=None, max_rows=None)``

    The first two arguments are vLLM's. ``sampler``: a ``tokenrace.Sampler`` to use (shared with
    other users: it is thread-safe); otherwise one is made with ``threads``, ``seed`` (of the
    unseeded rows' stream), ``simd`` and ``max_rows`` (which must cover vLLM's
    ``max_num_seqs``), each left to the ``TOKENRACE_*`` environment when None.

    Refused (ValueError): ``use_fp64_gumbel=True`` and the processed logprobs modes.
    """

    def __init__(self, logprobs_mode="raw_logprobs", use_fp64_gumbel=False, *, sampler=None,
                 threads=None, seed=None, simd=None, max_rows=None):
        super().__init__()
        if logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode: {logprobs_mode!r} is not one of {', '.join(LOGPROBS_MODES)}")
        if logprobs_mode in PROCESSED_LOGPROBS_MODES:
            raise ValueError(
                f"logprobs_mode={logprobs_mode!r} is not supported by tokenrace: vLLM returns the logits "
                f"masked by its own top-k/top-p, whose kept set differs from tokenrace's on ties and at the "
                f"top-p boundary (float rounding), so they would not be exactly vLLM's; use "
                f"'raw_logprobs' or 'raw_logits', or vLLM's own sampler")
        if use_fp64_gumbel:
            raise ValueError(
                "use_fp64_gumbel=True is not supported by tokenrace: its noise comes from 32-bit uniforms "
                "(docs/semantics.md, Noise), it cannot give fp64 exponentials; use vLLM's own sampler")
        self.logprobs_mode = logprobs_mode
        self.use_fp64_gumbel = False
        self.sampler = _make_sampler(sampler, threads, seed, simd, max_rows)

    def forward_native(self, logits, generators, k, p, *, out=None):
        """Top-k (``k``: None or an int tensor per row; k >= vocab or k < 1 is off for the row) and
        top-p (``p``: None or a float tensor per row; 1.0 is off), then a draw at T = 1 from the
        logits as given (vLLM has divided them by the temperature already). ``generators``: {row:
        torch.Generator} of the seeded rows. Returns ``(sampled, None)``: int64 [rows] (or
        ``out``), and None as vLLM does in the raw logprobs modes. The logits are not changed."""
        rows = _check_logits(logits)
        _check_out(out, rows)
        draws = _GeneratorDraws(generators, rows)
        try:
            tokens = self.sampler.draw(logits, seeds=draws.seeds, seeded=draws.seeded, top_k=k, top_p=p)
        except BaseException:
            draws.restore()  # a refused call leaves the generators as they were
            raise
        return _tokens_tensor(tokens, out), None

    # vLLM picks forward_cpu on x86, ARM and s390x, forward_native elsewhere: the same draw here.
    forward_cpu = forward_native

    def forward(self, logits, generators, k, p, *, out=None):
        return self.forward_native(logits, generators, k, p, out=out)


# -- the sampling step in vLLM V1's forms -----------------------------------------------------

# The keyword arguments of ``sample`` that carry the sampling step (vLLM V1's ``SamplingMetadata``
# names), in the order their docs list them.
STEP_ARGUMENTS = ("prompt_token_ids", "output_token_ids", "repetition_penalties", "frequency_penalties",
                  "presence_penalties", "allowed_token_ids_mask", "bad_words_token_ids", "logit_bias",
                  "token_bitmask")


def _step_arguments(rows, vocab, prompt_token_ids=None, output_token_ids=None, repetition_penalties=None,
                    frequency_penalties=None, presence_penalties=None, no_penalties=False,
                    allowed_token_ids_mask=None, bad_words_token_ids=None, logit_bias=None, token_bitmask=None,
                    penalty_last_n=None, dry=False, min_tokens=None):
    """The sampling step's keyword arguments of ``Sampler.draw`` from vLLM V1's forms, checked
    and converted here (before any generator advances), so that errors name vLLM's arguments.

    The histories go to the library as CSR (int32 ids, uint64 offsets): a padded int64 tensor is
    read through a numpy view of its memory and compacted in a few vectorised numpy calls (the C
    ABI takes int32 CSR, so that one conversion cannot be avoided). Penalty tensors and a
    grammar bitmask are read in place. ``dry``: whether DRY is on (it reads the histories too);
    ``min_tokens``: ``(per-row counts, per-row stop lists)`` or None (it reads the output's
    length)."""
    step = {}
    penalised = not no_penalties and any(
        value is not None for value in (repetition_penalties, frequency_penalties, presence_penalties))
    output = None
    if output_token_ids is not None and (penalised or bad_words_token_ids or dry or min_tokens is not None):
        output = _token_rows(output_token_ids, rows, vocab, "output_token_ids")
    if penalised:
        step.update(repetition_penalty=repetition_penalties, frequency_penalty=frequency_penalties,
                    presence_penalty=presence_penalties)
        if penalty_last_n is not None:
            step["penalty_last_n"] = penalty_last_n
    if (penalised or dry) and prompt_token_ids is not None:
        step["prompt_tokens"] = _token_rows(prompt_token_ids, rows, vocab, "prompt_token_ids")
    if output is not None:
        # The penalties, DRY, min_tokens and the bad words' prefix rule read the whole output.
        step["output_tokens"] = output
    if min_tokens is not None:
        step["min_tokens"], step["stop_token_ids"] = min_tokens
    if logit_bias is not None:
        if isinstance(logit_bias, Mapping) or not isinstance(logit_bias, (list, tuple)):
            raise TypeError(f"logit_bias: must be a list of one dict {{id: bias}} (or None) per row, as "
                            f"vLLM's SamplingMetadata holds it, got {type(logit_bias).__name__}")
        step["logit_bias"] = list(logit_bias)  # a list: the binding reads a tuple as CSR
    bitmask = None
    if allowed_token_ids_mask is not None:
        bitmask = _allowed_bitmask(allowed_token_ids_mask, rows, vocab)
    if token_bitmask is not None:
        if bitmask is None:
            bitmask = token_bitmask  # read in place by the binding, which checks it
        else:
            bitmask &= _grammar_words(token_bitmask, bitmask.shape)
    if bitmask is not None:
        step["token_bitmask"] = bitmask
    if bad_words_token_ids:
        step["bad_words"] = _bad_words(bad_words_token_ids, rows, vocab, output)
    return step


def _min_tokens(min_tokens, stop_token_ids, rows, output_given):
    """``(counts, stop lists)`` for ``Sampler.draw``'s ``min_tokens`` and ``stop_token_ids``:
    vLLM's form ``{row: (min_tokens, stop_token_ids)}`` (the min-tokens logits processor's
    state), or a per-row count (an int or an int tensor [rows]) with ``stop_token_ids`` (a list of
    per-row id lists, or one list for every row). The rule counts each row's output, so it needs
    ``output_token_ids`` (or ``requests``)."""
    if min_tokens is None:
        if stop_token_ids is not None:
            raise ValueError("stop_token_ids: given without min_tokens (they are banned only while a row's output "
                             "is shorter than its min_tokens)")
        return None
    if not output_given:
        raise ValueError("min_tokens: needs output_token_ids (or requests): a row's stop tokens are banned while "
                         "its output holds fewer than min_tokens tokens, and the output is what counts them")
    if isinstance(min_tokens, Mapping):
        if stop_token_ids is not None:
            raise ValueError("stop_token_ids: vLLM's {row: (min_tokens, stop_token_ids)} form holds them already")
        counts = np.zeros(rows, np.int32)
        stops = [None] * rows
        for row, entry in min_tokens.items():
            if isinstance(row, bool) or not isinstance(row, (int, np.integer)) or not 0 <= row < rows:
                raise ValueError(f"min_tokens: row {row!r} is outside the batch of {rows} rows")
            if not isinstance(entry, (tuple, list)) or len(entry) != 2:
                raise ValueError(f"min_tokens[{row}]: must be (min_tokens, stop_token_ids), vLLM's form, got "
                                 f"{entry!r}")
            counts[row] = int(entry[0])
            stops[row] = sorted(int(t) for t in entry[1])
        return counts, stops
    if stop_token_ids is None:
        raise ValueError("min_tokens: per-row counts need stop_token_ids (the tokens they ban), or pass vLLM's "
                         "{row: (min_tokens, stop_token_ids)}")
    if isinstance(stop_token_ids, (list, tuple)) and stop_token_ids and all(
            isinstance(t, (int, np.integer)) for t in stop_token_ids):
        stop_token_ids = [list(stop_token_ids)] * rows  # one list for every row
    return _as_numpy(min_tokens), stop_token_ids


def _sampling_mask_form(sampling_mask):
    if sampling_mask is not None and sampling_mask not in SAMPLING_MASK_FORMS:
        raise ValueError(f"sampling_mask: {sampling_mask!r} is not None, 'bool' (a bool tensor [rows, vocab]) or "
                         f"'bitmask' (int32 words [rows, ceil(vocab / 32)], xgrammar's layout)")
    return sampling_mask


def _kept_set(result, vocab, sampling_mask, kept_values) -> KeptSet:
    """The kept-set outputs of a ``draw_full`` as tensors: the bitmask and the values over the memory
    the library wrote; the bool mask unpacked from the bitmask (one pass: torch has no bit
    tensors)."""
    mask = None
    if sampling_mask is not None:
        words = np.ascontiguousarray(_as_numpy(result.kept_bitmask))
        if sampling_mask == "bitmask":
            mask = torch.from_numpy(words)
        else:
            bits = np.unpackbits(words.view(np.uint8), axis=1, bitorder="little")[:, :vocab]
            mask = torch.from_numpy(bits.view(np.bool_))
    if not kept_values:
        return KeptSet(mask, None, None, None)
    return KeptSet(mask, *(torch.from_numpy(np.asarray(_as_numpy(v)))
                           for v in (result.kept_threshold, result.kept_count, result.kept_mass)))


def _token_rows(value, rows, vocab, name):
    """A token history as a CSR tuple ``(int32 ids, uint64 offsets)``: a 2-D integer tensor (or
    numpy array) padded as vLLM pads it (entries equal to ``vocab``, or negative, are padding;
    anything above ``vocab`` is refused, naming row and column), or a list of per-row ids
    (vLLM's ``output_token_ids``: a list of lists), each id in ``[0, vocab)``."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        if isinstance(value, torch.Tensor) and value.device.type != "cpu":
            raise ValueError(f"{name}: is a tensor on device '{value.device}'; pass {name}.cpu()")
        return _padded(value, rows, vocab, name)
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{name}: must be a 2-D integer tensor padded with the vocabulary size {vocab}, or a "
                        f"list of per-row id lists, got {type(value).__name__}")
    ids, offsets, present = _per_row_lists(value, rows, name)
    bad = (ids < 0) | (ids >= vocab)
    if bad.any():
        entry = int(np.argmax(bad))
        r = _row_of(offsets, entry)
        raise ValueError(f"{name}[{r}]: position {entry - int(offsets[r])}: {int(ids[entry])} is not a token id "
                         f"in [0, {vocab})")
    return ids, offsets


def _allowed_bitmask(mask, rows, vocab):
    """vLLM V1's ``allowed_token_ids_mask`` (bool [rows, vocab], True where a token is NOT
    allowed; a row of a request without ``allowed_token_ids`` is all False) as a grammar bitmask
    in xgrammar's layout (bit set: allowed), packed in one numpy call over a view of the mask."""
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"allowed_token_ids_mask: must be a torch.Tensor, got {type(mask).__name__}")
    if mask.device.type != "cpu":
        raise ValueError(f"allowed_token_ids_mask: is a tensor on device '{mask.device}'; pass "
                         f"allowed_token_ids_mask.cpu()")
    if mask.dtype != torch.bool:
        raise ValueError(f"allowed_token_ids_mask: has dtype {mask.dtype}; vLLM's mask is torch.bool, True "
                         f"where a token is not allowed")
    if tuple(mask.shape) != (rows, vocab):
        raise ValueError(f"allowed_token_ids_mask: has shape {tuple(mask.shape)}, the logits need ({rows}, {vocab})")
    allowed = ~mask.detach().numpy()
    words = -(-vocab // 32)
    packed = np.zeros((rows, words * 4), np.uint8)
    packed[:, :(vocab + 7) // 8] = np.packbits(allowed, axis=1, bitorder="little")
    # Byte b bit j is token 8 b + j, so the little-endian words hold token 32 w + j at bit j.
    return packed.view("<i4").astype(np.int32, copy=False)


def _grammar_words(token_bitmask, shape):
    """The caller's grammar bitmask as int32 numpy words of ``shape``, to combine with the allowed
    mask's (both restrict the row: a token needs both bits)."""
    words = token_bitmask.detach().numpy() if isinstance(token_bitmask, torch.Tensor) else token_bitmask
    if not isinstance(words, np.ndarray) or words.dtype != np.int32:
        raise ValueError("token_bitmask: must be int32 words (xgrammar's layout) as a CPU tensor or numpy array")
    if tuple(words.shape) != shape:
        raise ValueError(f"token_bitmask: has shape {tuple(words.shape)}, the logits need {shape}")
    return words


def _bad_words(bad_words, rows, vocab, output):
    """vLLM's bad words (``{row: [word, ...]}``, each word a list of token ids) as the per-row
    word lists of ``Sampler.draw``'s ``bad_words``, which the library applies by vLLM's prefix
    rule (``vllm/v1/sample/ops/bad_words.py``): a word's last token is banned when the row's
    output ends with the word's other tokens (a one-token word: always). Each word is checked
    here, so that errors name vLLM's argument and the row's word."""
    if not isinstance(bad_words, Mapping):
        raise TypeError(f"bad_words_token_ids: must be a dict {{row: [word, ...]}} (vLLM's form), got "
                        f"{type(bad_words).__name__}")
    per_row = [None] * rows
    for row, words in bad_words.items():
        if isinstance(row, bool) or not isinstance(row, (int, np.integer)) or not 0 <= row < rows:
            raise ValueError(f"bad_words_token_ids: row {row!r} is outside the batch of {rows} rows")
        name = f"bad_words_token_ids[{row}]"
        checked = []
        for w, word in enumerate(words):
            word = _word_ids(word, vocab, f"{name}[{w}]")
            if len(word) > 1 and output is None:
                raise ValueError(f"{name}[{w}]: a word of {len(word)} tokens needs output_token_ids (vLLM's prefix "
                                 f"rule bans its last token after the output ends with the others)")
            checked.append(word)
        per_row[int(row)] = checked
    return per_row


def _word_ids(word, vocab, name):
    """One bad word as a list of Python ints, each checked to be a token id."""
    if type(word) is list and word and all(type(t) is int for t in word):
        ids = word  # vLLM's own form, taken as it is
    else:
        if isinstance(word, torch.Tensor):
            word = word.detach().numpy()
        try:
            arr = np.asarray(word)
        except (OverflowError, ValueError, TypeError) as error:
            raise ValueError(f"{name}: must be a list of token ids ({error})") from None
        if arr.ndim != 1 or arr.shape[0] == 0 or arr.dtype.kind not in "iu":
            raise ValueError(f"{name}: must be a non-empty list of token ids, got {word!r}")
        ids = arr.tolist()
    if min(ids) < 0 or max(ids) >= vocab:
        j = next(j for j, t in enumerate(ids) if not 0 <= t < vocab)
        raise ValueError(f"{name}: position {j}: {ids[j]} is not a token id in [0, {vocab})")
    return ids


_default_sampler = None
_default_lock = threading.Lock()


def default_sampler():
    """The sampler ``sample()`` uses when given none: made on first use from the ``TOKENRACE_*``
    environment, with any vocabulary size."""
    global _default_sampler
    with _default_lock:
        if _default_sampler is None:
            _default_sampler = Sampler(0)
        return _default_sampler


def _seed_arguments(generators, seeds, positions, rows, unit="row"):
    """``(seeds, seeded, offsets, draws)``; ``draws`` (a ``_GeneratorDraws``) restores the
    generators when the call fails."""
    if generators and seeds is not None:
        raise ValueError("pass generators or seeds, not both")
    if positions is not None and seeds is None:
        raise ValueError(f"positions: needs seeds (a position is the offset of a {unit}'s seed)")
    draws = _GeneratorDraws(generators, rows, unit)
    if generators:
        return draws.seeds, draws.seeded, None, draws
    return seeds, None, positions, draws


def sample(logits, temperature, *, top_k=None, top_p=None, min_p=None, generators=None, seeds=None,
           positions=None, logprobs=None, out=None, sampler=None, prompt_token_ids=None, output_token_ids=None,
           repetition_penalties=None, frequency_penalties=None, presence_penalties=None, no_penalties=False,
           allowed_token_ids_mask=None, bad_words_token_ids=None, logit_bias=None, token_bitmask=None,
           penalty_last_n=None, requests=None, request_ids=None, forced_tokens=None, logprob_token_ids=None,
           min_tokens=None, stop_token_ids=None, top_n_sigma=None, min_keep=None, typical_p=None,
           xtc_probability=None, xtc_threshold=None, dynatemp_range=None, dynatemp_exponent=None, order=None,
           dry_multiplier=None, dry_base=None, dry_allowed_length=None, dry_penalty_last_n=None,
           dry_sequence_breakers=None, row_index=None, sampling_mask=None, kept_values=False,
           append_to_requests=False):
    """One fused sampling step, replacing vLLM's ``Sampler.sample`` (and with the sampling
    step's arguments below, the masks, bias and penalties of ``Sampler.forward`` before it).

    logits: 2-D CPU tensor [rows, vocab] (float32, bfloat16 or float16), raw: before temperature,
        and before the sampling step when its arguments are given (otherwise with penalties,
        biases and masks already applied, as vLLM's ``sample`` receives them). Read in place,
        never changed.
    temperature: float or a float tensor per row; a row below the sampler's ``greedy_below``
        (1e-5, vLLM's ``_SAMPLING_EPS``) takes the argmax, lowest index on ties.
    top_k, top_p, min_p: None or a tensor (or scalar) per row, applied after temperature in
        vLLM's order min-p, top-k, top-p; off: k < 1 or k >= vocab, p = 1, min_p = 0.
    generators: {row: torch.Generator}, vLLM's per-request generators (one draw each per call,
        see the module doc); or ``seeds`` (non-negative 64-bit integers per row) with optional
        ``positions`` (the offset mixed into each seed, e.g. the token's position), the
        stateless alternative: the same (seed, position) always gives the same token.
    logprobs: None, or n >= 0 (-1: the whole vocabulary) to also return a ``LogprobsTensors``
        with the sampled token and the top n: log_softmax of the logits as given (before
        temperature), vLLM's default ``raw_logprobs``.
    out: an int64 or int32 CPU tensor [rows] to write the token ids into.
    sampler: the ``tokenrace.Sampler`` to use (default: ``default_sampler()``).

    The sampling step, in the forms of vLLM V1's ``SamplingMetadata`` (all optional, None: off),
    applied in vLLM's order (masks, bias, penalties; ``docs/semantics.md``, The sampling step)
    in the same native call, the logits unchanged:

    repetition_penalties, frequency_penalties, presence_penalties: a float tensor [rows] (or a
        scalar) each; 1.0, 0.0 and 0.0 are off for a row. ``no_penalties=True`` (vLLM's flag:
        no row has one) skips all three and the histories.
    penalty_last_n: None, or an int (or an int tensor [rows]) n >= 0: only the last n tokens of
        a row's prompt followed by its output count for the penalties (llama.cpp's window; 0
        counts every token, it does not turn the penalties off).
    prompt_token_ids: int64 tensor [rows, max prompt length] padded with the vocabulary size, as
        vLLM pads it (negative entries are padding too); read by the penalties only.
    output_token_ids: the tokens each row has generated: vLLM's list of per-row lists, or a 2-D
        integer tensor padded like the prompt's; read by the penalties and by multi-token bad
        words. (The C ABI takes int32 CSR, so a history is converted once: a padded tensor is
        compacted through a numpy view of its memory in a few vectorised calls.)
    allowed_token_ids_mask: bool tensor [rows, vocab], True where a token is NOT allowed (vLLM
        V1's mask; a row of a request without ``allowed_token_ids`` is all False). Packed into a
        bitmask of 1 bit per token.
    bad_words_token_ids: ``{row: [word, ...]}``, each word a list of token ids (vLLM's form). A
        one-token word bans its id; a longer word bans its last token when the row's output ends
        with its other tokens (vLLM's prefix rule), which needs ``output_token_ids``; the library
        applies the rule in the same call.
    logit_bias: a list of one ``{id: bias}`` dict (or None) per row; a bias adds to the logit,
        -inf bans the token (vLLM clamps biases to [-100, 100] when it builds the request).
    token_bitmask: a grammar bitmask in xgrammar's layout (int32 [rows, ceil(vocab / 32)], bit
        set: allowed), read in place; with ``allowed_token_ids_mask`` too, a token needs both.
    requests, request_ids: a ``tokenrace.Requests`` holding the histories (added once per
        request, appended to after each step) and one request id per row (a list or an integer
        tensor [rows]), instead of ``prompt_token_ids``/``output_token_ids`` (then None): the
        same tokens, bit for bit, without converting the histories every step. A per-row
        parameter left None (``temperature`` included) is the row's request's, when it holds
        them (``Requests.set_params``); ``append_to_requests=True`` appends each drawn token to
        its request once the call succeeds.
    forced_tokens: None, or an int tensor (or list) [rows]: a token id that the row returns
        instead of drawing (a thinking budget's end marker, a replayed trace), -1 to draw; its
        logprobs and rank are reported as if it had been drawn, and its noise is consumed as a
        drawn row's, so the other rows are unchanged (docs/semantics.md, forced tokens).
    logprob_token_ids: None, or per row the token ids whose logprobs are wanted (vLLM's
        ``logprob_token_ids``): a list with a list (or None) per row, ``{row: [ids]}``, or a CSR
        tuple ``(ids, offsets)`` of integer tensors (``rows + 1`` offsets, read in place). The
        ``LogprobsTensors`` then has vLLM's layout: column 0 the sampled token, then per row its
        given ids (in order) or, for a row without any, the top ``logprobs``; ``1 + max(logprobs,
        longest list)`` columns, unused cells id 0 with logprob -inf. Implies ``logprobs=0`` when
        ``logprobs`` is None.
    min_tokens, stop_token_ids: vLLM's ``{row: (min_tokens, stop_token_ids)}`` (the min-tokens
        logits processor's state), or an int (or int tensor [rows]) with ``stop_token_ids`` (per
        row a list of ids, or one list for every row): while a row's output (``output_token_ids``
        or ``requests``, needed) holds fewer than its min_tokens tokens, its stop tokens are banned.

    llama.cpp's filters and chain, and DRY, as ``Sampler.draw`` takes them (scalars or tensors
    [rows], read in place when their dtype is the C one: float32, or int32 for the counts):
    top_n_sigma, min_keep, typical_p, xtc_probability, xtc_threshold, dynatemp_range,
    dynatemp_exponent; order (a tuple of stage names, e.g. ``tokenrace.LLAMA_CPP_ORDER``);
    dry_multiplier, dry_base, dry_allowed_length, dry_penalty_last_n and dry_sequence_breakers
    (DRY reads ``prompt_token_ids`` then ``output_token_ids``, or ``requests``). Rows with
    typical sampling, XTC or a dynamic temperature report raw logprobs only, and no kept set.

    row_index: None, or an integer tensor (or list) [n]: vLLM's ``n > 1`` from one logits row,
        draw row r reading ``logits[row_index[r]]`` in place (never copied), with its own seed,
        generator, parameters and outputs. Every per-row argument, ``out`` and the results then
        have n rows (``docs/semantics.md``, Several outputs from one logits row).
    sampling_mask: None, ``"bool"`` or ``"bitmask"``: also return each row's kept set (the tokens
        its filters keep, what vLLM's model runner V2 ``return_sampling_mask`` reports): a bool
        tensor [rows, vocab], True where kept (unpacked from the library's bitmask, one pass), or
        the library's int32 words [rows, ceil(vocab / 32)] in xgrammar's layout as written (no
        copy). kept_values: True also returns the kept sets' threshold, count and mass.

    Returns the int64 token ids [rows] (or ``out``), with the ``LogprobsTensors`` when
    ``logprobs`` is given: ``(ids, logprobs_tensors)``; torch tensors, the logprobs over the
    memory the library wrote (the token ids are widened to vLLM's int64 once, or written into
    ``out``). Raw logprobs are those of the logits as given, before the step (vLLM's default).
    With ``sampling_mask`` or ``kept_values``: ``(ids, logprobs_tensors or None, KeptSet)``.
    A refused call (ValueError or TypeError naming the argument, or the library's
    InvalidArgumentError) leaves the generators as they were.
    """
    rows = _check_logits(logits)
    vocab = logits.shape[1]
    index = None
    if row_index is not None:
        index = int32_vector(row_index, "row_index")  # an int32 tensor is read in place
        rows = len(index)
    if sampler is not None and not isinstance(sampler, Sampler):
        raise TypeError(f"sampler: must be a tokenrace.Sampler, got {type(sampler).__name__}")
    n = None if logprobs is None else _top_count(logprobs, vocab)
    given = None if logprob_token_ids is None else _given_lists(logprob_token_ids, rows)
    if given is not None and n is None:
        n = 0
    mask_form = _sampling_mask_form(sampling_mask)
    if not isinstance(kept_values, (bool, np.bool_)):
        raise TypeError(f"kept_values: must be a bool, got {type(kept_values).__name__}")
    kept = mask_form is not None or bool(kept_values)
    forced = None if forced_tokens is None else _as_numpy(forced_tokens)
    _check_out(out, rows)
    step = _step_arguments(
        rows, vocab, prompt_token_ids=prompt_token_ids, output_token_ids=output_token_ids,
        repetition_penalties=repetition_penalties, frequency_penalties=frequency_penalties,
        presence_penalties=presence_penalties, no_penalties=no_penalties,
        allowed_token_ids_mask=allowed_token_ids_mask, bad_words_token_ids=bad_words_token_ids,
        logit_bias=logit_bias, token_bitmask=token_bitmask, penalty_last_n=penalty_last_n,
        dry=dry_multiplier is not None,
        min_tokens=_min_tokens(min_tokens, stop_token_ids, rows,
                               output_token_ids is not None or requests is not None))
    llama = dict(top_n_sigma=top_n_sigma, min_keep=min_keep, typical_p=typical_p, xtc_probability=xtc_probability,
                 xtc_threshold=xtc_threshold, dynatemp_range=dynatemp_range, dynatemp_exponent=dynatemp_exponent,
                 order=order, dry_multiplier=dry_multiplier, dry_base=dry_base,
                 dry_allowed_length=dry_allowed_length, dry_penalty_last_n=dry_penalty_last_n,
                 dry_sequence_breakers=dry_sequence_breakers, row_index=index)
    step.update({name: _as_numpy(value) for name, value in llama.items() if value is not None})
    sampler = default_sampler() if sampler is None else sampler
    # Everything this module checks is checked above, before any generator advances; the draw's
    # own checks and the library's refusals come after the seeds are drawn, and put the
    # generators back.
    row_seeds, seeded, offsets, draws = _seed_arguments(generators, seeds, positions, rows)
    draw_args = dict(temperature=temperature, seeds=row_seeds, seeded=seeded, offsets=offsets,
                     top_k=top_k, top_p=top_p, min_p=min_p, requests=requests, request_ids=request_ids,
                     forced_tokens=forced, append_to_requests=append_to_requests, **step)
    try:
        if n is None and not kept:
            return _tokens_tensor(sampler.draw(logits, **draw_args), out)
        if given is not None:
            draw_args["logprob_token_ids"] = (given[0], given[1].astype(np.uint64))
        result = sampler.draw_full(logits, logprobs=n or 0, ranks=n is not None, logprob_mode="raw",
                                   kept_set=bool(kept_values), kept_bitmask=mask_form is not None, **draw_args)
    except BaseException:
        draws.restore()
        raise
    logprobs_tensors = None
    if given is not None:
        logprobs_tensors = _logprobs_with_given(result, rows, n, given)
    elif n is not None:
        logprobs_tensors = _logprobs_tensors(result, rows, n)
    tokens = _tokens_tensor(result.tokens, out)
    if kept:
        return tokens, logprobs_tensors, _kept_set(result, vocab, mask_form, kept_values)
    return tokens, logprobs_tensors


def score(logits, target_ids, *, logprobs=0, mode="raw", temperature=None, top_k=None, top_p=None, min_p=None,
          logprob_token_ids=None, sampler=None, top_n_sigma=None, min_keep=None, typical_p=None, xtc_probability=None,
          xtc_threshold=None, dynatemp_range=None, dynatemp_exponent=None, order=None, seeds=None, positions=None,
          row_index=None):
    """Prompt logprobs (vLLM's ``compute_topk_scores`` for ``prompt_logprobs``): the logprob and
    rank of one target token per row, and the top ``logprobs``, with nothing drawn and no noise
    consumed, in one native call over every row (spread over the sampler's threads).

    logits: 2-D CPU tensor [positions, vocab] (float32, bfloat16 or float16), read in place.
    target_ids: an integer tensor (or list) [positions]: each row's target (the next prompt token).
    logprobs: n >= 0 (-1: the whole vocabulary) most probable tokens per row.
    mode: "raw" (log_softmax of the logits as given, vLLM's ``raw_logprobs``) or "processed"
        (after ``temperature`` and the filters ``top_k``/``top_p``/``min_p``, -inf outside the
        kept set; ``Sampler.score``).
    logprob_token_ids: as ``sample``'s: per row the ids whose logprobs fill the row's columns in
        place of its top n.
    top_n_sigma, min_keep, typical_p, xtc_probability, xtc_threshold, dynatemp_range,
        dynatemp_exponent, order: llama.cpp's filters and chain, as in ``sample`` (the processed
        mode judges the kept set they leave; rows with typical sampling, XTC or a dynamic
        temperature score raw logprobs only). seeds, positions: the keys of XTC's coins (a score
        draws nothing else).
    row_index: as ``sample``'s: several rows scored from one logits row, read in place.

    Returns a ``LogprobsTensors`` in vLLM's layout: column 0 the target, then the top n (or the
    row's given ids); ``selected_token_ranks`` the targets' ranks (int64). The values equal, bit
    for bit, those ``sample`` reports when it draws the same tokens.
    """
    rows = _check_logits(logits)
    index = None
    if row_index is not None:
        index = int32_vector(row_index, "row_index")  # an int32 tensor is read in place
        rows = len(index)
    if sampler is not None and not isinstance(sampler, Sampler):
        raise TypeError(f"sampler: must be a tokenrace.Sampler, got {type(sampler).__name__}")
    if positions is not None and seeds is None:
        raise ValueError("positions: needs seeds (a position is the offset of a row's seed)")
    n = _top_count(logprobs, logits.shape[1])
    given = None if logprob_token_ids is None else _given_lists(logprob_token_ids, rows)
    sampler = default_sampler() if sampler is None else sampler
    options = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    extra = dict(top_n_sigma=top_n_sigma, min_keep=min_keep, typical_p=typical_p, xtc_probability=xtc_probability,
                 xtc_threshold=xtc_threshold, dynatemp_range=dynatemp_range, dynatemp_exponent=dynatemp_exponent,
                 order=order, seeds=seeds, offsets=positions, row_index=index)
    options.update({name: _as_numpy(value) for name, value in extra.items() if value is not None})
    if given is not None:
        options["logprob_token_ids"] = (given[0], given[1].astype(np.uint64))
    result = sampler.score(logits, target_ids, logprobs=n, ranks=True, mode=mode, **options)
    if given is not None:
        return _logprobs_with_given(result, rows, n, given)
    return _logprobs_tensors(result, rows, n)


def _given_lists(value, rows):
    """``logprob_token_ids`` as ``(ids, offsets)``: int32 ids and ``rows + 1`` int64 offsets (row
    r's ids at ``ids[offsets[r]:offsets[r + 1]]``). Forms: a list with a list (or None) per row,
    ``{row: [ids]}``, or a CSR tuple ``(ids, offsets)`` of tensors or arrays (read as given; the
    library checks the ids and the offsets' order)."""
    if isinstance(value, tuple) and len(value) == 2 and not isinstance(value[0], (list, type(None))):
        ids, offsets = (_as_numpy(v) if isinstance(v, torch.Tensor) else np.asarray(v) for v in value)
        if ids.ndim != 1 or offsets.ndim != 1 or ids.dtype.kind not in "iu" or offsets.dtype.kind not in "iu":
            raise ValueError("logprob_token_ids: a CSR tuple (ids, offsets) needs 1-D integer ids and offsets")
        if len(offsets) != rows + 1:
            raise ValueError(f"logprob_token_ids: has {len(offsets)} offsets, a CSR list of {rows} rows needs "
                             f"{rows + 1}")
        return ids, offsets.astype(np.int64, copy=False)
    if isinstance(value, Mapping):
        lists = [[] for _ in range(rows)]
        for row, ids in value.items():
            if isinstance(row, bool) or not isinstance(row, int) or not 0 <= row < rows:
                raise ValueError(f"logprob_token_ids: key {row!r} is not a row in [0, {rows})")
            lists[row] = [] if ids is None else [int(t) for t in ids]
    elif isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
        raise TypeError("logprob_token_ids: must be a list of per-row id lists, {row: [ids]} or a CSR tuple "
                        f"(ids, offsets), got {type(value).__name__}")
    elif len(value) != rows:
        raise ValueError(f"logprob_token_ids: has {len(value)} rows, logits have {rows}")
    else:
        lists = [[] if ids is None else [int(t) for t in ids] for ids in value]
    offsets = np.zeros(rows + 1, np.int64)
    np.cumsum([len(ids) for ids in lists], out=offsets[1:])
    return np.fromiter((t for ids in lists for t in ids), np.int64, int(offsets[-1])), offsets


def _logprobs_with_given(result, rows, n, given) -> LogprobsTensors:
    """vLLM's layout with per-request token ids: the sampled token, then a row's given ids in
    place of its top n (a row without any keeps its top n); cells past a row's entries hold id 0
    and -inf."""
    ids_given, offsets = given
    lengths = np.diff(offsets)
    width = 1 + max(n, int(lengths.max(initial=0)))
    ids = np.zeros((rows, width), dtype=np.int32)
    values = np.full((rows, width), -np.inf, dtype=np.float32)
    ids[:, 0] = _as_numpy(result.tokens)
    values[:, 0] = _as_numpy(result.logprobs)
    token_logprobs = _as_numpy(result.token_logprobs)
    # Row r's k given entries (at offsets[r]..offsets[r] + k of the ids and of the library's
    # token_logprobs) go to columns 1..k.
    row_of = np.repeat(np.arange(rows), lengths)
    place = np.arange(len(row_of)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    at = np.repeat(offsets[:-1], lengths) + place
    ids[row_of, 1 + place] = ids_given[at]
    values[row_of, 1 + place] = token_logprobs[at]
    if n:
        without = lengths == 0
        ids[without, 1:1 + n] = _as_numpy(result.topn_ids)[without]
        values[without, 1:1 + n] = _as_numpy(result.topn_logprobs)[without]
    return LogprobsTensors(torch.from_numpy(ids), torch.from_numpy(values),
                           torch.from_numpy(_as_numpy(result.ranks).astype(np.int64)))


def _top_count(logprobs, vocab):
    if isinstance(logprobs, bool) or not isinstance(logprobs, int):
        raise TypeError(f"logprobs: must be None or an integer, got {type(logprobs).__name__}")
    if logprobs == -1:
        return vocab
    if not 0 <= logprobs <= vocab:
        raise ValueError(f"logprobs: {logprobs} is not in [0, {vocab}] (or -1 for the whole vocabulary)")
    return logprobs


def _logprobs_tensors(result, rows, n) -> LogprobsTensors:
    # vLLM's layout puts the sampled token in column 0 before the top n: one copy into it.
    ids = np.empty((rows, n + 1), dtype=np.int32)
    values = np.empty((rows, n + 1), dtype=np.float32)
    ids[:, 0] = _as_numpy(result.tokens)
    values[:, 0] = _as_numpy(result.logprobs)
    if n:
        ids[:, 1:] = _as_numpy(result.topn_ids)
        values[:, 1:] = _as_numpy(result.topn_logprobs)
    return LogprobsTensors(torch.from_numpy(ids), torch.from_numpy(values),
                           torch.from_numpy(_as_numpy(result.ranks).astype(np.int64)))


def _draft_counts(num_draft_tokens):
    """vLLM's ``num_draft_tokens`` (a list of ints, or a CPU integer tensor) as int32 numpy."""
    counts = int32_vector(num_draft_tokens, "num_draft_tokens")
    if counts.size and counts.min() < 0:
        i = int(np.argmax(counts < 0))
        raise ValueError(f"num_draft_tokens[{i}]: {counts[i]} is negative")
    return counts


def rejection_sample(target_logits, draft_token_ids, num_draft_tokens, temperature, *, draft_probs=None,
                     top_k=None, top_p=None, min_p=None, generators=None, seeds=None, positions=None,
                     max_spec_len=None, sampler=None, prompt_token_ids=None, output_token_ids=None,
                     repetition_penalties=None, frequency_penalties=None, presence_penalties=None,
                     no_penalties=False, allowed_token_ids_mask=None, bad_words_token_ids=None, logit_bias=None,
                     token_bitmask=None, draft_parents=None):
    """The verification step of speculative decoding, shaped as vLLM's rejection sampler
    (``RejectionSampler.forward``'s output), on ``Sampler.verify``.

    target_logits: 2-D CPU tensor [num_tokens + batch, vocab] (float32, bfloat16 or float16),
        raw (before temperature): for each request, the rows of its draft positions, then its
        bonus position, as vLLM's spec-decode logits are laid out. Read in place, never changed.
    draft_token_ids: integer tensor [num_tokens] (vLLM's ``metadata.draft_token_ids``): every
        request's drafts, one after the other. ``PLACEHOLDER_TOKEN_ID`` (-1), vLLM's padded or
        grammar-invalid draft, is rejected where it stands, as vLLM's rejection sampler does.
    num_draft_tokens: the draft count of each request (vLLM's ``metadata.num_draft_tokens``, a
        list of ints; 0 allowed), or an integer tensor [batch].
    temperature: float or a float tensor [batch]; a request below the sampler's ``greedy_below``
        (1e-5, vLLM's ``_SAMPLING_EPS``) is greedy: its drafts are accepted while they are the
        target's argmax. (vLLM leaves ``sampling_metadata.temperature`` None when every request
        is greedy: pass 0.0 then.)
    draft_probs: None (deterministic drafts: n-gram, EAGLE without probabilities) or a float32
        tensor [num_tokens, vocab] of the draft model's probabilities.
    top_k, top_p, min_p: None, a scalar or a tensor [batch], per request, as in ``sample``.
    generators: {request index: torch.Generator} of the seeded requests: each draws one value
        per call (``torch.randint(0, 2**31, (1,), generator=gen)``, as ``sample`` does), the
        request's tokenrace seed for this step. Or ``seeds`` (non-negative 64-bit integers per
        request) with optional ``positions`` (the position of each request's first draft token),
        the stateless alternative: the same (seed, position) gives the same tokens on every
        rank and in any batch. Unseeded requests use the tokenrace sampler's own stream.
    max_spec_len: the output's width minus 1 (default: max(num_draft_tokens)); at least the
        largest draft count.
    sampler: the ``tokenrace.Sampler`` to use (default: ``default_sampler()``).
    prompt_token_ids, output_token_ids, repetition_penalties, frequency_penalties,
    presence_penalties, no_penalties, allowed_token_ids_mask, bad_words_token_ids, logit_bias:
        the sampling step of vLLM's ``SamplingMetadata``, one entry PER REQUEST, in ``sample``'s
        forms (padded prompt/output id tensors, padding = vocab size; ``output_token_ids`` also
        vLLM's list of lists; the allowed mask bool [batch, vocab], True = not allowed;
        ``{request: [word, ...]}``; a list of ``{id: bias}`` dicts). Applied to each target row
        as vLLM's rejection sampler applies it: at draft position j the output history is the
        request's output followed by drafts 0..j-1 (the penalties count them, multi-token bad
        words match against them, docs/semantics.md "The sampling step in verification"); the
        bonus row's history holds every draft. Bit-identical to drawing each target row
        through ``sample`` with that history.
    token_bitmask: a grammar bitmask with one row per TARGET ROW (int32 [num_tokens + batch,
        ceil(vocab / 32)], xgrammar's layout: vLLM's spec-decode bitmask, a row per position);
        with ``allowed_token_ids_mask`` a token needs both.
    draft_parents: None (chains), or an integer tensor [num_tokens] making each request's drafts
        a tree (EAGLE-style), as ``Sampler.verify``'s ``draft_parents``: request-local, -1 for a
        child of the context, else an earlier node; target rows: the root's, then one per node.
        The output row is then the emitted path (``Sampler.verify`` also gives its node indices).

    Returns an int32 CPU tensor [batch, max_spec_len + 1]: request i's accepted drafts, then its
    recovered (first rejection) or bonus (every draft accepted) token, then
    ``PLACEHOLDER_TOKEN_ID`` (-1). Its accepted count is ``(row != -1).sum() - 1``.

    A refused call (ValueError, TypeError, the library's InvalidArgumentError) leaves the
    generators as they were (see ``_GeneratorDraws``).
    """
    rows = _check_logits(target_logits, "target_logits")
    if sampler is not None and not isinstance(sampler, Sampler):
        raise TypeError(f"sampler: must be a tokenrace.Sampler, got {type(sampler).__name__}")
    if temperature is None:
        raise TypeError("temperature: is None; pass 0.0 for greedy requests (vLLM's all_greedy leaves it None) "
                        "or the per-request temperatures")
    sampler = default_sampler() if sampler is None else sampler
    counts = _draft_counts(num_draft_tokens)
    longest = int(counts.max()) if counts.size else 0
    step = _verify_step_arguments(
        counts, rows, target_logits.shape[1], prompt_token_ids=prompt_token_ids, output_token_ids=output_token_ids,
        repetition_penalties=repetition_penalties, frequency_penalties=frequency_penalties,
        presence_penalties=presence_penalties, no_penalties=no_penalties,
        allowed_token_ids_mask=allowed_token_ids_mask, bad_words_token_ids=bad_words_token_ids,
        logit_bias=logit_bias, token_bitmask=token_bitmask)
    if max_spec_len is not None:  # checked before any generator advances
        if isinstance(max_spec_len, bool) or not isinstance(max_spec_len, (int, np.integer)):
            raise TypeError(f"max_spec_len: must be an integer, got {type(max_spec_len).__name__}")
        if max_spec_len < longest:
            raise ValueError(f"max_spec_len: {max_spec_len} is smaller than the largest draft count, {longest}")
    # The shapes and lengths ``Sampler.verify`` checks before its call, and the library's value
    # checks, come after the seeds are drawn: a refused call puts the generators back.
    req_seeds, seeded, offsets, draws = _seed_arguments(generators, seeds, positions, counts.size, "request")
    try:
        result = sampler.verify(target_logits, draft_token_ids, counts, draft_probs=draft_probs,
                                temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seeds=req_seeds,
                                seeded=seeded, offsets=offsets, draft_parents=draft_parents, **step)
    except BaseException:
        draws.restore()
        raise
    tokens = result.tokens
    if max_spec_len is not None and max_spec_len > longest:
        tokens = np.full((counts.size, int(max_spec_len) + 1), PLACEHOLDER_TOKEN_ID, dtype=np.int32)
        tokens[:, :longest + 1] = result.tokens
    return torch.from_numpy(tokens)


def _verify_step_arguments(counts, rows, vocab, token_bitmask=None, allowed_token_ids_mask=None, **kwargs):
    """The sampling step's keyword arguments of ``Sampler.verify`` from vLLM V1's forms: the
    histories, penalties, bias, allowed mask and bad words per REQUEST (as ``sample`` reads them
    per row, a request standing for a row), the grammar bitmask per TARGET ROW (vLLM's spec-decode
    bitmask: one row per draft position and one per bonus position). The allowed mask, packed per
    request, is repeated over the request's target rows and combined with the grammar bitmask (a
    token needs both)."""
    if (token_bitmask is not None and not isinstance(token_bitmask, (torch.Tensor, np.ndarray))):
        raise TypeError(f"token_bitmask: must be int32 words [rows, ceil(vocab / 32)] (a CPU tensor or numpy "
                        f"array), got {type(token_bitmask).__name__}")
    step = _step_arguments(int(counts.size), vocab, allowed_token_ids_mask=allowed_token_ids_mask, **kwargs)
    step.pop("penalty_last_n", None)
    per_request = step.pop("token_bitmask", None)
    bitmask = None
    if per_request is not None:
        bitmask = np.repeat(per_request, counts.astype(np.int64) + 1, axis=0)
    if token_bitmask is not None:
        if bitmask is None:
            bitmask = token_bitmask  # read in place by the binding, which checks its shape
        else:
            bitmask &= _grammar_words(token_bitmask, bitmask.shape)
    if bitmask is not None:
        step["token_bitmask"] = bitmask
    return step


def _all_gather_bytes(data: bytes, group):
    """Every rank's ``data`` (the same length on every rank), in rank order, through
    ``torch.distributed.all_gather`` (gloo on CPU)."""
    import torch.distributed as dist

    mine = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, mine, group=group)
    return [t.numpy().tobytes() for t in gathered]


# Why ``sample``'s arguments that ``sample_sharded`` lacks are not sharded (the refusals' words).
_NOT_SHARDED = {
    "requests": "the request state is not sharded (pass the histories as prompt_token_ids/output_token_ids)",
    "request_ids": "the request state is not sharded (pass the histories as prompt_token_ids/output_token_ids)",
    "forced_tokens": "forced tokens are not sharded",
    "logprob_token_ids": "the logprobs of given ids are not sharded",
    "top_n_sigma": "top-n-sigma's threshold needs the whole row's spread",
    "row_index": "several draws of one logits row are not sharded",
}


def sample_sharded(logits_slice, vocab_start, vocab_size, temperature, *, min_p=None, top_k=None, top_p=None,
                   seeds=None, positions=None, seeded=None, sampler=None, group=None, logprob_mode=None, top_n=0,
                   prompt_token_ids=None, output_token_ids=None, repetition_penalties=None, frequency_penalties=None,
                   presence_penalties=None, no_penalties=False, allowed_token_ids_mask=None,
                   bad_words_token_ids=None, logit_bias=None, token_bitmask=None, penalty_last_n=None,
                   min_tokens=None, stop_token_ids=None, dry_multiplier=None, dry_base=None,
                   dry_allowed_length=None, dry_penalty_last_n=None, dry_sequence_breakers=None,
                   **not_sharded):
    """One token per row from a vocabulary-parallel LM head's output, exactly as ``sample`` of the
    gathered rows would draw it (docs/semantics.md, "Sharded rows"): this rank holds
    ``logits_slice`` [rows, slice] float32, tokens ``[vocab_start, vocab_start + slice)`` of rows of
    ``vocab_size``; every rank of ``group`` calls this with its own slice and the same per-row
    ``temperature``, ``min_p``, ``top_k``, ``top_p``, ``seeds`` (with ``positions`` as offsets,
    ``seeded`` as a mask). ``all_gather`` rounds: the rows' maxima (40 bytes per row and rank,
    plus 4 per top-k candidate), for top-p the rounds of the cut (1320 bytes per row; usually
    two), then the slices' race winners (40 bytes). Returns int64 tokens [rows], the same on
    every rank; with ``logprob_mode`` ("raw" or "processed") also the sampled tokens' logprobs
    [rows] and the ``top_n`` ids [rows, top_n] and logprobs, their partials sent with the race's
    (64 bytes plus 8 per top-n entry per row), within 1e-5 of ``sample``'s.

    ``sampler``: a ``tokenrace.Sampler`` per rank, made with the same seed on every rank (its
    stream keys the unseeded rows; ranks whose streams differ are refused, not mixed); default
    ``default_sampler()`` (seeded from ``TOKENRACE_SEED``).

    The sampling step: ``sample``'s arguments of the same names and forms (histories, penalties,
    ``penalty_last_n``, ``allowed_token_ids_mask``, ``bad_words_token_ids``, ``logit_bias``,
    ``token_bitmask``, ``min_tokens``/``stop_token_ids``, DRY's), for the WHOLE rows (global
    token ids; masks of ``vocab_size`` columns or bits), the same on every rank: each rank applies
    what falls in its slice, and the tokens are ``sample``'s with the same step, bit for bit. It
    adds no round and no byte. Processed logprobs only with a step (raw ones need the whole raw
    row's mass: refused). Not sharded, refused naming the argument: ``requests``/``request_ids``
    (pass the histories), ``forced_tokens``, ``logprob_token_ids``, llama.cpp's filters, mirostat
    and ``row_index``."""
    from . import _shard as shard

    if not_sharded:
        name = sorted(not_sharded)[0]
        if name not in inspect.signature(sample).parameters:
            raise TypeError(f"sample_sharded() got an unexpected keyword argument {name!r}")
        raise ValueError(f"{name}: {_NOT_SHARDED.get(name, 'not sharded')}; draw these rows with sample")

    if not isinstance(logits_slice, torch.Tensor) or logits_slice.device.type != "cpu":
        raise TypeError("logits_slice: must be a CPU torch.Tensor")
    if logits_slice.dtype != torch.float32:
        raise TypeError(f"logits_slice: sharded rows are float32, got {logits_slice.dtype}")
    x = logits_slice.detach().numpy()
    s = default_sampler() if sampler is None else sampler
    settings = dict(temperature=_as_numpy(temperature), min_p=_as_numpy(min_p), top_k=_as_numpy(top_k),
                    top_p=_as_numpy(top_p), seeds=_as_numpy(seeds), offsets=_as_numpy(positions),
                    seeded=_as_numpy(seeded))
    rows = x.shape[0] if x.ndim == 2 else 1
    # The step in ``sample``'s forms, converted by the same code (``Sampler.draw``'s names out).
    step = _step_arguments(
        rows, vocab_size, prompt_token_ids=prompt_token_ids, output_token_ids=output_token_ids,
        repetition_penalties=repetition_penalties, frequency_penalties=frequency_penalties,
        presence_penalties=presence_penalties, no_penalties=no_penalties,
        allowed_token_ids_mask=allowed_token_ids_mask, bad_words_token_ids=bad_words_token_ids,
        logit_bias=logit_bias, token_bitmask=token_bitmask, penalty_last_n=penalty_last_n,
        dry=dry_multiplier is not None,
        min_tokens=_min_tokens(min_tokens, stop_token_ids, rows, output_token_ids is not None))
    dry = dict(dry_multiplier=dry_multiplier, dry_base=dry_base, dry_allowed_length=dry_allowed_length,
               dry_penalty_last_n=dry_penalty_last_n, dry_sequence_breakers=dry_sequence_breakers)
    step.update({name: _as_numpy(value) for name, value in dry.items() if value is not None})
    settings["step"] = shard.step_block(rows, vocab_size, **step)
    drawn = shard.draw(s, x, vocab_start, vocab_size, lambda data: _all_gather_bytes(data, group),
                       logprob_mode=logprob_mode, top_n=top_n, **settings)
    tokens = drawn.tokens
    if logprob_mode is not None:
        return (torch.from_numpy(tokens.astype(np.int64)), torch.from_numpy(drawn.logprobs),
                torch.from_numpy(drawn.topn_ids), torch.from_numpy(drawn.topn_logprobs))
    return torch.from_numpy(tokens.astype(np.int64))
