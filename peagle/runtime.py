"""Where and in what precision peagle runs: ``--device`` and ``--dtype``, resolved as vLLM names them.

``auto`` picks CUDA when present; the dtype is bfloat16 on CUDA and on CPUs that multiply bf16
natively (AVX512_BF16 or AMX), float32 elsewhere (float16 has no fast CPU GEMM).
"""
from __future__ import annotations

import functools
import os
from pathlib import Path

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_CHOICES = ("auto", *DTYPES)
DEVICE_HELP = "auto (CUDA when present), cpu, cuda or cuda:N"


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags, as /proc/cpuinfo names them (empty where it cannot be read)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_has_native_bf16() -> bool:
    """True where the CPU multiplies bf16 in hardware (AVX512_BF16 or AMX-BF16)."""
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


def configure_cpu() -> None:
    """CPU inference and training: one torch thread pool over every core (``PEAGLE_TORCH_THREADS``
    overrides). One pool only: a second one (numpy's OpenBLAS, say) spinning on the same cores slows
    decoding several-fold."""
    torch.set_num_threads(int(os.environ.get("PEAGLE_TORCH_THREADS", 0)) or os.cpu_count() or 1)


def resolve_device(name: str | torch.device | None = "auto") -> torch.device:
    """``auto``/None -> ``cuda`` when available, else ``cpu``; anything else is checked."""
    if isinstance(name, torch.device):
        return name
    if name in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ValueError(f"unknown device {name!r}; use {DEVICE_HELP}") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device {name!r}; use {DEVICE_HELP}")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {name!r} asked for, but CUDA is not available here")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device {name!r} asked for, but there are {torch.cuda.device_count()} CUDA devices")
    return dev


def resolve_dtype(name: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """``auto``/None -> bfloat16 on CUDA and on native-bf16 CPUs, else float32."""
    if isinstance(name, torch.dtype):
        return name
    if name in (None, "", "auto"):
        return torch.bfloat16 if device.type == "cuda" or cpu_has_native_bf16() else torch.float32
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPE_CHOICES)}")
    return DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def add_runtime_args(p, engine: bool = False) -> None:
    """``--dtype`` and ``--device`` for a command-line parser, as vLLM names them; with ``engine``
    (commands that run the engine) ``--enforce-eager`` too."""
    p.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto",
                   help="weights and activations: auto = bfloat16 on CUDA and on CPUs with native bf16, else float32")
    p.add_argument("--device", default="auto", help=DEVICE_HELP)
    if engine:
        p.add_argument("--enforce-eager", action="store_true",
                       help="CUDA: run decode steps eagerly, without CUDA graphs (the CPU always does)")


def to_device(data: list, device: torch.device, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """A host list as a tensor on ``device``: built on the CPU (named, so a default device never
    leaks in), then copied from pinned memory without blocking the host on CUDA."""
    t = torch.tensor(data, dtype=dtype, device="cpu")
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t if device.type == "cpu" else t.to(device)
