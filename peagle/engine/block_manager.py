"""Paged KV-cache bookkeeping: fixed-size blocks handed to sequences as they grow.

Target and drafter caches have the same number of slots and share each sequence's block table,
so one allocation covers both.
"""
from __future__ import annotations

from peagle.engine.sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.free: list[int] = list(range(num_blocks - 1, -1, -1))

    def blocks_needed(self, seq: Sequence, num_positions: int) -> int:
        return max(0, -(-num_positions // self.block_size) - len(seq.block_table))

    def ensure(self, seq: Sequence, num_positions: int) -> bool:
        """Grow ``seq``'s table to hold positions ``0..num_positions-1``; False if blocks ran out."""
        n = self.blocks_needed(seq, num_positions)
        if n > len(self.free):
            return False
        seq.block_table.extend(self.free.pop() for _ in range(n))
        return True

    def release(self, seq: Sequence) -> None:
        self.free.extend(reversed(seq.block_table))
        seq.block_table = []
        seq.num_cached = 0

    @property
    def num_free(self) -> int:
        return len(self.free)
