set -e
cd /work/main
OUT=docs/results/serve-vs-generate
P="Explain speculative decoding to a new engineer in three sentences."
SPEC='{"method": "eagle3", "parallel_drafting": true}'
.venv/bin/peagle serve --port 8791 --speculative-config "$SPEC" > $OUT/serve.log 2>&1 &
SP=$!
for i in $(seq 60); do curl -sf localhost:8791/health >/dev/null && break; sleep 1; done
for r in 1 2 3; do
  .venv/bin/python - "$P" <<'PY' | tee -a $OUT/runs.txt
import json, sys, time, urllib.request
body = {"messages": [{"role": "user", "content": sys.argv[1]}], "max_tokens": 256, "min_tokens": 256, "temperature": 0}
t = time.perf_counter()
r = json.load(urllib.request.urlopen(urllib.request.Request("http://127.0.0.1:8791/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})))
dt = time.perf_counter() - t
n = r["usage"]["completion_tokens"]
print(f"serve {n} tokens {dt:.2f}s {n/dt:.1f} tok/s AL {r['metrics']['speculative_decoding']['mean_acceptance_length']:.2f}")
PY
  .venv/bin/peagle generate --max-new-tokens 256 --min-tokens 256 --json "$P" 2>/dev/null | .venv/bin/python -c "import json,sys; r=json.load(sys.stdin); print(f\"generate {r['num_output_tokens']} tokens {r['elapsed_s']:.2f}s {r['output_tokens_per_s']} tok/s AL {r['acceptance_length']}\")" | tee -a $OUT/runs.txt
done
kill $SP; wait $SP 2>/dev/null || true
