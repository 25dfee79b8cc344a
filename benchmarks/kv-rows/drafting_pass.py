"""A P-EAGLE drafting pass (ModelRunner.propose, K=2 and K=4) over R verified rows of one sequence at a 100-token
context, the shipped head on the shipped GGUF: the median of 35 passes after 5, per (R, K). R of 16 and more is a
catch-up (the rows of steps the drafter skipped, or a prompt). BENCHMARKS.md §53; ab.sh runs it on two trees.

    python benchmarks/kv-rows/drafting_pass.py
"""
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "declined"))
from common import engine, ids  # noqa: E402
from peagle.models.attention import Span  # noqa: E402
e, _ = engine("defaults", ids[0])
runner = e.runner
H3 = runner.drafter.cfg.target_hidden_size * 3
g = torch.Generator().manual_seed(0)
bs = runner.cfg.block_size
res = {}
for R in [1, 3, 16, 48, 64, 110, 200]:
    for k in (2, 4):
        start = 100
        nblk = -(-(start + R + k) // bs)
        span = Span(R, start + R, list(range(1, nblk + 1)), start)
        batch = ([span], torch.randint(0, 40000, (R,), generator=g), torch.arange(start, start + R), [0, R],
                 torch.tensor([R]), torch.randn(R, H3, generator=g), torch.randint(0, 40000, (1,), generator=g))
        ts = []
        with torch.inference_mode():
            for i in range(40):
                t = time.perf_counter(); runner.propose(*batch, k); ts.append(time.perf_counter() - t)
        res[R, k] = statistics.median(ts[5:])
print(" ".join(f"R{R}k{k}={v*1e3:.3f}ms" for (R, k), v in res.items()))
