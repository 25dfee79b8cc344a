"""The default model's LM head (49,152 x 576 Q8_0, 28 MB: a one-stream tile) for 1, 2 and 8 rows on one instruction set:
the fastest of 30 (ms). THREADS=n for n threads.

    taskset -c 0 python benchmarks/tiles/lm_head.py ISA
"""
import sys, time, torch
from peagle import kernels
from peagle.models.loader import load_target
assert kernels.available()
torch.set_num_threads(int(__import__("os").environ.get("THREADS", 1)))
isa = sys.argv[1]
g, _ = load_target(None, device="cpu", compute="fast")
w = g.lm_weight.blocks
out = []
with torch.inference_mode():
    for M in (1, 2, 8):
        x = torch.randn(M, 576)
        torch.ops.peagle.linear(x, w, None, isa); ts = []
        for _ in range(30):
            t = time.perf_counter(); torch.ops.peagle.linear(x, w, None, isa); ts.append(time.perf_counter() - t)
        out.append(f"{M}:{min(ts)*1e3:.2f}")
print(isa, " ".join(out))
