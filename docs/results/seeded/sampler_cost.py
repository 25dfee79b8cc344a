"""The sampler alone, before and after position-keyed sampling: one sequence's verification over
1 and 8 rows of the default model's vocabulary (49,152), temperature 0.8 (with and without top-p
0.95), medians of 200 calls after 20 warm-up calls. `rejection` is the sampler this replaced
(commit 7aa3cb4's `verify`, copied here as the reference it is measured against)."""
import statistics
import sys
import time

import torch

from peagle.engine.sampling import SamplingParams, probs_from_logits, verify
from peagle.runtime import configure_cpu


def rejection(logits, drafts, p, gen):
    dev = logits.device
    drafts = torch.as_tensor(drafts, dtype=torch.long, device=dev)
    k = drafts.shape[0]
    probs = probs_from_logits(logits, p)
    valid = probs.isfinite().all(-1, keepdim=True) & (probs.sum(-1, keepdim=True) > 0)
    probs = torch.where(valid, probs, 1.0 / probs.shape[-1])
    idx = torch.arange(k, device=dev)
    u = torch.rand(k, generator=gen, device=dev)
    accepted = (u < probs[idx, drafts]).int().cumprod(0).sum()
    residual = probs[:k].clone()
    residual[idx, drafts] = 0.0
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, probs[:k])
    choices = torch.multinomial(torch.cat([residual, probs[k:]]), 1, generator=gen)[:, 0]
    return accepted, choices[accepted]


def median_us(fn, n=200, warm=20):
    for _ in range(warm):
        fn()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


configure_cpu()
g = torch.Generator().manual_seed(0)
print(f"torch {torch.__version__}, {torch.get_num_threads()} threads", file=sys.stderr)
print("| rows | params | rejection sampler us | position-keyed us | ratio |\n|---|---|---|---|---|")
for rows in (1, 8):
    logits = torch.randn(rows, 49152, generator=g) * 3
    drafts = logits[:-1].argmax(-1).tolist()
    for name, p in (("T=0.8", SamplingParams(temperature=0.8)), ("T=0.8, top-p 0.95", SamplingParams(temperature=0.8, top_p=0.95))):
        old = median_us(lambda: rejection(logits, drafts, p, g))
        new = median_us(lambda: verify(logits, drafts, p, 7, 100))
        print(f"| {rows} | {name} | {old:.0f} | {new:.0f} | {new / old:.2f} |")
