"""Where a speculative round's time goes (bench.py's rounds, taken apart): the target's pass over 1 or K + 1 rows
(``ModelRunner.forward``), the drafter's pass (``ModelRunner.propose``: the random 1-layer head, with a trained
head's draft vocabulary (``drafter.DRAFT_VOCAB``), or HEAD, quantized and packed beside the target) and the rest of
the step, at K = 0 (plain), 1, 3, 7; lookups off, one request, the engines' steps interleaved, medians of 8 x REPS
steps each. A head over the whole vocabulary (the random head's before 2026-12-02) reads more:

    peagle init-drafter --target FILE.gguf --layers 1 --out HEAD
    PEAGLE_TORCH_THREADS=2 python benchmarks/real_sizes/round_parts.py FILE.gguf [REPS [HEAD]]
"""
import json
import statistics
import sys
import time

from peagle.bench.steps import begin, step_times
from peagle.engine.config import EngineConfig
from peagle.engine.llm_engine import LLMEngine
from peagle.engine.model_runner import ModelRunner
from peagle.models.loader import load_drafter_for, load_target, load_tokenizer, resolve_target

path, reps = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3
drafter = sys.argv[3] if len(sys.argv) > 3 else None
acc = {"forward": [], "propose": []}


def timed(name: str):
    """ModelRunner's method ``name``, its time added to ``acc[name]``."""
    real = getattr(ModelRunner, name)

    def wrap(self, *a, **kw):
        t = time.perf_counter()
        r = real(self, *a, **kw)
        acc[name].append(time.perf_counter() - t)
        return r
    return wrap


for name in acc:
    setattr(ModelRunner, name, timed(name))
tok = load_tokenizer(resolve_target(path, weights=False))
target, folder = load_target(path)
head = load_drafter_for(target, folder, drafter, tok)
off = dict(prompt_lookup_max=0, response_lookup="none", max_num_seqs=1, max_model_len=1024)
engines = {0: LLMEngine(target, None, EngineConfig(method="none", **off), tok)}
for k in (1, 3, 7):
    engines[k] = LLMEngine(target, head, EngineConfig(method="parallel", num_speculative_tokens=k, **off), tok)
begin(engines, tok("The quick brown fox jumps over the lazy dog. " * 4)["input_ids"])
res = {k: {"step": [], "forward": [], "propose": []} for k in engines}


def each(k: int, seconds: float) -> None:
    """A step's time and its parts', the parts' clocks then reset for the next step."""
    res[k]["step"].append(seconds)
    for name, v in acc.items():
        res[k][name].append(sum(v))
        v.clear()


for v in acc.values():  # the prefills'
    v.clear()
step_times(engines, reps, 8, each)
med = {k: {n: statistics.median(v) * 1e3 for n, v in r.items()} for k, r in res.items()}
base = med[0]["step"]
for k, m in med.items():
    rest = m["step"] - m["forward"] - m["propose"]
    print(f"K={k}: step {m['step']:.1f} ms ({m['step'] / base:.2f}x plain); target pass {m['forward']:.1f} "
          f"({m['forward'] / med[0]['forward']:.2f}x plain's); drafter {m['propose']:.1f}; rest {rest:.1f}")
print(json.dumps(med))
