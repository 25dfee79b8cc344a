"""Paged KV-cache bookkeeping: fixed-size blocks handed to sequences as they grow, and kept, once their KV is
complete, for any later prompt that starts with the same tokens (prefix caching, as vLLM's automatic prefix
caching and llama-server's prompt cache): a chat's next turn prefills only what is new, and requests that share
a system prompt share its blocks, while the sequence that wrote them runs and after it ends.

Target and drafter caches have the same number of slots and share each sequence's block table,
so one allocation covers both. A kept block is keyed by its tokens, those before it (its key chains the
previous block's) and the token after it: the drafter's KV at position p is made from token p + 1, so a
block's last position is only right where the same token follows. A block is kept only where both its
target and drafter KV are complete, and it is never written again: a sequence that reuses it writes from
the first position after it, and reusing it is exact wherever a row's KV does not depend on the pass that
wrote it (the CPU kernels' batch invariance).
"""
from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict

from peagle.engine.sequence import Sequence


def block_key(previous: bytes, tokens: list[int], i: int, block_size: int) -> bytes:
    """Block ``i``'s key: sha256 over the key of the block before it (``b""`` for the first), its tokens and the
    token after it, as vLLM's sha256 prefix hashes chain."""
    return hashlib.sha256(previous + array("q", tokens[i * block_size:(i + 1) * block_size + 1]).tobytes()).digest()


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = True):
        self.block_size, self.num_blocks, self.prefix_caching = block_size, num_blocks, prefix_caching
        self.free: list[int] = list(range(num_blocks - 1, -1, -1))   # blocks that hold nothing kept
        self.kept: dict[bytes, int] = {}      # key -> the block holding that prefix's KV
        self.key_of: dict[int, bytes] = {}
        self.users = [0] * num_blocks         # sequences reading each kept block (the one that wrote it included)
        # kept blocks no sequence reads, the first to be reused for new KV first (a sequence's last blocks
        # before its first: a shorter prefix stays findable longer)
        self.idle: OrderedDict[int, None] = OrderedDict()
        self.queries = self.hits = 0          # prompt tokens looked up / found kept (vLLM's prefix_cache_*)

    def blocks_needed(self, seq: Sequence, num_positions: int) -> int:
        return max(0, -(-num_positions // self.block_size) - len(seq.block_table))

    def ensure(self, seq: Sequence, num_positions: int) -> bool:
        """Grow ``seq``'s table to hold positions ``0..num_positions-1``; False if blocks ran out."""
        n = self.blocks_needed(seq, num_positions)
        if n > self.num_free:
            return False
        seq.block_table.extend(self._take() for _ in range(n))
        return True

    def admit(self, seq: Sequence, num_positions: int, hit: list[int] | None = None) -> bool:
        """A waiting sequence's blocks for ``num_positions``: the kept blocks its tokens start with (``hit``, where
        the caller looked them up already; their KV valid: ``num_cached`` counts them), then new ones; False, and
        nothing taken, if they do not fit."""
        assert not seq.block_table and not seq.num_cached, "a waiting sequence holds no blocks"
        hit = self.lookup(seq.tokens) if hit is None else hit
        now_idle = sum(not self.users[b] for b in hit)   # (they leave the reusable pool when read)
        if -(-num_positions // self.block_size) - len(hit) > self.num_free - now_idle:
            return False
        for b in hit:
            self.users[b] += 1
            self.idle.pop(b, None)
        seq.block_table, seq.block_keys = hit, [self.key_of[b] for b in hit]
        seq.num_cached = len(hit) * self.block_size
        if seq.cached_prompt_tokens is None:   # (a preempted sequence finds its own blocks again: not the prompt's)
            seq.cached_prompt_tokens = seq.num_cached
        self.queries += len(seq.tokens)
        self.hits += seq.num_cached
        return self.ensure(seq, num_positions)

    def lookup(self, tokens: list[int]) -> list[int]:
        """The kept blocks ``tokens`` start with: full blocks, each followed by a token (the last token always
        has its KV computed: its logits give the first output token)."""
        hit, key = [], b""
        for i in range((len(tokens) - 1) // self.block_size if self.prefix_caching else 0):
            key = block_key(key, tokens, i, self.block_size)
            if key not in self.kept:
                break
            hit.append(self.kept[key])
        return hit

    def keep(self, seq: Sequence) -> None:
        """Keep ``seq``'s blocks that became complete, target and drafter KV (positions below ``num_cached`` less
        the rows the drafter has not read, and a token after them), under their keys: a prompt admitted from now
        on reads them, while ``seq`` runs too. A block whose prefix is kept already stays ``seq``'s own."""
        if not self.prefix_caching:
            return
        keys, bs = seq.block_keys, self.block_size
        for i in range(len(keys), min(seq.num_cached - seq.draft_lag_rows, seq.num_tokens - 1) // bs):
            keys.append(block_key(keys[-1] if keys else b"", seq.tokens, i, bs))
            b = seq.block_table[i]
            if b not in self.key_of and keys[i] not in self.kept:
                self.kept[keys[i]], self.key_of[b] = b, keys[i]
                self.users[b] = 1

    def release(self, seq: Sequence) -> None:
        """Take ``seq``'s blocks back, its complete ones kept (:meth:`keep`): a kept block no sequence reads is
        idle, the rest hold nothing."""
        self.keep(seq)
        for b in reversed(seq.block_table):
            if b not in self.key_of:
                self.free.append(b)
                continue
            self.users[b] -= 1
            if not self.users[b]:
                self.idle[b] = None
        seq.block_table, seq.block_keys = [], []
        seq.num_cached = 0

    def _take(self) -> int:
        """A block for new KV: a free one, else the idle kept block first in line, forgotten."""
        return self.free.pop() if self.free else self._forget()

    def _forget(self) -> int:
        """The idle kept block first in line, its key forgotten."""
        b, _ = self.idle.popitem(last=False)
        del self.kept[self.key_of.pop(b)]
        return b

    def reset_prefix_cache(self) -> None:
        """Forget every kept block no sequence reads (vLLM's ``reset_prefix_cache``)."""
        while self.idle:
            self.free.append(self._forget())

    @property
    def num_free(self) -> int:
        """Blocks available for new KV: free ones and idle kept ones."""
        return len(self.free) + len(self.idle)
