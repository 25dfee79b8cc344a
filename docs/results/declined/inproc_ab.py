"""Speculation variants on the 12 held-out prompts in one process: every variant's engine on the same target
weights, variants alternating request by request (the order rotating), so no variant owns a process whose pages
or minutes differ from another's (the per-process harness `docs/results/responses/burst_ab.py` read two copies of
one variant 4-8% apart in one run, §52). Each request is a fresh engine, as `peagle generate` makes (greedy, 128
tokens at most; the start-up cost curves timed once and reused). Prints each variant's rate over all its steps
against `none`'s (every variant decodes the same tokens), its step count, and each prompt's ratio.
Variants: `none`, `ngram`, `defaults`, and the defaults with changes joined by `+`: `nohead` (`auto` never drafts
with the head), `ungated` (the text's short matches and the table's drafts verified whenever proposed, as `ngram`
does, not only while `auto`'s gate finds they pay), `lowprior` (a fresh engine's prior for the head's first
position 0.2, not 0.5), `sparse` (probes from step 32, their interval
doubling to 128, not 16 to 64), `noprobe` (no probes: the head drafts only where
`auto`'s model says it pays now), `blind` (at 6bde5a4, reverted: the gate's declined drafts not
scored against the tokens that come, as before and after it), e.g. `defaults+nohead+ungated`.

$PROMPTS=mtbench20: 20 of MT-Bench's first turns (every fourth) instead of the held-out prompts.

    python docs/results/declined/inproc_ab.py [PASSES] [VARIANT ...]   # default: 2 none ngram defaults
"""
import os
import sys
import time

from common import alternating, engine, ids

from peagle.engine.auto_k import AutoK
from peagle.engine.scheduler import Scheduler
from peagle.engine.tree import Tree

passes = int(sys.argv[1]) if len(sys.argv) > 1 else 2
variants = sys.argv[2:] or ["none", "ngram", "defaults"]
current = [""]
choose, pays = AutoK.choose, AutoK.lookup_pays
AutoK.choose = lambda self, *a: Tree(()) if "+nohead" in current[0] else choose(self, *a)
AutoK.lookup_pays = lambda self, *a: "+ungated" in current[0] or pays(self, *a)
if hasattr(Scheduler, "_score_declined"):   # 6bde5a4
    score = Scheduler._score_declined
    Scheduler._score_declined = lambda self, seq: (setattr(seq, "declined", []) if "+blind" in current[0]
                                                   else score(self, seq))
total = {v: [0, 0.0, 0] for v in variants}
per_prompt = {v: [[0, 0.0] for _ in ids] for v in variants}


def run(v: str, i: int) -> None:
    current[0] = v
    e, _ = engine(v, ids[i])   # (defaults+...: the defaults, changed below)
    if "+noprobe" in v:
        e.scheduler.auto.next_probe = 10 ** 9
    if "+sparse" in v:
        a = e.scheduler.auto
        a.probe_every, a.probe_max, a.interval, a.next_probe = 32, 128, 32, 32
    if "+lowprior" in v:
        e.scheduler.auto.accepted[0][0] = 0.2 * e.scheduler.auto.prior
    while e.has_unfinished():
        t = time.perf_counter()
        done = sum(len(s.output_ids) for s in e.step().finished)
        dt = time.perf_counter() - t
        total[v][0] += done
        total[v][1] += dt
        total[v][2] += 1
        per_prompt[v][i][0] += done
        per_prompt[v][i][1] += dt


for v, i in alternating(passes, variants):
    run(v, i)
rate = {v: t / s for v, (t, s, _) in total.items()}
print(f"{passes} passes over the {len(ids)} {os.environ.get('PROMPTS', 'held-out')} prompts, variants alternating request by request in one process; "
      "tokens/s over all steps, against `none`, and each prompt's:")
for v in variants:
    each = [(a / b) / (c / d) for (a, b), (c, d) in zip(per_prompt[v], per_prompt[variants[0]])]
    print(f"  {v}: {rate[v]:.1f} tok/s, {rate[v] / rate[variants[0]]:.3f}x, {total[v][2]} steps; worst prompt "
          f"{min(each):.3f}x; " + " ".join(f"{x:.2f}" for x in each))
