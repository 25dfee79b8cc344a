"""What runs each step, and what becomes of it: the queues, the KV blocks, admission, preemption and abort
(:meth:`Scheduler.schedule`), the shape of the drafts (:meth:`Scheduler.next_tree`, the engine's own choice
under ``auto``), and the tokens a step verified taken in (:meth:`Scheduler.postprocess`). Nothing here
touches the device: the model runner (:mod:`peagle.engine.model_runner`) does, between the two."""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from peagle.engine.auto_k import AutoK
from peagle.engine.block_manager import BlockManager
from peagle.engine.config import Bounds, EngineConfig
from peagle.engine.lookup import (LOOKUP_BATCH, LOOKUP_LEAST, LOOKUP_MOST, RESPONSE_MOST, PromptLookup,
                                  ResponseLookup, with_lookup)
from peagle.engine.batch import Verified
from peagle.engine.processors import allowed_tree
from peagle.engine.sequence import BONUS, CORRECTED, PLAIN, Sequence, SpecStats, Status
from peagle.engine.tree import Tree, ranks_of

Work = list[tuple[Sequence, int]]   # a step's sequences, each with the new tokens it feeds
MIN_LONG_CHUNK = 16                 # a long prompt's chunk while others run, at the least: it always progresses
# a long prompt alone takes steps this many times the step target: chunks of 200 ms alone cost a
# 6,000-token prefill 22-30% on a Zen 5, 4 x 200 ms 12%; a request that arrives
# meanwhile waits one such step
ALONE_STEPS = 4


@dataclass
class StepResult:
    """Sequences that produced tokens this step (``finished`` ones are done and released)."""
    updated: list[Sequence] = field(default_factory=list)
    finished: list[Sequence] = field(default_factory=list)


class Scheduler:
    def __init__(self, config: EngineConfig, bounds: Bounds, blocks: BlockManager, eos_token_ids: set[int],
                 auto: AutoK | None, responses: ResponseLookup | None = None):
        self.cfg, self.bounds, self.blocks, self.eos_token_ids, self.auto = config, bounds, blocks, eos_token_ids, auto
        self.responses = responses if bounds.k_max else None   # drafts from the target's earlier responses
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.stats = SpecStats()  # engine-wide totals, for metrics
        self.timed: int | None = None        # the rows this step verifies, where auto times it (observe)
        self.long_step_tokens = 0            # this step's prefill tokens, where a long prompt is among them
        self.prefill_token_s: float | None = None  # seconds per prefill token of the last step that did
        # the engine chooses how many of the text's drafts to verify alone (auto; ngram at K auto), or K does
        self.lookup_by_match = auto is not None or config.num_speculative_tokens == "auto"

    def add(self, seq: Sequence) -> None:
        if self.cfg.prompt_lookup_max and self.bounds.k_max:
            seq.lookup = PromptLookup(self.cfg.prompt_lookup_min, self.cfg.prompt_lookup_max)
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def abort(self, request_id: str) -> bool:
        for seq in list(self.waiting) + self.running:
            if seq.request_id == request_id:
                self._finish(seq, "abort")
                if seq in self.waiting:
                    self.waiting.remove(seq)
                else:
                    self.running.remove(seq)
                    self.blocks.release(seq)
                return True
        return False

    # ------------------------------------------------------------------ what runs
    def positions_needed(self, seq: Sequence) -> int:
        """KV positions this step may write: the verify pass plus the drafting after it."""
        return min(seq.num_tokens + len(seq.drafts) + self.bounds.k_max + 1, self.bounds.max_positions)

    def schedule(self) -> Work:
        """This step's work: ``(sequence, new tokens to feed)`` for each sequence, within
        ``max_num_batched_tokens``: decode and verify rows of running sequences first, then prompts.
        A sequence is prefilled until all its tokens but the last emitted have KV, from the end of the prefix
        the block manager kept of an earlier sequence's (prefix caching).

        With chunked prefill, prompts share the rest of the budget (:meth:`_schedule_prefills`);
        without it, a prompt is fed whole, one after another (a longer one than the budget alone)."""
        budget = self.cfg.max_num_batched_tokens
        for seq in list(self.running):  # reserve blocks first; preemption frees the newest
            while seq in self.running and not self.blocks.ensure(seq, self.positions_needed(seq)):
                self.preempt(self.running[-1])  # newest first, as vLLM does; it recomputes later
        work = []
        for seq in self.running:
            if seq.num_tokens - seq.num_cached == 1:  # decoding: the last token and its drafts, never held back
                work.append((seq, 1))
                budget -= 1 + len(seq.drafts)
        if self.cfg.enable_chunked_prefill:
            return work + self._schedule_prefills(budget, bool(work))
        for seq in self.running:
            left = seq.num_tokens - seq.num_cached
            if left > 1 and budget > 0 and (left <= budget or not work):
                work.append((seq, left))
                budget -= left
        while self.waiting and len(self.running) < self.cfg.max_num_seqs and budget > 0:
            seq = self.waiting[0]
            hit = self.blocks.lookup(seq.tokens)
            left = seq.num_tokens - len(hit) * self.blocks.block_size
            if left > budget and work:
                break
            if not self.blocks.admit(seq, self.positions_needed(seq), hit):
                break
            self._admit(seq)
            work.append((seq, left))
            budget -= left
        return work

    def _schedule_prefills(self, budget: int, decoding: bool) -> Work:
        """Fair chunked prefill: prompts already prefilling keep their turn, then waiting ones are
        admitted beside them (``max_num_partial_prefills`` at a time, ``max_long_partial_prefills`` of
        them long; a short prompt may pass a long one that must wait). A long prompt gets at most
        ``long_prefill`` tokens a step unless it has the step to itself, and no more than a step of
        ``long_prefill_step_ms`` holds (:meth:`long_share`), so a request that arrives during a long
        prefill waits for one such step at most, and the long prompt always progresses."""
        cfg, limit = self.cfg, self.cfg.long_prefill
        partial = [seq for seq in self.running if seq.num_tokens - seq.num_cached > 1]
        num_long = sum(seq.num_tokens - seq.num_cached > limit for seq in partial)
        for seq in list(self.waiting):
            if budget <= 0 or len(self.running) >= cfg.max_num_seqs or len(partial) >= cfg.max_num_partial_prefills:
                break
            hit = self.blocks.lookup(seq.tokens)   # (a prompt's kept prefix is not prefilled again)
            long = seq.num_tokens - len(hit) * self.blocks.block_size > limit
            if long and num_long >= cfg.max_long_partial_prefills:
                continue
            if not self.blocks.admit(seq, self.positions_needed(seq), hit):
                break
            self._admit(seq)
            partial.append(seq)
            num_long += long
        alone = not decoding and len(partial) == 1 and not self.waiting
        work, share, long = [], self.long_share(alone), False
        for seq in partial:
            if budget <= 0:
                break
            left = seq.num_tokens - seq.num_cached
            long |= left > limit
            work.append((seq, min(left, budget, left if left <= limit else share)))
            budget -= work[-1][1]
        self.long_step_tokens = sum(n for _, n in work) if long else 0
        return work

    def long_share(self, alone: bool) -> int:
        """A long prompt's chunk: as many tokens as the last step that prefilled a long prompt says fit
        ``long_prefill_step_ms`` (its context has grown since: the next chunk costs a little more, the
        step after corrects it), at most the token threshold while others run. Until a step is measured,
        or without a time target, vLLM's rule: the threshold beside others, the whole budget alone."""
        limit, ms = self.cfg.long_prefill, self.cfg.long_prefill_step_ms
        if ms is None or self.prefill_token_s is None:
            return self.cfg.max_num_batched_tokens if alone else limit
        fit = max(MIN_LONG_CHUNK, int(ms / 1e3 / self.prefill_token_s))
        return fit * ALONE_STEPS if alone else min(limit, fit)

    def _admit(self, seq: Sequence) -> None:
        self.waiting.remove(seq)
        seq.status = Status.RUNNING
        self.running.append(seq)

    def preempt(self, seq: Sequence) -> None:
        """Free ``seq``'s blocks and queue it first: it is recomputed from its first token."""
        # admission guarantees that a sequence alone fits: evicting the last one could never be undone
        if len(self.running) == 1:
            raise RuntimeError(f"request {seq.request_id} does not fit the KV cache alone")
        self.running.remove(seq)
        self.blocks.release(seq)
        seq.set_drafts(Tree(()), [])
        seq.drafts_from, seq.head_candidates = "", None
        seq.take_lag()
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)

    def next_tree(self, work: Work) -> Tree:
        """What this step drafts: the tree ``auto`` chooses, the explicit one, or the chain of K (ngram: none, the
        text drafts alone after the step, priced at K auto)."""
        if self.auto:
            missed = sum(seq.draft_lag_rows for seq, _ in work) if self.cfg.uses_head else 0
            tree = self.auto.choose(len(work), missed, self.prefill_token_s, max(seq.tokens_left for seq, _ in work)) \
                if self.cfg.uses_head else self.auto.tick()
            # a decode step is timed by the rows it verifies, where its drafting has no catch-up to do
            decoding = all(n == 1 for _, n in work) and not (missed and tree.depth)
            self.timed = sum(len(seq.drafts) + 1 for seq, _ in work) if decoding else None
            return tree
        if not self.cfg.uses_head:
            return Tree(())
        tree = self.bounds.token_tree
        return tree if isinstance(tree, Tree) else Tree.chain(self.bounds.k_max)

    # ------------------------------------------------------------------ what became of it
    def postprocess(self, work: Work, verified: list[Verified], tree: Tree) -> StepResult:
        """Take in what the step verified (``tree``: what it drafted): KV now valid, tokens emitted, the
        next drafts kept, the statistics counted; finished sequences retired and their blocks freed."""
        result = StepResult()
        for (seq, n), v in zip(work, verified):
            seq.num_cached += n + v.accepted      # the new tokens and the accepted drafts have KV now
            self.blocks.keep(seq)                 # its blocks now complete, for prompts that start with them
            if not v.tokens:                      # a prompt chunk before the last: nothing emitted
                continue
            per_depth = seq.tree.nodes_per_depth
            seq.stats.record(per_depth, v.accepted)
            self.stats.record(per_depth, v.accepted)
            if self.auto and (seq.drafts_from or self._proposes(seq) and not per_depth):
                # what a step without the head's drafts yielded
                self.auto.record_lookup(v.accepted, seq.drafts_from if seq.drafts_from in self.auto.gated else None)
            elif self.auto and per_depth:   # auto weighs the head's drafting by its own hits
                self.auto.record(ranks_of(v.tokens, seq.candidates if seq.head_candidates is None
                                          else seq.head_candidates))
            seq.logprobs += v.logprobs
            depth = seq.tree.depth   # the tree this step verified
            seq.origins += [*range(1, v.accepted + 1),
                            PLAIN if not depth else BONUS if v.accepted == depth else CORRECTED]
            self._append(seq, v.tokens)
            if not seq.finished:   # (a finished one's drafts were dropped)
                self._next_drafts(seq, v, tree)
            result.updated.append(seq)
        for seq, _ in work:
            if seq.finished:
                self.running.remove(seq)
                self.blocks.release(seq)
                result.finished.append(seq)
        return result

    def _next_drafts(self, seq: Sequence, v: Verified, tree: Tree) -> None:
        """What the next step verifies: ``tree`` from the head's candidates; where the text repeats, what
        followed it then in their place (the head's kept: auto weighs the head's own hits); where the drafter
        skipped this step, drafts from the text alone (:meth:`_proposal`: rows to verify, no drafter pass);
        what the grammar forbids costs no row."""
        cands, seq.head_candidates, seq.drafts_from = v.candidates, None, ""
        if seq.lookup is not None and cands:
            cands = with_lookup(cands, seq.lookup.propose(seq.tokens, len(cands)))
            seq.head_candidates = v.candidates if cands != v.candidates else None
        seq.set_drafts(tree.cut(self._num_drafts(seq, tree.depth)), cands)
        if not tree.depth and self._proposes(seq):
            proposal, kind = self._proposal(seq)
            k = self._num_drafts(seq, len(proposal))
            if kind == "match" and k <= LOOKUP_LEAST:   # a long match cut by the request's end is a short one
                kind = "short"
            # ngram alone verifies every proposal (a lone sequence's rows wait on memory: priced there it lost ~1%);
            # the defaults' gate, and ngram's beside other sequences, price them
            free = kind == "match" or not self.cfg.uses_head and len(self.running) <= LOOKUP_BATCH
            if k and (free or not self.auto or self.auto.lookup_pays(k, len(self.running), kind)):
                seq.set_drafts(Tree.chain(k), [[t] for t in proposal])
                seq.drafts_from = kind
        if seq.matcher is not None and seq.drafts:
            seq.set_drafts(allowed_tree(seq), seq.candidates)

    def _proposes(self, seq: Sequence) -> bool:
        """Whether anything but the head drafts for ``seq``: its text (prompt lookup) or the response table."""
        return seq.lookup is not None or self.responses is not None

    def _proposal(self, seq: Sequence) -> tuple[list[int], str]:
        """Drafts verified alone where the drafter skipped a step, and where they came from: the text's own
        (``match``; under ``auto`` by its match, verified only while they pay where short), else where the text
        proposes nothing, the target's earlier responses' (``responses``, verified only while they pay)."""
        if seq.lookup is not None:
            chosen = self.lookup_by_match
            most = LOOKUP_MOST if len(self.running) <= LOOKUP_BATCH else LOOKUP_LEAST
            proposal = seq.lookup.propose(seq.tokens, min(most, self.bounds.k_max) if chosen else self.bounds.k_max,
                                          by_match=chosen)
            if proposal:
                return proposal, "match"
        if self.responses is not None:
            return self.responses.propose(seq.tokens, min(RESPONSE_MOST, self.bounds.k_max)), "responses"
        return [], "match"

    def observe(self, work: Work, tree: Tree, seconds: float) -> None:
        """The step's time: per prefill token where it fed a long prompt (:meth:`long_share`), and where a
        decode step verified its rows (the head's drafts or the ones verified alone) and drafted ``tree`` without
        a catch-up (what a step costs by), ``auto`` corrects its model with it."""
        if self.long_step_tokens:  # the step's time over its prefill tokens (the other rows' cost included)
            self.prefill_token_s = seconds / self.long_step_tokens
        if self.auto and self.timed is not None:
            self.auto.observe(self.timed, tree, len(work), seconds)

    def _num_drafts(self, seq: Sequence, k: int) -> int:
        """K, less where the request is about to hit max_tokens or max_model_len; 0 where it asked for none."""
        if not seq.params.speculative:
            return 0
        left = seq.tokens_left
        return max(0, min(k, left - 1, self.bounds.max_model_len - seq.num_tokens))

    def _append(self, seq: Sequence, tokens: list[int]) -> None:
        p = seq.params
        for t in tokens:
            if seq.matcher is not None and not seq.matcher.accept(t):   # every token was chosen under its mask,
                if not seq.matcher.dead_end:                            # unless the mask allowed nothing
                    raise RuntimeError(f"token {t} is not allowed by the request's grammar")
                seq.error = (f"the {seq.params.structured.kind.replace('_', ' ')} allows no token this model's "
                             f"tokenizer can write after the output's {len(seq.output_ids)} tokens")
                return self._finish(seq, "error")   # this request alone: the others in the step go on
            seq.tokens.append(t)
            if seq.first_token_time is None:
                seq.first_token_time = time.perf_counter()
            if not p.ignore_eos and t in self.eos_token_ids or seq.matcher is not None and seq.matcher.terminated:
                return self._finish(seq, "stop")
            cut = None
            if seq.detok is not None:
                cut = seq.detok.push(t)
                seq.text_ends.append(len(seq.detok.text))
            if cut is not None and len(seq.output_ids) > p.min_tokens:   # (vLLM's rule: none up to min_tokens)
                return self._finish(seq, "stop", cut)
            if len(seq.output_ids) >= p.max_tokens or seq.num_tokens >= self.bounds.max_model_len:
                return self._finish(seq, "length")

    def _finish(self, seq: Sequence, reason: str, text: str | None = None) -> None:
        """``text``: the output cut before a stop string; else all the detokenized output."""
        seq.status = Status.FINISHED
        seq.finish_reason = reason
        seq.finish_time = time.perf_counter()
        seq.set_drafts(Tree(()), [])
        seq.text = text if text is not None else seq.detok.text if seq.detok is not None else ""
        del seq.logprobs[len(seq.output_ids):]  # tokens of the last step after a stop are not emitted
        del seq.origins[len(seq.output_ids):]
