"""A CPU training step (8 documents, online target states, the shipped GGUF) with the chain keys gathered by
`index_select` (now) against advanced indexing `k[idx]` (before), on the same documents each round, order
alternating. Seconds a step.

    python docs/results/chain_gather/train_step_ab.py [ROUNDS]
"""
import statistics
import sys
import time

import torch

import peagle.models.attention as A
from peagle.train.trainer import Trainer, TrainConfig

new = A.attend_chain


def old(q, k, v, m):   # the gather as it was before 0adb8ed
    T, H, d = q.shape
    Hkv, n0 = k.shape[1], m.context.shape[1]
    qg = q.view(T, Hkv, H // Hkv, d) * d ** -0.5
    s0 = torch.einsum("thgd,shd->hgts", qg, k[:n0]).masked_fill(~m.context, float("-inf"))
    idx = m.chain.clamp(min=0)
    kc, vc = k[idx], v[idx]
    sc = torch.einsum("thgd,tchd->hgtc", qg, kc).masked_fill(m.chain < 0, float("-inf"))
    p = torch.cat([s0, sc], dim=-1).softmax(-1)
    o = torch.einsum("hgts,shd->thgd", p[..., :n0], v[:n0]) + torch.einsum("hgtc,tchd->thgd", p[..., n0:], vc)
    return o.reshape(T, H * d)


rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 4
tr = Trainer(TrainConfig(data="data/synth/smollm2-135m-instruct", out="/tmp/tab", k=8, batch_size=8,
                         micro_tokens=4096, max_elements=16384, progress=False, eval_docs=4, max_steps=100))
tr.train_step()
res = {"index_select": [], "k[idx]": []}
for r in range(rounds):
    s0 = tr.step
    for name, f in (list(zip(res, (new, old))) if r % 2 == 0 else list(zip(res, (new, old)))[::-1]):
        A.attend_chain = f
        tr.step = s0   # the same documents for both
        t0 = time.perf_counter()
        tr.train_step()
        res[name].append(time.perf_counter() - t0)
for name, ts in res.items():
    print(name, [round(x, 2) for x in ts], "median", round(statistics.median(ts), 2))
print(f"index_select / k[idx]: {statistics.median(res['index_select']) / statistics.median(res['k[idx]']):.2f}x")
