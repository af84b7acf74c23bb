"""tokenrace: exact next-token sampling on the CPU, through ctypes.

    >>> import numpy as np, tokenrace
    >>> s = tokenrace.Sampler(vocab_size=8)
    >>> s.draw(np.zeros((2, 8), np.float32), temperature=0.0)
    array([0, 0], dtype=int32)

The native library is found through ``TOKENRACE_LIBRARY``, then beside this package, then in
the crate's ``target/{release,debug}`` (``CARGO_TARGET_DIR`` first, if set).
"""

from . import _ffi
from . import _shard as shard
from ._errors import (
    ClosedError,
    InternalError,
    InvalidArgumentError,
    InvalidConfigError,
    OutOfMemoryError,
    TokenraceError,
    TokenraceTimeoutError,
    UnsupportedError,
)
from ._ffi import ABI_VERSION, FLAG_EMPTY, FLAG_FORCED_BANNED, FLAG_GREEDY, FLAG_HAS_NAN, FLAG_HAS_POSINF, library_path
from ._pool import NoiseLease, NoisePool
from ._requests import Requests
from ._sampler import DrawResult, Sampler

# The two fixed filter orders as stage lists (``Sampler.draw(order=...)``), and llama.cpp's
# default chain.
TEMPERATURE_FIRST = ("temperature", "top_n_sigma", "min_p", "top_k", "typical", "top_p", "xtc")
FILTERS_FIRST = ("top_n_sigma", "min_p", "top_k", "typical", "top_p", "xtc", "temperature")
LLAMA_CPP_ORDER = ("top_k", "typical", "top_p", "min_p", "xtc", "temperature")
from ._verify import VerifyResult
from ._watermark import Detection, detect_watermark, watermark_accept, watermark_seeds, watermark_verify_seeds

__all__ = [
    "ABI_VERSION", "FILTERS_FIRST", "LLAMA_CPP_ORDER", "TEMPERATURE_FIRST", "FLAG_EMPTY", "FLAG_FORCED_BANNED", "FLAG_GREEDY", "FLAG_HAS_NAN", "FLAG_HAS_POSINF",
    "ClosedError", "DrawResult", "InternalError", "InvalidArgumentError", "InvalidConfigError",
    "NoiseLease", "NoisePool", "OutOfMemoryError", "Requests", "Sampler", "TokenraceError", "TokenraceTimeoutError", "UnsupportedError",
    "VerifyResult",
    "Detection", "detect_watermark", "watermark_seeds", "watermark_verify_seeds", "watermark_accept",
    "shard",
    "abi_version", "library_path", "simd_level", "version",
]


def version() -> str:
    """The native library's version, e.g. "0.2.0"."""
    return _ffi.lib().tokenrace_version().decode()


def abi_version() -> int:
    """The ABI version of the loaded library (this binding checks it equals ``ABI_VERSION``)."""
    return int(_ffi.lib().tokenrace_abi_version())


def simd_level() -> str:
    """The SIMD level a sampler made from the environment would use ("avx512", "avx2", "neon",
    "vxe2", "portable" or "scalar")."""
    return _ffi.lib().tokenrace_simd_level().decode()
