"""Per variant, in one process, alternating request by request (the 12 held-out prompts, fresh engines, greedy, 128
tokens): each decode step classed by where its drafts came from (`plain`: none; `head`; `match`/`short`: the text's;
`responses`: the table's), the rows it verified and whether the head drafted after it; the class's steps, time a
step against `none`'s plain step, tokens a step. BENCHMARKS.md §52.

    python docs/results/declined/step_classes.py [PASSES] [VARIANT ...]   # default: none ngram defaults
"""
import json, sys, time
from collections import defaultdict
from pathlib import Path
from peagle.engine.config import EngineConfig
from peagle.engine.llm_engine import LLMEngine
from peagle.engine.model_runner import ModelRunner
from peagle.engine.sampling import SamplingParams
from peagle.models.loader import load_drafter_for, load_response_lookup, resolve_target
items = [json.loads(l) for l in Path("docs/results/int8/heldout.jsonl").read_text().splitlines()]
base = LLMEngine.from_pretrained(None, method="none", max_num_seqs=1)
path = resolve_target(None, weights=False)
head = load_drafter_for(base.target, path, None, base.tokenizer)
table = load_response_lookup(EngineConfig(), path, None, base.target.cfg.vocab_size)
ids = [base.encode_prompt(it["prompt"]) for it in items]
measure, costs = ModelRunner.measure_costs, {}
ModelRunner.measure_costs = lambda self, *a: costs["c"] if costs else costs.setdefault("c", measure(self, *a))
variants = sys.argv[2:] or ["none", "ngram", "defaults"]
cls = {v: defaultdict(lambda: [0, 0.0, 0]) for v in variants}
def run(v, p):
    method = {"none": "none", "ngram": "ngram"}.get(v, "parallel")
    cfg = EngineConfig(method=method, num_speculative_tokens=1 if method == "none" else "auto", max_num_seqs=1)
    e = LLMEngine(base.target, head if method == "parallel" else None, cfg, base.tokenizer, responses=table)
    s = e.add_request(p, SamplingParams(max_tokens=128))
    t = time.perf_counter(); e.step(); cls[v][("prefill",)][1] += time.perf_counter() - t; cls[v][("prefill",)][0] += 1
    while not s.finished:
        rows, kind = len(s.drafts) + 1, s.drafts_from or ("head" if s.drafts else "plain")
        n0 = len(s.output_ids)
        t = time.perf_counter(); e.step(); dt = time.perf_counter() - t
        after = bool(s.drafts) and not s.drafts_from
        c = cls[v][(kind, rows, after)]
        c[0] += 1; c[1] += dt; c[2] += len(s.output_ids) - n0
for rep in range(int(sys.argv[1])):
    for i, p in enumerate(ids):
        order = variants[(i + rep) % len(variants):] + variants[:(i + rep) % len(variants)]
        for v in order: run(v, p)
plain = cls["none"][("plain", 1, False)]
ps = plain[1] / plain[0]
for v in variants:
    tot_t = sum(c[1] for c in cls[v].values()); tot_n = sum(c[2] for c in cls[v].values())
    print(f"== {v}: {tot_n} tokens in {tot_t:.2f} s; plain step (none) {ps*1e3:.2f} ms")
    for k in sorted(cls[v], key=str):
        n, t, tok = cls[v][k]
        print(f"  {str(k):32s} steps {n:5d}  {t/n*1e3:6.2f} ms ({t/n/ps:4.2f}x)  tokens/step {tok/n:4.2f}  share of time {t/tot_t:5.1%}")
