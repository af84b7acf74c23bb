"""The vLLM plugin's ``CPUSampler._sample_random`` (examples/vllm_plugin/tokenrace_vllm/
cpu_sampler.py) against vLLM 0.34's own classes: its ``CPUSamplingStates`` (the per-request
parameters and seeds ``add_request`` stores), its ``apply_top_k_top_p`` (the kept set and the
masked logits), and ``CPUSampler`` itself (the method patched on the class, called as vLLM's
``sample`` calls it). vLLM's compiled ``gumbel_sample_cpu`` comes only with its CPU build from
source, so the draws are compared by distribution (chi-square with a power check), not token by
token. Skipped where vLLM 0.34's CPU sampler cannot be imported (it needs torch and vLLM)."""

import importlib
import os
import sys

import numpy as np
import pytest

from conftest import REPO

torch = pytest.importorskip("torch", reason="torch is not installed (vLLM's CPU sampler needs it)")
try:
    vllm_cpu = importlib.import_module("vllm.v1.worker.cpu.sampler")
    from vllm.sampling_params import SamplingParams
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p
except Exception as e:  # ImportError, or vLLM failing on a missing optional module
    pytest.skip(f"vLLM 0.34's CPU sampler is not importable here: {e!r}", allow_module_level=True)

sys.path.insert(0, os.path.join(REPO, "examples", "vllm_plugin"))
cpu_sampler = importlib.import_module("tokenrace_vllm.cpu_sampler")

VOCAB = 400


def states_for(params):
    """vLLM's per-request sampling states, filled by its own ``add_request``."""
    states = vllm_cpu.CPUSamplingStates(len(params), VOCAB, torch.device("cpu"))
    for i, p in enumerate(params):
        states.add_request(i, p)
    return states


def tempered(logits, states, idx):
    """What ``_sample_random`` receives: vLLM's own temperature (greedy rows divided by 1) and
    min-p, applied by its states."""
    x = logits.clone()
    mapping = torch.tensor(idx, dtype=torch.int32)
    states.apply_temperature(x, mapping, np.array(idx))
    return x


def patched_sampler(states, logprobs_mode="raw_logprobs", return_sampling_mask=False):
    """A ``CPUSampler`` with only what ``_sample_random`` reads (its constructor needs a whole
    VllmConfig of the CPU platform), its class patched by the plugin."""
    cpu_sampler.patch(vllm_cpu.CPUSampler)
    s = vllm_cpu.CPUSampler.__new__(vllm_cpu.CPUSampler)
    s.sampling_states, s.use_fp64_gumbel = states, False
    s.logprobs_mode, s.return_sampling_mask = logprobs_mode, return_sampling_mask
    return s


def draw(sampler, x, idx, positions):
    states = sampler.sampling_states
    mapping = torch.tensor(idx, dtype=torch.int32)
    top_k, top_p, topp_only = states.get_top_k_top_p(mapping, np.array(idx), VOCAB)
    return sampler._sample_random(x, mapping, np.array(idx), torch.tensor(positions, dtype=torch.int64), top_k,
                                  top_p, topp_only, False)


def test_the_class_is_patched_once_and_keeps_vllms_method():
    cpu_sampler.patch(vllm_cpu.CPUSampler)
    method = vllm_cpu.CPUSampler._sample_random
    cpu_sampler.patch(vllm_cpu.CPUSampler)
    assert vllm_cpu.CPUSampler._sample_random is method
    assert method.tokenrace_original.__name__ == "_sample_random"


def test_draws_follow_vllms_kept_set_and_probabilities(rng):
    # One request, top-k 60 and top-p 0.8 at T = 0.7: every draw in the set vLLM's own
    # apply_top_k_top_p keeps, and the counts follow softmax over it.
    states = states_for([SamplingParams(temperature=0.7, top_k=60, top_p=0.8)])
    logits = torch.from_numpy((rng.standard_normal((1, VOCAB)) * 2).astype(np.float32))
    x = tempered(logits, states, [0])
    mapping = torch.tensor([0], dtype=torch.int32)
    k, p, only = states.get_top_k_top_p(mapping, np.array([0]), VOCAB)
    kept = apply_top_k_top_p(x.clone(), k, p, has_topp_only_rows=only)[0].numpy()
    q = np.where(np.isfinite(kept), np.exp(kept - kept[np.isfinite(kept)].max()), 0.0)
    q /= q.sum()
    wrong = np.where(np.isfinite(kept), np.exp((kept - kept[np.isfinite(kept)].max()) / 1.3), 0.0)
    wrong /= wrong.sum()
    sampler = patched_sampler(states)
    draws = 6000
    counts = np.zeros(VOCAB)
    # Each (seed, position) is one independent draw: the same seed over many positions.
    batch = 200
    for start in range(0, draws, batch):
        xs = x.repeat(batch, 1)
        tokens, _ = draw(sampler, xs, [0] * batch, list(range(start, start + batch)))
        np.add.at(counts, tokens.numpy(), 1)
    assert counts[~np.isfinite(kept)].sum() == 0, "a draw outside vLLM's kept set"
    cells = q * draws >= 5

    def chi2(p):
        e = p * draws
        rest = (counts[~cells].sum() - e[~cells].sum()) ** 2 / max(e[~cells].sum(), 1e-9)
        return (((counts[cells] - e[cells]) ** 2) / e[cells]).sum() + rest

    dof = cells.sum()
    limit = dof + 4.0 * np.sqrt(2.0 * dof) + 10.0  # far beyond p = 1e-3 at these dof
    assert chi2(q) < limit, (chi2(q), limit)
    assert chi2(wrong) > limit, ("the power check: a 1.3x temperature passed", chi2(wrong), limit)


def test_seeded_rows_are_batch_invariant_and_greedy_rows_take_the_argmax(rng):
    params = [SamplingParams(temperature=1.0, top_p=0.9, seed=7), SamplingParams(temperature=0.0),
              SamplingParams(temperature=0.8, top_k=5, seed=123)]
    states = states_for(params)
    logits = torch.from_numpy((rng.standard_normal((3, VOCAB)) * 2).astype(np.float32))
    x = tempered(logits, states, [0, 1, 2])
    sampler = patched_sampler(states)
    together, _ = draw(sampler, x, [0, 1, 2], [10, 11, 12])
    assert together[1] == int(torch.argmax(logits[1]))
    for row in (0, 2):
        alone, _ = draw(sampler, x[row:row + 1].clone(), [row], [10 + row])
        assert alone[0] == together[row]
    again, _ = draw(sampler, x, [0, 1, 2], [10, 11, 12])
    assert torch.equal(again, together)
    # vLLM's seeds are signed 64-bit: a negative one keys as its bits.
    states.seeds_np[0] = -5
    neg, _ = draw(sampler, x, [0, 1, 2], [10, 11, 12])
    assert 0 <= int(neg[0]) < VOCAB


def test_masked_logits_are_vllms_where_no_tie_sits_at_a_cut(rng):
    states = states_for([SamplingParams(temperature=0.9, top_k=30, top_p=0.95, seed=1),
                         SamplingParams(temperature=1.2, top_p=0.5, seed=2)])
    logits = torch.from_numpy((rng.standard_normal((2, VOCAB)) * 3).astype(np.float32))
    x = tempered(logits, states, [0, 1])
    mapping = torch.tensor([0, 1], dtype=torch.int32)
    k, p, only = states.get_top_k_top_p(mapping, np.array([0, 1]), VOCAB)
    want = apply_top_k_top_p(x.clone(), k, p, has_topp_only_rows=only)
    for mode, mask in (("processed_logprobs", False), ("raw_logprobs", True)):
        sampler = patched_sampler(states, logprobs_mode=mode, return_sampling_mask=mask)
        tokens, masked = draw(sampler, x, [0, 1], [0, 0])
        assert torch.equal(torch.isfinite(masked), torch.isfinite(want))
        fin = torch.isfinite(want)
        assert torch.equal(masked[fin], want[fin])
    # Raw modes without masks get vLLM's processed logits back untouched (no copy).
    sampler = patched_sampler(states)
    _, same = draw(sampler, x, [0, 1], [0, 0])
    assert same is x


def test_what_tokenrace_cannot_honour_stays_with_vllm():
    # use_fp64_gumbel, and vLLM's fused-sampler flag: vLLM's own method runs.
    states = states_for([SamplingParams(temperature=1.0, seed=3)])
    sampler = patched_sampler(states)
    sampler.use_fp64_gumbel = True
    calls = []

    def vllms(self, *args):
        calls.append(args)
        return "vllm"

    patched = cpu_sampler.tokenrace_sample_random(vllms)
    x = torch.zeros((1, VOCAB))
    mapping = torch.tensor([0], dtype=torch.int32)
    assert patched(sampler, x, mapping, np.array([0]), torch.tensor([0]), None, None, False, False) == "vllm"
    sampler.use_fp64_gumbel = False
    assert patched(sampler, x, mapping, np.array([0]), torch.tensor([0]), None, None, False, True) == "vllm"
    assert len(calls) == 2
