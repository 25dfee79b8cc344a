#!/usr/bin/env bash
# llama.cpp's own binaries (llama-bench, llama-server, llama-cli, llama-quantize) built from the source that the
# llama-cpp-python sdist vendors (PyPI has no prebuilt binaries; this is the same llama.cpp that llama-cpp-python wraps).
# Built once per machine, ~10-12 min on 2 cores, into $LLAMA_NATIVE (default ~/.cache/llama-native); prints the bin folder.
#   usage: benchmarks/llama-native.sh [VERSION]      (default 0.3.36)
#   e.g.:  B=$(benchmarks/llama-native.sh) && "$B/llama-bench" -m model.gguf -t 2 -p 0 -n 128
# The Python package can reuse the same build without compiling again:
#   CMAKE_ARGS="-DLLAMA_BUILD=OFF" pip install "$LLAMA_NATIVE/llama_cpp_python-$V.tar.gz"; export LLAMA_CPP_LIB_PATH="$B"
set -euo pipefail
V=${1:-0.3.36}
D=${LLAMA_NATIVE:-$HOME/.cache/llama-native}
B="$D/llama_cpp_python-$V/vendor/llama.cpp/build/bin"
if [ ! -x "$B/llama-bench" ] || [ ! -x "$B/llama-server" ]; then
  mkdir -p "$D"; cd "$D"
  [ -f "llama_cpp_python-$V.tar.gz" ] || python3 -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$V" -d . >&2
  [ -d "llama_cpp_python-$V" ] || tar xzf "llama_cpp_python-$V.tar.gz"
  cd "llama_cpp_python-$V/vendor/llama.cpp"
  # AMX compiled out: on the AMX Xeons here 0.3.36's -march=native build dies with SIGILL in every prompt pass
  # (gdb: a tileloadd in ggml_backend_amx_mul_mat on an OpenMP thread); without the tiles it runs AVX512-VNNI
  # there, as on every CPU without AMX. (GCC lets -mno-* win over -march=native in either order.)
  NOAMX=""; [ "$(uname -m)" = x86_64 ] && NOAMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DCMAKE_C_FLAGS="$NOAMX" -DCMAKE_CXX_FLAGS="$NOAMX" \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON >"$D/cmake.log" 2>&1
  cmake --build build -j"$(nproc)" --target llama-bench llama-server llama-cli llama-quantize >"$D/build.log" 2>&1 \
    || { echo "llama.cpp build failed, see $D/build.log" >&2; exit 1; }
fi
echo "$B"
