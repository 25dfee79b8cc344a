"""Every layer matmul of a GGUF model (the real weights, packed for the integer path) for 1, 2, 4 and 8 rows
on one instruction set, one thread: the fastest of 25 passes over all of them (ms). The weights stream from
memory as in decoding (the default model's 67 MB of layers do not fit the caches).

    taskset -c 0 python benchmarks/tiles/layer_matmuls.py [ISA] [MODEL]   # ISA: avx512vnni (default), avxvnni, avx2
"""
import sys
import time

import torch

from peagle import kernels
from peagle.models.layers import Linear
from peagle.models.loader import load_target

assert kernels.available()
torch.set_num_threads(int(__import__("os").environ.get("THREADS", 1)))
isa = sys.argv[1] if len(sys.argv) > 1 else "avx512vnni"
model, _ = load_target(sys.argv[2] if len(sys.argv) > 2 else None, device="cpu", compute="fast")
mods = [m for m in model.modules() if isinstance(m, Linear)]
cells = []
with torch.inference_mode():
    for rows in (1, 2, 4, 8):
        xs = [torch.randn(rows, m.weight.shape[1]) for m in mods]

        def run():
            for x, m in zip(xs, mods):
                torch.ops.peagle.linear(x, m.weight.blocks, None, isa)
        run()
        times = []
        for _ in range(25):
            t = time.perf_counter()
            run()
            times.append(time.perf_counter() - t)
        cells.append(f"{min(times) * 1e3:.2f}")
print(f"| {isa} | {len(mods)} matrices | " + " | ".join(cells) + " |")
