"""Per variant, in one process, alternating request by request (the 12 held-out prompts, fresh engines, greedy, 128
tokens): each decode step classed by where its drafts came from (`plain`: none; `head`; `match`/`short`: the text's;
`responses`: the table's), the rows it verified and whether the head drafted after it; the class's steps, time a
step against `none`'s plain step, tokens a step. BENCHMARKS.md §52.

    python docs/results/declined/step_classes.py [PASSES] [VARIANT ...]   # default: none ngram defaults
"""
import sys
import time
from collections import defaultdict

from common import alternating, engine, ids

variants = sys.argv[2:] or ["none", "ngram", "defaults"]
cls = {v: defaultdict(lambda: [0, 0.0, 0]) for v in variants}
def run(v, p):
    e, s = engine(v, p)
    t = time.perf_counter(); e.step(); cls[v][("prefill",)][1] += time.perf_counter() - t; cls[v][("prefill",)][0] += 1
    while not s.finished:
        rows, kind = len(s.drafts) + 1, s.drafts_from or ("head" if s.drafts else "plain")
        n0 = len(s.output_ids)
        t = time.perf_counter(); e.step(); dt = time.perf_counter() - t
        after = bool(s.drafts) and not s.drafts_from
        c = cls[v][(kind, rows, after)]
        c[0] += 1; c[1] += dt; c[2] += len(s.output_ids) - n0
for v, i in alternating(int(sys.argv[1]), variants):
    run(v, ids[i])
plain = cls["none"][("plain", 1, False)]
ps = plain[1] / plain[0]
for v in variants:
    tot_t = sum(c[1] for c in cls[v].values()); tot_n = sum(c[2] for c in cls[v].values())
    print(f"== {v}: {tot_n} tokens in {tot_t:.2f} s; plain step (none) {ps*1e3:.2f} ms")
    for k in sorted(cls[v], key=str):
        n, t, tok = cls[v][k]
        print(f"  {str(k):32s} steps {n:5d}  {t/n*1e3:6.2f} ms ({t/n/ps:4.2f}x)  tokens/step {tok/n:4.2f}  share of time {t/tot_t:5.1%}")
