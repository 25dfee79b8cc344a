"""peagle's native CPU kernels: the linear layer (float32/float16/bfloat16 weights and GGUF Q8_0/Q4_0/Q4_1
blocks in float32 arithmetic; packed GGUF blocks through integer dot products, llama.cpp's 8-bit
activations; packed bfloat16 weights through AVX512_BF16's bf16 dot products, AMX-BF16 tiles where a probe
at set-up found them exact and faster) for the few rows of decoding, verification and drafting, paged
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
import functools
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

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
    """Compile the kernels for this machine's torch into ``build/`` (needs a C++ compiler)."""
    from torch.utils.cpp_extension import load

    BUILD_DIR.mkdir(exist_ok=True)
    load(name="peagle_kernels", sources=[str(s) for s in SOURCES], extra_cflags=CFLAGS, extra_ldflags=["-fopenmp"],
         build_directory=str(BUILD_DIR), is_python_module=False, verbose=verbose)
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
    if published_block_sizes() != table.BLOCK_SIZES:
        _notice("native kernels' GGUF block layouts differ from peagle.kernels.table.BLOCK_SIZES (rebuild)")
        return False
    torch.ops.peagle.set_isa(os.environ.get("PEAGLE_ISA", ""))
    if "amx" in torch.ops.peagle.int_isas():
        torch.ops.peagle.set_amx(*_amx_verdict())
    return True


def published_block_sizes() -> "table.BlockSizes":
    """The GGUF block layouts the loaded library reads (``peagle::formats``, from ``csrc/kernels.h``)."""
    f = dict(torch.ops.peagle.formats())
    group, bf16 = f.pop("group")[0], f.pop("bf16")[1]
    return table.BlockSizes({name: tuple(v) for name, v in f.items()}, bf16, group)


AMX_PROBE = BUILD_DIR / "amx.json"
AMX_FORMATS = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1")
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
    peagle.kernels``'s probe (:func:`probe_amx`, in a child process) found its tiles giving the reference's bits
    and faster than the AVX-512 path beside them."""
    used = []
    for path, (name, other, where) in AMX_PATHS.items():
        v = amx_probe(path) or {"error": "not probed (run `make setup`)"}
        ok = bool(v.get("exact")) and v.get("amx_ms", 1e9) < v.get("base_ms", 0)
        if not ok:
            why = v.get("error") or ("inexact" if not v.get("exact") else f"slower than {other}")
            print(f"peagle: {name} tiles not used ({why}, {AMX_PROBE}); {where} runs {other}", file=sys.stderr)
        used.append(ok)
    return used[0], used[1]


def _random_blocks(fmt: str, n: int, k: int, g: torch.Generator) -> torch.Tensor:
    """GGUF blocks ``[n, k / 32, bytes]`` of ``fmt`` (32-weight formats): random quants, small fp16 scales (and mins)."""
    from peagle.models.quant import FORMATS

    f = FORMATS[fmt]
    b = torch.randint(0, 256, (n, k // f.weights, f.block_bytes), dtype=torch.uint8, generator=g)
    heads = (torch.randn(n, k // f.weights, f.scale_bytes // 2, generator=g) * 0.02).half()
    b[..., :f.scale_bytes] = heads.view(torch.uint8)
    return b


def _probe_path(isa: str, base: str, cases, timed: tuple, calls: int) -> dict:
    """One AMX path checked and timed: ``cases`` yields (name, x, packed weight, the reference's result), each
    compared bit for bit on ``isa``; then ``timed`` (x, packed weight) on ``isa`` and ``base`` alternating, the
    fastest of ``calls`` after a fifth of them."""
    for name, x, w, ref in cases:
        if not torch.equal(torch.ops.peagle.linear(x, w, None, isa).view(torch.int32), ref.view(torch.int32)):
            return {"exact": False, "error": f"{name} differs from the reference"}
    x, w = timed
    ms: dict[str, float] = {}
    for path in (isa, base) * 2:
        for i in range(calls):
            t = time.perf_counter()
            torch.ops.peagle.linear(x, w, None, path)
            if i >= calls // 5:
                ms[path] = min(ms.get(path, 1e9), (time.perf_counter() - t) * 1e3)
    return {"exact": True, "amx_ms": ms[isa], "base_ms": ms[base]}


HEIGHTS = (2, 3, 8, 16, 17, 40)  # pass heights the probe checks: row tiles whole, short and leftover


def _amx_probe_child(isa: str = "amx", calls: int = 250, paths: tuple[str, ...] = ("int8", "bf16")) -> dict:
    """The probe's work (a child process: a fault in the tiles ends it, not the set-up), per path (``int8``,
    ``bf16``: those this CPU has AMX tiles for, or ``isa`` ``amx-model`` in tests): the AMX kernel against the
    scalar reference at pass heights 2-40 (every 32-weight GGUF format; bf16 weights with denormals and
    infinities among them, two widths: NaN payloads are the tests' business, not a reason to give up the
    tiles), then both paths' time at 8 rows on the default model's largest layer shape (3,072 x 576: Q4_1, and
    bf16)."""
    from peagle.models.quant import pack, pack_bf16

    assert available()
    g = torch.Generator().manual_seed(0)
    torch.set_num_threads(1)

    def int8_cases():
        for fmt in AMX_FORMATS:
            blocks = _random_blocks(fmt, 48, 576, g)
            packed = pack(blocks)
            for m in HEIGHTS:
                x = torch.randn(m, 576, generator=g)
                yield f"{fmt} at {m} rows", x, packed, torch.ops.peagle.qlinear_ref(x, blocks)

    def bf16_cases():
        for k in (576, 200):  # whole tiles of 16 pairs, and a last tile of 4
            w = torch.randn(48, k, generator=g) * 0.05
            w[1, ::5], w[2, 3], w[3, 9] = 1e-39, float("inf"), -float("inf")  # denormals read as zero; infinities
            w = w.bfloat16()
            packed = pack_bf16(w)
            for m in HEIGHTS:
                x = torch.randn(m, k, generator=g)
                x[0, ::11] = 1e-39
                yield f"bf16 {k} wide at {m} rows", x, packed, torch.ops.peagle.bf16linear_ref(x, w)

    out = {}
    x = torch.randn(8, 576, generator=g)
    if "int8" in paths:
        w = pack(_random_blocks("q4_1", 3072, 576, g))
        out["int8"] = _probe_path(isa, "avx512vnni", int8_cases(), (x, w), calls)
    if "bf16" in paths:
        w = pack_bf16((torch.randn(3072, 576, generator=g) * 0.05).bfloat16())
        out["bf16"] = _probe_path(isa, "avx512bf16", bf16_cases(), (x, w), calls)
    return out


def probe_amx() -> dict | None:
    """On a CPU whose OS grants AMX tiles, run :func:`_amx_probe_child` in a child process for each path it has
    tiles for, and keep the verdicts in ``build/amx.json`` (read at load: :func:`_amx_verdict`); None elsewhere."""
    import subprocess

    available.cache_clear()
    if not available() or "amx" not in torch.ops.peagle.int_isas():
        return None
    paths = ("int8",) + (("bf16",) if "amx" in torch.ops.peagle.bf16_isas() else ())
    code = f"import json; from peagle.kernels import _amx_probe_child as p; print(json.dumps(p(paths={paths!r})))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    try:
        out = json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        fault = {"exact": False, "error": f"the probe ended with code {r.returncode}: {r.stderr.strip()[-300:]}"}
        out = {path: fault for path in paths}
    AMX_PROBE.write_text(json.dumps(out))
    available.cache_clear()
    return out


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
    that path's integer kernels, or not at all on ``scalar``; bf16 weights only under ``avx512`` (AVX512_BF16)."""
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


def isa() -> str:
    """The instruction set the kernels run here: ``avx512``, ``avx2``, ``scalar``, or ``none`` (not loaded)."""
    return torch.ops.peagle.isa() if available() else "none"


def int_isa() -> str:
    """The integer path's instruction set for packed GGUF blocks (``csrc/kernels.h``): ``amx``, ``avx512vnni``,
    ``avxvnni``, ``avx2``, or ``none`` (no such path here, or the kernels not loaded: the file's blocks run in float32)."""
    return torch.ops.peagle.int_isa() if available() else "none"


def bf16_isa() -> str:
    """The bf16 dot-product path's instruction set for packed bf16 weights (``csrc/kernels.h``): ``amx`` (AMX-BF16
    tiles, one-row passes on AVX512_BF16), ``avx512bf16``, or ``none`` (no such path here, or the kernels not loaded: bf16 weights stay plain, float32 arithmetic)."""
    return torch.ops.peagle.bf16_isa() if available() else "none"


_tuned = False


@torch.inference_mode()
def tune_streaming(weights: list, rounds: int = 15, budget: int = 64 << 20) -> tuple[int, int] | None:
    """Where packed weights (GGUF blocks on the integer path, bf16 pairs on the bf16 one) stream in tiles one
    packed group wide (one read stream) rather than the wider tiles that hide the dot products' latency, for
    passes of one row and taller (``csrc/linear_tiles.h``, ``run_packed``): the CPU's answer, not a constant
    (the default model's layer matmuls, two threads: on a Zen 4 every matrix is faster one group wide; on a
    Zen 5 4-row passes are slower so). Times both on ``weights`` (a model's packed
    weights, as decoding reads them) at 1 and 4 rows, alternating, the fastest of ``rounds`` each after two
    warm-up rounds (the host's other work only adds time: medians of 7 chose three ways in three processes on a
    Zen 4), and leaves the kernels' default (weights over 16 MiB: LM heads) only where the other wins by 3%.
    Once a process: the shape never changes a result, only its speed. Timed on one weight of each shape and format,
    up to ``budget`` bytes of them (a layer's matrices stand for all layers': timing all of an 8B model's would add
    seconds to every start). Returns the limits (one row, taller); None without weights."""
    global _tuned
    if not weights or not available():
        return None
    kinds: dict[tuple, object] = {}
    for w in weights:
        kinds.setdefault((tuple(w.blocks.shape), w.blocks.dtype), w)
    weights, total = [], 0
    for w in kinds.values():
        if total and total + w.blocks.numel() > budget:
            continue
        weights.append(w)
        total += w.blocks.numel()
    before = tuple(torch.ops.peagle.stream_bytes())   # the kernels' default, until tuned
    if _tuned:
        return before
    _tuned = True
    chosen = []
    for i, rows in enumerate((1, 4)):
        xs = [torch.randn(rows, w.shape[1]) for w in weights]
        times: dict[int, list[float]] = {before[i]: [], 0: []}
        for r in range(rounds + 2):  # the first rounds warm the caches, the pages and the thread pool
            for limit, ts in times.items():
                torch.ops.peagle.set_stream_bytes(limit, limit)
                t = time.perf_counter()
                for x, w in zip(xs, weights):
                    torch.ops.peagle.linear(x, w.blocks)
                if r > 1:
                    ts.append(time.perf_counter() - t)
        narrow, wide = min(times[0]), min(times[before[i]])
        chosen.append(0 if narrow < 0.97 * wide else before[i])
    torch.ops.peagle.set_stream_bytes(*chosen)
    return tuple(chosen)


from peagle.kernels import table  # noqa: E402  (the table reads this module's functions at call time)
from peagle.kernels.table import on_device, pick, provides, run, runs_packed  # noqa: E402,F401
