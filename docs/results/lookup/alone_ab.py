"""`generate`'s defaults against `none` on the 12 held-out prompts (as heldout.py: a fresh engine a request), with
the lookup on: `auto-blind` (K=0 priced as plain decoding, as before d17196e), `auto-aware` (K=0 priced with the
lookup's measured yield, as shipped), `lookup-alone` (`auto`'s choice held at K=0: the head never drafts, the
text's own drafts verified alone; an in-process variant, not a shipped mode). Rotating order, ROUNDS rounds.

    python docs/results/lookup/alone_ab.py ROUNDS
"""
import json, statistics, sys
from peagle.engine.llm_engine import EngineConfig, LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.engine.tree import Tree
import peagle.engine.auto_k as AK
items = [json.loads(line) for line in open("docs/results/int8/heldout.jsonl")]
base = LLMEngine.from_pretrained(None, method="parallel", k="auto", max_num_seqs=1)
params = SamplingParams(max_tokens=128)
ids = [base.encode_prompt(it["prompt"]) for it in items]
orig, orig_rl = AK.AutoK.choose, AK.AutoK.record_lookup
V = {"none": None, "auto-blind": "blind", "auto-aware": "auto", "lookup-alone": "k0"}
names = list(V)
res = {v: [[] for _ in items] for v in names}
for r in range(int(sys.argv[1])):
    for i in range(len(items)):
        s = (r + i) % len(names)
        for v in names[s:] + names[:s]:
            m = V[v]
            AK.AutoK.choose = (lambda self, *a, **k: Tree(())) if m == "k0" else orig
            AK.AutoK.record_lookup = (lambda self, a: None) if m == "blind" else orig_rl
            cfg = EngineConfig(method="parallel" if m else "none", num_speculative_tokens="auto" if m else 1, max_num_seqs=1)
            out = LLMEngine(base.target, base.drafter if m else None, cfg, base.tokenizer).generate([ids[i]], params)[0]
            res[v][i].append((len(out.token_ids) / out.elapsed_s, out.stats.acceptance_length))
med = {v: [statistics.median(x for x, _ in c) for c in res[v]] for v in names}
for v in names[1:]:
    ratios = [a / b for a, b in zip(med[v], med["none"])]
    al = statistics.mean(statistics.median(a for _, a in c) for c in res[v])
    print(f"{v:12s} mean {statistics.mean(ratios):.3f}, worst {min(ratios):.3f}, best {max(ratios):.3f}, AL {al:.2f}: " + " ".join(f"{x:.2f}" for x in ratios), flush=True)
