"""Each packed matrix of a model timed alone at 1 row, in decoding's order, medians of 5 sweeps after one; GB/s
by packed format and shape, under each of the tiles' streaming settings `kernels.tune_streaming` chooses from
(`kernels.tiles`: narrow, one packed group wide everywhere; the kernels' default; wide everywhere): where a
K-quant file's step loses per byte against Q4_0's (docs/real-sizes.md).

    PEAGLE_TORCH_THREADS=2 python benchmarks/real_sizes/matrices.py FILE.gguf
"""
import collections
import statistics
import sys
import time

import torch

from peagle import kernels
from peagle.cpu import configure_cpu
from peagle.models.loader import load_target
from peagle.models.quant import PACKED, packed_matrices

configure_cpu()
target, _ = load_target(sys.argv[1])
ms = packed_matrices(target)
xs = [torch.randn(1, w.shape[1]) for w in ms]
for name in ("narrow", "default", "wide"):
    print(f"-- {name}" + " (one group wide)" * (name == "narrow"))
    each: list[list[float]] = [[] for _ in ms]
    sweeps: list[float] = []
    with kernels.tiles(name):
        for r in range(6):  # the first sweep warms the pages and the threads
            start = time.perf_counter()
            for x, w, ts in zip(xs, ms, each):
                t = time.perf_counter()
                torch.ops.peagle.linear(x, w.blocks)
                ts.append(time.perf_counter() - t)
            sweeps.append(time.perf_counter() - start)
    by = collections.defaultdict(lambda: [0.0, 0])  # (format, shape) -> seconds, bytes
    for w, ts in zip(ms, each):
        k = by[PACKED[w.blocks.shape[-1]].name, tuple(w.shape)]
        k[0] += statistics.median(ts[1:])
        k[1] += w.blocks.numel()
    for (fmt, shape), (t, b) in sorted(by.items(), key=lambda kv: -kv[1][0]):
        print(f"{fmt} {shape}: {t * 1e3:6.2f} ms {b / 1e6:7.1f} MB {b / t / 1e9:5.1f} GB/s")
    total, sweep = sum(b for _, b in by.values()), statistics.median(sweeps[1:])
    print(f"{total / 1e6:.0f} MB: a sweep {sweep * 1e3:.1f} ms, {total / sweep / 1e9:.1f} GB/s")
