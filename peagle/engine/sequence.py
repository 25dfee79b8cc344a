"""A request's state inside the engine and the result handed back to callers."""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from enum import Enum

import torch

from peagle.engine.detokenizer import Detokenizer
from peagle.engine.sampling import SamplingParams, TokenLogprob, draw_seed

_ids = itertools.count()


class Status(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class SpecStats:
    """Speculation counters, named after vLLM's ``spec_decode`` metrics."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)

    def record(self, drafted: int, accepted: int) -> None:
        if drafted == 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += drafted
        self.num_accepted_tokens += accepted
        if len(self.accepted_per_pos) < drafted:
            self.accepted_per_pos += [0] * (drafted - len(self.accepted_per_pos))
        for i in range(accepted):
            self.accepted_per_pos[i] += 1

    def merge(self, other: "SpecStats") -> None:
        self.num_drafts += other.num_drafts
        self.num_draft_tokens += other.num_draft_tokens
        self.num_accepted_tokens += other.num_accepted_tokens
        n = max(len(self.accepted_per_pos), len(other.accepted_per_pos))
        self.accepted_per_pos = [(self.accepted_per_pos[i] if i < len(self.accepted_per_pos) else 0)
                                 + (other.accepted_per_pos[i] if i < len(other.accepted_per_pos) else 0)
                                 for i in range(n)]

    @property
    def acceptance_length(self) -> float:
        """AL = 1 + accepted drafts per verify round (1.0 when nothing was drafted)."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    @property
    def per_position_acceptance(self) -> list[float]:
        return [a / self.num_drafts for a in self.accepted_per_pos] if self.num_drafts else []


class Sequence:
    def __init__(self, prompt_ids: list[int], params: SamplingParams, request_id: str | None = None):
        self.request_id = request_id if request_id is not None else str(next(_ids))
        self.prompt_ids = list(prompt_ids)
        self.tokens = list(prompt_ids)
        self.params = params
        self.status = Status.WAITING
        self.block_table: list[int] = []
        self.num_cached = 0           # tokens whose target (and drafter) KV is valid
        self.drafts: list[int] = []   # proposed tokens, verified by the next target pass
        # rows the drafter has not read (steps at K = 0): (ids, positions, target taps), read when
        # drafting resumes so its KV has no holes
        self.draft_lag: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self.finish_reason: str | None = None
        self.text = ""
        self.detok: Detokenizer | None = None      # the engine's, when it has a tokenizer
        self.logprobs: list[TokenLogprob] = []     # one per output token, when params.logprobs is set
        self.stats = SpecStats()
        # what sampling is keyed by, with the output position (a seed is drawn for a request that names none)
        self.seed = params.seed if params.seed is not None else draw_seed()
        self.arrival_time = time.perf_counter()
        self.first_token_time: float | None = None
        self.finish_time: float | None = None

    @property
    def draft_lag_rows(self) -> int:
        """Rows the drafter must catch up on before it drafts again."""
        return sum(ids.shape[0] for ids, _, _ in self.draft_lag)

    @property
    def output_ids(self) -> list[int]:
        return self.tokens[len(self.prompt_ids):]

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def finished(self) -> bool:
        return self.status == Status.FINISHED


@dataclass
class RequestOutput:
    request_id: str
    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None
    stats: SpecStats
    ttft_s: float | None
    elapsed_s: float | None

    @classmethod
    def of(cls, seq: Sequence) -> "RequestOutput":
        end = seq.finish_time or time.perf_counter()
        return cls(seq.request_id, seq.prompt_ids, seq.output_ids, seq.text, seq.finish_reason, seq.stats,
                   None if seq.first_token_time is None else seq.first_token_time - seq.arrival_time,
                   end - seq.arrival_time)
