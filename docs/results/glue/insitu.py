"""In-situ split of the production step(): time inside native_layers (the layer stacks) and linear (LM heads, the
drafter's fc) against the rest (the host's work), engines K in KS interleaved in blocks of 10 steps, medians (ms);
the instrumentation of docs/results/fused-draft/step_parts.py, its native calls alone. The figures quoted from it
predate the one-call passes (BENCHMARKS.md §46): since them the target's and the drafter's layers and heads run
inside peagle::target_pass and peagle::draft, which these wrappers do not see (layers and linear read 0 there).

    python docs/results/glue/insitu.py 0,1,7
"""
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent / "fused-draft"))
from step_parts import instrument, measure  # noqa: E402

instrument(parts=False)
res = measure([int(k) for k in sys.argv[1].split(",")])
for k, parts in res.items():
    med = {n: statistics.median(v) * 1e3 for n, v in parts.items()}
    layers, linear = med.get("NATIVE layers", 0.0), med.get("NATIVE linear", 0.0)
    print(f"K={k}: step {med['step']:.3f}  layers {layers:.3f}  linear {linear:.3f}  rest {med['other']:.3f}")
