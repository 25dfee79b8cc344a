"""16 MT-Bench requests at once (`rounds16.py`): `none`, the defaults as this tree prices drafted steps (at least the
batch's plain-step error), and as the tree before did (the error at their own rows alone). BENCHMARKS.md §54.

    python benchmarks/batch-gate/batch16_ab.py [ROUNDS]
"""
import sys
import types

from rounds16 import rounds16

from peagle.engine.llm_engine import LLMEngine

engines = {"none": LLMEngine.from_pretrained(None, method="none", max_num_seqs=16)}
engines["batch floor"] = LLMEngine.from_pretrained(None, method="parallel", k="auto", max_num_seqs=16)
engines["rows' own error"] = old = LLMEngine.from_pretrained(None, method="parallel", k="auto", max_num_seqs=16)
old.scheduler.auto.corrected_seconds = types.MethodType(
    lambda self, nodes, depth, batch: self.step_seconds(nodes, depth, batch) * self._error(batch * (nodes + 1)),
    old.scheduler.auto)
rounds16(engines, int(sys.argv[1]) if len(sys.argv) > 1 else 4)
