"""The speculative methods against `none` on the 12 held-out prompts (`int8/heldout_ab.py`'s harness): `generate`'s
defaults (P-EAGLE, auto K, the lookup beside it), and `ngram` (the text's drafts alone) at K=auto (3) and K=5.

    python benchmarks/lookup/methods_ab.py ROUNDS
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "int8"))
from heldout_ab import compare, engine  # noqa: E402

compare({"defaults": lambda: engine(), "ngram": lambda: engine("ngram"), "ngram-k5": lambda: engine("ngram", 5)},
        int(sys.argv[1]))
