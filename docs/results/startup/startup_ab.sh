#!/usr/bin/env bash
# `peagle generate`'s wall time from the shell (8 tokens, the default model): the start-up code of e3678e7
# (A: AutoTokenizer, the collector walking every import and model object) against the tree's (B: the generic
# tokenizer built directly, what the CLI imports and the loaders load frozen), alternating, N rounds. Only the
# three Python files differ between A and B (the kernels are the tree's in both).
#   bash docs/results/startup/startup_ab.sh 6
set -euo pipefail
n=${1:-6}; files="peagle/cli.py peagle/runtime.py peagle/models/loader.py"; keep=$(mktemp -d)
for f in $files; do mkdir -p "$keep/$(dirname "$f")"; cp "$f" "$keep/$f"; done
run() { local s e; s=$(date +%s.%N); .venv/bin/peagle generate --max-new-tokens 8 "Name a fruit." >/dev/null 2>&1; e=$(date +%s.%N); echo "$e - $s" | bc; }
for i in $(seq "$n"); do
  git show e3678e7:peagle/cli.py > peagle/cli.py; git show e3678e7:peagle/runtime.py > peagle/runtime.py
  git show e3678e7:peagle/models/loader.py > peagle/models/loader.py; a=$(run)
  for f in $files; do cp "$keep/$f" "$f"; done; b=$(run)
  echo "round $i: A (e3678e7) $a s, B (now) $b s"
done
