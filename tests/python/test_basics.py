"""Module functions, Sampler settings and lifetime."""

import re

import numpy as np
import pytest


def test_version_abi_and_simd_level(tokenrace):
    assert re.fullmatch(r"\d+\.\d+\.\d+([-+].*)?", tokenrace.version())
    assert tokenrace.abi_version() == tokenrace.ABI_VERSION == 1
    assert tokenrace.simd_level() in ("scalar", "portable", "avx2", "avx512")
    assert tokenrace.library_path().endswith(tokenrace._ffi.library_filename())


def test_sampler_defaults(tokenrace):
    s = tokenrace.Sampler(100)
    assert s.vocab_size == 100 and s.max_rows == 256 and s.threads == 1 and s.seed is None
    assert s.greedy_below == pytest.approx(1e-5)
    assert s.simd_level == tokenrace.simd_level()
    cfg = s.config
    assert cfg["simd"] == "auto" and cfg["noise"] == "auto" and cfg["max_rows"] == 256
    assert "Sampler" in repr(s)


def test_sampler_explicit_settings(tokenrace):
    s = tokenrace.Sampler(0, 7, seed=2**64 - 1, threads=2, simd="scalar", greedy_below=0.5,
                          noise="inline")
    assert (s.vocab_size, s.max_rows, s.threads, s.seed) == (0, 7, 2, 2**64 - 1)
    assert s.simd_level == "scalar"
    assert s.config["noise"] == "inline" and s.greedy_below == 0.5


def test_signature_shows_the_effective_defaults(tokenrace):
    import inspect

    sig = str(inspect.signature(tokenrace.Sampler))
    assert "max_rows=256" in sig and "simd='auto'" in sig and "seed=None" in sig


def test_close_and_context_manager(tokenrace):
    x = np.zeros((1, 4), np.float32)
    with tokenrace.Sampler(4) as s:
        assert s.draw(x).shape == (1,)
    assert s.closed
    s.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        s.draw(x)
    assert "closed" in repr(s)


def test_stats_count_rows(tokenrace):
    s = tokenrace.Sampler(8)
    x = np.zeros((4, 8), np.float32)
    s.draw(x, temperature=[0, 0, 1, 1], seeds=[1, 2, 3, 4], seeded=[False, False, True, False])
    with pytest.raises(ValueError):
        s.draw(x, temperature=-1.0)
    st = s.stats()
    assert st["calls"] == 1 and st["rejected_calls"] == 1
    assert st["greedy_rows"] == 2 and st["seeded_rows"] == 1 and st["inline_rows"] == 1


def test_empty_batch(tokenrace):
    s = tokenrace.Sampler(8)
    tokens, flags = s.draw(np.zeros((0, 8), np.float32), return_flags=True)
    assert tokens.shape == (0,) and tokens.dtype == np.int32 and flags.dtype == np.uint32


def test_one_dimensional_logits_are_one_row(tokenrace):
    s = tokenrace.Sampler(5)
    out = s.draw(np.array([0, 3, 1, 9, 2], np.float32), temperature=0)
    assert out.tolist() == [3]


def test_lists_are_accepted(tokenrace):
    s = tokenrace.Sampler(3)
    assert s.draw([[0.0, 5.0, 1.0], [7.0, 0.0, 1.0]], temperature=0).tolist() == [1, 0]


def test_library_not_found_lists_the_places_tried(tmp_path):
    from conftest import run_python

    res = run_python(
        """
        import json, tokenrace, tokenrace._ffi as f
        f.candidate_paths = lambda: ["/nonexistent/a/libtokenrace.so", "/nonexistent/b/libtokenrace.so"]
        try:
            tokenrace.version()
        except OSError as e:
            print(json.dumps({"msg": str(e)}))
        """,
        env={"TOKENRACE_LIBRARY": ""},
    )
    assert "/nonexistent/a/libtokenrace.so" in res["msg"] and "/nonexistent/b" in res["msg"]
    res = run_python(
        """
        import json, tokenrace
        try:
            tokenrace.version()
        except OSError as e:
            print(json.dumps({"msg": str(e)}))
        """,
        env={"TOKENRACE_LIBRARY": str(tmp_path / "missing.so")},
    )
    assert "TOKENRACE_LIBRARY" in res["msg"] and "missing.so" in res["msg"]


def test_candidate_paths_order(tokenrace, monkeypatch, tmp_path):
    import os

    monkeypatch.setenv("CARGO_TARGET_DIR", str(tmp_path))
    paths = tokenrace._ffi.candidate_paths()
    pkg = os.path.dirname(tokenrace.__file__)
    name = tokenrace._ffi.library_filename()
    assert paths[0] == os.path.join(pkg, name)
    assert paths[1] == os.path.join(str(tmp_path), "release", name)
    repo = os.path.normpath(os.path.join(pkg, "..", "..", ".."))
    assert paths[2] == os.path.join(repo, "target", "release", name)
    assert paths[-1] == os.path.join(repo, "target", "debug", name)
