"""Where a plain step's host time goes (`none`, 8 held-out prompts of benchmarks/int8/heldout.py, 128 tokens each):
the step split at the runner's forward, LlamaModel.decode and the native peagle::target_pass call; medians, ms.

    python benchmarks/cold-host/host_split.py
"""
import statistics, time, torch, json
from pathlib import Path
import peagle.models.llama as L
from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams
items = [json.loads(l) for l in (Path(__file__).parent.parent / "int8" / "heldout.jsonl").read_text().splitlines()]
e = LLMEngine.from_pretrained(None, method="none", max_num_seqs=1)
native = torch.ops.peagle.target_pass
marks = {}
def timed(*a, **k):
    marks["n0"] = time.perf_counter(); out = native(*a, **k); marks["n1"] = time.perf_counter(); return out
class _Ops:
    def __getattr__(self, k): return timed if k == "target_pass" else getattr(torch.ops.peagle, k)
class _Torch:
    ops = type("ops", (), {"peagle": _Ops()})()
    def __getattr__(self, k): return getattr(torch, k)
L.torch = _Torch()
t = e.target
orig_decode = t.decode
def decode(*a, **k):
    marks["d0"] = time.perf_counter(); out = orig_decode(*a, **k); marks["d1"] = time.perf_counter(); return out
t.decode = decode
orig_fwd = e.runner.forward
def fwd(*a, **k):
    marks["f0"] = time.perf_counter(); out = orig_fwd(*a, **k); marks["f1"] = time.perf_counter(); return out
e.runner.forward = fwd
R = {k: [] for k in ("step", "before forward", "forward->decode", "decode before native", "native", "decode after native", "after forward")}
for it in items[:8]:
    s = e.add_request(e.encode_prompt(it["prompt"]), SamplingParams(max_tokens=128))
    e.step()
    while not s.finished:
        marks.clear()
        t0 = time.perf_counter(); e.step(); t1 = time.perf_counter()
        if "n0" not in marks: continue
        R["step"].append(t1 - t0); R["before forward"].append(marks["f0"] - t0); R["forward->decode"].append(marks["d0"] - marks["f0"])
        R["decode before native"].append(marks["n0"] - marks["d0"]); R["native"].append(marks["n1"] - marks["n0"])
        R["decode after native"].append(marks["d1"] - marks["n1"]); R["after forward"].append(t1 - marks["f1"])
print({k: round(statistics.median(v) * 1e3, 3) for k, v in R.items()})
