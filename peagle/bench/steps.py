"""Engines' step times side by side: each engine given one endless request, then its steps timed with the engines
taking turns, a few steps each, round after round, so that a burst of the host's other work lands on all of them
alike and their ratios (a round against a plain step) hold where their absolute times drift. One place for the
benchmarks that price a speculative round (benchmarks/real_sizes/, benchmarks/cpu-roofline/round.py)."""
from __future__ import annotations

import time
from collections.abc import Callable, Hashable

from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams


def begin(engines: dict[Hashable, LLMEngine], prompt: list[int]) -> dict:
    """``prompt`` added to every engine as a request that never ends, and prefilled; returns the sequences."""
    seqs = {}
    for k, e in engines.items():
        seqs[k] = e.add_request(list(prompt), SamplingParams(max_tokens=10 ** 6, ignore_eos=True))
        e.step()
    return seqs


def step_times(engines: dict[Hashable, LLMEngine], rounds: int, steps: int,
               each: Callable[[Hashable, float], None] | None = None) -> dict[Hashable, list[float]]:
    """Each engine's step times in seconds, ``rounds`` rounds of ``steps`` steps each per engine; ``each(key,
    seconds)`` after every step (what else a step measured, read then)."""
    times: dict[Hashable, list[float]] = {k: [] for k in engines}
    for _ in range(rounds):
        for k, e in engines.items():
            for _ in range(steps):
                t = time.perf_counter()
                e.step()
                times[k].append(time.perf_counter() - t)
                if each is not None:
                    each(k, times[k][-1])
    return times
