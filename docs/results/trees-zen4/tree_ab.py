"""`generate`'s defaults (a chain of K chosen by `auto`) against `auto` trees of a few budgets on the 12 held-out
prompts of docs/results/int8/heldout.py, same run, interleaved (each request in a fresh engine): do trees pay now
that a round of few rows costs 1.2-1.4x a plain step (§46)?

    python docs/results/trees-zen4/tree_ab.py [ROUNDS] [BUDGET ...]   # e.g. 2 4 8 16
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

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
budgets = [int(b) for b in sys.argv[2:]] or [4, 8, 16]
items = [json.loads(line) for line in (here.parent / "int8" / "heldout.jsonl").read_text().splitlines()]
base = LLMEngine.from_pretrained(None, method="none", max_num_seqs=1)
head = load_drafter_for(base.target, resolve_target(None, weights=False), None, base.tokenizer)
params = SamplingParams(max_tokens=128)
ids = [base.encode_prompt(it["prompt"]) for it in items]
names = ["none", "auto", *(f"tree{b}" for b in budgets)]


def run(name, i):
    tree = dict(speculative_token_tree="auto", speculative_tree_budget=int(name[4:])) if name.startswith("tree") else {}
    cfg = EngineConfig(method="none" if name == "none" else "parallel", num_speculative_tokens="auto",
                       max_num_seqs=1, **tree)
    out = LLMEngine(base.target, None if name == "none" else head, cfg, base.tokenizer).generate([ids[i]], params)[0]
    return out.token_ids, out.elapsed_s, out.stats.acceptance_length


res, tokens = interleaved(run, names, len(items), rounds)
report(res, tokens, items, names, base.precision, rounds)
