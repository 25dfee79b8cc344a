#!/bin/bash
# One request at a time through `peagle serve` (the target alone) against `peagle generate --method none`, alternating,
# N pairs, 256 tokens (min_tokens 256, greedy): what the server adds to a request on this CPU.
#   bash docs/results/zen4/serve_none.sh N
set -e
cd "$(git rev-parse --show-toplevel)"
OUT=docs/results/zen4
P="Explain speculative decoding to a new engineer in three sentences."
.venv/bin/peagle serve --port 8792 > $OUT/serve_none.log 2>&1 &
SP=$!
trap 'kill $SP' EXIT
for i in $(seq 90); do curl -sf localhost:8792/health >/dev/null && break; sleep 1; done
for r in $(seq "${1:-3}"); do
  .venv/bin/python - "$P" <<'PY'
import json, sys, time, urllib.request
body = {"messages": [{"role": "user", "content": sys.argv[1]}], "max_tokens": 256, "min_tokens": 256, "temperature": 0}
t = time.perf_counter()
r = json.load(urllib.request.urlopen(urllib.request.Request("http://127.0.0.1:8792/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})))
dt = time.perf_counter() - t
n = r["usage"]["completion_tokens"]
print(f"serve {n} tokens {dt:.2f}s {n/dt:.1f} tok/s")
PY
  .venv/bin/peagle generate --method none --max-new-tokens 256 --min-tokens 256 --json "$P" 2>/dev/null | .venv/bin/python -c "import json,sys; r=json.load(sys.stdin); print(f\"generate {r['num_output_tokens']} tokens {r['elapsed_s']:.2f}s {r['output_tokens_per_s']} tok/s\")"
done
