"""peagle's CPU attention kernel alone (the cache warm): 30 layers' worth of one layer's call (9 query heads,
3 KV heads, head_dim 64: the default model) at a context of CTX positions, for 1-16 rows of one sequence.

    taskset -c 0 env OMP_NUM_THREADS=1 python benchmarks/zen5-2/profile/attention.py [CTX]
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
k, v = torch.randn(SLOTS, HKV, D), torch.randn(SLOTS, HKV, D)
for rows in (1, 2, 4, 8, 16):
    meta = AttnMeta([Span(rows, ctx + rows, list(range(-(-(ctx + rows) // BS))), ctx)], BS).prepare(
        torch.arange(ctx, ctx + rows), SLOTS)
    q = torch.randn(rows, H, D)

    def call():
        return torch.ops.peagle.attention(q, k, v, meta.table, meta.seq_of_row, meta.positions, meta.short_rows, BS, 0,
                                          0.125, None)
    for _ in range(5):
        call()
    times = []
    for _ in range(200):
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    us = statistics.median(times) * 1e6
    print(f"context {ctx}, {rows} rows: {us:.1f} us a layer, {us * 30 / 1000:.2f} ms for 30 layers")
