"""In-process A/B of an environment toggle a temporary patch read (BENCHMARKS §35, tried.txt) over engine.step(): engines K in KS, blocks of 10 steps alternating
toggle on/off, medians. usage: ab_env.py ENVVAR KS ROUNDS"""
import os, sys, time, statistics
from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.prompts import dataset_path, read_prompt_file
var, KS, R = sys.argv[1], [int(k) for k in sys.argv[2].split(",")], int(sys.argv[3])
text = read_prompt_file(dataset_path("mt-bench", None), "mt-bench")[0].text
eng = {k: LLMEngine.from_pretrained(None, method="none" if k == 0 else "parallel", k=max(k, 1), max_num_seqs=1) for k in KS}
for e in eng.values():
    e.add_request(e.encode_prompt(text), SamplingParams(max_tokens=10 ** 6, ignore_eos=True)); e.step()
t = {(k, v): [] for k in KS for v in (0, 1)}
for _ in range(R):
    for k, e in eng.items():
        for v in (0, 1):
            if v: os.environ[var] = "1"
            else: os.environ.pop(var, None)
            for _ in range(10):
                s = time.perf_counter(); e.step(); t[k, v].append(time.perf_counter() - s)
os.environ.pop(var, None)
for k in KS:
    a, b = statistics.median(t[k, 0]) * 1e3, statistics.median(t[k, 1]) * 1e3
    print(f"K={k}: {var} unset {a:.3f} ms, set {b:.3f} ms, set/unset {b / a:.3f}")
