#!/usr/bin/env python3
"""tokenrace against the samplers a user would otherwise write, in one process, on the same inputs.

Peers (each only where its package is installed):
  numpy-argmax     np.argmax(x, axis=1)                                 (against tokenrace-greedy)
  numpy-vllm       softmax(x/T) / Exp(1) noise drawn per call, argmax   (vLLM's random_sample in NumPy)
  numpy-ready      argmax(x/T - log_noise) with the noise already drawn (the Spyre ring buffer's form)
  torch-random     vLLM's random_sample on CPU: softmax, q.exponential_(), probs.div_(q).argmax
  torch-topk-topp  vLLM's sort-based apply_top_k_top_p (k=50, p=0.9), then random_sample
tokenrace paths: greedy, race (inline noise), race-ready (the same ready log-noise as numpy-ready),
top-k50-top-p0.9.

  python3 bench/compare.py --threads 1 --rows 1,8,32 --vocab 163840 [--json out.json]

Every number is the median of per-call wall time over --reps calls after one warm-up; the
ratio column is the peer's time over tokenrace's on the same path kind, in the same run.

Greedy alone, with --greedy (instead of the table above):

  python3 bench/compare.py --greedy --threads 1 --rows 1,64 --vocab 163840 [--reps 41] [--greedy-json out.json]

tokenrace-greedy, np.argmax(x, axis=1) and np.max(x, axis=1) (NumPy's own read of the same
memory, a read floor that finds no index), timed in alternation call by call (so that a load on
the machine that comes and goes weighs on all three alike; the order rotates) on the same rows;
per shape the median, p10 and p90 per call, us per row, and the ratios argmax/greedy (above 1:
tokenrace is faster) and greedy/max (greedy's time over the read floor).

The whole sampling step, with --step (instead of the table above):

  python3 bench/compare.py --step --threads 16 [--rows 32 --vocab 151936] [--step-json out.json]

32 rows x vocab 151936, each with 4096 prompt and 1024 output tokens, repetition 1.1, frequency
0.2, presence 0.1, 16 biased ids and a grammar bitmask allowing 10% of the vocabulary, T = 1:
  tokenrace-fused         one draw with every input (CSR int32 histories and bias, the bitmask
                          read in place)
  tokenrace-fused-padded  the same with the histories as vLLM holds them (2-D int64 padded with
                          vocab) and the bias as one dict per row: the binding's conversions
  tokenrace-plain         the plain race on the same logits (no step arguments)
  tokenrace-plain-processed  the plain race on the processed logits (bitmask, bias and penalties
                          applied in NumPy before timing): what a fused draw must still race if
                          the step itself cost nothing (ratio processed_over_plain)
  torch-vllm-step         vLLM V1's CPU path for the same step, written from vllm/v1/sample/:
                          the bitmask unpacked to a dense bool mask and masked_fill -inf,
                          logit_bias through advanced-index add, apply_penalties (scatter_add
                          bin counts and masks of the padded histories, the repetition scaling,
                          the two subtractions), the temperature division, then random_sample
                          (softmax, q.exponential_(), probs.div_(q).argmax), in place on the
                          logits as vLLM does (restored, untimed, before each call)
With --requests, the histories are also held in a tokenrace.Requests state (added once, before
timing, from the padded int64 rows) and --history sets each row's history length (default 5120:
4096 prompt + 1024 output; 28000: 26976 + 1024):
  tokenrace-fused-requests  one draw naming the rows by request id (no history passed)
  tokenrace-requests-append  Requests.append of one drawn token per row (on a second state, so
                          that the timed draws keep the list draws' inputs); the ratios
                          requests_over_plain (the goal: at most 1.3), fused_over_requests and
                          padded_over_requests take the draw plus the append
Each is timed --reps times (wall clock, after a warm-up): median, p10 and p90, and the ratios
fused/plain (the goal: at most 1.3) and torch/fused (the goal: at least 50). torch is
optional: without it the torch row is skipped, with the reason printed and in the JSON.

Speculative-decoding verification (vLLM's rejection sampler), with --verify (instead of both):

  python3 bench/compare.py --verify --threads 16 [--rows 32 --drafts 4 --vocab 151936 --reps 20]
      [--verify-profile normal|peaked] [--verify-json out.json] [--verify-cuda]

32 requests x 4 drafts, so 160 float32 target rows (each request's 4 draft positions, then its
bonus position) at vocab 151936, N(0,3) rows (or --verify-profile peaked: the rows of the table
above), T = 1; at each draft position a draft distribution q = softmax(target row + N(0,1)) and
a draft token drawn from it, so that some drafts are accepted:
  tokenrace-draw          a plain draw of the 160 target rows (the baseline)
  tokenrace-verify-no-q   Sampler.verify without draft probabilities (n-gram drafts: q one-hot)
  tokenrace-verify-q      Sampler.verify with the q rows
  torch-vllm-verify-no-q  vLLM V1's RejectionSampler.forward on the CPU, written from
  torch-vllm-verify-q     vllm/v1/sample/rejection_sampler.py in vectorised torch ops (draft_probs
                          None, then the q rows): the bonus rows sampled as its Sampler does
                          (temperature, softmax, q.exponential_(), probs.div_(q).argmax), the
                          target rows copied, divided by the temperature and softmaxed in float32,
                          float64 uniforms, acceptance where draft_prob > 0 and target_prob /
                          draft_prob >= uniform up to the first rejection, recovered tokens as
                          argmax(max(p - q, 0) / Exp(1)) with one Exp(1) row per request (p with
                          the draft zeroed without q). It leaves out what this case does not use
                          (greedy requests, top-k/top-p, logits processors) and the clone of the
                          target logits that vLLM makes for its raw logprobs
  cuda-vllm-verify-*      with --verify-cuda, the same torch ops on the GPU, the logits already on
                          the device as vLLM's are (synchronised after each call; the tokens copied
                          back): vLLM's algorithm in torch ops, not its Triton kernels, which fuse
                          the acceptance and recovery loops (their softmax and exponential rows
                          are the same torch work)
Each is timed --reps times in rounds (wall clock, after a warm-up): median, p10 and p90; the
ratios verify/draw and torch/tokenrace; and the mean accepted drafts per request of every path
beside what these drafts should accept (sum over j of prod min(1, p/q)), a check that both apply
the same rule. --threads sets torch.set_num_threads and the sampler's threads. torch is optional
as with --step.
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "bindings", "python"))
import tokenrace  # noqa: E402

try:
    import torch
except ImportError:  # the peers that need torch are skipped
    torch = None


def peaked_logits(rows, vocab, rng):
    x = rng.normal(0.0, 3.0, size=(rows, vocab)).astype(np.float32)
    for r in range(rows):
        idx = rng.choice(vocab, 4, replace=False)
        x[r, idx] = 20.0 - np.arange(4, dtype=np.float32) * 0.7
    return x


def median_us(fn, reps, budget_s=20.0):
    fn()  # warm up
    times = []
    start = time.perf_counter()
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e6)
        if time.perf_counter() - start > budget_s and len(times) >= 3:
            break
    return float(np.median(times))


def numpy_vllm(x, t, rng):
    z = x / t
    z = z - z.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    q = rng.exponential(size=p.shape).astype(np.float32)
    return np.argmax(p / q, axis=1)


def numpy_ready(x, t, log_noise):
    return np.argmax(x / t - log_noise, axis=1)


def torch_random(x, t):
    probs = torch.softmax(x / t, dim=-1, dtype=torch.float32)
    q = torch.empty_like(probs).exponential_()
    return probs.div_(q).argmax(dim=-1)


def torch_topk_topp(x, t, k, p):
    logits = x / t
    logits_sort, logits_idx = logits.sort(dim=-1, descending=False)
    kth = logits_sort.gather(-1, (logits_sort.size(1) - k).unsqueeze(1))
    logits_sort.masked_fill_(logits_sort < kth, -float("inf"))
    probs_sort = logits_sort.softmax(dim=-1)
    probs_sum = torch.cumsum(probs_sort, dim=-1, out=probs_sort)
    mask = probs_sum <= 1 - p.unsqueeze(1)
    mask[:, -1] = False
    logits_sort.masked_fill_(mask, -float("inf"))
    logits = logits_sort.scatter(dim=-1, index=logits_idx, src=logits_sort)
    return torch_random(logits, 1.0)


# -- the whole sampling step (--step) -------------------------------------------------------------


def timings_us(fn, reps, setup=None, budget_s=60.0):
    """Per-call wall times in µs of ``fn()`` over ``reps`` calls after one warm-up; ``setup()``
    (untimed) runs before each call."""
    if setup:
        setup()
    fn()
    times = []
    start = time.perf_counter()
    for _ in range(reps):
        if setup:
            setup()
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e6)
        if time.perf_counter() - start > budget_s and len(times) >= 5:
            break
    return np.asarray(times)


def step_inputs(rows, vocab, prompt_len, output_len, biased, allowed_fraction, rng):
    """The step's inputs: per-row histories, 16 biased ids, a bitmask of ~10% allowed tokens."""
    prompt = rng.integers(0, vocab, size=(rows, prompt_len), dtype=np.int64)
    output = rng.integers(0, vocab, size=(rows, output_len), dtype=np.int64)
    bias_ids = np.stack([rng.choice(vocab, biased, replace=False) for _ in range(rows)]).astype(np.int64)
    bias_values = rng.uniform(-5.0, 5.0, size=(rows, biased)).astype(np.float32)
    words = -(-vocab // 32)
    bits = rng.random((rows, words * 32)) < allowed_fraction
    for r in range(rows):  # the row's likeliest tokens stay allowed (a grammar allows something useful)
        bits[r, bias_ids[r, :2]] = True
    weights = (1 << np.arange(32, dtype=np.uint64)).astype(np.uint64)
    bitmask = (bits.reshape(rows, words, 32).astype(np.uint64) * weights).sum(axis=2).astype(np.uint32).view(np.int32)
    return prompt, output, bias_ids, bias_values, np.ascontiguousarray(bitmask), bits[:, :vocab]


def processed_logits(x, prompt, output, bias_ids, bias_values, allowed, r, f, p):
    """The step's processed logits in NumPy, float32: the bitmask (-inf outside it), the bias,
    then the penalties (repetition on every token of the prompt or the output, frequency and
    presence on the output's). The values the fused draw races, up to rounding: timed only, as
    the row a plain race would have to read if the step cost nothing."""
    y = np.where(allowed, x, -np.inf).astype(np.float32)
    vocab = x.shape[1]
    for i in range(x.shape[0]):
        y[i, bias_ids[i]] += bias_values[i]
        counts = np.bincount(output[i], minlength=vocab)
        seen = counts > 0
        seen[prompt[i]] = True
        row = y[i]
        row[seen] = np.where(row[seen] > 0, row[seen] / np.float32(r), row[seen] * np.float32(r))
        row -= (np.float32(f) * counts + np.float32(p) * (counts > 0)).astype(np.float32)
    return y


def csr_of(rows_2d, dtype=np.int32):
    rows, width = rows_2d.shape
    return (np.ascontiguousarray(rows_2d.reshape(-1), dtype=dtype),
            np.arange(rows + 1, dtype=np.uint64) * np.uint64(width))


def torch_vllm_step(logits, prompt_t, output_t, bias_rows, bias_cols, bias_vals, bitmask_t, shifts,
                    rep, freq, pres, temp):
    """vLLM V1's CPU sampling step on ``logits`` (in place), as its sampler runs it: grammar
    bitmask, logit bias, penalties, temperature, random_sample."""
    rows, vocab = logits.shape
    # The structured-output bitmask as a dense mask: bit j of word w allows token 32 w + j.
    allowed = ((bitmask_t.unsqueeze(-1) >> shifts) & 1).reshape(rows, -1)[:, :vocab].bool()
    logits.masked_fill_(~allowed, -float("inf"))
    # Logit bias (LogitBiasLogitsProcessor.apply): an advanced-index add of the (row, id) pairs.
    logits[(bias_rows, bias_cols)] += bias_vals
    # apply_penalties: bin counts over vocab + 1 (the padding id is vocab), masks, then the
    # repetition scaling (apply_repetition_penalties_torch) and the two subtractions.
    prompt_counts = torch.zeros((rows, vocab + 1), dtype=torch.long)
    prompt_counts.scatter_add_(1, prompt_t, torch.ones_like(prompt_t))
    prompt_mask = prompt_counts[:, :vocab] > 0
    output_counts = torch.zeros((rows, vocab + 1), dtype=torch.long)
    output_counts.scatter_add_(1, output_t, torch.ones_like(output_t))
    output_counts = output_counts[:, :vocab]
    output_mask = output_counts > 0
    penalties = torch.where(prompt_mask | output_mask, rep.unsqueeze(1).repeat(1, vocab), 1.0)
    scaling = torch.where(logits > 0, 1.0 / penalties, penalties)
    logits *= scaling
    logits -= freq.unsqueeze(1) * output_counts
    logits -= pres.unsqueeze(1) * output_mask
    # Sampler.sample: the temperature, then random_sample.
    logits.div_(temp.unsqueeze(1))
    probs = logits.softmax(dim=-1, dtype=torch.float32)
    q = torch.empty_like(probs).exponential_()
    return probs.div_(q).argmax(dim=-1)


def _commit():
    """BENCH_COMMIT when set (a copy of the tree on another host may carry a stale .git), else HEAD."""
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    try:
        return subprocess.run(["git", "-C", HERE, "rev-parse", "HEAD"], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _cpu():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def summary(path, times, **fields):
    """The record of one timed path: ``fields`` (the case), then the median, p10 and p90 of the
    per-call ``times`` (µs) and their count."""
    return dict(path=path, **fields, reps=int(times.size), us_per_call_median=float(np.median(times)),
                us_per_call_p10=float(np.percentile(times, 10)), us_per_call_p90=float(np.percentile(times, 90)))


def print_summary_header():
    print(f"{'path':<24}{'median us':>12}{'p10 us':>12}{'p90 us':>12}")


def print_summary(rec):
    print(f"{rec['path']:<24}{rec['us_per_call_median']:>12.1f}{rec['us_per_call_p10']:>12.1f}"
          f"{rec['us_per_call_p90']:>12.1f}")


def run_info(sampler, threads):
    """What the JSON files record of the run: the command line, the commit, the machine and the
    versions, the SIMD level and threads of the tokenrace sampler."""
    return dict(command=" ".join([os.path.basename(sys.executable)] + sys.argv), commit=_commit(), cpu=_cpu(),
                cpus=os.cpu_count(), isa=sampler.simd_level, tokenrace=tokenrace.version(),
                numpy=np.__version__, torch=torch.__version__ if torch else None, threads=threads)


def write_json(path, doc):
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=1)


def print_versions(sampler, threads):
    print(f"tokenrace {tokenrace.version()} ({sampler.simd_level}), numpy {np.__version__}, "
          f"torch {torch.__version__ if torch else 'absent'}, threads {threads}, {os.cpu_count()} cpus")


def step_main(a):
    rows = 32 if a.rows is None else int(a.rows.split(",")[0])
    vocab = 151936 if a.vocab is None else a.vocab
    output_len, biased, allowed_fraction = 1024, 16, 0.10
    prompt_len = a.history - output_len
    r, f, p, t = 1.1, 0.2, 0.1, 1.0
    rng = np.random.default_rng(0)
    x = peaked_logits(rows, vocab, rng)
    prompt, output, bias_ids, bias_values, bitmask, allowed = step_inputs(
        rows, vocab, prompt_len, output_len, biased, allowed_fraction, rng)
    x[np.arange(rows)[:, None], bias_ids[:, :2]] = 20.0  # allowed and likely
    sampler = tokenrace.Sampler(vocab, max_rows=max(rows, 256), seed=1, threads=a.threads)
    if torch is not None:
        torch.set_num_threads(a.threads)
    bias_csr = (np.ascontiguousarray(bias_ids.reshape(-1), np.int32), bias_values.reshape(-1),
                np.arange(rows + 1, dtype=np.uint64) * np.uint64(biased))
    fused_args = dict(temperature=t, prompt_tokens=csr_of(prompt), output_tokens=csr_of(output),
                      repetition_penalty=r, frequency_penalty=f, presence_penalty=p, logit_bias=bias_csr,
                      token_bitmask=bitmask)
    padded_args = dict(fused_args, prompt_tokens=prompt, output_tokens=output,
                       logit_bias=[dict(zip(bias_ids[i].tolist(), bias_values[i].tolist())) for i in range(rows)])
    tokens = sampler.draw(x, **fused_args)
    assert allowed[np.arange(rows), tokens].all(), "a fused draw returned a token the bitmask forbids"
    np.testing.assert_array_equal(sampler.draw(x, seeds=np.arange(rows), **fused_args),
                                  sampler.draw(x, seeds=np.arange(rows), **padded_args))
    if a.requests:
        # The histories held by a state: added once (vLLM's padded int64 rows, converted here),
        # then each timed step names the rows and appends the drawn tokens.
        state = tokenrace.Requests()
        ids = np.arange(rows, dtype=np.uint64) + np.uint64(1 << 40)
        state.add_rows(ids, prompt, output, pad_id=vocab)
        requests_args = dict(fused_args, prompt_tokens=None, output_tokens=None, requests=state, request_ids=ids)
        np.testing.assert_array_equal(sampler.draw(x, seeds=np.arange(rows), **fused_args),
                                      sampler.draw(x, seeds=np.arange(rows), **requests_args))

        # The per-step append, timed apart on a second state: appending the drawn tokens to the
        # timed state would change its histories (the drawn tokens are the peaks the penalties
        # then lower), so that its draws would no longer race the inputs of the list draws.
        scratch = tokenrace.Requests()
        scratch.add_rows(ids, prompt, output, pad_id=vocab)
        drawn = sampler.draw(x, **requests_args)

        def requests_step():
            sampler.draw(x, **requests_args)
    setting = (f"{rows} rows x vocab {vocab}, {prompt_len} prompt + {output_len} output tokens per row, "
               f"r={r} f={f} p={p}, {biased} biased ids, bitmask allowing {allowed_fraction:.0%}, T={t}")
    print_versions(sampler, a.threads)
    print(setting)
    print_summary_header()
    records = {}

    def report(path, times, note=None):
        rec = summary(path, times, rows=rows, vocab=vocab, threads=a.threads)
        if note:
            rec["note"] = note
        records[path] = rec
        print_summary(rec)

    # The plain race of the processed row: what any fused draw must at least race, with the step
    # itself free. On peaked rows the bitmask removes the peak from most rows, so this race
    # visits more blocks than the plain race of the given logits.
    processed = processed_logits(x, prompt, output, bias_ids, bias_values, allowed, r, f, p)
    # Interleaved in rounds so that a load on the machine weighs on both alike.
    fused, padded, plain, plain_processed, held = [], [], [], [], []
    rounds = 5
    per = max(1, a.reps // rounds)
    for _ in range(rounds):
        if a.requests:
            held.append(timings_us(requests_step, per))
        fused.append(timings_us(lambda: sampler.draw(x, **fused_args), per))
        plain.append(timings_us(lambda: sampler.draw(x, temperature=t), per))
        plain_processed.append(timings_us(lambda: sampler.draw(processed, temperature=t), per))
        padded.append(timings_us(lambda: sampler.draw(x, **padded_args), max(1, per // 2)))
    report("tokenrace-fused", np.concatenate(fused))
    if a.requests:
        report("tokenrace-fused-requests", np.concatenate(held),
               note="histories held in a Requests state, the rows named by request id")
        report("tokenrace-requests-append", timings_us(lambda: scratch.append(ids, drawn), a.reps),
               note="Requests.append of one drawn token per row (the state's per-step bookkeeping)")
    report("tokenrace-fused-padded", np.concatenate(padded))
    report("tokenrace-plain", np.concatenate(plain))
    report("tokenrace-plain-processed", np.concatenate(plain_processed),
           note="the plain race of the processed logits, made in NumPy before timing")
    skipped = None
    if torch is not None:
        tx = torch.from_numpy(x)
        work = tx.clone()
        prompt_t = torch.from_numpy(prompt)  # vLLM's prompt tensor: int64, padded with vocab (none here)
        output_t = torch.from_numpy(output)
        bias_rows = torch.arange(rows, dtype=torch.int32).repeat_interleave(biased)
        bias_cols = torch.from_numpy(np.ascontiguousarray(bias_ids.reshape(-1), np.int32))
        bias_vals = torch.from_numpy(bias_values.reshape(-1).copy())
        bitmask_t = torch.from_numpy(bitmask)
        shifts = torch.arange(32, dtype=torch.int32)
        rep_t, freq_t, pres_t, temp_t = (torch.full((rows,), v, dtype=torch.float32) for v in (r, f, p, t))

        def torch_step():
            return torch_vllm_step(work, prompt_t, output_t, bias_rows, bias_cols, bias_vals, bitmask_t, shifts,
                                   rep_t, freq_t, pres_t, temp_t)

        got = torch_step()
        assert allowed[np.arange(rows), got.numpy()].all(), "the torch step returned a token the bitmask forbids"
        report("torch-vllm-step", timings_us(torch_step, max(3, a.reps // 5), setup=lambda: work.copy_(tx)))
    else:
        skipped = "torch is not installed here (pip install torch): vLLM's CPU path was not measured"
        print(f"{'torch-vllm-step':<24}skipped: {skipped}")
    fused_us = records["tokenrace-fused"]["us_per_call_median"]
    ratios = {"fused_over_plain": fused_us / records["tokenrace-plain"]["us_per_call_median"],
              "padded_over_fused": records["tokenrace-fused-padded"]["us_per_call_median"] / fused_us,
              "processed_over_plain": records["tokenrace-plain-processed"]["us_per_call_median"]
              / records["tokenrace-plain"]["us_per_call_median"]}
    if a.requests:
        held_us = (records["tokenrace-fused-requests"]["us_per_call_median"]
                   + records["tokenrace-requests-append"]["us_per_call_median"])
        ratios["requests_over_plain"] = held_us / records["tokenrace-plain"]["us_per_call_median"]
        ratios["fused_over_requests"] = fused_us / held_us
        ratios["padded_over_requests"] = records["tokenrace-fused-padded"]["us_per_call_median"] / held_us
    if "torch-vllm-step" in records:
        ratios["torch_over_fused"] = records["torch-vllm-step"]["us_per_call_median"] / fused_us
    print("ratios: " + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items())
          + " (goals: fused/plain <= 1.3, torch/fused >= 50)")
    if a.step_json:
        write_json(a.step_json, dict(run_info(sampler, a.threads), setting=setting, records=list(records.values()),
                                         ratios=ratios, torch_skipped=skipped))


# -- speculative-decoding verification (--verify) -------------------------------------------------


def verify_inputs(requests, drafts, vocab, profile, rng):
    """The verification case: target logits for ``requests`` requests of ``drafts`` draft tokens
    each, request after request (its draft positions, then its bonus position), N(0, 3) rows
    ("normal") or ``peaked_logits`` rows ("peaked"); at each draft position a draft model's
    distribution q = softmax(target row + N(0, 1)) and a draft token drawn from it.

    Returns the logits, the draft ids (int32), q (float32, one row per draft), the indices of the
    draft and of the bonus rows in the logits, and each draft's p(d) and q(d) in float64, p being
    the target row's softmax at T = 1 (for the expected acceptance)."""
    rows = requests * (drafts + 1)
    if profile == "peaked":
        x = peaked_logits(rows, vocab, rng)
    else:
        x = rng.normal(0.0, 3.0, size=(rows, vocab)).astype(np.float32)
    target_idx = (np.arange(requests)[:, None] * (drafts + 1) + np.arange(drafts)).reshape(-1)
    bonus_idx = np.arange(requests) * (drafts + 1) + drafts
    n = target_idx.size
    z = x[target_idx] + rng.normal(0.0, 1.0, size=(n, vocab)).astype(np.float32)  # the draft model's logits
    ids = np.argmax(z - np.log(rng.exponential(size=z.shape)).astype(np.float32), axis=1).astype(np.int32)
    q = z.astype(np.float64)  # softmax(z), float64 for q(d); the q rows handed over are float32
    q -= q.max(axis=1, keepdims=True)
    np.exp(q, out=q)
    q /= q.sum(axis=1, keepdims=True)
    q_d = q[np.arange(n), ids]
    q = q.astype(np.float32)
    t = x[target_idx].astype(np.float64)
    t -= t.max(axis=1, keepdims=True)
    p_d = np.exp(t[np.arange(n), ids]) / np.exp(t).sum(axis=1)
    return x, ids, q, target_idx, bonus_idx, p_d, q_d


def expected_accepted(p_d, q_d, requests, drafts):
    """The expected number of accepted drafts per request, averaged over the requests, for these
    drafts: draft j is accepted with chance min(1, p(d_j) / q(d_j)) once every draft before it is."""
    a = np.minimum(1.0, p_d / q_d).reshape(requests, drafts)
    return float(np.cumprod(a, axis=1).sum(axis=1).mean())


def torch_vllm_verify(logits, target_idx, bonus_idx, draft_ids, num_draft, temp, draft_probs):
    """vLLM V1's rejection sampler step (RejectionSampler.forward, vllm/v1/sample/
    rejection_sampler.py) on the CPU in vectorised torch ops, for sampling requests (vLLM's
    all_random: no greedy request, no top-k/top-p) that all have the same number of drafts.
    ``draft_probs`` None is vLLM's case without draft probabilities (n-gram: q one-hot).
    Returns int32 [batch, drafts + 1]: the accepted drafts, the recovered or bonus token, then -1."""
    batch = temp.shape[0]
    k = draft_ids.shape[0] // batch
    # The bonus tokens: vLLM's Sampler on the bonus rows (a copy), temperature then random_sample.
    bonus = torch_random(logits[bonus_idx], temp.unsqueeze(1))
    # apply_sampling_constraints on the target rows (a copy: logits[target_logits_indices]):
    # the request's temperature for each draft token (expand_batch_to_tokens), divided in place,
    # then the float32 softmax.
    target = logits[target_idx]
    target.div_(temp.repeat_interleave(num_draft).unsqueeze(1))
    probs = target.softmax(dim=-1, dtype=torch.float32)
    # generate_uniform_probs: one float64 uniform per draft token.
    dev = logits.device
    uniform = torch.rand(draft_ids.shape[0], dtype=torch.float64, device=dev)
    # The acceptance test of rejection_random_sample_kernel, at every position at once:
    # draft_prob > 0 and target_prob / draft_prob >= uniform (draft_prob 1 without draft probs).
    col = draft_ids.unsqueeze(1)
    target_p = probs.gather(1, col).squeeze(1)
    if draft_probs is None:
        draft_p = torch.ones_like(target_p)
        probs.scatter_(1, col, 0.0)  # sample_recovered_tokens without q: p with the draft zeroed
    else:
        draft_p = draft_probs.gather(1, col).squeeze(1)
        probs.sub_(draft_probs).clamp_(min=0.0)  # max(p - q, 0), unnormalised as vLLM leaves it
    accept = ((draft_p > 0) & (target_p / draft_p >= uniform)).view(batch, k)
    # sample_recovered_tokens: one Exp(1) row per request, shared by its positions,
    # recovered = argmax(prob / exp) at every draft position (the probabilities are not needed after).
    exp = torch.empty((batch, probs.shape[1]), dtype=torch.float32, device=dev).exponential_()
    recovered = probs.view(batch, k, -1).div_(exp.unsqueeze(1)).argmax(dim=-1)
    # rejection_random_sample_kernel's output: the drafts up to the first rejection, then the
    # recovered token of that position, or the bonus token when every draft is accepted.
    n_acc = accept.to(torch.int32).cumprod(dim=1).sum(dim=1)
    last = torch.where(n_acc < k, recovered.gather(1, n_acc.clamp(max=k - 1).unsqueeze(1)).squeeze(1), bonus)
    out = torch.full((batch, k + 1), -1, dtype=torch.int32, device=dev)
    out[:, :k] = torch.where(torch.arange(k, device=dev).unsqueeze(0) < n_acc.unsqueeze(1), draft_ids.view(batch, k), -1)
    out.scatter_(1, n_acc.unsqueeze(1), last.unsqueeze(1).to(torch.int32))
    return out


def check_verify_output(name, tokens, accepted, drafts_2d, vocab):
    """Each request's output: its accepted drafts, then one token id, then -1."""
    requests, k = drafts_2d.shape
    assert tokens.shape == (requests, k + 1), f"{name}: output shape {tokens.shape}"
    for i in range(requests):
        n = int(accepted[i])
        assert 0 <= n <= k, f"{name}: request {i} accepted {n} of {k} drafts"
        assert (tokens[i, :n] == drafts_2d[i, :n]).all(), f"{name}: request {i} emitted other tokens than its drafts"
        assert 0 <= tokens[i, n] < vocab, f"{name}: request {i} emitted {tokens[i, n]}, no token id"
        assert (tokens[i, n + 1:] == -1).all(), f"{name}: request {i} is not -1 padded"


def verify_main(a):
    requests = 32 if a.rows is None else int(a.rows.split(",")[0])
    vocab = 151936 if a.vocab is None else a.vocab
    k, t = a.drafts, 1.0
    if k < 1 or a.reps < 1:
        raise SystemExit("--verify needs --drafts and --reps of at least 1")
    rows = requests * (k + 1)
    rng = np.random.default_rng(0)
    x, ids, q, target_idx, bonus_idx, p_d, q_d = verify_inputs(requests, k, vocab, a.verify_profile, rng)
    counts = np.full(requests, k, dtype=np.int32)
    drafts_2d = ids.reshape(requests, k)
    sampler = tokenrace.Sampler(vocab, max_rows=max(rows, 256), seed=1, threads=a.threads)
    if torch is not None:
        torch.set_num_threads(a.threads)
    profile = ("N(0,3)" if a.verify_profile == "normal" else "N(0,3) with 4 ids at 20, 19.3, 18.6, 17.9")
    setting = (f"{requests} requests x {k} drafts ({rows} target rows) x vocab {vocab}, float32 {profile} logits, "
               f"drafts drawn from q = softmax(target + N(0,1)), T={t}")
    print_versions(sampler, a.threads)
    print(setting)
    print_summary_header()
    fields = dict(requests=requests, drafts=k, rows=rows, vocab=vocab, threads=a.threads)
    outputs = {}  # path: what each of its calls returned (the accepted counts are read after the timing)

    def tokenrace_verify(path, draft_probs):
        got = outputs.setdefault(path, [])
        return lambda: got.append(sampler.verify(x, ids, counts, draft_probs=draft_probs, temperature=t))

    paths = {"tokenrace-draw": lambda: sampler.draw(x, temperature=t),
             "tokenrace-verify-no-q": tokenrace_verify("tokenrace-verify-no-q", None),
             "tokenrace-verify-q": tokenrace_verify("tokenrace-verify-q", q)}
    for path, draft_probs in (("tokenrace-verify-no-q", None), ("tokenrace-verify-q", q)):
        r = sampler.verify(x, ids, counts, draft_probs=draft_probs, temperature=t)
        check_verify_output(path, r.tokens, r.accepted, drafts_2d, vocab)
    skipped = None
    if torch is not None:
        tx = torch.from_numpy(x)
        tq = torch.from_numpy(q)
        t_target, t_bonus = torch.from_numpy(target_idx), torch.from_numpy(bonus_idx)
        t_ids = torch.from_numpy(ids.astype(np.int64))  # torch's gather and scatter take int64 indices
        t_counts = torch.from_numpy(counts.astype(np.int64))
        t_temp = torch.full((requests,), t, dtype=torch.float32)

        def torch_verify(path, draft_probs):
            got = outputs.setdefault(path, [])
            return lambda: got.append(torch_vllm_verify(tx, t_target, t_bonus, t_ids, t_counts, t_temp, draft_probs))

        for path, draft_probs in (("torch-vllm-verify-no-q", None), ("torch-vllm-verify-q", tq)):
            out = torch_vllm_verify(tx, t_target, t_bonus, t_ids, t_counts, t_temp, draft_probs).numpy()
            check_verify_output(path, out, (out != -1).sum(axis=1) - 1, drafts_2d, vocab)
            paths[path] = torch_verify(path, draft_probs)
        if a.verify_cuda and torch.cuda.is_available():
            # The same step on the GPU with the logits already there (as vLLM's are): its time
            # to the last kernel's end, not counting the copies to the device.
            g = {name: v.cuda() for name, v in dict(x=tx, q=tq, target=t_target, bonus=t_bonus, ids=t_ids,
                                                     counts=t_counts, temp=t_temp).items()}

            def cuda_verify(path, draft_probs):
                got = outputs.setdefault(path, [])

                def call():
                    out = torch_vllm_verify(g["x"], g["target"], g["bonus"], g["ids"], g["counts"], g["temp"],
                                            draft_probs)
                    torch.cuda.synchronize()
                    got.append(out.cpu())
                return call

            for path, draft_probs in (("cuda-vllm-verify-no-q", None), ("cuda-vllm-verify-q", g["q"])):
                out = torch_vllm_verify(g["x"], g["target"], g["bonus"], g["ids"], g["counts"], g["temp"],
                                        draft_probs).cpu().numpy()
                check_verify_output(path, out, (out != -1).sum(axis=1) - 1, drafts_2d, vocab)
                paths[path] = cuda_verify(path, draft_probs)
    else:
        skipped = "torch is not installed here (pip install torch): vLLM's rejection sampler step was not measured"
    # Interleaved in rounds so that a load on the machine weighs on every path alike.
    rounds = min(5, a.reps)
    times = {path: [] for path in paths}
    for i in range(rounds):
        per = a.reps // rounds + (i < a.reps % rounds)
        for path, fn in paths.items():
            times[path].append(timings_us(fn, per))
    records = {}
    for path in paths:
        records[path] = summary(path, np.concatenate(times[path]), **fields)
        print_summary(records[path])
    if skipped:
        for path in ("torch-vllm-verify-no-q", "torch-vllm-verify-q"):
            print(f"{path:<24}skipped: {skipped}")
    med = {path: rec["us_per_call_median"] for path, rec in records.items()}
    ratios = {"verify_no_q_over_draw": med["tokenrace-verify-no-q"] / med["tokenrace-draw"],
              "verify_q_over_draw": med["tokenrace-verify-q"] / med["tokenrace-draw"]}
    if torch is not None:
        ratios["torch_over_tokenrace_no_q"] = med["torch-vllm-verify-no-q"] / med["tokenrace-verify-no-q"]
        ratios["torch_over_tokenrace_q"] = med["torch-vllm-verify-q"] / med["tokenrace-verify-q"]
    if "cuda-vllm-verify-q" in med:
        ratios["tokenrace_over_cuda_no_q"] = med["tokenrace-verify-no-q"] / med["cuda-vllm-verify-no-q"]
        ratios["tokenrace_over_cuda_q"] = med["tokenrace-verify-q"] / med["cuda-vllm-verify-q"]
    print("ratios: " + ", ".join(f"{name} {v:.2f}" for name, v in ratios.items()))
    # The acceptance each implementation saw, against its expectation for these drafts: a check
    # that both run the same rule (it varies from call to call: the uniforms are fresh each time).
    acceptance = {"expected_no_q": expected_accepted(p_d, np.ones_like(q_d), requests, k),
                  "expected_q": expected_accepted(p_d, q_d, requests, k)}
    for path, got in outputs.items():
        if path.startswith(("torch", "cuda")):
            acceptance[path] = float(np.mean([(out.numpy() != -1).sum(axis=1) - 1 for out in got]))
        else:
            acceptance[path] = float(np.mean([r.counts - 1 for r in got]))
    print("accepted drafts per request (mean over every call): "
          + ", ".join(f"{name} {v:.3f}" for name, v in acceptance.items()))
    if a.verify_json:
        write_json(a.verify_json, dict(run_info(sampler, a.threads), setting=setting, profile=a.verify_profile,
                                       temperature=t, records=list(records.values()), ratios=ratios,
                                       accepted_drafts_per_request=acceptance, torch_skipped=skipped))


def alternating_us(fns, reps):
    """Per-call wall times in µs of each of ``fns`` over ``reps`` rounds after one warm-up round;
    each round calls every function once, so that a load on the machine that comes and goes
    weighs on all of them alike, in an order that rotates from round to round, so that none
    always follows the same one (which leaves the caches as it leaves them)."""
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    for rep in range(reps):
        for j in range(len(fns)):
            i = (j + rep) % len(fns)
            start = time.perf_counter()
            fns[i]()
            times[i].append((time.perf_counter() - start) * 1e6)
    return [np.asarray(t) for t in times]


def greedy_main(a):
    """Greedy against np.argmax and the read floor np.max, in alternation (see the module doc)."""
    rng = np.random.default_rng(0)
    sampler = tokenrace.Sampler(a.vocab, max_rows=max(256, max(int(r) for r in a.rows.split(","))), seed=1,
                                threads=a.threads)
    print_versions(sampler, a.threads)
    print(f"{'path':<18}{'rows':>6}{'vocab':>8}{'median us':>11}{'p10 us':>10}{'p90 us':>10}{'us/row':>9}")
    records, ratios = [], []
    for rows in [int(r) for r in a.rows.split(",")]:
        x = peaked_logits(rows, a.vocab, rng)
        np.testing.assert_array_equal(sampler.draw(x, temperature=0.0), np.argmax(x, axis=1))
        paths = ("tokenrace-greedy", "numpy-argmax", "numpy-max")
        fns = (lambda: sampler.draw(x, temperature=0.0), lambda: np.argmax(x, axis=1), lambda: np.max(x, axis=1))
        medians = {}
        for path, times in zip(paths, alternating_us(fns, a.reps)):
            rec = summary(path, times, rows=rows, vocab=a.vocab)
            rec["us_per_row_median"] = rec["us_per_call_median"] / rows
            records.append(rec)
            medians[path] = rec["us_per_call_median"]
            print(f"{path:<18}{rows:>6}{a.vocab:>8}{rec['us_per_call_median']:>11.1f}{rec['us_per_call_p10']:>10.1f}"
                  f"{rec['us_per_call_p90']:>10.1f}{rec['us_per_row_median']:>9.2f}")
        r = dict(rows=rows, vocab=a.vocab,
                 argmax_over_greedy=medians["numpy-argmax"] / medians["tokenrace-greedy"],
                 greedy_over_max=medians["tokenrace-greedy"] / medians["numpy-max"])
        ratios.append(r)
        print(f"  argmax/greedy {r['argmax_over_greedy']:.3f}   greedy/max (read floor) {r['greedy_over_max']:.3f}")
    if a.greedy_json:
        write_json(a.greedy_json, dict(run_info(sampler, a.threads), records=records, ratios=ratios))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rows", default="1,8,32,128,256")
    ap.add_argument("--vocab", type=int, default=163840)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json")
    ap.add_argument("--greedy", action="store_true",
                    help="time greedy alone against np.argmax and np.max, in alternation (see the module doc)")
    ap.add_argument("--greedy-json", help="with --greedy: write the results here")
    ap.add_argument("--step", action="store_true",
                    help="measure the whole sampling step instead (see the module doc; --rows and --vocab "
                         "default to 32 and 151936 there)")
    ap.add_argument("--step-json", help="with --step: write the results here")
    ap.add_argument("--requests", action="store_true",
                    help="with --step: also time the draw with the histories held in a tokenrace.Requests state")
    ap.add_argument("--history", type=int, default=5120,
                    help="with --step: history tokens per row (the last 1024 of them the output)")
    # The former names of --step and --step-json, still taken (deprecated, not listed).
    ap.add_argument("--pipeline", dest="step", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--pipeline-json", dest="step_json", help=argparse.SUPPRESS)
    ap.add_argument("--verify", action="store_true",
                    help="measure speculative-decoding verification instead (see the module doc; --rows is the "
                         "requests there, 32 by default, --vocab 151936, --reps 20)")
    ap.add_argument("--drafts", type=int, default=4, help="with --verify: draft tokens per request")
    ap.add_argument("--verify-profile", choices=("normal", "peaked"), default="normal",
                    help="with --verify: N(0,3) target rows, or those of the table (4 ids far above the rest)")
    ap.add_argument("--verify-json", help="with --verify: write the results here")
    ap.add_argument("--verify-cuda", action="store_true",
                    help="with --verify: also time vLLM's step in torch ops on the GPU (logits on the device)")
    a = ap.parse_args()
    if a.step and a.verify:
        ap.error("--step and --verify are two different measurements: pass one")
    def own_defaults(reps):
        # --verify and --step have their own sizes: the table's defaults become None (the
        # measurement's), and --reps defaults to `reps`.
        for name in ("rows", "vocab"):
            if getattr(a, name) == ap.get_default(name):
                setattr(a, name, None)
        a.reps = a.reps if a.reps != ap.get_default("reps") else reps

    if a.greedy:
        if a.step or a.verify:
            ap.error("--greedy is a measurement of its own: pass it without --step or --verify")
        return greedy_main(a)
    if a.verify:
        own_defaults(20)
        return verify_main(a)
    if a.step:
        own_defaults(50)
        return step_main(a)
    rng = np.random.default_rng(0)
    if torch is not None:
        torch.set_num_threads(a.threads)
    sampler = tokenrace.Sampler(a.vocab, max_rows=256, seed=1, threads=a.threads)
    has_filters = "top_k" in tokenrace.Sampler.draw.__code__.co_varnames
    print(f"tokenrace {tokenrace.version()} ({sampler.simd_level if hasattr(sampler, 'simd_level') else tokenrace.simd_level()}), "
          f"numpy {np.__version__}, torch {torch.__version__ if torch else 'absent'}, threads {a.threads}, "
          f"{os.cpu_count()} cpus, vocab {a.vocab}")
    print(f"{'path':<22}{'rows':>6}{'us/call':>12}{'us/row':>10}{'tokenrace us/call':>19}{'peer/tokenrace':>16}")
    records = []
    info = run_info(sampler, a.threads)

    def report(path, rows, us, ours):
        ratio = us / ours if ours else float("nan")
        print(f"{path:<22}{rows:>6}{us:>12.1f}{us / rows:>10.2f}{ours:>19.1f}{ratio:>16.1f}")
        records.append(dict(path=path, rows=rows, vocab=a.vocab, us_per_call=us, us_per_row=us / rows,
                            tokenrace_us_per_call=ours, ratio=ratio, **info))

    for rows in [int(r) for r in a.rows.split(",")]:
        x = peaked_logits(rows, a.vocab, rng)
        temps = np.full(rows, 1.0, dtype=np.float32)
        log_noise = np.log(rng.exponential(size=x.shape)).astype(np.float32)
        greedy = median_us(lambda: sampler.draw(x, temperature=0.0), a.reps)
        race = median_us(lambda: sampler.draw(x, temperature=temps), a.reps)
        ready = median_us(lambda: sampler.draw(x, temperature=temps, noise=log_noise, noise_kind="log_exp"), a.reps)
        report("tokenrace-greedy", rows, greedy, greedy)
        report("tokenrace-race", rows, race, race)
        report("tokenrace-race-ready", rows, ready, ready)
        filt = None
        if has_filters:
            filt = median_us(lambda: sampler.draw(x, temperature=temps, top_k=50, top_p=0.9), a.reps)
            report("tokenrace-topk-topp", rows, filt, filt)
        reps = max(3, a.reps // 5)
        report("numpy-argmax", rows, median_us(lambda: np.argmax(x, axis=1), a.reps), greedy)
        report("numpy-vllm", rows, median_us(lambda: numpy_vllm(x, 1.0, rng), reps), race)
        report("numpy-ready", rows, median_us(lambda: numpy_ready(x, 1.0, log_noise), reps), ready)
        if torch is not None:
            tx = torch.from_numpy(x)
            report("torch-random", rows, median_us(lambda: torch_random(tx, 1.0), reps), race)
            k = torch.full((rows,), 50, dtype=torch.long)
            p = torch.full((rows,), 0.9, dtype=torch.float32)
            report("torch-topk-topp", rows, median_us(lambda: torch_topk_topp(tx, 1.0, k, p), reps), filt or race)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
