"""The host's work around the target's native pass: `LlamaModel.decode` over one row at a 128-token context, 400
times, timed whole and with `peagle::target_pass` timed inside it; prints the medians (the decode call before the op
was wrapped, the decode call and the op after, and the Python around the op). BENCHMARKS.md §52 (the tree it measured
against, d7f685d, is reverted).

    python docs/results/declined/decode_overhead.py
"""
import statistics
import time
import types

import torch

import peagle.models.llama as llama
from peagle.engine.llm_engine import LLMEngine
from peagle.engine.model_runner import AttnMeta, Span

e = LLMEngine.from_pretrained(None, method="none", k=1, max_num_seqs=1)
r, ctx = e.runner, 128
bs = r.cfg.block_size
for c in r.target_caches:
    c.materialize(ctx + 8)
ids, pos = torch.zeros(1, dtype=torch.long), torch.arange(ctx, ctx + 1)


def passes() -> list[int]:
    out = []
    for _ in range(400):
        meta = AttnMeta([Span(1, ctx + 1, list(range(-(-(ctx + 1) // bs))), ctx)], bs)
        t = time.perf_counter_ns()
        r.target.decode(ids, pos, r.target_caches, meta, pos - ctx)
        out.append(time.perf_counter_ns() - t)
    return out


with torch.inference_mode():
    plain = passes()
    op, inner = torch.ops.peagle.target_pass, []

    def timed(*a):
        t = time.perf_counter_ns()
        out = op(*a)
        inner.append(time.perf_counter_ns() - t)
        return out
    # the module's torch, with the op wrapped (decode reaches it as torch.ops.peagle.target_pass)
    llama.torch = types.SimpleNamespace(**{k: getattr(torch, k) for k in dir(torch) if not k.startswith("__")})
    llama.torch.ops = types.SimpleNamespace(peagle=types.SimpleNamespace(target_pass=timed))
    wrapped = passes()
med = lambda xs: statistics.median(xs) / 1e3  # noqa: E731
print(f"decode {med(plain):.0f} us; with the op timed: decode {med(wrapped):.0f}, op {med(inner):.0f}, "
      f"python around it {med([a - b for a, b in zip(wrapped, inner)]):.0f} us")
