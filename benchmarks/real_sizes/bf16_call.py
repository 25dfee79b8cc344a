"""One bf16 linear's time a call: a random N x K matrix packed for the bf16 path, one row, CALLS calls a round,
the median of 5 rounds after one. What a call costs beyond its arithmetic (docs/real-sizes.md: the CPUID that the
bf16 path's selection once asked at every call).

    PEAGLE_TORCH_THREADS=1 python benchmarks/real_sizes/bf16_call.py [N K [CALLS]]
"""
import statistics
import sys
import time

import torch

from peagle import kernels
from peagle.cpu import configure_cpu
from peagle.models.quant import pack_bf16

n = int(sys.argv[1]) if len(sys.argv) > 1 else 512
k = int(sys.argv[2]) if len(sys.argv) > 2 else 4096
calls = int(sys.argv[3]) if len(sys.argv) > 3 else 500
configure_cpu()
assert kernels.available(), "the native kernels are not built (make setup)"
w = pack_bf16(torch.randn(n, k, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16))
x = torch.randn(1, k)
times = []
for _ in range(6):
    t = time.perf_counter()
    for _ in range(calls):
        torch.ops.peagle.linear(x, w)
    times.append((time.perf_counter() - t) / calls * 1e6)
print(f"{kernels.bf16_isa()}: bf16 {n} x {k}, 1 row: {statistics.median(times[1:]):.1f} us a call")
