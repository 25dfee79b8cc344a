import os, sys, time, torch, statistics
from peagle.models.layers import Linear
from peagle.models.loader import load_target
from peagle.models.quant import QuantTensor
nt = int(sys.argv[1]); torch.set_num_threads(nt)
model, _ = load_target(None, device="cpu", compute="fast")
model.pack_for_inference()
ws = [m.weight for m in model.modules() if isinstance(m, Linear) and isinstance(m.weight, QuantTensor) and m.weight.packed][:12]
xs = [torch.randn(8, w.shape[1]) for w in ws]
with torch.inference_mode():
    ts = []
    for _ in range(400):
        t = time.perf_counter()
        for x, w in zip(xs, ws): torch.ops.peagle.linear(x, w.blocks)
        ts.append(time.perf_counter() - t)
print(f"threads {nt} pid {os.getpid()}: median {statistics.median(ts[50:])*1e3:.3f} ms min {min(ts)*1e3:.3f}")
