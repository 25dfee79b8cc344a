"""auto's drafted steps priced with at least the batch's plain-step error (this tree) against the error at their
own rows alone (the tree before, restored on the engine's AutoK), `none` beside them: the 12 held-out prompts
one request at a time (`int8/heldout.jsonl`, a fresh engine a request, as `peagle generate` runs, the response
table loaded), variants interleaved, tokens checked equal. BENCHMARKS.md §54.

    python benchmarks/batch-gate/floor_ab.py [ROUNDS]
"""
import json
import sys
import types
from pathlib import Path

from peagle.engine.llm_engine import EngineConfig, LLMEngine
from peagle.engine.sampling import SamplingParams

sys.path.insert(0, str(Path(__file__).parents[1] / "int8"))
from interleave import interleaved, report  # noqa: E402

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
items = [json.loads(line) for line in (Path(__file__).parents[1] / "int8/heldout.jsonl").read_text().splitlines()]
base = LLMEngine.from_pretrained(None, method="parallel", k="auto", max_num_seqs=1)
ids = [base.encode_prompt(it["prompt"]) for it in items]
params = SamplingParams(max_tokens=128)


def before(self, nodes, depth, batch):   # the tree before: the error at the step's own rows alone
    return self.step_seconds(nodes, depth, batch) * self._error(batch * (nodes + 1))


def run(name, i):
    spec = name != "none"
    cfg = EngineConfig(method="parallel" if spec else "none", num_speculative_tokens="auto" if spec else 1, max_num_seqs=1)
    engine = LLMEngine(base.target, base.drafter if spec else None, cfg, base.tokenizer,
                       responses=base.scheduler.responses if spec else None)
    if name == "rows' own error":
        engine.scheduler.auto.corrected_seconds = types.MethodType(before, engine.scheduler.auto)
    out = engine.generate([ids[i]], params)[0]
    return out.token_ids, out.elapsed_s, out.stats.acceptance_length


names = ["none", "batch floor", "rows' own error"]
res, tokens = interleaved(run, names, len(items), rounds)
report(res, tokens, items, names, "12 held-out prompts, one request at a time", rounds)
