#!/usr/bin/env bash
# include/tokenrace_llama.h against a real libllama, and the peer benchmark against llama.cpp's
# own chain (docs/performance.md). Not part of CI: building libllama takes about 8 minutes on 2
# cores. llama.cpp's source comes from the llama-cpp-python sdist on PyPI (it vendors llama.cpp),
# or from LLAMA_SRC (a llama.cpp checkout); only the `llama` target is built, into
# target/llama-build.
#
#   scripts/llama-check.sh [check|bench [VOCAB [REPS]]]     (default: check, then bench)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
mkdir -p target/llama
if [ -z "${LLAMA_SRC:-}" ]; then
  version=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
  LLAMA_SRC=target/llama/llama_cpp_python-$version/vendor/llama.cpp
  if [ ! -f "$LLAMA_SRC/include/llama.h" ]; then
    python3 -m pip download --quiet --no-deps --no-binary :all: -d target/llama "llama-cpp-python==$version"
    tar xzf "target/llama/llama_cpp_python-$version.tar.gz" -C target/llama
  fi
fi
build=target/llama-build
if [ ! -f "$build/bin/libllama.so" ]; then
  echo "llama-check: building libllama from $LLAMA_SRC (about 8 minutes on 2 cores)"
  cmake -S "$LLAMA_SRC" -B "$build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_BUILD_TOOLS=OFF -DGGML_OPENMP=OFF >/dev/null
  cmake --build "$build" --target llama -j"$(nproc)" >/dev/null
fi
cargo build --release --lib --quiet
c++ -O2 -std=c++17 -Wall -Wextra -Iinclude -I"$LLAMA_SRC/include" -I"$LLAMA_SRC/ggml/include" \
  c_tests/llama_check.cpp -o target/llama/llama_check \
  -L"$build/bin" -lllama -Ltarget/release -ltokenrace \
  -Wl,-rpath,"$root/$build/bin" -Wl,-rpath,"$root/target/release" -lm
echo "llama.cpp: $(cd "$LLAMA_SRC" && (git rev-parse --short HEAD 2>/dev/null || basename "$(dirname "$(dirname "$PWD")")"))"
mode=${1:-all}
if [ "$mode" = check ] || [ "$mode" = all ]; then
  target/llama/llama_check check
fi
if [ "$mode" = bench ] || [ "$mode" = all ]; then
  # One core: llama.cpp's samplers are single-threaded, and so is this tokenrace sampler.
  for vocab in ${2:-32000 151936}; do
    taskset -c 0 target/llama/llama_check bench "$vocab" "${3:-300}"
  done
fi
