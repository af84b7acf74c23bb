"""vLLM 0.34's CPU sampler as one fused tokenrace call: ``CPUSampler``.

vLLM 0.34's standalone CPU model runner (model runner V2 without Triton: aarch64, s390x,
POWER hosts) samples with ``vllm.v1.worker.cpu.sampler.CPUSampler``: per step it copies the
logits to float32, runs its logits processors (allowed tokens, logit bias and min_tokens in a
compiled kernel, penalties with ``torch.unique`` over every history, bad words in Python),
forces the thinking budget's end marker, divides by the temperature, applies min-p, sorts every
row for top-k/top-p and draws with its compiled Gumbel kernel keyed by (seed, position).

``CPUSampler`` here is a subclass with the same constructor and methods (``add_request``,
``apply_staged_writes``, ``__call__(logits, input_batch) -> SamplerOutput``) whose step is one
``Sampler.draw_full`` call: masks, bias, penalties, bad words, min_tokens, temperature, min-p,
top-k, top-p, the seeded draw, forced tokens (thinking budget, trace replay), logprobs in every
``logprobs_mode`` (top-n, logprob token ids, ranks) and the sampling masks. Each request's
histories live in a ``tokenrace.Requests`` state: added once when the request is, then only
the tokens vLLM appended since the last step are copied over. Per-request parameters are read
from the tables vLLM's own ``add_request`` fills (``super().add_request``), so a request's
temperature, seed (vLLM draws one when the user gives none), top-k normalisation, min length
and stop ids are vLLM's.

What stays with vLLM's own ``__call__`` (the parent's): tensors not on the CPU,
``use_fp64_gumbel``, several logits per request (speculative decoding, which the standalone
runner refuses), logits processors beyond vLLM's three. ``docs/integration.md`` lists the
differences that remain.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch
from vllm.config.model import PROCESSED_LOGPROBS_MODES
from vllm.v1.outputs import LogprobsTensors
from vllm.v1.worker.cpu import sampler as _vllm_sampler
from vllm.v1.worker.cpu.input_batch import get_num_sampled_and_rejected
from vllm.v1.worker.cpu.logits_processors import LogitsContext

import tokenrace
import tokenrace.torch

_LOGITS_MODES = ("raw_logits", "processed_logits")
# The request id of the empty history, named by every row that needs none in a call whose
# other rows do (a batch that names requests names one for every row).
_EMPTY_HISTORY = 0


class _ForcedTokens:
    """Receives vLLM's thinking-budget forcing (``logits[row, token] = 1e9``) as forced tokens,
    so that vLLM's own rule decides which rows end their thinking, and tokenrace returns the
    token instead of raising its logit."""

    def __init__(self, rows):
        self.tokens = np.full(rows, -1, np.int32)

    def __setitem__(self, key, value):
        row, token = key
        self.tokens[int(row)] = int(token)


class CPUSampler(_vllm_sampler.CPUSampler):
    """vLLM 0.34's ``CPUSampler`` whose step is one tokenrace call (see the module doc)."""

    # vLLM's class, which a plugin may have replaced by this one in vLLM's module.
    tokenrace_parent = _vllm_sampler.CPUSampler

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        slots = self.sampling_states.max_num_reqs
        self.vocab_size = self.sampling_states.vocab_size
        self.tokenrace_sampler = tokenrace.torch.default_sampler()
        if self.tokenrace_sampler.max_rows < slots:
            # A step holds up to one row per request: refuse now, not at the first full batch.
            raise ValueError(f"max_num_reqs: {slots} rows a step, the tokenrace sampler takes at most "
                             f"{self.tokenrace_sampler.max_rows} (set TOKENRACE_MAX_ROWS >= {slots})")
        self.histories = tokenrace.Requests()
        self.histories.add(_EMPTY_HISTORY, [])
        self._next_key = itertools.count(_EMPTY_HISTORY + 1)
        self._key = np.full(slots, _EMPTY_HISTORY, np.uint64)
        # Tokens of vLLM's all_token_ids already in the state, per slot.
        self._mirrored = np.zeros(slots, np.int64)
        self._needs_history = np.zeros(slots, bool)
        self._bias = [None] * slots      # (ids int32, values float32) or None
        self._allowed = [None] * slots   # int32 ids or None
        self._stops = [None] * slots     # int32 ids (min_tokens > 0 only) or None
        self._restore = np.zeros(slots, bool)
        self._bad_words = [None] * slots
        self._custom_ids = [None] * slots  # logprob_token_ids as int32, or None
        self._penalties = [self.penalties_state.repetition_penalty.numpy(),
                           self.penalties_state.frequency_penalty.numpy(),
                           self.penalties_state.presence_penalty.numpy()]

    # --- request states ---------------------------------------------------------------------

    def add_request(self, req_idx: int, sampling_params) -> None:
        """vLLM's ``add_request`` (its tables hold the parameters), then the request's lists in
        tokenrace's forms and, when penalties or bad words read its histories, the histories in
        the tokenrace state (the prompt's tokens outside the vocabulary dropped, as vLLM's
        penalties drop them)."""
        super().add_request(req_idx, sampling_params)
        p = sampling_params
        self._bias[req_idx] = (None if not p.logit_bias else
                               (np.fromiter(p.logit_bias.keys(), np.int32, len(p.logit_bias)),
                                np.fromiter(p.logit_bias.values(), np.float32, len(p.logit_bias))))
        self._allowed[req_idx] = np.asarray(p.allowed_token_ids, np.int32) if p.allowed_token_ids else None
        stops = p.all_stop_token_ids
        self._stops[req_idx] = np.fromiter(stops, np.int32, len(stops)) if p.min_tokens > 0 and stops else None
        self._restore[req_idx] = self._stops[req_idx] is not None and p.structured_outputs is not None
        self._bad_words[req_idx] = [list(w) for w in p.bad_words_token_ids] if p.bad_words_token_ids else None
        self._custom_ids[req_idx] = np.asarray(p.logprob_token_ids, np.int32) if p.logprob_token_ids else None
        needs = (p.repetition_penalty != 1.0 or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0
                 or self._bad_words[req_idx] is not None)
        self._forget(req_idx)
        self._needs_history[req_idx] = needs
        if needs:
            self._mirror(req_idx)

    def apply_staged_writes(self) -> None:
        """Model runner V2's hook after ``add_request``: the CPU tables are written in place, and
        the tokenrace state is updated as it is read, so there is nothing to flush."""

    def _forget(self, slot):
        if self._key[slot] != _EMPTY_HISTORY:
            self.histories.remove(int(self._key[slot]))
            self._key[slot] = _EMPTY_HISTORY
        self._mirrored[slot] = 0

    def _mirror(self, slot):
        """Adds slot's request to the state as vLLM's request state holds it now."""
        states = self.req_states
        prompt_len = int(states.prompt_len_np[slot])
        total = int(states.total_len[slot])
        tokens = states.all_token_ids[slot, :total].numpy()
        prompt = tokens[:prompt_len]
        prompt = prompt[(prompt >= 0) & (prompt < self.vocab_size)]
        key = next(self._next_key)
        self.histories.add(key, prompt, tokens[prompt_len:])
        self._key[slot], self._mirrored[slot] = key, total

    def _catch_up(self, slots):
        """Appends to the state the tokens vLLM appended to these slots' requests since they
        were last read (one or a few per step)."""
        total = self.req_states.total_len.numpy()[slots].astype(np.int64)
        behind = np.flatnonzero(total != self._mirrored[slots])
        if behind.size == 0:
            return
        grew, tokens = [], []
        for i in behind.tolist():
            slot = int(slots[i])
            if total[i] < self._mirrored[slot]:  # the request's history was rewritten: re-read it
                self._forget(slot)
                self._mirror(slot)
                continue
            grew.append(int(self._key[slot]))
            tokens.append(self.req_states.all_token_ids[slot, self._mirrored[slot]:total[i]].numpy())
            self._mirrored[slot] = total[i]
        if grew:
            self.histories.append(grew, tokens)

    # --- the step ---------------------------------------------------------------------------

    def handles(self, logits, input_batch):
        """Whether tokenrace does this call as vLLM's ``__call__`` would."""
        return (logits.device.type == "cpu" and logits.dim() == 2
                and logits.dtype in (torch.float32, torch.bfloat16, torch.float16)
                and not self.use_fp64_gumbel and len(self.logits_processors) == 3
                and input_batch.expanded_idx_mapping.shape[0] == input_batch.idx_mapping_np.shape[0])

    def __call__(self, logits, input_batch):
        if not self.handles(logits, input_batch):
            return super().__call__(logits, input_batch)
        slots = input_batch.expanded_idx_mapping.numpy().astype(np.int64)
        valid = slots >= 0
        slots = np.where(valid, slots, 0)
        pos = input_batch.positions[input_batch.logits_indices]
        num_nans = _vllm_sampler.get_num_nans(logits) if self.compute_nans else None
        args = self._step_arguments(logits, input_batch, slots, valid, pos)
        dims = self.get_logprobs_dims(input_batch.idx_mapping_np)
        full = None
        if self.logprobs_mode == "processed_logits" and dims is not None:
            full = "processed_logits"
        if dims is not None:
            n, max_ids = dims
            args["logprobs"] = n
            args["ranks"] = True
            args["logprob_mode"] = "processed" if self.logprobs_mode in PROCESSED_LOGPROBS_MODES else "raw"
            if max_ids:
                args["logprob_token_ids"] = [self._custom_ids[s] if ok else None
                                             for s, ok in zip(slots.tolist(), valid.tolist())]
        if self.return_sampling_mask:
            args["kept_set"] = args["kept_bitmask"] = True
        r = self.tokenrace_sampler.draw_full(logits, full_logprobs=full, **args)
        sampled = r.tokens.to(torch.int64)

        logprobs_tensors = None
        if dims is not None:
            logprobs_tensors = self._logprobs(logits, r, dims, slots, valid, input_batch)
        num_sampled, num_rejected = get_num_sampled_and_rejected(
            input_batch.seq_lens.new_ones(input_batch.num_reqs), input_batch.seq_lens,
            input_batch.cu_num_logits, input_batch.idx_mapping, self.req_states.prefill_len)
        masks = None
        if self.return_sampling_mask:
            masks = self._sampling_masks(r, input_batch, num_sampled)
        return _vllm_sampler.SamplerOutput(sampled_token_ids=sampled.view(-1, 1), logprobs_tensors=logprobs_tensors,
                                           num_nans=num_nans, num_sampled=num_sampled, num_rejected=num_rejected,
                                           sampling_mask_tensors=masks)

    def _step_arguments(self, logits, input_batch, slots, valid, pos):
        """``draw_full``'s keyword arguments for this step's rows (slot ``slots[r]`` for row r;
        rows not ``valid`` are vLLM's padding: greedy, nothing else)."""
        st = self.sampling_states
        rows = slots.shape[0]
        temperature = np.where(valid, st.temperature_np[slots], 0.0).astype(np.float32)
        args = {"temperature": temperature,
                # vLLM's seeds are any int64 (drawn when the user gives none); tokenrace keys by
                # the same 64 bits, unsigned, with the position as the offset, as vLLM keys them.
                "seeds": st.seeds_np[slots].view(np.uint64),
                "offsets": pos.numpy().astype(np.int64).view(np.uint64)}
        sampling = valid & (temperature != 0.0)
        top_k = st.top_k_np[slots]
        if np.any(sampling & (top_k < self.vocab_size)):
            args["top_k"] = top_k
        top_p = st.top_p_np[slots]
        if np.any(sampling & (top_p < 1.0)):
            args["top_p"] = top_p
        min_p = st.min_p_np[slots]
        if np.any(sampling & (min_p > 0.0)):
            args["min_p"] = min_p
        rep, freq, pres = (p[slots] for p in self._penalties)
        if np.any(rep != 1.0) or np.any(freq != 0.0) or np.any(pres != 0.0):
            args.update(repetition_penalty=rep, frequency_penalty=freq, presence_penalty=pres)
        # The state catches up first: min_tokens' n is counted from the output it holds.
        history = valid & self._needs_history[slots]
        if np.any(history):
            self._catch_up(slots[history])
            args["requests"] = self.histories
            args["request_ids"] = np.where(history, self._key[slots], _EMPTY_HISTORY)
        slot_list = [s if ok else -1 for s, ok in zip(slots.tolist(), valid.tolist())]
        self._bias_and_masks(args, slot_list)
        self._min_tokens(args, logits, slot_list, pos)
        if any(s >= 0 and self._bad_words[s] is not None for s in slot_list):
            args["bad_words"] = [self._bad_words[s] if s >= 0 else None for s in slot_list]
        forced = self._forced_tokens(rows, input_batch, pos)
        if forced is not None:
            args["forced_tokens"] = forced
        return args

    def _bias_and_masks(self, args, slot_list):
        biased = [self._bias[s] if s >= 0 else None for s in slot_list]
        if any(b is not None for b in biased):
            ids = [b[0] if b is not None else np.empty(0, np.int32) for b in biased]
            values = [b[1] if b is not None else np.empty(0, np.float32) for b in biased]
            offsets = np.zeros(len(ids) + 1, np.uint64)
            np.cumsum([a.size for a in ids], out=offsets[1:])
            args["logit_bias"] = (np.concatenate(ids), np.concatenate(values), offsets)
        allowed = [self._allowed[s] if s >= 0 else None for s in slot_list]
        if any(a is not None for a in allowed):
            args["allowed_tokens"] = allowed

    def _min_tokens(self, args, logits, slot_list, pos):
        """min_tokens by vLLM's rule: the stop ids are banned while ``pos + 1 < prompt_len +
        min_tokens``. tokenrace bans while the output it reads holds fewer than n tokens, so
        each row gets the n that makes the two agree with the output the state holds."""
        stops = [self._stops[s] if s >= 0 else None for s in slot_list]
        if all(s is None for s in stops):
            return
        lp_state = self.logits_processors[0]
        positions = pos.tolist()
        counts = np.zeros(len(slot_list), np.int64)
        for row, (slot, stop) in enumerate(zip(slot_list, stops)):
            if stop is None:
                continue
            still = int(lp_state.min_lens_np[slot]) - (positions[row] + 1)
            if still <= 0:
                continue
            if self._restore[slot] and not self._finite_without(logits[row], slot, stop):
                continue  # vLLM restores the stop tokens of a row they would leave empty
            held = (int(self._mirrored[slot] - self.req_states.prompt_len_np[slot])
                    if self._needs_history[slot] else 0)
            counts[row] = held + still
        if np.any(counts):
            args["min_tokens"] = counts
            args["stop_token_ids"] = stops

    def _finite_without(self, row_logits, slot, stop):
        """Whether the row keeps a finite value once its allowed list, bias and the stop ban
        apply (vLLM's check before it restores the stop tokens; rows with a structured output
        and min_tokens only)."""
        x = row_logits.float().clone()
        if self._allowed[slot] is not None:
            keep = torch.full_like(x, float("-inf"))
            ids = torch.from_numpy(self._allowed[slot].astype(np.int64))
            keep[ids] = x[ids]
            x = keep
        if self._bias[slot] is not None:
            x[torch.from_numpy(self._bias[slot][0].astype(np.int64))] += torch.from_numpy(self._bias[slot][1])
        x[torch.from_numpy(stop.astype(np.int64))] = float("-inf")
        return bool(torch.isfinite(x).any())

    def _forced_tokens(self, rows, input_batch, pos):
        """The thinking budget's end marker (vLLM's own rule, recorded) and trace replay's
        tokens (which win, as vLLM applies them last), or None."""
        forced = None
        budget = self.thinking_budget_state
        if budget.enabled:
            recorder = _ForcedTokens(rows)
            ctx = LogitsContext(expanded_idx_mapping=input_batch.expanded_idx_mapping,
                                idx_mapping=input_batch.idx_mapping, idx_mapping_np=input_batch.idx_mapping_np,
                                expanded_local_pos=input_batch.expanded_local_pos,
                                input_ids=input_batch.input_ids[input_batch.logits_indices], pos=pos,
                                seq_lens_upper_bound_np=input_batch.seq_lens_cpu_upper_bound.numpy())
            budget.apply(recorder, ctx)
            if np.any(recorder.tokens >= 0):
                forced = recorder.tokens
        if self.trace_replay_state is not None:
            trace = torch.full((rows,), -1, dtype=torch.int64)
            self.trace_replay_state.apply_trace(trace, input_batch.idx_mapping)
            if bool((trace >= 0).any()):
                trace_np = trace.numpy().astype(np.int32)
                forced = trace_np if forced is None else np.where(trace_np >= 0, trace_np, forced)
        return forced

    # --- outputs ----------------------------------------------------------------------------

    def _logprobs(self, logits, r, dims, slots, valid, input_batch):
        """vLLM's ``LogprobsTensors``: column 0 the sampled token, then the top-n (the batch's
        largest n) or, for a request with its own logprob token ids, those ids; columns past a
        row's own are id 0 and -inf, as vLLM pads them. The values are logprobs in the mode's
        space, or in the logits modes the values themselves (the logits as given, or the
        processed logits tokenrace wrote out)."""
        n, max_ids = dims
        rows = logits.shape[0]
        cols = max(n, max_ids)
        ids = torch.zeros((rows, 1 + cols), dtype=torch.int64)
        lps = torch.full((rows, 1 + cols), float("-inf"), dtype=torch.float32)
        width = np.full(rows, n, np.int64)
        own_ids = np.zeros(rows, bool)  # rows whose columns are their own logprob token ids
        ids[:, 0] = r.tokens.to(torch.int64)
        lps[:, 0] = r.logprobs
        if n:
            ids[:, 1:1 + n] = r.topn_ids.to(torch.int64)
            lps[:, 1:1 + n] = r.topn_logprobs
        if max_ids:
            offset = 0
            for row, (slot, ok) in enumerate(zip(slots.tolist(), valid.tolist())):
                custom = self._custom_ids[slot] if ok else None
                if custom is None:
                    continue
                k = custom.size
                width[row] = k
                own_ids[row] = True
                ids[row, 1:] = 0
                lps[row, 1:] = float("-inf")
                ids[row, 1:1 + k] = torch.from_numpy(custom.astype(np.int64))
                lps[row, 1:1 + k] = r.token_logprobs[offset:offset + k]
                offset += k
        if self.logprobs_mode in _LOGITS_MODES:
            source = logits if self.logprobs_mode == "raw_logits" else r.full_logprobs
            padding = torch.from_numpy(np.arange(1 + cols)[None, :] > width[:, None])
            lps = source.gather(-1, ids).to(torch.float32).masked_fill_(padding, float("-inf"))
            if n:
                self._order_top_n_by_value(ids, lps, n, ~own_ids)
        expanded = rows != input_batch.idx_mapping_np.shape[0]
        return LogprobsTensors(logprob_token_ids=ids, logprobs=lps, selected_token_ranks=r.ranks.to(torch.int64),
                               cu_num_generated_tokens=input_batch.cu_num_logits_np.tolist() if expanded else None)

    @staticmethod
    def _order_top_n_by_value(ids, values, n, rows):
        """In the logits modes, the top-n columns of ``rows`` by value, descending (vLLM's
        ``torch.topk`` order): tokenrace ranks them by logprob, where two logits a rounding apart
        may share one float32 logprob and come lowest id first."""
        top, order = torch.sort(values[:, 1:1 + n], dim=1, descending=True, stable=True)
        pick = torch.from_numpy(rows)
        ids[pick, 1:1 + n] = ids[:, 1:1 + n].gather(1, order)[pick]
        values[pick, 1:1 + n] = top[pick]

    def _sampling_masks(self, r, input_batch, num_sampled):
        """vLLM's ``CPUSamplingMaskTensors`` from tokenrace's kept set: the packed mask (bytes,
        little-endian bit order) is the kept bitmask's words read as little-endian bytes; the
        compact ids are the first kept ids, up to the batch's largest top-k (at most 2048)."""
        vocab = self.vocab_size
        width = min(int(np.max(self.sampling_states.top_k_np[input_batch.idx_mapping_np])), vocab,
                    _vllm_sampler.MAX_COMPACT_SUPPORT)
        # One logits row per request: request i's row is cu_num_logits[i]; a request that samples
        # nothing this step (a chunked prefill) has an empty mask, as in vLLM.
        rows = input_batch.cu_num_logits_np[:input_batch.num_reqs].astype(np.int64)
        sampled = num_sampled.numpy() > 0
        words = np.where(sampled[:, None], r.kept_bitmask.numpy()[rows], 0).astype("<u4", copy=False)
        packed = np.ascontiguousarray(words.view(np.uint8)[:, :(vocab + 7) // 8])
        counts = np.where(sampled, r.kept_count.numpy()[rows], 0).astype(np.int32)
        token_ids = _first_set_bits(words, width)
        return _vllm_sampler.CPUSamplingMaskTensors(torch.from_numpy(token_ids), torch.from_numpy(packed),
                                                    torch.from_numpy(counts), vocab, 1)


def _first_set_bits(words, width):
    """Per row of ``words`` (uint32, bit i of word j is token 32 j + i), the first ``width`` set
    tokens in increasing order, zero-padded: found from the nonzero words (each holds at least
    one token, so a row's first ``width`` of them hold all it needs), not from a pass over every
    bit of the row."""
    rows = words.shape[0]
    out = np.zeros((rows, width), np.int32)
    if width == 0:
        return out
    row, word = np.nonzero(words)
    rank = np.arange(row.size) - np.searchsorted(row, np.arange(rows))[row]
    row, word = row[rank < width], word[rank < width]
    bits = (words[row, word][:, None] >> np.arange(32, dtype=np.uint32)) & 1
    which, bit = np.nonzero(bits)
    row, token = row[which], word[which] * 32 + bit
    rank = np.arange(row.size) - np.searchsorted(row, np.arange(rows))[row]
    keep = rank < width
    out[row[keep], rank[keep]] = token[keep]
    return out
