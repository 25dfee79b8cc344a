"""A request's state inside the engine and the result handed back to callers."""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from enum import Enum

import torch

from peagle.engine.detokenizer import Detokenizer
from peagle.engine.grammar import Matcher
from peagle.engine.lookup import PromptLookup
from peagle.engine.sampling import SamplingParams, TokenLogprob, draw_seed
from peagle.engine.tree import Tree

_ids = itertools.count()

# how an output token came (:attr:`Sequence.origins`); k >= 1: the k-th draft of its round, accepted
CORRECTED = 0   # the target's own token where its round's draft was rejected
BONUS = -1      # the target's token after every draft of its round was accepted
PLAIN = -2      # a round without drafts (the first token, K = 0, a request that opted out)


class Status(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class SpecStats:
    """Speculation counters, named after vLLM's ``spec_decode`` metrics. A draft token is a verified node
    (a chain's K, a tree's every node); ``drafted_per_pos`` counts them by depth, ``accepted_per_pos`` the
    accepted ones (at most one a depth), ``histogram[a]`` the rounds that accepted ``a`` drafts."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    drafted_per_pos: list[int] = field(default_factory=list)
    histogram: list[int] = field(default_factory=list)

    def record(self, nodes_per_depth: list[int], accepted: int) -> None:
        if not nodes_per_depth:
            return
        self.num_drafts += 1
        self.num_draft_tokens += sum(nodes_per_depth)
        self.num_accepted_tokens += accepted
        _add(self.drafted_per_pos, nodes_per_depth)
        _add(self.accepted_per_pos, [1] * accepted + [0] * (len(nodes_per_depth) - accepted))
        _add(self.histogram, [0] * accepted + [1])

    def merge(self, other: "SpecStats") -> None:
        self.num_drafts += other.num_drafts
        self.num_draft_tokens += other.num_draft_tokens
        self.num_accepted_tokens += other.num_accepted_tokens
        _add(self.accepted_per_pos, other.accepted_per_pos)
        _add(self.drafted_per_pos, other.drafted_per_pos)
        _add(self.histogram, other.histogram)

    @property
    def acceptance_length(self) -> float:
        """AL = 1 + accepted drafts per verify round (1.0 when nothing was drafted)."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    @property
    def per_position_acceptance(self) -> list[float]:
        return [a / self.num_drafts for a in self.accepted_per_pos] if self.num_drafts else []


def _add(into: list[int], counts: list[int]) -> None:
    """``into += counts`` element by element, ``into`` grown as needed."""
    into += [0] * (len(counts) - len(into))
    for i, c in enumerate(counts):
        into[i] += c


class Sequence:
    def __init__(self, prompt_ids: list[int], params: SamplingParams, request_id: str | None = None):
        self.request_id = request_id if request_id is not None else str(next(_ids))
        self.prompt_ids = list(prompt_ids)
        self.tokens = list(prompt_ids)
        self.params = params
        self.status = Status.WAITING
        self.block_table: list[int] = []
        self.block_keys: list[bytes] = []   # its complete leading blocks' keys (the block manager's prefix cache)
        self.cached_prompt_tokens: int | None = None   # its prompt's tokens found kept when first admitted
        self.num_cached = 0           # tokens whose target (and drafter) KV is valid
        self.drafts: list[int] = []   # proposed tokens, verified by the next target pass: the nodes of
        self.tree = Tree(())          # this tree, in its order (a chain: K nodes, one a depth)
        self.candidates: list[list[int]] = []   # the drafter's [position][rank] candidates they came from
        self.lookup: PromptLookup | None = None   # drafts from its own text (the engine's prompt_lookup_*)
        # where its drafts came from, in a step the drafter skipped ("match", "short": the text; "responses": the
        # target's earlier responses; "": the head, or none)
        self.drafts_from = ""
        self.head_candidates: list[list[int]] | None = None   # the head's, where the lookup's took their place
        # rows the drafter has not read (steps at K = 0): (ids, positions, target taps), read when
        # drafting resumes so its KV has no holes
        self.draft_lag: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self.draft_lag_rows = 0       # their rows, counted as they come (auto K reads it every step)
        self.finish_reason: str | None = None
        self.error: str | None = None     # why it ended with finish_reason "error" (its grammar's dead end)
        self.text = ""
        self.detok: Detokenizer | None = None      # the engine's, when it has a tokenizer
        self.matcher: Matcher | None = None        # the grammar's state after the output, for a structured output
        self.logprobs: list[TokenLogprob] = []     # one per output token, when params.logprobs is set
        self.origins: list[int] = []               # how each output token came (BONUS, CORRECTED, PLAIN, k)
        self.text_ends: list[int] = []             # the detokenized text's length after each output token
        self.stats = SpecStats()
        # what sampling is keyed by, with the output position (a seed is drawn for a request that names none)
        self.seed = params.seed if params.seed is not None else draw_seed()
        self.arrival_time = time.perf_counter()
        self.first_token_time: float | None = None
        self.finish_time: float | None = None

    def set_drafts(self, tree: Tree, candidates: list[list[int]]) -> None:
        """Draft ``tree`` from the drafter's ``[position][rank]`` candidates (the empty tree: no drafts)."""
        self.tree = tree
        self.candidates = candidates[:tree.depth]
        self.drafts = tree.tokens(self.candidates)

    def lag(self, ids: torch.Tensor, positions: torch.Tensor, taps: torch.Tensor) -> None:
        """Keep a step's rows the drafter skipped (K = 0), to be read when drafting resumes."""
        self.draft_lag.append((ids, positions, taps))
        self.draft_lag_rows += ids.shape[0]

    def take_lag(self) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """The skipped rows, handed over (to the drafter's catch-up) or dropped (preemption)."""
        lag, self.draft_lag, self.draft_lag_rows = self.draft_lag, [], 0
        return lag

    @property
    def tokens_left(self) -> int:
        """Output tokens this request may still produce (its ``max_tokens`` less its output)."""
        return self.params.max_tokens - len(self.output_ids)

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
    origins: list[int]   # how each output token came (BONUS, CORRECTED, PLAIN, or k: the k-th draft)
    error: str | None = None   # with finish_reason "error": why the request could not go on

    @classmethod
    def of(cls, seq: Sequence) -> "RequestOutput":
        end = seq.finish_time or time.perf_counter()
        return cls(seq.request_id, seq.prompt_ids, seq.output_ids, seq.text, seq.finish_reason, seq.stats,
                   None if seq.first_token_time is None else seq.first_token_time - seq.arrival_time,
                   end - seq.arrival_time, seq.origins, seq.error)
