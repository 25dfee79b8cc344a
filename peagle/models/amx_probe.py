"""The set-up's AMX probe (``python -m peagle.kernels`` runs it after the build): on a CPU whose OS grants AMX tiles,
the tiles' kernels checked bit for bit against the scalar reference on GGUF blocks and bfloat16 matrices packed as
a loaded model's are (:mod:`peagle.models.quant`), and timed beside the AVX-512 paths; the verdicts are kept in
``build/amx.json``, which :mod:`peagle.kernels` reads at load. Here, above the kernels, because it packs weights
as the models do."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import torch

from peagle import kernels
from peagle.models.quant import FORMATS, pack, pack_bf16

AMX_FORMATS = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1")


def random_blocks(fmt: str, n: int, k: int, g: torch.Generator) -> torch.Tensor:
    """GGUF blocks ``[n, k / 32, bytes]`` of ``fmt`` (32-weight formats): random quants, small fp16 scales (and mins)."""
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


def probe_child(isa: str = "amx", calls: int = 250, paths: tuple[str, ...] = ("int8", "bf16")) -> dict:
    """The probe's work (a child process: a fault in the tiles ends it, not the set-up), per path (``int8``,
    ``bf16``: those this CPU has AMX tiles for, or ``isa`` ``amx-model`` in tests): the AMX kernel against the
    scalar reference at pass heights 2-40 (every 32-weight GGUF format; bf16 weights with denormals and
    infinities among them, two widths: NaN payloads are the tests' business, not a reason to give up the
    tiles), then both paths' time at 8 rows on the default model's largest layer shape (3,072 x 576: Q4_1, and
    bf16)."""
    assert kernels.available()
    g = torch.Generator().manual_seed(0)
    torch.set_num_threads(1)

    def int8_cases():
        for fmt in AMX_FORMATS:
            blocks = random_blocks(fmt, 48, 576, g)
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
        w = pack(random_blocks("q4_1", 3072, 576, g))
        out["int8"] = _probe_path(isa, "avx512vnni", int8_cases(), (x, w), calls)
    if "bf16" in paths:
        w = pack_bf16((torch.randn(3072, 576, generator=g) * 0.05).bfloat16())
        out["bf16"] = _probe_path(isa, "avx512bf16", bf16_cases(), (x, w), calls)
    return out


def probe_amx() -> dict | None:
    """On a CPU whose OS grants AMX tiles, run :func:`probe_child` in a child process for each path it has
    tiles for, and keep the verdicts in ``build/amx.json`` (read at load: :func:`peagle.kernels._amx_verdict`);
    None elsewhere."""
    kernels.available.cache_clear()
    if not kernels.available() or "amx" not in torch.ops.peagle.int_isas():
        return None
    paths = ("int8",) + (("bf16",) if "amx" in torch.ops.peagle.bf16_isas() else ())
    code = f"import json; from peagle.models.amx_probe import probe_child as p; print(json.dumps(p(paths={paths!r})))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    try:
        out = json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        fault = {"exact": False, "error": f"the probe ended with code {r.returncode}: {r.stderr.strip()[-300:]}"}
        out = {path: fault for path in paths}
    kernels.AMX_PROBE.write_text(json.dumps(out))
    kernels.available.cache_clear()
    return out
