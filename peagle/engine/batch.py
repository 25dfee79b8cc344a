"""One step's batch as :class:`~peagle.engine.model_runner.ModelRunner` lays it out for the target's pass (the rows,
and what verification and drafting read of them), and what it reads back per sequence (:class:`Verified`, the
scheduler's input)."""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import accumulate

import torch

from peagle.engine.sampling import TokenLogprob
from peagle.engine.sequence import Sequence
from peagle.engine.tree import Tree, TreeBatch
from peagle.models.attention import Span, TreeRows


def offsets(spans: list[Span]) -> list[int]:
    """Each span's first row in the flat batch, and the rows in all."""
    return list(accumulate((s.num_rows for s in spans), initial=0))


@dataclass
class Batch:
    """One step's target pass laid out: the rows, and what verification and drafting read of them."""
    work: list[tuple[Sequence, int]]       # the sequences, each with its new tokens
    layout: list[tuple[int, Tree] | None]  # (KV index of the root, tree) where a tree (not a chain) is verified
    partial: list[bool]                    # prompt chunks before the last: nothing emitted
    ids: torch.Tensor
    positions: torch.Tensor
    spans: list[Span]
    cu: list[int]                          # each sequence's first row (padding sequences' too)
    first: list[int]                       # each sequence's first verified (logit) row
    logit_rows: torch.Tensor
    tree_batch: TreeBatch | None           # the verified nodes, as verification reads them (None: no drafts)
    tree_rows: TreeRows | None             # where tree nodes keep their KV
    tables: torch.Tensor | None = None     # the padded decode layout (CUDA graphs): block tables ...
    num_pad: int = 0                       # ... and padding sequences

    @property
    def seqs(self) -> list[Sequence]:
        return [seq for seq, _ in self.work]


@dataclass
class Verified:
    """One sequence's outcome of a step, read back from the device."""
    accepted: int                  # drafts accepted (their KV, and the new tokens', is valid now)
    tokens: list[int] = field(default_factory=list)   # the accepted drafts, the target's token (none: a chunk)
    candidates: list[list[int]] = field(default_factory=list)  # the next drafts' [position][rank] candidates
    logprobs: list[TokenLogprob] = field(default_factory=list)
