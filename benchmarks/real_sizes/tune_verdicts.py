"""The tiles' tuner (``kernels.tune_streaming``'s timing) run REPEATS times on FILE's packed weights (default: the
default model), each verdict and its seconds printed: whether the tuner's answer is the CPU's or the host's noise.

    PEAGLE_TORCH_THREADS=2 python benchmarks/real_sizes/tune_verdicts.py [FILE [REPEATS]]
"""
import sys
import time

import torch

from peagle import kernels
from peagle.cpu import configure_cpu
from peagle.models.loader import load_target
from peagle.models.quant import packed_matrices

configure_cpu()
target, _ = load_target(sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] else None)
target.pack_for_inference()
weights = packed_matrices(target)
before = tuple(torch.ops.peagle.stream_bytes())
names = {kernels.NARROW: "narrow", kernels.WIDE: "wide", before[0]: "default", before[1]: "default"}
for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 4):
    t = time.perf_counter()
    one_row, taller = kernels._timed_limits(weights, before, 3)
    print(f"one row {names[one_row]}, taller {names[taller]}: {time.perf_counter() - t:.2f} s")
