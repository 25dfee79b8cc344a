"""Where and in what precision peagle runs: ``--device`` and ``--dtype``, resolved as vLLM names them.

``--dtype`` names the weights' dtype. On CUDA the arithmetic runs in it too (bfloat16 for ``auto``).
On the CPU, where peagle's native kernels run (:mod:`peagle.kernels`), the arithmetic is float32
whatever the weights are, as in llama.cpp's F32/F16/BF16 files: a decode step reads the weights once
(16-bit weights: half the bytes) and every row's result is the same bits however many rows share the
pass (``--compute fast`` multiplies bfloat16 weights by bf16-rounded activations where the CPU has
AVX512_BF16, accumulating in float32). ``auto`` there is bfloat16 weights (faster end to end than float16 on Zen 5:
widening bf16 is a shift). Without the kernels
the CPU falls back to torch's matmul with one dtype for both: bfloat16 on CPUs that multiply it
natively (AVX512_BF16 or AMX), else float32.
"""
from __future__ import annotations

import atexit
import ctypes
import functools
import gc
import mmap
import os
from pathlib import Path

import torch

from peagle import kernels

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_CHOICES = ("auto", *DTYPES)
QUANTIZATION_CHOICES = ("gguf", "none")
LOAD_FORMATS = ("auto", "dummy")  # vLLM's names: the checkpoint's weights, or random ones at its dimensions
COMPUTE_CHOICES = ("fast", "exact")
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


def freeze_long_lived() -> None:
    """Freeze every object alive now for the cyclic collector (``gc.freeze``: never walked again): called where
    what exists will live as long as the process (the CLI's imports, a model loaded with its tokenizer). Walking
    those millions of objects again at every full collection cost ~1 s of `peagle generate`'s
    start. A frozen object is still freed when its last reference goes; only a cycle of them
    waits, until exit, when they are unfrozen for the interpreter's last collection (native extensions that
    count their objects, nanobind's, report the rest as leaks)."""
    gc.freeze()
    _unfreeze_at_exit()


@functools.cache
def _unfreeze_at_exit() -> None:
    atexit.register(gc.unfreeze)


def trim_heap() -> None:
    """Free what reference cycles hold, then hand the C heap's free pages back to the OS (glibc's
    ``malloc_trim``; elsewhere nothing): parsing a tokenizer or reading a checkpoint frees hundreds of MB of
    small blocks between live ones, which glibc keeps resident otherwise (Gemma 3's tokenizer: 270 MB). The
    loaders call it as a model and its tokenizer arrive: what survives is theirs, frozen
    (:func:`freeze_long_lived`)."""
    gc.collect()
    freeze_long_lived()
    try:
        libc = ctypes.CDLL(None)
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc
        return
    trim(0)


HUGE_PAGE = 2 << 20


def anonymous_memory(size: int, huge: bool = False) -> torch.Tensor:
    """``size`` bytes (uint8) of fresh private anonymous memory: zeros that take memory only where written (a read
    of an untouched page maps the shared zero page). ``huge``: asked to be backed by 2 MB pages (Linux's
    ``MADV_HUGEPAGE``: transparent huge pages are often granted only where asked for) and starting at a 2 MB
    boundary; a plain mapping where the system takes no such advice. The tensor keeps the mapping alive."""
    pages = mmap.mmap(-1, size + (HUGE_PAGE if huge else 0), flags=mmap.MAP_PRIVATE)  # (shared would be shmem)
    if huge and hasattr(mmap, "MADV_HUGEPAGE"):
        pages.madvise(mmap.MADV_HUGEPAGE)
    whole = torch.frombuffer(pages, dtype=torch.uint8)
    at = -whole.data_ptr() % HUGE_PAGE if huge else 0
    return whole[at:at + size]


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
    """The weights' dtype. ``auto``/None -> bfloat16 on CUDA and on the CPU with the native kernels;
    without them bfloat16 on native-bf16 CPUs, else float32."""
    if isinstance(name, torch.dtype):
        return name
    if name in (None, "", "auto"):
        if device.type == "cuda":
            return torch.bfloat16
        return torch.bfloat16 if kernels.on_device(device) or cpu_has_native_bf16() else torch.float32
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPE_CHOICES)}")
    return DTYPES[name]


def compute_dtype(weights: torch.dtype, device: torch.device) -> torch.dtype:
    """The activations' (and KV cache's) dtype for weights in ``weights``: float32 where the native CPU
    kernels run, else the weights' own."""
    return torch.float32 if kernels.on_device(device) else weights


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def precision_name(weights: torch.dtype, compute: torch.dtype) -> str:
    """``bfloat16``, or ``float16 weights, float32 compute`` where the two differ."""
    if weights == compute:
        return dtype_name(weights)
    return f"{dtype_name(weights)} weights, {dtype_name(compute)} compute"


def add_quantization_arg(p) -> None:
    """``--quantization``, ``--load-format`` (vLLM's names) and ``--compute`` for every command that loads a target."""
    from peagle.models.quant import FORMATS

    p.add_argument("--quantization", choices=QUANTIZATION_CHOICES + tuple(FORMATS), default=None,
                   help="gguf (the default for a .gguf target, the default model's too): its GGUF matrices "
                        "run as stored on peagle's CPU kernels; none: de-quantize the weights into --dtype; a block "
                        "format (q4_0, q4_k, ...): with --load-format dummy, random blocks of that format")
    p.add_argument("--load-format", choices=LOAD_FORMATS, default="auto",
                   help="auto: the target's weights; dummy: random weights at its dimensions (--target: a preset "
                        "such as llama-3.1-8b, a HF folder, a config.json or a .gguf file), as vLLM's")
    p.add_argument("--compute", choices=COMPUTE_CHOICES, default="fast",
                   help="fast (default): GGUF blocks through integer dot products, each row's activations rounded to "
                        "8 bits as llama.cpp does, and bfloat16 weights through bf16 dot products where the CPU has "
                        "AVX512_BF16 (batch-invariant: speculation stays exact); exact: float32 arithmetic on the "
                        "de-quantized or bf16 weights, bit for bit")


def add_runtime_args(p, engine: bool = False) -> None:
    """``--dtype`` and ``--device`` for a command-line parser, as vLLM names them; with ``engine``
    (commands that run the engine) ``--enforce-eager`` too."""
    p.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto",
                   help="the weights' dtype: auto = bfloat16 (on CUDA the arithmetic too; on the CPU the arithmetic "
                        "is float32 whatever the weights)")
    p.add_argument("--device", default="auto", help=DEVICE_HELP)
    if engine:
        p.add_argument("--enforce-eager", action="store_true",
                       help="CUDA: run decode steps eagerly, without CUDA graphs (the CPU always does)")


def add_kv_args(p) -> None:
    """``--kv-cache-dtype`` (vLLM's name) for the commands that run the engine."""
    from peagle.engine.config import KV_CACHE_DTYPES

    p.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto",
                   help="what the KV cache stores: auto = float16 where peagle's CPU kernels run their fast paths "
                        "(as llama.cpp's F16 cache: half the bytes attention reads), else the model's dtype "
                        "(float32 on the CPU with --compute exact)")


def to_device(data: list, device: torch.device, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """A host list as a tensor on ``device``: built on the CPU (named, so a default device never
    leaks in), then copied from pinned memory without blocking the host on CUDA."""
    t = torch.tensor(data, dtype=dtype, device="cpu")
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t if device.type == "cpu" else t.to(device)


def add_lookup_args(p) -> None:
    """``--prompt-lookup-max/-min``: drafts from the text itself beside the head's (vLLM's n-gram keys);
    ``--response-lookup``: from the target's earlier responses."""
    from peagle.engine.config import EngineConfig

    p.add_argument("--prompt-lookup-max", type=int, default=EngineConfig.prompt_lookup_max,
                   help="drafts from the text itself beside the head's: where the last n tokens occurred before, "
                        "what followed them then; the longest n looked up (default %(default)s; 0: off)")
    p.add_argument("--prompt-lookup-min", type=int, default=EngineConfig.prompt_lookup_min,
                   help="the shortest n looked up (default %(default)s)")
    p.add_argument("--response-lookup", default=EngineConfig.response_lookup,
                   help="where the text proposes nothing: drafts from the target's earlier responses, a table "
                        "(`peagle index-responses`): auto (the one beside the head, if any), none, or its path")


def add_tree_args(p) -> None:
    """``--speculative-token-tree`` and its budget (P-EAGLE; vLLM's ``speculative_token_tree``)."""
    p.add_argument("--speculative-token-tree", default="chain",
                   help="chain (default: the top draft of each position), auto (the engine chooses a tree of "
                        "candidates each step, by measured acceptance and verify cost) or an explicit tree of rank "
                        "paths as vLLM writes it, e.g. \"[(0,), (1,), (0, 0)]\"")
    p.add_argument("--speculative-tree-budget", type=int, default=16,
                   help="the most nodes an auto tree verifies per sequence and step (default 16)")
