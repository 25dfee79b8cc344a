"""The head in Q4_1 (the default beside a target on the integer path) against the same head in Q8_0 (before), on
the 12 held-out prompts of docs/results/int8/heldout.py: `generate`'s defaults (`auto`) and K fixed at 1 and 3, and
`none`; same run, interleaved, each request in a fresh engine, tokens checked equal; ratio to `none` per prompt
(medians) and overall (all tokens over all time).

    python docs/results/fused-draft/head_ab.py [ROUNDS]
"""
import json
import statistics
import sys
from pathlib import Path

from peagle.engine.llm_engine import EngineConfig, LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.models import loader
from peagle.models.loader import load_drafter_for, resolve_target

here = Path(__file__).parent
sys.path.insert(0, str(here.parent / "int8"))
from interleave import interleaved  # noqa: E402

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
items = [json.loads(line) for line in (here.parent / "int8" / "heldout.jsonl").read_text().splitlines()]
base = LLMEngine.from_pretrained(None, method="none", max_num_seqs=1)
heads = {}
for fmt in ("q4_1", "q8_0"):
    loader.head_format = lambda target, head, fmt=fmt: fmt
    heads[fmt] = load_drafter_for(base.target, resolve_target(None, weights=False), None, base.tokenizer)
params = SamplingParams(max_tokens=128)
ids = [base.encode_prompt(it["prompt"]) for it in items]
names = ["none", "auto", "auto-q8_0", "k1", "k1-q8_0", "k3", "k3-q8_0"]


def run(name, i):
    k = 1 if name == "none" else "auto" if name.startswith("auto") else int(name[1])
    head = heads["q8_0" if name.endswith("-q8_0") else "q4_1"]
    cfg = EngineConfig(method="none" if name == "none" else "parallel", num_speculative_tokens=k, max_num_seqs=1)
    out = LLMEngine(base.target, None if name == "none" else head, cfg, base.tokenizer).generate([ids[i]], params)[0]
    return out.token_ids, out.elapsed_s, out.stats.acceptance_length


res, tokens = interleaved(run, names, len(items), rounds)
print(f"{base.precision}; {rounds} rounds; ratio to `none` (medians per prompt), AL in brackets\n")
print("| # | kind | tokens | " + " | ".join(names[1:]) + " |\n|---|---|---|" + "---|" * (len(names) - 1))
tot = {v: [0, 0.0] for v in names}
for i, it in enumerate(items):
    rate = {v: statistics.median(n / s for n, s, _ in res[v][i]) for v in names}
    for v in names:
        tot[v][0] += sum(n for n, _, _ in res[v][i])
        tot[v][1] += sum(s for _, s, _ in res[v][i])
    cells = [f"{rate[v] / rate['none']:.2f}x ({statistics.median(a for _, _, a in res[v][i]):.2f})" for v in names[1:]]
    print(f"| {i + 1} | {it['kind']} | {len(tokens[i])} | " + " | ".join(cells) + " |")
none = tot["none"][0] / tot["none"][1]
print("\noverall: " + ", ".join(f"{v} {tot[v][0] / tot[v][1] / none:.3f}x" for v in names[1:]))
