#!/usr/bin/env bash
# The mixed workload of BENCHMARKS §13: 40 MT-Bench chats and 4 long prompts (4,000 tokens) among
# them, Poisson arrivals at $RATE requests/s (default 1.5), 64 tokens each, against `peagle serve`
# with each --long-prefill-token-threshold given (2048 = the whole budget: no sharing, the old
# behaviour) and $SERVE_FLAGS; results in mixed-rate$RATE-threshold-T$TAG.json.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=docs/results/fair-prefill
for t in "$@"; do
  .venv/bin/peagle serve --port 8791 --long-prefill-token-threshold "$t" ${SERVE_FLAGS:-} 2>/dev/null &
  pid=$!
  until curl -sf localhost:8791/health >/dev/null; do sleep 0.5; done
  curl -s localhost:8791/v1/completions -H 'Content-Type: application/json' -d '{"prompt": "Hello", "max_tokens": 8}' >/dev/null
  .venv/bin/peagle bench serve --port 8791 --dataset-name mt-bench --num-prompts 40 --long-prompts 4 \
      --long-prompt-len 4000 --request-rate "${RATE:-1.5}" --output-len 64 --temperature 0 --ignore-eos --disable-tqdm \
      --save-result --save-detailed --result-filename "$out/mixed-rate${RATE:-1.5}-threshold-$t${TAG:-}.json" --metadata threshold="$t" | tail -2
  kill -TERM $pid; wait $pid || true
done
