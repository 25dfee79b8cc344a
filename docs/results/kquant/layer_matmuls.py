"""Per-layer matmul times on the Gemma file: each quantized linear of two layers (one with Q6_K down and
Q8_0 q/k/v, one with Q4_K down and Q5_0 q/k/v), 1 and 8 rows: the float32 path on the file's blocks and the
integer path on packed ones (Q5_0 also re-encoded as Q8_0: the 5-bit values expanded to int8)."""
import time, torch
from peagle.models.loader import gemma_gguf, load_target
from peagle.models.quant import QuantTensor, pack, as_q8_0
torch.set_num_threads(1)
model, _ = load_target(str(gemma_gguf()), "float32", compute="exact")
def bench(w, m):
    x = torch.randn(m, w.shape[1] if w.dim() == 2 else 0) if False else torch.randn(m, K[id(w)])
    f = lambda: torch.ops.peagle.linear(x, w)
    f(); t0 = time.perf_counter(); n = 0
    while time.perf_counter() - t0 < 0.2: f(); n += 1
    best = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(max(1, n // 5)): f()
        best.append((time.perf_counter() - t0) / max(1, n // 5))
    return min(best) * 1e3
K = {}
layers = model.model.layers
pick = [next(i for i, l in enumerate(layers) if l.mlp.down_proj.weight.format == f) for f in ("q6_k", "q4_k")]
for li in pick:
    for name, p in layers[li].named_parameters():
        if not isinstance(p, QuantTensor):
            continue
        ws = {"float": p.blocks, "int": pack(p.blocks)}
        if p.format == "q5_0":
            ws["int (as q8_0)"] = pack(as_q8_0(p.blocks))
        for kind, w in ws.items():
            K[id(w)] = p.shape[1]
            print(f"layer {li:2d} {name.split('.')[1]:13s} {p.format} {tuple(p.shape)} {kind:14s} 1 row {bench(w, 1):.4f} ms  8 rows {bench(w, 8):.4f} ms", flush=True)
