"""A vLLM plugin that samples with tokenrace on the CPU.

vLLM 0.34 (model runner V2's CPU backend): ``cpu_sampler.py`` patches ``CPUSampler``. Older vLLM
(V1, up to the releases that still have ``TopKTopPSampler``): the rest of this module.

vLLM calls ``register()`` in every process it starts (the engine and each worker) through the
``vllm.general_plugins`` entry point of ``pyproject.toml``, before it builds the model runner and
its ``Sampler``. ``register()`` patches vLLM's ``TopKTopPSampler`` (the top-k/top-p step and the
random draw, ``vllm/v1/sample/ops/topk_topp_sampler.py``) so that its CPU methods run tokenrace's
drop-in; its ``__init__`` binds ``self.forward`` to ``forward_cpu`` (x86, ARM, s390x) or
``forward_native`` (POWER, RISC-V) from the class, so the patch must come first, as it does.

What tokenrace cannot honour stays with vLLM's own code: a sampler built with
``use_fp64_gumbel=True`` or a processed logprobs mode, and tensors not on the CPU.
"""

import functools

PROCESSED_LOGPROBS_MODES = ("processed_logits", "processed_logprobs")


@functools.lru_cache(maxsize=None)
def drop_in():
    """One tokenrace drop-in per process (its sampler is thread-safe); settings from the
    ``TOKENRACE_*`` environment (e.g. TOKENRACE_THREADS, TOKENRACE_MAX_ROWS >= max_num_seqs)."""
    import tokenrace.torch

    return tokenrace.torch.TopKTopPSampler()


def tokenrace_forward(original):
    """``original`` (a ``TopKTopPSampler`` method) routed through tokenrace where it can be."""

    @functools.wraps(original)
    def forward(self, logits, generators, k, p):
        if (getattr(self, "use_fp64_gumbel", False) or self.logprobs_mode in PROCESSED_LOGPROBS_MODES
                or logits.device.type != "cpu"):
            return original(self, logits, generators, k, p)
        return drop_in().forward_cpu(logits, generators, k, p)

    forward.tokenrace_original = original
    return forward


def patch(sampler_class):
    """Points ``sampler_class.forward_cpu`` and ``forward_native`` at tokenrace (idempotent)."""
    for name in ("forward_cpu", "forward_native"):
        method = getattr(sampler_class, name)
        if not hasattr(method, "tokenrace_original"):
            setattr(sampler_class, name, tokenrace_forward(method))


def register():
    """The ``vllm.general_plugins`` entry point: vLLM 0.34's CPU backend (``CPUSampler``,
    ``cpu_sampler.py``) and, in the vLLM versions that have it, V1's ``TopKTopPSampler``."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():  # GPU platforms keep their own samplers
        return
    try:
        from vllm.v1.worker.cpu.sampler import CPUSampler
    except ImportError:
        pass
    else:
        from . import cpu_sampler

        cpu_sampler.patch(CPUSampler)
    try:
        from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler
    except ImportError:
        return
    patch(TopKTopPSampler)
