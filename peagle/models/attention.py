"""Attention over the paged KV cache (inference) and under a chain mask (training).

A forward works on a flat batch of tokens (``[T, ...]``) from many sequences, as vLLM lays it out.
:class:`AttnMeta` says where each sequence's rows are and which KV blocks hold its context. It is
described on the host with plain ints (:class:`Span`); :meth:`AttnMeta.prepare` turns that into a
few tensors on the model's device once per forward (slot mapping, block tables, masks derived from
the rows' positions), so the layers run without host work or per-sequence tensor ops. Rows may be
the nodes of token trees (:class:`TreeRows`): each sees its context and its own ancestors only.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from itertools import accumulate

import torch
import torch.nn.functional as F
from torch import nn

from peagle import kernels
from peagle.kernels import table
from peagle.memory import anonymous_memory, to_device
from peagle.models.layers import Linear, RMSNorm, apply_rope

# sequences of at most kernels.limits().span_rows rows (decoding, verifying, drafting) attend in batches of
MAX_PADDING = 1.25       # sequences whose contexts, padded to the longest, hold at most 25% padding
HOST_SLOT_ROWS = 64      # rows whose KV slots a pass computes on the host (a decode or verify step), not in five ops


@dataclass(frozen=True)
class Span:
    """One sequence's rows in a flat batch: ``num_rows`` consecutive rows whose keys, once this
    pass has written its own, are KV indices ``0..ctx_len-1`` (positions, outside a tree) in the blocks
    of ``block_table``. ``start`` is the first row's position when the rows are ``start, start+1, ...``
    (None when the positions are only known on the device, as for the drafter's expanded rows, or for
    a tree's)."""

    num_rows: int
    ctx_len: int
    block_table: list[int]
    start: int | None = None


@dataclass
class TreeRows:
    """Rows of a pass that are nodes of token trees (laid out by :mod:`peagle.engine.tree`). Row r writes its K/V at KV
    index ``kv_index[r]`` (its position for rows outside a tree) and sees logical keys ``0 .. pos[r]``
    (window aside), of which those at or past ``base[r]`` are read from KV index ``map[r, i - base[r]]``
    (``base[r] = pos[r] + 1`` outside a tree: nothing remapped)."""
    kv_index: torch.Tensor  # [T] long, on the model's device
    base: torch.Tensor      # [T] long
    map: torch.Tensor       # [T, W] long (W >= 1; the entries a row reads are 0 .. pos[r] - base[r])


@dataclass
class Group:
    """Sequences attended in one batched call. ``rows[b, j]``: the flat row of query j of sequence b
    (padding repeats a real row, ``valid`` marks real ones; ``first`` set when the rows are the
    contiguous range ``first .. first+B*Q-1``); keys are the first ``length`` slots of the blocks
    ``blocks[b]`` (or ``kv_slice`` of the pool when one sequence's blocks are contiguous), or the
    pass's own rows (``self_attend``: a whole prompt from position 0)."""

    B: int
    Q: int
    length: int
    block_size: int
    rows: torch.Tensor | None = None
    first: int | None = None
    valid: torch.Tensor | None = None
    blocks: torch.Tensor | None = None
    kv_slice: slice | None = None
    self_attend: bool = False
    causal: bool = False      # one sequence's rows are the last Q of its L keys (a prompt or a chunk of one)
    masks: dict[int | None, torch.Tensor | None] = field(default_factory=dict)
    _folded: dict = field(default_factory=dict)

    def folded_mask(self, window: int | None, gqa: int) -> torch.Tensor | None:
        """The window's mask ``[B, Q, L]`` as :func:`attend` reads it, ``[B, 1, gqa*Q, L]`` (query
        heads sharing a KV head folded into the query axis); built once per forward, not per layer."""
        key = (window, gqa)
        if key not in self._folded:
            m = self.masks[window]
            self._folded[key] = None if m is None else m[:, None].repeat(1, 1, gqa, 1)
        return self._folded[key]


def key_mask(length: int, qpos: torch.Tensor, window: int | None, base: torch.Tensor | None = None,
             kv: torch.Tensor | None = None) -> torch.Tensor:
    """``[..., length]``: key j is visible to a query at position p iff j <= p (and p - j < window). Tree rows
    (``base [...]``, ``kv [..., W]``: :class:`TreeRows`' ``base`` and ``map`` of the same queries) see KV index j
    iff j < base by that rule, or j is the KV index of a logical key base + c <= p the window keeps."""
    keys = torch.arange(length, device=qpos.device)
    m = keys <= qpos[..., None]
    if window:
        m &= keys > qpos[..., None] - window
    if base is None:
        return m
    logical = base[..., None] + torch.arange(kv.shape[-1], device=kv.device)
    seen = logical <= qpos[..., None]
    if window:
        seen &= logical > qpos[..., None] - window
    m &= keys < base[..., None]
    # each map entry marks its KV index where the row sees it, else a spare column past the end
    spare = torch.cat([m, m.new_zeros(*m.shape[:-1], 1)], -1)
    return spare.scatter_(-1, kv.where(seen, length), True)[..., :length]


class AttnMeta:
    """Where one forward's rows sit in the paged KV cache (see the module docstring).

    ``no_write`` (device bool ``[T]``) marks rows that write no KV (the drafter's rejected rows); ``tree`` says
    where token-tree rows write and read their keys (the positions stay RoPE's and the window's)."""

    kernel_ok = True  # peagle's CPU attention kernel may attend its short spans (not PaddedMeta's layout)

    def __init__(self, spans: list[Span], block_size: int, no_write: torch.Tensor | None = None,
                 tree: TreeRows | None = None):
        self.spans, self.block_size, self.no_write, self.tree = spans, block_size, no_write, tree
        self.slot_mapping: torch.Tensor | None = None
        self._groups: dict[bool, list[Group]] = {}
        self._short_rows: torch.Tensor | None = None

    def cut(self, rows: int) -> "AttnMeta":
        """The same rows with each span of more than ``rows`` rows (a prompt or a chunk of one, the drafter's
        catch-up on rows it missed) cut into pieces of at most ``rows``, each over the same blocks: what a causal
        prefill computes, in spans peagle's attention kernel takes whole (each row over its own keys, up to its
        own position, whatever shares its pass) instead of SDPA's. A piece of consecutive positions ends its keys
        at its own last one; one of positions known only on the device (``start`` None: the drafter's expanded
        rows) keeps the span's bound, which only SDPA's groups read. A token tree's rows keep their map (it is
        kept per row, and a tree fits one span)."""
        if all(s.num_rows <= rows for s in self.spans):
            return self
        pieces = [Span(min(rows, s.num_rows - i), s.ctx_len if s.start is None else s.start + min(i + rows, s.num_rows),
                       s.block_table, None if s.start is None else s.start + i)
                  for s in self.spans for i in range(0, s.num_rows, rows)]
        return AttnMeta(pieces, self.block_size, self.no_write, self.tree)

    def for_layers(self, positions: torch.Tensor, caches: list, x: torch.Tensor, head_dim: int, group: int,
                   windows: tuple[int | None, ...] = (None,)) -> "AttnMeta":
        """This pass prepared for a model's layers (:meth:`prepare`, ``self`` too: callers read it after the pass),
        and where peagle's attention kernel runs (``x`` the layers' input), a copy whose long spans are cut into
        spans it takes whole (:meth:`cut`: prompts, the drafter's catch-up on rows it missed), prepared in turn."""
        self.prepare(positions, caches[0].num_slots, windows)
        if not table.pick("attention", x, caches[0], self, head_dim, group).native:
            return self
        meta = self.cut(kernels.limits().span_rows)
        return meta if meta is self else meta.prepare(positions, caches[0].num_slots, windows)

    @classmethod
    def single(cls, slots: torch.Tensor | list[int], start: int, end: int) -> "AttnMeta":
        """One sequence feeding positions ``start..end-1``, position p's KV in ``slots[p]``
        (a block table of block size 1: any slot layout)."""
        return cls([Span(end - start, end, [int(s) for s in slots[:end]], start)], 1)

    def prepare(self, positions: torch.Tensor, num_slots: int, windows: tuple[int | None, ...] = (None,)) -> "AttnMeta":
        """Build the device tensors every layer shares; ``positions`` are the rows' positions on the
        model's device, ``num_slots`` the pools' size (rows that write nothing go to a scratch slot
        past it). Called by the model's forward, once; the SDPA groups are built when first asked for."""
        dev = positions.device
        spans = self.spans
        # slot of each row: its block table entry for its KV index (one gather over a padded table)
        nb = max(len(s.block_table) for s in spans)
        self.table = to_device([s.block_table + [0] * (nb - len(s.block_table)) for s in spans], dev)
        self.seq_of_row = to_device([i for i, s in enumerate(spans) for _ in range(s.num_rows)], dev)
        bs = self.block_size
        if self.tree is None and self.no_write is None and len(positions) <= HOST_SLOT_ROWS and \
                all(s.start is not None for s in spans):   # a decode step's few rows: one copy, not five ops
            slots = to_device([s.block_table[p // bs] * bs + p % bs for s in spans
                               for p in range(s.start, s.start + s.num_rows)], dev)
        else:
            slots = self.slots(self.seq_of_row, positions if self.tree is None else self.tree.kv_index)
        if self.no_write is not None:
            slots = torch.where(self.no_write, num_slots, slots)
        self.slot_mapping, self.positions, self.windows = slots, positions, windows
        self.firsts = list(accumulate((s.num_rows for s in spans), initial=0))
        self._groups, self._short_rows = {}, None
        return self

    @property
    def tree_args(self) -> dict[str, torch.Tensor]:
        """The tree as peagle's attention operators take it (``tree_base``, ``tree_map``; none without one)."""
        return {} if self.tree is None else {"tree_base": self.tree.base, "tree_map": self.tree.map}

    def slots(self, seq: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """The pool slot of KV index ``index`` of sequence ``seq`` (after :meth:`prepare`)."""
        bs = self.block_size
        return self.table[seq, index // bs] * bs + index % bs

    @property
    def groups(self) -> list[Group]:
        """Every sequence's rows, in the groups SDPA attends in one call each."""
        return self._groups_of(long_only=False)

    @property
    def long_groups(self) -> list[Group]:
        """The groups of the sequences with more than ``span_rows`` rows (prompt chunks): SDPA's, where
        peagle's attention kernel takes the short ones (:attr:`short_rows`)."""
        return self._groups_of(long_only=True)

    @property
    def short_rows(self) -> torch.Tensor:
        """The rows of sequences with at most ``span_rows`` rows (decoding, verifying, drafting, short prompts)."""
        if self._short_rows is None:
            short = kernels.limits().span_rows
            self._short_rows = to_device([r for s, f in zip(self.spans, self.firsts) if s.num_rows <= short
                                          for r in range(f, f + s.num_rows)], self.positions.device)
        return self._short_rows

    def _groups_of(self, long_only: bool) -> list[Group]:
        """The SDPA groups (all sequences, or the long ones only), built on first use in a forward."""
        if long_only not in self._groups:
            self._groups[long_only] = self._build_groups(long_only)
        return self._groups[long_only]

    def _build_groups(self, long_only: bool) -> list[Group]:
        spans, firsts, most = self.spans, self.firsts, kernels.limits().span_rows
        long = [i for i, s in enumerate(spans) if s.num_rows > most]
        short = [] if long_only else sorted((i for i, s in enumerate(spans) if s.num_rows <= most),
                                            key=lambda i: spans[i].ctx_len)
        batches, cur = [], []
        for i in short:  # by growing length: a batch ends before padding would pass the bound
            padded, real = (len(cur) + 1) * spans[i].ctx_len, sum(spans[j].ctx_len for j in cur) + spans[i].ctx_len
            if cur and padded > MAX_PADDING * real:
                batches.append(cur)
                cur = []
            cur.append(i)
        batches += [[i] for i in long] + ([cur] if cur else [])
        return [self._group(b, firsts, self.positions, self.windows) for b in batches]

    def _group(self, seqs: list[int], firsts: list[int], positions: torch.Tensor,
               windows: tuple[int | None, ...]) -> Group:
        dev, bs = positions.device, self.block_size
        spans = [self.spans[i] for i in seqs]
        B, Q = len(spans), max(s.num_rows for s in spans)
        L = max(s.ctx_len for s in spans)
        g = Group(B, Q, L, bs)
        if all(s.num_rows == Q for s in spans) and all(firsts[i] == firsts[seqs[0]] + b * Q for b, i in enumerate(seqs)):
            g.first = firsts[seqs[0]]
            take = lambda t: t[g.first:g.first + B * Q].view(B, Q, *t.shape[1:])  # noqa: E731
        else:
            rows = [[firsts[i] + min(j, s.num_rows - 1) for j in range(Q)] for i, s in zip(seqs, spans)]
            g.rows = to_device(rows, dev)
            g.valid = to_device([[j < s.num_rows for j in range(Q)] for s in spans], dev, torch.bool)
            take = lambda t: t[g.rows]  # noqa: E731
        qpos = take(positions)
        tree = () if self.tree is None else (take(self.tree.base), take(self.tree.map))
        s0 = spans[0]
        g.causal = B == 1 and Q > kernels.limits().span_rows and s0.start is not None and s0.start + s0.num_rows == s0.ctx_len
        if g.causal and s0.start == 0:
            g.self_attend = True  # a whole prompt: its keys are this pass's own rows
        elif B == 1 and s0.block_table == list(range(s0.block_table[0], s0.block_table[0] + len(s0.block_table))):
            first = s0.block_table[0] * bs
            g.kv_slice = slice(first, first + L)
        else:
            nbk = -(-L // bs)
            g.blocks = to_device([s.block_table[:nbk] + s.block_table[:1] * (nbk - len(s.block_table[:nbk]))
                                  for s in spans], dev)
            g.length = L if B == 1 else nbk * bs
        decoding = B == 1 and Q == 1 and s0.start == s0.ctx_len - 1
        for w in windows:
            if (decoding and not (w and L > w)) or (g.causal and w is None):
                g.masks[w] = None  # all keys (decoding), or causal: SDPA's kernel, no mask
                continue
            g.masks[w] = key_mask(g.length, qpos, w, *tree)
        return g


class PaddedMeta(AttnMeta):
    """``B`` sequences of ``rows`` rows each (row ``b*rows + j`` is sequence ``b``'s ``j``-th), their
    block tables ``tables`` (device ``[B, nb]``) all padded to one width: built on the device alone,
    from tensors of fixed shape, so a CUDA graph can replay it (:mod:`peagle.engine.graphs`). Each
    row attends to every key of its whole padded table at or before its own position: the price of
    fixed shapes is attention over the padding, which a GPU pays less for than for launching the
    kernels of a pass one by one. Positions past the table (padding sequences) read its last block."""

    kernel_ok = False

    def __init__(self, tables: torch.Tensor, rows: int, block_size: int, no_write: torch.Tensor | None = None,
                 tree: TreeRows | None = None):
        if tree is not None:
            raise ValueError("PaddedMeta (CUDA graphs) has no token-tree layout: run tree steps eagerly (AttnMeta)")
        super().__init__([], block_size, no_write)
        self.tables, self.rows = tables, rows

    def prepare(self, positions: torch.Tensor, num_slots: int, windows: tuple[int | None, ...] = (None,)) -> "PaddedMeta":
        B, nb = self.tables.shape
        bs, pos = self.block_size, positions.view(B, self.rows)
        block = self.tables.gather(1, (pos // bs).clamp(max=nb - 1))
        slots = (block * bs + pos % bs).flatten()
        self.slot_mapping = slots if self.no_write is None else torch.where(self.no_write, num_slots, slots)
        g = Group(B, self.rows, nb * bs, bs, first=0, blocks=self.tables)
        g.masks = {w: key_mask(nb * bs, pos, w) for w in windows}
        self._groups = {False: [g]}
        return self


def untouched_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """Zeros that take memory only where they are written: on the CPU, anonymous pages the OS fills with zeros
    on first use (a KV pool sized for 8,192 positions is resident for the blocks handed out: 300 MB of
    Gemma 3's float32 pool otherwise; reads of the rest see the shared zero page); elsewhere ``torch.zeros``."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    return anonymous_memory(math.prod(shape) * dtype.itemsize).view(dtype).view(shape)


class KVCache:
    """One layer's paged key/value pool: ``[num_slots + 1, kv_heads, head_dim]`` each, the last
    slot a scratch row for rows that write nothing. Zeros to begin with: batched attention reads whole
    blocks, and a masked key still multiplies its value by a zero weight, which never-written
    memory could turn into NaN (stale values of freed blocks are finite); on the CPU the pool's pages become
    resident as blocks are first written (:func:`untouched_zeros`)."""

    paged = True  # the layout peagle's attention kernel reads (peagle.kernels.table)

    def __init__(self, num_slots: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device | str):
        self.num_slots = num_slots
        self.k = untouched_zeros((num_slots + 1, kv_heads, head_dim), dtype, device)
        self.v = untouched_zeros((num_slots + 1, kv_heads, head_dim), dtype, device)

    def materialize(self, slots: int) -> None:
        """Write zeros to the first ``slots`` slots, for a caller about to read them unwritten: on the CPU a read
        of an untouched page maps the zero page, and the first write there afterwards copies it (a TLB shootdown
        a page: +7 ms on a 96-token prefill after the engine timed its passes)."""
        self.k[:slots].zero_()
        self.v[:slots].zero_()

    def write(self, meta: AttnMeta, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k.index_copy_(0, meta.slot_mapping, k.to(self.k.dtype))
        self.v.index_copy_(0, meta.slot_mapping, v.to(self.v.dtype))

    def stored(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``k``, ``v`` as the pools give them back (rounded to a 16-bit cache's dtype, in the rows' dtype), for
        attention over a pass's own rows: the same values as over keys read from the pools."""
        if self.k.dtype == k.dtype:
            return k, v
        return k.to(self.k.dtype).to(k.dtype), v.to(self.v.dtype).to(v.dtype)

    @staticmethod
    def move(caches: list["KVCache"], src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy slots ``src`` to ``dst`` in every layer's pools, every source read before any is written (a
        token tree's accepted path, :func:`peagle.engine.tree.path_slots`)."""
        table.run("move_rows", caches, src, dst)  # natively one call for every layer (0.18 ms of torch ops a step)

    def keys_values(self, g: Group) -> tuple[torch.Tensor, torch.Tensor]:
        """``[B, length, Hkv, d]`` keys and values of a group (a view where the blocks are contiguous)."""
        if g.kv_slice is not None:
            return self.k[g.kv_slice][None], self.v[g.kv_slice][None]
        B, nb = g.blocks.shape
        out = []
        for pool in (self.k, self.v):
            per_block = pool[:self.num_slots].view(-1, g.block_size * pool.shape[1] * pool.shape[2])
            kv = per_block.index_select(0, g.blocks.flatten()).view(B, nb * g.block_size, *pool.shape[1:])
            out.append(kv[:, :g.length])
        return out[0], out[1]


class DenseKV:
    """Training's stand-in for :class:`KVCache`: one layer's keys and values, kept in the autograd
    graph and extended by each forward, so EAGLE-3's unrolled passes (training-time test) attend to
    what earlier passes computed. It may start from keys computed elsewhere (a segment's depth-0
    prefix, :mod:`peagle.train.objective`). The forward's ``meta`` is then a :class:`ChainMask`."""

    def __init__(self, k: torch.Tensor | None = None, v: torch.Tensor | None = None):
        self.k, self.v = k, v

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k = k if self.k is None else torch.cat([self.k, k])
        self.v = v if self.v is None else torch.cat([self.v, v])
        return self.k, self.v


# scores one query block of the chunked chain attention holds (128 MB in bf16): each block runs about 20 operations
# besides its matmuls, so fewer, larger blocks are faster (a 2,048-token document at K = 8 on the default target runs
# in 2 blocks: its attention's forward and backward took 0.6x the time of 8 blocks' on a loaded 2-core CPU)
SCORE_BUDGET = 1 << 26
# bytes of weights the chunked chain attention keeps from forward for backward, per call: a 2,048-token document at
# K = 8 on the default target keeps 238 MB a layer in bf16; past the budget (a long segment) backward recomputes them
SAVED_BUDGET = 512 << 20


@dataclass
class ChainMask:
    """Which keys a training query sees, in the shape of P-EAGLE's attention rule. Queries and keys
    are elements ``(token row, depth)``; keys are depth-major, so the depth-0 keys come first,
    sorted by row. Query ``(a_q, d_q)`` sees key ``(a_k, d_k)`` iff both rows are in one document
    and either ``d_k == 0 and a_k <= a_q`` or ``a_k == a_q and d_k <= d_q``.

    Two views of the same rule, neither of them a dense ``[queries, keys]`` mask: for the chunked
    attention, each query's context keys are one range ``first[q] <= j < end[q]`` and its own chain
    at most ``C`` more (``chain[q, c]``, -1 for none); for FlexAttention, :meth:`mask_mod` states
    the rule per (query, key) pair from the elements' rows and depths."""

    first: torch.Tensor    # [queries] long
    end: torch.Tensor      # [queries] long
    chain: torch.Tensor    # [queries, C] long
    q_tok: torch.Tensor    # [queries] token row
    q_depth: torch.Tensor
    k_tok: torch.Tensor    # [keys]
    k_depth: torch.Tensor
    doc: torch.Tensor      # [rows] document of each token row
    block_mask: object = field(default=None, init=False, repr=False)  # FlexAttention's, built once for all layers

    def mask_mod(self):
        """The rule as FlexAttention's ``mask_mod(b, h, q_idx, kv_idx)``."""
        q_tok, q_depth, k_tok, k_depth, doc = self.q_tok, self.q_depth, self.k_tok, self.k_depth, self.doc

        def rule(b, h, q_idx, kv_idx):
            qt, kt, kd = q_tok[q_idx], k_tok[kv_idx], k_depth[kv_idx]
            return (doc[qt] == doc[kt]) & (((kd == 0) & (kt <= qt)) | ((kt == qt) & (kd <= q_depth[q_idx])))
        return rule


def _layout(q, k, v, chain, scale, dtype):
    """:class:`ChunkedChainAttention`'s operands in the matmuls' dtype: queries ``[Hkv, T, g, d]`` (the query heads
    that share a KV head next to each other, so that a block of queries is the view ``[Hkv, B*g, d]`` and its output
    is written in place), keys and values ``[Hkv, S, d]``, and each query's chain keys and values ``[Hkv, T, C, d]``
    (the chain's products then run for all queries in one batched matmul each)."""
    T, H, d = q.shape
    Hkv, C = k.shape[1], chain.shape[1]
    qh = (q * scale).to(dtype).view(T, Hkv, H // Hkv, d).transpose(0, 1).contiguous()
    kh, vh = (t.to(dtype).transpose(0, 1).contiguous() for t in (k, v))
    idx = chain.clamp(min=0).view(-1)
    kc, vc = (t.index_select(1, idx).view(Hkv, T, C, d) for t in (kh, vh))
    return qh, kh, vh, kc, vc, idx


def _padded(x: torch.Tensor, r0: int, r1: int, pad: int) -> torch.Tensor:
    """Rows ``r0 .. r1-1`` of ``x [Hkv, S, d]`` and ``pad`` zero rows after them: a block's context keys or values
    with a zero row for each chain column of its weights, so that the weights ``[.., R + C]`` enter each matmul
    whole (a slice of them, its rows strided, makes the matmul copy it) and the chain columns add zeros."""
    return torch.cat([x[:, r0:r1], x.new_zeros(x.shape[0], pad, x.shape[2])], 1)


def _probs(qh, kh, sc, first, end, chain, i, j, r0, r1) -> torch.Tensor:
    """The weights ``[Hkv, B, g, R + C]`` of query block ``i .. j-1`` (``R = r1 - r0`` context keys, the union of
    its queries' ranges; then its chain keys, their scores ``sc``): torch's softmax in the matmuls' dtype, as the
    dense path ran it."""
    Hkv, _, g, d = qh.shape
    B, R, C = j - i, r1 - r0, sc.shape[-1]
    s = torch.bmm(qh[:, i:j].view(Hkv, B * g, d), _padded(kh, r0, r1, C).transpose(1, 2)).view(Hkv, B, g, R + C)
    s[..., R:] = sc[:, i:j]
    cols = torch.arange(r0, r1, device=qh.device)
    hidden = torch.cat([(cols < first[i:j, None]) | (cols >= end[i:j, None]), chain[i:j] < 0], 1)   # [B, R+C]
    return torch.softmax(s.masked_fill_(hidden[:, None], float("-inf")), -1, out=s)


def _blocks(first: torch.Tensor, end: torch.Tensor, heads: int, width: int) -> list[tuple[int, int, int, int]]:
    """The query blocks ``(i, j, r0, r1)`` of :class:`ChunkedChainAttention`: queries ``i .. j-1`` whose scores
    (``heads`` x queries x the widest range plus the chain) stay under :data:`SCORE_BUDGET`, each with its
    context keys ``r0 .. r1-1``."""
    T = len(first)
    if not T:
        return []
    block = max(16, SCORE_BUDGET // (heads * max(width, 1)))
    starts = list(range(0, T, block))
    r0 = torch.stack([first[i:i + block].min() for i in starts]).tolist()
    r1 = torch.stack([end[i:i + block].max() for i in starts]).tolist()
    return [(i, min(i + block, T), a, b) for i, a, b in zip(starts, r0, r1)]


class ChunkedChainAttention(torch.autograd.Function):
    """Attention under a :class:`ChainMask` one query block at a time: no ``[H, queries, keys]`` tensor is built,
    and a block scores only the keys its queries' ranges span. Backward reuses the blocks' weights from forward
    while all of them fit :data:`SAVED_BUDGET`; past it forward keeps only its inputs and backward recomputes each
    block's weights (as FlashAttention does), so memory stays one block's scores. The chain keys (at most C per
    query) are scored, and their share of each gradient summed, for all queries at once: per block only the
    large matmuls run. Exact: the dense masked softmax, up to summation order. Matmuls run in the autocast dtype
    where autocast is on, as the dense path's did, and torch's softmax and its backward in the scores' dtype."""

    @staticmethod
    def forward(ctx, q, k, v, m: ChainMask, scale: float):
        T, H, d = q.shape
        Hkv, C = k.shape[1], m.chain.shape[1]
        dev = q.device.type
        dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else q.dtype
        blocks = _blocks(m.first, m.end, H, (int((m.end - m.first).max()) if T else 0) + C)
        keep = sum(H * (j - i) * (r1 - r0 + C) for i, j, r0, r1 in blocks) * dtype.itemsize <= SAVED_BUDGET
        kept = []
        with torch.autocast(dev, enabled=False):
            qh, kh, vh, kc, vc, _ = _layout(q, k, v, m.chain, scale, dtype)
            sc = torch.matmul(qh, kc.transpose(2, 3))                                    # [Hkv, T, g, C]
            pc, oh = torch.empty_like(sc), torch.empty_like(qh)
            for i, j, r0, r1 in blocks:
                p = _probs(qh, kh, sc, m.first, m.end, m.chain, i, j, r0, r1)
                torch.bmm(p.view(Hkv, -1, p.shape[-1]), _padded(vh, r0, r1, C), out=oh[:, i:j].view(Hkv, -1, d))
                pc[:, i:j] = p[..., r1 - r0:]
                if keep:
                    kept.append(p)
            oh += torch.matmul(pc, vc)
        ctx.save_for_backward(q, k, v, m.first, m.end, m.chain, *kept)
        ctx.scale, ctx.blocks, ctx.dtype = scale, blocks, dtype
        return oh.transpose(0, 1).reshape(T, H, d)

    @staticmethod
    def backward(ctx, grad):
        q, k, v, first, end, chain, *kept = ctx.saved_tensors
        scale, dtype = ctx.scale, ctx.dtype
        T, H, d = q.shape
        Hkv, C = k.shape[1], chain.shape[1]
        dk = torch.zeros(Hkv, k.shape[0], d, dtype=torch.float32, device=k.device)
        dv = torch.zeros(Hkv, v.shape[0], d, dtype=torch.float32, device=v.device)
        with torch.autocast(q.device.type, enabled=False):
            qh, kh, vh, kc, vc, idx = _layout(q, k, v, chain, scale, dtype)
            gh = grad.to(dtype).view(T, Hkv, H // Hkv, d).transpose(0, 1).contiguous()  # [Hkv, T, g, d]
            dpc = torch.matmul(gh, vc.transpose(2, 3))                                   # [Hkv, T, g, C]
            sc = None if kept else torch.matmul(qh, kc.transpose(2, 3))
            dqh, dsc, pc = torch.empty_like(qh), torch.empty_like(dpc), torch.empty_like(dpc)
            for n, (i, j, r0, r1) in enumerate(ctx.blocks):
                R = r1 - r0
                p = kept[n] if kept else _probs(qh, kh, sc, first, end, chain, i, j, r0, r1)   # [Hkv, B, g, R+C]
                ks, vs = _padded(kh, r0, r1, C), _padded(vh, r0, r1, C)
                qb, go = qh[:, i:j].view(Hkv, -1, d), gh[:, i:j].view(Hkv, -1, d)
                dp = torch.bmm(go, vs.transpose(1, 2)).view(p.shape)
                dp[..., R:] = dpc[:, i:j]
                ds = torch.ops.aten._softmax_backward_data(dp, p, -1, p.dtype)           # p * (dp - sum(p * dp))
                flat = ds.view(Hkv, -1, R + C)
                torch.bmm(flat, ks, out=dqh[:, i:j].view(Hkv, -1, d))
                dk[:, r0:r1] += torch.bmm(flat.transpose(1, 2), qb)[:, :R]
                dv[:, r0:r1] += torch.bmm(p.view(Hkv, -1, R + C).transpose(1, 2), go)[:, :R]
                dsc[:, i:j], pc[:, i:j] = ds[..., R:], p[..., R:]
            dqh += torch.matmul(dsc, kc)
            # the chain keys' and values' share: rows of [Hkv, T*C, d], added to the keys they were gathered from
            dk.index_add_(1, idx, torch.matmul(dsc.transpose(2, 3), qh).view(Hkv, -1, d).float())
            dv.index_add_(1, idx, torch.matmul(pc.transpose(2, 3), gh).view(Hkv, -1, d).float())
        dq = dqh.transpose(0, 1).reshape(T, H, d) * scale
        return dq.to(q.dtype), dk.transpose(0, 1).to(k.dtype), dv.transpose(0, 1).to(v.dtype), None, None


def attend_chain(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: ChainMask) -> torch.Tensor:
    """Grouped-query attention under a :class:`ChainMask`: q ``[T, H, d]``, k/v ``[S, Hkv, d]`` ->
    ``[T, H*d]``. FlexAttention with the rule as its ``mask_mod`` on CUDA (its kernels skip the blocks
    the mask leaves empty); elsewhere :class:`ChunkedChainAttention` (FlexAttention has no backward on
    the CPU in torch 2.13, and its CPU forward needs a compiler)."""
    T, H, d = q.shape
    if q.device.type == "cuda":
        return flex_chain(q, k, v, m).reshape(T, H * d)
    return ChunkedChainAttention.apply(q, k, v, m, d ** -0.5).reshape(T, H * d)


@functools.cache
def compiled_flex():
    """FlexAttention compiled once (its eager form materialises the scores)."""
    from torch.nn.attention.flex_attention import flex_attention  # here: loads torch._dynamo

    return torch.compile(flex_attention, dynamic=True)


def flex_chain(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: ChainMask, compiled: bool = True) -> torch.Tensor:
    """:func:`attend_chain` through FlexAttention: ``[T, H, d]``. ``compiled=False`` runs torch's
    eager reference (any device, forward only on the CPU), which materialises the scores: for tests."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if m.block_mask is None:  # one for every layer of a pass
        m.block_mask = create_block_mask(m.mask_mod(), None, None, q.shape[0], k.shape[0], device=q.device)
    # the full kernel for every pass: a segment's short query runs (a prefix's keys) otherwise take the decoding
    # kernel, for which Inductor found no configuration on an H200 (torch 2.11)
    opts = {"kernel_options": {"FORCE_USE_FLEX_ATTENTION": True}} if compiled else {}
    o = (compiled_flex() if compiled else flex_attention)(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                                          v.transpose(0, 1)[None], block_mask=m.block_mask,
                                                          enable_gqa=True, **opts)
    return o[0].transpose(0, 1)


def prefix_then_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Attention of a chunk of ``n`` queries that are the last ``n`` of ``L`` keys (``[B, H, *, d]``),
    on the CPU: the cached prefix without a mask and the chunk under the causal kernel, merged by
    their log-sum-exps. Given the lower-right causal bias, the CPU kernel would materialise the mask
    and score every masked block; this skips them (a 2,048-token chunk after 2,048 cached tokens:
    about 20% less attention time)."""
    p = k.shape[2] - q.shape[2]
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    o1, lse1 = flash(q, k[:, :, :p], v[:, :, :p], scale=scale)[:2]
    o2, lse2 = flash(q, k[:, :, p:], v[:, :, p:], is_causal=True, scale=scale)[:2]   # lse: [B, H, n], float32
    lse = torch.logaddexp(lse1, lse2)
    return (o1 * (lse1 - lse).exp()[..., None] + o2 * (lse2 - lse).exp()[..., None]).to(q.dtype)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
           sinks: torch.Tensor | None = None, causal: bool = False, scale: float | None = None) -> torch.Tensor:
    """Grouped-query attention: q ``[B, n, H, d]``, k/v ``[B, L, Hkv, d]``, ``mask`` folded as
    :meth:`Group.folded_mask` makes it (True: attend; None: all keys, or with ``causal`` the n queries
    are the last n of the L keys, each seeing the keys up to its own: a prompt, or a chunk of one
    after its cached start, through SDPA's causal kernel with no mask) -> ``[B, n, H*d]``.

    The query heads that share a KV head are folded into the query axis, so SDPA runs its fast
    kernel without repeating K/V (``enable_gqa`` falls back to the slow math path on CPU); SDPA
    beat two hand-written matmuls even for one decoding query (CPU, bf16 and float32). Attention
    sinks (GPT-OSS: a learned logit per head joins every row's softmax denominator, so a query may
    attend to "nothing") are spelled out, as SDPA cannot express them. Scores are scaled by ``scale``
    (``d ** -0.5`` if None; Gemma 3's ``query_pre_attn_scalar ** -0.5``)."""
    B, n, H, d = q.shape
    Hkv = k.shape[2]
    g = H // Hkv
    scale = d ** -0.5 if scale is None else scale
    kt, vt = k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3)                          # [B, Hkv, L, d]
    L = k.shape[1]
    if causal and sinks is None:  # SDPA's causal kernel (aligned to the last key), no mask materialised
        qh, kh, vh = q.transpose(1, 2), kt.repeat_interleave(g, 1), vt.repeat_interleave(g, 1)
        if n == L:
            o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale)
        elif q.device.type == "cpu":
            o = prefix_then_causal(qh, kh, vh, scale)
        else:  # CUDA's kernels take the lower-right causal bias without materialising it
            from torch.nn.attention.bias import causal_lower_right  # here: importing it loads torch._dynamo (144 MB)

            o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=causal_lower_right(n, L), scale=scale)
        return o.transpose(1, 2).reshape(B, n, H * d)
    if causal:
        mask = torch.ones(n, L, dtype=torch.bool, device=q.device).tril(L - n)[None, None].repeat(1, 1, g, 1)
    qt = q.view(B, n, Hkv, g, d).permute(0, 2, 3, 1, 4).reshape(B, Hkv, g * n, d)
    if sinks is None:
        o = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, scale=scale)
    else:
        scores = torch.matmul(qt * scale, kt.transpose(-1, -2))                 # [B, Hkv, g*n, L]
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        sink = sinks.to(scores.dtype).view(1, Hkv, g, 1, 1).expand(B, Hkv, g, n, 1).reshape(B, Hkv, g * n, 1)
        o = torch.matmul(torch.cat([scores, sink], dim=-1).softmax(-1)[..., :-1], vt)
    return o.view(B, Hkv, g, n, d).permute(0, 3, 1, 2, 4).reshape(B, n, H * d)


class Attention(nn.Module):
    """Attention over the paged cache with the options the supported families need: q/k/v bias
    (Qwen2), per-head q/k RMSNorm (Qwen3), a wider input (EAGLE-3's first layer), a sliding window
    (Mistral; GPT-OSS and Gemma 3 on some layers), attention sinks (GPT-OSS) and a score scale other than
    ``head_dim ** -0.5`` (Gemma 3). q, k and v are one fused projection, as in vLLM (checkpoints keep
    separate names)."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, *, in_dim: int | None = None,
                 qkv_bias: bool = False, o_bias: bool = False, qk_norm_eps: float | None = None,
                 sliding_window: int | None = None, sinks: bool = False, scale: float | None = None):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.scale = head_dim ** -0.5 if scale is None else scale
        self.sliding_window = sliding_window or None
        self.qkv_proj = Linear(in_dim or hidden, (heads + 2 * kv_heads) * head_dim, qkv_bias)
        self.o_proj = Linear(heads * head_dim, hidden, o_bias)
        self.q_norm = RMSNorm(head_dim, qk_norm_eps) if qk_norm_eps is not None else None
        self.k_norm = RMSNorm(head_dim, qk_norm_eps) if qk_norm_eps is not None else None
        self.sinks = nn.Parameter(torch.zeros(heads)) if sinks else None

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], cache: KVCache | DenseKV,
                meta: AttnMeta | ChainMask) -> torch.Tensor:
        T = x.shape[0]
        qkv = self.qkv_proj(x).view(T, self.heads + 2 * self.kv_heads, self.head_dim)
        nqk = self.heads + self.kv_heads
        # peagle's CPU kernel attends the short spans, each row over its own keys, batch-invariant
        native = table.pick("attention", qkv, cache, meta, self.head_dim, self.heads // self.kv_heads).native
        if self.q_norm is None and native:
            # peagle's CPU kernels: RoPE and the KV write in one op, attention for the short spans
            cos, sin = rope
            torch.ops.peagle.rope_write(qkv, cos.reshape(T, -1), sin.reshape(T, -1), self.heads, cache.k, cache.v,
                                        meta.slot_mapping)
            q, k, v = qkv[:, :self.heads], qkv[:, self.heads:nqk], qkv[:, nqk:]
            return self._attend(q, k, v, cache, meta, native=True)
        if self.q_norm is not None:
            qk = torch.cat([self.q_norm(qkv[:, :self.heads]), self.k_norm(qkv[:, self.heads:nqk])], dim=1)
        else:
            qk = qkv[:, :nqk]
        qk = apply_rope(qk, rope)
        q, k, v = qk[:, :self.heads], qk[:, self.heads:], qkv[:, nqk:]
        if isinstance(cache, DenseKV):  # training: meta is a ChainMask
            k, v = cache.extend(k, v)
            return self.o_proj(attend_chain(q, k, v, meta))
        cache.write(meta, k, v)
        return self._attend(q, k, v, cache, meta, native=native)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: KVCache, meta: AttnMeta,
                native: bool) -> torch.Tensor:
        """Attention of the rows (their keys already in ``cache``) and the output projection."""
        T, w, gqa = q.shape[0], self.sliding_window, self.heads // self.kv_heads
        if native:  # peagle's kernel: short spans, any batch
            out = torch.ops.peagle.attention(q, cache.k, cache.v, meta.table, meta.seq_of_row, meta.positions,
                                             meta.short_rows, meta.block_size, w or 0, self.scale,
                                             self.sinks, **meta.tree_args)
            groups = meta.long_groups
        else:
            groups = meta.groups
            one = len(groups) == 1 and groups[0].first == 0
            out = None if one else q.new_empty(T, self.heads * self.head_dim)
        for g in groups:
            if g.self_attend:
                rows = slice(g.first, g.first + g.Q)
                keys, values = cache.stored(k[rows], v[rows])
                o = attend(q[rows][None], keys[None], values[None], g.folded_mask(w, gqa), self.sinks,
                           causal=g.masks[w] is None, scale=self.scale)
            else:
                qg = q[g.first:g.first + g.B * g.Q].view(g.B, g.Q, *q.shape[1:]) if g.first is not None else q[g.rows]
                keys, values = cache.keys_values(g)
                o = attend(qg, keys.to(q.dtype), values.to(q.dtype), g.folded_mask(w, gqa), self.sinks,
                           causal=g.causal and g.masks[w] is None, scale=self.scale)
            if out is None:
                return self.o_proj(o.view(T, -1))
            if g.first is not None:
                out[g.first:g.first + g.B * g.Q] = o.view(g.B * g.Q, -1)
            else:
                out[g.rows[g.valid]] = o[g.valid]
        return self.o_proj(out)
