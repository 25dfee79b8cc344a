"""Where the CPU-roofline issue starts on this machine: decode speed of llama.cpp's engine in-process
(llama-cpp-python, F32 / BF16 / Q4_1 files made from the shipped one) against peagle's engine
(`none` float32 and bf16, and `generate`'s defaults: P-EAGLE, K chosen by the engine, bf16), on the
same MT-Bench prompts (chat template, token ids from peagle's tokenizer), greedy, 128 new tokens, EOS
ignored. Decode rate = (tokens - 1) / (time after the first token); rounds interleave the systems.

    python docs/results/cpu-roofline/engines.py [ROUNDS] [PROMPTS]
"""
import statistics
import sys
import time

from peagle.bench import llamacpp
from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.prompts import dataset_path, read_prompt_file

N = 128
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
num_prompts = int(sys.argv[2]) if len(sys.argv) > 2 else 6
prompts = read_prompt_file(dataset_path("mt-bench", None), "mt-bench")[:num_prompts]


def peagle_system(method, dtype):
    engine = LLMEngine.from_pretrained(None, method=method, k="auto", dtype=dtype, max_num_seqs=1)
    ids = [engine.encode_prompt(p.text) for p in prompts]

    def run(i):
        out = engine.generate([ids[i]], SamplingParams(max_tokens=N, ignore_eos=True))[0]
        return (N - 1) / (out.elapsed_s - out.ttft_s)
    return ids, run


def llama_system(kind, ids):
    from llama_cpp import Llama

    llm = Llama(model_path=str(llamacpp.gguf_file(kind)), n_threads=2, n_threads_batch=2, n_ctx=2048,
                n_batch=llamacpp.safe_batch(kind) or 512, verbose=False)

    def run(i):
        llm.reset()
        llm.eval(ids[i])
        tok = llm.sample(top_k=1, temp=0.0)
        t = time.perf_counter()
        for _ in range(N - 1):
            llm.eval([tok])
            tok = llm.sample(top_k=1, temp=0.0)
        return (N - 1) / (time.perf_counter() - t)
    return run


ids, none32 = peagle_system("none", "float32")
systems = {"peagle none float32": none32, "peagle none bf16": peagle_system("none", "bfloat16")[1],
           "peagle generate defaults (P-EAGLE, auto K, bf16)": peagle_system("parallel", "bfloat16")[1]}
for kind in ("F32", "BF16", "Q4_1"):
    systems[f"llama.cpp {kind}"] = llama_system(kind, ids)
for run in systems.values():  # warm-up
    run(0)
rates = {name: [] for name in systems}
for _ in range(rounds):
    for name, run in systems.items():
        for i in range(len(prompts)):
            rates[name].append(run(i))
print(f"| system | decode tok/s (median of {rounds} x {len(prompts)}) |\n|---|---|")
for name, xs in rates.items():
    print(f"| {name} | {statistics.median(xs):.1f} |")
