"""NOT KEPT (BENCHMARKS.md §41): the scheduler patch it measured was reverted, so here "shipped" is 7573737's
scheduler again. A lone sequence's copy going on past the head's chain ( where the text's by-match proposal is longer than
the K `auto` chose, the step verifies all of it) against the scheduler of 7573737 (the proposal cut to the
head's K), `generate`'s defaults, on the 12 held-out prompts (`int8/heldout_ab.py`'s harness, against `none`), and
with `mtbench` as the first argument on 32 MT-Bench first turns at one request (`peagle bench offline`).

    python benchmarks/lookup/not-kept/extend_ab.py ROUNDS
    python benchmarks/lookup/not-kept/extend_ab.py mtbench before|shipped
"""
import subprocess
import sys
import types
from pathlib import Path

import peagle.engine.scheduler as scheduler

root = Path(__file__).resolve().parents[3]
old = sys.modules["scheduler_7573737"] = types.ModuleType("scheduler_7573737")   # (dataclasses look it up)
exec(compile(subprocess.run(["git", "-C", str(root), "show", "7573737:peagle/engine/scheduler.py"], check=True,
                            capture_output=True, text=True).stdout, "scheduler_7573737", "exec"), old.__dict__)
NEXT = scheduler.Scheduler._next_drafts


def use(before: bool) -> None:
    scheduler.Scheduler._next_drafts = old.Scheduler._next_drafts if before else NEXT


if __name__ == "__main__" and sys.argv[1] == "mtbench":
    use(sys.argv[2] == "before")
    from peagle.cli import main
    sys.exit(main(["bench", "offline", "--dataset-name", "mt-bench", "--num-prompts", "32", "--output-len", "256",
                   "--methods", "parallel,ngram,none", "-k", "auto", "--max-concurrency", "1", "--disable-tqdm"]))
elif __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "int8"))
    from heldout_ab import compare, engine

    def variant(before: bool, method: str = "parallel"):
        def make():
            use(before)
            return engine(method)
        return make

    compare({"defaults-before": variant(True), "defaults-shipped": variant(False), "ngram": variant(False, "ngram")},
            int(sys.argv[1]))
