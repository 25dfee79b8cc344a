"""`generate`'s defaults (K chosen by `auto`) against fixed K and `none` on the 12 held-out prompts of
docs/results/int8/heldout.py, same run, interleaved (each request in a fresh engine, as a new `peagle generate`
process): does `auto` pick the K that pays on each prompt? Prompt lookup as the defaults (on). A variant
`treeB` is P-EAGLE with an `auto` token tree of at most B nodes (K by `auto`; BENCHMARKS.md §48).

    python docs/results/heldout-k/k_ab.py [ROUNDS] [K|treeB ...]   # e.g. 3 1 2 3 5, or 2 tree4 tree8 tree16
"""
import json
import sys
from pathlib import Path

from peagle.engine.llm_engine import EngineConfig, LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.models.loader import load_drafter_for, resolve_target

here = Path(__file__).parent
sys.path.insert(0, str(here.parent / "int8"))
from interleave import interleaved, report  # noqa: E402

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
variants = [v if v.startswith("tree") else f"k{int(v)}" for v in sys.argv[2:]] or ["k1", "k2", "k3", "k5"]
items = [json.loads(line) for line in (here.parent / "int8" / "heldout.jsonl").read_text().splitlines()]
base = LLMEngine.from_pretrained(None, method="none", max_num_seqs=1)
head = load_drafter_for(base.target, resolve_target(None, weights=False), None, base.tokenizer)
params = SamplingParams(max_tokens=128)
ids = [base.encode_prompt(it["prompt"]) for it in items]
names = ["none", "auto", *variants]


def run(name, i):
    k = int(name[1:]) if name.startswith("k") else 1 if name == "none" else "auto"
    tree = dict(speculative_token_tree="auto", speculative_tree_budget=int(name[4:])) if name.startswith("tree") else {}
    cfg = EngineConfig(method="none" if name == "none" else "parallel", num_speculative_tokens=k, max_num_seqs=1,
                       **tree)
    out = LLMEngine(base.target, None if name == "none" else head, cfg, base.tokenizer).generate([ids[i]], params)[0]
    return out.token_ids, out.elapsed_s, out.stats.acceptance_length


res, tokens = interleaved(run, names, len(items), rounds)
report(res, tokens, items, names, base.precision, rounds)
