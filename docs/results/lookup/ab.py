"""`generate`'s defaults with drafts from the text itself (prompt lookup, `peagle/engine/lookup.py`): off, only
merged into the head's drafts (`merge`: no drafts of its own where the drafter skips a step), as shipped, and at
`prompt_lookup_min` 1 and 3, against `--method none`, on the 12 held-out prompts of docs/results/int8/heldout.jsonl
(a fresh engine a request, as heldout.py; variants interleaved in rotating order, ROUNDS rounds, medians per
prompt; every variant's tokens checked equal to plain decoding's).

    python docs/results/lookup/ab.py ROUNDS
"""
import json
import statistics
import sys
from pathlib import Path

import peagle.engine.scheduler as scheduler
from peagle.engine.llm_engine import EngineConfig, LLMEngine
from peagle.engine.sampling import SamplingParams

here = Path(__file__).resolve().parents[1] / "int8"
items = [json.loads(line) for line in (here / "heldout.jsonl").read_text().splitlines()]
base = LLMEngine.from_pretrained(None, method="parallel", k="auto", max_num_seqs=1)
params = SamplingParams(max_tokens=128)
ids = [base.encode_prompt(it["prompt"]) for it in items]
LOOKUP_ONLY = scheduler.LOOKUP_ONLY
VARS = {"none": None, "off": dict(prompt_lookup_max=0), "merge": dict(merge_only=True), "shipped": {},
        "min1": dict(prompt_lookup_min=1), "min3": dict(prompt_lookup_min=3)}
names = list(VARS)
res = {v: [[] for _ in items] for v in names}
tokens = {}
for r in range(int(sys.argv[1])):
    for i in range(len(items)):
        s = (r + i) % len(names)
        for v in names[s:] + names[:s]:
            kw = dict(VARS[v]) if VARS[v] is not None else None
            scheduler.LOOKUP_ONLY = 0 if kw and kw.pop("merge_only", False) else LOOKUP_ONLY
            spec = kw is not None
            cfg = EngineConfig(method="parallel" if spec else "none", num_speculative_tokens="auto" if spec else 1,
                               max_num_seqs=1, **(kw or {}))
            out = LLMEngine(base.target, base.drafter if spec else None, cfg, base.tokenizer).generate([ids[i]], params)[0]
            assert tokens.setdefault(i, out.token_ids) == out.token_ids, f"prompt {i}: {v} gave other tokens"
            res[v][i].append((len(out.token_ids) / out.elapsed_s, out.stats.acceptance_length))
med = {v: [statistics.median(x for x, _ in c) for c in res[v]] for v in names}
print(f"{base.precision}; {sys.argv[1]} rounds; kinds: " + " ".join(it["kind"][:4] for it in items))
for v in names[1:]:
    ratios = [a / b for a, b in zip(med[v], med["none"])]
    al = statistics.mean(statistics.median(a for _, a in c) for c in res[v])
    print(f"{v:5s} mean of ratios {statistics.mean(ratios):.3f}, worst {min(ratios):.3f}, best {max(ratios):.3f}, "
          f"mean AL {al:.2f}: " + " ".join(f"{x:.2f}" for x in ratios), flush=True)
