"""The Python examples: the two scripts run in a subprocess from a temporary directory, and the
vLLM plugin's ``register()`` against a stand-in of vLLM's ``TopKTopPSampler`` (vLLM itself is
not installed here)."""

import importlib
import os
import subprocess
import sys
import tomllib
import types

import numpy as np
import pytest

from conftest import BINDINGS, LIBRARY, REPO

EXAMPLES = os.path.join(REPO, "examples")
PLUGIN = os.path.join(EXAMPLES, "vllm_plugin")


def run_example(name, tmp_path):
    env = dict(os.environ, PYTHONPATH=BINDINGS, TOKENRACE_LIBRARY=LIBRARY)
    done = subprocess.run([sys.executable, os.path.join(EXAMPLES, "python", name)], cwd=tmp_path, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_numpy_example(tmp_path):
    out = run_example("numpy_draw.py", tmp_path)
    for check in ("greedy rows are the argmax", "seeded row 2 is the same alone as in the batch",
                  "filtered tokens are among each row's top 50", "sampled logprobs match float64 log_softmax"):
        assert f"{check}: True" in out, out
    assert "False" not in out


def test_torch_example(tmp_path):
    out = run_example("torch_sample.py", tmp_path)
    try:
        import torch  # noqa: F401
    except ImportError:
        assert out.strip() == "skipped: torch is not installed"
        return
    assert "row 2 (k = 1) drew a maximum: True" in out and "greedy row 0 is the argmax: True" in out, out
    assert "processed logits: None" in out and "False" not in out


def test_the_plugin_declares_its_entry_point():
    with open(os.path.join(PLUGIN, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    assert project["entry-points"]["vllm.general_plugins"] == {"tokenrace": "tokenrace_vllm:register"}


# -- register() against a stand-in vLLM ---------------------------------------------------------


@pytest.fixture
def torch_module(monkeypatch):
    """Real torch where installed, else the stand-in of test_torch_fake.py."""
    try:
        import torch
    except ImportError:
        from test_torch_fake import make_fake_torch

        torch = make_fake_torch()
        monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.delitem(sys.modules, "tokenrace.torch", raising=False)
    yield torch
    sys.modules.pop("tokenrace.torch", None)


def make_fake_vllm(monkeypatch, is_cpu=True):
    """The modules register() imports, with vLLM's TopKTopPSampler reduced to what matters: its
    __init__ binds ``self.forward`` to a method of the class (as vLLM's does), and its own
    methods answer "vllm" so a test sees which implementation ran."""

    class TopKTopPSampler:
        def __init__(self, logprobs_mode="raw_logprobs", use_fp64_gumbel=False):
            self.logprobs_mode, self.use_fp64_gumbel = logprobs_mode, use_fp64_gumbel
            self.forward = self.forward_cpu

        def forward_native(self, logits, generators, k, p):
            return "vllm", None

        def forward_cpu(self, logits, generators, k, p):
            return "vllm", None

    ops = types.ModuleType("vllm.v1.sample.ops.topk_topp_sampler")
    ops.TopKTopPSampler = TopKTopPSampler
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = types.SimpleNamespace(is_cpu=lambda: is_cpu)
    for name in ("vllm", "vllm.v1", "vllm.v1.sample", "vllm.v1.sample.ops"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "vllm.v1.sample.ops.topk_topp_sampler", ops)
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
    return TopKTopPSampler


@pytest.fixture
def plugin(monkeypatch):
    monkeypatch.syspath_prepend(PLUGIN)
    monkeypatch.delitem(sys.modules, "tokenrace_vllm", raising=False)
    module = importlib.import_module("tokenrace_vllm")
    yield module
    sys.modules.pop("tokenrace_vllm", None)


def test_register_routes_vllms_cpu_sampler_through_tokenrace(plugin, torch_module, monkeypatch, rng):
    cls = make_fake_vllm(monkeypatch)
    plugin.register()
    plugin.register()  # idempotent: one layer of patching
    assert cls.forward_cpu.tokenrace_original.__name__ == "forward_cpu"
    assert not hasattr(cls.forward_cpu.tokenrace_original, "tokenrace_original")

    x = torch_module.from_numpy((rng.standard_normal((3, 50)) * 2).astype(np.float32))

    def gens():
        return {0: torch_module.Generator().manual_seed(5), 2: torch_module.Generator().manual_seed(6)}

    sampled, processed = cls().forward(x, gens(), None, None)
    assert processed is None and not isinstance(sampled, str)
    import tokenrace.torch

    want, _ = tokenrace.torch.TopKTopPSampler().forward_cpu(x, gens(), None, None)
    assert sampled[0].item() == want[0].item() and sampled[2].item() == want[2].item()
    assert not isinstance(cls().forward_native(x, {}, None, None)[0], str)


@pytest.mark.parametrize("kwargs", [{"use_fp64_gumbel": True}, {"logprobs_mode": "processed_logits"},
                                    {"logprobs_mode": "processed_logprobs"}])
def test_what_tokenrace_cannot_honour_stays_with_vllm(plugin, torch_module, monkeypatch, kwargs):
    cls = make_fake_vllm(monkeypatch)
    plugin.register()
    x = torch_module.from_numpy(np.zeros((2, 8), np.float32))
    assert cls(**kwargs).forward(x, {}, None, None) == ("vllm", None)


def test_tensors_off_the_cpu_stay_with_vllm(plugin, torch_module, monkeypatch):
    cls = make_fake_vllm(monkeypatch)
    plugin.register()
    off_cpu = types.SimpleNamespace(device=types.SimpleNamespace(type="cuda"))
    assert cls().forward(off_cpu, {}, None, None) == ("vllm", None)


def test_register_leaves_gpu_platforms_alone(plugin, monkeypatch):
    cls = make_fake_vllm(monkeypatch, is_cpu=False)
    original = cls.forward_cpu
    plugin.register()
    assert cls.forward_cpu is original
