"""Where `generate`'s defaults draft with the head on the 12 held-out prompts (fresh engines, greedy, 128 tokens): per
request, auto's steps, and for each step that drafted with the head (step, depth, a probe or the model's choice, rows
the drafter had to catch up on, the first position's estimated acceptance, the text's and table's yield a step).
BENCHMARKS.md §52.

    python docs/results/declined/head_steps.py
"""
import json, sys
from pathlib import Path
from peagle.engine.config import EngineConfig
from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.engine.auto_k import AutoK
from peagle.models.loader import load_drafter_for, load_response_lookup, resolve_target
items = [json.loads(l) for l in Path("docs/results/int8/heldout.jsonl").read_text().splitlines()]
base = LLMEngine.from_pretrained(None, method="none", max_num_seqs=1)
path = resolve_target(None, weights=False)
head = load_drafter_for(base.target, path, None, base.tokenizer)
table = load_response_lookup(EngineConfig(), path, None, base.target.cfg.vocab_size)
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
for i, it in enumerate(items):
    log.clear()
    e = LLMEngine(base.target, head, EngineConfig(method="parallel", num_speculative_tokens="auto", max_num_seqs=1), base.tokenizer, responses=table)
    e.add_request(base.encode_prompt(it["prompt"]), SamplingParams(max_tokens=128))
    while e.has_unfinished(): e.step()
    for l in log: tot[l[2]] += 1
    print(i, e.scheduler.auto.steps, log[:12])
print(tot)
