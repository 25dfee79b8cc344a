"""Where a held-out request's steps go under `generate`'s defaults: the 12 held-out prompts of
benchmarks/int8/heldout.py (greedy, up to 128 tokens) in one engine (P-EAGLE, K by `auto`, prompt lookup on),
each decode step classed by the rows its target pass verifies and whether it drafts for the next, with the
medians of the step, its target pass (`forward`) and its drafting (`propose`), and the drafts it accepted.
`--table` (§50, docs/results/responses/step_classes.txt): with the shipped response table, and each class split by
where its drafts came from (`-`: the head's or none; `match` / `short`: the text's; `responses`: the table's).

    python benchmarks/cold-host/step_classes.py [--table]
"""
import json, statistics, sys, time
from collections import defaultdict
from pathlib import Path
from peagle.engine.llm_engine import EngineConfig, LLMEngine, load_response_lookup
from peagle.engine.sampling import SamplingParams
from peagle.models.loader import load_drafter_for, resolve_target

table = "--table" in sys.argv[1:]

items = [json.loads(l) for l in (Path(__file__).parent.parent / "int8" / "heldout.jsonl").read_text().splitlines()]
base = LLMEngine.from_pretrained(None, method="none", max_num_seqs=1)
head = load_drafter_for(base.target, resolve_target(None, weights=False), None, base.tokenizer)
e = LLMEngine(base.target, head, EngineConfig(method="parallel", num_speculative_tokens="auto", max_num_seqs=1),
              base.tokenizer, responses=load_response_lookup(EngineConfig(), resolve_target(None, weights=False), None,
                                                             base.target.cfg.vocab_size) if table else None)
r, cur, accepted = e.runner, {}, []
for name in ("forward", "propose"):
    def timed(*a, _orig=getattr(r, name), _name=name, **k):
        t = time.perf_counter(); out = _orig(*a, **k); cur[_name] = time.perf_counter() - t; return out
    setattr(r, name, timed)
run = r.run
r.run = lambda work, tree: (lambda out: accepted.append(out[0].accepted) or out)(run(work, tree))
stats = defaultdict(list)
for it in items:
    s = e.add_request(base.encode_prompt(it["prompt"]), SamplingParams(max_tokens=128))
    e.step()   # the prefill
    while not s.finished:
        cur.clear(); rows = f"{len(s.drafts) + 1} {s.drafts_from or '-'}" if table else len(s.drafts) + 1
        t = time.perf_counter(); e.step(); dt = time.perf_counter() - t
        stats[rows, "propose" in cur].append((dt, cur.get("forward", 0), cur.get("propose", 0), accepted[-1]))
print(f"| rows verified{', drafts from' if table else ''} | {'head drafts' if table else 'drafts'} next | steps | step ms | forward ms | propose ms | host ms | tokens a step | drafts accepted: 0 / 1 / 2 / 3+ |")
print("|---|---|---|---|---|---|---|---|---|")
for (rows, drafts), v in sorted(stats.items()):
    step, fwd, prop = (statistics.median(x[j] for x in v) * 1e3 for j in range(3))
    acc = [x[3] for x in v]
    hist = " / ".join(str(sum(1 for a in acc if (a == n if n < 3 else a >= 3))) for n in range(4))
    print(f"| {rows} | {'yes' if drafts else 'no'} | {len(v)} | {step:.2f} | {fwd:.2f} | {prop:.2f} | "
          f"{step - fwd - prop:.2f} | {1 + statistics.mean(acc):.2f} | {hist} |")
