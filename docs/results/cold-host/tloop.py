import sys, time, statistics, torch
from peagle.engine.llm_engine import LLMEngine
from peagle.models.attention import AttnMeta, Span
e = LLMEngine.from_pretrained(None, method="none", k=1, max_num_seqs=1)
r = e.runner; bs = r.cfg.block_size
ctx = int(sys.argv[2]); n = int(sys.argv[1])
for c in r.target_caches: c.materialize(ctx)
ids, pos = torch.zeros(n, dtype=torch.long), torch.arange(ctx, ctx + n)
meta = AttnMeta([Span(n, ctx + n, list(range(-(-(ctx + n) // bs))), ctx)], bs)
with torch.inference_mode():
    T = []; t0 = time.time()
    while time.time() - t0 < float(sys.argv[3]):
        t = time.perf_counter(); r.target.decode(ids, pos, r.target_caches, meta, pos - ctx); T.append(time.perf_counter() - t)
print("target", n, "rows ctx", ctx, f"{statistics.median(T)*1e3:.3f} ms", len(T))
