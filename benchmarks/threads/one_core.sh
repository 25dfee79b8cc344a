#!/usr/bin/env bash
# Plain decoding on one pinned core, peagle against llama-bench on the same file and core, alternating
# (two rounds); before the fix peagle's pool took os.cpu_count() threads whatever the affinity (run the
# session's start with PEAGLE_TORCH_THREADS=2 to see it). Writes <name>.txt here.
#   bash benchmarks/threads/one_core.sh CORE [ROUNDS]
set -u
CORE=${1:-0}; ROUNDS=${2:-2}
HERE=$(dirname "$0"); BIN=$(ls -d ~/.cache/llama-native/*/vendor/llama.cpp/build/bin | head -1)
SMOL=$(.venv/bin/python -c "from peagle.models.loader import default_gguf; print(default_gguf())" 2>/dev/null)
GEMMA=~/.cache/peagle/models/gemma-3-270m-q4_k_m.gguf
for r in $(seq "$ROUNDS"); do
  for threads in 1 2; do   # 2: the old behaviour on one core
    taskset -c "$CORE" env PEAGLE_TORCH_THREADS=$threads .venv/bin/peagle generate --method none --max-new-tokens 128 --min-tokens 128 \
      "Explain speculative decoding to a new engineer in three sentences." 2>&1 | grep tok/s | sed "s/^/smollm2 threads=$threads: /" >> "$HERE/peagle.txt"
    taskset -c "$CORE" env PEAGLE_TORCH_THREADS=$threads .venv/bin/peagle generate --target gemma3 --method none --no-chat \
      --max-new-tokens 128 "The history of the Roman Empire" 2>&1 | grep tok/s | sed "s/^/gemma threads=$threads: /" >> "$HERE/peagle.txt"
  done
  taskset -c "$CORE" "$BIN/llama-bench" -m "$SMOL" -t 1 -p 0 -n 128 -r 3 2>/dev/null | grep tg128 >> "$HERE/llama-bench.txt"
  taskset -c "$CORE" "$BIN/llama-bench" -m "$GEMMA" -t 1 -p 0 -n 128 -r 3 2>/dev/null | grep tg128 >> "$HERE/llama-bench.txt"
done
