"""The issue's matmul table on this machine: all of the default model's layer matmuls (the engine's fused
shapes, the real weights) and the LM head, for 1 / 8 / 16 rows, through peagle's kernels: the GGUF's
blocks (Q4_1, the Q8_0 embedding as the head) on the integer path (packed, each of this CPU's integer
instruction sets) and in float32 arithmetic (`--compute exact`), each float weight dtype, against torch's
`mm` (float32, weights [in, out] as the old engine stored them) and torch bf16 (`F.linear`, bf16
activations), with the floor: the weights' bytes over the read bandwidth measured here (torch sum of 1 GiB).

    python docs/results/cpu-roofline/matmuls.py
"""
import statistics
import time

import torch

from peagle import kernels
from peagle.models.layers import Linear
from peagle.models.loader import load_target

assert kernels.available()
model, _ = load_target(None, "float32", device="cpu", quantization="none")
ws32 = [m.weight.detach().contiguous() for m in model.modules() if isinstance(m, Linear)]
head32 = model.model.embed_tokens.weight.detach().contiguous()

def blocks(compute):  # the file as it ships: Q4_1 layers, the Q8_0 embedding as the head
    gguf, _ = load_target(None, device="cpu", compute=compute)
    return [m.weight.blocks for m in gguf.modules() if isinstance(m, Linear)] + [gguf.model.embed_tokens.weight.blocks]


wsq, wsp = blocks("exact"), blocks("fast")
int_isas = list(torch.ops.peagle.int_isas())


def bench(fn, n=20):
    fn()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3


x = torch.randn(256 * 1024 * 1024)
bw = x.numel() * 4 / bench(lambda: x.sum(), 10) / 1e6  # GB/s
del x
print(f"kernels: {kernels.isa()}; read bandwidth {bw:.1f} GB/s\n")
print("| route | 1 row | 8 rows | 16 rows | 8 / 1 | 16 / 1 | floor, 1 row |")
print("|---|---|---|---|---|---|---|")
with torch.inference_mode():
    routes = [(f"GGUF Q4_1 (Q8_0 head), integer path ({isa})", wsp, isa) for isa in int_isas]
    routes += [("GGUF Q4_1 (Q8_0 head), float32 arithmetic", wsq, "")]
    routes += [(f"{dt} weights".removeprefix("torch."), [w.to(dt) for w in ws32] + [head32.to(dt)], "")
               for dt in (torch.float32, torch.float16, torch.bfloat16)]
    for name, ws, isa in routes:
        ms = {}
        for M in (1, 8, 16):
            xs = {K: torch.randn(M, K) for K in (576, 1536)}
            ms[M] = bench(lambda: [torch.ops.peagle.linear(xs[w.shape[1] * (32 if w.dim() == 3 else 1)], w, None, isa)
                                   for w in ws])
        floor = sum(w.numel() * w.element_size() for w in ws) / bw / 1e6
        print(f"| peagle kernel, {name} | {ms[1]:.1f} | {ms[8]:.1f} | {ms[16]:.1f} | {ms[8] / ms[1]:.2f} | "
              f"{ms[16] / ms[1]:.2f} | {floor:.1f} |")
    for name, dt in (("torch `mm` float32, [in, out]", torch.float32), ("torch `F.linear` bf16", torch.bfloat16)):
        ws = [w.t().contiguous().t() if dt == torch.float32 else w.to(dt) for w in ws32 + [head32]]
        ms = {}
        for M in (1, 8, 16):
            xs = {K: torch.randn(M, K, dtype=dt) for K in (576, 1536)}
            ms[M] = bench(lambda: [xs[w.shape[1]] @ w.t() for w in ws])
        print(f"| {name} | {ms[1]:.1f} | {ms[8]:.1f} | {ms[16]:.1f} | {ms[8] / ms[1]:.2f} | {ms[16] / ms[1]:.2f} | |")
