"""peagle's CPU attention kernel as a decode step meets it: 30 layers' KV pools (9 query heads, 3 KV heads,
head_dim 64: the default model) at a context of CTX positions, each layer's call after reading 4 MB of other
memory (a layer's weights' worth), so its keys and values come from DRAM; 1-8 rows of one sequence; the pools
in DTYPE (float32 or float16). Median over 60 passes of the 30 layers' attention time alone, ms.

    taskset -c 0 env OMP_NUM_THREADS=1 python benchmarks/kv16/attention_cold.py [CTX] [DTYPE]
"""
import statistics
import sys
import time

import torch

from peagle import kernels
from peagle.models.attention import AttnMeta, Span

assert kernels.available()
torch.manual_seed(0)
H, HKV, D, BS, SLOTS = 9, 3, 64, 16, 4096
ctx = int(sys.argv[1]) if len(sys.argv) > 1 else 300
dtype = getattr(torch, sys.argv[2]) if len(sys.argv) > 2 else torch.float32
pools = [(torch.randn(SLOTS, HKV, D).to(dtype), torch.randn(SLOTS, HKV, D).to(dtype)) for _ in range(30)]
other = [torch.randn(2 ** 20) for _ in range(30)]  # 4 MB a layer
cells = []
for rows in (1, 2, 4, 8):
    meta = AttnMeta([Span(rows, ctx + rows, list(range(-(-(ctx + rows) // BS))), ctx)], BS).prepare(
        torch.arange(ctx, ctx + rows), SLOTS)
    q = torch.randn(rows, H, D)
    totals = []
    for _ in range(60):
        total = 0.0
        for layer in range(30):
            other[layer].sum()
            k, v = pools[layer]
            t = time.perf_counter()
            torch.ops.peagle.attention(q, k, v, meta.table, meta.seq_of_row, meta.positions, meta.short_rows, BS, 0,
                                       0.125, None)
            total += time.perf_counter() - t
        totals.append(total)
    cells.append(f"{statistics.median(totals) * 1e3:.3f}")
print(f"| {ctx} | {str(dtype).removeprefix('torch.')} | " + " | ".join(cells) + " |")
