"""`peagle generate`'s defaults (P-EAGLE, K chosen by the engine) against `--method none` on 12 prompts of
four kinds written for this measurement (QA, summarization, instructions, code; `heldout.jsonl`: in no
training or benchmark set), as a user runs them: each request in a fresh engine (its `auto` K state new, as
in a new `peagle generate` process; the weights loaded once), chat template, greedy, up to 128 tokens;
the rate is output tokens over the request's wall time (prefill included, as `generate` reports it).
Rounds interleave the two, alternating which goes first; medians per prompt, and the overall rate (all
tokens over all time).

    python docs/results/int8/heldout.py [ROUNDS] [--compute exact]   # writes heldout-<compute>.json
"""
import json
import statistics
import sys
from pathlib import Path

from peagle.engine.llm_engine import EngineConfig, LLMEngine
from peagle.engine.sampling import SamplingParams

rounds = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 3
compute = "exact" if "exact" in sys.argv else "fast"
here = Path(__file__).parent
items = [json.loads(line) for line in (here / "heldout.jsonl").read_text().splitlines()]
base = LLMEngine.from_pretrained(None, method="parallel", k="auto", max_num_seqs=1, compute=compute)
params = SamplingParams(max_tokens=128)
ids = [base.encode_prompt(it["prompt"]) for it in items]


def run(method, i):
    cfg = EngineConfig(method=method, num_speculative_tokens="auto" if method == "parallel" else 1, max_num_seqs=1)
    engine = LLMEngine(base.target, base.drafter if method == "parallel" else None, cfg, base.tokenizer)
    out = engine.generate([ids[i]], params)[0]
    return out.token_ids, out.elapsed_s, out.stats.acceptance_length


res = {m: [[] for _ in items] for m in ("none", "parallel")}
tokens = {}
for r in range(rounds):
    for i in range(len(items)):
        for m in (("none", "parallel") if (r + i) % 2 == 0 else ("parallel", "none")):
            toks, s, al = run(m, i)
            assert tokens.setdefault(i, toks) == toks, f"prompt {i}: {m} gave other tokens"
            res[m][i].append((len(toks), s, al))
print(f"compute {compute}, {base.precision}; {rounds} rounds\n")
print("| # | kind | tokens | none tok/s | generate defaults tok/s | ratio | AL |\n|---|---|---|---|---|---|---|")
ratios, tot = [], {"none": [0, 0.0], "parallel": [0, 0.0]}
for i, it in enumerate(items):
    rate = {m: statistics.median(n / s for n, s, _ in res[m][i]) for m in res}
    for m in res:
        tot[m][0] += sum(n for n, _, _ in res[m][i])
        tot[m][1] += sum(s for _, s, _ in res[m][i])
    ratios.append(rate["parallel"] / rate["none"])
    al = statistics.median(a for _, _, a in res["parallel"][i])
    print(f"| {i + 1} | {it['kind']} | {len(tokens[i])} | {rate['none']:.1f} | {rate['parallel']:.1f} | "
          f"{ratios[-1]:.2f}x | {al:.2f} |")
overall = (tot["parallel"][0] / tot["parallel"][1]) / (tot["none"][0] / tot["none"][1])
print(f"\noverall {overall:.2f}x, worst prompt {min(ratios):.2f}x, best {max(ratios):.2f}x")
(here / f"heldout-{compute}.json").write_text(json.dumps({"rounds": rounds, "compute": compute, "precision": base.precision,
                                                          "runs": res, "overall": overall, "ratios": ratios}) + "\n")
