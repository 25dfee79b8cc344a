"""The integer path's products at 1-16 rows on two instruction sets, over more matrices than the caches hold:
COUNT Q4_0 (or FORMAT) matrices of a 3B layer's 8,192 x 3,072, one sweep over all of them timed per ISA, the two
alternating, medians of 5. How a pass's cost grows with its rows (a verify pass is K + 1 rows) where the weights
stream from memory, and whether AMX tiles pay (docs/real-sizes.md).

    PEAGLE_TORCH_THREADS=2 python benchmarks/real_sizes/isa_rows.py [FORMAT [COUNT [ISA ISA]]]
"""
import statistics
import sys

import torch
from sweeps import alternate, packed

fmt = sys.argv[1] if len(sys.argv) > 1 else "q4_0"
count = int(sys.argv[2]) if len(sys.argv) > 2 else 48
isas = sys.argv[3:5] if len(sys.argv) > 4 else ["avx512vnni", "amx"]
g = torch.Generator().manual_seed(0)
ws = packed(fmt, 8192, 3072, count, g)
print(f"{count} {fmt} matrices of 8192 x 3072, {torch.get_num_threads()} threads; ms a sweep, {isas[1]} / {isas[0]}")
for rows in (1, 2, 4, 8, 16):
    x = torch.randn(rows, 3072, generator=g)
    ms = alternate({isa: lambda isa=isa: [torch.ops.peagle.linear(x, w, None, isa) for w in ws] for isa in isas}, 5)
    a, b = (statistics.median(ms[isa]) for isa in isas)
    print(f"rows {rows:2d}: {isas[0]} {a:6.1f}  {isas[1]} {b:6.1f}  {b / a:.2f}x", flush=True)
