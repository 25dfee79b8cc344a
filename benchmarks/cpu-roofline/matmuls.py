"""The issue's matmul table on this machine: all of the default model's layer matmuls (the engine's fused
shapes, the real weights) and the LM head, for 1 / 8 / 16 rows, through peagle's kernels: the GGUF's
blocks (Q4_1, the Q8_0 embedding as the head) on the integer path (packed, each of this CPU's integer
instruction sets) and in float32 arithmetic (`--compute exact`), each float weight dtype, bf16 weights packed
for the bf16 dot-product path (`--compute fast`, where the CPU has AVX512_BF16), against torch's `mm`
(float32, weights [in, out] as the old engine stored them) and torch bf16 (`F.linear`, bf16 activations),
with the floor: the weights' bytes over the read bandwidth measured here (torch sum of 1 GiB). Rounds
interleave the routes; medians (ms for all of them once).

    python benchmarks/cpu-roofline/matmuls.py
    taskset -c 0 env OMP_NUM_THREADS=1 python benchmarks/cpu-roofline/matmuls.py    # one thread
"""
import statistics
import time

import torch

from peagle import kernels
from peagle.models.layers import Linear
from peagle.models.loader import load_target
from peagle.models.quant import BF16_PAIR, pack_bf16

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


def interleaved(fns: dict, n=20) -> dict:
    """Each of ``fns`` timed once a round, round after round: medians in ms."""
    for fn in fns.values():
        fn()
    ts = {name: [] for name in fns}
    for _ in range(n):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            ts[name].append(time.perf_counter() - t)
    return {name: statistics.median(t) * 1e3 for name, t in ts.items()}


def cols(w: torch.Tensor) -> int:  # the K a weight as the kernels take it multiplies
    return w.shape[1] if w.dim() == 2 else w.shape[1] * (2 if w.shape[2] == BF16_PAIR else 32)


x = torch.randn(256 * 1024 * 1024)
bw = x.numel() * 4 / bench(lambda: x.sum(), 10) / 1e6  # GB/s
del x
print(f"kernels: {kernels.isa()}; {torch.get_num_threads()} thread(s); read bandwidth {bw:.1f} GB/s\n")
print("| route | 1 row | 8 rows | 16 rows | 8 / 1 | 16 / 1 | floor, 1 row |")
print("|---|---|---|---|---|---|---|")
with torch.inference_mode():
    routes = [(f"GGUF Q4_1 (Q8_0 head), integer path ({isa})", wsp, isa) for isa in int_isas]
    routes += [("GGUF Q4_1 (Q8_0 head), float32 arithmetic", wsq, "")]
    routes += [(f"{dt} weights".removeprefix("torch."), [w.to(dt) for w in ws32] + [head32.to(dt)], "")
               for dt in (torch.float32, torch.float16, torch.bfloat16)]
    if kernels.bf16_isa() != "none":
        routes += [(f"bfloat16 weights, bf16 dot products ({kernels.bf16_isa()})",
                    [pack_bf16(w.to(torch.bfloat16)) for w in ws32 + [head32]], "")]
    torch_routes = [(f"torch {name}", [w.t().contiguous().t() if dt == torch.float32 else w.to(dt) for w in ws32 + [head32]], dt)
                    for name, dt in (("`mm` float32, [in, out]", torch.float32), ("`F.linear` bf16", torch.bfloat16))]
    ms = {}
    for M in (1, 8, 16):
        xs = {(K, dt): torch.randn(M, K, dtype=dt) for K in (576, 1536) for dt in (torch.float32, torch.bfloat16)}
        fns = {f"peagle kernel, {name}": lambda ws=ws, isa=isa: [
            torch.ops.peagle.linear(xs[cols(w), torch.float32], w, None, isa) for w in ws] for name, ws, isa in routes}
        fns.update({name: lambda ws=ws, dt=dt: [xs[w.shape[1], dt] @ w.t() for w in ws] for name, ws, dt in torch_routes})
        for name, t in interleaved(fns).items():
            ms[name, M] = t
    for name, ws in [(f"peagle kernel, {n}", ws) for n, ws, _ in routes] + [(n, None) for n, _, _ in torch_routes]:
        floor = f"{sum(w.numel() * w.element_size() for w in ws) / bw / 1e6:.1f}" if ws else ""
        print(f"| {name} | {ms[name, 1]:.1f} | {ms[name, 8]:.1f} | {ms[name, 16]:.1f} | {ms[name, 8] / ms[name, 1]:.2f} | "
              f"{ms[name, 16] / ms[name, 1]:.2f} | {floor} |")
