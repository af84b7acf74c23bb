"""Two adjustments to setuptools-rust for `pip install .` and the sdist (everything else is in
pyproject.toml). The library is a plain C shared object that the package loads with ctypes, not a
Python extension module, so:

- it is bundled under its plain name, tokenrace/libtokenrace.so, rather than the extension-module
  name setuptools gives it (libtokenrace.cpython-311-x86_64-linux-gnu.so), which would claim a
  CPython ABI the file does not have;
- the wheel is tagged py3-none-<platform>: one wheel serves every CPython that requires-python
  allows, like the manylinux wheels of scripts/build-wheels.sh (the platform stays
  linux_<arch>: a local build links the host's glibc, so it makes no manylinux promise).
"""

import os
import sys

from setuptools import setup
from setuptools_rust import build_rust

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel


class build_rust_plain_name(build_rust):
    def get_dylib_ext_path(self, ext, target_fname):
        path = super().get_dylib_ext_path(ext, target_fname)
        name = "libtokenrace.dylib" if sys.platform == "darwin" else "libtokenrace.so"
        return os.path.join(os.path.dirname(path), name)


class bdist_wheel_any_python(bdist_wheel):
    def get_tag(self):
        _python, _abi, plat = super().get_tag()
        return "py3", "none", plat


setup(cmdclass={"build_rust": build_rust_plain_name, "bdist_wheel": bdist_wheel_any_python})
