"""The CPU peagle runs on: its feature flags, the one torch thread pool sized to the cores this process has, and
oneMKL's math functions settled before threads share them."""
from __future__ import annotations

import functools
import os
from pathlib import Path

import torch


@functools.cache
def cpuinfo(field: str) -> str:
    """The first ``field`` of /proc/cpuinfo (``flags``, ``model name``), or "" where it cannot be read."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(field):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags, as /proc/cpuinfo names them (empty where it cannot be read)."""
    return frozenset(cpuinfo("flags").split())


def cpu_has_native_bf16() -> bool:
    """True where the CPU multiplies bf16 in hardware (AVX512_BF16 or AMX-BF16)."""
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


def cpu_threads() -> int:
    """Threads for the torch pool: ``PEAGLE_TORCH_THREADS``, else ``OMP_NUM_THREADS``, else the cores this
    process may run on (its affinity: ``taskset``, a container's cpuset), not the machine's count. Two
    OpenMP threads on one core wait for each other at every barrier: a decode step pinned to one core
    took 1.4x as long with two."""
    for name in ("PEAGLE_TORCH_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):   # no affinity call on this platform
        return os.cpu_count() or 1


# The float operators ATen hands to oneMKL's VML (ATen/cpu/vml.h, IMPLEMENT_VML_MKL), each thread its chunk of a
# tensor. oneMKL resolves a VML function's kernel on its first call; in oneMKL 2024.2 (torch 2.13's wheels) a first
# call that several threads make at once can run one thread's chunk in a low-accuracy kernel, VML_HA asked for
# (pytorch/pytorch#188792; fixed from oneMKL 2025.0). Here that was the default model's RoPE table: its cos,
# split at 2,048 elements, wrong by up to 2,534 ulps in rows 128-255 in three fresh processes of some 500, and those
# processes' greedy tokens were not plain decoding's (docs/exactness.md).
VML_OPS = ("acos", "asin", "atan", "cos", "erf", "erfc", "erfinv", "exp", "log", "log10", "log2", "sin", "sqrt",
           "tan", "tanh", "trunc")


@functools.cache
def settle_vml() -> None:
    """Each of :data:`VML_OPS` called once on one element (one thread) in float32 and float64, so that oneMKL has
    chosen its kernels before threads share a call (the fix proposed upstream, pytorch/pytorch#188791)."""
    for dtype in (torch.float32, torch.float64):
        x = torch.full((1,), 0.5, dtype=dtype)
        for op in VML_OPS:
            getattr(torch, op)(x)


def configure_cpu() -> None:
    """CPU inference and training: one torch thread pool over the cores this process has (see
    :func:`cpu_threads`), oneMKL's math functions settled (:func:`settle_vml`). One pool only: a second one
    (numpy's OpenBLAS, say) spinning on the same cores slows decoding several-fold."""
    settle_vml()
    torch.set_num_threads(cpu_threads())
