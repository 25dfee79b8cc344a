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
from dataclasses import dataclass

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
    """The chain rule's attention (docs/design.md, "Training") for queries ``q`` over keys ``kv`` (depth-major,
    so the depth-0 context keys come first): ``(a_q, d_q)`` sees ``(a_k, d_k)`` iff same document and either ``d_k == 0
    and a_k <= a_q`` or ``a_k == a_q and d_k <= d_q``."""
    n0 = int((kv.depth == 0).sum())
    k0 = kv.tok[:n0]
    context = (batch.doc[q.tok][:, None] == batch.doc[k0][None, :]) & (k0[None, :] <= q.tok[:, None])
    deep = (kv.depth > 0).nonzero().squeeze(1)
    c = int(kv.depth.max()) if deep.numel() else 0
    table = torch.full((batch.ids.shape[0], c + 1), -1, dtype=torch.long, device=batch.device)  # (row, depth) -> key
    table[kv.tok[deep], kv.depth[deep]] = deep
    chain = table[q.tok][:, 1:]
    chain = torch.where(torch.arange(1, c + 1, device=batch.device)[None, :] <= q.depth[:, None], chain, -1)
    return ChainMask(context, chain)


def segments(batch: Batch, el: Elements, num_segments: int) -> list[tuple[Elements, torch.Tensor]]:
    """Sequence partition: ``(elements to run, which of them carry loss)`` per segment.

    Depth-0 elements belong to the segment of their row, deeper ones (a whole rollout) to the
    segment of row ``t + 1``. A segment runs the depth-0 prefix up to its right edge as context
    (no loss there) plus its own rollouts, so every element sees exactly the keys it sees in one
    pass and the summed gradients equal the single-pass gradient, with peak memory about one
    segment's."""
    if num_segments <= 1:
        return [(el, torch.ones(len(el), dtype=torch.bool, device=batch.device))]
    n = batch.ids.shape[0]
    bounds = torch.linspace(0, n, num_segments + 1, device=batch.device).round().long()
    home = torch.bucketize(el.tok + (el.depth > 0).long(), bounds[1:-1], right=True)
    out = []
    for s in range(num_segments):
        run = ((el.depth == 0) & (el.tok < bounds[s + 1])) | ((el.depth > 0) & (home == s))
        if bool(run.any()):
            out.append((el.select(run), home[run] == s))
    return out


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


Piece = tuple[Batch, Elements, torch.Tensor]  # (batch, elements to run, which of them carry loss)


def pieces(batch: Batch, el: Elements, num_segments: int) -> list[Piece]:
    """The segments of one micro-batch as units of forward and backward."""
    return [(batch, seg, home) for seg, home in segments(batch, el, num_segments)]


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

    def hidden(self, batch: Batch, el: Elements) -> torch.Tensor:
        """Normed outputs ``[len(el), H]`` of the head for ``el`` (depth-major)."""
        head = self.head
        positions = batch.pos[el.tok] + el.depth
        kv = [DenseKV() for _ in range(head.cfg.num_layers)]
        is0 = el.depth == 0
        if self.method == "peagle":
            ids = torch.where(is0, batch.ids[el.tok + 1], head.cfg.mask_token_id)
            hidden = head.mask_feature().expand(len(el), -1).clone()
            hidden[is0] = head.project(batch.taps[el.tok[is0]])
            normed, _ = head(ids, hidden, positions, kv, chain_mask(batch, el, el))
            return normed
        outs, prev = [], None
        for d in range(int(el.depth.max()) + 1):
            at = el.depth == d
            q = el.select(at)
            if d == 0:
                hidden = head.project(batch.taps[q.tok])
            else:  # the head's own output for the same anchor one depth up
                hidden = prev[1][torch.searchsorted(prev[0], q.tok)]
            keys = el.select(el.depth <= d)
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
        p = (batch.final[rows] @ self.target_head.t()).float().softmax(-1)[inverse]
        loss = -(p * F.log_softmax(logits[supervised].float(), -1)).sum()
        return loss, correct, supervised

    def forward(self, batch: Batch, el: Elements, home: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One piece: (summed loss, correct, supervised) over its loss-carrying elements, and which
        of ``el`` those are."""
        with self.autocast():
            normed = self.hidden(batch, el)
            rows = home & batch.supervised_from(el.tok)
            loss, correct, supervised = self.score(batch, el.select(rows), normed[rows])
        return loss, correct, supervised, rows

    def run(self, work: list[Piece], scale: float, backward: bool, model: nn.Module | None = None) -> Stats:
        """Forward (and backward, the loss times ``scale``), piece by piece. ``model`` is this
        objective or its DistributedDataParallel wrapper, which then all-reduces the gradients in
        the last backward only (``no_sync`` for the others)."""
        model = model or self
        stats = Stats.zeros(self.k, self.target_head.device)
        for i, piece in enumerate(work):
            sync = i == len(work) - 1 or not isinstance(model, nn.parallel.DistributedDataParallel)
            with contextlib.nullcontext() if sync else model.no_sync():
                loss, correct, supervised, rows = model(*piece)
                if backward:
                    (loss * scale).backward()
            depth = piece[1].depth[rows]
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
        for seg, home in segments(batch, el, auto_segments(batch, el, 1, max_elements)):
            _, ok, _, rows = objective(batch, seg, home)
            tok, depth = seg.tok[rows], seg.depth[rows]
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


def auto_segments(batch: Batch, el: Elements, requested: int, max_elements: int) -> int:
    """At least ``requested`` segments, more when one segment would exceed ``max_elements`` elements."""
    deep = int((el.depth > 0).sum())
    room = max_elements - batch.ids.shape[0]
    return max(requested, math.ceil(deep / room) if room > 0 else requested)
