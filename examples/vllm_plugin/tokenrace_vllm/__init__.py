"""A vLLM plugin that samples with tokenrace on the CPU.

Which vLLM each part serves:

- **vLLM 0.34 and later (model runner V2's standalone CPU runner**, the runner of CPU hosts
  without Triton: aarch64, s390x, POWER): ``install_whole_sampler`` makes the runner build
  ``tokenrace.vllm_sampler.CPUSampler``, vLLM's ``CPUSampler`` whose whole step (logits
  processors, temperature, min-p, top-k/top-p, the seeded draw, forced tokens, logprobs,
  sampling masks) is one tokenrace call, with the histories in a ``tokenrace.Requests`` state.
  ``cpu_sampler.py`` also patches ``CPUSampler._sample_random`` (top-k/top-p and the draw only),
  which serves what the drop-in hands back to vLLM's own code and ``CPUWatermarkSampler``'s
  rows without a watermark.
- **Older vLLM (V1, up to the releases that still have ``TopKTopPSampler``)**: the rest of this
  module patches ``TopKTopPSampler.forward_cpu`` / ``forward_native``.
- x86 hosts with Triton run model runner V2's GPU ``Sampler`` on CPU tensors; it is not
  replaced (its Triton kernels stay).

vLLM calls ``register()`` in every process it starts (the engine and each worker) through the
``vllm.general_plugins`` entry point of ``pyproject.toml``, before it builds the model runner and
its ``Sampler``. For V1, ``register()`` patches vLLM's ``TopKTopPSampler`` (the top-k/top-p step
and the random draw, ``vllm/v1/sample/ops/topk_topp_sampler.py``) so that its CPU methods run
tokenrace's drop-in; its ``__init__`` binds ``self.forward`` to ``forward_cpu`` (x86, ARM, s390x)
or ``forward_native`` (POWER, RISC-V) from the class, so the patch must come first, as it does.

What tokenrace cannot honour stays with vLLM's own code: a sampler built with
``use_fp64_gumbel=True``, V1's processed logprobs modes, and tensors not on the CPU.
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


def install_whole_sampler():
    """Makes vLLM 0.34's standalone CPU model runner build ``tokenrace.vllm_sampler.CPUSampler``
    (the name it looks up, in its module and in the sampler module it imports it from)."""
    import sys

    from vllm.v1.worker.cpu import sampler as vllm_sampler

    from tokenrace.vllm_sampler import CPUSampler

    vllm_sampler.CPUSampler = CPUSampler
    runner = sys.modules.get("vllm.v1.worker.cpu.standalone_model_runner")
    if runner is not None:
        runner.CPUSampler = CPUSampler
    return CPUSampler


def register():
    """The ``vllm.general_plugins`` entry point: vLLM 0.34's CPU backend (the whole sampler,
    ``tokenrace.vllm_sampler``, and ``CPUSampler._sample_random``, ``cpu_sampler.py``) and, in
    the vLLM versions that have it, V1's ``TopKTopPSampler``."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():  # GPU platforms keep their own samplers
        return
    try:
        from vllm.v1.worker.cpu.sampler import CPUSampler
    except ImportError:
        pass
    else:
        from . import cpu_sampler

        cpu_sampler.patch(getattr(CPUSampler, "tokenrace_parent", CPUSampler))
        install_whole_sampler()
    try:
        from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler
    except ImportError:
        return
    patch(TopKTopPSampler)
