"""`generate`'s defaults against `--method none` on the 12 held-out prompts (`int8/heldout_ab.py`'s harness), `auto`
as it is now (`new`: six plain steps first, each size's timing error following new lows at once, a start-up cost
curve that never falls with more rows) against `auto` as it was before (`old`: three plain steps, a running ratio
from the first timing, the curve as timed). The lookup off, as when §38 measured it.

    python docs/results/auto/warmup_ab.py ROUNDS
"""
import sys
from pathlib import Path

import peagle.engine.auto_k as AK

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "int8"))
from heldout_ab import compare, engine  # noqa: E402

new_post, new_observe = AK.CostCurve.__post_init__, AK.AutoK.observe


def old_observe(self, tree, batch, seconds):
    n, r = len(tree), seconds / self.step_seconds(len(tree), tree.depth, batch)
    self.scale[n] = r if n not in self.scale else 0.9 * self.scale[n] + 0.1 * r


def variant(old: bool):
    def make():
        AK.CostCurve.__post_init__ = (lambda self: None) if old else new_post
        AK.AutoK.observe = old_observe if old else new_observe
        e = engine(prompt_lookup_max=0)
        if old:
            e.scheduler.auto.warmup = 3
        return e
    return make


compare({"new": variant(False), "old": variant(True)}, int(sys.argv[1]))
