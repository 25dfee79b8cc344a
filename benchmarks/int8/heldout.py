"""`peagle generate`'s defaults (P-EAGLE, K chosen by the engine) against `--method none` on 12 prompts of
four kinds written for this measurement (QA, summarization, instructions, code; `heldout.jsonl`: in no
training or benchmark set), as a user runs them: each request in a fresh engine (its `auto` K state new, as
in a new `peagle generate` process; the weights loaded once), chat template, greedy, up to 128 tokens;
the rate is output tokens over the request's wall time (prefill included, as `generate` reports it).
Rounds interleave the variants, rotating which goes first; medians per prompt, and the overall rate (all
tokens over all time). `--drafter HEAD ...` puts those heads in the same run (default: the shipped one).

    python benchmarks/int8/heldout.py [ROUNDS] [--compute exact] [--drafter HEAD ...]   # writes heldout-<compute>.json
"""
import json
import statistics
import sys
from pathlib import Path

from peagle.engine.llm_engine import EngineConfig, LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.models.loader import load_drafter_for, resolve_target

sys.path.insert(0, str(Path(__file__).parent))
from interleave import interleaved  # noqa: E402

args = sys.argv[1:]
rounds = int(args[0]) if args and args[0].isdigit() else 3
compute = "exact" if "exact" in args else "fast"
heads = args[args.index("--drafter") + 1:] if "--drafter" in args else [None]
here = Path(__file__).parent
items = [json.loads(line) for line in (here / "heldout.jsonl").read_text().splitlines()]
base = LLMEngine.from_pretrained(None, method="none", max_num_seqs=1, compute=compute)
drafters = {h or "parallel": load_drafter_for(base.target, resolve_target(None, weights=False), h, base.tokenizer)
            for h in heads}
params = SamplingParams(max_tokens=128)
ids = [base.encode_prompt(it["prompt"]) for it in items]
names = ["none", *drafters]


def run(name, i):
    spec = name != "none"
    cfg = EngineConfig(method="parallel" if spec else "none", num_speculative_tokens="auto" if spec else 1, max_num_seqs=1)
    engine = LLMEngine(base.target, drafters[name] if spec else None, cfg, base.tokenizer)
    out = engine.generate([ids[i]], params)[0]
    return out.token_ids, out.elapsed_s, out.stats.acceptance_length


res, tokens = interleaved(run, names, len(items), rounds)
print(f"compute {compute}, {base.precision}; {rounds} rounds")
summary = {}
for m in drafters:
    print(f"\n{m}\n\n| # | kind | tokens | none tok/s | generate defaults tok/s | ratio | AL |\n|---|---|---|---|---|---|---|")
    ratios, tot = [], {"none": [0, 0.0], m: [0, 0.0]}
    for i, it in enumerate(items):
        rate = {v: statistics.median(n / s for n, s, _ in res[v][i]) for v in tot}
        for v in tot:
            tot[v][0] += sum(n for n, _, _ in res[v][i])
            tot[v][1] += sum(s for _, s, _ in res[v][i])
        ratios.append(rate[m] / rate["none"])
        al = statistics.median(a for _, _, a in res[m][i])
        print(f"| {i + 1} | {it['kind']} | {len(tokens[i])} | {rate['none']:.1f} | {rate[m]:.1f} | {ratios[-1]:.2f}x | {al:.2f} |")
    overall = (tot[m][0] / tot[m][1]) / (tot["none"][0] / tot["none"][1])
    summary[m] = {"overall": overall, "ratios": ratios}
    print(f"\noverall {overall:.2f}x, worst prompt {min(ratios):.2f}x, best {max(ratios):.2f}x")
(here.resolve().parents[1] / "docs" / "results" / "int8" / f"heldout-{compute}.json").write_text(json.dumps({"rounds": rounds, "compute": compute, "precision": base.precision,
                                                          "runs": res, **summary}) + "\n")
