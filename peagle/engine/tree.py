"""Token trees from one drafting pass.

One P-EAGLE pass gives a distribution at each of the K draft positions. A chain keeps the top token of
each; a tree keeps several, and the target verifies all of them in one pass. A parallel draft at depth
d does not condition on the token chosen at depth d-1, so the same candidates hang under every parent:
a node is a path of ranks ``(r1, ..., rd)`` (vLLM's ``speculative_token_tree`` form), its token the
rank-``rd`` candidate of position d. Nodes are numbered in breadth-first order (by depth, then ranks),
the root (the last emitted token) 0, so cutting a tree to a depth keeps a prefix of its nodes.

The target's pass lays the tree out as rows ``[root, node 1, ..., node N]``; node i writes its KV at
index ``p0 + i`` and reads its ancestors there (:class:`peagle.models.attention.TreeRows`); the
accepted path's KV is then moved to ``p0 + depth``, where a chain's would be.
"""
from __future__ import annotations

import ast
import heapq
from dataclasses import dataclass
from functools import cached_property

import torch

MAX_NODES = 63   # a tree's nodes and its root fit the 64 rows the attention kernel takes as one short span
MAX_RANK = 16    # candidates per depth a tree may use


@dataclass(frozen=True)
class Tree:
    """Nodes as rank paths in breadth-first order; the empty tree drafts nothing."""

    paths: tuple[tuple[int, ...], ...]

    def __post_init__(self):
        for p in self.paths:
            if not p or any(not isinstance(r, int) or isinstance(r, bool) or not 0 <= r < MAX_RANK for r in p):
                raise ValueError(f"token tree node {p}: a node is a non-empty tuple of ranks in 0..{MAX_RANK - 1}")
        if len(self.paths) > MAX_NODES:
            raise ValueError(f"a token tree has at most {MAX_NODES} nodes, got {len(self.paths)}")
        paths = tuple(sorted(self.paths, key=_bfs))
        seen = {()}
        for p in paths:
            if p in seen:
                raise ValueError(f"token tree node {p} appears twice")
            if p[:-1] not in seen:
                raise ValueError(f"token tree node {p} has no parent {p[:-1]} in the tree")
            seen.add(p)
        object.__setattr__(self, "paths", paths)

    @classmethod
    def chain(cls, k: int) -> "Tree":
        return cls(tuple((0,) * d for d in range(1, k + 1)))

    @classmethod
    def parse(cls, spec: "str | list | tuple") -> "Tree":
        """vLLM's explicit form, ``"[(0,), (1,), (0, 0)]"`` (a string or the list itself)."""
        try:
            nodes = ast.literal_eval(spec) if isinstance(spec, str) else spec
            paths = tuple(tuple(p) for p in nodes)
        except (ValueError, SyntaxError, TypeError):
            raise ValueError(f"a token tree is a list of tuples of child ranks such as "
                             f"\"[(0,), (1,), (0, 0)]\", got {spec!r}") from None
        if not paths:
            raise ValueError("an explicit token tree needs at least one node")
        return cls(paths)

    def __len__(self) -> int:
        return len(self.paths)

    @property
    def depth(self) -> int:
        """Draft positions the tree reads (the K the drafter drafts)."""
        return len(self.paths[-1]) if self.paths else 0

    @property
    def ranks(self) -> int:
        """Candidates per position it reads (top-``ranks`` of each draft position)."""
        return 1 + max((max(p) for p in self.paths), default=0)

    @cached_property
    def is_chain(self) -> bool:
        return all(p == (0,) * len(p) for p in self.paths) and all(len(p) == i + 1 for i, p in enumerate(self.paths))

    def cut(self, depth: int) -> "Tree":
        """The nodes at depth ``depth`` or less (a prefix in breadth-first order)."""
        if depth >= self.depth:
            return self
        return Tree(tuple(p for p in self.paths if len(p) <= depth))

    @cached_property
    def nodes_per_depth(self) -> list[int]:
        """How many nodes sit at depth 1, 2, ... (a chain: one each)."""
        out = [0] * self.depth
        for p in self.paths:
            out[len(p) - 1] += 1
        return out

    @cached_property
    def parents(self) -> list[int]:
        """Each node's parent (root 0 first, its own parent 0)."""
        index = {(): 0} | {p: i + 1 for i, p in enumerate(self.paths)}
        return [0] + [index[p[:-1]] for p in self.paths]

    @cached_property
    def depths(self) -> list[int]:
        return [0] + [len(p) for p in self.paths]

    @cached_property
    def lineage(self) -> list[list[int]]:
        """Each node's ancestors by depth, itself last: ``lineage[i][j]`` is node i's ancestor at depth j."""
        out = [[0]]
        for i in range(1, len(self.paths) + 1):
            out.append(out[self.parents[i]] + [i])
        return out

    def tokens(self, candidates: list[list[int]]) -> list[int]:
        """The nodes' tokens from the drafter's candidates ``[position][rank]``."""
        return [candidates[len(p) - 1][p[-1]] for p in self.paths]

    def __str__(self) -> str:
        return "chain" if self.is_chain else str(list(self.paths))


def _bfs(p: tuple[int, ...]) -> tuple:
    return (len(p), p)


def best_first(accept: list[list[float]], budget: int, depth: int) -> tuple[list[tuple[int, ...]], list[float]]:
    """The ``budget`` nodes of largest estimated path acceptance (product of ``accept[d][r]``, the chance
    the rank-r candidate of position d is the target's token once its parent was), at most ``depth`` deep,
    in the order found: every prefix is a tree (a child's product never exceeds its parent's). Returns the
    nodes and their path acceptances; ``1 + sum`` of the first n is the expected tokens of that tree."""
    heap = [(-accept[0][r], (r,)) for r in range(len(accept[0]))] if depth else []
    heapq.heapify(heap)
    nodes, probs = [], []
    while heap and len(nodes) < budget:
        neg, path = heapq.heappop(heap)
        nodes.append(path)
        probs.append(-neg)
        if len(path) < depth:
            for r, a in enumerate(accept[len(path)]):
                heapq.heappush(heap, (neg * a, path + (r,)))
    return nodes, probs


@dataclass
class TreeBatch:
    """The trees of one verify pass on the device, padded to ``N + 1`` nodes (root first) per sequence."""

    rows: torch.Tensor      # [B, N+1] the logit row of each node (padding repeats the root's)
    tokens: torch.Tensor    # [B, N+1] node tokens (root and padding -1: never matched)
    parents: torch.Tensor   # [B, N+1]
    depths: torch.Tensor    # [B, N+1] (padding -1)
    lineage: torch.Tensor   # [B, N+1, D+1] ancestor at each depth (padding: the node itself)

    @classmethod
    def of(cls, trees: list[Tree], tokens: list[list[int]], first_rows: list[int], device: torch.device) -> "TreeBatch":
        from peagle.runtime import to_device

        n = 1 + max(len(t) for t in trees)
        d = 1 + max(t.depth for t in trees)
        rows, toks, par, dep, lin = [], [], [], [], []
        for t, tk, f in zip(trees, tokens, first_rows):
            pad = n - 1 - len(t)
            rows.append([f + i for i in range(len(t) + 1)] + [f] * pad)
            toks.append([-1] + list(tk) + [-1] * pad)
            par.append(t.parents + [0] * pad)
            dep.append(t.depths + [-1] * pad)
            lin.append([li + [li[-1]] * (d - len(li)) for li in t.lineage] + [[0] * d] * pad)
        return cls(*(to_device(x, device) for x in (rows, toks, par, dep, lin)))


def accept_paths(y: torch.Tensor, tb: TreeBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tree verification on the device (no host sync), given ``y`` ``[B, N+1]``: the target's token at
    each node (its argmax, or its position-keyed sample). A node is accepted when its token is its
    parent's ``y`` and its parent was accepted; siblings hold distinct tokens, so the accepted nodes form
    one path. Returns (accepted drafts ``[B]``, the token emitted after them ``[B]``: ``y`` at the path's
    end, the path's nodes by depth ``[B, D+1]``)."""
    match = tb.tokens == y.gather(1, tb.parents)
    match[:, 0] = True
    # accepted: every node of its lineage matched (the lineage pads with the node itself)
    ok = match.gather(1, tb.lineage.flatten(1)).view(tb.lineage.shape).all(-1) & (tb.depths >= 0)
    depth = torch.where(ok, tb.depths, -1)
    end = depth.argmax(1)                                   # the deepest accepted node (the root if none)
    accepted = depth.gather(1, end[:, None])[:, 0]
    path = tb.lineage.gather(1, end[:, None, None].expand(-1, 1, tb.lineage.shape[2]))[:, 0]
    return accepted, y.gather(1, end[:, None])[:, 0], path
