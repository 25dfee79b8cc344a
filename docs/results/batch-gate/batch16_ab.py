"""16 MT-Bench requests at once (128 tokens each, EOS ignored) through one engine per variant, kept across rounds
(as a server's: `auto`'s state carries over), rounds interleaved: `none`, the defaults as this tree prices drafted
steps (at least the batch's plain-step error), and as the tree before did (the error at their own rows alone);
drafts and accepted tokens counted. BENCHMARKS.md §54.

    python docs/results/batch-gate/batch16_ab.py [ROUNDS]
"""
import copy
import statistics
import sys
import time
import types

from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.prompts import dataset_path, read_prompt_file

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 4
prompts = read_prompt_file(dataset_path("mt-bench", None), "mt-bench")[:16]
engines = {"none": LLMEngine.from_pretrained(None, method="none", max_num_seqs=16)}
engines["batch floor"] = LLMEngine.from_pretrained(None, method="parallel", k="auto", max_num_seqs=16)
engines["rows' own error"] = old = LLMEngine.from_pretrained(None, method="parallel", k="auto", max_num_seqs=16)
old.scheduler.auto.corrected_seconds = types.MethodType(
    lambda self, nodes, depth, batch: self.step_seconds(nodes, depth, batch) * self._error(batch * (nodes + 1)),
    old.scheduler.auto)
ids = [engines["none"].encode_prompt(p.text) for p in prompts]
sp = SamplingParams(max_tokens=128, ignore_eos=True)
rates, drafts = {n: [] for n in engines}, {n: [] for n in engines}
for r in range(rounds):
    for n, e in engines.items():
        s0 = copy.deepcopy(e.stats)
        t = time.perf_counter()
        e.generate(ids, sp)
        rates[n].append(2048 / (time.perf_counter() - t))
        drafts[n].append((e.stats.num_draft_tokens - s0.num_draft_tokens, e.stats.num_accepted_tokens - s0.num_accepted_tokens))
none = statistics.median(rates["none"])
for n in engines:
    m = statistics.median(rates[n])
    print(f"{n}: median {m:.1f} tok/s, {m / none:.3f}x none; runs {[round(x) for x in rates[n]]}; "
          f"draft tokens / accepted per run {drafts[n]}")
