"""Time to the first token of a 4,000-token prompt (random ids; plain decoding, the shipped GGUF, chunks as the
engine cuts them), three prompts in one process. BENCHMARKS.md §53; ab.sh runs it on two trees.

    python benchmarks/kv-rows/prefill.py
"""
import statistics
import time

import torch

from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams
e = LLMEngine.from_pretrained(None, method="none", max_num_seqs=1)
g = torch.Generator().manual_seed(0)
ts = []
for r in range(3):
    ids = torch.randint(100, 40000, (4000,), generator=g).tolist()
    t = time.perf_counter(); e.generate([ids], SamplingParams(max_tokens=1)); ts.append(time.perf_counter() - t)
print("ttft", " ".join(f"{x:.3f}" for x in ts), "median", f"{statistics.median(ts):.3f}")
