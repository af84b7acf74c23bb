"""tokenrace in vLLM 0.34's CPU sampler (``vllm/v1/worker/cpu/sampler.py::CPUSampler``).

vLLM 0.34's CPU backend samples in ``CPUSampler``: its ``apply_sampling_params`` runs the logits
processors (bias, penalties, bad words, thinking budget), divides by the temperature (greedy rows
by 1) and applies min-p; then ``_sample_random`` sorts every row for top-k/top-p
(``apply_top_k_top_p``, a torch sort; its source carries a to-do for fused ops) and draws with
the compiled ``gumbel_sample_cpu`` keyed by each request's (seed, position). ``patch`` points
``CPUSampler._sample_random`` at one tokenrace call that does top-k, top-p and the draw without
sorting, keyed the same way: every vLLM request has a seed (vLLM draws one when the user gives
none), so a row's token is a pure function of (seed, position, logits), in any batch, as in vLLM.
Greedy rows take the argmax (lowest id on ties).

When vLLM needs the masked logits (a processed logprobs mode, or sampling masks), tokenrace
writes them in the same call (``processed_logits``: the kept tokens' values, -inf elsewhere).
What stays with vLLM's own code: ``use_fp64_gumbel``, tensors not on the CPU, vLLM's fused
sampler flag, and ``CPUWatermarkSampler`` (its own ``_sample_random``).

Differences from vLLM's path (``docs/integration.md``): the noise is tokenrace's, so the tokens of
one seed differ (the distribution is the same); top-k and top-p keep every token tied at their
cut; greedy rows' masked logits are not filtered (vLLM applies top-k/top-p to them too, which
never changes their argmax).
"""

import functools

import numpy as np

PROCESSED_LOGPROBS_MODES = ("processed_logits", "processed_logprobs")


@functools.lru_cache(maxsize=None)
def sampler():
    """One tokenrace sampler per process (thread-safe); settings from ``TOKENRACE_*``
    (TOKENRACE_MAX_ROWS must cover vLLM's ``max_num_seqs`` times its logits per request)."""
    import tokenrace.torch

    return tokenrace.torch.default_sampler()


def sample_rows(processed_logits, temperature, top_k, top_p, seeds, positions, masked):
    """Tokens (int64 tensor) of rows already tempered (greedy rows where ``temperature == 0``),
    with top-k and top-p (None, or tensors per row in vLLM's forms: k = vocab and p = 1 are off),
    keyed by (seeds, positions); and the logits masked by the filters when ``masked``, else
    ``processed_logits`` itself."""
    import torch

    rows, vocab = processed_logits.shape
    t = torch.where(temperature == 0.0, 0.0, 1.0).to(torch.float32)
    # vLLM's seeds are any int64; tokenrace keys by the same 64 bits, unsigned.
    seed_bits = seeds.to(torch.int64).numpy().view(np.uint64)
    offsets = positions.to(torch.int64).numpy().view(np.uint64)
    k = None if top_k is None else top_k.to(torch.int32)
    p = None if top_p is None else top_p.to(torch.float32)
    logits = processed_logits if processed_logits.dtype == torch.float32 else processed_logits.float()
    r = sampler().draw_full(logits.contiguous(), temperature=t, top_k=k, top_p=p, seeds=seed_bits,
                            offsets=offsets, full_logprobs="processed_logits" if masked else None)
    tokens = r.tokens.to(torch.int64)
    return tokens, (r.full_logprobs if masked else processed_logits)


def tokenrace_sample_random(original):
    """``CPUSampler._sample_random`` routed through tokenrace where it can be."""

    @functools.wraps(original)
    def _sample_random(self, processed_logits, expanded_idx_mapping, idx_mapping_np, pos, top_k, top_p,
                       has_topp_only_rows, use_fused_sampler):
        if self.use_fp64_gumbel or use_fused_sampler or processed_logits.device.type != "cpu":
            return original(self, processed_logits, expanded_idx_mapping, idx_mapping_np, pos, top_k, top_p,
                            has_topp_only_rows, use_fused_sampler)
        states = self.sampling_states
        masked = self.logprobs_mode in PROCESSED_LOGPROBS_MODES or getattr(self, "return_sampling_mask", False)
        return sample_rows(processed_logits, states.temperature[expanded_idx_mapping], top_k, top_p,
                           states.seeds[expanded_idx_mapping], pos, masked)

    _sample_random.tokenrace_original = original
    return _sample_random


def patch(cpu_sampler_class):
    """Points ``cpu_sampler_class._sample_random`` at tokenrace (idempotent)."""
    method = cpu_sampler_class._sample_random
    if not hasattr(method, "tokenrace_original"):
        cpu_sampler_class._sample_random = tokenrace_sample_random(method)
