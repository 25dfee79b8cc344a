"""`generate`'s defaults (P-EAGLE, auto K) with `auto`'s settings varied, against `--method none`, on the 12 held-out
prompts of docs/results/int8/heldout.jsonl (a fresh engine a request, as heldout.py; variants interleaved in rotating
order, ROUNDS rounds, medians per prompt). probe32: a probe every 32 steps (16); margin20: drafting must win 20% by
the model (10%); prior35: the first position's prior acceptance 0.35 (0.5).

    python docs/results/auto/variants.py ROUNDS
"""
import json, statistics, sys
from pathlib import Path
from peagle.engine.llm_engine import EngineConfig, LLMEngine
from peagle.engine.sampling import SamplingParams
here = Path(__file__).resolve().parents[1] / "int8"
items = [json.loads(l) for l in (here / "heldout.jsonl").read_text().splitlines()]
base = LLMEngine.from_pretrained(None, method="parallel", k="auto", max_num_seqs=1)
params = SamplingParams(max_tokens=128)
ids = [base.encode_prompt(it["prompt"]) for it in items]
VARS = {"none": None, "default": {}, "probe32": {"probe_every": 32}, "margin20": {"margin": 0.2}, "prior35": {"prior_p": 0.35}}
def run(v, i):
    kw = VARS[v]
    m = "none" if kw is None else "parallel"
    cfg = EngineConfig(method=m, num_speculative_tokens="auto" if m == "parallel" else 1, max_num_seqs=1)
    e = LLMEngine(base.target, base.drafter if m == "parallel" else None, cfg, base.tokenizer)
    a = e.scheduler.auto
    if kw:
        for k, val in kw.items():
            if k == "prior_p":
                a.accepted[0][0] = val * a.prior
            else:
                setattr(a, k, val)
                if k == "probe_every": a.interval = a.next_probe = val
    out = e.generate([ids[i]], params)[0]
    return len(out.token_ids) / out.elapsed_s
names = list(VARS)
res = {v: [[] for _ in items] for v in names}
R = int(sys.argv[1])
for r in range(R):
    for i in range(len(items)):
        order = names[r % len(names):] + names[:r % len(names)]
        for v in (order if (r + i) % 2 == 0 else order[::-1]):
            res[v][i].append(run(v, i))
med = {v: [statistics.median(x) for x in res[v]] for v in names}
for v in names[1:]:
    ratios = [a / b for a, b in zip(med[v], med["none"])]
    print(f"{v:10s} mean-of-ratios {statistics.mean(ratios):.3f} worst {min(ratios):.3f} best {max(ratios):.3f}  " + " ".join(f"{x:.2f}" for x in ratios), flush=True)
