"""peagle's native CPU kernels: the linear layer (float32/float16/bfloat16 weights and GGUF Q8_0/Q4_0/Q4_1
blocks in float32 arithmetic; packed GGUF blocks through integer dot products, llama.cpp's 8-bit
activations; packed bfloat16 weights through bf16 dot products: AVX512_BF16's, AMX-BF16 tiles where a probe
at set-up found them exact and faster, or their steps in FMAs on AVX2) for the few rows of decoding, verification and drafting, paged
attention for short spans, a layer's small ops fused, and every layer of such a pass in one call
(``decoder_layers``); batch-invariant: a row's result does not depend on how many rows share the pass
(``csrc/kernels.h``).

Built on the user's machine by ``make setup`` (``python -m peagle.kernels``), the instruction set
chosen at run time (AVX-512 (+ VNNI, + AMX-INT8 tiles where a probe at set-up found them exact and faster),
AVX2 + FMA + F16C (+ AVX-VNNI), else a scalar reference; ``PEAGLE_ISA=avx512``, ``avxvnni``, ``avx2`` or
``scalar`` caps it, as :func:`use_isa` does). Where the library is missing or stale, :func:`available`
says so once and the models keep torch's own matmul.
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from peagle.cpu import cpuinfo
from peagle.files import remembered
from peagle.kernels.blocks import BLOCK_SIZES, BlockSizes

HERE = Path(__file__).parent
SOURCES = sorted((HERE / "csrc").glob("*.cpp"))
HEADERS = sorted((HERE / "csrc").glob("*.h"))
BUILD_DIR = HERE / "build"
LIBRARY = BUILD_DIR / "peagle_kernels.so"
STAMP = BUILD_DIR / "stamp"
# FMAs only where the code writes them (the reference's order is the SIMD one); OpenMP as torch's own
# parallel_for uses it (libgomp.so.1 resolves to the copy torch has loaded: one thread pool)
CFLAGS = ["-O3", "-ffp-contract=off", "-fopenmp"]


def _fingerprint() -> str:
    h = hashlib.sha256(torch.__version__.encode())
    for f in SOURCES + HEADERS:
        h.update(f.name.encode() + f.read_bytes())
    h.update(" ".join(CFLAGS).encode())
    return h.hexdigest()


def build(verbose: bool = False) -> Path:
    """Compile the kernels for this machine's torch into ``build/`` (needs a C++ compiler). One build at a time
    holds ``build.flock`` (the OS lets go of it when its process dies); torch's own ``lock`` file found then was
    left by a build that was killed, and torch would wait on it forever: it is deleted."""
    from torch.utils.cpp_extension import load

    BUILD_DIR.mkdir(exist_ok=True)
    with open(BUILD_DIR / "build.flock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        (BUILD_DIR / "lock").unlink(missing_ok=True)
        load(name="peagle_kernels", sources=[str(s) for s in SOURCES], extra_cflags=CFLAGS,
             extra_ldflags=["-fopenmp"], build_directory=str(BUILD_DIR), is_python_module=False, verbose=verbose)
        STAMP.write_text(_fingerprint())
    return LIBRARY


def _notice(msg: str) -> None:
    print(f"peagle: {msg}; using torch's matmul (slower, and not batch-invariant)", file=sys.stderr)


@functools.cache
def available() -> bool:
    """Whether ``torch.ops.peagle.linear`` is loaded (loading it on the first call). ``PEAGLE_NATIVE=0``
    turns the kernels off (the fallback path, as tests and CI run it too)."""
    if os.environ.get("PEAGLE_NATIVE", "1") == "0":
        return False
    if not LIBRARY.exists():
        _notice("native kernels not built (run `make setup`)")
        return False
    if not STAMP.exists() or STAMP.read_text() != _fingerprint():
        _notice("native kernels are stale (sources or torch changed; run `make setup`)")
        return False
    try:
        torch.ops.load_library(str(LIBRARY))
    except OSError as e:
        _notice(f"native kernels failed to load ({e})")
        return False
    if published_block_sizes() != BLOCK_SIZES:
        _notice("native kernels' GGUF block layouts differ from peagle.kernels.blocks.BLOCK_SIZES (rebuild)")
        return False
    torch.ops.peagle.set_isa(os.environ.get("PEAGLE_ISA", ""))
    if "amx" in torch.ops.peagle.int_isas():
        torch.ops.peagle.set_amx(*_amx_verdict())
    return True


def published_block_sizes() -> BlockSizes:
    """The GGUF block layouts the loaded library reads (``peagle::formats``, from ``csrc/kernels.h``)."""
    f = dict(torch.ops.peagle.formats())
    group, bf16 = f.pop("group")[0], f.pop("bf16")[1]
    return BlockSizes({name: tuple(v) for name, v in f.items()}, bf16, group)


AMX_PROBE = BUILD_DIR / "amx.json"
AMX_PATHS = {"int8": ("AMX-INT8", "avx512vnni", "the integer path"), "bf16": ("AMX-BF16", "avx512bf16", "the bf16 path")}


def amx_probe(path: str) -> dict:
    """What the set-up's probe recorded for AMX path ``path`` (``int8`` or ``bf16``): ``exact``, its and the AVX-512
    path's times, or ``error`` (the tiles' first difference from the reference); empty where it did not run."""
    try:
        r = json.loads(AMX_PROBE.read_text())
    except (OSError, ValueError):
        return {}
    return r.get(path, {}) if isinstance(r, dict) and isinstance(r.get(path, {}), dict) else {}


def _amx_verdict() -> tuple[bool, bool]:
    """Whether the integer path and the bf16 path take AMX tiles on this CPU: each only where ``python -m
    peagle.kernels``'s probe (:func:`peagle.models.amx_probe.probe_amx`, in a child process) found its tiles
    giving the reference's bits and faster than the AVX-512 path beside them."""
    used = []
    for path, (name, other, where) in AMX_PATHS.items():
        v = amx_probe(path) or {"error": "not probed (run `make setup`)"}
        ok = bool(v.get("exact")) and v.get("amx_ms", 1e9) < v.get("base_ms", 0)
        if not ok:
            why = v.get("error") or ("inexact" if not v.get("exact") else f"slower than {other}")
            print(f"peagle: {name} tiles not used ({why}, {AMX_PROBE}); {where} runs {other}", file=sys.stderr)
        used.append(ok)
    return used[0], used[1]


@dataclass(frozen=True)
class Limits:
    """What the kernels are built for (``csrc/kernels.h``, published by ``peagle::limits``): attention heads of
    at most ``head_dim`` with at most ``group`` query heads per KV head; a sequence's rows attended whole, up to
    ``span_rows`` (decoding, verification, drafting; a longer prompt is cut into such spans, ``AttnMeta.cut``); a token tree of ``tree_nodes``
    nodes, so it and its root fit one span. The defaults are the kernels' own values, in force where they are
    not loaded (CUDA, ``PEAGLE_NATIVE=0``), so trees and routing do not change with the machine."""

    head_dim: int = 256
    group: int = 16
    span_rows: int = 64
    tree_nodes: int = 63


@functools.cache
def limits() -> Limits:
    """The kernels' :class:`Limits` as they publish them (the same values where they are not loaded)."""
    return Limits(**torch.ops.peagle.limits()) if available() else Limits()


def native(x: torch.Tensor | torch.device, head_dim: int | None = None, group: int | None = None) -> bool:
    """Whether peagle's kernels may run here rather than torch's ops (asked only by :mod:`peagle.kernels.table`,
    whose entries add each kernel's own conditions). For a device,
    the CPU with the kernels loaded; for activations ``x``, also float32 with no gradient wanted (the kernels
    have no backward); for attention, heads within :func:`limits`."""
    if isinstance(x, torch.device):
        if x.type != "cpu" or not available():
            return False
    elif x.device.type != "cpu" or x.dtype != torch.float32 or torch.is_grad_enabled() or not available():
        return False
    lim = limits()
    return (head_dim is None or head_dim <= lim.head_dim) and (group is None or group <= lim.group)


@contextlib.contextmanager
def use_isa(name: str):
    """Run the kernels on instruction set ``name`` (``amx``: AVX-512 with AMX-INT8 and AMX-BF16 tiles where the
    set-up's probe chose them,
    ``avx512``, ``avxvnni``: AVX2 with AVX-VNNI's integer path, ``avx2``, ``scalar``; no wider than this CPU's) inside the block, as ``PEAGLE_ISA`` does for a process: weights loaded inside are packed for
    that path's integer kernels, or not at all on ``scalar``; bf16 weights under ``avx512`` where the CPU has
    AVX512_BF16, and under ``avx2`` and ``avxvnni``."""
    torch.ops.peagle.set_isa(name)
    try:
        yield
    finally:
        torch.ops.peagle.set_isa(os.environ.get("PEAGLE_ISA", ""))


@contextlib.contextmanager
def streaming(one_row: int, taller: int):
    """Inside the block, packed weights of more bytes than these (passes of one row, taller) run tiles one
    packed group wide (:func:`tune_streaming`'s setting, restored after); 0, 0: every packed weight."""
    before = torch.ops.peagle.stream_bytes()
    torch.ops.peagle.set_stream_bytes(one_row, taller)
    try:
        yield
    finally:
        torch.ops.peagle.set_stream_bytes(*before)


@contextlib.contextmanager
def tiles(setting: str):
    """Inside the block, the tiles of one of :func:`tune_streaming`'s settings by name: ``default`` (the kernels'
    own limits, or the ones tuned), ``narrow`` (every packed weight one group wide) or ``wide`` (no weight)."""
    limits = {"default": None, "narrow": NARROW, "wide": WIDE}
    if setting not in limits:
        raise ValueError(f"unknown tiles {setting!r}; choose {', '.join(limits)}")
    limit = limits[setting]
    with contextlib.nullcontext() if limit is None else streaming(limit, limit):
        yield


def isa() -> str:
    """The instruction set the kernels run here: ``avx512``, ``avx2``, ``scalar``, or ``none`` (not loaded)."""
    return torch.ops.peagle.isa() if available() else "none"


def int_isa() -> str:
    """The integer path's instruction set for packed GGUF blocks (``csrc/kernels.h``): ``amx``, ``avx512vnni``,
    ``avxvnni``, ``avx2``, or ``none`` (no such path here, or the kernels not loaded: the file's blocks run in float32)."""
    return torch.ops.peagle.int_isa() if available() else "none"


def bf16_isa() -> str:
    """The bf16 dot-product path's instruction set for packed bf16 weights (``csrc/kernels.h``): ``amx`` (AMX-BF16
    tiles, one-row passes on AVX512_BF16), ``avx512bf16``, ``avx2`` (its steps in FMAs, where the float path is
    AVX2's), or ``none`` (no such path here, or the kernels not loaded: bf16 weights stay plain, float32 arithmetic)."""
    return torch.ops.peagle.bf16_isa() if available() else "none"


_tuned = False
NARROW = 0  # a stream limit every packed weight passes: one packed group wide (one read stream) for each
WIDE = 1 << 62  # a stream limit no weight reaches: the wide tiles for every weight
TUNE_BYTES = 1 << 30  # the most weights timed: twice the largest last-level cache seen (2.3 s of a 3B first start)
TUNE_VERSION = 3  # in the remembered verdicts' key: version 1 timed a cache-sized subset, and chose from two
# settings; version 2 timed single sweeps, taller passes at 4 rows, and kept the default unless another was 3% faster
TUNE_SAMPLE_S = 0.02  # a timed sample's least seconds: one sweep, or as many as fill it
TUNE_EDGE = 0.01  # how much faster than the default another setting must sweep to be taken
# The passes a sweep times, for the one-row limit and the taller one: verification's 4 and 8 rows (K=3 and K=7),
# where the taller limit costs most. Timed at 4 rows alone, the default model's LM head kept the default (narrow)
# in 8-row passes, whose K=7 steps ran 1.25x slower than wide (Sapphire Rapids).
TUNE_ROWS = ((1,), (4, 8))


@torch.inference_mode()
def tune_streaming(weights: list, rounds: int = 3, remember: Path | None = None) -> tuple[int, int] | None:
    """Where packed weights (GGUF blocks on the integer path, bf16 pairs on the bf16 one) stream in tiles one
    packed group wide (one read stream) rather than the wider tiles that hide the dot products' latency, for
    passes of one row and taller (``csrc/linear_tiles.h``, ``run_packed``): the CPU's answer, not a constant.
    Three settings are timed: every weight one group wide (:data:`NARROW`), the kernels' default (weights over
    16 MiB: LM heads), and none (:data:`WIDE`); :func:`tiles` names them for benchmarks. On a Zen 4 every
    matrix of the default model is faster one group wide; on a Zen 5 4-row passes are slower so; on a Sapphire
    Rapids Xeon decoding an 8B file is 1.24-1.28x faster with wide tiles for every weight (3B 1.17x, 1B 1.07x).
    Timed at 1 row and at 4 and 8 (:data:`TUNE_ROWS`) on ``weights`` (a model's packed weights) in their order,
    as decoding reads them, up to :data:`TUNE_BYTES`: a subset that fits the last-level cache answers for the
    cache, not for memory (a 64 MiB subset, in that Xeon's 480 MiB L3, chose one group wide for the 8B files).
    The fastest of ``rounds`` samples each, the settings alternating (the host's other work only adds time), a
    sample as many sweeps as fill :data:`TUNE_SAMPLE_S`. Single sweeps of the default model's 96 MB (4 ms) and a
    rule that kept the default unless another was 3% faster kept it in 3 of 12 verdicts (6 tunings, one row and
    taller) on a Sapphire Rapids, where wide's sweeps were 3-5% faster and its decoding steps 1.02-1.065x in 3
    runs of 4 (0.98x in one; ``benchmarks/real_sizes/verdict_steps.py``); with samples of 20 ms and a 1% edge
    (:data:`TUNE_EDGE`), in 1 of 12 (``tune_verdicts.py``). The edge keeps the default where the settings are
    level within the host's noise (a bf16 1B model's sweeps: 80-87 ms in all three). Once a process: the shape
    never changes a result, only its speed. With ``remember`` (a JSON file), a verdict found there for the same
    library, CPU, thread count and weights is taken instead of timing (0.4 s for the default model, 2.3 s at
    3B and above, here), and a new one is added to it.
    Returns the limits (one row, taller); None without weights."""
    global _tuned
    if not weights or not available():
        return None
    before = tuple(torch.ops.peagle.stream_bytes())   # the kernels' default, until tuned
    if _tuned:
        return before
    _tuned = True
    kinds = sorted({(tuple(w.blocks.shape), str(w.blocks.dtype)) for w in weights})
    key = json.dumps([TUNE_VERSION, STAMP.read_text(), int_isa(), bf16_isa(), torch.get_num_threads(),
                      cpuinfo("model name"), sum(w.blocks.numel() for w in weights), [list(k) for k in kinds]])
    chosen = remembered(remember, key, lambda: _timed_limits(weights, before, rounds),
                        lambda v: isinstance(v, list) and len(v) == 2 and all(isinstance(x, int) for x in v))
    torch.ops.peagle.set_stream_bytes(*chosen)
    return tuple(chosen)


def _timed_limits(weights: list, before: tuple[int, int], rounds: int) -> list[int]:
    """:func:`tune_streaming`'s timing: for one row and taller (:data:`TUNE_ROWS`), the limit whose sweep of the
    weights is fastest, the least of ``rounds`` samples each, the settings alternating, after one sweep each (the
    pages, the thread pool); the kernels' ``before`` unless another is :data:`TUNE_EDGE` faster."""
    timed, total = [], 0
    for w in weights:  # the first TUNE_BYTES (a MoE model's experts are not all read by a step)
        if total >= TUNE_BYTES:
            break
        timed.append(w)
        total += w.blocks.numel() * w.blocks.element_size()
    chosen = []
    for i, heights in enumerate(TUNE_ROWS):
        xs = [(torch.randn(rows, w.shape[1]), w.blocks) for rows in heights for w in timed]

        def sweeps(limit: int, reps: int) -> float:
            """Seconds a sweep, over ``reps`` of them."""
            torch.ops.peagle.set_stream_bytes(limit, limit)
            t = time.perf_counter()
            for _ in range(reps):
                for x, w in xs:
                    torch.ops.peagle.linear(x, w)
            return (time.perf_counter() - t) / reps

        limits = dict.fromkeys((before[i], NARROW, WIDE))
        warm = max(sweeps(limit, 1) for limit in limits)
        reps = math.ceil(TUNE_SAMPLE_S / max(warm, TUNE_SAMPLE_S / 256))  # 256 at most (a clock that reads 0: tests)
        times: dict[int, list[float]] = {limit: [] for limit in limits}
        for _ in range(rounds):
            for limit, ts in times.items():
                ts.append(sweeps(limit, reps))
        best = min(times, key=lambda limit: min(times[limit]))
        chosen.append(best if min(times[best]) < (1 - TUNE_EDGE) * min(times[before[i]]) else before[i])
    return chosen
