"""peagle `none` in bf16 (`--quantization none`) against `llama-bench` BF16 tg128, interleaved: 3 MT-Bench prompts
(128 tokens after each, EOS ignored; the rate after the first token) then one llama-bench tg128 (3 reps), ROUNDS times.

    python docs/results/bf16/bf16.py ROUNDS
"""
import statistics, sys
from peagle.bench.peers import llamacpp
from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.prompts import dataset_path, read_prompt_file
N = 128
prompts = read_prompt_file(dataset_path("mt-bench", None), "mt-bench")[:3]
engine = LLMEngine.from_pretrained(None, method="none", max_num_seqs=1, dtype="bfloat16", quantization="none")
ids = [engine.encode_prompt(p.text) for p in prompts]
def pe():
    out = []
    for i in ids:
        o = engine.generate([i], SamplingParams(max_tokens=N, ignore_eos=True))[0]
        out.append((N - 1) / (o.elapsed_s - o.ttft_s))
    return out
pe()
P, L = [], []
for r in range(int(sys.argv[1])):
    P += pe(); L.append(llamacpp.llama_bench("BF16", prompt=0, gen=N, reps=3)["avg_ts"])
    print(r, [round(x, 1) for x in P[-3:]], round(L[-1], 1), flush=True)
print("peagle bf16", round(statistics.median(P), 1), "llama-bench BF16", round(statistics.median(L), 1), "ratio", round(statistics.median(P) / statistics.median(L), 3))
