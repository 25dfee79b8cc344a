#!/usr/bin/env bash
# GuideLLM (a benchmark client nobody here wrote) against peagle's and llama.cpp's servers, as the
# issue ran it: synthetic prompts of 128 tokens, 64 out, 1 and 4 concurrent streams, 16 requests.
# GuideLLM lives in a venv of its own (its requirements are not the project's): set GUIDELLM_VENV. It checks a
# server with GET /health first; llama.cpp's Python server has no /health, so that check is off for it.
set -euo pipefail
cd "$(dirname "$0")/../../.."
venv=${GUIDELLM_VENV:-/tmp/guidellm-venv}
[ -x "$venv/bin/guidellm" ] || { python3 -m venv "$venv"; "$venv/bin/pip" install -q torch==2.13.0 guidellm; }
tok=${PEAGLE_CACHE:-$HOME/.cache/peagle}/models/SmolLM2-135M-Instruct
out=docs/results/serving
run() {  # name, extra backend settings, server command...
  local name=$1 extra=$2; shift 2
  "$@" > /dev/null 2>&1 &
  local pid=$!
  until curl -sf localhost:8802/v1/models >/dev/null; do sleep 0.5; done
  curl -s localhost:8802/v1/completions -H 'Content-Type: application/json' -d '{"prompt": "Hello", "max_tokens": 8}' >/dev/null
  for streams in 1 4; do
    HF_HUB_OFFLINE=1 "$venv/bin/guidellm" run --backend kind=openai_http,target=http://127.0.0.1:8802$extra \
      --profile kind=concurrent,streams=$streams --data kind=synthetic_text,prompt_tokens=128,output_tokens=64 \
      --tokenizer kind=huggingface_auto,model="$tok" --constraint kind=max_requests,count=16 --disable-progress \
      --output kind=json,path="$out/guidellm-$name-c$streams.json" > /dev/null 2>&1
    gzip -9f "$out/guidellm-$name-c$streams.json"
  done
  kill -TERM $pid; wait $pid || true
}
run peagle-none "" .venv/bin/peagle serve --port 8802
run peagle-parallel "" .venv/bin/peagle serve --port 8802 --speculative-config '{"method": "eagle3", "parallel_drafting": true}'
run llamacpp-BF16 ,validate_backend=false $(.venv/bin/python -c "from peagle.bench.peers.llamacpp import server_command; print(' '.join(server_command('BF16', 8802)))")
python3 - "$out" > "$out/guidellm.md" <<'PY'
import gzip, json, sys
print("| system | streams | output tok/s (mean) | TTFT ms (median) | ITL ms (median) | output tokens / request |")
print("|---|---|---|---|---|---|")
for s in ("peagle-none", "peagle-parallel", "llamacpp-BF16"):
    for c in (1, 4):
        m = json.load(gzip.open(f"{sys.argv[1]}/guidellm-{s}-c{c}.json.gz"))["benchmarks"][0]["metrics"]
        out = m.get("output_token_count", {}).get("successful", {}).get("median")
        print(f"| {s} | {c} | {m['output_tokens_per_second']['successful']['mean']:.1f} | "
              f"{m['time_to_first_token_ms']['successful']['median']:.0f} | "
              f"{m['inter_token_latency_ms']['successful']['median']:.1f} | {out} |")
PY
