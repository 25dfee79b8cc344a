"""A peagle server (its --speculative-config from argv[1]) on a loopback port: `bench serve` at 16 clients over 16
MT-Bench prompts twice, the speculation counters read from /metrics around each. BENCHMARKS.md §54.

    PYTHONPATH=TREE python benchmarks/batch-gate/server_rounds.py SPEC_JSON
"""
import argparse, json, sys, re, httpx
from peagle.bench import serving
spec = sys.argv[1]
extra = sys.argv[2:]
cmd = [sys.executable, "-m", "peagle.cli", "serve", "--port", "8766", "--max-num-seqs", "16", "--speculative-config", spec, *extra]
args = argparse.Namespace(port=8766, dataset_name="mt-bench", num_prompts=16, output_len=128, seed=0, dataset_path=None, target=None)
with serving.running(cmd, 8766) as (log, proc):
    for rep in range(2):
        before = httpx.get("http://127.0.0.1:8766/metrics").text
        r = serving.client(args, 16)
        after = httpx.get("http://127.0.0.1:8766/metrics").text
        def val(text, name):
            m = re.search(rf"^{name}_total (\S+)", text, re.M); return float(m.group(1)) if m else 0.0
        d = {n: val(after, n) - val(before, n) for n in ("peagle:spec_decode_num_drafts", "peagle:spec_decode_num_draft_tokens", "peagle:spec_decode_num_accepted_tokens", "peagle:generation_tokens")}
        print(spec, extra, f"tok/s {r['output_throughput']:.1f} ttft {r['mean_ttft_ms']:.0f}", {k.split(':')[1]: v for k, v in d.items()}, flush=True)
