"""llama.cpp as a benchmark peer, through llama-cpp-python (``pip install 'peagle[llamacpp]'``, built
from source on the user's machine as its users install it; about 6 minutes on 2 cores).

The default model ships as a Q4_1 GGUF; the F32, F16, BF16 and Q8_0 files are made from it by
llama.cpp's own quantizer (``allow_requantize``), so every precision holds the weights peagle runs.
On CPUs with AMX, llama.cpp's repacked Q4_1 path crashes on any batch of more than one token
(CPU-PERF.md); there the Q4_1 peer runs with ``n_batch=1`` (the prompt fed a token at a time, decode
unchanged) and :func:`config_note` says so.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import sys
from pathlib import Path

from peagle.models.loader import cache_dir, default_gguf
from peagle.runtime import cpu_flags

# llama_ftype of each precision (llama.h's LLAMA_FTYPE_*)
FTYPES = {"F32": 0, "F16": 1, "Q4_1": 3, "Q8_0": 7, "BF16": 32}
SHIPPED = "Q4_1"


def available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def require() -> None:
    if not available():
        raise RuntimeError("llama.cpp is not installed: pip install 'peagle[llamacpp]' (builds it from source)")


@functools.cache
def gguf_file(kind: str) -> Path:
    """The default model's GGUF in ``kind`` precision: the shipped file, or one converted from it once
    (cached beside peagle's converted models; written to a temporary name, then renamed)."""
    if kind not in FTYPES:
        raise ValueError(f"unknown llama.cpp precision {kind!r}; choose from {', '.join(FTYPES)}")
    src = default_gguf()
    if kind == SHIPPED:
        return src
    out = cache_dir() / "gguf" / f"{src.stem.rsplit('.', 1)[0]}.{kind}.gguf"
    if out.exists():
        return out
    require()
    import llama_cpp

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.allow_requantize, params.nthread = FTYPES[kind], True, os.cpu_count() or 1
    if llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), params) != 0:
        raise RuntimeError(f"llama.cpp could not convert {src.name} to {kind}")
    tmp.rename(out)
    return out


def safe_batch(kind: str) -> int | None:
    """``n_batch`` that keeps llama.cpp alive on this CPU: 1 for Q4_1 with AMX, else its default."""
    return 1 if kind == SHIPPED and "amx_tile" in cpu_flags() else None


def config_note(kind: str) -> str:
    return "n_batch=1 (AMX: its repacked Q4_1 path crashes on batches)" if safe_batch(kind) else "defaults"


def server_command(kind: str, port: int, n_ctx: int = 4096) -> list[str]:
    """``python -m llama_cpp.server`` on the default model in ``kind`` precision, every core, requests
    one after another (its only mode; by default a new request interrupts the running one, which
    concurrent clients would turn into wasted work)."""
    require()
    threads = str(os.cpu_count() or 1)
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf_file(kind)), "--n_threads", threads,
           "--n_threads_batch", threads, "--n_ctx", str(n_ctx), "--interrupt_requests", "False",
           "--host", "127.0.0.1", "--port", str(port)]
    if safe_batch(kind):
        cmd += ["--n_batch", str(safe_batch(kind))]
    return cmd
