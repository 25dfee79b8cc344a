"""`generate`'s defaults (P-EAGLE, auto K) against `--method none`, one request at a time, 6 MT-Bench prompts x
2 rounds, 128 tokens, decode tok/s medians; on the GGUF as shipped, or with BF16=1 on bf16 weights.
Run with and without auto K's margin (peagle/engine/auto_k.py) for BENCHMARKS.md §16.

    [BF16=1] python docs/results/quantized/auto_k_margin.py
"""
import statistics, sys
from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.prompts import dataset_path, read_prompt_file
prompts = read_prompt_file(dataset_path("mt-bench", None), "mt-bench")[:6]
import os
how = dict(quantization="none", dtype="bfloat16") if os.environ.get("BF16") else {}
es = {m: LLMEngine.from_pretrained(None, method=m, k="auto", max_num_seqs=1, **how) for m in ("none", "parallel")}
ids = [es["none"].encode_prompt(p.text) for p in prompts]
r = {m: [] for m in es}
for rnd in range(2):
    for i in range(len(ids)):
        for m, e in es.items():
            o = e.generate([ids[i]], SamplingParams(max_tokens=128, ignore_eos=True))[0]
            r[m].append(127 / (o.elapsed_s - o.ttft_s))
n, p = statistics.median(r["none"]), statistics.median(r["parallel"])
print(f"none {n:.1f} parallel {p:.1f} ratio {p/n:.3f}; AL {es['parallel'].stats}")
