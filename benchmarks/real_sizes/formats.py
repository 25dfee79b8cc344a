"""Packed formats per byte on the integer path: COUNT random N x K matrices of each FORMAT (more bytes than the caches
hold), one sweep over a format's matrices timed at ROWS rows, the formats alternating in one process (the host's
drift hits each alike), medians of 8 after one. Where a file's step loses per byte against Q4_0's, this says whether
the format or the shape does it (docs/real-sizes.md: Zen 3's K-quants). TILES: the kernels' default streaming
limits, ``wide`` (every weight in the wide tiles) or ``narrow`` (one packed group wide): the engine chooses between
them per CPU at start-up (``kernels.tune_streaming``), so time the one it chose.

    PEAGLE_TORCH_THREADS=2 python benchmarks/real_sizes/formats.py N K [FORMATS [COUNT [ROWS [TILES]]]]
"""
import statistics
import sys

import torch
from sweeps import alternate, packed

from peagle import kernels

n, k = int(sys.argv[1]), int(sys.argv[2])
formats = (sys.argv[3] if len(sys.argv) > 3 else "q4_0,q4_k,q6_k").split(",")
count = int(sys.argv[4]) if len(sys.argv) > 4 else 12
rows = int(sys.argv[5]) if len(sys.argv) > 5 else 1
tiles = sys.argv[6] if len(sys.argv) > 6 else "default"
g = torch.Generator().manual_seed(0)
ws = {f: packed(f, n, k, count, g) for f in formats}
x = torch.randn(rows, k, generator=g)
with kernels.tiles(tiles):
    times = alternate({f: lambda f=f: [torch.ops.peagle.linear(x, w) for w in ws[f]] for f in formats}, 8, warm=1)
print(f"{count} matrices {n} x {k}, {rows} row(s), {tiles} tiles, {torch.get_num_threads()} threads, "
      f"{kernels.int_isa()}")
for f in formats:
    gb = sum(w.numel() * w.element_size() for w in ws[f]) / 1e9
    ms = statistics.median(times[f])
    print(f"{f}: {ms:7.2f} ms a sweep of {gb:.2f} GB, {gb / ms * 1e3:5.1f} GB/s (fastest {min(times[f]):.2f} ms)")
