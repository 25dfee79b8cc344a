"""Where a step's time goes: the runner's and scheduler's parts (exclusive) and the native calls the Python
functions native_layers and linear make, per K (0: `none`), engines interleaved in blocks of 10 steps. (The
one-call passes do not go through native_layers: after them the drafting and the target's layers show inside
`propose` and `forward`.) docs/results/glue/insitu.py reads the native calls alone through the same functions.

    python docs/results/fused-draft/step_parts.py 0,1,3
"""
import sys, time, statistics, collections
from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.prompts import dataset_path, read_prompt_file
import peagle.models.llama as lm, peagle.models.drafter as dr, peagle.models.layers as ly
import peagle.engine.model_runner as mr, peagle.engine.scheduler as sc
T = collections.defaultdict(float)
stack = []


def timed(f, name):
    def g(*a, **k):
        t = time.perf_counter(); stack.append(0.0)
        r = f(*a, **k)
        d = time.perf_counter() - t; inner = stack.pop()
        T[name] += d - inner
        if stack: stack[-1] += d
        return r
    return g


def instrument(parts: bool = True) -> None:
    """Time the native calls (NATIVE layers, NATIVE linear) and, with ``parts``, the runner's and scheduler's steps."""
    lm.native_layers = timed(lm.native_layers, "NATIVE layers"); dr.native_layers = lm.native_layers
    ly.linear = timed(ly.linear, "NATIVE linear"); lm.linear = ly.linear; dr.linear = ly.linear
    if parts:
        for n in ["prepare", "forward", "sample", "accept", "propose", "_read_back", "run"]:
            setattr(mr.ModelRunner, n, timed(getattr(mr.ModelRunner, n), "runner." + n))
        for n in ["schedule", "next_tree", "postprocess", "observe"]:
            setattr(sc.Scheduler, n, timed(getattr(sc.Scheduler, n), "sched." + n))


def measure(KS: list[int], rounds: int = 12) -> dict:
    """Per K: each timed part's seconds a step (and ``step``, ``other``: the rest), 10 steps a block, engines interleaved."""
    text = read_prompt_file(dataset_path("mt-bench", None), "mt-bench")[0].text
    eng = {k: LLMEngine.from_pretrained(None, method="none" if k == 0 else "parallel", k=max(k, 1), max_num_seqs=1)
           for k in KS}
    for e in eng.values():
        e.add_request(e.encode_prompt(text), SamplingParams(max_tokens=10 ** 6, ignore_eos=True)); e.step()
    res = {k: collections.defaultdict(list) for k in KS}
    for _ in range(rounds):
        for k, e in eng.items():
            for _ in range(10):
                T.clear(); t = time.perf_counter(); e.step(); s = time.perf_counter() - t
                res[k]["step"].append(s)
                for n, v in T.items(): res[k][n].append(v)
                res[k]["other"].append(s - sum(T.values()))
    return res


if __name__ == "__main__":
    instrument()
    res = measure([int(k) for k in sys.argv[1].split(",")])
    for k, parts in res.items():
        print(f"K={k}:\n  " + "\n  ".join(f"{n:20s} {statistics.median(v) * 1e3:.3f}" for n, v in parts.items()))
