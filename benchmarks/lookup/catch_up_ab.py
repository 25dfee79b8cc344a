"""The drafter's first pass after a prompt prefilled without drafts (its catch-up on the prompt's rows, `auto`'s
warm-up steps): cut into pieces for peagle's attention kernel and run in one native call (§41) against the whole
span through SDPA and the layers one by one (before), on the 12 held-out prompts (`int8/heldout_ab.py`'s prompts),
`generate`'s defaults, fresh engines, interleaved: the median milliseconds of that pass and of the request.

    python benchmarks/lookup/catch_up_ab.py ROUNDS
"""
import statistics
import sys
import time
from pathlib import Path

import peagle.engine.model_runner as MR
from peagle.models.attention import AttnMeta
from peagle.models.drafter import Drafter

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "int8"))
from heldout_ab import IDS, engine  # noqa: E402

from peagle.engine.sampling import SamplingParams  # noqa: E402

FORWARD, CUT, PROPOSE = Drafter.forward, AttnMeta.cut, MR.ModelRunner.propose
timed: list[tuple[int, float]] = []


def uncut(self, *args, **kwargs):
    AttnMeta.cut = lambda meta, rows: meta
    try:
        return FORWARD(self, *args, **kwargs)
    finally:
        AttnMeta.cut = CUT


def propose(self, spans, ids, *args):
    t0 = time.perf_counter()
    out = PROPOSE(self, spans, ids, *args)
    timed.append((len(ids), time.perf_counter() - t0))
    return out


MR.ModelRunner.propose = propose
res = {v: {"pass": [], "request": []} for v in ("before", "cut")}
for r in range(int(sys.argv[1])):
    for i, ids in enumerate(IDS):
        for v in (("before", "cut") if (r + i) % 2 else ("cut", "before")):
            Drafter.forward = uncut if v == "before" else FORWARD
            timed.clear()
            out = engine().generate([ids], SamplingParams(max_tokens=128))[0]
            rows, seconds = max(timed, key=lambda t: t[0])   # the catch-up: the pass over the most rows
            res[v]["pass"].append(seconds * 1e3)
            res[v]["request"].append(out.elapsed_s * 1e3)
print(f"{len(IDS)} prompts, {sys.argv[1]} rounds")
for v, d in res.items():
    print(f"{v:6s} catch-up pass median {statistics.median(d['pass']):.2f} ms, request median {statistics.median(d['request']):.1f} ms, "
          f"sum of requests {sum(d['request']) / 1e3:.3f} s")
