"""Plain decoding steps of FILE (default: the default model) under each one-row streaming setting (the kernels'
default limit, narrow, wide; taller passes as the tuner left them), the settings alternating in one process, 12
rounds of 16 steps: what the tiles' verdict (``kernels.tune_streaming``) is worth in whole steps, which its
sweeps of the weights alone can understate (docs/real-sizes.md, "The tiles' verdict, timed again").

    PEAGLE_TORCH_THREADS=2 python benchmarks/real_sizes/verdict_steps.py [FILE]
"""
import statistics
import sys

import torch

from peagle import kernels
from peagle.bench.steps import begin, step_times
from peagle.engine.config import EngineConfig
from peagle.engine.llm_engine import LLMEngine
from peagle.models.loader import load_target, load_tokenizer, resolve_target

path = sys.argv[1] if len(sys.argv) > 1 else None
tok = load_tokenizer(resolve_target(path, weights=False))
target, _ = load_target(path)
default = torch.ops.peagle.stream_bytes()[0]  # the kernels' own, before the engine's tuner sets its verdict
off = dict(prompt_lookup_max=0, response_lookup="none", max_num_seqs=1, max_model_len=4096)
engine = LLMEngine(target, None, EngineConfig(method="none", **off), tok)
begin({0: engine}, tok("The quick brown fox jumps over the lazy dog. " * 4)["input_ids"])
taller = torch.ops.peagle.stream_bytes()[1]
limits = {"default": default, "narrow": kernels.NARROW, "wide": kernels.WIDE}
medians: dict[str, list[float]] = {name: [] for name in limits}
for _ in range(12):
    for name, limit in limits.items():
        torch.ops.peagle.set_stream_bytes(limit, taller)
        medians[name].append(statistics.median(step_times({0: engine}, 1, 16)[0]) * 1e3)
for name, ms in medians.items():
    print(f"{name}: a step {statistics.median(ms):.3f} ms (rounds' medians {min(ms):.3f}-{max(ms):.3f})")
