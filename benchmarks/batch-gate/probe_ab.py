"""P-EAGLE's defaults at 16 MT-Bench requests at once (`rounds16.py`): `none`; no probe where a head always right
could not pay (this tree, AutoK.could_pay); probes as before (could_pay always true on that engine's AutoK).
BENCHMARKS.md §54.

    python benchmarks/batch-gate/probe_ab.py [ROUNDS]
"""
import sys
import types

from rounds16 import rounds16

from peagle.engine.llm_engine import LLMEngine

engines = {"none": LLMEngine.from_pretrained(None, method="none", max_num_seqs=16),
           "no futile probes": LLMEngine.from_pretrained(None, method="parallel", k="auto", max_num_seqs=16),
           "probes as before": LLMEngine.from_pretrained(None, method="parallel", k="auto", max_num_seqs=16)}
old = engines["probes as before"].scheduler.auto
old.could_pay = types.MethodType(lambda self, batch, plain_rate: True, old)
rounds16(engines, int(sys.argv[1]) if len(sys.argv) > 1 else 5)
