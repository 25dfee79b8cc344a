"""The drafter's pass over 112 rows at a warm context: whole (a span over 64 rows: SDPA) against chunks of at
most 64 rows (the native layer stack). Medians of 15 calls, ms.

    python docs/results/auto/catchup_chunks.py
"""
import time, torch, statistics
from peagle.engine.llm_engine import LLMEngine
from peagle.models.attention import AttnMeta, Span
e = LLMEngine.from_pretrained(None, method="parallel", k=3, max_num_seqs=1)
r = e.runner; d = r.drafter; bs = r.cfg.block_size
for c in r.drafter_caches: c.materialize(256)
def run(chunks, ctx0=0):
    t0 = time.perf_counter()
    start = ctx0
    for n in chunks:
        ids = torch.zeros(n, dtype=torch.long); pos = torch.arange(start, start + n)
        meta = AttnMeta([Span(n, start + n, list(range(-(-(start + n) // bs))), start)], bs)
        hidden = torch.zeros(n, d.cfg.hidden_size, dtype=r.dtype)
        with torch.inference_mode():
            d(ids, hidden, pos, r.drafter_caches, meta)
        start += n
    return (time.perf_counter() - t0) * 1e3
for chunks in ([112], [56, 56], [64, 48], [112], [56, 56]):
    ts = [run(chunks) for _ in range(15)]
    print(chunks, f"{statistics.median(ts):.3f} ms")
