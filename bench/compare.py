#!/usr/bin/env python3
"""tokenrace against the samplers a user would otherwise write, in one process, on the same inputs.

Peers (each only where its package is installed):
  numpy-vllm       softmax(x/T) / Exp(1) noise drawn per call, argmax   (vLLM's random_sample in NumPy)
  numpy-ready      argmax(x/T - log_noise) with the noise already drawn (the Spyre ring buffer's form)
  torch-random     vLLM's random_sample on CPU: softmax, q.exponential_(), probs.div_(q).argmax
  torch-topk-topp  vLLM's sort-based apply_top_k_top_p (k=50, p=0.9), then random_sample
tokenrace paths: greedy, race (inline noise), race-ready (the same ready log-noise as numpy-ready),
top-k50-top-p0.9.

  python3 bench/compare.py --threads 1 --rows 1,8,32 --vocab 163840 [--json out.json]

Every number is the median of per-call wall time over --reps calls after one warm-up; the
ratio column is the peer's time over tokenrace's on the same path kind, in the same run.

The whole sampling step (issue 9), with --pipeline (instead of the table above):

  python3 bench/compare.py --pipeline --threads 16 [--rows 32 --vocab 151936] [--pipeline-json out.json]

32 rows x vocab 151936, each with 4096 prompt and 1024 output tokens, repetition 1.1, frequency
0.2, presence 0.1, 16 biased ids and a grammar bitmask allowing 10% of the vocabulary, T = 1:
  tokenrace-fused         one draw with every input (CSR int32 histories and bias, the bitmask
                          read in place)
  tokenrace-fused-padded  the same with the histories as vLLM holds them (2-D int64 padded with
                          vocab) and the bias as one dict per row: the binding's conversions
  tokenrace-plain         the plain race on the same logits (no step arguments)
  torch-vllm-step         vLLM V1's CPU path for the same step, written from vllm/v1/sample/:
                          the bitmask unpacked to a dense bool mask and masked_fill -inf,
                          logit_bias through advanced-index add, apply_penalties (scatter_add
                          bin counts and masks of the padded histories, the repetition scaling,
                          the two subtractions), the temperature division, then random_sample
                          (softmax, q.exponential_(), probs.div_(q).argmax), in place on the
                          logits as vLLM does (restored, untimed, before each call)
Each is timed --reps times (wall clock, after a warm-up): median, p10 and p90, and the ratios
fused/plain (the issue's bound: 1.3) and torch/fused (the issue's bound: at least 50). torch is
optional: without it the torch row is skipped, with the reason printed and in the JSON.
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


# -- the whole sampling step (--pipeline) ---------------------------------------------------------


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


def pipeline_inputs(rows, vocab, prompt_len, output_len, biased, allowed_fraction, rng):
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


def pipeline_main(a):
    rows = 32 if a.rows is None else int(a.rows.split(",")[0])
    vocab = 151936 if a.vocab is None else a.vocab
    prompt_len, output_len, biased, allowed_fraction = 4096, 1024, 16, 0.10
    r, f, p, t = 1.1, 0.2, 0.1, 1.0
    rng = np.random.default_rng(0)
    x = peaked_logits(rows, vocab, rng)
    prompt, output, bias_ids, bias_values, bitmask, allowed = pipeline_inputs(
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
    setting = (f"{rows} rows x vocab {vocab}, {prompt_len} prompt + {output_len} output tokens per row, "
               f"r={r} f={f} p={p}, {biased} biased ids, bitmask allowing {allowed_fraction:.0%}, T={t}")
    print(f"tokenrace {tokenrace.version()} ({sampler.simd_level}), numpy {np.__version__}, "
          f"torch {torch.__version__ if torch else 'absent'}, threads {a.threads}, {os.cpu_count()} cpus")
    print(setting)
    print(f"{'path':<24}{'median us':>12}{'p10 us':>12}{'p90 us':>12}")
    records = {}

    def report(path, times, note=None):
        rec = dict(path=path, rows=rows, vocab=vocab, threads=a.threads, reps=int(times.size),
                   us_per_call_median=float(np.median(times)), us_per_call_p10=float(np.percentile(times, 10)),
                   us_per_call_p90=float(np.percentile(times, 90)))
        if note:
            rec["note"] = note
        records[path] = rec
        print(f"{path:<24}{rec['us_per_call_median']:>12.1f}{rec['us_per_call_p10']:>12.1f}{rec['us_per_call_p90']:>12.1f}")

    # Interleaved in rounds so that a load on the machine weighs on both alike.
    fused, padded, plain = [], [], []
    rounds = 5
    per = max(1, a.reps // rounds)
    for _ in range(rounds):
        fused.append(timings_us(lambda: sampler.draw(x, **fused_args), per))
        plain.append(timings_us(lambda: sampler.draw(x, temperature=t), per))
        padded.append(timings_us(lambda: sampler.draw(x, **padded_args), max(1, per // 2)))
    report("tokenrace-fused", np.concatenate(fused))
    report("tokenrace-fused-padded", np.concatenate(padded))
    report("tokenrace-plain", np.concatenate(plain))
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
              "padded_over_fused": records["tokenrace-fused-padded"]["us_per_call_median"] / fused_us}
    if "torch-vllm-step" in records:
        ratios["torch_over_fused"] = records["torch-vllm-step"]["us_per_call_median"] / fused_us
    print("ratios: " + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items())
          + " (issue 9: fused/plain <= 1.3, torch/fused >= 50)")
    if a.pipeline_json:
        doc = dict(command=" ".join([os.path.basename(sys.executable)] + sys.argv), commit=_commit(), cpu=_cpu(),
                   cpus=os.cpu_count(), isa=sampler.simd_level, tokenrace=tokenrace.version(),
                   numpy=np.__version__, torch=torch.__version__ if torch else None, threads=a.threads,
                   setting=setting, records=list(records.values()), ratios=ratios, torch_skipped=skipped)
        with open(a.pipeline_json, "w") as fh:
            json.dump(doc, fh, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rows", default="1,8,32,128,256")
    ap.add_argument("--vocab", type=int, default=163840)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json")
    ap.add_argument("--pipeline", action="store_true",
                    help="measure the whole sampling step instead (see the module doc; --rows and --vocab "
                         "default to 32 and 151936 there)")
    ap.add_argument("--pipeline-json", help="with --pipeline: write the results here")
    a = ap.parse_args()
    if a.pipeline:
        for name in ("rows", "vocab"):
            if getattr(a, name) == ap.get_default(name):
                setattr(a, name, None)
        a.reps = a.reps if a.reps != ap.get_default("reps") else 50
        return pipeline_main(a)
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

    def report(path, rows, us, ours):
        ratio = us / ours if ours else float("nan")
        print(f"{path:<22}{rows:>6}{us:>12.1f}{us / rows:>10.2f}{ours:>19.1f}{ratio:>16.1f}")
        records.append(dict(path=path, rows=rows, vocab=a.vocab, threads=a.threads, us_per_call=us,
                            us_per_row=us / rows, tokenrace_us_per_call=ours, ratio=ratio))

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
