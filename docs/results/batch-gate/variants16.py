"""16 MT-Bench requests at once through one engine per variant (none, the defaults, the head alone, no response
table, ngram), kept across rounds, rounds interleaved. BENCHMARKS.md §54.

    python docs/results/batch-gate/variants16.py [ROUNDS]
"""
import time, statistics, sys
from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.prompts import dataset_path, read_prompt_file
prompts = read_prompt_file(dataset_path("mt-bench", None), "mt-bench")[:16]
V = {"none": dict(method="none"), "defaults": dict(method="parallel"),
     "head only": dict(method="parallel", prompt_lookup_max=0, response_lookup="none"),
     "no table": dict(method="parallel", response_lookup="none"), "ngram": dict(method="ngram")}
engs = {n: LLMEngine.from_pretrained(None, k="auto", max_num_seqs=16, **kw) for n, kw in V.items()}
ids = [engs["none"].encode_prompt(p.text) for p in prompts]
sp = SamplingParams(max_tokens=128, ignore_eos=True)
rates = {n: [] for n in V}
for rep in range(int(sys.argv[1]) if len(sys.argv) > 1 else 4):
    for n, e in engs.items():
        t = time.perf_counter(); e.generate(ids, sp); rates[n].append(2048 / (time.perf_counter() - t))
for n, r in rates.items():
    print(f"{n}: median {statistics.median(r):.1f} tok/s ({statistics.median(r)/statistics.median(rates['none']):.3f}x none)  runs {[round(x) for x in r]}")
