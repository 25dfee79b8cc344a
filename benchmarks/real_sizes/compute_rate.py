"""The integer path's arithmetic alone: one random N x K matrix of each FORMAT small enough for a core's L2, called
CALLS times a sweep at ROWS rows each (1,2,4,8 by default), the formats alternating in one process, medians of 5
after one. Weights a second and integer products a second (GMAC/s): what one core multiplies when memory is not
the limit. Where a format's streamed GB/s (formats.py) falls short of Q4_0's, this says whether its arithmetic can
keep up at all (docs/real-sizes.md). TILES: ``wide`` (the default here), ``narrow`` or ``default``, as formats.py's.

    PEAGLE_TORCH_THREADS=1 python benchmarks/real_sizes/compute_rate.py [N K [FORMATS [ROWS [CALLS [TILES]]]]]
"""
import statistics
import sys

import torch
from sweeps import alternate, packed

from peagle import kernels

n = int(sys.argv[1]) if len(sys.argv) > 1 else 512
k = int(sys.argv[2]) if len(sys.argv) > 2 else 4096
formats = (sys.argv[3] if len(sys.argv) > 3 else "q4_0,q4_k,q6_k,q8_0").split(",")
heights = [int(r) for r in (sys.argv[4] if len(sys.argv) > 4 else "1,2,4,8").split(",")]
calls = int(sys.argv[5]) if len(sys.argv) > 5 else 300
tiles = sys.argv[6] if len(sys.argv) > 6 else "wide"
g = torch.Generator().manual_seed(0)
ws = {f: packed(f, n, k, 1, g)[0] for f in formats}
print(f"{n} x {k}, {calls} calls a sweep, {tiles} tiles, {torch.get_num_threads()} threads, {kernels.int_isa()}")
with kernels.tiles(tiles):
    for rows in heights:
        x = torch.randn(rows, k, generator=g)
        times = alternate({f: lambda f=f: [torch.ops.peagle.linear(x, ws[f]) for _ in range(calls)] for f in formats},
                          5, warm=1)
        for f in formats:
            s = statistics.median(times[f]) / 1e3 / calls
            print(f"{rows} row(s) {f}: {s * 1e6:7.1f} us a call, {n * k / s / 1e9:5.1f} G weights/s, "
                  f"{rows * n * k / s / 1e9:6.1f} GMAC/s, {ws[f].numel() / s / 1e9:5.1f} GB/s")
