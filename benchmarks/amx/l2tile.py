"""The default model's gate_up matrix (3,072 x 576 Q4_1) in cache, one thread: rows 1, 4 and 8 through the
tiles the kernels choose, or with ``shapes`` rows 1 and 8 in both tile shapes (wide, and one packed group wide
as streamed weights take); the fastest of three runs of 5,000 calls.

    python benchmarks/amx/l2tile.py [shapes]
"""
import sys
import time

import torch

from peagle import kernels
from peagle.models.layers import Linear
from peagle.models.loader import load_target

torch.set_num_threads(1)
model, _ = load_target(None, device="cpu", compute="fast")
model.pack_for_inference()
m = next(m for m in model.modules() if isinstance(m, Linear) and tuple(m.weight.shape) == (3072, 576))
print(m.weight.format, m.weight.blocks.shape, m.weight.blocks.numel()/1e6, "MB")
shapes = [("wide", (16 << 20, 16 << 20)), ("stream", (0, 0))] if sys.argv[1:] == ["shapes"] else [("", None)]
for name, limits in shapes:
    for rows in ((1, 8) if limits else (1, 4, 8)):
        x = torch.randn(rows, 576)
        best = []
        with torch.inference_mode(), kernels.streaming(*(limits or torch.ops.peagle.stream_bytes())):
            for _ in range(3):
                for _ in range(500): torch.ops.peagle.linear(x, m.weight.blocks, None, "")
                t = time.perf_counter()
                for _ in range(5000): torch.ops.peagle.linear(x, m.weight.blocks, None, "")
                best.append((time.perf_counter() - t) / 5000 * 1e6)
        macs = rows * 3072 * 576
        print(f"{name} rows {rows}: {min(best):.1f} us; {macs/64/min(best)/1e3:.2f} G zmm-dpbusd-equivalents/s (peak ~3.6)".strip())
