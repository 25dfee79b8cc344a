import time, torch, sys
from peagle.models.loader import load_target
from peagle.models.layers import Linear
torch.set_num_threads(1)
model, _ = load_target(None, device="cpu", compute="fast")
model.pack_for_inference()
m = next(m for m in model.modules() if isinstance(m, Linear) and tuple(m.weight.shape) == (3072, 576))
print(m.weight.format, m.weight.blocks.shape, m.weight.blocks.numel()/1e6, "MB")
for rows in (1, 4, 8):
    x = torch.randn(rows, 576)
    best = []
    with torch.inference_mode():
        for _ in range(3):
            for _ in range(500): torch.ops.peagle.linear(x, m.weight.blocks, None, "")
            t = time.perf_counter()
            for _ in range(5000): torch.ops.peagle.linear(x, m.weight.blocks, None, "")
            best.append((time.perf_counter() - t) / 5000 * 1e6)
    macs = rows * 3072 * 576
    print(f"rows {rows}: {min(best):.1f} us; {macs/64/min(best)/1e3:.2f} G zmm-dpbusd-equivalents/s (peak ~3.6)")
