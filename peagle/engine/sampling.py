"""Sampling parameters, logits processing and the verification of draft tokens.

Drafts are the drafter's argmax (a point mass q), as in vLLM's EAGLE proposers. Against a point
mass, the standard rejection sampler accepts draft d with probability p(d) and otherwise samples
from p with d removed and renormalised, so every emitted token follows p exactly.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class SamplingParams:
    """Per-request sampling, with vLLM's names. ``temperature == 0`` is greedy; ``top_k <= 0`` is off."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 256
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    ignore_eos: bool = False

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if not (isinstance(self.temperature, (int, float)) and self.temperature >= 0):
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool):
            raise ValueError(f"top_k must be an integer, got {self.top_k!r}")
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError("stop must be a list of non-empty strings")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def probs_from_logits(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Target distribution after temperature, top-k and top-p: ``[rows, vocab]`` float32."""
    logits = logits.float() / p.temperature
    if 0 < p.top_k < logits.shape[-1]:
        kth = logits.topk(p.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(-1)
    if p.top_p < 1.0:
        sorted_p, idx = probs.sort(dim=-1, descending=True)
        cum = sorted_p.cumsum(-1)
        drop = cum - sorted_p >= p.top_p  # keep the smallest prefix whose mass reaches top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, idx, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def verify_greedy(logits: torch.Tensor, rows: torch.Tensor, drafts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy verification of a batch on the device: ``rows[b, j]`` is the logit row of sequence b's
    j-th verified position (padding repeats its last), ``drafts[b]`` its drafts (-1 pads). Returns
    (accepted drafts ``[B]``, emitted token ``[B]``: the target's argmax after the accepted drafts)."""
    best = logits.argmax(-1)[rows]                                        # [B, K+1]
    accepted = (drafts == best[:, :-1]).int().cumprod(1).sum(1)
    return accepted, best.gather(1, accepted[:, None])[:, 0]


def verify(logits: torch.Tensor, drafts: torch.Tensor | list[int], p: SamplingParams,
           gen: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Rejection sampling of one sequence's ``drafts`` against the target's ``logits``
    (``[len(drafts)+1, vocab]``), on the device without a host sync.

    Returns (number of accepted drafts, the token emitted after them: drawn from the residual
    ``p`` without the draft where a draft was rejected, else the bonus token from the last row),
    as 0-d tensors. A replacement is drawn for every position and the first rejection's is kept,
    which leaves the distribution of what is emitted exactly ``p``'s."""
    dev = logits.device
    drafts = torch.as_tensor(drafts, dtype=torch.long, device=dev)
    k = drafts.shape[0]
    probs = probs_from_logits(logits, p)
    idx = torch.arange(k, device=dev)
    u = torch.rand(k, generator=gen, device=dev)
    accepted = (u < probs[idx, drafts]).int().cumprod(0).sum()
    residual = probs[:k].clone()
    residual[idx, drafts] = 0.0
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, probs[:k])  # p(d) = 1: never used
    choices = torch.multinomial(torch.cat([residual, probs[k:]]), 1, generator=gen)[:, 0]
    return accepted, choices[accepted]
