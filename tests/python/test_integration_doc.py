"""The aiter-style ctypes wrapper printed in docs/integration.md, run as written: it must draw
what the rules of docs/semantics.md say (greedy rows: the argmax; sampled rows with external
Exp(1) noise: argmax(x / T - ln E)) and report bad arguments by name."""

import os
import re

import numpy as np
import pytest

from conftest import REPO
from test_torch_fake import make_fake_torch


def aiter_style_wrapper():
    with open(os.path.join(REPO, "docs", "integration.md")) as f:
        text = f.read()
    start = text.index("## An aiter-style Python wrapper over the C header")
    block = re.compile(r"```python\n(.*?)```", flags=re.S).search(text, start)
    # Padded with the lines before it, so that a traceback points at the line of the doc.
    code = "\n" * text.count("\n", 0, block.start(1)) + block.group(1)
    namespace = {}
    exec(compile(code, "docs/integration.md", "exec"), namespace)
    return namespace["mixed_sample_outer_exponential"]


def test_the_documented_wrapper_draws_by_the_rules(rng):
    torch = make_fake_torch()  # the wrapper needs only data_ptr, stride, shape and dtype
    sample = aiter_style_wrapper()
    x = (rng.standard_normal((5, 300)) * 2).astype(np.float32)
    temps = np.array([0.0, 0.5, 1.0, 0.0, 2.0], np.float32)
    out = np.full(5, -1, np.int32)
    for noise in (rng.exponential(size=(5, 300)).astype(np.float32),
                  np.broadcast_to(rng.exponential(size=300).astype(np.float32), (5, 300))):  # ATOM's .expand
        result = sample(torch.from_numpy(out), torch.from_numpy(x), torch.from_numpy(noise), torch.from_numpy(temps))
        assert result.numpy() is out
        with np.errstate(divide="ignore"):
            keys = x / np.where(temps == 0, 1, temps)[:, None] - np.log(noise)
        want = np.where(temps == 0, np.argmax(x, axis=1), np.argmax(keys, axis=1))
        np.testing.assert_array_equal(out, want)


def test_the_documented_wrapper_names_a_bad_argument(rng):
    torch = make_fake_torch()
    sample = aiter_style_wrapper()
    x = np.zeros((2, 10), np.float32)
    with pytest.raises(ValueError, match=r"temperature\[1\]"):
        sample(torch.from_numpy(np.zeros(2, np.int32)), torch.from_numpy(x),
               torch.from_numpy(np.ones((2, 10), np.float32)), torch.from_numpy(np.array([1, -1], np.float32)))
