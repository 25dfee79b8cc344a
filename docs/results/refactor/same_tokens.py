"""Issue 37's check that the engine's split changed nothing: the engine of a given source tree (PYTHONPATH)
decodes the first PROMPTS MT-Bench questions (chat template, greedy, 64 tokens, EOS ignored) with `none`
and with `generate`'s defaults (P-EAGLE, auto K), one request at a time, ROUNDS times; writes the tokens
and the median decode rate per method to OUT (json). Run it for the old and the new tree, alternating,
and compare (compare.py).

    PYTHONPATH=TREE python docs/results/refactor/same_tokens.py OUT [PROMPTS] [ROUNDS]
"""
import json
import statistics
import sys

from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.prompts import dataset_path, read_prompt_file

out, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 40
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 1
prompts = read_prompt_file(dataset_path("mt-bench", None), "mt-bench")[:n]
res = {}
for method in ("none", "parallel"):
    engine = LLMEngine.from_pretrained(None, method=method, k="auto", max_num_seqs=1)
    ids = [engine.encode_prompt(p.text) for p in prompts]
    tokens, rates = [], []
    for r in range(rounds):
        for i in ids:
            o = engine.generate([i], SamplingParams(max_tokens=64, ignore_eos=True))[0]
            rates.append(63 / (o.elapsed_s - o.ttft_s))
            if r == 0:
                tokens.append(o.token_ids)
    res[method] = {"tokens": tokens, "rate": statistics.median(rates)}
json.dump(res, open(out, "w"))
print(out, {m: round(v["rate"], 1) for m, v in res.items()})
