"""A drafting round's work right after the target's pass, against the same work warm: the native drafting call
(`peagle::draft`, 2 rows, K=1, a 128-token context) warm, after a target pass (one row), and after a 100 MB read
that only evicts the caches; then the Python calls of `propose` one at a time after a target pass (each the first
Python and torch code run since the pass). Medians of 400 rounds, µs.

    python benchmarks/cold-host/cold_host.py
"""
import statistics, time, torch
from peagle import kernels
from peagle.engine.llm_engine import LLMEngine
from peagle.memory import to_device
from peagle.models.attention import AttnMeta, KVCache, Span
from peagle.models.llama import stack_key

e = LLMEngine.from_pretrained(None, method="parallel", k=1, max_num_seqs=1)
r = e.runner; d = r.drafter; bs = r.cfg.block_size; ctx = 128
for c in r.target_caches + r.drafter_caches: c.materialize(ctx)
ids, pos = torch.zeros(2, dtype=torch.long), torch.arange(ctx, ctx + 2)
table = list(range(-(-(ctx + 2) // bs)))
spans, taps, nv = [Span(2, ctx + 2, table, ctx)], torch.zeros(2, d.fc.weight.shape[1]), to_device([2], r.device)
big = torch.ones(25_000_000)
T = {}
def mark(k, t0):
    t = time.perf_counter(); T.setdefault(k, []).append(t - t0); return t
def target_pass():
    r.target.decode(ids[:1], pos[:1], r.target_caches, AttnMeta([Span(1, ctx + 1, table, ctx)], bs), pos[:1] - ctx)
native = torch.ops.peagle.draft
def timed_native(*a):
    if state == "warm" and not warm_now[0]: return native(*a)
    t = time.perf_counter(); out = native(*a); mark(f"native draft call, {state}", t); return out
import peagle.models.drafter as dm
class _Ops:   # the drafter's call to peagle::draft, timed
    def __getattr__(self, k): return timed_native if k == "draft" else getattr(torch.ops.peagle, k)
class _Torch:
    ops = type("ops", (), {"peagle": _Ops()})()
    def __getattr__(self, k): return getattr(torch, k)
dm.torch = _Torch()
state, warm_now = "", [True]
with torch.inference_mode():
    for _ in range(400):
        warm_now = [False]
        warm_up = lambda: r.propose(spans, ids, pos, [0, 2], nv, taps, ids[:1], 1)
        for state, before in (("warm", warm_up), ("after a target pass", target_pass), ("after a 100 MB read", big.sum)):
            before()
            warm_now[0] = True
            t = time.perf_counter(); r.propose(spans, ids, pos, [0, 2], nv, taps, ids[:1], 1); mark(f"propose, {state}", t)
        target_pass()
        t = time.perf_counter()
        x = d.midlayer; t = mark("python after a pass: a module attribute (the first code run)", t)
        layers = [d.midlayer, *d.layers.values()]; t = mark("python after a pass: the layer list", t)
        stack_key(layers); t = mark("python after a pass: stack_key", t)
        kernels.native(taps, 64, 3); t = mark("python after a pass: kernels.native(taps)", t)
        d.fuses(taps, r.drafter_caches, 2); t = mark("python after a pass: the rest of fuses()", t)
        to_device([table], r.device); t = mark("python after a pass: the block table to a tensor", t)
        d.rotary.rows(ctx + 2, torch.float32); t = mark("python after a pass: RoPE rows", t)
for k, v in T.items():
    print(f"{k}: {statistics.median(v) * 1e6:.0f}")
