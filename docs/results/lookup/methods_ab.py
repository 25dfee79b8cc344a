"""The speculative methods against `none` on the 12 held-out prompts of docs/results/int8/heldout.jsonl (a fresh
engine a request, as heldout.py; 128 tokens, greedy; rotating order, ROUNDS rounds, medians per prompt, every
output checked equal to plain decoding's): `generate`'s defaults (P-EAGLE, auto K, the lookup beside it), and
`ngram` (the text's drafts alone) at K=auto (3) and K=5.

    python docs/results/lookup/methods_ab.py ROUNDS
"""
import json
import statistics
import sys
from pathlib import Path

from peagle.engine.llm_engine import EngineConfig, LLMEngine
from peagle.engine.sampling import SamplingParams

here = Path(__file__).resolve().parents[1] / "int8"
items = [json.loads(line) for line in (here / "heldout.jsonl").read_text().splitlines()]
base = LLMEngine.from_pretrained(None, method="parallel", k="auto", max_num_seqs=1)
params = SamplingParams(max_tokens=128)
ids = [base.encode_prompt(it["prompt"]) for it in items]
VARS = {"none": ("none", 1), "defaults": ("parallel", "auto"), "ngram": ("ngram", "auto"), "ngram-k5": ("ngram", 5)}
names = list(VARS)
res = {v: [[] for _ in items] for v in names}
tokens = {}
for r in range(int(sys.argv[1])):
    for i in range(len(items)):
        s = (r + i) % len(names)
        for v in names[s:] + names[:s]:
            method, k = VARS[v]
            cfg = EngineConfig(method=method, num_speculative_tokens=k, max_num_seqs=1)
            out = LLMEngine(base.target, base.drafter, cfg, base.tokenizer).generate([ids[i]], params)[0]
            assert tokens.setdefault(i, out.token_ids) == out.token_ids, f"prompt {i}: {v} gave other tokens"
            res[v][i].append((len(out.token_ids) / out.elapsed_s, out.stats.acceptance_length))
med = {v: [statistics.median(x for x, _ in c) for c in res[v]] for v in names}
print(f"{base.precision}; {sys.argv[1]} rounds; kinds: " + " ".join(it["kind"][:4] for it in items))
for v in names[1:]:
    ratios = [a / b for a, b in zip(med[v], med["none"])]
    al = statistics.mean(statistics.median(a for _, a in c) for c in res[v])
    print(f"{v:8s} mean of ratios {statistics.mean(ratios):.3f}, worst {min(ratios):.3f}, best {max(ratios):.3f}, "
          f"mean AL {al:.2f}: " + " ".join(f"{x:.2f}" for x in ratios), flush=True)
