"""What `auto` was told a step costs, against what it took: the 12 held-out prompts (docs/results/int8/heldout.jsonl)
under `generate`'s defaults (a fresh engine per request, greedy, 128 tokens), each decode step classed by where its
drafts came from (`plain`: none; `head`; `match`/`short`: the text's; `responses`: the table's), the rows it verified
and whether it drafted with the head after it; the step's median time against a plain step's, and the start-up
curve's model of it (the target's pass over its rows, the drafter's pass where it drafted; a catch-up left out)
against the curve's one row. Then the last engine's measured corrections (`scale`: measured / modelled, by the rows a
step verified; before §51 by the tree it verified, 0 for plain steps). BENCHMARKS.md §51.

    python docs/results/row-costs/step_model.py               # step_model.txt
    PYTHONPATH=<a checkout of 04d14b7> python docs/results/row-costs/step_model.py   # step_model_before.txt
"""
import json
import statistics
import time
from collections import defaultdict
from pathlib import Path

from peagle.engine.llm_engine import EngineConfig, LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.models.loader import load_drafter_for, load_response_lookup, resolve_target

items = [json.loads(line) for line in
         (Path(__file__).resolve().parent.parent / "int8" / "heldout.jsonl").read_text().splitlines()]
base = LLMEngine.from_pretrained(None, method="none", max_num_seqs=1)
path = resolve_target(None, weights=False)
head = load_drafter_for(base.target, path, None, base.tokenizer)
table = load_response_lookup(EngineConfig(), path, None, base.target.cfg.vocab_size)
steps = defaultdict(list)
for it in items:
    e = LLMEngine(base.target, head, EngineConfig(method="parallel", num_speculative_tokens="auto", max_num_seqs=1),
                  base.tokenizer, responses=table)
    auto, drafted = e.scheduler.auto, []
    choose = auto.choose
    auto.choose = lambda *a: drafted.append(choose(*a)) or drafted[-1]
    s = e.add_request(base.encode_prompt(it["prompt"]), SamplingParams(max_tokens=128))
    e.step()
    while not s.finished:
        rows, kind = len(s.drafts) + 1, s.drafts_from or ("head" if s.drafts else "plain")
        t = time.perf_counter()
        e.step()
        dt, depth = time.perf_counter() - t, drafted[-1].depth
        model = auto.target(rows) + (auto.drafter(rows + max(depth - 1, 0)) if depth else 0.0)
        steps[kind, rows, bool(depth)].append((dt, model / auto.target(1)))
plain = statistics.median(dt for dt, _ in steps["plain", 1, False])
print("| drafts from | rows verified | head drafts after | steps | ms | against a plain step | start-up model |")
print("|---|---|---|---|---|---|---|")
for (kind, rows, depth), v in sorted(steps.items()):
    dt = statistics.median(x for x, _ in v)
    print(f"| {kind} | {rows} | {'yes' if depth else 'no'} | {len(v)} | {dt * 1e3:.2f} | {dt / plain:.2f}x | "
          f"{statistics.median(m for _, m in v):.2f}x |")
print("the last engine's corrections (rows verified: measured / modelled):",
      {k: round(v, 3) for k, v in sorted(auto.scale.items())})
