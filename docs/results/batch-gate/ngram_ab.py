"""`--method ngram` at K auto with its drafts priced (this tree: AutoK.lookup_pays beside other sequences) against
unpriced (the tree before: every proposal verified; the engine's AutoK removed), `none` beside them: 16 MT-Bench
requests at once through one engine per variant kept across rounds, then the 12 held-out prompts one request at a
time (a fresh engine a request), variants interleaved, tokens checked equal. BENCHMARKS.md §54.

    python docs/results/batch-gate/ngram_ab.py [ROUNDS16] [ROUNDS1]
"""
import json
import statistics
import sys
import time
from pathlib import Path

from peagle.engine.llm_engine import EngineConfig, LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.prompts import dataset_path, read_prompt_file

sys.path.insert(0, str(Path(__file__).parents[1] / "int8"))
from interleave import interleaved, report  # noqa: E402

r16 = int(sys.argv[1]) if len(sys.argv) > 1 else 4
r1 = int(sys.argv[2]) if len(sys.argv) > 2 else 2
NAMES = ["none", "ngram priced", "ngram unpriced"]


def engine(name, base=None, seqs=16):
    method = "none" if name == "none" else "ngram"
    if base is None:
        e = LLMEngine.from_pretrained(None, method=method, k="auto", max_num_seqs=seqs)
    else:
        e = LLMEngine(base.target, None, EngineConfig(method=method, num_speculative_tokens="auto", max_num_seqs=seqs),
                      base.tokenizer, responses=base.scheduler.responses if method == "ngram" else None)
    if name == "ngram unpriced":
        e.scheduler.auto = None
    return e


engines = {n: engine(n) for n in NAMES}
ids = [engines["none"].encode_prompt(p.text) for p in read_prompt_file(dataset_path("mt-bench", None), "mt-bench")[:16]]
sp = SamplingParams(max_tokens=128, ignore_eos=True)
rates, drafted = {n: [] for n in NAMES}, {n: [] for n in NAMES}
for r in range(r16):
    for n, e in engines.items():
        before = e.stats.num_draft_tokens
        t = time.perf_counter()
        e.generate(ids, sp)
        rates[n].append(2048 / (time.perf_counter() - t))
        drafted[n].append(e.stats.num_draft_tokens - before)
none = statistics.median(rates["none"])
print(f"16 MT-Bench requests at once, {r16} rounds")
for n in NAMES:
    m = statistics.median(rates[n])
    print(f"{n}: median {m:.1f} tok/s, {m / none:.3f}x none; runs {[round(x) for x in rates[n]]}; draft tokens {drafted[n]}")

base = engines["ngram priced"]
items = [json.loads(line) for line in (Path(__file__).parents[1] / "int8/heldout.jsonl").read_text().splitlines()]
hids = [base.encode_prompt(it["prompt"]) for it in items]


def run(name, i):
    out = engine(name, base, 1).generate([hids[i]], SamplingParams(max_tokens=128))[0]
    return out.token_ids, out.elapsed_s, out.stats.acceptance_length


res, tokens = interleaved(run, NAMES, len(items), r1)
print()
report(res, tokens, items, NAMES, "12 held-out prompts, one request at a time", r1)
