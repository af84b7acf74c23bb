"""Times one step of vLLM 0.34's CPU sampler against ``tokenrace.vllm_sampler.CPUSampler``.

    python examples/vllm_plugin/bench_step.py [--rows 32] [--vocab 151936] [--prompt 4096] [--output 1024]

Both samplers are built as vLLM's standalone CPU model runner builds its own (vLLM's
``CPURequestState``, ``SamplingParams`` and ``InputBatch``), with the same requests: temperature
0.8, top-k 50, top-p 0.9, repetition 1.1, frequency 0.1 and presence 0.1 penalties, a seed,
histories of ``prompt + output`` tokens. vLLM's draw is its compiled ``gumbel_sample_cpu``, which
comes only with vLLM's C++ build: here it is replaced by an argmax over the processed logits, a
lower bound of its cost (a Gumbel draw reads the row and generates a noise per token), so vLLM's
times below are lower bounds. Each configuration prints the median of ``--repeat`` steps, in ms.
"""

import argparse
import statistics
import time
import types

import numpy as np
import torch
import vllm._cpu_ops as cpu_ops
import vllm.v1.worker.cpu.sampler as vllm_cpu
from vllm.sampling_params import SamplingParams
from vllm.v1.worker.cpu.input_batch import InputBatch
from vllm.v1.worker.cpu.states import CPURequestState

from tokenrace.vllm_sampler import CPUSampler


def argmax_stand_in(logits, mapping, temperature, seeds, positions, apply_temperature, is_drafting, use_fp64):
    return logits.argmax(-1)


def batch_of(states, slots):
    n = len(slots)
    mapping = torch.from_numpy(np.asarray(slots, np.int64))
    total = states.total_len[mapping].clone()
    return InputBatch(
        req_ids=[states.index_to_req_id[s] for s in slots], num_reqs=n, num_reqs_after_padding=n,
        idx_mapping=mapping, idx_mapping_np=np.asarray(slots), expanded_idx_mapping=mapping,
        expanded_local_pos=torch.zeros(n, dtype=torch.int32), num_scheduled_tokens=np.ones(n, np.int32),
        num_tokens=n, num_tokens_after_padding=n, query_start_loc=torch.arange(n + 1, dtype=torch.int32),
        query_start_loc_np=np.arange(n + 1, dtype=np.int32), seq_lens=total.clone(),
        seq_lens_cpu_upper_bound=total.clone(), num_computed_tokens_np=total.numpy() - 1,
        prefill_len_np=states.prefill_len_np[slots], num_computed_prefill_tokens_np=states.prefill_len_np[slots],
        is_prefilling_np=np.zeros(n, bool), has_prefill=False, decode_graph_eligible=True,
        input_ids=torch.zeros(n, dtype=torch.int32), positions=(total - 1).to(torch.int64),
        is_padding=torch.zeros(n, dtype=torch.bool), logits_indices=torch.arange(n),
        cu_num_logits=torch.arange(n + 1, dtype=torch.int32), cu_num_logits_np=np.arange(n + 1, dtype=np.int32),
        has_structured_output_reqs=False, prompt_lens=None)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--prompt", type=int, default=4096)
    parser.add_argument("--output", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    cpu_ops.gumbel_sample_cpu = argmax_stand_in
    rng = np.random.default_rng(0)
    states = CPURequestState(args.rows, args.prompt + args.output + 8, 8192, args.vocab, torch.device("cpu"))
    configs = {
        "penalties, top-k, top-p": dict(),
        "+ processed logprobs (top 5) and sampling masks": dict(logprobs=5),
    }
    logits = torch.from_numpy(rng.standard_normal((args.rows, args.vocab)).astype(np.float32) * 3)
    for i in range(args.rows):
        tokens = rng.integers(0, args.vocab, args.prompt + args.output).tolist()
        states.add_request(f"r{i}", args.prompt, tokens, len(tokens), 64)
    slots = [states.req_id_to_index[f"r{i}"] for i in range(args.rows)]
    batch = batch_of(states, slots)
    print(f"{args.rows} rows x vocab {args.vocab}, histories {args.prompt} + {args.output} tokens, "
          f"torch threads {torch.get_num_threads()}")
    for name, extra in configs.items():
        options = dict(logprobs_mode="processed_logprobs", return_sampling_mask=bool(extra))
        made = {}
        for label, cls in (("vLLM CPUSampler", vllm_cpu.CPUSampler), ("tokenrace CPUSampler", CPUSampler)):
            sampler = cls(vllm_config=types.SimpleNamespace(reasoning_config=None), max_num_reqs=args.rows,
                          vocab_size=args.vocab, device=torch.device("cpu"), req_states=states, **options)
            for i, slot in enumerate(slots):
                sampler.add_request(slot, SamplingParams(temperature=0.8, top_k=50, top_p=0.9, repetition_penalty=1.1,
                                                         frequency_penalty=0.1, presence_penalty=0.1, seed=i, **extra))
            made[label] = sampler
        for label, sampler in made.items():
            sampler(logits, batch)  # warm-up (torch.compile, the tokenrace state's first read)
            times = []
            for _ in range(args.repeat):
                start = time.perf_counter()
                sampler(logits, batch)
                times.append((time.perf_counter() - start) * 1e3)
            print(f"{name:50s} {label:22s} {statistics.median(times):8.2f} ms")


if __name__ == "__main__":
    main()
