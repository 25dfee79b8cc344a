"""Sampling parameters, logits processing and the verification of draft tokens.

Drafts are the drafter's argmax (a point mass q), as in vLLM's EAGLE proposers. Against a point
mass, the standard rejection sampler accepts draft d with probability p(d) and otherwise samples
from p with d removed and renormalised, so every emitted token follows p exactly.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

GREEDY_BELOW = 1e-5      # temperatures under this are greedy (vLLM's rule): dividing by them overflows
MAX_LOGPROBS = 20        # top alternatives a request may ask for, as OpenAI allows


class SamplingError(ValueError):
    """The target's logits for a request cannot be sampled (NaN or infinite values)."""


@dataclass
class SamplingParams:
    """Per-request sampling, with vLLM's names. ``temperature < 1e-5`` is greedy; ``top_k <= 0`` is off;
    ``logprobs`` (None: off) asks for the emitted tokens' log-probabilities and that many alternatives."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 256
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    ignore_eos: bool = False
    logprobs: int | None = None

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
        if self.logprobs is not None and not (isinstance(self.logprobs, int) and 0 <= self.logprobs <= MAX_LOGPROBS):
            raise ValueError(f"logprobs must be an integer in 0..{MAX_LOGPROBS}, got {self.logprobs!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW


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
        drop[..., 0] = False  # and the top token whatever top_p (5e-324 is 0.0 in float32)
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
    valid = probs.isfinite().all(-1, keepdim=True) & (probs.sum(-1, keepdim=True) > 0)
    probs = torch.where(valid, probs, 1.0 / probs.shape[-1])  # non-finite logits: the engine's check refuses them
    idx = torch.arange(k, device=dev)
    u = torch.rand(k, generator=gen, device=dev)
    accepted = (u < probs[idx, drafts]).int().cumprod(0).sum()
    residual = probs[:k].clone()
    residual[idx, drafts] = 0.0
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, probs[:k])  # p(d) = 1: never used
    choices = torch.multinomial(torch.cat([residual, probs[k:]]), 1, generator=gen)[:, 0]
    return accepted, choices[accepted]


@dataclass
class TokenLogprob:
    """The target's log-probability of an emitted token and its ``top`` alternatives ``(id, logprob)``."""
    token_id: int
    logprob: float
    top: list[tuple[int, float]]


def logprobs_of(logits: torch.Tensor, token_ids: list[int], top_n: int) -> list[TokenLogprob]:
    """Raw log-probabilities (before temperature, top-k and top-p: vLLM's default ``raw_logprobs``)
    of ``token_ids[i]`` under ``logits[i]``, with the ``top_n`` most likely tokens; one host sync."""
    lp = logits.float().log_softmax(-1)
    chosen = lp.gather(1, torch.tensor(token_ids, device=logits.device)[:, None])
    top = lp.topk(top_n, dim=-1)
    rows = torch.cat([chosen, top.values, top.indices.float()], 1).tolist()
    return [TokenLogprob(t, r[0], [(int(i), v) for v, i in zip(r[1:1 + top_n], r[1 + top_n:])])
            for t, r in zip(token_ids, rows)]
