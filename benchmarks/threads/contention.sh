#!/usr/bin/env bash
# Plain decoding on both cores (two threads), the machine quiet and then with a busy loop on core 1 (another
# job), under libgomp's wait policies: its default (spin ~300k rounds, then sleep), shorter spins, passive.
#   bash benchmarks/threads/contention.sh [ROUNDS]   # writes contention.txt here
set -u
ROUNDS=${1:-2}; HERE=$(dirname "$0"); OUT="$HERE/contention.txt"
run() {  # $1: label, rest: env
  local label=$1; shift
  local r
  r=$(env "$@" .venv/bin/peagle generate --method none --max-new-tokens 128 --min-tokens 128 \
      "Explain speculative decoding to a new engineer in three sentences." 2>&1 | grep -o "[0-9.]* tok/s")
  echo "$label $*: $r" | tee -a "$OUT"
}
for r in $(seq "$ROUNDS"); do
  for busy in no yes; do
    [ "$busy" = yes ] && { taskset -c 1 sh -c 'while :; do :; done' & BUSY=$!; sleep 1; }
    run "busy=$busy" X=1
    run "busy=$busy" GOMP_SPINCOUNT=30000
    run "busy=$busy" GOMP_SPINCOUNT=3000
    run "busy=$busy" OMP_WAIT_POLICY=passive
    run "busy=$busy" PEAGLE_TORCH_THREADS=1
    [ "$busy" = yes ] && { kill "$BUSY"; wait "$BUSY" 2>/dev/null; }
  done
done
