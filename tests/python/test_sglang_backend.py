"""The SGLang sampler backend (examples/sglang_plugin/tokenrace_sglang) against SGLang's own
classes: its ``Sampler`` (the backend is a subclass, registered with its
``register_sampler_backend`` and made by its ``create_sampler``), its ``SamplingBatchInfo`` and
``LogitsProcessorOutput``, its ``OutputLogprobProcessor`` for the logprob outputs, and its torch
sampler's filtered probabilities (``top_k_top_p_min_p_sampling_from_probs_torch`` with
``return_filtered_probs``) as the kept set and the probabilities the draws must follow
(chi-square, with a power check). Skipped where SGLang cannot be imported."""

import importlib
import os
import sys

import numpy as np
import pytest

from conftest import REPO

torch = pytest.importorskip("torch", reason="torch is not installed (SGLang's sampler needs it)")
try:
    sglang_sampler = importlib.import_module("sglang.srt.layers.sampler")
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
except Exception as e:  # ImportError, or SGLang failing on a missing optional module
    pytest.skip(f"SGLang's sampler is not importable here: {e!r}", allow_module_level=True)

sys.path.insert(0, os.path.join(REPO, "examples", "sglang_plugin"))
plugin = importlib.import_module("tokenrace_sglang")

VOCAB = 300
TOP_K_ALL = 1 << 30


def batch_info(temps, top_ks, top_ps, min_ps, seeds=None):
    t = torch.tensor(temps, dtype=torch.float32).view(-1, 1)
    k = torch.tensor(top_ks, dtype=torch.int32)
    return SamplingBatchInfo(
        temperatures=t, top_ps=torch.tensor(top_ps, dtype=torch.float32), top_ks=k,
        min_ps=torch.tensor(min_ps, dtype=torch.float32), is_all_greedy=bool(all(x == 1 for x in top_ks)),
        is_any_greedy=bool(any(x == 1 for x in top_ks)), need_top_p_sampling=any(p < 1 for p in top_ps),
        need_top_k_sampling=any(x != TOP_K_ALL for x in top_ks), need_min_p_sampling=any(m > 0 for m in min_ps),
        vocab_size=VOCAB, device="cpu",
        sampling_seed=None if seeds is None else torch.tensor(seeds, dtype=torch.int64))


def backend():
    """The registered backend, as SGLang's create_sampler makes it, without SGLang's process
    groups (its constructor reads the parallel state of a running server)."""
    plugin.register()
    cls = sglang_sampler._CUSTOM_SAMPLER_FACTORIES["tokenrace"]
    s = cls.__new__(cls)
    torch.nn.Module.__init__(s)
    s.tp_sync_group = s.cp_sync_group = None
    s.rl_on_policy_target, s.enable_deterministic = None, False
    s.use_log_softmax_logprob = s.use_ascend_backend = False
    s.sampling_mask_max_tokens = 0
    s.output_logprob_processor = sglang_sampler.OutputLogprobProcessor()
    assert isinstance(s, sglang_sampler.Sampler)
    return s


def run(s, logits, info, positions=None, return_logprob=False, top_n=0):
    out = LogitsProcessorOutput(next_token_logits=logits.clone())
    rows = logits.shape[0]
    pos = torch.arange(rows, dtype=torch.int64) if positions is None else positions
    ids = s.forward(out, info, return_logprob, [top_n] * rows, [None] * rows, pos)
    return ids, out


def sglang_filtered(logits, info):
    """SGLang's kept tokens and their probabilities (its torch path, tempered softmax)."""
    probs = torch.softmax(logits / info.temperatures, dim=-1)
    _, weights, idx, _ = sglang_sampler.top_k_top_p_min_p_sampling_from_probs_torch(
        probs.clone(), info.top_ks, info.top_ps, info.min_ps, info.need_min_p_sampling, None,
        torch.zeros(logits.shape[0], dtype=torch.int64), return_filtered_probs=True)
    q = torch.zeros_like(probs, dtype=torch.float64)
    q.scatter_(1, idx.long(), weights.double())
    return (q / q.sum(dim=1, keepdim=True)).numpy()


def test_register_makes_a_backend_sglangs_registry_knows():
    plugin.register()
    assert "tokenrace" in sglang_sampler._CUSTOM_SAMPLER_FACTORIES
    assert issubclass(sglang_sampler._CUSTOM_SAMPLER_FACTORIES["tokenrace"], sglang_sampler.Sampler)


@pytest.mark.parametrize("case", [
    dict(temp=0.7, top_k=TOP_K_ALL, top_p=0.85, min_p=0.0),
    dict(temp=1.3, top_k=40, top_p=1.0, min_p=0.0),
    dict(temp=0.9, top_k=TOP_K_ALL, top_p=1.0, min_p=0.08),
])
def test_draws_follow_sglangs_filtered_probabilities(rng, case):
    s = backend()
    base = torch.from_numpy((rng.standard_normal((1, VOCAB)) * 2).astype(np.float32))
    rows = 250
    logits = base.repeat(rows, 1)
    info = batch_info([case["temp"]] * rows, [case["top_k"]] * rows, [case["top_p"]] * rows, [case["min_p"]] * rows)
    q = sglang_filtered(base, batch_info([case["temp"]], [case["top_k"]], [case["top_p"]], [case["min_p"]]))[0]
    wrong_info = batch_info([case["temp"] * 1.3], [case["top_k"]], [case["top_p"]], [case["min_p"]])
    wrong = np.where(q > 0, torch.softmax(base / wrong_info.temperatures, dim=-1)[0].double().numpy(), 0.0)
    wrong /= wrong.sum()
    counts = np.zeros(VOCAB)
    for _ in range(24):  # 6,000 unseeded draws
        ids, _ = run(s, logits, info)
        np.add.at(counts, ids.numpy(), 1)
    draws = counts.sum()
    assert counts[q == 0].sum() == 0, "a draw outside SGLang's kept set"
    cells = q * draws >= 5

    def chi2(p):
        e = p * draws
        rest = (counts[~cells].sum() - e[~cells].sum()) ** 2 / max(e[~cells].sum(), 1e-9)
        return (((counts[cells] - e[cells]) ** 2) / e[cells]).sum() + rest

    dof = cells.sum()
    limit = dof + 4.0 * np.sqrt(2.0 * dof) + 10.0
    assert chi2(q) < limit, (chi2(q), limit)
    assert chi2(wrong) > limit, ("the power check: a 1.3x temperature passed", chi2(wrong), limit)


def test_greedy_rows_seeds_and_logprobs(rng):
    s = backend()
    logits = torch.from_numpy((rng.standard_normal((3, VOCAB)) * 2).astype(np.float32))
    logits[0, 17] = logits[0, 200] = logits[0].max() + 1  # tied maxima: the first wins
    info = batch_info([1.0, 0.8, 1.1], [1, 50, TOP_K_ALL], [1.0, 0.9, 1.0], [0.0, 0.0, 0.05], seeds=[5, 6, 7])
    ids, out = run(s, logits, info, positions=torch.tensor([3, 4, 5]), return_logprob=True, top_n=4)
    assert ids[0] == 17
    again, _ = run(s, logits, info, positions=torch.tensor([3, 4, 5]))
    assert torch.equal(ids, again), "seeded rows: the same (seed, position), the same token"
    alone, _ = run(s, logits[1:2], batch_info([0.8], [50], [0.9], [0.0], seeds=[6]), positions=torch.tensor([4]))
    assert alone[0] == ids[1], "a seeded row draws the same token alone as in its batch"
    # SGLang's logprobs: log_softmax of the tempered logits, through its own processor.
    want = torch.log_softmax(logits / info.temperatures, dim=-1)
    got = out.next_token_logprobs
    assert torch.allclose(torch.as_tensor(got).float(), want[torch.arange(3), ids], atol=1e-5)
    top_idx = [list(map(int, r)) for r in out.next_token_top_logprobs_idx]
    assert top_idx == [list(map(int, torch.topk(want[r], 4).indices)) for r in range(3)]


def test_what_tokenrace_cannot_honour_stays_with_sglang(rng):
    s = backend()
    logits = torch.zeros((2, VOCAB))
    info = batch_info([1.0, 1.0], [TOP_K_ALL] * 2, [1.0] * 2, [0.0] * 2)
    info.sampling_mask_batch_indices = torch.tensor([0])
    assert not s.handles(logits, info, False, None)
    info.sampling_mask_batch_indices = None
    assert s.handles(logits, info, False, None)
    assert not s.handles(logits, info, False, torch.zeros((2, VOCAB)))
    s.enable_deterministic = True
    assert not s.handles(logits, info, False, None)
