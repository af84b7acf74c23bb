"""The ctypes mirror in tokenrace/_ffi.py against include/tokenrace.h and the C compiler."""

import os
import re
import shutil
import subprocess

import pytest

from conftest import REPO

HEADER = os.path.join(REPO, "include", "tokenrace.h")


def _header():
    with open(HEADER) as f:
        return f.read()


def _strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def header_structs():
    """{struct name: [field names in order]} of every struct defined in the header."""
    text = _strip_comments(_header())
    structs = {}
    for name, body in re.findall(r"typedef struct (\w+) \{(.*?)\} \1;", text, flags=re.S):
        fields = []
        for decl in body.split(";"):
            decl = decl.strip()
            if decl:
                fields.append(re.search(r"(\w+)\s*(\[[^\]]*\])?$", decl).group(1))
        structs[name] = fields
    return structs


def test_every_header_struct_is_mirrored_field_by_field(tokenrace):
    ffi = tokenrace._ffi
    structs = header_structs()
    assert set(structs) == set(ffi.STRUCTS), "a struct of the header is missing in _ffi.STRUCTS"
    for name, fields in structs.items():
        assert [f for f, _ in ffi.STRUCTS[name]._fields_] == fields, name


def test_constants_match_the_header(tokenrace):
    ffi = tokenrace._ffi
    text = _strip_comments(_header())
    defines = dict(re.findall(r"#define TOKENRACE_(\w+) (\d+)", text))
    enums = dict(re.findall(r"TOKENRACE_(\w+) = (\d+)", text))
    assert defines and enums
    for name, value in list(defines.items()) + list(enums.items()):
        assert getattr(ffi, name) == int(value), name
    assert tokenrace.FLAG_HAS_NAN == 1 and tokenrace.FLAG_HAS_POSINF == 2
    assert tokenrace.FLAG_EMPTY == 4 and tokenrace.FLAG_GREEDY == 8
    assert tokenrace.ABI_VERSION == int(defines["ABI_VERSION"])


def test_every_declared_function_exists_in_the_header(tokenrace):
    text = _strip_comments(_header())
    declared = set(re.findall(r"\b(tokenrace_\w+)\(", text))
    assert set(tokenrace._ffi._SIGNATURES) == declared


needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc)")


def _compile(tmp_path, source, name):
    src = tmp_path / f"{name}.c"
    src.write_text(source)
    exe = tmp_path / name
    done = subprocess.run(["cc", "-std=c11", "-Wall", "-Werror", "-o", str(exe), str(src)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return exe, done


@needs_cc
def test_header_compiles_as_c(tmp_path):
    _, done = _compile(tmp_path, f'#include "{HEADER}"\nint main(void) {{ return 0; }}\n', "plain")
    assert done.returncode == 0, done.stdout


@needs_cc
def test_header_compiles_as_cpp(tmp_path):
    if shutil.which("c++") is None:
        pytest.skip("no C++ compiler (c++)")
    src = tmp_path / "plain.cpp"
    src.write_text(f'#include "{HEADER}"\nint main() {{ return 0; }}\n')
    done = subprocess.run(["c++", "-std=c++11", "-Wall", "-Werror", "-o", str(tmp_path / "plainpp"), str(src)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert done.returncode == 0, done.stdout


@needs_cc
def test_struct_layout_matches_the_c_compiler(tokenrace, tmp_path):
    import ctypes

    structs = tokenrace._ffi.STRUCTS
    lines = ["#include <stdio.h>", f'#include "{HEADER}"', "int main(void) {"]
    for name, cls in structs.items():
        lines.append(f'  printf("{name} %zu %zu\\n", sizeof(struct {name}), _Alignof(struct {name}));')
        for field, _ in cls._fields_:
            lines.append(f'  printf("{name}.{field} %zu %zu\\n", offsetof(struct {name}, {field}), '
                         f'sizeof(((struct {name} *)0)->{field}));')
    lines += ["  return 0;", "}"]
    exe, done = _compile(tmp_path, "\n".join(lines), "layout")
    assert done.returncode == 0, done.stdout
    out = subprocess.run([str(exe)], check=True, stdout=subprocess.PIPE, text=True).stdout
    c = {}
    for line in out.splitlines():
        key, *nums = line.split()
        c[key] = tuple(int(n) for n in nums)
    for name, cls in structs.items():
        assert ctypes.sizeof(cls) == c[name][0], f"sizeof({name})"
        assert ctypes.alignment(cls) == c[name][1], f"alignof({name})"
        for field, ctype in cls._fields_:
            off, size = c[f"{name}.{field}"]
            assert getattr(cls, field).offset == off, f"offsetof({name}, {field})"
            assert ctypes.sizeof(ctype) == size, f"sizeof({name}.{field})"


def test_declared_signatures_match_the_header(tokenrace):
    """Every C prototype's return type and parameter types, against the ctypes declaration."""
    import ctypes

    ffi = tokenrace._ffi
    text = _strip_comments(_header())
    scalar = {"uint32_t": ctypes.c_uint32, "uint64_t": ctypes.c_uint64, "int32_t": ctypes.c_int32,
              "uint8_t": ctypes.c_uint8, "float": ctypes.c_float, "double": ctypes.c_double, "void": None,
              "enum tokenrace_status": ffi.status}

    def ctype_of(decl):
        decl = re.sub(r"\bconst\b", "", decl).strip()
        stars = decl.count("*")
        base = re.sub(r"\s+", " ", decl.replace("*", "")).strip()
        if base == "tokenrace_log_callback" or (base == "void" and stars == 1):
            return ctypes.c_void_p  # a function pointer or user data, passed as an address
        if stars == 0:
            if base.startswith("struct "):
                return ffi.STRUCTS[base[len("struct "):]]
            return scalar[base]
        if base == "char" and stars == 1:
            return ctypes.c_char_p
        if base == "struct tokenrace_sampler":
            inner = ffi.sampler_p
        elif base == "struct tokenrace_pool":
            inner = ffi.pool_p
        elif base == "struct tokenrace_requests":
            inner = ffi.requests_p
        elif scalar.get(base) is not None:
            inner = ctypes.POINTER(scalar[base])  # an array of scalars (the request state's)
        elif base.startswith("struct "):
            inner = ctypes.POINTER(ffi.STRUCTS[base[len("struct "):]])
        elif scalar.get(base) is not None:  # an output array of scalars (the watermark calls', the shard tokens and flags)
            inner = ctypes.POINTER(scalar[base])
        else:
            raise AssertionError(f"unexpected C type {decl!r}")
        for _ in range(stars - 1):
            inner = ctypes.POINTER(inner)
        return inner

    # Function pointer typedefs (the log callback) are types, not functions.
    text = re.sub(r"typedef[^;]*\(\*\s*\w+\)\s*\([^;]*\);", "", text)
    protos = re.findall(r"\n([\w ]+?[\s*]+)(tokenrace_\w+)\(([^)]*)\);", text)
    assert len(protos) == len(ffi._SIGNATURES)
    for ret, name, params in protos:
        restype, argtypes = ffi._SIGNATURES[name]
        assert restype == ctype_of(ret), f"{name}: return type"
        params = [p.strip() for p in params.split(",")] if params.strip() != "void" else []
        want = [ctype_of(re.sub(r"\w+$", "", p)) for p in params]
        assert argtypes == want, f"{name}: parameters"


def test_struct_size_is_set_to_the_ctypes_size(tokenrace):
    import ctypes

    for cls in tokenrace._ffi.STRUCTS.values():
        if cls._fields_[0][0] == "struct_size":  # the shard records are moved as bytes, unversioned
            assert cls().struct_size == ctypes.sizeof(cls)
