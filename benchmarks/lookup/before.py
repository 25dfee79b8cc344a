"""The text's drafts as §39 shipped them, for A/Bs in one process: proposals stopped at the text's end
(`replay.cut_at_end`), never lengthened by their match, and 3 at most where verified alone.
`python benchmarks/lookup/before.py [before|shipped] ARGS...` runs `peagle ARGS...` so (MT-Bench, §40)."""
import sys
from pathlib import Path

import peagle.engine.scheduler as scheduler
from peagle.engine.lookup import PromptLookup

sys.path.insert(0, str(Path(__file__).resolve().parent))
from replay import cut_at_end  # noqa: E402

PROPOSE, MOST = PromptLookup.propose, scheduler.LOOKUP_MOST


def use(before: bool) -> None:
    """Patch (or restore) the lookup's proposals and the scheduler's most drafts verified alone."""
    PromptLookup.propose = (lambda self, tokens, k, by_match=False: cut_at_end(self, tokens, PROPOSE(self, tokens, k))) \
        if before else PROPOSE
    scheduler.LOOKUP_MOST = 3 if before else MOST


if __name__ == "__main__":
    use(sys.argv[1] == "before")
    from peagle.cli import main
    sys.exit(main(sys.argv[2:]))
