"""Whether a pass's weight reads and its products overlap: the default model's 210 layer matrices (Q4_1, packed,
as decoding runs them; the LM head left out) at 1 and 8 rows, streamed from memory (every layer's own matrices)
against the same shapes in cache (layer 0's matrices 30 times), two threads, alternating, medians of 60.

    python benchmarks/overlap/overlap.py
"""
import statistics
import time

import torch

from peagle.models.layers import Linear
from peagle.models.loader import load_target
from peagle.models.quant import QuantTensor

import os; torch.set_num_threads(int(os.environ.get("NT", "2")))
model, _ = load_target(None, device="cpu", compute="fast")
layers = [m.weight for name, m in model.named_modules()
          if isinstance(m, Linear) and isinstance(m.weight, QuantTensor) and m.weight.packed and ".layers." in name]
first = [w for w in layers[:len(layers) // 30]] * 30
print(f"{len(layers)} matrices, {sum(w.blocks.numel() for w in layers) / 1e6:.1f} MB streamed; "
      f"{sum(w.blocks.numel() for w in first[:len(layers) // 30]) / 1e6:.2f} MB in cache")
sets = {"streamed": layers, "in cache": first}
times = {(s, r): [] for s in sets for r in (1, 8)}
with torch.inference_mode():
    xs = {r: {w.shape[1]: torch.randn(r, w.shape[1]) for w in layers} for r in (1, 8)}
    for i in range(70):
        for (s, r), ts in times.items():
            t = time.perf_counter()
            for w in sets[s]:
                torch.ops.peagle.linear(xs[r][w.shape[1]], w.blocks)
            if i >= 10:
                ts.append(time.perf_counter() - t)
ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
for k, v in ms.items():
    print(f"{k[0]:>9} {k[1]} rows: {v:.2f} ms")
print(f"8 rows streamed {ms['streamed', 8]:.2f} ms against 1 row streamed + 8 rows in cache "
      f"{ms['streamed', 1] + ms['in cache', 8]:.2f} (no overlap) and their max {max(ms['streamed', 1], ms['in cache', 8]):.2f} (full)")
