"""`generate`'s defaults with drafts from the text itself (prompt lookup, `peagle/engine/lookup.py`): off, only
merged into the head's drafts (`merge`: no drafts of its own where the drafter skips a step), as shipped, and at
`prompt_lookup_min` 1 and 3, against `--method none`, on the 12 held-out prompts (`int8/heldout_ab.py`'s harness).

    python benchmarks/lookup/ab.py ROUNDS
"""
import sys
from pathlib import Path

import peagle.engine.scheduler as scheduler

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "int8"))
from heldout_ab import compare, engine  # noqa: E402

LOOKUP_MOST = scheduler.LOOKUP_MOST


def variant(merge_only: bool = False, **config):
    def make():
        scheduler.LOOKUP_MOST = 0 if merge_only else LOOKUP_MOST
        return engine(**config)
    return make


compare({"off": variant(prompt_lookup_max=0), "merge": variant(merge_only=True), "shipped": variant(),
         "min1": variant(prompt_lookup_min=1), "min3": variant(prompt_lookup_min=3)}, int(sys.argv[1]))
