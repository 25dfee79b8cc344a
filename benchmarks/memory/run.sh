#!/bin/bash
# Peak RSS (/usr/bin/time -v) of peagle generate on Gemma 3 270M Q4_K_M, the default model (plain and with its
# head) and a random 1.64 GB bf16 Llama (the default --compute fast, and PEAGLE_ISA=avx2 as on a Zen 3), and
# llama-bench's on the Gemma file; then where each peagle run's memory goes (rss_profile.py).
#   bash benchmarks/memory/run.sh OUT_DIR [REPO]   (REPO: the checkout to run, default this one)
# One core (taskset -c 1), one thread, nice 10: the machine is shared.
set -e
OUT=$1; REPO=${2:-$(cd "$(dirname "$0")/../../.." && pwd)}; mkdir -p "$OUT"
PY=${PY:-/work/main/.venv/bin/python}
BF16=${BF16:-/tmp/rss/llama-820m-bf16}
LLAMA_BENCH=${LLAMA_BENCH:-$HOME/.cache/llama-native/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/llama-bench}
[ -f "$BF16/model.safetensors" ] || (cd "$REPO" && PYTHONPATH=$REPO $PY benchmarks/memory/make_bf16_target.py "$BF16")
pin() { taskset -c 1 nice -n 10 env OMP_NUM_THREADS=1 PYTHONPATH=$REPO "$@"; }
run() {  # name, env, generate args
  name=$1; e=$2; shift 2
  (cd "$REPO" && pin env $e /usr/bin/time -v $PY -m peagle.cli generate "$@") > "$OUT/$name.out" 2> "$OUT/$name.err"
  echo "$name: $(grep 'Maximum resident' "$OUT/$name.err" | awk '{printf "%d MB", $6 / 1000}'); $(grep -o '[0-9.]* tok/s' "$OUT/$name.err")"
}
run gemma-none "" --target gemma3 --method none --max-new-tokens 128 --no-chat "The history of the Roman Empire"
run gemma-default "" --target gemma3 --max-new-tokens 128 --no-chat "The history of the Roman Empire"
run smollm-none "" --method none --max-new-tokens 128 "What is the capital of France?"
run smollm-default "" --max-new-tokens 128 "What is the capital of France?"
run bf16-fast "" --target "$BF16" --method none --max-new-tokens 16 "What is the capital of France?"
run bf16-avx2 "PEAGLE_ISA=avx2" --target "$BF16" --method none --max-new-tokens 16 "What is the capital of France?"
if [ -x "$LLAMA_BENCH" ]; then
  taskset -c 1 nice -n 10 /usr/bin/time -v "$LLAMA_BENCH" -m "$HOME/.cache/peagle/models/gemma-3-270m-q4_k_m.gguf" \
    -p 0 -n 128 -r 1 -t 1 > "$OUT/llama-bench.out" 2> "$OUT/llama-bench.err"
  echo "llama-bench (-t 1 -r 1): $(grep 'Maximum resident' "$OUT/llama-bench.err" | awk '{printf "%d MB", $6 / 1000}')"
fi
if [ -f "$REPO/benchmarks/memory/rss_profile.py" ]; then
  prof() { name=$1; e=$2; shift 2
    (cd "$REPO" && pin env $e $PY benchmarks/memory/rss_profile.py generate "$@") 2>&1 >/dev/null | grep -v "^peagle:" > "$OUT/$name.profile"; }
  prof gemma-none "" --target gemma3 --method none --max-new-tokens 128 --no-chat "The history of the Roman Empire"
  prof smollm-default "" --max-new-tokens 128 "What is the capital of France?"
  prof bf16-fast "" --target "$BF16" --method none --max-new-tokens 16 "What is the capital of France?"
  prof bf16-avx2 "PEAGLE_ISA=avx2" --target "$BF16" --method none --max-new-tokens 16 "What is the capital of France?"
fi
