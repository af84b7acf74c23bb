"""An SGLang sampler backend on tokenrace: ``--sampling-backend tokenrace``.

SGLang loads this package's ``register()`` in each of its processes (the ``sglang.srt.plugins``
entry point); it registers ``TokenraceSampler`` with SGLang's ``register_sampler_backend``.
``TokenraceSampler`` is SGLang's ``Sampler`` whose ``forward`` does, for CPU logits, what
SGLang's standard path does (custom logit processors and NaN handling first, then the logits
divided by the temperature in place, then top-k, top-p and min-p and the draw) in one tokenrace
call without a softmax or a sort, keyed by each request's ``sampling_seed`` and position when
SGLang gives seeds (deterministic inference); and with logprobs, the log_softmax of the tempered
logits in the same call, handed to SGLang's own ``OutputLogprobProcessor`` (top-n and requested
token ids as SGLang computes them).

What stays with SGLang's own path: logits not on the CPU, sampling masks, watermarks, the RL
on-policy and deterministic log_softmax modes, ``SGLANG_RETURN_ORIGINAL_LOGPROB``, the Ascend
backend, separate logprob logits.

Differences from SGLang (``docs/integration.md``): tokenrace's filter order is min-p, top-k, top-p
(SGLang's: top-k, top-p, min-p; they keep different sets when top-p and min-p are both set);
top-k and top-p keep every token tied at their cut; the noise is tokenrace's. SGLang's greedy
rows (top-k 1 at temperature 1) take the argmax, the first of tied maxima, as torch.argmax.
"""

import functools


@functools.lru_cache(maxsize=None)
def sampler():
    """One tokenrace sampler per process (thread-safe); settings from ``TOKENRACE_*``
    (TOKENRACE_MAX_ROWS must cover SGLang's largest batch)."""
    import tokenrace.torch

    return tokenrace.torch.default_sampler()


def _sampler_class():
    import torch
    from sglang.srt.layers import sampler as sglang_sampler

    base = sglang_sampler.Sampler

    class TokenraceSampler(base):
        """SGLang's ``Sampler`` drawing CPU rows with tokenrace (see the module doc)."""

        def handles(self, logits, sampling_info, return_logprob, logprob_logits):
            """Whether this call is one tokenrace does as SGLang's standard path would."""
            return (logits is not None and logits.device.type == "cpu" and logits.dim() == 2
                    and logits.dtype in (torch.float32, torch.float16, torch.bfloat16)
                    and logprob_logits is None and sampling_info.sampling_mask_batch_indices is None
                    and not getattr(sampling_info, "has_watermark_candidates", False)
                    and self.rl_on_policy_target is None and not self.enable_deterministic
                    and not self.use_ascend_backend
                    and not (return_logprob and sglang_sampler.SGLANG_RETURN_ORIGINAL_LOGPROB))

        def forward(self, logits_output, sampling_info, return_logprob, top_logprobs_nums, token_ids_logprobs,
                    positions, *, logprob_logits=None):
            logits = logits_output.next_token_logits
            if not self.handles(logits, sampling_info, return_logprob, logprob_logits):
                return super().forward(logits_output, sampling_info, return_logprob, top_logprobs_nums,
                                       token_ids_logprobs, positions, logprob_logits=logprob_logits)
            logits = self._preprocess_logits(logits, sampling_info)
            rows, vocab = logits.shape
            # SGLang's other rows are divided by their temperature in place, as its standard path
            # does; its greedy rows are top-k 1 at temperature 1: here the argmax (temperature 0,
            # the first of tied maxima, as torch.argmax).
            if not sampling_info.is_all_greedy:
                logits.div_(sampling_info.temperatures)
            top_k = sampling_info.top_ks.to(torch.int64).clamp(max=vocab).to(torch.int32)
            temperature = torch.where(top_k == 1, 0.0, 1.0).to(torch.float32)
            seeds = offsets = None
            if sampling_info.sampling_seed is not None:
                import numpy as np

                seeds = sampling_info.sampling_seed.to(torch.int64).numpy().view(np.uint64)
                offsets = positions.to(torch.int64).numpy().view(np.uint64)
            x = logits if logits.dtype == torch.float32 else logits.float()
            r = sampler().draw_full(x.contiguous(), temperature=temperature, top_k=top_k,
                                    top_p=sampling_info.top_ps.to(torch.float32),
                                    min_p=sampling_info.min_ps.to(torch.float32), seeds=seeds, offsets=offsets,
                                    full_logprobs="raw" if return_logprob else None)
            ids = r.tokens.to(torch.int64)
            if return_logprob:
                result = self.output_logprob_processor.compute_logprobs(
                    r.full_logprobs, top_logprobs_nums, token_ids_logprobs, ids)
                result.write_output_to(logits_output)
            self._sync_token_ids_across_tp(ids, sampling_info)
            return ids

    return TokenraceSampler


def register():
    """The ``sglang.srt.plugins`` entry point: the ``tokenrace`` sampling backend."""
    from sglang.srt.layers.sampler import register_sampler_backend

    register_sampler_backend("tokenrace", _sampler_class())
