"""`generate`'s defaults (P-EAGLE, auto K) with `auto`'s settings varied, against `--method none`, on the 12 held-out
prompts (`int8/heldout_ab.py`'s harness). probe32: a probe every 32 steps (16); margin20: drafting must win 20% by
the model (10%); prior35: the first position's prior acceptance 0.35 (0.5). The lookup off, as when §37 measured it.

    python docs/results/auto/variants.py ROUNDS
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "int8"))
from heldout_ab import compare, engine  # noqa: E402


def tuned(**settings):
    def make():
        e = engine(prompt_lookup_max=0)
        a = e.scheduler.auto
        for k, val in settings.items():
            if k == "prior_p":
                a.accepted[0][0] = val * a.prior
            else:
                setattr(a, k, val)
                if k == "probe_every":
                    a.interval = a.next_probe = val
        return e
    return make


compare({"default": tuned(), "probe32": tuned(probe_every=32), "margin20": tuned(margin=0.2),
         "prior35": tuned(prior_p=0.35)}, int(sys.argv[1]))
