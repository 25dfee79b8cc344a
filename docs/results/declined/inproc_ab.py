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
import json
import os
import sys
import time
from pathlib import Path

from peagle.engine.auto_k import AutoK
from peagle.engine.config import EngineConfig
from peagle.engine.llm_engine import LLMEngine
from peagle.engine.model_runner import ModelRunner
from peagle.engine.sampling import SamplingParams
from peagle.engine.scheduler import Scheduler
from peagle.engine.tree import Tree
from peagle.models.loader import load_drafter_for, load_response_lookup, resolve_target

passes = int(sys.argv[1]) if len(sys.argv) > 1 else 2
variants = sys.argv[2:] or ["none", "ngram", "defaults"]
if os.environ.get("PROMPTS") == "mtbench20":   # 20 of MT-Bench's first turns (every fourth), as burst_ab.py's
    questions = Path(__file__).resolve().parents[4] / "shared" / "data" / "bench" / "mt_bench" / "question.jsonl"
    items = [{"prompt": q["turns"][0]} for q in map(json.loads, open(questions))][::4][:20]
else:
    items = [json.loads(line) for line in
             (Path(__file__).resolve().parent.parent / "int8" / "heldout.jsonl").read_text().splitlines()]
base = LLMEngine.from_pretrained(None, method="none", max_num_seqs=1)
path = resolve_target(None, weights=False)
head = load_drafter_for(base.target, path, None, base.tokenizer)
table = load_response_lookup(EngineConfig(), path, None, base.target.cfg.vocab_size)
ids = [base.encode_prompt(it["prompt"]) for it in items]
measure, costs = ModelRunner.measure_costs, {}
ModelRunner.measure_costs = lambda self, *a: costs["c"] if costs else costs.setdefault("c", measure(self, *a))
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
    method = {"none": "none", "ngram": "ngram"}.get(v, "parallel")   # (defaults, defaults+...)
    cfg = EngineConfig(method=method, num_speculative_tokens=1 if method == "none" else "auto", max_num_seqs=1)
    e = LLMEngine(base.target, head if method == "parallel" else None, cfg, base.tokenizer, responses=table)
    if "+noprobe" in v:
        e.scheduler.auto.next_probe = 10 ** 9
    if "+sparse" in v:
        a = e.scheduler.auto
        a.probe_every, a.probe_max, a.interval, a.next_probe = 32, 128, 32, 32
    if "+lowprior" in v:
        e.scheduler.auto.accepted[0][0] = 0.2 * e.scheduler.auto.prior
    e.add_request(ids[i], SamplingParams(max_tokens=128))
    while e.has_unfinished():
        t = time.perf_counter()
        done = sum(len(s.output_ids) for s in e.step().finished)
        dt = time.perf_counter() - t
        total[v][0] += done
        total[v][1] += dt
        total[v][2] += 1
        per_prompt[v][i][0] += done
        per_prompt[v][i][1] += dt


for p in range(passes):
    for i in range(len(ids)):
        r = (i + p) % len(variants)
        for v in variants[r:] + variants[:r]:
            run(v, i)
rate = {v: t / s for v, (t, s, _) in total.items()}
print(f"{passes} passes over the {len(ids)} {os.environ.get('PROMPTS', 'held-out')} prompts, variants alternating request by request in one process; "
      "tokens/s over all steps, against `none`, and each prompt's:")
for v in variants:
    each = [(a / b) / (c / d) for (a, b), (c, d) in zip(per_prompt[v], per_prompt[variants[0]])]
    print(f"  {v}: {rate[v]:.1f} tok/s, {rate[v] / rate[variants[0]]:.3f}x, {total[v][2]} steps; worst prompt "
          f"{min(each):.3f}x; " + " ".join(f"{x:.2f}" for x in each))
