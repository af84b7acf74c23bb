#!/usr/bin/env python3
"""vLLM's CPU sampling steps on tokenrace, with torch tensors (``tokenrace.torch``).

    PYTHONPATH=bindings/python python3 examples/python/torch_sample.py

Prints "skipped: torch is not installed" and exits 0 where torch is missing.
"""
import sys

try:
    import torch
except ImportError:
    print("skipped: torch is not installed")
    sys.exit(0)

import tokenrace.torch  # noqa: E402  (needs torch)

ROWS, VOCAB = 4, 32000


def main():
    gen = torch.Generator().manual_seed(0)
    raw = torch.randn(ROWS, VOCAB, generator=gen).mul_(3).to(torch.bfloat16)  # read in place, any row stride

    # 1. The drop-in for vLLM's TopKTopPSampler: logits already divided by the temperature, per-row
    #    k (>= vocab: off) and p (1.0: off), one torch.Generator per seeded request.
    sampler = tokenrace.torch.TopKTopPSampler(logprobs_mode="raw_logprobs")
    k = torch.tensor([50, VOCAB, 1, 20], dtype=torch.int32)
    p = torch.tensor([0.9, 1.0, 1.0, 0.5])
    generators = {1: torch.Generator().manual_seed(42)}  # row 1 is a seeded request
    sampled, processed = sampler.forward_cpu(raw, generators, k, p)
    print("drop-in:", sampled.tolist(), "processed logits:", processed)
    print("row 2 (k = 1) drew a maximum:", bool(raw[2, sampled[2]] == raw[2].max()))

    # 2. The fused step replacing vLLM's Sampler.sample: raw logits, temperatures (0: greedy),
    #    filters, seeds, and vLLM's logprobs triple.
    temperature = torch.tensor([0.0, 0.7, 1.0, 1.3])
    ids, logprobs = tokenrace.torch.sample(raw, temperature, top_k=k, top_p=p, min_p=torch.full((ROWS,), 0.01),
                                           generators=generators, logprobs=2)
    print("fused step:", ids.tolist(), "greedy row 0 is the argmax:", ids[0].item() == raw[0].float().argmax().item())
    print("logprob_token_ids (sampled first, then the top 2):", logprobs.logprob_token_ids.tolist())
    print("selected_token_ranks:", logprobs.selected_token_ranks.tolist())


if __name__ == "__main__":
    main()
