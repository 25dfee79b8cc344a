#!/bin/bash
# The kernels of this tree against those of COMMIT on one command, alternating, N rounds: COMMIT's kernels are
# built in a worktree and their .so swapped in under this tree's stamp (the Python side is this tree's).
#   bash benchmarks/kv16/ab.sh COMMIT N command args...
set -euo pipefail
commit=$1 n=$2
shift 2
root=$(git rev-parse --show-toplevel)
so=$root/peagle/kernels/build/peagle_kernels.so
old=$(mktemp -d)
git -C "$root" worktree add -q --detach "$old/tree" "$commit"
(cd "$old/tree" && "$root/.venv/bin/python" -m peagle.kernels >/dev/null 2>&1)
cp "$so" "$old/new.so"
trap 'cp "$old/new.so" "$so"; git -C "$root" worktree remove --force "$old/tree"; rm -rf "$old"' EXIT
for i in $(seq "$n"); do
  for which in "$commit" HEAD; do
    if [ "$which" = HEAD ]; then cp "$old/new.so" "$so"; else cp "$old/tree/peagle/kernels/build/peagle_kernels.so" "$so"; fi
    if [ "$which" = HEAD ]; then echo "# kernels of this tree, round $i"; else echo "# kernels of $commit ($(git -C "$root" rev-parse --short "$commit")), round $i"; fi
    "$@"
  done
done
