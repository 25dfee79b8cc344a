"""The target's one-row pass (peagle::target_pass, a 200-token context, the shipped GGUF) timed in a loop, median
ms, and this machine's read rate (torch.sum over 400 MB, best of 10) at the same thread count: run with
OMP_NUM_THREADS=1 and =2 alternately to see what the second thread adds.

    OMP_NUM_THREADS=N python benchmarks/cold-host/one_row_pass.py
"""
import statistics, time, torch
from peagle.engine.llm_engine import LLMEngine
from peagle.models.attention import AttnMeta, Span

e = LLMEngine.from_pretrained(None, method="none", max_num_seqs=1)
r = e.runner; bs = r.cfg.block_size; ctx = 200
for c in r.target_caches: c.materialize(ctx)
ids, pos = torch.zeros(1, dtype=torch.long), torch.arange(ctx, ctx + 1)
meta = AttnMeta([Span(1, ctx + 1, list(range(-(-(ctx + 1) // bs))), ctx)], bs)
with torch.inference_mode():
    T = []; t0 = time.time()
    while time.time() - t0 < 3:
        t = time.perf_counter(); r.target.decode(ids, pos, r.target_caches, meta, pos - ctx); T.append(time.perf_counter() - t)
x = torch.ones(100_000_000)
reads = []
for _ in range(10):
    t = time.perf_counter(); x.sum(); reads.append(time.perf_counter() - t)
print(f"threads {torch.get_num_threads()}: one-row pass {statistics.median(T) * 1e3:.2f} ms; read {0.4 / min(reads):.1f} GB/s")
