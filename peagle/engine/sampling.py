"""Sampling parameters, logits processing and the verification of draft tokens.

Sampling is keyed by position: the token at output position ``t`` of a request is
``y_t = F_t^-1(u(seed, t))``, the inverse CDF of the target's distribution ``p_t`` (after
temperature, top-k and top-p) at one uniform number that depends on the request's seed and ``t``
only. Plain decoding emits ``y_t``; verification computes ``y`` at every node of the drafts (a chain,
or a tree: a node at depth j decides position ``t + j``), accepts a draft iff it equals its parent's
``y`` and emits ``y`` where the accepted path ends (the bonus after a whole path). Drafts are the drafter's argmax (a point mass), so a draft ``d`` is accepted with probability
``p(d)``, as under the standard rejection sampler, and every emitted token is ``y_t``, which follows
``p_t`` exactly: sampled output is the same token for token whatever the method, K, batch,
chunking or preemption, given the same seed. (Gumbel-max keyed the same way would need a hash for
every vocabulary entry of every row; the inverse CDF needs one number a row, known on the host, so
it costs no host sync and no pass over the vocabulary beyond the cumulative sum that sampling makes
anyway.)
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass, field

import torch

from peagle.kernels import table
from peagle.engine.grammar import StructuredOutput
from peagle.memory import to_device

FLOAT32_MAX = torch.finfo(torch.float32).max
GREEDY_BELOW = 1e-5      # temperatures under this are greedy (vLLM's rule): dividing by them overflows
MAX_LOGPROBS = 20        # top alternatives a request may ask for, as OpenAI allows
MAX_BIAS = 100.0         # |logit_bias| at most, as OpenAI allows


class SamplingError(ValueError):
    """The target's logits for a request cannot be sampled (NaN or infinite values)."""


@dataclass
class SamplingParams:
    """Per-request sampling, with vLLM's names and meanings. ``temperature < 1e-5`` is greedy; ``top_k <= 0``
    is off; ``logprobs`` (None: off) asks for the emitted tokens' log-probabilities (the raw model's) and that
    many alternatives. ``logit_bias`` (token id -> added logit), ``min_tokens`` (stop tokens and stop strings
    held off until then), the penalties and ``structured`` (a JSON schema, regex, grammar or choice the output
    follows) change the target's logits before a token is chosen (:mod:`peagle.engine.processors`);
    ``speculative=False`` decodes this request without drafts."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 256
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    ignore_eos: bool = False
    logprobs: int | None = None
    logit_bias: dict[int, float] | None = None
    min_tokens: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    structured: StructuredOutput | None = None
    speculative: bool = True
    token_origins: bool = False   # hand back how each token came, with its text (the server's playground)

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
        if not isinstance(self.min_tokens, int) or isinstance(self.min_tokens, bool) or \
                not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be an integer in 0..max_tokens ({self.max_tokens}), got {self.min_tokens!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and -2 <= v <= 2):
                raise ValueError(f"{name} must be in [-2, 2], got {v!r}")
        if not (isinstance(self.repetition_penalty, (int, float)) and 0 < self.repetition_penalty <= 100):
            raise ValueError(f"repetition_penalty must be in (0, 100], got {self.repetition_penalty!r}")
        for t, v in (self.logit_bias or {}).items():
            if not isinstance(t, int) or isinstance(t, bool) or t < 0:
                raise ValueError(f"logit_bias keys must be token ids (integers >= 0), got {t!r}")
            if not (isinstance(v, (int, float)) and -MAX_BIAS <= v <= MAX_BIAS):
                raise ValueError(f"logit_bias values must be in [-{MAX_BIAS:g}, {MAX_BIAS:g}], got {v!r} for {t}")

    @property
    def processed(self) -> bool:
        """Whether the logits are changed before a token is chosen (:mod:`peagle.engine.processors`)."""
        return bool(self.logit_bias) or self.min_tokens > 0 or self.presence_penalty != 0 or \
            self.frequency_penalty != 0 or self.repetition_penalty != 1 or self.structured is not None

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW


def probs_from_logits(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Target distribution after temperature, top-k and top-p: ``[rows, vocab]`` float32. The divisor stops at
    float32's largest value, so a forbidden token's -inf (a grammar's, a ban's) stays -inf at any temperature:
    past it the divisor was inf and -inf / inf NaN (a 5e307 temperature then sampled a token the grammar forbids:
    found by the API fuzzer)."""
    logits = logits.float() / min(p.temperature, FLOAT32_MAX)
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


_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    """SplitMix64's output function: a bijective mix of 64 bits (Steele, Lea and Flood, 2014)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def draw_seed() -> int:
    """A seed for a request that names none (its output is then reproducible from the seed alone)."""
    return secrets.randbits(63)


def position_uniforms(seed: int, positions: list[int]) -> list[float]:
    """``u(seed, t)`` for output positions ``t``: 53 bits of a counter-based hash of (seed, t), as
    floats in (0, 1)."""
    key = _splitmix64(seed & _MASK64)
    return [((_splitmix64(key ^ t) >> 11) + 0.5) * 2.0 ** -53 for t in positions]


def sample_rows(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Row r's inverse-CDF sample at ``u[r]``: the first token whose cumulative probability exceeds
    ``u[r]`` times the row's total (a token of zero probability is never taken). The cumulative sum
    runs in float64, row by row, so a row's result does not depend on the other rows."""
    cdf = probs.double().cumsum(-1)
    hit = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)[:, 0]
    return hit.clamp_(max=probs.shape[-1] - 1)


def greedy(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's argmax (the first of equal maxima) and whether the row is finite (no NaN, no infinity): peagle's
    one-pass kernel where the table picks it (torch's argmax and isfinite take ~20x as long on the CPU)."""
    return table.run("greedy", logits)


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """:func:`greedy`'s tokens alone, for the callers that do not check finiteness (drafts, processed rows)."""
    return table.run("argmax", logits)


def sample_tokens(logits: torch.Tensor, p: SamplingParams, seed: int, positions: list[int]) -> torch.Tensor:
    """``y`` at each row of ``logits``: the inverse-CDF sample of the target's distribution (after
    temperature, top-k and top-p) at ``u(seed, t)``, ``t`` the row's output position; on the device,
    without a host sync. Verification (:func:`peagle.engine.tree.accept_paths`) accepts a draft iff it is
    its parent's ``y``, so every emitted token is the ``y`` of its position."""
    probs = probs_from_logits(logits, p)
    valid = probs.isfinite().all(-1, keepdim=True) & (probs.sum(-1, keepdim=True) > 0)
    probs = torch.where(valid, probs, 1.0 / probs.shape[-1])  # non-finite logits: the engine's check refuses them
    return sample_rows(probs, to_device(position_uniforms(seed, positions), logits.device, torch.float64))


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
