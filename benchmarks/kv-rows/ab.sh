#!/usr/bin/env bash
# Two trees' drafting passes and prompt prefill, alternating process by process: BASE (a worktree of the commit
# before, its kernels built there: `git worktree add /tmp/base fd900a8~1 && (cd /tmp/base && python -m peagle.kernels)`)
# and this one. BENCHMARKS.md §53.
#   usage: BASE=/tmp/base bash benchmarks/kv-rows/ab.sh [ROUNDS]
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); MAIN=$(cd "$HERE/../../.." && pwd); PY=${PY:-$MAIN/.venv/bin/python}
for r in $(seq "${1:-3}"); do
  for tree in "$BASE" "$MAIN"; do
    for script in drafting_pass.py prefill.py; do
      echo "round $r $tree $script: $(PYTHONPATH=$tree "$PY" "$HERE/$script" 2>&1 | grep -v '^peagle:')"
    done
  done
done
