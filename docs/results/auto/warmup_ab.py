"""`generate`'s defaults against `--method none` on the 12 held-out prompts (a fresh engine a request, as
heldout.py), `auto` as it is now (`new`: six plain steps first, each size's timing error following new lows at
once, a start-up cost curve that never falls with more rows) against `auto` as it was before (`old`: three
plain steps, a running ratio from the first timing, the curve as timed), variants interleaved in rotating
order, ROUNDS rounds, medians per prompt.

    python docs/results/auto/warmup_ab.py ROUNDS
"""
import json
import statistics
import sys
from pathlib import Path

import peagle.engine.auto_k as AK
from peagle.engine.llm_engine import EngineConfig, LLMEngine
from peagle.engine.sampling import SamplingParams

here = Path(__file__).resolve().parents[1] / "int8"
items = [json.loads(line) for line in (here / "heldout.jsonl").read_text().splitlines()]
base = LLMEngine.from_pretrained(None, method="parallel", k="auto", max_num_seqs=1)
params = SamplingParams(max_tokens=128)
ids = [base.encode_prompt(it["prompt"]) for it in items]
new_post, new_observe = AK.CostCurve.__post_init__, AK.AutoK.observe


def old_observe(self, tree, batch, seconds):
    n, r = len(tree), seconds / self.step_seconds(len(tree), tree.depth, batch)
    self.scale[n] = r if n not in self.scale else 0.9 * self.scale[n] + 0.1 * r


def run(v, i):
    m = "none" if v == "none" else "parallel"
    old = v == "old"
    AK.CostCurve.__post_init__ = (lambda self: None) if old else new_post
    AK.AutoK.observe = old_observe if old else new_observe
    cfg = EngineConfig(method=m, num_speculative_tokens="auto" if m == "parallel" else 1, max_num_seqs=1)
    e = LLMEngine(base.target, base.drafter if m == "parallel" else None, cfg, base.tokenizer)
    if old:
        e.scheduler.auto.warmup = 3
    out = e.generate([ids[i]], params)[0]
    return len(out.token_ids) / out.elapsed_s, out.stats.acceptance_length


names = ["none", "new", "old"]
res = {v: [[] for _ in items] for v in names}
R = int(sys.argv[1])
for r in range(R):
    for i in range(len(items)):
        s = (r + i) % len(names)
        for v in names[s:] + names[:s]:
            res[v][i].append(run(v, i))
med = {v: [statistics.median(x for x, _ in c) for c in res[v]] for v in names}
for v in names[1:]:
    ratios = [a / b for a, b in zip(med[v], med["none"])]
    al = statistics.mean(statistics.median(a for _, a in c) for c in res[v])
    print(f"{v:4s} mean-of-ratios {statistics.mean(ratios):.3f} worst {min(ratios):.3f} best {max(ratios):.3f} "
          f"(mean AL {al:.2f}): " + " ".join(f"{x:.2f}" for x in ratios), flush=True)
