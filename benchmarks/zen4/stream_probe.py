"""Every layer matmul of the default model (the shipped GGUF packed for the integer path, or `bf16`: its bfloat16
weights packed for vdpbf16ps) at 1, 4 and 8 rows under the default tiles and one packed group wide (kernels.streaming),
alternating, two threads (the engine's); ms per pass over all 120, median / fastest of ROUNDS, bits checked equal.

    python benchmarks/zen4/stream_probe.py [ROUNDS] [gguf|bf16]
"""
import statistics
import sys
import time

import torch

from peagle import kernels
from peagle.models.layers import Linear
from peagle.models.loader import load_target
from peagle.models.quant import QuantTensor

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 12
how = dict(dtype="bfloat16", quantization="none") if len(sys.argv) > 2 and sys.argv[2] == "bf16" else {}
torch.set_num_threads(2)
model, _ = load_target(None, device="cpu", compute="fast", **how)
model.pack_for_inference()
ws = [m.weight for m in model.modules() if isinstance(m, Linear) and isinstance(m.weight, QuantTensor) and m.weight.packed]
settings = {"default (16 MiB)": 16 << 20, "one group wide (0)": 0}
print(f"{len(ws)} packed {ws[0].format} matrices, {sum(w.blocks.numel() for w in ws) / 1e6:.1f} MB; {rounds} rounds\n")
print("| tiles | " + " | ".join(f"{r} rows, median / fastest" for r in (1, 4, 8)) + " |\n|---|---|---|---|")
cells = {s: [] for s in settings}
with torch.inference_mode():
    for rows in (1, 4, 8):
        xs = [torch.randn(rows, w.shape[1]) for w in ws]
        times, ref = {s: [] for s in settings}, None
        for i in range(rounds + 1):
            for s, limit in settings.items():
                with kernels.streaming(limit, limit):
                    t = time.perf_counter()
                    out = [torch.ops.peagle.linear(x, w.blocks) for x, w in zip(xs, ws)]
                    if i:
                        times[s].append((time.perf_counter() - t) * 1e3)
                ref = ref or out
                assert all(torch.equal(a, b) for a, b in zip(ref, out))
        for s in settings:
            cells[s].append(f"{statistics.median(times[s]):.2f} / {min(times[s]):.2f}")
for s in settings:
    print(f"| {s} | " + " | ".join(cells[s]) + " |")
