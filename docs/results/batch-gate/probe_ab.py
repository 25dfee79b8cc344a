"""P-EAGLE's defaults at 16 MT-Bench requests at once (128 tokens, EOS ignored), one engine per variant kept across
rounds, rounds interleaved: `none`; no probe where a head always right could not pay (this tree,
AutoK.could_pay); probes as before (could_pay always true on that engine's AutoK). BENCHMARKS.md §54.

    python docs/results/batch-gate/probe_ab.py [ROUNDS]
"""
import statistics
import sys
import time
import types

from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.prompts import dataset_path, read_prompt_file

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
engines = {"none": LLMEngine.from_pretrained(None, method="none", max_num_seqs=16),
           "no futile probes": LLMEngine.from_pretrained(None, method="parallel", k="auto", max_num_seqs=16),
           "probes as before": LLMEngine.from_pretrained(None, method="parallel", k="auto", max_num_seqs=16)}
old = engines["probes as before"].scheduler.auto
old.could_pay = types.MethodType(lambda self, batch, plain_rate: True, old)
ids = [engines["none"].encode_prompt(p.text) for p in read_prompt_file(dataset_path("mt-bench", None), "mt-bench")[:16]]
sp = SamplingParams(max_tokens=128, ignore_eos=True)
rates, drafted = {n: [] for n in engines}, {n: [] for n in engines}
for r in range(rounds):
    for n, e in engines.items():
        before = e.stats.num_draft_tokens
        t = time.perf_counter()
        e.generate(ids, sp)
        rates[n].append(2048 / (time.perf_counter() - t))
        drafted[n].append(e.stats.num_draft_tokens - before)
none = statistics.median(rates["none"])
for n in engines:
    m = statistics.median(rates[n])
    print(f"{n}: median {m:.1f} tok/s, {m / none:.3f}x none; runs {[round(x) for x in rates[n]]}; draft tokens {drafted[n]}")
