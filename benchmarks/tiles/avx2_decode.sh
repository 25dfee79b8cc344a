#!/usr/bin/env bash
# A stand-in for an AVX2-only CPU (Zen 3) on an AVX-512 one: peagle held to its AVX2 kernels (PEAGLE_ISA=avx2)
# against llama.cpp built without AVX-512 (the same vendored source as benchmarks/llama-native.sh, in
# build-avx2: -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF
# -DGGML_AVX_VNNI=OFF; `objdump -d libggml-cpu.so | grep -c zmm` gives 0). Plain decoding of the shipped
# Q4_1 file, 128 tokens, alternating, one pinned core and both cores. Writes avx2_decode.txt here.
#   bash benchmarks/tiles/avx2_decode.sh [ROUNDS]
set -u
ROUNDS=${1:-2}; HERE=$(dirname "$0"); OUT="$HERE/avx2_decode.txt"
SRC=$(ls -d ~/.cache/llama-native/*/vendor/llama.cpp | head -1)
if [ ! -x "$SRC/build-avx2/bin/llama-bench" ]; then
  cmake -S "$SRC" -B "$SRC/build-avx2" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON \
    -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF -DGGML_BMI2=ON -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=ON >/dev/null
  cmake --build "$SRC/build-avx2" -j"$(nproc)" --target llama-bench >/dev/null
fi
BIN="$SRC/build-avx2/bin"
SMOL=$(.venv/bin/python -c "from peagle.models.loader import default_gguf; print(default_gguf())" 2>/dev/null)
echo "llama.cpp AVX2 build: $(objdump -d "$BIN/libggml-cpu.so" | grep -c zmm) zmm instructions" | tee -a "$OUT"
for r in $(seq "$ROUNDS"); do
  for pin in "taskset -c 0" ""; do
    t=$([ -n "$pin" ] && echo 1 || echo 2)
    echo "peagle avx2 threads=$t: $($pin env PEAGLE_ISA=avx2 .venv/bin/peagle generate --method none --max-new-tokens 128 \
      --min-tokens 128 "Explain speculative decoding to a new engineer in three sentences." 2>&1 | grep -o "[0-9.]* tok/s")" | tee -a "$OUT"
    echo "llama-bench avx2 -t $t: $($pin "$BIN/llama-bench" -m "$SMOL" -t "$t" -p 0 -n 128 -r 3 2>/dev/null | grep tg128 | awk -F'|' '{print $8}')" | tee -a "$OUT"
  done
done
