"""``tokenrace.vllm_sampler.CPUSampler``, the whole of vLLM 0.34's CPU sampler as one tokenrace
call, driven as vLLM's standalone CPU model runner drives its own: vLLM's ``SamplingParams``,
its ``CPURequestState`` (the runner's histories), its ``InputBatch``, several steps with
requests added, removed and replaced, the sampled tokens appended as the runner's
``post_update`` appends them.

Checked against vLLM's own ``CPUSampler`` where its code runs without vLLM's C++ build (its
penalties, bad words, thinking budget, trace replay, temperature, min-p, top-k/top-p and
logprobs are torch and Python): the draw itself is vLLM's compiled ``gumbel_sample_cpu``, which
this test replaces by ``float64_gumbel`` below (greedy rows: the first maximum, as the kernel's
argmax), so only greedy tokens, and the parts of the outputs that do not depend on the noise,
are compared token for token. Logit bias, allowed tokens and min_tokens are vLLM's compiled
``apply_logit_bias_cpu``: those are checked against a float64 reference of vLLM's order
(``processed64``). Sampled tokens are checked by a chi-square against the processed
distribution, with a power check. Skipped where torch or vLLM 0.34 is missing (CI has neither).
"""

import importlib
import types

import numpy as np
import pytest

import reference

torch = pytest.importorskip("torch", reason="torch is not installed (vLLM's CPU sampler needs it)")
try:
    vllm_cpu = importlib.import_module("vllm.v1.worker.cpu.sampler")
    import vllm._cpu_ops as cpu_ops
    from vllm.sampling_params import SamplingParams
    from vllm.v1.worker.cpu.input_batch import InputBatch
    from vllm.v1.worker.cpu.states import CPURequestState
except Exception as e:  # ImportError, or vLLM failing on a missing optional module
    pytest.skip(f"vLLM 0.34's CPU sampler is not importable here: {e!r}", allow_module_level=True)

from tokenrace.vllm_sampler import CPUSampler  # noqa: E402

VOCAB = 2000
SLOTS = 16
MODES = ("raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits")


def float64_gumbel(logits, mapping, temperature, seeds, positions, apply_temperature, is_drafting, use_fp64):
    """Test stand-in for vLLM's compiled ``gumbel_sample_cpu`` (absent without vLLM's C++
    build): greedy rows take the first maximum (the kernel's argmax); sampling rows a float64
    Gumbel-max with numpy's generator keyed by (seed, position). Only its greedy tokens are
    compared."""
    x = logits.double().numpy()
    out = np.empty(x.shape[0], np.int64)
    for row in range(x.shape[0]):
        req = int(mapping[row])
        if float(temperature[req]) == 0.0:
            out[row] = int(np.argmax(x[row]))
            continue
        g = np.random.default_rng([int(seeds[req]) & (2**63 - 1), int(positions[row])]).gumbel(size=x.shape[1])
        out[row] = int(np.argmax(x[row] + g))
    return torch.from_numpy(out)


@pytest.fixture(autouse=True)
def stand_in_for_the_compiled_draw(monkeypatch):
    monkeypatch.setattr(cpu_ops, "gumbel_sample_cpu", float64_gumbel)


class Runner:
    """What vLLM's standalone CPU model runner does around its sampler: its request state, the
    input batch of a decode step, and the sampled tokens appended after it."""

    def __init__(self, reasoning=None, **sampler_options):
        self.states = CPURequestState(SLOTS, 512, 4096, VOCAB, torch.device("cpu"))
        config = types.SimpleNamespace(reasoning_config=reasoning)
        common = dict(vllm_config=config, max_num_reqs=SLOTS, vocab_size=VOCAB, device=torch.device("cpu"),
                      req_states=self.states, **sampler_options)
        self.ours = CPUSampler(**common)
        self.vllms = vllm_cpu.CPUSampler(**common)
        self.params = {}

    def add(self, req_id, prompt, params, output=()):
        tokens = list(prompt) + list(output)
        self.states.add_request(req_id, len(prompt), tokens, len(tokens), 64)
        slot = self.states.req_id_to_index[req_id]
        self.ours.add_request(slot, params)
        self.vllms.add_request(slot, params)
        self.params[req_id] = (list(prompt), params)
        return slot

    def remove(self, req_id):
        self.states.remove_request(req_id)

    def history(self, req_id):
        slot = self.states.req_id_to_index[req_id]
        prompt_len = int(self.states.prompt_len_np[slot])
        total = int(self.states.total_len[slot])
        tokens = self.states.all_token_ids[slot, :total].tolist()
        return tokens[:prompt_len], tokens[prompt_len:]

    def batch(self, req_ids, positions=None):
        slots = np.array([self.states.req_id_to_index[r] for r in req_ids], np.int64)
        n = len(req_ids)
        mapping = torch.from_numpy(slots)
        total = self.states.total_len[mapping].clone()
        pos = (total - 1).to(torch.int64) if positions is None else torch.tensor(positions, dtype=torch.int64)
        return InputBatch(
            req_ids=list(req_ids), num_reqs=n, num_reqs_after_padding=n, idx_mapping=mapping, idx_mapping_np=slots,
            expanded_idx_mapping=mapping, expanded_local_pos=torch.zeros(n, dtype=torch.int32),
            num_scheduled_tokens=np.ones(n, np.int32), num_tokens=n, num_tokens_after_padding=n,
            query_start_loc=torch.arange(n + 1, dtype=torch.int32), query_start_loc_np=np.arange(n + 1, dtype=np.int32),
            seq_lens=total.clone(), seq_lens_cpu_upper_bound=total.clone(), num_computed_tokens_np=total.numpy() - 1,
            prefill_len_np=self.states.prefill_len_np[slots],
            num_computed_prefill_tokens_np=self.states.prefill_len_np[slots],
            is_prefilling_np=np.zeros(n, bool), has_prefill=False, decode_graph_eligible=True,
            input_ids=torch.zeros(n, dtype=torch.int32), positions=pos, is_padding=torch.zeros(n, dtype=torch.bool),
            logits_indices=torch.arange(n), cu_num_logits=torch.arange(n + 1, dtype=torch.int32),
            cu_num_logits_np=np.arange(n + 1, dtype=np.int32), has_structured_output_reqs=False, prompt_lens=None)

    def step(self, req_ids, logits, compare=True, append=True, positions=None):
        """Both samplers on the same batch, then the tokens of ours appended (post_update)."""
        batch = self.batch(req_ids, positions)
        ours = self.ours(logits.clone(), batch)
        vllms = self.vllms(logits.clone(), batch) if compare else None
        if append:
            for row, req_id in enumerate(req_ids):
                slot = self.states.req_id_to_index[req_id]
                total = int(self.states.total_len[slot])
                self.states.all_token_ids[slot, total] = int(ours.sampled_token_ids[row, 0])
                self.states.total_len[slot] = total + 1
        return ours, vllms


def logits_favouring(runner, req_ids, rng, scale=2.0, boost=3.0):
    """Random logits that raise each request's history tokens, so that penalties decide."""
    x = rng.standard_normal((len(req_ids), VOCAB)).astype(np.float32) * scale
    for row, req_id in enumerate(req_ids):
        prompt, output = runner.history(req_id)
        x[row, np.array(prompt + output, np.int64)] += boost
    return torch.from_numpy(x)


def processed64(x, prompt, output, params, pos, prompt_len):
    """vLLM's order in float64 (tokenrace's rules): allowed tokens, bias, min_tokens' stop ban
    (while pos + 1 < prompt_len + min_tokens), penalties, bad words; returned as f32 values."""
    y = np.asarray(x, np.float64).copy()
    if params.allowed_token_ids:
        keep = np.full(y.size, -np.inf)
        ids = np.array(params.allowed_token_ids)
        keep[ids] = y[ids]
        y = keep
    for token, b in (params.logit_bias or {}).items():
        y[token] += np.float32(b)
    if params.min_tokens and pos + 1 < prompt_len + params.min_tokens:
        y[list(params.all_stop_token_ids)] = -np.inf
    seen = set(prompt) | set(output)
    r = np.float32(params.repetition_penalty)
    for t in seen:
        y[t] = y[t] / r if y[t] > 0 else y[t] * r
    counts = np.bincount(np.array(output, np.int64), minlength=y.size) if output else np.zeros(y.size)
    hit = counts > 0
    y[hit] -= np.float32(params.frequency_penalty) * counts[hit] + np.float32(params.presence_penalty)
    for word in params.bad_words_token_ids or []:
        prefix = list(word[:-1])
        if len(prefix) <= len(output) and output[len(output) - len(prefix):] == prefix:
            y[word[-1]] = -np.inf
    return y.astype(np.float32)


def with_bad_words(params, words):
    """``params`` with tokenized bad words, as vLLM's engine sets them from ``bad_words``."""
    params._bad_words_token_ids = words  # what update_from_tokenizer sets
    return params


def assert_same_logprobs(ours, vllms, columns=None):
    """The same ids and values, but for the order of tied values: where the ids differ, vLLM's id
    must carry, in ours, exactly the value of that column (top-n ties: lowest id first against
    torch.topk's order)."""
    a, b = ours.logprobs_tensors, vllms.logprobs_tensors
    cols = slice(None) if columns is None else columns
    ia, ib = a.logprob_token_ids[:, cols].numpy(), b.logprob_token_ids[:, cols].numpy()
    va = a.logprobs[:, cols].numpy()
    for row, col in zip(*np.nonzero(ia != ib)):
        where = np.flatnonzero(ia[row] == ib[row, col])
        assert where.size and va[row, where[0]] == va[row, col], ("ids differ beyond a tie", row, col)
    np.testing.assert_allclose(va, b.logprobs[:, cols].numpy(), rtol=1e-5, atol=1e-5)


def assert_same_masks(ours, vllms):
    a, b = ours.sampling_mask_tensors, vllms.sampling_mask_tensors
    assert torch.equal(a.counts, b.counts)
    assert torch.equal(a.packed_mask, b.packed_mask)
    for row in range(a.counts.shape[0]):
        k = min(int(a.counts[row]), a.token_ids.shape[1])
        assert torch.equal(a.token_ids[row, :k], b.token_ids[row, :k])
    # What the runner hands to the engine: the same kept ids per request.
    la, lb = a.tolists(), b.tolists()
    assert np.array_equal(la.token_ids, lb.token_ids) and np.array_equal(la.offsets, lb.offsets)


@pytest.mark.parametrize("mode", MODES)
def test_greedy_steps_equal_vllms_cpu_sampler(rng, mode):
    # Greedy requests with penalties, multi-token bad words, logprobs and logprob token ids,
    # over steps that add, remove and replace requests in vLLM's slots.
    runner = Runner(logprobs_mode=mode, return_sampling_mask=True)
    prompts = {f"r{i}": rng.integers(0, VOCAB, 40 + 30 * i).tolist() for i in range(6)}
    params = {
        "r0": SamplingParams(temperature=0.0, repetition_penalty=1.3, logprobs=3),
        "r1": SamplingParams(temperature=0.0, frequency_penalty=0.4, presence_penalty=0.2, logprobs=1),
        "r2": SamplingParams(temperature=0.0),
        "r3": SamplingParams(temperature=0.0, repetition_penalty=0.8, frequency_penalty=-0.3,
                             logprob_token_ids=[5, 17, 1999]),
        "r4": SamplingParams(temperature=0.0, repetition_penalty=1.2, logprobs=2),
        "r5": SamplingParams(temperature=0.0, presence_penalty=1.5, logprobs=-1),  # the whole vocabulary
    }
    live = ["r0", "r1", "r2", "r3"]
    for r in live:
        runner.add(r, prompts[r], params[r])
    # r2's output so far ends with 11, 12: the bad word (11, 12, 13) bans 13 at the first step.
    runner.remove("r2")
    runner.add("r2", prompts["r2"], with_bad_words(SamplingParams(temperature=0.0, logprobs=2), [[11, 12, 13], [7]]),
               output=[11, 12])
    for step in range(8):
        if step == 3:
            runner.remove("r1")
            live.remove("r1")
        if step == 4:
            runner.add("r4", prompts["r4"], params["r4"])  # takes r1's slot
            live.append("r4")
        if step == 6:
            runner.add("r5", prompts["r5"], params["r5"])
            live.append("r5")
        x = logits_favouring(runner, live, rng)
        x[live.index("r2"), 13] = 50.0  # only the bad word keeps 13 from winning
        ours, vllms = runner.step(live, x)
        assert torch.equal(ours.sampled_token_ids, vllms.sampled_token_ids), (step, mode)
        # Banned while the output ends with 11, 12 (the first step), then the winner.
        assert (int(ours.sampled_token_ids[live.index("r2"), 0]) == 13) == (step > 0)
        assert_same_logprobs(ours, vllms)
        assert torch.equal(ours.logprobs_tensors.selected_token_ranks, vllms.logprobs_tensors.selected_token_ranks)
        assert_same_masks(ours, vllms)
        assert torch.equal(ours.num_sampled, vllms.num_sampled)
    # The state mirrors vLLM's histories (one request per live slot with penalties or bad words,
    # and the empty history) as the last step read them: before that step's token.
    assert len(runner.ours.histories) == 1 + sum(
        bool(runner.ours._needs_history[runner.states.req_id_to_index[r]]) for r in live)
    for r in live:
        slot = runner.states.req_id_to_index[r]
        if runner.ours._needs_history[slot]:
            assert runner.ours.histories.output_len(int(runner.ours._key[slot])) == len(runner.history(r)[1]) - 1


def test_bfloat16_logits_are_read_as_they_are(rng):
    # A CPU model's logits in bfloat16: vLLM copies them to float32 for its processors, tokenrace
    # reads them in place. bfloat16 rows hold ties, so top-n ids may differ in order among equal
    # values (torch.topk's order against the lowest id first): values and ranks are compared.
    runner = Runner(logprobs_mode="raw_logprobs")
    runner.add("b0", rng.integers(0, VOCAB, 80).tolist(), SamplingParams(temperature=0.0, repetition_penalty=1.4,
                                                                        logprobs=4))
    runner.add("b1", rng.integers(0, VOCAB, 50).tolist(), SamplingParams(temperature=0.0, logprobs=4,
                                                                        frequency_penalty=0.5))
    for _ in range(4):
        x = logits_favouring(runner, ["b0", "b1"], rng).to(torch.bfloat16)
        ours, vllms = runner.step(["b0", "b1"], x)
        assert torch.equal(ours.sampled_token_ids, vllms.sampled_token_ids)
        assert torch.equal(ours.logprobs_tensors.selected_token_ranks, vllms.logprobs_tensors.selected_token_ranks)
        np.testing.assert_allclose(ours.logprobs_tensors.logprobs.numpy(), vllms.logprobs_tensors.logprobs.numpy(),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["processed_logprobs", "processed_logits"])
def test_sampling_rows_processed_outputs_equal_vllms(rng, mode):
    # Temperature, min-p, top-k, top-p and penalties: the processed top-n and the sampling masks
    # do not depend on the noise, so they are vLLM's (the sampled column is not compared).
    runner = Runner(logprobs_mode=mode, return_sampling_mask=True)
    reqs = {
        "a": SamplingParams(temperature=0.7, top_k=40, seed=1, logprobs=5, repetition_penalty=1.2),
        "b": SamplingParams(temperature=1.3, top_p=0.8, seed=2, logprobs=5, frequency_penalty=0.3),
        "c": SamplingParams(temperature=0.9, top_k=100, top_p=0.9, min_p=0.02, seed=3, logprobs=5),
        "d": SamplingParams(temperature=0.0, logprobs=5, presence_penalty=0.5),
    }
    for r, p in reqs.items():
        runner.add(r, rng.integers(0, VOCAB, 60).tolist(), p)
    for _ in range(4):
        x = logits_favouring(runner, list(reqs), rng, scale=3.0)
        ours, vllms = runner.step(list(reqs), x)
        assert_same_logprobs(ours, vllms, columns=slice(1, None))
        assert_same_masks(ours, vllms)
        # Every drawn token lies in vLLM's kept set.
        for row in range(len(reqs)):
            token = int(ours.sampled_token_ids[row, 0])
            assert vllms.sampling_mask_tensors.packed_mask[row, token // 8] >> (token % 8) & 1


def test_bias_allowed_tokens_and_min_tokens_against_a_float64_reference(rng):
    # vLLM's kernel for these is compiled: the reference is vLLM's order in float64.
    runner = Runner(logprobs_mode="processed_logprobs", return_sampling_mask=True)
    reqs = {
        "g": SamplingParams(temperature=0.0, logit_bias={3: 9.0, 4: -100.0}, logprobs=4),
        "s": SamplingParams(temperature=0.8, top_k=30, seed=9, logprobs=4, logit_bias={10: 2.5},
                            repetition_penalty=1.1),
        "a": SamplingParams(temperature=1.0, allowed_token_ids=list(range(100, 400)), logit_bias={150: 3.0},
                            seed=4, logprobs=4),
        "m": SamplingParams(temperature=0.0, min_tokens=3, stop_token_ids=[77], logprobs=4),
        # With a penalty its history is in the state, whose output length counts toward n.
        "n": SamplingParams(temperature=0.0, min_tokens=4, stop_token_ids=[78, 79], logprobs=4,
                            repetition_penalty=1.05),
    }
    for r, p in reqs.items():
        runner.add(r, rng.integers(0, VOCAB, 50).tolist(), p)
    names = list(reqs)
    for step in range(5):
        x = logits_favouring(runner, names, rng, scale=2.0)
        x[names.index("m"), 77] = 40.0  # the stop token wins once min_tokens lets it
        x[names.index("n"), 79] = 40.0
        batch_pos = [int(runner.states.total_len[runner.states.req_id_to_index[r]]) - 1 for r in names]
        histories = {r: runner.history(r) for r in names}
        ours, _ = runner.step(names, x, compare=False)
        masks = ours.sampling_mask_tensors
        for row, r in enumerate(names):
            prompt, output = histories[r]
            p = reqs[r]
            y = processed64(x[row].numpy(), prompt, output, p, batch_pos[row], len(prompt))
            token = int(ours.sampled_token_ids[row, 0])
            if p.temperature == 0.0:
                assert token == int(np.argmax(y)), (step, r)
                kept = np.isfinite(y)
            else:
                kept, _ = reference.kept_set(y, p.temperature, top_k=p.top_k if p.top_k > 0 else 0)
            bits = np.unpackbits(masks.packed_mask[row].numpy(), count=VOCAB, bitorder="little").astype(bool)
            assert np.array_equal(bits, kept), (step, r)
            assert int(masks.counts[row]) == int(kept.sum())
            want = reference.log_softmax64(y, p.temperature or 1.0, kept)
            lt = ours.logprobs_tensors
            ids = lt.logprob_token_ids[row, 1:].numpy()
            np.testing.assert_allclose(lt.logprobs[row, 1:].numpy(), want[ids], rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(float(lt.logprobs[row, 0]), want[token], rtol=1e-5, atol=1e-5)
        stop = int(ours.sampled_token_ids[names.index("m"), 0])
        assert (stop == 77) == (step >= 3), (step, stop)  # banned while fewer than 3 outputs
        stop = int(ours.sampled_token_ids[names.index("n"), 0])
        assert (stop == 79) == (step >= 4), (step, stop)


def test_a_chunked_prefill_row_samples_nothing_and_has_an_empty_mask(rng):
    # A request still prefilling (its seq_len below its prefill length) gets a logits row whose
    # token vLLM discards: num_sampled 0, and no sampling mask, as vLLM's own.
    runner = Runner(return_sampling_mask=True, logprobs_mode="raw_logprobs")
    runner.add("c0", rng.integers(0, VOCAB, 30).tolist(), SamplingParams(temperature=0.0, logprobs=1))
    runner.add("c1", rng.integers(0, VOCAB, 90).tolist(), SamplingParams(temperature=0.7, top_k=9, seed=3))
    batch = runner.batch(["c0", "c1"], positions=[29, 39])
    batch.seq_lens[1] = 40  # 40 of c1's 90 prompt tokens computed
    x = torch.from_numpy(rng.standard_normal((2, VOCAB)).astype(np.float32))
    ours, vllms = runner.ours(x.clone(), batch), runner.vllms(x.clone(), batch)
    assert ours.num_sampled.tolist() == vllms.num_sampled.tolist() == [1, 0]
    assert torch.equal(ours.num_rejected, vllms.num_rejected)
    assert_same_masks(ours, vllms)
    assert int(ours.sampling_mask_tensors.counts[1]) == 0


def test_the_compact_kept_ids_are_the_first_set_bits(rng):
    from tokenrace.vllm_sampler import _first_set_bits

    for density in (0.0, 0.001, 0.05, 0.5, 1.0):
        bits = rng.random((5, 32 * 40)) < density
        bits[3] = False  # an empty row
        words = np.packbits(bits, axis=1, bitorder="little").view("<u4")
        for width in (0, 1, 7, 64, 2048):
            got = _first_set_bits(words, width)
            for row in range(bits.shape[0]):
                want = np.flatnonzero(bits[row])[:width]
                assert np.array_equal(got[row, :want.size], want), (density, width, row)
                assert not got[row, want.size:].any()


def test_seeded_requests_are_reproducible_and_batch_invariant(rng):
    params = [SamplingParams(temperature=0.9, top_p=0.95, seed=11, repetition_penalty=1.2),
              SamplingParams(temperature=1.1, top_k=50, seed=12, frequency_penalty=0.2),
              SamplingParams(temperature=0.7, seed=13)]
    prompts = [rng.integers(0, VOCAB, 30).tolist() for _ in params]
    x = torch.from_numpy(rng.standard_normal((3, VOCAB)).astype(np.float32) * 2)

    def run(order):
        runner = Runner()
        for i in order:
            runner.add(f"q{i}", prompts[i], params[i])
        ours, _ = runner.step([f"q{i}" for i in order], x[list(order)], compare=False, append=False)
        return {i: int(ours.sampled_token_ids[row, 0]) for row, i in enumerate(order)}

    together = run([0, 1, 2])
    assert run([0, 1, 2]) == together
    assert run([2, 0, 1]) == together
    for i in range(3):
        assert run([i]) == {i: together[i]}


def test_draws_follow_the_processed_distribution(rng):
    # 96 requests, one distribution (penalties, bias, temperature, top-k, top-p), each its own
    # seed, drawn at 60 positions: chi-square against the float64 processed distribution, and a
    # power check that rejects the same draws against the distribution without the penalty.
    vocab_used = 300
    runner = Runner()
    prompt = list(range(0, 40))
    output = [5, 5, 6, 7]
    base = dict(temperature=0.8, top_k=60, top_p=0.95, repetition_penalty=1.5, frequency_penalty=0.3,
                logit_bias={50: 1.0})
    names = [f"d{i}" for i in range(SLOTS)]
    for i, r in enumerate(names):
        runner.add(r, prompt, SamplingParams(seed=1000 + i, **base), output=output)
    x = np.full(VOCAB, -30.0, np.float32)
    x[:vocab_used] = rng.standard_normal(vocab_used).astype(np.float32)
    x[:40] += 1.5  # the prompt's tokens are likely until penalised
    logits = torch.from_numpy(np.tile(x, (SLOTS, 1)))
    counts = np.zeros(VOCAB)
    for position in range(400):
        ours, _ = runner.step(names, logits, compare=False, append=False, positions=[100 + position] * SLOTS)
        np.add.at(counts, ours.sampled_token_ids[:, 0].numpy(), 1)
    params = SamplingParams(**base)
    y = processed64(x, prompt, output, params, 0, len(prompt))

    def probs(values):
        kept, _ = reference.kept_set(values, 0.8, top_k=60, top_p=0.95)
        w = np.where(kept, reference.weights(values, 0.8), 0.0)
        return w / w.sum()

    def chi2(p):
        cells = p * counts.sum() >= 5
        rest = counts[~cells].sum() - p[~cells].sum() * counts.sum()
        return reference.chi_square(counts[cells], p[cells] / p[cells].sum() * counts[cells].sum() / counts.sum()) + \
            rest ** 2 / max(p[~cells].sum() * counts.sum(), 1.0), int(cells.sum())

    right = probs(y)
    assert counts[right == 0].sum() == 0, "a draw outside the kept set"
    stat, dof = chi2(right)
    limit = reference.wilson_hilferty(dof, 4.0)
    assert stat < limit, (stat, limit)
    unpenalised = processed64(x, [], [], SamplingParams(logit_bias={50: 1.0}), 0, 0)
    wrong_stat, _ = chi2(probs(unpenalised))
    assert wrong_stat > limit, ("the power check: the draws fit the unpenalised distribution", wrong_stat, limit)


def test_thinking_budget_and_trace_replay_force_vllms_tokens(rng):
    reasoning = types.SimpleNamespace(reasoning_start_token_ids=[5], reasoning_end_token_ids=[8, 9],
                                      natural_reasoning_end_token_ids=[8, 9])
    runner = Runner(reasoning=reasoning, enable_trace_replay=True, logprobs_mode="raw_logprobs")
    runner.add("t", [1, 2, 5], SamplingParams(temperature=0.0, thinking_token_budget=2, logprobs=2))
    runner.add("r", [1, 2, 3], SamplingParams(temperature=0.0, trace_decode_token_ids=[40, 41, 42], logprobs=2))
    runner.add("p", [1, 2, 3], SamplingParams(temperature=0.0, logprobs=2))
    names = ["t", "r", "p"]
    seen = []
    for _ in range(5):
        x = torch.from_numpy(rng.standard_normal((3, VOCAB)).astype(np.float32))
        x[:, 8] = -5.0
        x[:, 9] = -5.0
        ours, vllms = runner.step(names, x)
        assert torch.equal(ours.sampled_token_ids, vllms.sampled_token_ids)
        assert_same_logprobs(ours, vllms)
        seen.append(ours.sampled_token_ids[:, 0].tolist())
    assert [s[1] for s in seen[:3]] == [40, 41, 42]
    assert [s[0] for s in seen[2:4]] == [8, 9]  # two thinking tokens, then the end marker


def test_what_tokenrace_cannot_honour_stays_with_vllm(rng):
    runner = Runner(use_fp64_gumbel=True)
    runner.add("f", [1, 2], SamplingParams(temperature=0.0))
    calls = []
    original = vllm_cpu.CPUSampler.sample

    def counted(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    runner.ours.sample = types.MethodType(counted, runner.ours)
    x = torch.from_numpy(rng.standard_normal((1, VOCAB)).astype(np.float32))
    ours, vllms = runner.step(["f"], x)
    assert calls and torch.equal(ours.sampled_token_ids, vllms.sampled_token_ids)


def test_a_sampler_with_too_few_rows_is_refused_when_built(monkeypatch):
    import tokenrace.torch

    monkeypatch.setattr(tokenrace.torch, "default_sampler", lambda: tokenrace.Sampler(0, max_rows=SLOTS - 1))
    with pytest.raises(ValueError, match="TOKENRACE_MAX_ROWS >= 16"):
        Runner()


def test_the_plugin_installs_the_whole_sampler_on_a_cpu_platform(monkeypatch):
    import os
    import sys

    import vllm.platforms

    from conftest import REPO

    monkeypatch.syspath_prepend(os.path.join(REPO, "examples", "vllm_plugin"))
    plugin = importlib.import_module("tokenrace_vllm")
    # Everything register() replaces is put back after the test (vLLM 0.34 has no V1
    # TopKTopPSampler: register() skips that part).
    parent = CPUSampler.tokenrace_parent
    # Start from vLLM's own class whatever an earlier test installed (restored afterwards).
    monkeypatch.setattr(vllm_cpu, "CPUSampler", parent)
    monkeypatch.setattr(parent, "_sample_random", parent._sample_random)
    runner_module = sys.modules.get("vllm.v1.worker.cpu.standalone_model_runner")
    if runner_module is not None:
        monkeypatch.setattr(runner_module, "CPUSampler", runner_module.CPUSampler)

    monkeypatch.setattr(vllm.platforms, "_current_platform", types.SimpleNamespace(is_cpu=lambda: False))
    plugin.register()
    assert vllm_cpu.CPUSampler is parent, "a GPU platform keeps vLLM's sampler"

    monkeypatch.setattr(vllm.platforms, "_current_platform", types.SimpleNamespace(is_cpu=lambda: True))
    plugin.register()
    assert vllm_cpu.CPUSampler is CPUSampler
    assert hasattr(parent._sample_random, "tokenrace_original")
    plugin.register()  # idempotent: vLLM calls it in every process, tests may call it twice
    assert vllm_cpu.CPUSampler is CPUSampler and CPUSampler.tokenrace_parent is parent
    assert not hasattr(parent._sample_random.tokenrace_original, "tokenrace_original")
