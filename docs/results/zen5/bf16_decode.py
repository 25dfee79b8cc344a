"""bfloat16 weights on two threads against llama.cpp's own `llama-bench` BF16 tg128 on the same weights (its
BF16 conversion of the shipped file): peagle `none` with `--compute fast` (the bf16 dot-product path where
the CPU has AVX512_BF16) and `--compute exact` (float32 arithmetic), 128 tokens after each of the first
PROMPTS MT-Bench questions, greedy, EOS ignored, rate 127 / (time after the first token); rounds interleave
the three; medians.

    python docs/results/zen5/bf16_decode.py [ROUNDS] [PROMPTS]
"""
import statistics
import sys

from peagle.bench.peers import llamacpp
from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.prompts import dataset_path, read_prompt_file

N = 128
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
prompts = read_prompt_file(dataset_path("mt-bench", None), "mt-bench")[:int(sys.argv[2]) if len(sys.argv) > 2 else 4]


def peagle(compute):
    engine = LLMEngine.from_pretrained(None, method="none", max_num_seqs=1, dtype="bfloat16", quantization="none",
                                       compute=compute)
    ids = [engine.encode_prompt(p.text) for p in prompts]

    def run():
        outs = [engine.generate([i], SamplingParams(max_tokens=N, ignore_eos=True))[0] for i in ids]
        return [(N - 1) / (o.elapsed_s - o.ttft_s) for o in outs]
    return f"peagle `none`, bfloat16 weights, `--compute {compute}` ({engine.precision})", run


systems = dict(peagle(c) for c in ("fast", "exact"))
systems["llama-bench BF16 tg128"] = lambda: [llamacpp.llama_bench("BF16", prompt=0, gen=N, reps=3)["avg_ts"]]
for run in systems.values():
    run()
rates = {name: [] for name in systems}
for _ in range(rounds):
    for name, run in systems.items():
        rates[name] += run()
ref = statistics.median(rates["llama-bench BF16 tg128"])
print("| system | decode tok/s (median) | against llama-bench BF16 |\n|---|---|---|")
for name, xs in rates.items():
    print(f"| {name} | {statistics.median(xs):.1f} | {statistics.median(xs) / ref:.2f}x |")
