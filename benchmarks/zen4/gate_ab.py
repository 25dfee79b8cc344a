"""`generate`'s defaults with a short match's drafts verified only while they pay (AutoK.lookup_pays, this tree)
against the same engine verifying them always (the gate patched open, as before), on the 12 held-out prompts
(`int8/heldout_ab.py`'s harness: fresh engines, interleaved, tokens checked equal), each against `none`.

    python benchmarks/zen4/gate_ab.py ROUNDS
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "int8"))
from heldout_ab import compare, engine  # noqa: E402


def ungated():
    e = engine()
    e.scheduler.auto.lookup_pays = lambda *a: True
    return e


compare({"gated": lambda: engine(), "ungated": ungated}, int(sys.argv[1]))
