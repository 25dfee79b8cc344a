"""What the scripts beside this one share: the prompts, the default model with its head and response table loaded
once, the start-up cost curves timed once and reused by every engine after, and a fresh engine per request for a
variant (`none`, `ngram`, or the defaults: P-EAGLE with auto K, prompt lookup and the table), as `peagle generate`
makes one. BENCHMARKS.md §52."""
import json
import os
from pathlib import Path

from peagle.engine.config import EngineConfig
from peagle.engine.llm_engine import LLMEngine, load_response_lookup
from peagle.engine.model_runner import ModelRunner
from peagle.engine.sampling import SamplingParams
from peagle.models.loader import load_drafter_for, resolve_target

HERE = Path(__file__).resolve().parent


def prompt_texts() -> list[str]:
    """The 12 held-out prompts, or with $PROMPTS=mtbench20 20 of MT-Bench's first turns (every fourth)."""
    if os.environ.get("PROMPTS") == "mtbench20":
        questions = HERE.parents[1] / "peagle" / "bench" / "data" / "mt_bench" / "question.jsonl"
        return [q["turns"][0] for q in map(json.loads, open(questions))][::4][:20]
    return [json.loads(line)["prompt"] for line in (HERE.parent / "int8" / "heldout.jsonl").read_text().splitlines()]


base = LLMEngine.from_pretrained(None, method="none", max_num_seqs=1)
_path = resolve_target(None, weights=False)
head = load_drafter_for(base.target, _path, None, base.tokenizer)
table = load_response_lookup(EngineConfig(), _path, None, base.target.cfg.vocab_size)
ids = [base.encode_prompt(text) for text in prompt_texts()]
_measure, _costs = ModelRunner.measure_costs, {}
ModelRunner.measure_costs = lambda self, *a: _costs["c"] if _costs else _costs.setdefault("c", _measure(self, *a))


def engine(variant: str, prompt: list[int]) -> tuple[LLMEngine, object]:
    """A fresh engine for ``variant`` (`none`, `ngram`, else the defaults) with ``prompt`` added (greedy, 128 tokens
    at most): the engine and the request's sequence."""
    method = {"none": "none", "ngram": "ngram"}.get(variant, "parallel")
    cfg = EngineConfig(method=method, num_speculative_tokens=1 if method == "none" else "auto", max_num_seqs=1)
    e = LLMEngine(base.target, head if method == "parallel" else None, cfg, base.tokenizer, responses=table)
    return e, e.add_request(prompt, SamplingParams(max_tokens=128))


def alternating(passes: int, variants: list[str]):
    """(variant, prompt index) for ``passes`` passes over the prompts, every variant on each prompt in turn, the
    order rotating from prompt to prompt."""
    for p in range(passes):
        for i in range(len(ids)):
            r = (i + p) % len(variants)
            for v in variants[r:] + variants[:r]:
                yield v, i
