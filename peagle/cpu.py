"""The CPU peagle runs on: its feature flags, and the one torch thread pool sized to the cores this process has."""
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


def configure_cpu() -> None:
    """CPU inference and training: one torch thread pool over the cores this process has (see
    :func:`cpu_threads`). One pool only: a second one (numpy's OpenBLAS, say) spinning on the same cores
    slows decoding several-fold."""
    torch.set_num_threads(cpu_threads())
