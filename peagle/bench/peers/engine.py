"""peagle's engine as a peer: one per method, each with the head ``load_drafter_for`` gives it,
greedy with ``ignore_eos``; it also times its own prefill and verify steps (the path production runs)."""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from peagle.bench.peers import PRECISION, Decode, Peer, time_once
from peagle.cpu import configure_cpu
from peagle.engine.sampling import SamplingParams
from peagle.engine.tree import Tree
from peagle.models.layers import Linear
from peagle.models.quant import QuantTensor


@dataclasses.dataclass(kw_only=True)
class EnginePeer(Peer):
    engine: Any   # LLMEngine

    def prepare(self) -> None:
        configure_cpu()

    def decode(self, ids: list[int], n: int) -> Decode:
        t0 = time.perf_counter()
        out = self.engine.generate([ids], SamplingParams(max_tokens=n, ignore_eos=True))[0]
        t1 = time.perf_counter()
        return Decode(tokens=list(out.token_ids), ttft_s=out.ttft_s, elapsed_s=t1 - t0,
                      acceptance_length=out.stats.acceptance_length)

    def prefill_s(self, ids: list[int]) -> float:
        """The engine's steps from a fresh request of ``ids`` to its first token."""
        e = self.engine
        e.add_request(ids, SamplingParams(max_tokens=1))

        def run():
            while e.has_unfinished():
                e.step()
        return time_once(run, e.device)

    @contextmanager
    def verify_timer(self, ctx: list[int], new_ids: list[int]) -> Iterator[Callable[[int], float]]:
        """One engine step verifying n tokens (the last one and n-1 injected drafts) at a context of
        ``len(ctx)``: scheduling, metadata, the target pass, verification and the host sync; the
        sequence is put back after each step so the context stays the same."""
        e, c = self.engine, len(ctx)
        seq = e.add_request(ctx, SamplingParams(max_tokens=10 ** 6, ignore_eos=True))
        e.step()   # prefill: C tokens cached, one emitted
        state = list(seq.tokens)

        def one_step(n: int) -> float:   # the n-1 drafts as a chain, the tree the step verifies
            seq.tokens[:], seq.num_cached = state, c
            seq.set_drafts(Tree.chain(n - 1), [[t] for t in new_ids[:n - 1]])
            return time_once(e.step, e.device)

        try:
            yield one_step
        finally:
            e.abort(seq.request_id)


def peer(engine, name: str, threads: int, k: int | str | None = None) -> EnginePeer:
    """``engine`` as the peer ``name`` (its method; ``k`` shown for the speculative ones) on the
    ``threads`` torch threads ``configure_cpu`` gives it."""
    label = f"peagle `{name}`" + ("" if k is None else f" (K={k})")
    return EnginePeer(name=name, system="peagle", label=label, precision=weight_precision(engine),
                      threads=f"torch {threads}", engine=engine)


def weight_precision(engine) -> str:
    """The engine's layer weights in llama.cpp's names: a GGUF block format as it runs (Q4_1, ...), else
    the dtype (BF16, F16, F32), so that each peagle row meets the llama.cpp file of its own precision."""
    w = next(m.weight for m in engine.target.modules() if isinstance(m, Linear))
    return w.format.upper() if isinstance(w, QuantTensor) else PRECISION[w.dtype]
