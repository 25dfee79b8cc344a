#!/bin/bash
# This tree's Python against COMMIT's (the kernels the same: COMMIT's worktree gets this tree's build, stamped as
# its own; this tree's kernels must be a superset of COMMIT's, as when only operators were added), alternating,
# N rounds of one command run from each tree's root:  bash docs/results/glue/round_ab.sh COMMIT N command args...
set -euo pipefail
commit=$1 n=$2
shift 2
root=$(git rev-parse --show-toplevel)
old=$(mktemp -u -d -p "$(dirname "$root")" ab-XXXX)  # beside the repo: ../shared is the same folder
git -C "$root" worktree add -q --detach "$old" "$commit"
cp -r "$root/peagle/kernels/build" "$old/peagle/kernels/"
(cd "$old" && PYTHONPATH="$old" "$root/.venv/bin/python" -c \
    "from peagle.kernels import STAMP, _fingerprint; STAMP.write_text(_fingerprint())")
trap 'git -C "$root" worktree remove --force "$old"' EXIT
for i in $(seq "$n"); do
  for which in "$commit" HEAD; do
    dir=$root; [ "$which" = HEAD ] || dir=$old
    echo "# Python of $which ($(git -C "$dir" rev-parse --short HEAD)), round $i"
    (cd "$dir" && PYTHONPATH="$dir" "$root/.venv/bin/python" "$@")
  done
done
