"""A 4,000-token prompt's time to the first token on the shipped GGUF, `--compute fast` against `--compute
exact` (the engine's default chunks of 2,048 tokens), and llama.cpp's own prompt processing of 4,000 tokens
(`llama-bench -p 4000 -n 0`), same run; medians of ROUNDS.

    python benchmarks/int8/prefill.py [ROUNDS]
"""
import statistics
import sys

from peagle.bench.peers import llamacpp
from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams

N = 4000
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
engines = {c: LLMEngine.from_pretrained(None, method="none", max_num_seqs=1, max_model_len=N + 64, compute=c)
           for c in ("fast", "exact")}
ids = (engines["fast"].encode_prompt("Tell me everything you know about the history of the ocean. " * 400, chat=False)
       * 2)[:N]
ttft = {c: [] for c in engines} | {"llama-bench Q4_1 pp4000": []}
for _ in range(rounds):
    for c, e in engines.items():
        ttft[c].append(e.generate([ids], SamplingParams(max_tokens=1, ignore_eos=True))[0].ttft_s)
    ttft["llama-bench Q4_1 pp4000"].append(N / llamacpp.llama_bench("Q4_1", prompt=N, gen=0, reps=1)["avg_ts"])
med = {k: statistics.median(v) for k, v in ttft.items()}
print(f"| system | time to first token, s ({N} tokens) | tokens/s | against llama.cpp |\n|---|---|---|---|")
for k, s in med.items():
    name = f"peagle `--compute {k}` ({engines[k].precision})" if k in engines else k
    print(f"| {name} | {s:.2f} | {N / s:.0f} | {med['llama-bench Q4_1 pp4000'] / s:.2f}x |")
