"""The training objectives: P-EAGLE's parallel groups (docs/design.md, "Training") and EAGLE-3's training-time test.

Both work on *elements* ``(token row t, depth d)`` of a packed micro-batch: the anchor is the
token at row ``t`` (position ``a`` in its document), the element sits at RoPE position ``a + d`` and
predicts token ``x[a+d+2]``; its label is the target's distribution at position ``a+d+1``. Depth 0
reads token ``x[a+1]`` with the target feature ``g[a]``, exactly as inference pairs them. Deeper
elements read the mask token and ``fc(mask_hidden)`` (P-EAGLE, all depths in one pass) or token
``x[a+d+1]`` and the head's own pre-norm output at depth ``d-1`` (EAGLE-3, one pass per depth).

Attention follows the chain rule of docs/design.md ("Training"): element ``(a_q, d_q)`` sees ``(a_k, d_k)`` iff
both are in the same document and either ``d_k == 0 and a_k <= a_q`` or ``a_k == a_q and d_k <= d_q``; that is
what a mask slot sees at inference (all verified context, the bonus row, earlier mask slots).
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from peagle.models.drafter import Drafter
from peagle.models.attention import ChainMask, DenseKV

METHODS = ("peagle", "eagle3")
LABELS = ("soft", "hard")


@dataclass
class Doc:
    """One training sequence with the target's view of it (from ``peagle hidden`` or computed online)."""

    ids: torch.Tensor      # [n] prompt + response token ids
    prompt_len: int
    taps: torch.Tensor     # [n, 3*H_target] auxiliary hidden states
    final: torch.Tensor    # [n, H_target] the target's final normed hidden state (its distribution)
    argmax: torch.Tensor   # [n] the target's greedy next token at each position


@dataclass
class Batch:
    """Documents packed along one token axis; positions restart in each document."""

    ids: torch.Tensor
    taps: torch.Tensor
    final: torch.Tensor
    argmax: torch.Tensor
    doc: torch.Tensor      # [N] document index of each row
    pos: torch.Tensor      # [N] position within its document
    first_anchor: list[int]  # per document: row of the first supervised anchor (the last prompt token)
    last_row: list[int]      # per document: row of its last token

    @property
    def device(self) -> torch.device:
        return self.ids.device

    def supervised_from(self, tok: torch.Tensor) -> torch.Tensor:
        """Whether each anchor row is at or after its document's last prompt token (loss starts there)."""
        return tok >= torch.tensor(self.first_anchor, device=self.device)[self.doc[tok]]

    @classmethod
    def pack(cls, docs: list[Doc]) -> "Batch":
        """One batch on the documents' device."""
        first, last, start = [], [], 0
        for d in docs:
            first.append(start + max(d.prompt_len - 1, 0))
            last.append(start + len(d.ids) - 1)
            start += len(d.ids)
        dev = docs[0].ids.device
        return cls(torch.cat([d.ids for d in docs]), torch.cat([d.taps for d in docs]),
                   torch.cat([d.final for d in docs]), torch.cat([d.argmax for d in docs]),
                   torch.cat([torch.full((len(d.ids),), i, device=dev) for i, d in enumerate(docs)]),
                   torch.cat([torch.arange(len(d.ids), device=dev) for d in docs]), first, last)


@dataclass
class Elements:
    """Element rows sorted by (depth, token row): depth-major, so EAGLE-3 runs one depth per pass."""

    tok: torch.Tensor
    depth: torch.Tensor

    def __len__(self) -> int:
        return self.tok.shape[0]

    def select(self, keep: torch.Tensor) -> "Elements":
        return Elements(self.tok[keep], self.depth[keep])


def sample_elements(batch: Batch, k: int, r: float, r_min: float, gens: list[torch.Generator] | None) -> Elements:
    """Depth 0: every anchor whose label ``x[a+2]`` exists (prompt rows are context, the rest
    supervised). Depth d >= 1: anchors from the last prompt token on whose label exists, about
    ``(n_valid - d) * max(r**d, r_min)`` of them, drawn from the anchors kept at depth d-1 (P-EAGLE's
    position sampling). ``gens=None`` keeps them all (EAGLE-3's training-time test, evaluation)."""
    dev = batch.device
    toks = [[] for _ in range(k)]
    for i, (lo, hi) in enumerate(zip(batch.first_anchor, batch.last_row)):
        start = hi - int(batch.pos[hi])
        toks[0].append(torch.arange(start, hi - 1, device=dev))
        kept = torch.arange(lo, hi - 1, device=dev)
        n_valid = kept.shape[0]
        for d in range(1, k):
            cand = kept[kept <= hi - 2 - d]            # label x[a+d+2] must exist
            if gens is not None:  # drawn on the CPU generator: the same elements on every device
                c = min(cand.shape[0], round((n_valid - d) * max(r ** d, r_min)))
                pick = torch.randperm(cand.shape[0], generator=gens[i], device="cpu")[:c]
                cand = cand[pick.to(dev)].sort().values
            toks[d].append(cand)
            kept = cand
    tok = [torch.cat(t) for t in toks]
    return Elements(torch.cat(tok), torch.cat([torch.full_like(t, d) for d, t in enumerate(tok)]))


def chain_mask(batch: Batch, q: Elements, kv: Elements) -> ChainMask:
    """The chain rule's attention (docs/design.md, "Training") for queries ``q`` over keys ``kv`` (depth-major, so
    the depth-0 context keys come first, sorted by row): ``(a_q, d_q)`` sees ``(a_k, d_k)`` iff same document and
    either ``d_k == 0 and a_k <= a_q`` or ``a_k == a_q and d_k <= d_q``. The context keys of a query are one range of
    the depth-0 keys: its document's first up to its own row."""
    n0 = int((kv.depth == 0).sum())
    k0 = kv.tok[:n0]
    first = torch.searchsorted(k0, q.tok - batch.pos[q.tok])
    end = torch.searchsorted(k0, q.tok, right=True)
    deep = (kv.depth > 0).nonzero().squeeze(1)
    c = int(kv.depth.max()) if deep.numel() else 0
    table = torch.full((batch.ids.shape[0], c + 1), -1, dtype=torch.long, device=batch.device)  # (row, depth) -> key
    table[kv.tok[deep], kv.depth[deep]] = deep
    chain = table[q.tok][:, 1:]
    chain = torch.where(torch.arange(1, c + 1, device=batch.device)[None, :] <= q.depth[:, None], chain, -1)
    return ChainMask(first, end, chain, q.tok, q.depth, kv.tok, kv.depth, batch.doc)


class PrefixKV:
    """The depth-0 elements of one partitioned micro-batch, their keys and values at every layer
    (one pass without gradients, computed when the first segment needs them), and the gradients the
    segments run so far sent back to them.

    Every element attends to the depth-0 keys before it (docs/design.md), so a segment needs the keys and values
    of the depth-0 elements before its first row, and nothing else of them. It reads them as leaves
    and adds the gradient they receive here; segments run last to first, so when one runs, every
    later segment has already sent its share, and its backward feeds that share through its own
    depth-0 elements' keys and values. The summed gradients are those of one pass over the whole
    micro-batch, while a segment holds the activations of its own elements only."""

    def __init__(self, el0: Elements):
        self.el0 = el0
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self.gk: list[torch.Tensor] = []
        self.gv: list[torch.Tensor] = []
        self.leaves: list[tuple[torch.Tensor, torch.Tensor]] = []

    def fill(self, objective: "Objective", batch: Batch) -> None:
        if self.k:
            return
        kv = [DenseKV() for _ in range(objective.head.cfg.num_layers)]
        with torch.no_grad():
            objective.hidden(batch, self.el0, kv)
        self.k, self.v = [c.k for c in kv], [c.v for c in kv]
        self.gk = [torch.zeros(k.shape, dtype=torch.float32, device=k.device) for k in self.k]
        self.gv = [torch.zeros(v.shape, dtype=torch.float32, device=v.device) for v in self.v]

    def caches(self, context: slice, grad: bool) -> list[DenseKV]:
        """Per layer, a cache that starts from the keys and values of the depth-0 elements ``context``
        (leaves that collect their gradient when ``grad``)."""
        self.leaves = [(k[context].detach().requires_grad_(grad), v[context].detach().requires_grad_(grad))
                       for k, v in zip(self.k, self.v)]
        return [DenseKV(k, v) for k, v in self.leaves]

    def sent_back(self, own: slice) -> list[torch.Tensor]:
        """The gradients later segments sent to the depth-0 elements ``own``, per layer: keys', values'."""
        return [g[own] for pair in zip(self.gk, self.gv) for g in pair]

    def collect(self, context: slice) -> None:
        """Add the gradients the last segment's backward left on its context leaves."""
        for l, (k, v) in enumerate(self.leaves):
            if k.grad is not None:
                self.gk[l][context] += k.grad.float()
                self.gv[l][context] += v.grad.float()
        self.leaves = []


@dataclass
class Piece:
    """One unit of forward and backward: a micro-batch's segment. ``prefix`` None: the whole
    micro-batch in one pass. Else ``context`` and ``own`` index ``prefix.el0``: the depth-0
    elements before the segment that its elements attend to, and its own."""

    batch: Batch
    el: Elements
    prefix: PrefixKV | None = None
    context: slice = field(default_factory=lambda: slice(0, 0))
    own: slice = field(default_factory=lambda: slice(0, 0))


def home_rows(el: Elements, method: str) -> torch.Tensor:
    """The row whose segment an element belongs to (the paper's Algorithm 1): a depth-0 element its
    own; P-EAGLE's rollout from anchor ``a`` (whose depth-1 element sits at position ``a + 1``) row
    ``a + 1``; EAGLE-3's rollout row ``a``, with its depth-0 element, whose output its depth 1 reads."""
    return el.tok + ((el.depth > 0) & (method == "peagle")).long()


def num_segments(el: Elements, requested: int, max_elements: int) -> int:
    """At least ``requested`` segments, and as many as it takes to hold at most about
    ``max_elements`` elements each."""
    return max(requested, math.ceil(len(el) / max_elements))


def pieces(batch: Batch, el: Elements, count: int, method: str) -> list[Piece]:
    """The micro-batch in ``count`` segments of about equal element counts, cut between rows, last
    segment first (:class:`PrefixKV`). A segment holds the depth-0 elements of its rows and the
    rollouts homed there (:func:`home_rows`); the depth-0 elements before it enter as keys only."""
    if count <= 1:
        return [Piece(batch, el)]
    n = batch.ids.shape[0]
    home = home_rows(el, method)
    per_row = torch.bincount(home, minlength=n).cumsum(0)
    cuts = torch.searchsorted(per_row, torch.linspace(0, len(el), count + 1, device=batch.device)[1:-1].round().long(),
                              right=True)
    bounds = [0, *sorted(set(cuts.tolist())), n]
    is0 = el.depth == 0
    prefix = PrefixKV(el.select(is0))
    rows0 = prefix.el0.tok
    out = []
    for lo, hi in zip(bounds, bounds[1:]):
        mine = (home >= lo) & (home < hi)
        if not bool(mine.any()):
            continue
        start = lo - int(batch.pos[lo])    # the first document in the segment begins here
        i, j, e = (int(x) for x in torch.searchsorted(rows0, torch.tensor([start, lo, hi], device=batch.device)))
        out.append(Piece(batch, el.select(mine), prefix, slice(i, j), slice(j, e)))
    return out[::-1]


@dataclass
class Stats:
    """Sums over supervised elements, per depth: loss, correct top-1, count. Tensors on the batch's
    device, read back once a step."""

    loss: torch.Tensor
    correct: torch.Tensor
    count: torch.Tensor

    @classmethod
    def zeros(cls, k: int, device: torch.device) -> "Stats":
        return cls(torch.zeros((), device=device), torch.zeros(k, device=device), torch.zeros(k, device=device))


class Objective(nn.Module):
    """Runs a head over a packed batch's elements and scores them against the target.

    ``target_head`` holds the target's LM-head rows of the draft vocabulary ``[V_draft, H_target]``:
    with ``labels="soft"`` the label of an element is ``softmax(final @ target_head.T)``, the
    target's distribution restricted to the draft vocabulary; with ``"hard"`` its greedy token, the
    one greedy verification accepts. Elements whose target argmax is outside it carry no loss.

    A module whose ``forward`` is one piece's loss, so that data-parallel training can wrap it
    whole (DDP sees every use of the head's weights inside one forward). ``dtype`` is the autocast
    dtype: the head keeps float32 weights; bfloat16/float16 run its matmuls in that dtype."""

    def __init__(self, head: Drafter, method: str, k: int, target_head: torch.Tensor,
                 dtype: torch.dtype = torch.float32, labels: str = "soft"):
        super().__init__()
        if method not in METHODS:
            raise ValueError(f"unknown training method {method!r}; choose one of {', '.join(METHODS)}")
        if labels not in LABELS:
            raise ValueError(f"unknown labels {labels!r}; choose one of {', '.join(LABELS)}")
        self.head, self.method, self.k, self.dtype, self.labels = head, method, k, dtype, labels
        self.target_head = target_head.detach()
        self.in_draft = head.t2d
        self.draft_ids = head.draft_vocab_ids()   # sorted target ids: a target id's draft id by search

    def autocast(self) -> contextlib.AbstractContextManager:
        """Matmuls in ``dtype`` (weights stay float32); float32: no autocast."""
        return torch.autocast(self.target_head.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32)

    def hidden(self, batch: Batch, el: Elements, kv: list[DenseKV] | None = None,
               context: Elements | None = None) -> torch.Tensor:
        """Normed outputs ``[len(el), H]`` of the head for ``el`` (depth-major). ``kv`` per layer, where
        given, starts from the keys and values of the depth-0 elements ``context`` (all before ``el``'s
        rows), which ``el`` attends to as well; its keys and values are left there."""
        head = self.head
        positions = batch.pos[el.tok] + el.depth
        if kv is None:
            kv = [DenseKV() for _ in range(head.cfg.num_layers)]
        def keys_of(e: Elements) -> Elements:   # the context's keys first: depth 0, sorted by row
            if context is None or not len(context):
                return e
            return Elements(torch.cat([context.tok, e.tok]), torch.cat([context.depth, e.depth]))
        is0 = el.depth == 0
        if self.method == "peagle":
            ids = torch.where(is0, batch.ids[el.tok + 1], head.cfg.mask_token_id)
            hidden = head.mask_feature().expand(len(el), -1).clone()
            hidden[is0] = head.project(batch.taps[el.tok[is0]])
            normed, _ = head(ids, hidden, positions, kv, chain_mask(batch, el, keys_of(el)))
            return normed
        outs, prev = [], None
        for d in range(int(el.depth.max()) + 1):
            at = el.depth == d
            q = el.select(at)
            if d == 0:
                hidden = head.project(batch.taps[q.tok])
            else:  # the head's own output for the same anchor one depth up
                hidden = prev[1][torch.searchsorted(prev[0], q.tok)]
            keys = keys_of(el.select(el.depth <= d))
            normed, pre = head(batch.ids[q.tok + d + 1], hidden, positions[at], kv, chain_mask(batch, q, keys))
            outs.append(normed)
            prev = (q.tok, pre)
        return torch.cat(outs)

    def score(self, batch: Batch, el: Elements, normed: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(summed cross-entropy over supervised elements, top-1 correct, supervised) for ``el``.

        A target token outside the draft vocabulary can never be drafted: such elements carry no
        loss, and evaluation counts them as misses."""
        label = el.tok + el.depth + 1
        logits = self.head.logits(normed)
        want = batch.argmax[label]
        supervised = self.in_draft[want]
        correct = self.head.to_target_ids(logits.argmax(-1)) == want
        if self.labels == "hard":
            loss = F.cross_entropy(logits[supervised].float(), torch.searchsorted(self.draft_ids, want[supervised]),
                                   reduction="sum")
            return loss, correct, supervised
        rows, inverse = label[supervised].unique(return_inverse=True)  # depths share label rows
        th = self.target_head  # in the target's dtype: its logits as it computes them
        p = (batch.final[rows].to(th.dtype) @ th.t()).float().softmax(-1)[inverse]
        loss = -(p * F.log_softmax(logits[supervised].float(), -1)).sum()
        return loss, correct, supervised

    def forward(self, piece: Piece) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                             list[torch.Tensor]]:
        """One piece: (summed loss, correct, supervised) over its supervised elements, which of the
        piece's elements those are, and (a segment) its own depth-0 elements' keys and values per
        layer, keys then values, to which :meth:`run` sends the later segments' gradients."""
        batch, el = piece.batch, piece.el
        with self.autocast():
            if piece.prefix is None:
                normed, own = self.hidden(batch, el), []
            else:
                piece.prefix.fill(self, batch)
                kv = piece.prefix.caches(piece.context, torch.is_grad_enabled())
                el0 = piece.prefix.el0
                context = Elements(el0.tok[piece.context], el0.depth[piece.context])
                normed = self.hidden(batch, el, kv, context)
                n, m = piece.context.stop - piece.context.start, piece.own.stop - piece.own.start
                own = [t[n:n + m] for c in kv for t in (c.k, c.v)]
            rows = batch.supervised_from(el.tok)
            loss, correct, supervised = self.score(batch, el.select(rows), normed[rows])
        return loss, correct, supervised, rows, own

    def run(self, work: list[Piece], scale: float, backward: bool, model: nn.Module | None = None) -> Stats:
        """Forward (and backward, the loss times ``scale``), piece by piece. ``model`` is this
        objective, its DistributedDataParallel wrapper or itself under FSDP2's ``fully_shard``, which
        then reduce the gradients in the last backward only. A segment's backward also carries the
        gradients later segments sent to its depth-0 keys and values (:class:`PrefixKV`)."""
        model = model or self
        stats = Stats.zeros(self.k, self.target_head.device)
        for i, piece in enumerate(work):
            sync = i == len(work) - 1
            if hasattr(model, "set_requires_gradient_sync"):   # FSDP2's fully_shard
                model.set_requires_gradient_sync(sync)
            ddp = isinstance(model, nn.parallel.DistributedDataParallel)
            with model.no_sync() if ddp and not sync else contextlib.nullcontext():
                loss, correct, supervised, rows, own = model(piece)
                if backward:
                    sent = piece.prefix.sent_back(piece.own) if own else []
                    torch.autograd.backward([loss * scale, *own], [None, *(g.to(t.dtype) for g, t in zip(sent, own))])
                    if piece.prefix is not None:
                        piece.prefix.collect(piece.context)
            depth = piece.el.depth[rows]
            stats.loss += loss.detach()
            stats.correct += torch.bincount(depth[correct & supervised], minlength=self.k)[:self.k]
            stats.count += torch.bincount(depth[supervised], minlength=self.k)[:self.k]
        return stats

    def count(self, batch: Batch, el: Elements) -> int:
        """Elements that carry loss: every loss is divided by one global count of them."""
        return int((batch.supervised_from(el.tok) & self.in_draft[batch.argmax[el.tok + el.depth + 1]]).sum())


@torch.no_grad()
def evaluate(objective: Objective, docs: list[Doc], k: int, max_elements: int = 8192) -> dict:
    """Per-depth top-1 accuracy over every anchor, and the acceptance length greedy verification
    would give: 1 + the leading run of correct depths, averaged over anchors with all K labels."""
    dev = objective.target_head.device
    correct, count, runs = torch.zeros(k, device=dev), torch.zeros(k, device=dev), []
    for doc in docs:
        batch = Batch.pack([doc])
        el = sample_elements(batch, k, 1.0, 1.0, None)
        hits = torch.zeros(batch.ids.shape[0], k, dtype=torch.bool, device=dev)
        for piece in pieces(batch, el, num_segments(el, 1, max_elements), objective.method):
            _, ok, _, rows, _ = objective(piece)
            tok, depth = piece.el.tok[rows], piece.el.depth[rows]
            hits[tok, depth] = ok
            correct += torch.bincount(depth[ok], minlength=k)[:k]
            count += torch.bincount(depth, minlength=k)[:k]
        full = torch.arange(batch.first_anchor[0], batch.last_row[0] - k, device=dev)  # anchors with all K labels
        if full.numel():
            runs.append(hits[full].long().cumprod(1).sum(1).float())
    runs_t = torch.cat(runs) if runs else torch.zeros(1, device=dev)
    acc = (correct / count.clamp(min=1)).tolist()
    return {"acc": [round(a, 4) for a in acc], "al": round(1.0 + float(runs_t.mean()), 4),
            "anchors": int(runs_t.numel())}
