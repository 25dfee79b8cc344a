"""The first step (a 96-token prefill, held-out prompt 5) of a fresh engine right after it is built, `none`
against P-EAGLE with K `auto` (whose build times its passes on the KV pools), alternating; the weights loaded once.

    python benchmarks/zen5-2/profile/first_step.py
"""
import json
import time
from pathlib import Path

from peagle.engine.llm_engine import EngineConfig, LLMEngine
from peagle.engine.sampling import SamplingParams

items = [json.loads(line) for line in (Path(__file__).parents[2] / "int8/heldout.jsonl").read_text().splitlines()]
base = LLMEngine.from_pretrained(None, method="parallel", k="auto", max_num_seqs=1)
ids = base.encode_prompt(items[4]["prompt"])
for method in ("none", "parallel") * 3:
    cfg = EngineConfig(method=method, num_speculative_tokens="auto" if method == "parallel" else 1, max_num_seqs=1)
    t0 = time.perf_counter()
    engine = LLMEngine(base.target, base.drafter if method == "parallel" else None, cfg, base.tokenizer)
    t1 = time.perf_counter()
    engine.add_request(ids, SamplingParams(max_tokens=1))
    engine.step()
    print(f"{method}: build {(t1 - t0) * 1e3:.1f} ms, first step {(time.perf_counter() - t1) * 1e3:.1f} ms ({len(ids)} prompt tokens)")
