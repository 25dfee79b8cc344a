"""What a speculative round costs against a plain step, the production path: the engine's `step()` for
one request on an MT-Bench prompt (context about 100-230 tokens), method `none` (one row) against
P-EAGLE at K = 1, 3 and 7 with the shipped head (verify K+1 rows, accept, one drafting pass), per weight
format (`gguf`: the file as it ships, the default, `--compute fast`; `gguf-exact`: its blocks in float32
arithmetic; else the de-quantized weights in that dtype). Medians over 120 steps, the engines interleaved
in rounds of 10 steps.

    python benchmarks/cpu-roofline/round.py [FORMATS] [KV_CACHE_DTYPE]   # default gguf,gguf-exact,bfloat16 auto
"""
import statistics
import sys

from peagle.bench.steps import begin, step_times
from peagle.engine.llm_engine import LLMEngine
from peagle.prompts import dataset_path, read_prompt_file

KS = (1, 3, 7)
text = read_prompt_file(dataset_path("mt-bench", None), "mt-bench")[0].text
print("| weights | plain step ms | " + " | ".join(f"round ms (K={k}) | round / step" for k in KS) +
      " | tokens per round (K=7) |")
print("|---|---|" + "---|---|" * len(KS) + "---|")
for fmt in (sys.argv[1].split(",") if len(sys.argv) > 1 else ["gguf", "gguf-exact", "bfloat16"]):
    how = dict(quantization="gguf", compute="exact" if fmt == "gguf-exact" else "fast") if fmt.startswith("gguf") \
        else dict(dtype=fmt, quantization="none")
    kv = sys.argv[2] if len(sys.argv) > 2 else "auto"
    engines = {k: LLMEngine.from_pretrained(None, method="none" if k == 0 else "parallel", k=max(k, 1), max_num_seqs=1,
                                            kv_cache_dtype=kv, **how) for k in (0, *KS)}
    seqs = begin(engines, engines[0].encode_prompt(text))
    times = step_times(engines, 12, 10)
    ms = {k: statistics.median(ts) * 1e3 for k, ts in times.items()}
    per_round = len(seqs[7].output_ids) / (len(times[7]) + 1)
    cells = " | ".join(f"{ms[k]:.2f} | {ms[k] / ms[0]:.2f}" for k in KS)
    print(f"| {fmt} ({engines[0].precision}; KV {engines[0].runner.kv_dtype}) | {ms[0]:.2f} | {cells} | {per_round:.2f} |")
