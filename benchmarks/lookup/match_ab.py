"""The text's drafts as shipped since §40 (verified alone: as many as the suffix matched is long, 3..7, where one
sequence decodes; a loop's proposal running on past the text's end) against §39's (3 always, stopped at the
end; `before.py`), in `generate`'s defaults (P-EAGLE, `auto` K) and `--method ngram` (K auto), against `none`, on
the 12 held-out prompts (`int8/heldout_ab.py`'s harness).

    python benchmarks/lookup/match_ab.py ROUNDS
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "int8"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from before import use  # noqa: E402
from heldout_ab import compare, engine  # noqa: E402


def variant(before: bool, method: str = "parallel"):
    def make():
        use(before)
        return engine(method)
    return make


compare({"defaults-before": variant(True), "defaults-shipped": variant(False), "ngram-before": variant(True, "ngram"),
         "ngram-shipped": variant(False, "ngram")}, int(sys.argv[1]))
