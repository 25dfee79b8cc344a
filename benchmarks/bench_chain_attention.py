"""Training attention A/B in one process: forward and backward over the same micro-batches (K=8, one layer, the
default target), the dense attention peagle ran before the chunked one (verbatim, its context mask spelled from the
same ranges) and the chunked one, alternating. Usage (DATA: a `peagle synth` folder, e.g. two 2,048-token documents):

    PYTHONPATH=. python benchmarks/bench_chain_attention.py DATA ROUNDS
"""
import json
import statistics
import sys
import tempfile
import time

import torch

from peagle.models import attention
from peagle.train.trainer import Trainer, TrainConfig


def dense_attend_chain(q, k, v, m):  # the attend_chain before, its ChainMask.context spelled from the ranges
    T, H, d = q.shape
    Hkv = k.shape[1]
    n0 = int(m.end.max())
    cols = torch.arange(n0, device=q.device)
    context = (cols >= m.first[:, None]) & (cols < m.end[:, None])
    qg = q.view(T, Hkv, H // Hkv, d) * d ** -0.5
    s0 = torch.einsum("thgd,shd->hgts", qg, k[:n0]).masked_fill(~context, float("-inf"))
    idx = m.chain.clamp(min=0).view(-1)
    C = m.chain.shape[1]
    kc, vc = k.index_select(0, idx).view(T, C, Hkv, d), v.index_select(0, idx).view(T, C, Hkv, d)
    sc = torch.einsum("thgd,tchd->hgtc", qg, kc).masked_fill(m.chain < 0, float("-inf"))
    p = torch.cat([s0, sc], dim=-1).softmax(-1)
    o = torch.einsum("hgts,shd->thgd", p[..., :n0], v[:n0]) + torch.einsum("hgtc,tchd->thgd", p[..., n0:], vc)
    return o.reshape(T, H * d)



chunked = attention.attend_chain
tr = Trainer(TrainConfig(data=sys.argv[1], out=tempfile.mkdtemp(), k=8, layers=1, max_len=2048, micro_tokens=2048,
                         batch_size=2, eval_fraction=0.0, progress=False))
work, n_sup, n_tok = tr.step_work()
print("pieces", len(work), "elements", sum(len(p.el) for p in work), "tokens", n_tok, "dtype", tr.dtype, flush=True)
tokens_per_s = {"dense": [], "chunked": []}
for rnd in range(int(sys.argv[2])):  # pairs: dense then chunked, so that a change in the machine's load hits both
    for name, fn in (("dense", dense_attend_chain), ("chunked", chunked)):
        attention.attend_chain = fn
        t, c = time.perf_counter(), time.process_time()
        tr.objective.run(work, 1.0 / n_sup, backward=True)
        tr.head.zero_grad(set_to_none=True)
        wall, cpu = time.perf_counter() - t, time.process_time() - c
        tokens_per_s[name].append(n_tok / wall)
        print(json.dumps({"round": rnd, "attention": name, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
                          "tokens_per_s": round(n_tok / wall, 1)}), flush=True)
print(json.dumps({"median_tokens_per_s": {k: round(statistics.median(v), 1) for k, v in tokens_per_s.items()},
                  "chunked_over_dense": [round(c / d, 2) for d, c in zip(*tokens_per_s.values())]}))
