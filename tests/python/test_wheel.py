"""The wheel that scripts/make-wheel.py assembles (scripts/build-wheels.sh builds the library with
zig for each architecture and installs and draws with each wheel; scripts/test-install.sh does that
for x86-64 with the release library, `--from-build`): its layout, tag, metadata and RECORD, and the
checks it makes on the library before tagging it. Nothing here builds or installs."""

import base64
import hashlib
import importlib.util
import os
import subprocess
import sys
import tomllib
import zipfile

import pytest

from conftest import REPO

SCRIPT = os.path.join(REPO, "scripts", "make-wheel.py")


def _make_wheel():
    spec = importlib.util.spec_from_file_location("make_wheel", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _arch():
    machine = os.uname().machine
    if machine not in ("x86_64", "aarch64", "s390x"):
        pytest.skip(f"make-wheel builds wheels for x86_64, aarch64 and s390x, not {machine}")
    return machine


def _version():
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]["version"]


def test_the_wheel_holds_the_binding_and_the_library_under_one_py3_none_tag(tokenrace, tmp_path):
    arch, lib = _arch(), tokenrace.library_path()
    run = subprocess.run([sys.executable, SCRIPT, "--lib", lib, "--arch", arch, "--glibc", "auto",
                          "--out", str(tmp_path)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    path = run.stdout.strip()
    floor = _make_wheel().check_library(lib, arch, "auto")
    tag = f"py3-none-manylinux_{floor[0]}_{floor[1]}_{arch}"
    assert os.path.basename(path) == f"tokenrace-{_version()}-{tag}.whl"
    dist_info = f"tokenrace-{_version()}.dist-info"
    with zipfile.ZipFile(path) as z:
        names = set(z.namelist())
        py_files = {f"tokenrace/{n}" for n in os.listdir(os.path.join(REPO, "bindings", "python", "tokenrace"))
                    if n.endswith(".py")}
        assert py_files <= names and "tokenrace/__init__.py" in names
        # The plain name, which the binding looks for first beside itself.
        assert "tokenrace/libtokenrace.so" in names
        assert z.read("tokenrace/libtokenrace.so") == open(lib, "rb").read()
        assert z.getinfo("tokenrace/libtokenrace.so").external_attr >> 16 == 0o100755
        wheel = z.read(f"{dist_info}/WHEEL").decode()
        assert "Root-Is-Purelib: false" in wheel and f"Tag: {tag}\n" in wheel
        meta = z.read(f"{dist_info}/METADATA").decode()
        assert f"Version: {_version()}\n" in meta and "Requires-Python: >=3.9\n" in meta
        assert "Requires-Dist: numpy>=1.22\n" in meta and 'Requires-Dist: torch>=2.1; extra == "torch"' in meta
        # RECORD: every other file with its sha256 and size, as pip checks on install.
        record = z.read(f"{dist_info}/RECORD").decode().splitlines()
        assert f"{dist_info}/RECORD,," in record
        listed = {}
        for line in record:
            name, digest, size = line.rsplit(",", 2)
            listed[name] = (digest, size)
        assert set(listed) == names
        for name in names - {f"{dist_info}/RECORD"}:
            data = z.read(name)
            expected = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert listed[name] == (expected, str(len(data))), name


def test_a_library_needing_a_newer_glibc_than_the_tag_is_refused(tokenrace, tmp_path):
    arch, lib = _arch(), tokenrace.library_path()
    newest = _make_wheel().read_elf(lib).glibc_versions[-1][:2]
    floor = "2.17" if newest > (2, 17) else None
    if floor is None:
        pytest.skip("this library needs no glibc newer than 2.17")
    run = subprocess.run([sys.executable, SCRIPT, "--lib", lib, "--arch", arch, "--glibc", floor,
                          "--out", str(tmp_path)], capture_output=True, text=True)
    assert run.returncode != 0 and f"needs GLIBC_{newest[0]}.{newest[1]}, newer than the tag's 2.17" in run.stderr
    assert not os.listdir(tmp_path)


def test_a_library_of_another_architecture_is_refused(tokenrace, tmp_path):
    arch = _arch()
    other = "s390x" if arch != "s390x" else "x86_64"
    run = subprocess.run([sys.executable, SCRIPT, "--lib", tokenrace.library_path(), "--arch", other,
                          "--glibc", "auto", "--out", str(tmp_path)], capture_output=True, text=True)
    assert run.returncode != 0 and f"not {other}" in run.stderr


def test_the_elf_reader_sees_only_glibc_and_the_loader_in_the_library(tokenrace):
    info = _make_wheel().read_elf(tokenrace.library_path())
    assert "libc.so.6" in info.needed and info.glibc_versions


def test_the_readmes_name_the_wheel_of_this_version():
    """The install line a user copies names the wheel build-wheels.sh makes for this version."""
    line = f"pip install tokenrace-{_version()}-py3-none-manylinux_2_28_x86_64.whl"
    for readme in ("README.md", os.path.join("bindings", "python", "README.md")):
        with open(os.path.join(REPO, readme), encoding="utf-8") as f:
            assert line in f.read(), f"{readme} lacks `{line}`"
