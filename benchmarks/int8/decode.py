"""Decode speed against llama.cpp's own `llama-bench`, one run: tg128 on the shipped Q4_1 file and on its
BF16 conversion, and its batches (pp1, pp8, pp16: what 8 or 16 verify rows cost it), against peagle on
the same files: `none` with `--compute fast` (the default: integer dot products) and `--compute exact`
(float32 arithmetic), bfloat16 weights, and `generate`'s defaults (P-EAGLE, K chosen by the engine), with HF
transformers `generate` in bfloat16 and float32 on the same token ids (greedy). peagle and HF decode 128 tokens after each of the first PROMPTS MT-Bench questions (chat template), greedy, EOS
ignored; its rate is 127 / (the time after the first token), as llama-bench's tg128 times 128 tokens after
a warm-up: from an empty context, and after as many tokens as the prompts hold on average (`-d`, the same
attention work as ours). Rounds interleave every system; medians.

    python benchmarks/int8/decode.py [ROUNDS] [PROMPTS]     # writes decode.json beside this file
"""
import json
import statistics
import sys
from pathlib import Path

import torch

from peagle.bench.peers import llamacpp
from peagle.bench.peers import checked_decode
from peagle.bench.peers import hf as hf_peer
from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.models.loader import resolve_target
from peagle.prompts import dataset_path, read_prompt_file

N = 128
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
prompts = read_prompt_file(dataset_path("mt-bench", None), "mt-bench")[:int(sys.argv[2]) if len(sys.argv) > 2 else 6]


def peagle(method, **how):
    engine = LLMEngine.from_pretrained(None, method=method, k="auto", max_num_seqs=1, **how)
    ids = [engine.encode_prompt(p.text) for p in prompts]

    def run():
        rates = []
        for i in ids:
            out = engine.generate([i], SamplingParams(max_tokens=N, ignore_eos=True))[0]
            rates.append((N - 1) / (out.elapsed_s - out.ttft_s))
        return rates
    return engine.precision, run


def hf(dtype, ids):
    peer = hf_peer.load(resolve_target(None), dtype, torch.device("cpu"), torch.get_num_threads())

    def run():
        ds = [checked_decode(peer, i, N) for i in ids]
        return [(N - 1) / (d.elapsed_s - d.ttft_s) for d in ds]
    return run


def bench(kind, p, n, depth=0):
    return lambda: [llamacpp.llama_bench(kind, prompt=p, gen=n, reps=3, depth=depth)["avg_ts"]]


systems = {
    "peagle `none`, the GGUF as shipped, `--compute fast` (default)": peagle("none"),
    "peagle `generate` defaults (P-EAGLE, auto K), the GGUF as shipped": peagle("parallel"),
    "peagle `none`, the GGUF as shipped, `--compute exact`": peagle("none", compute="exact"),
    "peagle `none`, bfloat16 weights (`--quantization none`)": peagle("none", dtype="bfloat16", quantization="none"),
}
systems = {name: run for name, (_, run) in systems.items()}
token_ids = [LLMEngine.from_pretrained(None, method="none", max_num_seqs=1).encode_prompt(p.text) for p in prompts]
systems["HF transformers `generate`, bfloat16"] = hf(torch.bfloat16, token_ids)
systems["HF transformers `generate`, float32"] = hf(torch.float32, token_ids)
D = round(statistics.mean(len(i) for i in token_ids))  # llama-bench -d: tg128 after as long a context as ours
peers = {f"llama-bench {kind} tg128{at}": bench(kind, 0, N, d) for kind in ("Q4_1", "BF16") for at, d in (("", 0), (f" @ d{D}", D))}
batches = {f"llama-bench Q4_1 pp{p}": bench("Q4_1", p, 0) for p in (1, 8, 16)}
everyone = {**systems, **peers}
for run in systems.values():
    run()  # warm-up
rates = {name: [] for name in {**everyone, **batches}}
for r in range(rounds):
    for name, run in everyone.items():
        rates[name] += run()
for name, run in batches.items():
    rates[name] += run()
med = {name: statistics.median(xs) for name, xs in rates.items()}
(Path(__file__).resolve().parents[2] / "docs" / "results" / "int8" / "decode.json").write_text(json.dumps({"rounds": rounds, "prompts": len(prompts),
                                                                "rates": rates, "medians": med}, indent=1) + "\n")
refs = [f"llama-bench {kind} tg128{at}" for kind in ("Q4_1", "BF16") for at in ("", f" @ d{D}")]
hf_bf = med["HF transformers `generate`, bfloat16"]
print(f"| system | decode tok/s (median) | against {' | against '.join(refs)} | against HF bf16 |\n|---|---|"
      + "---|" * (len(refs) + 1))
for name in everyone:
    print(f"| {name} | {med[name]:.1f} | " + " | ".join(f"{med[name] / med[r]:.2f}x" for r in refs)
          + f" | {med[name] / hf_bf:.2f}x |")
pp1 = med["llama-bench Q4_1 pp1"]
print("\n| llama-bench Q4_1 batch | tokens/s | time against pp1 |\n|---|---|---|")
for p in (1, 8, 16):
    t = med[f"llama-bench Q4_1 pp{p}"]
    print(f"| pp{p} | {t:.1f} | {p * pp1 / t:.2f}x |")
