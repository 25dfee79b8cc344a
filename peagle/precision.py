"""Where and in what precision peagle runs: ``--device`` and ``--dtype``, resolved as vLLM names them.

``--dtype`` names the weights' dtype. On CUDA the arithmetic runs in it too (bfloat16 for ``auto``).
On the CPU, where peagle's native kernels run (:mod:`peagle.kernels`), the arithmetic is float32
whatever the weights are, as in llama.cpp's F32/F16/BF16 files: a decode step reads the weights once
(16-bit weights: half the bytes) and every row's result is the same bits however many rows share the
pass (``--compute fast`` multiplies bfloat16 weights by bf16-rounded activations where the CPU has
AVX512_BF16, accumulating in float32). ``auto`` there is bfloat16 weights (faster end to end than float16 on Zen 5:
widening bf16 is a shift). Without the kernels
the CPU falls back to torch's matmul with one dtype for both, and ``auto`` is float32 there: torch's bfloat16
matmul rounds a row differently in a pass over several rows (an Emerald Rapids Xeon's batched synth gave
other greedy tokens), and speculation equals plain decoding only where a row's result does not depend on the pass.
"""
from __future__ import annotations

import torch

from peagle.kernels import table
from peagle.cpu import cpu_has_native_bf16

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_CHOICES = ("auto", *DTYPES)
QUANTIZATION_CHOICES = ("gguf", "none")
LOAD_FORMATS = ("auto", "dummy")  # vLLM's names: the checkpoint's weights, or random ones at its dimensions
COMPUTE_CHOICES = ("fast", "exact")
DEVICE_HELP = "auto (CUDA when present), cpu, cuda or cuda:N"


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


def multiplies_bf16(device: torch.device) -> bool:
    """Whether torch multiplies bfloat16 natively on ``device``: CUDA, and CPUs with AVX512_BF16 or AMX."""
    return device.type == "cuda" or cpu_has_native_bf16()


def resolve_dtype(name: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """The weights' dtype. ``auto``/None -> bfloat16 on CUDA and on the CPU with the native kernels; float32 on
    torch's CPU fallback, the one dtype whose passes gave a row the same bits however many rows shared them."""
    if isinstance(name, torch.dtype):
        return name
    if name in (None, "", "auto"):
        return torch.bfloat16 if device.type == "cuda" or table.on_device(device) else torch.float32
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPE_CHOICES)}")
    return DTYPES[name]


def autocast_dtype(name: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """Training's autocast dtype. ``auto``: bfloat16 where the device multiplies it natively (CUDA; CPUs with
    AVX512_BF16 or AMX), else float32. Not :func:`resolve_dtype`'s ``auto``: training's matmuls are torch's, not
    the native kernels, and without native bf16 torch emulates it (a training step 21x slower on a Zen 3)."""
    if name in (None, "", "auto"):
        return torch.bfloat16 if multiplies_bf16(device) else torch.float32
    return resolve_dtype(name, device)


def compute_dtype(weights: torch.dtype, device: torch.device) -> torch.dtype:
    """The activations' (and KV cache's) dtype for weights in ``weights``: float32 where the native CPU
    kernels run, else the weights' own."""
    return torch.float32 if table.on_device(device) else weights


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def precision_name(weights: torch.dtype, compute: torch.dtype) -> str:
    """``bfloat16``, or ``float16 weights, float32 compute`` where the two differ."""
    if weights == compute:
        return dtype_name(weights)
    return f"{dtype_name(weights)} weights, {dtype_name(compute)} compute"
