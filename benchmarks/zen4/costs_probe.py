"""The start-up cost curves `auto` prices K by (ModelRunner.measure_costs): this tree's (round-robin, each drafter
pass after a target pass, medians of 5) against the way before (each size alone, its passes back to back, median
of 3 after a warm-up), each three times in one process, ms; and what a step's drafter pass costs in decoding.

    python benchmarks/zen4/costs_probe.py
"""
import statistics
import time

import torch

from peagle.engine.llm_engine import LLMEngine
from peagle.engine.model_runner import AttnMeta, Span, greedy

e = LLMEngine.from_pretrained(None, method="parallel", k="auto", max_num_seqs=1)
r = e.runner


def before():
    """The method as it was: each size's 4 passes back to back, the median of the last 3."""
    bs, ctx, d = r.cfg.block_size, 128, r.drafter
    rows = [1, 2, 4, 8, 16, 18]

    def timed(n, drafter):
        ids, pos = torch.zeros(n, dtype=torch.long), torch.arange(ctx, ctx + n)
        meta = AttnMeta([Span(n, ctx + n, list(range(-(-(ctx + n) // bs))), ctx)], bs)
        ts = []
        for _ in range(4):
            t = time.perf_counter()
            if drafter:
                greedy(d.logits(d(ids, torch.zeros(n, d.cfg.hidden_size), pos, r.drafter_caches, meta)[0]))
            else:
                greedy(r.target(ids, pos, r.target_caches, meta, pos - ctx)[0])
            ts.append(time.perf_counter() - t)
        return sorted(ts[1:])[1]
    return [[timed(n, dr) * 1e3 for n in rows] for dr in (False, True)], rows


with torch.inference_mode():
    for i in range(3):
        (t0, d0), rows = before()
        t1, d1 = r.measure_costs()
        print(f"run {i + 1}, rows {rows}")
        print("  target  before " + " ".join(f"{x:.2f}" for x in t0) + " | now " + " ".join(f"{x * 1e3:.2f}" for x in t1.seconds))
        print("  drafter before " + " ".join(f"{x:.2f}" for x in d0) + " | now " + " ".join(f"{x * 1e3:.2f}" for x in d1.seconds))
