"""The baseline benchmark: a module per section (end_to_end, passes, prefill, drafting, llamabench);
:mod:`~peagle.bench.baseline.runner`: the flags and the run (``peagle bench baseline``, ``python -m peagle.bench.baseline``)."""
