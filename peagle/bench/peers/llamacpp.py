"""llama.cpp as a benchmark peer: its own binaries (``llama-bench``, ``llama-server``, ``llama-quantize``,
found in ``$LLAMA_CPP_BIN``, else where ``llama-native.sh`` builds them) for the figures quoted against it,
and llama-cpp-python (``pip install 'peagle[llamacpp]'``) in-process where a Python peer is needed (logits,
`bench baseline`'s token-for-token decode: :class:`LlamaCppPeer`, fed the engine's token ids, greedy token
by token as its own examples decode; EOS is a token like any other, as with the engine's ``ignore_eos``).
The binding's per-token Python loop charges its own cost to llama.cpp, and its server answers one request
at a time: decode rates and the serving table come from the binaries.

The default model ships as a Q4_1 GGUF; the F32, F16, BF16 and Q8_0 files are made from it by
llama.cpp's own quantizer (``allow_requantize``), so every precision holds the weights peagle runs.
On CPUs with AMX, llama.cpp's repacked Q4_1 path crashes on any batch of more than one token;
there the Q4_1 peer runs with ``n_batch=1`` (the prompt fed a token at a time, decode unchanged)
and :func:`config_note` says so.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from peagle.files import written
from peagle.bench.peers import Decode, Peer
from peagle.cpu import cpu_flags
from peagle.models.loader import cache_dir, default_gguf

# llama_ftype of each precision (llama.h's LLAMA_FTYPE_*)
FTYPES = {"F32": 0, "F16": 1, "Q4_1": 3, "Q8_0": 7, "BF16": 32}
SHIPPED = "Q4_1"


NATIVE_DEFAULT = Path.home() / ".cache" / "llama-native" / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp" / "build" / "bin"


def available() -> bool:
    """Whether the binding is installed; one installed over llama.cpp's own build (``CMAKE_ARGS=-DLLAMA_BUILD=OFF``,
    as ``llama-native.sh`` says) is pointed at that build's libraries unless ``LLAMA_CPP_LIB_PATH`` is set."""
    bins = Path(os.environ.get("LLAMA_CPP_BIN", NATIVE_DEFAULT))
    if (bins / "libllama.so").is_file():
        os.environ.setdefault("LLAMA_CPP_LIB_PATH", str(bins))
    return importlib.util.find_spec("llama_cpp") is not None


def native_bin(name: str) -> Path | None:
    """llama.cpp's binary ``name`` (``llama-bench``, ``llama-server``, ``llama-quantize``), or None."""
    path = Path(os.environ.get("LLAMA_CPP_BIN", NATIVE_DEFAULT)) / name
    return path if path.is_file() and os.access(path, os.X_OK) else None


def require_native(name: str) -> Path:
    path = native_bin(name)
    if path is None:
        raise RuntimeError(f"llama.cpp's {name} not found: build llama.cpp (cmake --build build --target {name}) and "
                           f"point LLAMA_CPP_BIN at its bin folder")
    return path


def llama_bench(kind: str, prompt: int = 0, gen: int = 128, reps: int = 5, threads: int | None = None,
                depth: int = 0) -> dict:
    """``llama-bench`` on the default model's ``kind`` file: one test (``-p prompt -n gen``), its JSON record
    (``avg_ts`` tokens/s, ``stddev_ts``). ``prompt`` > 0 and ``gen`` 0 is llama.cpp's batch of that many
    tokens (pp8: what 8 verify rows cost it). ``depth``: the test after that many tokens of context (``-d``; tg128
    alone starts from an empty one, where a decode after a prompt attends to the prompt too)."""
    cmd = [str(require_native("llama-bench")), "-m", str(gguf_file(kind)), "-t", str(threads or os.cpu_count() or 1),
           "-p", str(prompt), "-n", str(gen), "-d", str(depth), "-r", str(reps), "-o", "json"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out)[0]


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

    out.parent.mkdir(parents=True, exist_ok=True)
    with written(out) as tmp:
        quantize = native_bin("llama-quantize")
        if quantize is not None:  # llama.cpp's own tool
            res = subprocess.run([str(quantize), "--allow-requantize", str(src), str(tmp), kind],
                                 capture_output=True, text=True)
            if res.returncode != 0:
                raise RuntimeError(f"llama-quantize could not convert {src.name} to {kind}: {res.stderr[-400:]}")
        else:
            require()
            import llama_cpp

            params = llama_cpp.llama_model_quantize_default_params()
            params.ftype, params.allow_requantize, params.nthread = FTYPES[kind], True, os.cpu_count() or 1
            if llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), params) != 0:
                raise RuntimeError(f"llama.cpp could not convert {src.name} to {kind}")
    return out


def safe_batch(kind: str | Path) -> int | None:
    """``n_batch`` that keeps llama.cpp alive on this CPU: 1 for Q4_1 with AMX, else its default."""
    return 1 if kind == SHIPPED and "amx_tile" in cpu_flags() else None


def config_note(kind: str | Path) -> str:
    return "n_batch=1 (AMX: its repacked Q4_1 path crashes on batches)" if safe_batch(kind) else "defaults"


def server_note(parallel: int) -> str:
    """How :func:`server_command` serves: llama-server's slots, or the binding's one request at a time."""
    if native_bin("llama-server") is not None:
        return f"llama-server, {parallel} slots (--parallel {parallel})"
    return "llama_cpp.server (the Python binding): one request at a time, its only mode"


def server_command(kind: str | Path, port: int, parallel: int = 4, n_ctx: int = 4096) -> list[str]:
    """llama.cpp's ``llama-server`` on the default model in ``kind`` precision (or on ``kind``, a GGUF file's
    path: a user's own model), every core, ``parallel`` slots (continuous batching, as its users serve; ``n_ctx``
    tokens a slot). Without the binary, the binding's ``python -m llama_cpp.server``, which answers one request
    at a time (:func:`server_note`)."""
    model = str(kind) if isinstance(kind, Path) else str(gguf_file(kind))
    threads = str(os.cpu_count() or 1)
    native = native_bin("llama-server")
    if native is not None:
        cmd = [str(native), "-m", model, "-t", threads, "-tb", threads, "-c", str(n_ctx * parallel),
               "-np", str(parallel), "--host", "127.0.0.1", "--port", str(port)]
        return cmd + (["--no-repack"] if safe_batch(kind) else [])
    require()
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", model, "--n_threads", threads,
           "--n_threads_batch", threads, "--n_ctx", str(n_ctx), "--interrupt_requests", "False",
           "--host", "127.0.0.1", "--port", str(port)]
    if safe_batch(kind):
        cmd += ["--n_batch", str(safe_batch(kind))]
    return cmd


# ----------------------------------------------------------------------------- the in-process peer

@dataclasses.dataclass(kw_only=True)
class LlamaCppPeer(Peer):
    llm: Any   # llama_cpp.Llama

    def first_token(self, ids: list[int]) -> int:
        """The prompt into an empty cache, then its greedy token."""
        self.llm.reset()
        self.llm.eval(ids)
        return self.llm.sample(temp=0.0)

    def decode(self, ids: list[int], n: int) -> Decode:
        t0 = time.perf_counter()
        tokens = [self.first_token(ids)]
        ttft = time.perf_counter() - t0
        while len(tokens) < n:
            self.llm.eval(tokens[-1:])
            tokens.append(self.llm.sample(temp=0.0))
        return Decode(tokens=tokens, ttft_s=ttft, elapsed_s=time.perf_counter() - t0)

    def prefill_s(self, ids: list[int]) -> float:
        t0 = time.perf_counter()
        self.first_token(ids)
        return time.perf_counter() - t0


def load(kind: str, threads: int, n_ctx: int) -> LlamaCppPeer:
    """llama.cpp on the ``kind`` GGUF (converted once from the shipped file), ``threads`` threads for
    decode and prompt alike, a context of ``n_ctx`` tokens (the longest prompt and its tokens must fit)."""
    from llama_cpp import Llama

    llm = Llama(model_path=str(gguf_file(kind)), n_threads=threads, n_threads_batch=threads, n_ctx=n_ctx,
                n_batch=safe_batch(kind) or 512, verbose=False)
    note = config_note(kind)
    return LlamaCppPeer(name=f"llamacpp-{kind}", system="llama.cpp", label=f"llama.cpp `{kind}`", precision=kind,
                        threads=f"llama.cpp {threads}", note="" if note == "defaults" else note, llm=llm)
