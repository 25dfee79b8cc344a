"""``python -m peagle.bench.baseline``: the baseline, flags as ``peagle bench baseline``."""
from peagle.bench.baseline.runner import parse_args, run

run(parse_args())
