"""Packaging facts that need no install (scripts/test-install.sh does the real installs: the C
library under a prefix, pkg-config, CMake, and `pip install .` in a fresh virtualenv)."""

import os
import re
import tomllib

from conftest import REPO


def _toml(name):
    with open(os.path.join(REPO, name), "rb") as f:
        return tomllib.load(f)


def test_the_python_package_and_the_crate_have_one_version(tokenrace):
    assert _toml("pyproject.toml")["project"]["version"] == _toml("Cargo.toml")["package"]["version"]
    assert tokenrace.version() == _toml("Cargo.toml")["package"]["version"]


def test_the_package_declares_numpy_and_bundles_the_library():
    project = _toml("pyproject.toml")
    assert any(re.match(r"numpy\b", d) for d in project["project"]["dependencies"])
    (ext,) = project["tool"]["setuptools-rust"]["ext-modules"]
    assert ext["binding"] == "NoBinding" and ext["target"] == "tokenrace.libtokenrace"


def test_the_bundled_library_is_found_first(tokenrace, tmp_path):
    """After TOKENRACE_LIBRARY, the file beside the package wins: the plain name, then the name
    an older `pip install .` gave it (setuptools-rust's extension-module name)."""
    wheel_name = "libtokenrace.cpython-311-x86_64-linux-gnu.so"
    for name in (wheel_name, "libtokenrace.so", "libtokenrace_other.txt"):
        (tmp_path / name).write_bytes(b"")
    paths = tokenrace._ffi.bundled_paths(str(tmp_path))
    assert paths == [str(tmp_path / "libtokenrace.so"), str(tmp_path / wheel_name)]


def test_an_installed_package_does_not_look_in_a_build_tree(tokenrace, tmp_path, monkeypatch):
    """Outside a source checkout (no Cargo.toml three levels up) only the bundled file counts."""
    pkg = tmp_path / "site-packages" / "tokenrace"
    pkg.mkdir(parents=True)
    monkeypatch.setattr(tokenrace._ffi, "__file__", str(pkg / "_ffi.py"))
    paths = tokenrace._ffi.candidate_paths()
    assert paths and all(os.path.dirname(p) == str(pkg) for p in paths)
