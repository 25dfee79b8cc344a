"""What `isa_rows.py` and `formats.py` share: random packed GGUF matrices, more bytes than the caches hold, and
sweeps over them timed with the variants alternating in one process (the host's drift hits each alike)."""
from collections.abc import Callable
import time

import torch

from peagle import kernels
from peagle.cpu import configure_cpu
from peagle.models.amx_probe import random_blocks
from peagle.models.quant import pack


def packed(fmt: str, n: int, k: int, count: int, g: torch.Generator) -> list[torch.Tensor]:
    """``count`` random n x k matrices of ``fmt``, packed for the integer path (the native kernels loaded first)."""
    configure_cpu()
    assert kernels.available(), "the native kernels are not built (make setup)"
    return [pack(random_blocks(fmt, n, k, g)) for _ in range(count)]


def alternate(sweeps: dict[str, Callable[[], None]], reps: int, warm: int = 0) -> dict[str, list[float]]:
    """Each sweep's ms over ``reps`` rounds, the sweeps in turn within a round; the first ``warm`` rounds (pages,
    threads) not kept."""
    ms: dict[str, list[float]] = {name: [] for name in sweeps}
    for r in range(warm + reps):
        for name, sweep in sweeps.items():
            t = time.perf_counter()
            sweep()
            if r >= warm:
                ms[name].append((time.perf_counter() - t) * 1e3)
    return ms
