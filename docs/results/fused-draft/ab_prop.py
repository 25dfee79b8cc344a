"""The drafting pass in one native call against the steps (ModelRunner.fused_drafting), interleaved every 2 steps,
150 rounds, MT-Bench's first prompt: step and `propose` medians per K.

    python docs/results/fused-draft/ab_prop.py 1,3,7
"""
import sys, time, statistics
from peagle.engine.llm_engine import LLMEngine, EngineConfig
from peagle.engine.model_runner import ModelRunner
from peagle.engine.sampling import SamplingParams
from peagle.prompts import dataset_path, read_prompt_file
text = read_prompt_file(dataset_path("mt-bench", None), "mt-bench")[0].text
base = LLMEngine.from_pretrained(None, method="none", max_num_seqs=1)
from peagle.models.loader import load_drafter_for, resolve_target
head = load_drafter_for(base.target, resolve_target(None, weights=False), None, base.tokenizer)
P = []
orig = ModelRunner.propose
def timed(self, *a, **kw):
    t = time.perf_counter(); r = orig(self, *a, **kw); P.append(time.perf_counter() - t); return r
ModelRunner.propose = timed
KS = [int(k) for k in sys.argv[1].split(",")]
eng = {}
for k in KS:
    for fused in (False, True):
        e = LLMEngine(base.target, head, EngineConfig(method="parallel", num_speculative_tokens=k, max_num_seqs=1), base.tokenizer)
        e.add_request(e.encode_prompt(text), SamplingParams(max_tokens=10 ** 6, ignore_eos=True)); e.step()
        eng[k, fused] = e
res = {key: [] for key in eng}; prop = {key: [] for key in eng}
for _ in range(150):
    for (k, fused), e in eng.items():
        ModelRunner.fused_drafting = fused
        for _ in range(2):
            P.clear(); t = time.perf_counter(); e.step(); res[k, fused].append(time.perf_counter() - t); prop[k, fused].append(sum(P))
for key in res:
    print(key, f"step {statistics.median(res[key]) * 1e3:.3f} ms  propose {statistics.median(prop[key]) * 1e3:.3f} ms")
