"""`generate`'s defaults against `none` on the 12 held-out prompts (`int8/heldout_ab.py`'s harness), with the lookup
on: `auto-blind` (K=0 priced as plain decoding, as before d17196e), `auto-aware` (K=0 priced with the lookup's
measured yield, as shipped), `lookup-alone` (`auto`'s choice held at K=0: the head never drafts, the text's own
drafts verified alone; an in-process variant, not a shipped mode).

    python benchmarks/lookup/alone_ab.py ROUNDS
"""
import sys
from pathlib import Path

import peagle.engine.auto_k as AK
from peagle.engine.tree import Tree

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "int8"))
from heldout_ab import compare, engine  # noqa: E402

choose, record_lookup = AK.AutoK.choose, AK.AutoK.record_lookup


def variant(blind: bool = False, alone: bool = False):
    def make():
        AK.AutoK.choose = (lambda self, *a, **k: Tree(())) if alone else choose
        AK.AutoK.record_lookup = (lambda self, a: None) if blind else record_lookup
        return engine()
    return make


compare({"auto-blind": variant(blind=True), "auto-aware": variant(), "lookup-alone": variant(alone=True)},
        int(sys.argv[1]))
