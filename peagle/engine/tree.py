"""Token trees from one drafting pass: their shape, their layout in the target's pass, verification, and
the accepted path's KV.

One P-EAGLE pass gives a distribution at each of the K draft positions. A chain keeps the top token of
each; a tree keeps several, and the target verifies all of them in one pass. A parallel draft at depth
d does not condition on the token chosen at depth d-1, so the same candidates hang under every parent:
a node is a path of ranks ``(r1, ..., rd)`` (vLLM's ``speculative_token_tree`` form), its token the
rank-``rd`` candidate of position d. Nodes are numbered in breadth-first order (by depth, then ranks),
the root (the last emitted token) 0, so cutting a tree to a depth keeps a prefix of its nodes.

The target's pass lays the tree out as rows ``[root, node 1, ..., node N]``; node i writes its KV at
index ``p0 + i`` and reads its ancestors there (:func:`tree_rows`, the attention's
:class:`peagle.models.attention.TreeRows`); the accepted path's KV is then moved to ``p0 + depth``, where a
chain's would be (:func:`path_slots`), and the drafter reads the path's rows as a chain's (:func:`path_rows`).
How many nodes a tree may have is the attention kernel's limit (:func:`peagle.kernels.limits`), checked where the
engine starts (:meth:`peagle.engine.config.Bounds.of`): building a tree reads no library.
"""
from __future__ import annotations

import ast
import heapq
from dataclasses import dataclass
from functools import cached_property, lru_cache

import torch

from peagle.kernels import table
from peagle.memory import to_device
from peagle.models.attention import AttnMeta, Span, TreeRows

MAX_RANK = 16    # candidates per depth a tree may use


@lru_cache(maxsize=1024)
def _checked(paths: tuple) -> tuple[tuple[int, ...], ...]:
    """A tree's nodes validated and in breadth-first order (kept: ``auto`` makes a tree every step)."""
    for p in paths:
        if not p or any(not isinstance(r, int) or isinstance(r, bool) or not 0 <= r < MAX_RANK for r in p):
            raise ValueError(f"token tree node {p}: a node is a non-empty tuple of ranks in 0..{MAX_RANK - 1}")
    paths = tuple(sorted(paths, key=_bfs))
    seen = {()}
    for p in paths:
        if p in seen:
            raise ValueError(f"token tree node {p} appears twice")
        if p[:-1] not in seen:
            raise ValueError(f"token tree node {p} has no parent {p[:-1]} in the tree")
        seen.add(p)
    return paths


@dataclass(frozen=True)
class Tree:
    """Nodes as rank paths in breadth-first order; the empty tree drafts nothing."""

    paths: tuple[tuple[int, ...], ...]

    def __post_init__(self):
        object.__setattr__(self, "paths", _checked(self.paths))

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


def ranks_of(tokens: list[int], candidates: list[list[int]]) -> list[int | None]:
    """What one verified round tells :meth:`peagle.engine.auto_k.AutoK.record` of ``candidates`` (the drafted
    ones, or the head's where the lookup's took their place): the rank of each emitted token (the accepted
    drafts, then the target's own) among its position's candidates, up to the first not among them (None)."""
    ranks = []
    for t, cands in zip(tokens, candidates):
        ranks.append(cands.index(t) if t in cands else None)
        if ranks[-1] is None:
            break
    return ranks


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
        rows, par, dep, lin = _layout(tuple(trees), tuple(first_rows), device)
        n = rows.shape[1]
        toks = [[-1] + list(tk) + [-1] * (n - 1 - len(tk)) for tk in tokens]
        return cls(rows, to_device(toks, device), par, dep, lin)


@lru_cache(maxsize=256)
def _layout(trees: tuple[Tree, ...], first_rows: tuple[int, ...], device: torch.device) -> tuple[torch.Tensor, ...]:
    """A batch of trees' rows, parents, depths and lineage (see :class:`TreeBatch`; read, never written): the
    same every step while the trees and the rows they start at are (one sequence decoding at a fixed K)."""
    n = 1 + max(len(t) for t in trees)
    d = 1 + max(t.depth for t in trees)
    rows, par, dep, lin = [], [], [], []
    for t, f in zip(trees, first_rows):
        pad = n - 1 - len(t)
        rows.append([f + i for i in range(len(t) + 1)] + [f] * pad)
        par.append(t.parents + [0] * pad)
        dep.append(t.depths + [-1] * pad)
        lin.append([li + [li[-1]] * (d - len(li)) for li in t.lineage] + [[0] * d] * pad)
    return tuple(to_device(x, device) for x in (rows, par, dep, lin))


def accept_paths(y: torch.Tensor, tb: TreeBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tree verification on the device (no host sync), given ``y`` ``[B, N+1]``: the target's token at
    each node (its argmax, or its position-keyed sample). A node is accepted when its token is its
    parent's ``y`` and its parent was accepted; siblings hold distinct tokens, so the accepted nodes form
    one path. Returns (accepted drafts ``[B]``, the token emitted after them ``[B]``: ``y`` at the path's
    end, the path's nodes by depth ``[B, D+1]``). One call on peagle's CPU kernels (``peagle::accept_paths``),
    else :func:`accept_paths_torch` (the kernel table's choice)."""
    return table.run("accept_paths", y, tb)


@table.provides("accept_paths", "torch")
def accept_paths_torch(y: torch.Tensor, tb: TreeBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`accept_paths` in torch operators (CUDA, and the CPU without peagle's kernels)."""
    match = tb.tokens == y.gather(1, tb.parents)
    match[:, 0] = True
    # accepted: every node of its lineage matched (the lineage pads with the node itself)
    ok = match.gather(1, tb.lineage.flatten(1)).view(tb.lineage.shape).all(-1) & (tb.depths >= 0)
    depth = torch.where(ok, tb.depths, -1)
    end = depth.argmax(1)                                   # the deepest accepted node (the root if none)
    accepted = depth.gather(1, end[:, None])[:, 0]
    path = tb.lineage.gather(1, end[:, None, None].expand(-1, 1, tb.lineage.shape[2]))[:, 0]
    return accepted, y.gather(1, end[:, None])[:, 0], path


# --------------------------------------------------------------------------- the trees in a pass

def tree_rows(layout: list[tuple[int, Tree] | None], spans: list[Span], positions: list[int],
              device: torch.device) -> TreeRows:
    """Where the rows of a pass write and read their KV: node i of a tree verified from KV index ``start``
    (``layout``: ``(start, tree)`` per sequence, None outside a tree) writes index ``start + i`` and reads its
    ancestors there, the root in place; other rows as usual."""
    kv, base, maps = [], [], []
    width = max(t.depth for _, t in filter(None, layout))
    first = 0
    for span, t in zip(spans, layout):
        if t is None:
            for p in positions[first:first + span.num_rows]:
                kv.append(p), base.append(p + 1), maps.append([0] * width)
        else:
            start, tree = t
            for i, line in enumerate(tree.lineage):
                kv.append(start + i), base.append(start + 1)
                maps.append([start + j for j in line[1:]] + [start] * (width + 1 - len(line)))
        first += span.num_rows
    return TreeRows(to_device(kv, device), to_device(base, device), to_device(maps, device))


def path_slots(layout: list[tuple[int, Tree] | None], path: torch.Tensor,
               meta: AttnMeta) -> tuple[torch.Tensor, torch.Tensor]:
    """The KV slots each tree's accepted ``path`` (:func:`accept_paths`) moves from (index start + node) and
    to (start + depth, where the next steps read it as a chain's; past the path's end dead slots, written
    again later)."""
    pairs = [(i, t[0], j) for i, t in enumerate(layout) if t is not None for j in range(1, t[1].depth + 1)]
    seq_i, start, depth = (to_device(list(x), path.device) for x in zip(*pairs))
    return meta.slots(seq_i, start + path[seq_i, depth]), meta.slots(seq_i, start + depth)


def path_rows(layout: list[tuple[int, Tree] | None], path: torch.Tensor, spans: list[Span],
              cu: list[int]) -> tuple[torch.Tensor, list[Span]]:
    """The pass's rows as the drafter reads them: a tree's root and the nodes of its accepted path by depth
    (then, past the path's end, rows the expansion marks rejected), other sequences' rows as they are.
    Returns the rows (indices into the pass's ``cu[-1]`` rows) and their spans."""
    T, depth1, dev = cu[-1], path.shape[1], path.device
    on_path = torch.cat([torch.arange(T, device=dev), (to_device(cu[:-1], dev)[:, None] + path).flatten()])
    index, new_spans = [], []
    for i, (t, s) in enumerate(zip(layout, spans)):
        if t is not None:
            start, depth = t[0], t[1].depth
            index += range(T + i * depth1, T + i * depth1 + depth + 1)
            new_spans.append(Span(depth + 1, start + depth + 1, s.block_table, start))
        else:
            index += range(cu[i], cu[i + 1])
            new_spans.append(s)
    return on_path[to_device(index, dev)], new_spans
