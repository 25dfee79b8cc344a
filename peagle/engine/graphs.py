"""CUDA graphs for decode steps, as vLLM captures them (``--enforce-eager`` turns them off).

A decode step of a small model on a GPU is bound by launching its kernels one by one; a CUDA graph
replays the whole forward as one launch. A graph needs fixed shapes and no host work, so decode
steps take a padded layout (:class:`peagle.models.attention.PaddedMeta`): every sequence feeds the
same number of rows (missing drafts are filler rows, verified and rejected like wrong drafts), the
batch is padded to a bucket of sequences that write only to a padding block, and the block tables
are padded to a bucket of widths. One graph per (pass, shapes) is captured the first time a step
needs it, from that step's own inputs: the warm-up runs write the same KV the replay writes, so
capturing changes nothing. The target pass and the drafter pass are graphed; verification,
expansion and sampling run around them.

The padded layout also runs without capture (``capture=False``): that is how the CPU tests check
that it is exact, and that its forwards read nothing from the host.
"""
from __future__ import annotations

from typing import Callable

import torch

from peagle.models.attention import PaddedMeta


def bucket(n: int, most: int) -> int:
    """The next power of two >= ``n``, at most ``most`` (fewer shapes, so fewer graphs)."""
    return min(1 << max(n - 1, 0).bit_length(), most)


class Graphed:
    """``fn`` over static input buffers, one CUDA graph per input shape; the returned tensors are the
    graph's own outputs, valid until its next replay (clone what must outlive the step)."""

    def __init__(self, fn: Callable[..., tuple[torch.Tensor, ...]], capture: bool, pool=None):
        self.fn, self.capture, self.pool = fn, capture, pool
        self.entries: dict[tuple, tuple[list[torch.Tensor], torch.cuda.CUDAGraph | None, tuple]] = {}

    def __call__(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        key = tuple((a.shape, a.dtype) for a in args)
        if key not in self.entries:
            self.entries[key] = self._build(args)
        inputs, graph, outputs = self.entries[key]
        for buf, a in zip(inputs, args):
            buf.copy_(a, non_blocking=True)
        if graph is None:
            return self.fn(*inputs)
        graph.replay()
        return outputs

    def _build(self, args: tuple[torch.Tensor, ...]):
        inputs = [a.clone() for a in args]
        if not self.capture:
            return inputs, None, ()
        stream = torch.cuda.Stream(args[0].device)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up off the capture (lazy inits, autotuning)
            for _ in range(2):
                self.fn(*inputs)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            outputs = self.fn(*inputs)
        return inputs, graph, outputs


class StepGraphs:
    """The graphed passes of one engine: the target's forward (logits of every row and the aux
    hidden states) and the drafter's (normed and pre-norm hidden states), each over a
    :class:`PaddedMeta` batch."""

    def __init__(self, target, drafter, target_caches, drafter_caches, block_size: int, capture: bool):
        pool = torch.cuda.graph_pool_handle() if capture else None  # one memory pool for every graph

        def target_pass(ids, positions, tables):
            meta = PaddedMeta(tables, ids.shape[0] // tables.shape[0], block_size)
            return target(ids, positions, target_caches, meta)

        def drafter_pass(ids, hidden, positions, tables, no_write):
            meta = PaddedMeta(tables, ids.shape[0] // tables.shape[0], block_size, no_write)
            return drafter(ids, hidden, positions, drafter_caches, meta)

        self.target = Graphed(target_pass, capture, pool)
        self.drafter = Graphed(drafter_pass, capture, pool) if drafter is not None else None

    @property
    def num_graphs(self) -> int:
        return sum(len(g.entries) for g in (self.target, self.drafter) if g is not None)
