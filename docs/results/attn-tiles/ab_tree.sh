#!/bin/bash
# This tree against COMMIT's whole tree (its Python and its kernels) on one command, alternating, N rounds:
# COMMIT is checked out in a worktree, its kernels built there, and the command run from it with its peagle
# first on PYTHONPATH. (kv16/ab.sh swaps only the kernels' .so, for changes that leave the Python side alone.)
#   bash docs/results/attn-tiles/ab_tree.sh COMMIT N command args...   (paths in the command relative to the root)
set -euo pipefail
commit=$1 n=$2
shift 2
root=$(git rev-parse --show-toplevel)
old=$(mktemp -d)
ln -s "$(dirname "$root")/shared" "$old/shared"  # ../shared (the data) as from this tree
git -C "$root" worktree add -q --detach "$old/tree" "$commit"
(cd "$old/tree" && PYTHONPATH="$old/tree" "$root/.venv/bin/python" -m peagle.kernels >/dev/null 2>&1)
trap 'git -C "$root" worktree remove --force "$old/tree"; rm -rf "$old"' EXIT
for i in $(seq "$n"); do
  echo "# $commit ($(git -C "$root" rev-parse --short "$commit")), round $i"
  (cd "$old/tree" && PYTHONPATH="$old/tree" "$@")
  echo "# this tree ($(git -C "$root" rev-parse --short HEAD)), round $i"
  (cd "$root" && PYTHONPATH="$root" "$@")
done
