"""Where `generate`'s defaults draft with the head on the 12 held-out prompts (fresh engines, greedy, 128 tokens): per
request, auto's steps, and for each step that drafted with the head (step, depth, a probe or the model's choice, rows
the drafter had to catch up on, the first position's estimated acceptance, the text's and table's yield a step).
head_steps.txt was printed before common.py, each engine timing its own start-up curves (now timed once).
BENCHMARKS.md §52.

    python docs/results/declined/head_steps.py
"""
from common import engine, ids

from peagle.engine.auto_k import AutoK

log = []
choose = AutoK.choose
def spy(self, *a):
    probe = self.steps + 1 >= self.next_probe and self.steps + 1 > self.warmup
    t = choose(self, *a)
    if t.depth:
        acc = self.acceptance()
        log.append((self.steps, t.depth, "probe" if probe else "pays", a[1] if len(a) > 1 else 0, round(acc[0][0], 2), round(self.lookup_tokens / max(self.lookup_steps, 1e-9), 2)))
    return t
AutoK.choose = spy
tot = {"probe": 0, "pays": 0}
for i, p in enumerate(ids):
    log.clear()
    e, _ = engine("defaults", p)
    while e.has_unfinished(): e.step()
    for l in log: tot[l[2]] += 1
    print(i, e.scheduler.auto.steps, log[:12])
print(tot)
