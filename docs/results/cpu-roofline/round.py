"""What a speculative round costs against a plain step, the production path: the engine's `step()` for
one request on an MT-Bench prompt (context about 100-230 tokens), method `none` (one row) against
P-EAGLE at K=7 with the shipped head (verify 8 rows, accept, one drafting pass), per weight format
(`gguf`: the file as it ships, the default; else the de-quantized weights in that dtype). Medians over
120 steps, the two engines interleaved in rounds of 10 steps.

    python docs/results/cpu-roofline/round.py [FORMATS]   # default gguf,bfloat16,float16,float32
"""
import statistics
import sys
import time

from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.prompts import dataset_path, read_prompt_file

text = read_prompt_file(dataset_path("mt-bench", None), "mt-bench")[0].text
print("| weights | plain step ms | speculative round ms (K=7) | round / step | tokens per round |")
print("|---|---|---|---|---|")
for dtype in (sys.argv[1].split(",") if len(sys.argv) > 1 else ["gguf", "bfloat16", "float16", "float32"]):
    how = dict(quantization="gguf") if dtype == "gguf" else dict(dtype=dtype, quantization="none")
    engines = {m: LLMEngine.from_pretrained(None, method=m, k=7, max_num_seqs=1, **how) for m in ("none", "parallel")}
    seqs = {}
    for m, e in engines.items():
        seqs[m] = e.add_request(e.encode_prompt(text), SamplingParams(max_tokens=10 ** 6, ignore_eos=True))
        e.step()  # prefill
    times = {m: [] for m in engines}
    for _ in range(12):
        for m, e in engines.items():
            for _ in range(10):
                t = time.perf_counter()
                e.step()
                times[m].append(time.perf_counter() - t)
    step, rnd = statistics.median(times["none"]) * 1e3, statistics.median(times["parallel"]) * 1e3
    per_round = len(seqs["parallel"].output_ids) / (len(times["parallel"]) + 1)
    print(f"| {dtype} ({engines['none'].precision}) | {step:.2f} | {rnd:.2f} | {rnd / step:.2f} | {per_round:.2f} |")
