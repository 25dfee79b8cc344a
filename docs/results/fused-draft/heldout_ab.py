"""Two forms of the same drafting on the 12 held-out prompts of docs/results/int8/heldout.py: `generate`'s defaults
(`auto`) and K fixed at 1 and 3, each in both forms, and `none`; same run, interleaved, each request in a fresh
engine, tokens checked equal; ratio to `none` per prompt (medians) and overall (all tokens over all time).
`fused`: the drafting pass in one native call (`peagle::draft`) against the same pass step by step
(ModelRunner.fused_drafting; heldout_ab.txt, heldout_ab_costs.txt); `head`: the head in Q4_1 against the same head in
Q8_0 (head_ab.txt).

    python docs/results/fused-draft/heldout_ab.py [ROUNDS] [fused|head]
"""
import json
import sys
from pathlib import Path

from peagle.engine.llm_engine import EngineConfig, LLMEngine
from peagle.engine.model_runner import ModelRunner
from peagle.engine.sampling import SamplingParams
from peagle.models import loader
from peagle.models.loader import load_drafter_for, resolve_target

here = Path(__file__).parent
sys.path.insert(0, str(here.parent / "int8"))
from interleave import interleaved, report  # noqa: E402

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
mode = sys.argv[2] if len(sys.argv) > 2 else "fused"
other = {"fused": "-steps", "head": "-q8_0"}[mode]
items = [json.loads(line) for line in (here.parent / "int8" / "heldout.jsonl").read_text().splitlines()]
base = LLMEngine.from_pretrained(None, method="none", max_num_seqs=1)
heads = {}
for fmt in ("q4_1", "q8_0") if mode == "head" else (None,):
    if fmt:
        loader.head_format = lambda target, head, fmt=fmt: fmt
    heads[fmt] = load_drafter_for(base.target, resolve_target(None, weights=False), None, base.tokenizer)
params = SamplingParams(max_tokens=128)
ids = [base.encode_prompt(it["prompt"]) for it in items]
names = ["none"] + [f"{v}{s}" for v in ("auto", "k1", "k3") for s in ("", other)]


def run(name, i):
    k = 1 if name == "none" else "auto" if name.startswith("auto") else int(name[1])
    ModelRunner.fused_drafting = not name.endswith("-steps")
    head = heads["q8_0" if name.endswith("-q8_0") else "q4_1" if mode == "head" else None]
    cfg = EngineConfig(method="none" if name == "none" else "parallel", num_speculative_tokens=k, max_num_seqs=1)
    out = LLMEngine(base.target, None if name == "none" else head, cfg, base.tokenizer).generate([ids[i]], params)[0]
    return out.token_ids, out.elapsed_s, out.stats.acceptance_length


res, tokens = interleaved(run, names, len(items), rounds)
report(res, tokens, items, names, base.precision, rounds)
