"""TOKENRACE_* variables fill in what the caller did not pass. The library reads the
environment once per process, so each case runs in a fresh interpreter."""

import json

from conftest import run_python

PROLOGUE = """
import json, numpy as np, tokenrace
def rows_ok(s, n):
    try:
        s.draw(np.zeros((n, 100), np.float32))
        return True
    except ValueError as e:
        assert "max_rows" in str(e), e
        return False
"""


def test_max_rows_from_env_unless_passed():
    res = run_python(PROLOGUE + """
a, b, c = tokenrace.Sampler(100), tokenrace.Sampler(100, max_rows=5), tokenrace.Sampler(100, max_rows=256)
print(json.dumps({
    "a": [a.max_rows, rows_ok(a, 3), rows_ok(a, 4)],
    "b": [b.max_rows, rows_ok(b, 5), rows_ok(b, 6)],
    "c": [c.max_rows, rows_ok(c, 256)],
}))
""", env={"TOKENRACE_MAX_ROWS": "3"})
    assert res["a"] == [3, True, False]
    assert res["b"] == [5, True, False]
    assert res["c"] == [256, True], "passing the default value explicitly must win over the env"


def test_bad_variable_names_it():
    res = run_python("""
import json, tokenrace
out = {"level": tokenrace.simd_level()}
try:
    tokenrace.Sampler(100)
except ValueError as e:
    out["error"] = str(e)
    out["type"] = type(e).__name__
print(json.dumps(out))
""", env={"TOKENRACE_SIMD": "foo"})
    assert "TOKENRACE_SIMD" in res["error"] and "foo" in res["error"]
    assert res["type"] == "InvalidConfigError"
    assert res["level"] in ("scalar", "portable", "avx2", "avx512")


def test_simd_seed_threads_greedy_and_noise_from_env():
    code = PROLOGUE + """
x = np.random.default_rng(0).standard_normal((50, 100)).astype(np.float32)
a = tokenrace.Sampler(100)
b = tokenrace.Sampler(100, simd="scalar", seed=5, threads=1, greedy_below=0.0, noise="auto")
_, fa = a.draw(x, temperature=0.3, return_flags=True)
_, fb = b.draw(x, temperature=0.3, return_flags=True)
print(json.dumps({
    "a": [a.config["simd"], a.seed, a.threads, a.config["noise"], int(fa[0])],
    "b": [b.config["simd"], b.seed, b.threads, b.config["noise"], int(fb[0])],
    "tokens": tokenrace.Sampler(100).draw(x).tolist(),
    "level": tokenrace.simd_level(),
}))
"""
    env = {"TOKENRACE_SIMD": "portable", "TOKENRACE_SEED": "1234", "TOKENRACE_THREADS": "2",
           "TOKENRACE_GREEDY_BELOW": "0.5", "TOKENRACE_NOISE": "inline"}
    r1 = run_python(code, env=env)
    r2 = run_python(code, env=env)
    assert r1["a"] == ["portable", 1234, 2, "inline", 8]
    assert r1["b"] == ["scalar", 5, 1, "auto", 0]
    assert r1["level"] == "portable"
    assert r1["tokens"] == r2["tokens"], "TOKENRACE_SEED must make unseeded rows reproducible"
    r3 = run_python(code, env=dict(env, TOKENRACE_SEED="1235"))
    assert r3["tokens"] != r1["tokens"]


def test_no_seed_means_os_entropy():
    code = PROLOGUE + """
x = np.zeros((64, 100), np.float32)
print(json.dumps({"seed": tokenrace.Sampler(100).seed, "tokens": tokenrace.Sampler(100).draw(x).tolist()}))
"""
    r1, r2 = run_python(code), run_python(code)
    assert r1["seed"] is None
    assert r1["tokens"] != r2["tokens"]


def _run_raw(code, env):
    """Runs ``code`` in a fresh interpreter with ``env`` (bytes values allowed) added."""
    import os
    import subprocess
    import sys
    import textwrap
    full = dict(os.environb)
    full.update({k.encode(): v if isinstance(v, bytes) else v.encode() for k, v in env.items()})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)


def test_a_value_that_is_not_utf8_is_an_error_naming_it():
    done = _run_raw("""
import json, tokenrace
try:
    tokenrace.Sampler(100)
    print(json.dumps({"error": None}))
except ValueError as e:
    print(json.dumps({"error": str(e), "type": type(e).__name__}))
""", {"TOKENRACE_MAX_ROWS": b"\xff3"})
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    res = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert res["error"] is not None, "a non-UTF-8 value must not be ignored"
    assert "TOKENRACE_MAX_ROWS" in res["error"] and "UTF-8" in res["error"], res
    assert res["type"] == "InvalidConfigError"


def test_an_unknown_variable_is_warned_about():
    done = _run_raw("""
import tokenrace
tokenrace.Sampler(100)
print("{}")
""", {"TOKENRACE_MAX_ROW": "3"})
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    err = done.stderr.decode(errors="replace")
    assert "TOKENRACE_MAX_ROW is not a tokenrace setting" in err, err


def test_vocab_size_from_env_unless_passed():
    res = run_python("""
        import json, tokenrace
        print(json.dumps({"env": tokenrace.Sampler().vocab_size,
                          "passed": tokenrace.Sampler(vocab_size=50).vocab_size,
                          "positional": tokenrace.Sampler(60).vocab_size}))
    """, env={"TOKENRACE_VOCAB_SIZE": "4096"})
    assert res == {"env": 4096, "passed": 50, "positional": 60}


def test_info_logging_names_the_simd_level_once_and_each_pool():
    # The messages go to Python's logging (logger "tokenrace"): shown on stderr at info.
    done = _run_raw("""
import logging
logging.basicConfig(level=logging.INFO)
import tokenrace
a = tokenrace.Sampler(100)
b = tokenrace.Sampler(100, simd="scalar")
p = tokenrace.NoisePool(64, 8, seed=1)
p.close()
print("{}")
""", {"TOKENRACE_LOG_LEVEL": "info", "TOKENRACE_SIMD_LEVLE": "avx2"})
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    err = done.stderr.decode(errors="replace")
    simd_lines = [line for line in err.splitlines() if "SIMD level" in line]
    assert len(simd_lines) == 1 and "requested auto" in simd_lines[0], err
    assert sum("pool: 8 rows x 64 values" in line for line in err.splitlines()) == 1, err
    assert "TOKENRACE_SIMD_LEVLE is not a tokenrace setting" in err, err


def test_the_default_level_logs_no_info():
    done = _run_raw("""
import tokenrace
tokenrace.Sampler(100)
print("{}")
""", {})
    assert done.returncode == 0
    assert "SIMD level" not in done.stderr.decode(errors="replace")


def test_filter_order_from_env_unless_passed():
    """TOKENRACE_FILTER_ORDER picks the order of a sampler made without filter_order=; the
    draws follow it (at T = 3 with top-p 0.5, filters first keeps fewer tokens)."""
    res = run_python(PROLOGUE + """
x = (np.random.default_rng(3).standard_normal((1, 100)) * 3).astype(np.float32)
def kept(s):
    r = s.draw_full(x, temperature=3.0, top_p=0.5, full_logprobs="processed")
    return int(np.isfinite(r.full_logprobs).sum())
env, passed = tokenrace.Sampler(100), tokenrace.Sampler(100, filter_order="temperature_first")
print(json.dumps({"env": [env.filter_order, env.config["filter_order"], kept(env)],
                  "passed": [passed.filter_order, kept(passed)]}))
""", env={"TOKENRACE_FILTER_ORDER": "filters_first"})
    assert res["env"][:2] == ["filters_first", "filters_first"]
    assert res["passed"][0] == "temperature_first", "passing the default explicitly must win over the env"
    assert res["env"][2] < res["passed"][1]
    bad = run_python("""
import json, tokenrace
try:
    tokenrace.Sampler(100)
    print(json.dumps(None))
except ValueError as e:
    print(json.dumps([type(e).__name__, str(e)]))
""", env={"TOKENRACE_FILTER_ORDER": "vllm"})
    assert bad[0] == "InvalidConfigError" and "TOKENRACE_FILTER_ORDER" in bad[1] and "vllm" in bad[1], bad
    assert run_python("import json, tokenrace; print(json.dumps(tokenrace.Sampler(10).filter_order))") == \
        "temperature_first"
