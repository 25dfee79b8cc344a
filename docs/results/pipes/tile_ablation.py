"""Where the AVX512-VNNI Q4_1 tile's time goes (BENCHMARKS.md §34): the default model's gate_up matrix
(3,072 x 576 Q4_1, 1.1 MB: in L2) times 8 rows, one thread, with parts of vnni_tiles.h taken out (the results
are wrong then: timing only). Each variant is written into the tree, built, timed (fastest of 3 x 20,000
calls), and the file is put back and the kernels built again.

    taskset -c 0 python docs/results/pipes/tile_ablation.py
"""
import subprocess
import sys
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[3] / "peagle/kernels/csrc/vnni_tiles.h"
EPILOGUE = """          for (int h = 0; h < SUMS; ++h)
            acc[r][j] = W::fma(scales(s + QGROUP / W::LANES * SB * h), W::mul(W::cvt_f(is[h][r][j]), dx), acc[r][j]);
          if constexpr (F.min)
            acc[r][j] = W::fma(scales(s + QGROUP / W::LANES * SB * SUMS), W::set1_f(a.x.sd[xb]), acc[r][j]);"""
MIN = """          if constexpr (F.min)
            acc[r][j] = W::fma(scales(s + QGROUP / W::LANES * SB * SUMS), W::set1_f(a.x.sd[xb]), acc[r][j]);"""
VARIANTS = {
    "as shipped": [],
    "no float epilogue (the int32 sums converted and added)": [
        (EPILOGUE, "          (void)dx; (void)s; acc[r][j] = W::add(acc[r][j], W::cvt_f(is[0][r][j]));")],
    "no min term (Q4_1's m * sum(x))": [(MIN, "")],
    "no software prefetch": [("for (int64_t l = 0; l < PB; l += 64) __builtin_prefetch(next + l, 0, 3);", "(void)next;")],
    "no nibble split (the raw bytes as both halves)": [
        ("W::nibbles(W::load(p[j] + 64 * v), lo[j], hi[j]);", "lo[j] = W::load(p[j] + 64 * v); hi[j] = lo[j];")],
}
TIME = """
import time, torch
from peagle.models.loader import load_target
from peagle.models.layers import Linear
torch.set_num_threads(1)
model, _ = load_target(None, device="cpu", compute="fast")
m = next(m for m in model.modules() if isinstance(m, Linear) and tuple(m.weight.shape) == (3072, 576))
x = torch.randn(8, 576)
best = []
with torch.inference_mode():
    for _ in range(3):
        for _ in range(500): torch.ops.peagle.linear(x, m.weight.blocks, None, "")
        t = time.perf_counter()
        for _ in range(20000): torch.ops.peagle.linear(x, m.weight.blocks, None, "")
        best.append((time.perf_counter() - t) / 20000 * 1e6)
print(f"{min(best):.1f}")
"""


def build():
    subprocess.run([sys.executable, "-m", "peagle.kernels"], check=True, capture_output=True)


original = SRC.read_text()
try:
    for name, edits in VARIANTS.items():
        text = original
        for old, new in edits:
            assert old in text, old
            text = text.replace(old, new)
        SRC.write_text(text)
        build()
        us = subprocess.run([sys.executable, "-c", TIME], check=True, capture_output=True, text=True).stdout.split()[-1]
        print(f"| {name} | {us} |", flush=True)
finally:
    SRC.write_text(original)
    build()
