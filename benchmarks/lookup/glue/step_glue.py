"""Where a plain decoding step's time goes outside the native layers: inclusive microseconds a step of the engine's
methods and the model's, each wrapped in a timer, over 400 tokens of `none` on the shipped GGUF (after 50 to warm
up). `python benchmarks/lookup/glue/step_glue.py` (BENCHMARKS.md §41)."""
import sys, time, collections
import peagle.models.llama as LL
import peagle.models.attention as AT
import peagle.models.layers as LY
import peagle.engine.model_runner as MR
import peagle.engine.scheduler as SC
from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams
acc = collections.Counter(); cnt = collections.Counter()
def wrap(owner, name, label=None):
    f = getattr(owner, name); label = label or f"{getattr(owner, '__name__', owner)}.{name}"
    def g(*a, **k):
        t0 = time.perf_counter(); r = f(*a, **k); acc[label] += time.perf_counter() - t0; cnt[label] += 1; return r
    setattr(owner, name, g)
for owner, names in ((SC.Scheduler, ["schedule", "next_tree", "postprocess", "observe", "_append", "_next_drafts"]),
                     (MR.ModelRunner, ["prepare", "forward", "sample", "accept", "_read_back", "run"]),
                     (LL.LlamaModel, ["hidden", "embed", "stacks", "native_stack", "logits"]),
                     (AT.AttnMeta, ["prepare", "cut"]), (LY.Rotary, ["table"]), (LL, ["native_layers"]),
                     (LY.RMSNorm, ["forward"]), (MR, ["greedy"]) if hasattr(MR, "greedy") else (LL, [])):
    for n in names: wrap(owner, n)
e = LLMEngine.from_pretrained(None, method="none", k=1, max_num_seqs=1)
ids = e.encode_prompt("Write a long story about a dragon.")
e.generate([ids], SamplingParams(max_tokens=50, ignore_eos=True))
acc.clear(); cnt.clear()
st = e.step; tot = [0.0, 0]
def step():
    t0 = time.perf_counter(); r = st(); tot[0] += time.perf_counter() - t0; tot[1] += 1; return r
e.step = step
e.generate([ids], SamplingParams(max_tokens=400, ignore_eos=True))
n = tot[1]
print(f"step {tot[0]/n*1e6:.0f} us")
for k, v in sorted(acc.items(), key=lambda x: -x[1]):
    print(f"  {k:35s} {v/n*1e6:8.1f} us/step  ({cnt[k]/n:.1f} calls/step)")
