"""Test setup: a hermetic environment, the native library built once, the package importable.

* Every ``TOKENRACE_*`` setting of the developer's shell is removed before the library reads the
  environment (it does so once per process), so that the tests see the documented defaults.
  Tests of the environment run subprocesses (see ``run_python``).
* Unless ``TOKENRACE_LIBRARY`` is set, the library is built with ``cargo build --release``
  (honouring ``CARGO_TARGET_DIR``) when it is missing or older than the crate's sources, and
  ``TOKENRACE_LIBRARY`` is pointed at it, for this process and its subprocesses.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BINDINGS = os.path.join(REPO, "bindings", "python")

for _name in list(os.environ):
    if _name.startswith("TOKENRACE_") and _name != "TOKENRACE_LIBRARY":
        del os.environ[_name]


def _library_name():
    if sys.platform == "darwin":
        return "libtokenrace.dylib"
    if sys.platform == "win32":
        return "tokenrace.dll"
    return "libtokenrace.so"


def _newest_source_mtime():
    newest = 0.0
    for top in ("src", "include"):
        for root, _dirs, files in os.walk(os.path.join(REPO, top)):
            for f in files:
                newest = max(newest, os.path.getmtime(os.path.join(root, f)))
    for f in ("Cargo.toml", "Cargo.lock", "build.rs"):
        p = os.path.join(REPO, f)
        if os.path.exists(p):
            newest = max(newest, os.path.getmtime(p))
    return newest


def _ensure_library():
    if os.environ.get("TOKENRACE_LIBRARY"):
        return os.environ["TOKENRACE_LIBRARY"]
    target = os.path.abspath(os.environ.get("CARGO_TARGET_DIR") or os.path.join(REPO, "target"))
    lib = os.path.join(target, "release", _library_name())
    stale = not os.path.exists(lib) or os.path.getmtime(lib) < _newest_source_mtime()
    if stale:
        cargo = shutil.which("cargo")
        if cargo is None:
            if not os.path.exists(lib):
                pytest.exit(f"{lib} is missing and cargo is not on PATH to build it", returncode=2)
        else:
            env = dict(os.environ, CARGO_TARGET_DIR=target)
            done = subprocess.run([cargo, "build", "--release"], cwd=REPO, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if done.returncode != 0:
                pytest.exit(f"cargo build --release failed:\n{done.stdout[-4000:]}", returncode=2)
    os.environ["TOKENRACE_LIBRARY"] = lib
    return lib


LIBRARY = _ensure_library()
if BINDINGS not in sys.path:
    sys.path.insert(0, BINDINGS)
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (BINDINGS, os.environ.get("PYTHONPATH")) if p)


def run_python(code, env=None, timeout=60):
    """Runs ``code`` in a fresh interpreter with extra environment ``env``; returns the JSON
    object it prints on its last line of stdout. The library reads the environment once per
    process, so environment tests must use this."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full_env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
    assert done.returncode == 0, f"subprocess failed ({done.returncode}):\n{done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def tokenrace():
    import tokenrace as module

    return module


@pytest.fixture
def rng():
    import numpy as np

    return np.random.default_rng(12345)


def supported_simd_levels():
    """The SIMD levels this machine runs (a sampler for each can be made)."""
    import tokenrace

    levels = []
    for level in ("scalar", "portable", "avx2", "avx512"):
        try:
            tokenrace.Sampler(0, simd=level).close()
        except tokenrace.UnsupportedError:
            continue
        levels.append(level)
    return levels
