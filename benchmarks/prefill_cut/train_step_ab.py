"""A CPU training step (8 documents, online target states, the shipped GGUF) three ways on the same documents each round:
`new` (documents share prefills, prompts through the attention kernel), `no-cut` (shared prefills through SDPA) and
`old` (a prefill per document through SDPA, as before 33ddda1). Seconds a step.

    python benchmarks/prefill_cut/train_step_ab.py
"""
import time, statistics, torch
from peagle.train.trainer import Trainer, TrainConfig
from peagle.models.attention import AttnMeta
import peagle.train.data as D
G = None
cfg = TrainConfig(data="data/synth/smollm2-135m-instruct", out="/tmp/tab", target=G, k=8, batch_size=8,
                  micro_tokens=4096, max_elements=16384, progress=False, eval_docs=4, max_steps=100)
tr = Trainer(cfg)
cut, tv = AttnMeta.cut, D.target_views
def per_doc(target, docs, budget=4096, chunk=512):   # the old path: a prefill per document
    return [x for d in docs for x in tv(target, [d], budget, chunk)]
variants = {"new": (cut, tv), "no-cut": (lambda self, rows: self, tv), "old": (lambda self, rows: self, per_doc)}
res = {v: [] for v in variants}
tr.train_step()
for r in range(4):
    s0 = tr.step
    for v, (c, t) in variants.items():
        AttnMeta.cut, D.target_views = c, t
        tr.step = s0   # the same documents for every variant
        t0 = time.perf_counter(); tr.train_step(); res[v].append(time.perf_counter() - t0)
for v in variants:
    print(v, [round(x, 2) for x in res[v]], "median", round(statistics.median(res[v]), 2))
