import time, torch, sys
from peagle import kernels
from peagle.models.loader import load_target
from peagle.models.layers import Linear
torch.set_num_threads(1)
model, _ = load_target(None, device="cpu", compute="fast")
m = next(m for m in model.modules() if isinstance(m, Linear) and tuple(m.weight.shape) == (3072, 576))
for name, lim in (("wide", (16 << 20, 16 << 20)), ("stream", (0, 0))):
  with kernels.streaming(*lim):
    for rows in (1, 8):
        x = torch.randn(rows, 576)
        best = []
        with torch.inference_mode():
            for _ in range(3):
                for _ in range(300): torch.ops.peagle.linear(x, m.weight.blocks, None, "")
                t = time.perf_counter()
                for _ in range(3000): torch.ops.peagle.linear(x, m.weight.blocks, None, "")
                best.append((time.perf_counter() - t) / 3000 * 1e6)
        macs = rows * 3072 * 576
        print(f"{name} rows {rows}: {min(best):.1f} us; {macs/64/min(best)/1e3:.2f} G zmm-dpbusd/s")
