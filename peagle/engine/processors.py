"""What a request's sampling fields do to the target's logits before its token is chosen: ``logit_bias``,
``min_tokens`` (the stop tokens held off), then the repetition, frequency and presence penalties, in vLLM's
order and with vLLM's meanings (repetition over prompt and output, the other two over the output), and a
structured output's grammar (:mod:`peagle.engine.grammar`) masking what it forbids.

Under speculation a verified row decides the token after its node, so it is processed with the history
plain decoding would have there: the request's tokens so far and the drafts on the node's path (a chain's
drafts before it, a tree node's ancestors). Verification then compares each draft with the processed
target's token, and greedy and seeded output equal plain decoding's with the same fields. Only the rows of
requests that set a field are touched, on the device and without a host sync (histories are host lists).
A grammar also prunes the drafts before they are verified (:func:`allowed_tree`): a draft it forbids could
never be accepted, so it costs no row.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from peagle.engine import grammar
from peagle.engine.tree import Tree
from peagle.memory import to_device

if TYPE_CHECKING:
    from peagle.engine.sequence import Sequence


def row_histories(seq: Sequence) -> list[list[int]]:
    """The drafts before each verified row of ``seq`` (its tree's nodes, the root first, which has none)."""
    return [[seq.drafts[j - 1] for j in line[1:]] for line in seq.tree.lineage]


def process(logits: torch.Tensor, seq: Sequence, stop_ids: list[int]) -> torch.Tensor:
    """``seq``'s verified rows ``[nodes, vocab]`` after its sampling fields, as a new tensor."""
    p, dev = seq.params, logits.device
    out = logits.clone()
    paths = row_histories(seq)
    if p.logit_bias:
        ids = to_device(list(p.logit_bias), dev)
        out[:, ids] += to_device(list(p.logit_bias.values()), dev, out.dtype)
    if p.repetition_penalty != 1 or p.frequency_penalty or p.presence_penalty:
        counts = output_counts(seq.output_ids, paths, out.shape, dev)
        if p.repetition_penalty != 1:
            seen = (counts > 0) | (to_device(seq.prompt_ids, dev).bincount(minlength=out.shape[1]) > 0)[None]
            out = torch.where(seen, torch.where(out > 0, out / p.repetition_penalty, out * p.repetition_penalty),
                              out)
        if p.frequency_penalty:
            out -= p.frequency_penalty * counts
        if p.presence_penalty:
            out -= p.presence_penalty * (counts > 0).to(out.dtype)
    if seq.matcher is not None:
        grammar.apply(out, grammar_masks(seq.matcher, paths, out.shape[1]))
    if p.min_tokens:  # a row at output position t < min_tokens may not stop
        n = len(seq.output_ids)
        early = [i for i, path in enumerate(paths) if n + len(path) < p.min_tokens]
        if early and stop_ids:
            rows, stops = to_device(early, dev), to_device(stop_ids, dev)
            ban: torch.Tensor | float = float("-inf")
            if seq.matcher is not None:  # unless its grammar, complete, leaves nothing else: it ends short
                others = out[rows].index_fill_(1, stops, float("-inf")).isfinite().any(1, keepdim=True)
                ban = torch.where(others, float("-inf"), out[rows[:, None], stops])
            out[rows[:, None], stops] = ban
    return out


def grammar_masks(matcher: grammar.Matcher, paths: list[list[int]], vocab_size: int) -> torch.Tensor:
    """Each row's allowed tokens: the grammar's state after the row's path (walked, then rolled back)."""
    mask = grammar.new_mask(len(paths), vocab_size)
    for i, path in enumerate(paths):
        for t in path:
            if not matcher.accept(t):   # drafts were pruned (allowed_tree): a forbidden one is a bug
                raise RuntimeError(f"draft {t} is not allowed by the request's grammar")
        if not matcher.terminated:   # (after a stop token the sequence ends: its row is never read)
            matcher.fill(mask, i)
        matcher.rollback(len(path))
    return mask


def allowed_tree(seq: Sequence) -> Tree:
    """``seq``'s draft tree without the nodes its grammar forbids after their ancestors (and their subtrees)."""
    matcher, tree = seq.matcher, seq.tree
    keep = [True]
    for i, line in enumerate(tree.lineage[1:], 1):
        ok, walked = keep[tree.parents[i]], 0
        for j in line[1:] if ok else ():
            if not matcher.accept(seq.drafts[j - 1]):
                ok = False
                break
            walked += 1
        matcher.rollback(walked)
        keep.append(ok)
    return Tree(tuple(p for p, k in zip(tree.paths, keep[1:]) if k))


def output_counts(output_ids: list[int], paths: list[list[int]], shape: torch.Size,
                  device: torch.device) -> torch.Tensor:
    """How often each token occurs in the output as each row sees it: ``output_ids`` then the row's path."""
    counts = to_device(output_ids, device).bincount(minlength=shape[1]).float()[None].repeat(shape[0], 1)
    rows = [i for i, path in enumerate(paths) for _ in path]
    if rows:
        tokens = [t for path in paths for t in path]
        counts.index_put_((to_device(rows, device), to_device(tokens, device)),
                          torch.ones(len(rows), device=device), accumulate=True)
    return counts
