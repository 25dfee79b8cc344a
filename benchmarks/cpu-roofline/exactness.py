"""Is speculation exact in every dtype? On the default model, the 40-prompt MT-Bench check: greedy
(and seeded sampling) output of P-EAGLE (auto K) and EAGLE-3 against plain decoding, token for token,
128 new tokens, EOS ignored, each prompt alone and the 40 in batches of 8.

    python benchmarks/cpu-roofline/exactness.py [FORMATS] [PROMPTS] [K]   # gguf (as shipped),float16,bfloat16,float32
                                                                            # K: auto (default), or a fixed K
"""
import json
import sys

from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.prompts import dataset_path, read_prompt_file

dtypes = sys.argv[1].split(",") if len(sys.argv) > 1 else ["gguf", "float16", "bfloat16", "float32"]
n_prompts = int(sys.argv[2]) if len(sys.argv) > 2 else 40
k = int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[3] != "auto" else "auto"
prompts = read_prompt_file(dataset_path("mt-bench", None), "mt-bench")[:n_prompts]
N = 128
report = {}
for dtype in dtypes:
    runs = {}
    for method in ("none", "parallel", "eagle3"):
        how = dict(quantization="gguf") if dtype == "gguf" else dict(dtype=dtype, quantization="none")
        engine = LLMEngine.from_pretrained(None, method=method, k=k, max_num_seqs=8, **how)
        ids = [engine.encode_prompt(p.text) for p in prompts]
        for mode, params in (("greedy", dict()), ("seeded", dict(temperature=0.8, top_p=0.95, seed=1234))):
            sp = SamplingParams(max_tokens=N, ignore_eos=True, **params)
            runs[method, mode, "alone"] = [engine.generate([i], sp)[0].token_ids for i in ids]
            runs[method, mode, "batch8"] = [o.token_ids for o in engine.generate(ids, sp)]
        print(dtype, method, engine.precision, engine.kernels, file=sys.stderr, flush=True)
    for (method, mode, how), outs in runs.items():
        base = runs["none", mode, "alone"]
        same = sum(a == b for a, b in zip(outs, base))
        report[f"{dtype} {method} {mode} {how}"] = f"{same}/{len(base)}"
        print(f"{dtype:9s} {method:9s} {mode:7s} {how:7s} equal to none alone: {same}/{len(base)}", flush=True)
print(json.dumps(report))
