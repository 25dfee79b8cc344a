"""`generate`'s defaults with the response lookup table shipped beside the head (peagle/engine/lookup.py's
ResponseLookup) against the same without it (`--response-lookup none`, the defaults before), `--method ngram` (the
text's drafts and the table's, no head) and `none`, on the 12
held-out prompts of benchmarks/int8/heldout.py (or MT-Bench's first turns), same run, interleaved, each request
in a fresh engine as a new `peagle generate` process would be.

    python benchmarks/responses/ab.py [ROUNDS] [heldout|mtbench N]
"""
import json
import sys
from pathlib import Path

from peagle.engine.config import EngineConfig
from peagle.engine.llm_engine import LLMEngine, load_response_lookup
from peagle.engine.sampling import SamplingParams
from peagle.models.loader import load_drafter_for, resolve_target

here = Path(__file__).parent
sys.path.insert(0, str(here.parent / "int8"))
from interleave import interleaved, report  # noqa: E402

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
which = sys.argv[2] if len(sys.argv) > 2 else "heldout"
if which == "heldout":
    items = [json.loads(line) for line in (here.parent / "int8" / "heldout.jsonl").read_text().splitlines()]
else:
    path = here.parents[1] / "peagle" / "bench" / "data" / "mt_bench" / "question.jsonl"
    items = [{"kind": q["category"], "prompt": q["turns"][0]} for q in map(json.loads, open(path))]
    items = items[::max(1, len(items) // int(sys.argv[3]))][:int(sys.argv[3])] if len(sys.argv) > 3 else items
base = LLMEngine.from_pretrained(None, method="none", max_num_seqs=1)
path = resolve_target(None, weights=False)
head = load_drafter_for(base.target, path, None, base.tokenizer)
table = load_response_lookup(EngineConfig(), path, None, base.target.cfg.vocab_size)
assert table is not None, "no table beside the shipped head"
params = SamplingParams(max_tokens=128)
ids = [base.encode_prompt(it["prompt"]) for it in items]
names = ["none", "defaults", "no-table", "ngram"]


def run(name, i):
    method = {"none": "none", "ngram": "ngram"}.get(name, "parallel")
    cfg = EngineConfig(method=method, num_speculative_tokens=1 if name == "none" else "auto", max_num_seqs=1)
    engine = LLMEngine(base.target, head if method == "parallel" else None, cfg, base.tokenizer,
                       responses=None if name == "no-table" else table)
    out = engine.generate([ids[i]], params)[0]
    return out.token_ids, out.elapsed_s, out.stats.acceptance_length


res, tokens = interleaved(run, names, len(items), rounds)
report(res, tokens, items, names, base.precision, rounds)
