"""One 6,000-token prompt prefilled alone, offline, with `--long-prefill-step-ms` 200 and with the token rule
(None): the time to its first token and each step's (prefill tokens, ms), as BENCHMARKS.md §19 quotes them.

    python docs/results/zen5/prefill_chunks.py
"""
import sys
import time
from pathlib import Path

from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams

sys.path.insert(0, str(Path(__file__).parents[1] / "fair-prefill"))
from long_short import long_prompt  # noqa: E402

ids = long_prompt(6000)
for ms in (200.0, None, 200.0, None):
    e = LLMEngine.from_pretrained(None, method="parallel", k="auto", long_prefill_step_ms=ms)
    e.generate([ids[:100]], SamplingParams(max_tokens=4))
    chunks, observe = [], e.scheduler.observe

    def timed(work, tree, s, observe=observe, chunks=chunks):
        chunks.append((sum(n for _, n in work), round(s * 1e3)))
        observe(work, tree, s)
    e.scheduler.observe = timed
    t = time.perf_counter()
    e.generate([ids], SamplingParams(max_tokens=1))
    print(ms, round(time.perf_counter() - t, 2), len(chunks), chunks[:6], chunks[-4:], flush=True)
