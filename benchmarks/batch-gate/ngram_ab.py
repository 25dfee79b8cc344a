"""`--method ngram` at K auto with its drafts priced (this tree: AutoK.lookup_pays beside other sequences) against
unpriced (the tree before: every proposal verified; the engine's AutoK removed), `none` beside them: 16 MT-Bench
requests at once through one engine per variant kept across rounds, then the 12 held-out prompts one request at a
time (a fresh engine a request), variants interleaved, tokens checked equal. BENCHMARKS.md §54.

    python benchmarks/batch-gate/ngram_ab.py [ROUNDS16] [ROUNDS1]
"""
import json
import sys
from pathlib import Path

from peagle.engine.llm_engine import EngineConfig, LLMEngine
from peagle.engine.sampling import SamplingParams

sys.path.insert(0, str(Path(__file__).parents[1] / "int8"))
sys.path.insert(0, str(Path(__file__).parent))
from interleave import interleaved, report  # noqa: E402
from rounds16 import rounds16  # noqa: E402

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
rounds16(engines, r16)

base = engines["ngram priced"]
items = [json.loads(line) for line in (Path(__file__).parents[1] / "int8/heldout.jsonl").read_text().splitlines()]
hids = [base.encode_prompt(it["prompt"]) for it in items]


def run(name, i):
    out = engine(name, base, 1).generate([hids[i]], SamplingParams(max_tokens=128))[0]
    return out.token_ids, out.elapsed_s, out.stats.acceptance_length


res, tokens = interleaved(run, NAMES, len(items), r1)
print()
report(res, tokens, items, NAMES, "12 held-out prompts, one request at a time", r1)
