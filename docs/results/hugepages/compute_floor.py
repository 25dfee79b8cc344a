"""Where 8 verify rows' integer matmuls stand against their arithmetic: one layer's four matrices timed hot (in
cache, fastest of 50, times 30 layers: the arithmetic alone, each call's fork included) against every layer matrix
streamed from memory as a pass reads them (fastest / median of 10), 1 and 8 rows, one packed group wide, two threads.

    python docs/results/hugepages/compute_floor.py
"""
import time, statistics, torch, sys
from peagle import kernels
from peagle.models.layers import Linear
from peagle.models.loader import load_target
from peagle.models.quant import QuantTensor
torch.set_num_threads(2)
model, _ = load_target(None, device="cpu", compute="fast")
model.pack_for_inference()
ws = [m.weight for m in model.modules() if isinstance(m, Linear) and isinstance(m.weight, QuantTensor) and m.weight.packed]
with torch.inference_mode(), kernels.streaming(0, 0):
    for rows in (1, 8):
        xs = [torch.randn(rows, w.shape[1]) for w in ws]
        hot = 0.0
        for x, w in zip(xs[:4], ws[:4]):  # one layer's 4 matrices, hot
            ts = []
            for _ in range(50):
                t = time.perf_counter(); torch.ops.peagle.linear(x, w.blocks); ts.append(time.perf_counter() - t)
            hot += min(ts)
        cold = []
        for _ in range(10):
            t = time.perf_counter(); [torch.ops.peagle.linear(x, w.blocks) for x, w in zip(xs, ws)]; cold.append(time.perf_counter() - t)
        print(f"rows {rows}: hot x30 layers {hot*30*1e3:.2f} ms, streamed all {min(cold)*1e3:.2f} / {statistics.median(cold)*1e3:.2f} ms")
