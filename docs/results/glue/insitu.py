"""In-situ split of the production step(): time inside native_layers (the layer stacks) and linear (LM heads, the drafter's fc) against the rest (the host's work), engines K in KS interleaved in blocks of 10 steps, medians (ms).

    python docs/results/glue/insitu.py 0,1,7
"""
import sys, time, statistics, collections
from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.prompts import dataset_path, read_prompt_file
import peagle.models.llama as lm, peagle.models.drafter as dr, peagle.models.layers as ly
T = collections.defaultdict(float)
def timed(name, f):
    def g(*a, **k):
        t = time.perf_counter(); r = f(*a, **k); T[name] += time.perf_counter() - t; return r
    return g
lm.native_layers = timed("layers", lm.native_layers); dr.native_layers = lm.native_layers
ly.linear = timed("linear", ly.linear); lm.linear = ly.linear; dr.linear = ly.linear
text = read_prompt_file(dataset_path("mt-bench", None), "mt-bench")[0].text
KS = [int(k) for k in sys.argv[1].split(",")]
eng = {k: LLMEngine.from_pretrained(None, method="none" if k == 0 else "parallel", k=max(k, 1), max_num_seqs=1) for k in KS}
for e in eng.values():
    e.add_request(e.encode_prompt(text), SamplingParams(max_tokens=10 ** 6, ignore_eos=True)); e.step()
res = {k: collections.defaultdict(list) for k in KS}
for _ in range(12):
    for k, e in eng.items():
        for _ in range(10):
            T.clear(); t = time.perf_counter(); e.step(); s = time.perf_counter() - t
            res[k]["step"].append(s); res[k]["layers"].append(T["layers"]); res[k]["linear"].append(T["linear"])
            res[k]["rest"].append(s - T["layers"] - T["linear"])
for k in KS:
    print(f"K={k}: " + "  ".join(f"{n} {statistics.median(v) * 1e3:.3f}" for n, v in res[k].items()))
