"""What a plain step and speculative rounds (K = 1, 3, 7: verify K+1 rows, draft) cost under each tile setting
for streamed weights (kernels.streaming: one-row and taller byte limits, LIMITS as 16777216:16777216,0:0), one
process, the settings alternating every 5 steps (cpu-roofline/round.py's engines; medians, ms).

    python benchmarks/zen4/round_stream.py 16777216:16777216,0:0 16
"""
import os, statistics, sys, time, torch
from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.prompts import dataset_path, read_prompt_file
variants = sys.argv[1].split(",")
KS = (0, 1, 3, 7)
text = read_prompt_file(dataset_path("mt-bench", None), "mt-bench")[0].text
engines = {k: LLMEngine.from_pretrained(None, method="none" if k == 0 else "parallel", k=max(k, 1), max_num_seqs=1) for k in KS}
for e in engines.values():
    e.add_request(e.encode_prompt(text), SamplingParams(max_tokens=10 ** 6, ignore_eos=True)); e.step()
times = {(v, k): [] for v in variants for k in KS}
for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 12):
    for k, e in engines.items():
        for v in variants:
            torch.ops.peagle.set_stream_bytes(*[int(b) for b in v.split(":")])
            for _ in range(5):
                t = time.perf_counter(); e.step(); times[(v, k)].append(time.perf_counter() - t)
print("| variant | plain ms | " + " | ".join(f"K={k} ms / step" for k in KS[1:]) + " |")
for v in variants:
    ms = {k: statistics.median(times[(v, k)]) * 1e3 for k in KS}
    print(f"| {v} | {ms[0]:.2f} | " + " | ".join(f"{ms[k]:.2f} / {ms[k]/ms[0]:.2f}" for k in KS[1:]) + " |")
