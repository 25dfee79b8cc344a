#!/usr/bin/env bash
# The benchmark's files: random weights at real dimensions written by `peagle dummy-gguf` (f16, the default model's
# 49,152-token tokenizer), then quantized by llama.cpp's own llama-quantize, as users' downloads are made; BF16
# written by `dummy-gguf --type bf16` directly, as llama.cpp's convert_hf_to_gguf.py writes it.
#   benchmarks/real_sizes/make_files.sh DIR [PRESETS] [TYPES]
#   default PRESETS: llama-3.2-1b llama-3.2-3b llama-3.1-8b; TYPES: Q4_0 Q4_K_M Q8_0 BF16
# llama.cpp's binaries: benchmarks/llama-native.sh (LLAMA_BIN overrides the folder).
set -euo pipefail
DIR=${1:?usage: make_files.sh DIR [PRESETS] [TYPES]}
PRESETS=${2:-llama-3.2-1b llama-3.2-3b llama-3.1-8b}
TYPES=${3:-Q4_0 Q4_K_M Q8_0 BF16}
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${LLAMA_BIN:-$("$HERE/../llama-native.sh")}
mkdir -p "$DIR"
for p in $PRESETS; do
  f16="$DIR/$p-f16.gguf"
  for t in $TYPES; do
    out="$DIR/$p-$t.gguf"
    [ -f "$out" ] && continue
    if [ "$t" = BF16 ]; then  # a plain conversion: written directly (an 8B needs 16 GB of disk, not 32 beside the f16)
      python -m peagle.cli dummy-gguf "$p" --type bf16 --out "$out"
      continue
    fi
    [ -f "$f16" ] || python -m peagle.cli dummy-gguf "$p" --out "$f16"
    "$BIN/llama-quantize" "$f16" "$out.tmp" "$t" "$(nproc)" >"$out.log" 2>&1
    mv "$out.tmp" "$out"
  done
done
ls -la "$DIR"
