"""16 MT-Bench requests at once (`rounds16.py`) through `none`, the defaults, the head alone, the defaults without the
response table, and ngram. BENCHMARKS.md §54.

    python benchmarks/batch-gate/variants16.py [ROUNDS]
"""
import sys

from rounds16 import rounds16

from peagle.engine.llm_engine import LLMEngine

V = {"none": dict(method="none"), "defaults": dict(method="parallel"),
     "head only": dict(method="parallel", prompt_lookup_max=0, response_lookup="none"),
     "no table": dict(method="parallel", response_lookup="none"), "ngram": dict(method="ngram")}
rounds16({n: LLMEngine.from_pretrained(None, k="auto", max_num_seqs=16, **kw) for n, kw in V.items()},
         int(sys.argv[1]) if len(sys.argv) > 1 else 4)
