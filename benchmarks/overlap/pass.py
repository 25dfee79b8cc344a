"""The target's pass alone (`LlamaModel.decode`, the engine's call) over N rows of one sequence at a 128-token
context, as `measure_costs` times it: the median of ITERS passes.

    python benchmarks/overlap/pass.py N ITERS
"""
import statistics
import sys
import time

import torch

from peagle.engine.llm_engine import LLMEngine
from peagle.models.attention import AttnMeta, Span

e = LLMEngine.from_pretrained(None, method="parallel", k=7, max_num_seqs=1)
r = e.runner
n, iters = int(sys.argv[1]), int(sys.argv[2])
bs, ctx = r.cfg.block_size, 128
for c in r.target_caches:
    c.materialize(ctx)
ids, pos = torch.zeros(n, dtype=torch.long), torch.arange(ctx, ctx + n)
meta = AttnMeta([Span(n, ctx + n, list(range(-(-(ctx + n) // bs))), ctx)], bs)
ts = []
with torch.inference_mode():
    for i in range(iters):
        t = time.perf_counter()
        r.target.decode(ids, pos, r.target_caches, meta, pos - ctx)
        ts.append(time.perf_counter() - t)
print(n, f"{statistics.median(ts) * 1e3:.2f} ms")
