"""What a pass costs, as :class:`~peagle.engine.auto_k.AutoK` prices K by: the curves
:meth:`~peagle.engine.model_runner.ModelRunner.measure_costs` times at a start (~60 passes: 1.9 s of a 1B target's
start, over 10 s of an 8B one's), remembered for the next start on the same machine, thread count, library, models
and bounds. A curve from another moment of the machine is corrected online all the same (AutoK: by the step times
measured since)."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from peagle import kernels
from peagle.cpu import cpuinfo
from peagle.engine.auto_k import CostCurve
from peagle.engine.model_runner import ModelRunner
from peagle.files import remembered

COSTS_VERSION = 1  # the layout of what pass_costs remembers


def pass_costs(runner: ModelRunner, remember: Path | None = None) -> tuple[CostCurve, CostCurve]:
    """The target's and the drafter's cost curves: from ``remember`` (a JSON file) where a process measured
    them for this key, else measured (and added to it)."""
    def shapes(m: torch.nn.Module | None) -> list:
        return sorted({(tuple(p.shape), str(p.dtype), type(p).__name__, getattr(p, "format", ""))
                       for p in m.parameters()}) if m is not None else []

    dev, rows, ctx = torch.device(runner.device), runner.cost_rows(), runner.cost_context()
    for c in runner.target_caches + runner.drafter_caches:  # the passes read the context: written, as a
        c.materialize(ctx)                                  # request's first write would copy the zero page
    key = json.dumps([COSTS_VERSION, kernels.STAMP.read_text() if kernels.available() else "", kernels.int_isa(),
                      kernels.bf16_isa(), torch.get_num_threads(), cpuinfo("model name"), str(dev),
                      torch.cuda.get_device_name(dev) if dev.type == "cuda" else "", str(runner.dtype),
                      runner.cfg.method, rows, ctx, shapes(runner.target), shapes(runner.drafter)])
    curves = remembered(remember, key, lambda: [c.seconds for c in runner.measure_costs()],
                        lambda v: isinstance(v, list) and len(v) == 2 and all(
                            isinstance(c, list) and len(c) == len(rows) and
                            all(isinstance(x, float) and 0 <= x < 1e3 for x in c) for c in v))
    return CostCurve(rows, curves[0]), CostCurve(rows, curves[1])
