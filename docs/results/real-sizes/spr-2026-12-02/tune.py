import sys, time, torch
from peagle import kernels
from peagle.models.loader import load_target
from peagle.models.quant import packed_matrices
target, _ = load_target(sys.argv[1])
target.pack_for_inference()
ws = packed_matrices(target)
before = tuple(torch.ops.peagle.stream_bytes())
for i in range(int(sys.argv[2])):
    t = time.perf_counter()
    v = kernels._timed_limits(ws, before, 2)
    print({0: "narrow", kernels.WIDE: "wide", before[0]: "default"}.get(v[0]), {0: "narrow", kernels.WIDE: "wide", before[1]: "default"}.get(v[1]), f"{time.perf_counter()-t:.1f} s", flush=True)
