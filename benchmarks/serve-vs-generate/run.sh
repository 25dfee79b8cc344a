# One chat request at a time through `peagle serve` against `peagle generate`, alternating, PAIRS pairs (default 3),
# 256 tokens (min_tokens 256, greedy), appended to runs.txt: P-EAGLE (K auto) by default, `none`: the target alone.
#   bash benchmarks/serve-vs-generate/run.sh [PAIRS] [none]
set -e
cd "$(git rev-parse --show-toplevel)"
OUT=docs/results/serve-vs-generate; mkdir -p $OUT
P="Explain speculative decoding to a new engineer in three sentences."
if [ "${2:-}" = none ]; then SERVE=(--speculative-config '{"method": "none"}'); GEN=(--method none); else
  SERVE=(--speculative-config '{"method": "eagle3", "parallel_drafting": true}'); GEN=(); fi
.venv/bin/peagle serve --port 8791 "${SERVE[@]}" > $OUT/serve.log 2>&1 &
SP=$!
for i in $(seq 90); do curl -sf localhost:8791/health >/dev/null && break; sleep 1; done
for r in $(seq "${1:-3}"); do
  .venv/bin/python - "$P" <<'PY' | tee -a $OUT/runs.txt
import json, sys, time, urllib.request
body = {"messages": [{"role": "user", "content": sys.argv[1]}], "max_tokens": 256, "min_tokens": 256, "temperature": 0}
t = time.perf_counter()
r = json.load(urllib.request.urlopen(urllib.request.Request("http://127.0.0.1:8791/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})))
dt = time.perf_counter() - t
n = r["usage"]["completion_tokens"]
al = r.get("metrics", {}).get("speculative_decoding", {}).get("mean_acceptance_length")
print(f"serve {n} tokens {dt:.2f}s {n/dt:.1f} tok/s AL {'-' if al is None else f'{al:.2f}'}")
PY
  .venv/bin/peagle generate "${GEN[@]}" --max-new-tokens 256 --min-tokens 256 --json "$P" 2>/dev/null | .venv/bin/python -c "import json,sys; r=json.load(sys.stdin); print(f\"generate {r['num_output_tokens']} tokens {r['elapsed_s']:.2f}s {r['output_tokens_per_s']} tok/s AL {r.get('acceptance_length', '-')}\")" | tee -a $OUT/runs.txt
done
kill $SP; wait $SP 2>/dev/null || true
