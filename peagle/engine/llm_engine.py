"""The engine: continuous batching over a paged KV cache, with speculative decoding.

One ``step()`` is one target pass over every running sequence (prompts being prefilled and drafts
being verified, mixed in one flat batch), verification, then one drafting phase:

* ``parallel`` (P-EAGLE): one drafter pass over [accepted tokens, bonus, K-1 mask slots] yields K drafts,
  or the top candidates of each position, of which a token tree is verified next (:mod:`peagle.engine.tree`);
* ``eagle3``: the same head run K times, feeding its own pre-norm hidden state back;
* ``none``: the target alone.
"""
from __future__ import annotations

import time
from collections import deque
from itertools import accumulate
from dataclasses import dataclass, field
from typing import Iterable

import torch
import torch.nn.functional as F

from peagle.engine.auto_k import AutoK, CostCurve
from peagle.engine.block_manager import BlockManager
from peagle.engine.expansion import expand
from peagle.engine.graphs import StepGraphs, bucket
from peagle.engine.detokenizer import Detokenizer
from peagle.engine.sampling import SamplingError, SamplingParams, greedy, logprobs_of, sample_tokens
from peagle.engine.sequence import RequestOutput, Sequence, SpecStats, Status
from peagle.engine.tree import MAX_NODES, Tree, TreeBatch, accept_paths
from peagle.models.attention import AttnMeta, Span, TreeRows
from peagle.models.drafter import Drafter
from peagle.models.layers import pack_for_inference, weight_dtype
from peagle.models.llama import LlamaModel
from peagle.models.quant import formats
from peagle.runtime import configure_cpu, native_cpu, precision_name, to_device

METHODS = ("parallel", "eagle3", "none")
AUTO_RANKS = 8   # candidates a position the engine weighs for a tree of its own choosing


class RequestError(ValueError):
    """A request the engine cannot take (empty prompt, too long, bad parameters)."""


@dataclass
class EngineConfig:
    method: str = "parallel"
    num_speculative_tokens: int | str = 7   # or "auto": chosen each step up to max_speculative_tokens
    max_speculative_tokens: int | None = None  # K_max for "auto" (default: the head's trained K, else 10)
    # what the drafts form (vLLM's key): "chain" (one candidate a position), "auto" (the engine chooses a
    # tree of at most speculative_tree_budget nodes each step, P-EAGLE only), or an explicit tree drafted
    # every step, vLLM's list of rank paths such as "[(0,), (1,), (0, 0)]" (its depth at most K)
    speculative_token_tree: str = "chain"
    speculative_tree_budget: int = 16
    max_num_seqs: int = 8
    max_model_len: int | None = None        # default: the target's max_position_embeddings, capped at 8192
    max_num_batched_tokens: int = 2048      # tokens per step: decode and verify rows first, then prefill chunks
    enable_chunked_prefill: bool = True     # off: a prompt is prefilled whole (a longer one runs alone)
    # fair prefill (vLLM's names; with chunked prefill): a prompt with more tokens left to prefill than
    # the threshold is long and gets at most that many a step while anything else runs (None or 0, as
    # vLLM: an eighth of max_num_batched_tokens, BENCHMARKS.md §13); prompts prefill side by side, this many
    # at most, of them this many long ones
    long_prefill_token_threshold: int | None = None
    max_num_partial_prefills: int = 8
    max_long_partial_prefills: int = 1
    block_size: int = 16
    kv_cache_tokens: int | None = None      # default: max_num_seqs full sequences, capped at 16384
    enforce_eager: bool = False             # CUDA: no CUDA graphs for decode steps (vLLM's flag; CPUs never capture)

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"unknown method {self.method!r}; choose one of {', '.join(METHODS)}")
        k = self.num_speculative_tokens
        if k != "auto" and (not isinstance(k, int) or isinstance(k, bool) or (k <= 0 and self.method != "none")):
            raise ValueError(f"the number of speculative tokens K must be an integer >= 1 or 'auto', got {k!r}")
        tree = self.token_tree   # parsed: a bad tree is refused here
        if tree != "chain" and self.method != "parallel":
            raise ValueError(f"speculative_token_tree {self.speculative_token_tree!r} needs parallel drafting "
                             f"(P-EAGLE): a {self.method} draft is one token a position")
        if isinstance(tree, Tree) and isinstance(k, int) and tree.depth > k:
            raise ValueError(f"the token tree is {tree.depth} deep, more than num_speculative_tokens={k}")
        if not 1 <= self.speculative_tree_budget <= MAX_NODES - 2:
            raise ValueError(f"speculative_tree_budget must be in 1..{MAX_NODES - 2}, got {self.speculative_tree_budget}")
        m = self.max_speculative_tokens
        if m is not None and (not isinstance(m, int) or m < 1):
            raise ValueError(f"max_speculative_tokens must be an integer >= 1, got {m!r}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "max_num_partial_prefills",
                     "max_long_partial_prefills"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.max_long_partial_prefills > self.max_num_partial_prefills:
            raise ValueError(f"max_long_partial_prefills ({self.max_long_partial_prefills}) must not exceed "
                             f"max_num_partial_prefills ({self.max_num_partial_prefills})")
        t = self.long_prefill_token_threshold
        if t is not None and not 0 <= t <= self.max_num_batched_tokens:
            raise ValueError(f"long_prefill_token_threshold must be in 0..max_num_batched_tokens "
                             f"({self.max_num_batched_tokens}; 0: the default), got {t}")

    @property
    def token_tree(self) -> str | Tree:
        """``chain``, ``auto`` or the explicit :class:`Tree`."""
        t = self.speculative_token_tree
        return t if t in ("chain", "auto") else Tree.parse(t)

    @property
    def auto(self) -> bool:
        """The engine chooses the drafts' shape each step (K, or the whole tree)."""
        return self.method != "none" and (self.speculative_token_tree == "auto" or (
            self.num_speculative_tokens == "auto" and self.speculative_token_tree == "chain"))

    @property
    def long_prefill(self) -> int:
        """The long-prompt threshold in force."""
        return self.long_prefill_token_threshold or max(1, self.max_num_batched_tokens // 8)


@dataclass
class StepResult:
    """Sequences that produced tokens this step (``finished`` ones are done and released)."""
    updated: list[Sequence] = field(default_factory=list)
    finished: list[Sequence] = field(default_factory=list)


class LLMEngine:
    def __init__(self, target: LlamaModel, drafter: Drafter | None, config: EngineConfig, tokenizer=None,
                 eos_token_ids: Iterable[int] | None = None):
        self.target, self.drafter, self.cfg, self.tokenizer = target, drafter, config, tokenizer
        self.device, self.dtype, self.weight_dtype = target.lm_weight.device, target.dtype, target.weight_dtype
        if self.device.type == "cpu":
            configure_cpu()
        target.pack_for_inference()
        if drafter is not None:
            pack_for_inference(drafter)
        if config.method != "none":
            if drafter is None:
                raise ValueError(f"method {config.method!r} needs a drafter")
            drafter.cfg.check_target(target.cfg, target.aux_layers)
            mine = (drafter.lm_head.weight.device, weight_dtype(drafter), drafter.embed_tokens.weight.dtype)
            if mine != (self.device, self.weight_dtype, self.dtype):
                raise ValueError(f"the drafter is {precision_name(*mine[1:])} on {mine[0]}, the target "
                                 f"{precision_name(self.weight_dtype, self.dtype)} on {self.device}: "
                                 "load both with the same dtype and device")
        tk = drafter.cfg.trained_k if drafter is not None else None
        # the most positions a step drafts (K, K_max when the engine chooses, an explicit tree's depth), the
        # candidates of each it keeps (ranks) and the most nodes a step verifies per sequence
        tree = self.token_tree = config.token_tree if config.method != "none" else "chain"
        k = config.num_speculative_tokens
        self.k_max = (0 if config.method == "none" else tree.depth if isinstance(tree, Tree)
                      else (config.max_speculative_tokens or tk or 10) if k == "auto" else k)
        if config.method == "parallel" and tk is not None and self.k_max > tk:
            raise ValueError(f"K={self.k_max} exceeds the K={tk} this head was trained for")
        self.ranks = tree.ranks if isinstance(tree, Tree) else AUTO_RANKS if tree == "auto" else 1
        self.max_nodes = (len(tree) if isinstance(tree, Tree) else config.speculative_tree_budget + 2 if tree == "auto"
                          else self.k_max)   # (+2: auto's probes)
        tmax = target.cfg.max_position_embeddings
        self.max_model_len = config.max_model_len or min(tmax, 8192)
        if self.max_model_len > tmax:
            raise ValueError(f"max_model_len {self.max_model_len} exceeds the target's {tmax} positions")
        # a sequence at max_model_len still verifies its nodes and drafts K tokens past it
        self.max_positions = self.max_model_len + max(self.k_max, self.max_nodes) + 1
        slots = config.kv_cache_tokens or max(min(config.max_num_seqs * self.max_positions, 16384), self.max_positions)
        self.blocks = BlockManager(-(-slots // config.block_size), config.block_size)
        self.pad_block = self.blocks.num_blocks  # one more block, never handed out: padding sequences write there
        num_slots = (self.blocks.num_blocks + 1) * config.block_size
        self.target_caches = target.make_caches(num_slots)
        self.drafter_caches = drafter.make_caches(num_slots) if config.method != "none" else []
        use_graphs = self.device.type == "cuda" and not config.enforce_eager and target.graph_safe
        self.graphs = self.make_graphs(capture=True) if use_graphs else None
        eos = set(eos_token_ids or []) | set(target.cfg.eos_token_ids)
        if tokenizer is not None and tokenizer.eos_token_id is not None:
            eos.add(tokenizer.eos_token_id)
        self.eos_token_ids = eos
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.stats = SpecStats()  # engine-wide totals, for metrics
        self.auto = AutoK(self.k_max, config.method == "parallel", *self._measure_costs(), ranks=self.ranks, warmup=3,
                          budget=config.speculative_tree_budget if tree == "auto" else None) if config.auto else None
        self._last_tree: Tree | None = None   # the tree of the drafts the next step verifies

    def make_graphs(self, capture: bool) -> StepGraphs:
        """The padded decode passes (:mod:`peagle.engine.graphs`); ``capture=False`` runs them eagerly
        (the CPU tests of the layout)."""
        return StepGraphs(self.target, self.drafter if self.cfg.method != "none" else None, self.target_caches,
                          self.drafter_caches, self.cfg.block_size, capture)

    @torch.inference_mode()
    def _measure_costs(self) -> tuple[CostCurve, CostCurve]:
        """The target's pass (logits of every row) and the drafter's pass (its LM head too) over
        1, 2, 4, ... rows at a 128-token context, timed on the empty KV pool's first blocks (median
        of 3 after a warm-up): what :class:`AutoK` weighs K by."""
        bs, dev = self.cfg.block_size, self.device
        most = min(self.cfg.max_num_seqs * (max(self.k_max, self.max_nodes) + 1) * 2, 512, self.blocks.num_blocks * bs // 2)
        rows = sorted({r for r in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512) if r < most} | {max(most, 2)})
        ctx = min(128, self.blocks.num_blocks * bs - rows[-1])
        d = self.drafter

        def timed(n: int, drafter: bool) -> float:
            ids, pos = torch.zeros(n, dtype=torch.long, device=dev), torch.arange(ctx, ctx + n, device=dev)
            meta = AttnMeta([Span(n, ctx + n, list(range(-(-(ctx + n) // bs))), ctx)], bs)
            if drafter:
                hidden = torch.zeros(n, d.cfg.hidden_size, dtype=self.dtype, device=dev)
                run = lambda: greedy(d.logits(d(ids, hidden, pos, self.drafter_caches, meta)[0]))  # noqa: E731
            else:
                run = lambda: greedy(self.target(ids, pos, self.target_caches, meta, pos - ctx)[0])  # noqa: E731
            times = []
            for _ in range(4):
                t0 = time.perf_counter()
                run()
                if dev.type == "cuda":
                    torch.cuda.synchronize(dev)
                times.append(time.perf_counter() - t0)
            return sorted(times[1:])[1]

        return (CostCurve(rows, [timed(n, False) for n in rows]), CostCurve(rows, [timed(n, True) for n in rows]))

    @property
    def kernels(self) -> str:
        """The linear layers' kernels: ``avx512``/``avx2``/``scalar`` (peagle's CPU kernels), ``torch``."""
        from peagle import kernels

        return kernels.isa() if native_cpu(self.device) else "torch"

    @property
    def quantization(self) -> str:
        """``gguf`` where the target's weights run GGUF-quantized (:mod:`peagle.models.quant`), else ``none``."""
        return "gguf" if formats(self.target) else "none"

    @property
    def precision(self) -> str:
        """What runs, as the CLI and the server's start line say it, e.g. ``float16 weights, float32 compute``
        or ``GGUF Q4_1/Q8_0 weights, float32 compute``."""
        return self.target.precision

    @classmethod
    def from_pretrained(cls, target: str | None = None, drafter: str | None = None, method: str = "parallel",
                        k: int = 7, dtype: str | torch.dtype = "auto", device: str | torch.device = "auto",
                        quantization: str | None = None, compute: str = "fast", **engine_kwargs) -> "LLMEngine":
        """Load a target (HF folder, GGUF, hub id; None = the default model), its tokenizer and a head,
        on ``device``, the weights in ``dtype`` (see :mod:`peagle.runtime`: ``auto`` is CUDA when present,
        bf16 there, bf16 weights with float32 arithmetic on the CPU), a GGUF target's quantized matrices
        kept as they ship unless ``quantization`` is ``none``, run through integer dot products unless ``compute``
        is ``exact`` (:func:`peagle.models.loader.load_target`)."""
        from peagle.models.loader import load_drafter_for, load_target, load_tokenizer

        config = EngineConfig(method=method, num_speculative_tokens=k, **engine_kwargs)
        model, path = load_target(target, dtype, device=device, quantization=quantization, compute=compute)
        tokenizer = load_tokenizer(path)
        head = load_drafter_for(model, path, drafter, tokenizer, method) if method != "none" else None
        return cls(model, head, config, tokenizer)

    def encode_prompt(self, prompt: str | list[dict], chat: bool = True) -> list[int]:
        """Token ids of ``prompt`` (a user message, or a list of chat messages), wrapped in the chat
        template when ``chat`` (and the model has one)."""
        from peagle.prompts import encode

        msgs = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        return encode(self.tokenizer, msgs, chat)

    # ------------------------------------------------------------------ requests
    def add_request(self, prompt_ids: list[int], params: SamplingParams | None = None,
                    request_id: str | None = None) -> Sequence:
        params = params or SamplingParams()
        if not prompt_ids:
            raise RequestError("the prompt is empty")
        if len(prompt_ids) >= self.max_model_len:
            raise RequestError(f"the prompt has {len(prompt_ids)} tokens; max_model_len is {self.max_model_len} "
                               "and at least one token must be generated")
        vocab = self.target.cfg.vocab_size
        if min(prompt_ids) < 0 or max(prompt_ids) >= vocab:
            raise RequestError(f"prompt token ids must be in 0..{vocab - 1}")
        # the most KV positions it can need (see _positions_needed); admitted, it always fits alone
        need = min(len(prompt_ids) + params.max_tokens + max(self.k_max, self.max_nodes), self.max_positions)
        if -(-need // self.cfg.block_size) > self.blocks.num_blocks:
            raise RequestError(f"the prompt ({len(prompt_ids)} tokens) with max_tokens {params.max_tokens} needs "
                               f"{need} KV positions, more than the {self.blocks.num_blocks * self.cfg.block_size} "
                               "the KV cache holds")
        seq = Sequence(prompt_ids, params, request_id)
        seq.detok = Detokenizer(self.tokenizer, params.stop) if self.tokenizer is not None else None
        self.waiting.append(seq)
        return seq

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

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # ------------------------------------------------------------------ scheduling
    def _positions_needed(self, seq: Sequence) -> int:
        """KV positions this step may write: the verify pass plus the drafting after it."""
        return min(seq.num_tokens + len(seq.drafts) + self.k_max + 1, self.max_positions)

    def _schedule(self) -> list[tuple[Sequence, int]]:
        """This step's work: ``(sequence, new tokens to feed)`` for each sequence, within
        ``max_num_batched_tokens``: decode and verify rows of running sequences first, then prompts.
        A sequence is prefilled until all its tokens but the last emitted have KV.

        With chunked prefill, prompts share the rest of the budget (:meth:`_schedule_prefills`);
        without it, a prompt is fed whole, one after another (a longer one than the budget alone)."""
        budget = self.cfg.max_num_batched_tokens
        for seq in list(self.running):  # reserve blocks first; preemption frees the newest
            while seq in self.running and not self.blocks.ensure(seq, self._positions_needed(seq)):
                self._preempt(self.running[-1])  # newest first, as vLLM does; it recomputes later
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
            if seq.num_tokens > budget and work:
                break
            if not self.blocks.ensure(seq, self._positions_needed(seq)):
                break
            self._admit(seq)
            work.append((seq, seq.num_tokens))
            budget -= seq.num_tokens
        return work

    def _schedule_prefills(self, budget: int, decoding: bool) -> list[tuple[Sequence, int]]:
        """Fair chunked prefill: prompts already prefilling keep their turn, then waiting ones are
        admitted beside them (``max_num_partial_prefills`` at a time, ``max_long_partial_prefills`` of
        them long; a short prompt may pass a long one that must wait). A long prompt gets at most
        ``long_prefill`` tokens a step unless it has the step to itself, so a request that arrives
        during a long prefill waits for one chunk at most, and the long prompt always progresses."""
        cfg, limit = self.cfg, self.cfg.long_prefill
        partial = [seq for seq in self.running if seq.num_tokens - seq.num_cached > 1]
        num_long = sum(seq.num_tokens - seq.num_cached > limit for seq in partial)
        for seq in list(self.waiting):
            if budget <= 0 or len(self.running) >= cfg.max_num_seqs or len(partial) >= cfg.max_num_partial_prefills:
                break
            long = seq.num_tokens - seq.num_cached > limit
            if long and num_long >= cfg.max_long_partial_prefills:
                continue
            if not self.blocks.ensure(seq, self._positions_needed(seq)):
                break
            self._admit(seq)
            partial.append(seq)
            num_long += long
        alone = not decoding and len(partial) == 1 and not self.waiting
        work = []
        for seq in partial:
            if budget <= 0:
                break
            left = seq.num_tokens - seq.num_cached
            work.append((seq, min(left, budget, left if alone else limit)))
            budget -= work[-1][1]
        return work

    def _admit(self, seq: Sequence) -> None:
        self.waiting.remove(seq)
        seq.status = Status.RUNNING
        self.running.append(seq)

    def _preempt(self, seq: Sequence) -> None:
        # admission guarantees that a sequence alone fits: evicting the last one could never be undone
        if len(self.running) == 1:
            raise RuntimeError(f"request {seq.request_id} does not fit the KV cache alone")
        self.running.remove(seq)
        self.blocks.release(seq)
        seq.set_drafts(Tree(()), [])   # recomputed from its first token
        seq.draft_lag = []
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)

    # ------------------------------------------------------------------ one step
    @torch.inference_mode()
    def step(self) -> StepResult:
        """One target pass, verification and drafting, all on the model's device; one host sync
        at the end reads every sequence's accepted count, emitted token, accepted path and next drafts."""
        t0 = time.perf_counter()
        work = self._schedule()
        result = StepResult()
        if not work:
            return result
        batch = [seq for seq, _ in work]
        trees = [seq.tree for seq in batch]
        branched = [not t.is_chain for t in trees]   # sequences verifying a tree (not a chain): rows remapped
        # a decode step runs the padded layout under CUDA graphs: every sequence feeds `width` rows
        # (filler rows after its drafts), padding sequences fill the batch to a bucket
        padded = (self.graphs is not None and all(n == 1 for _, n in work) and not any(s.draft_lag for s in batch)
                  and not any(branched))
        kmax = max(len(seq.drafts) for seq in batch)
        width = kmax + 1 if padded else 0
        num_pad = bucket(len(batch), self.cfg.max_num_seqs) - len(batch) if padded else 0  # padding sequences
        # 1. one target pass: prompts (or chunks of them), and [last token, drafts...] of decoding sequences;
        # a tree's node i sits at position start + its depth and keeps its KV at index start + i
        ids, positions, spans, verify_rows, partial, tree_rows = [], [], [], [], [], []
        for (seq, n), tree, b in zip(work, trees, branched):
            start = seq.num_cached
            inp = seq.tokens[start:start + n] + seq.drafts   # drafts only when decoding
            inp += [0] * (width - len(inp))                  # filler rows: verified by no one, rejected
            ids += inp
            positions += [start + d for d in tree.depths] if b else range(start, start + len(inp))
            spans.append(Span(len(inp), start + len(inp), seq.block_table, None if b else start))
            verify_rows.append(len(seq.drafts) + 1)
            partial.append(start + n < seq.num_tokens)       # a prompt chunk before the last: nothing emitted
            tree_rows.append((start, tree.lineage) if b else None)
        dev = self.device
        tables = None
        if padded:
            ids += [0] * (num_pad * width)
            positions += [0] * (num_pad * width)
            spans += [Span(width, 1, [self.pad_block], 0)] * num_pad
            nb = bucket(max(len(s.block_table) for s in spans), -(-self.max_positions // self.cfg.block_size))
            tables = to_device([s.block_table + [self.pad_block] * (nb - len(s.block_table)) for s in spans], dev)
        ids_t, pos_t = to_device(ids, dev), to_device(positions, dev)
        cu = list(accumulate((s.num_rows for s in spans), initial=0))     # each sequence's first input row
        # the verified rows: each sequence's last new token and its drafts
        logit_rows = to_device([c + n - 1 + j for c, (_, n), v in zip(cu, work, verify_rows) for j in range(v)], dev)
        meta = None
        if padded:
            logits, taps = self.graphs.target(ids_t, pos_t, tables)
            logits = logits[logit_rows]
        else:
            meta = AttnMeta(spans, self.cfg.block_size, tree=self._tree_rows(tree_rows, spans, positions) if any(branched) else None)
            logits, taps = self.target(ids_t, pos_t, self.target_caches, meta, logit_rows)

        # 2. verify on the device: the target's token y at every node (argmax, or sampled keyed by position)
        first = list(accumulate(verify_rows, initial=0))                   # each sequence's first logit row
        y, finite_rows = greedy(logits)
        for i, seq in enumerate(batch):
            if not seq.params.greedy and not partial[i]:
                out_pos = len(seq.output_ids)
                y[first[i]:first[i + 1]] = sample_tokens(logits[first[i]:first[i + 1]], seq.params, seq.seed,
                                                         [out_pos + d for d in trees[i].depths])
        tb = TreeBatch.of(trees, [seq.drafts for seq in batch], first[:-1], dev)
        accepted, tokens, path = accept_paths(y[tb.rows], tb)
        if any(partial):  # the drafter reads the prompt's next token where a chunk stops short
            nxt = [seq.tokens[seq.num_cached + n] if p else 0 for (seq, n), p in zip(work, partial)]
            tokens = torch.where(to_device(partial, dev, torch.bool), to_device(nxt, dev), tokens)
        ids_v, pos_v, taps_v, spans_v, cu_v = ids_t, pos_t, taps, spans, cu   # the rows as the drafter reads them
        if any(branched):  # the accepted paths' KV where a chain's would be; the drafter reads the paths
            self._keep_paths(work, branched, trees, path, meta)
            ids_v, pos_v, taps_v, spans_v, cu_v = self._path_rows(work, branched, trees, path, ids_t, pos_t, taps,
                                                                  spans, cu)

        # 3. propose the next drafts, then the one host sync
        finite = finite_rows[tb.rows].all(1)   # a NaN or inf in any verified row
        out = [finite[:, None].long(), accepted[:, None], tokens[:, None], path]
        tree = self._next_tree(batch)
        k = tree.depth
        if k:  # rows whose KV stays valid: the new tokens and the accepted drafts
            num_valid = to_device([n for _, n in work], dev) + accepted
            bonus = tokens
            if num_pad:  # padding sequences keep one row and read token 0
                num_valid, bonus = F.pad(num_valid, (0, num_pad), value=1), F.pad(tokens, (0, num_pad))
            drafter_in = (spans_v, ids_v, pos_v, cu_v, num_valid, taps_v)
            if any(seq.draft_lag for seq in batch):
                drafter_in = self._with_lag(batch, *drafter_in)
            out.append(self._propose(*drafter_in, bonus, k, tables)[:len(batch)].flatten(1))
        packed = torch.cat(out, dim=1).tolist()
        if not all(row[0] for row in packed):  # before any state changes: the caller fails these requests
            raise SamplingError("the model produced non-finite logits")

        # 4. on the host: emit tokens, keep the drafts, retire finished sequences
        depth1 = path.shape[1]
        for i, ((seq, n), row) in enumerate(zip(work, packed)):
            a, token, nodes, cands = row[1], row[2], row[3:3 + depth1], row[3 + depth1:]
            seq.num_cached += n + a      # the new tokens and the accepted drafts have KV now
            if self.k_max and not k:     # the drafter skipped these rows: keep what it will read
                rows = slice(cu_v[i], cu_v[i] + n + a)   # (taps may be a graph's output: copied)
                seq.draft_lag.append((ids_v[rows], pos_v[rows], taps_v[rows].clone()))
            if partial[i]:
                continue
            verified, vtree = seq.drafts, trees[i]
            kept = [verified[j - 1] for j in nodes[1:a + 1]]
            ranks = [vtree.paths[j - 1][-1] for j in nodes[1:a + 1]]
            if a < len(seq.candidates):   # where the path stopped: the rank of the target's token, if drafted
                ranks.append(seq.candidates[a].index(token) if token in seq.candidates[a] else None)
            per_depth = vtree.nodes_per_depth
            seq.stats.record(per_depth, a)
            self.stats.record(per_depth, a)
            if self.auto and per_depth:
                self.auto.record(ranks)
            if seq.params.logprobs is not None:  # the target's, at each emitted position (a sync when asked)
                seq.logprobs += logprobs_of(logits[[first[i] + j for j in nodes[:a + 1]]], kept + [token],
                                            seq.params.logprobs)
            self._append(seq, kept + [token])
            if not seq.finished:   # (a finished one's drafts were dropped)
                r = self.ranks
                seq.set_drafts(tree.cut(self._num_drafts(seq, k)), [cands[d * r:(d + 1) * r] for d in range(k)])
            result.updated.append(seq)
        for seq in batch:
            if seq.finished:
                self.running.remove(seq)
                self.blocks.release(seq)
                result.finished.append(seq)
        # a steady decode step: it verified a tree of the size and depth it drafted (what a step costs by),
        # so `auto` corrects its model with it (trees change shape from step to step; their sizes repeat)
        last = self._last_tree
        if self.auto and last is not None and (len(tree), tree.depth) == (len(last), last.depth) \
                and all(n == 1 for _, n in work):
            self.auto.observe(tree, len(batch), time.perf_counter() - t0)
        self._last_tree = tree
        return result

    def _next_tree(self, batch: list[Sequence]) -> Tree:
        """What this step drafts: the tree ``auto`` chooses, the explicit one, or the chain of K."""
        if self.auto:
            return self.auto.choose(len(batch), sum(s.draft_lag_rows for s in batch))
        return self.token_tree if isinstance(self.token_tree, Tree) else Tree.chain(self.k_max)

    def _tree_rows(self, tree_rows: list, spans: list[Span], positions: list[int]) -> TreeRows:
        """Where the rows of the trees in this pass write and read their KV (:class:`TreeRows`): node i of a
        tree at ``start`` writes index ``start + i`` and reads its ancestors there, the root in place; other
        rows as usual."""
        kv, base, maps = [], [], []
        width = max(len(t[1][-1]) - 1 for t in tree_rows if t is not None)   # the deepest node's depth
        first = 0
        for span, t in zip(spans, tree_rows):
            if t is None:
                for p in positions[first:first + span.num_rows]:
                    kv.append(p), base.append(p + 1), maps.append([0] * width)
            else:
                start, lineage = t
                for i, line in enumerate(lineage):
                    kv.append(start + i), base.append(start + 1)
                    maps.append([start + j for j in line[1:]] + [start] * (width + 1 - len(line)))
            first += span.num_rows
        dev = self.device
        return TreeRows(to_device(kv, dev), to_device(base, dev), to_device(maps, dev))

    def _keep_paths(self, work: list, branched: list[bool], trees: list[Tree], path: torch.Tensor,
                    meta: AttnMeta) -> None:
        """Copy the target KV of each tree's accepted path (index start + node) to index start + depth,
        where the next steps read it as a chain's (past the path's end: dead slots, overwritten later)."""
        dev = self.device
        pairs = [(i, seq.num_cached, j) for i, ((seq, _), b, t) in enumerate(zip(work, branched, trees)) if b
                 for j in range(1, t.depth + 1)]
        seq_i, start, depth = (to_device(list(x), dev) for x in zip(*pairs))
        src, dst = meta.slots(seq_i, start + path[seq_i, depth]), meta.slots(seq_i, start + depth)
        if native_cpu(dev):   # one call for every layer (0.18 ms of torch ops a step on the default model)
            torch.ops.peagle.move_rows([c.k for c in self.target_caches] + [c.v for c in self.target_caches], src, dst)
            return
        for c in self.target_caches:
            c.k.index_copy_(0, dst, c.k.index_select(0, src))
            c.v.index_copy_(0, dst, c.v.index_select(0, src))

    def _path_rows(self, work: list, branched: list[bool], trees: list[Tree], path: torch.Tensor, ids: torch.Tensor,
                   positions: torch.Tensor, taps: torch.Tensor, spans: list[Span], cu: list[int]) -> tuple:
        """The target pass's rows as the drafter reads them: a tree's root and the nodes of its accepted path
        by depth (then, past the path's end, rows the expansion marks rejected), other sequences' rows as
        they are."""
        T, depth1 = ids.shape[0], path.shape[1]
        on_path = torch.cat([torch.arange(T, device=self.device), (to_device(cu[:-1], self.device)[:, None] + path).flatten()])
        index, new_spans = [], []
        for i, ((seq, _), b, t, s) in enumerate(zip(work, branched, trees, spans)):
            if b:
                index += range(T + i * depth1, T + i * depth1 + t.depth + 1)
                new_spans.append(Span(t.depth + 1, seq.num_cached + t.depth + 1, s.block_table, seq.num_cached))
            else:
                index += range(cu[i], cu[i + 1])
                new_spans.append(s)
        rows = on_path[to_device(index, self.device)]
        return (ids[rows], positions[rows], taps[rows], new_spans,
                list(accumulate((s.num_rows for s in new_spans), initial=0)))

    def _with_lag(self, batch: list[Sequence], spans: list[Span], ids: torch.Tensor, positions: torch.Tensor,
                  cu: list[int], num_valid: torch.Tensor, taps: torch.Tensor) -> tuple:
        """The drafter's inputs with each sequence's lagging rows (steps at K = 0) before its rows of
        this pass: they are kept rows at the positions just before, so the expansion reads them as
        one longer prefix and the drafter's KV has no holes. Rare (drafting resumes), so per sequence."""
        parts, lags = [], []
        for i, seq in enumerate(batch):
            rows = slice(cu[i], cu[i + 1])
            lag = seq.draft_lag + [(ids[rows], positions[rows], taps[rows])]
            parts.append([torch.cat(x) for x in zip(*lag)])
            lags.append(seq.draft_lag_rows)
            seq.draft_lag = []
        spans = [Span(s.num_rows + n, s.ctx_len, s.block_table) for s, n in zip(spans, lags)]
        ids, positions, taps = (torch.cat(x) for x in zip(*parts))
        return (spans, ids, positions, list(accumulate((s.num_rows for s in spans), initial=0)),
                num_valid + to_device(lags, self.device), taps)

    def _num_drafts(self, seq: Sequence, k: int) -> int:
        """K, less where the request is about to hit max_tokens or max_model_len."""
        left = seq.params.max_tokens - len(seq.output_ids)
        return max(0, min(k, left - 1, self.max_model_len - seq.num_tokens))

    def _propose(self, spans: list[Span], ids: torch.Tensor, positions: torch.Tensor, cu: list[int],
                 num_valid: torch.Tensor, taps: torch.Tensor, bonus: torch.Tensor, k: int,
                 tables: torch.Tensor | None = None) -> torch.Tensor:
        """``k`` drafts ``[B, k, ranks]`` (the top ``ranks`` candidates of each position, best first: one
        for a chain) for each sequence of the target pass (``spans``; ``cu`` its row
        offsets; ``num_valid`` rows kept, ``taps`` the target's aux hidden states, ``bonus`` the
        emitted token): the verified batch is expanded as vLLM does (:mod:`peagle.engine.expansion`),
        one drafter pass reads the drafts at the bonus and mask rows, and EAGLE-3 then continues one
        token at a time, feeding back the head's own pre-norm hidden state. With ``tables`` (the
        padded block tables of a decode step) the drafter's passes are the graphed ones."""
        d, dev = self.drafter, self.device
        parallel = self.cfg.method == "parallel"
        num_masks = k - 1 if parallel else 0
        b = expand(ids, positions, to_device(cu, dev), num_valid, bonus, num_masks, d.cfg.mask_token_id)
        hidden = d.project(taps)[b.hidden_map.clamp(min=0)]
        if num_masks:
            hidden = torch.where(b.is_masked[:, None], d.mask_feature(), hidden)
        bs = self.cfg.block_size
        if tables is not None:
            normed, prenorm = self.graphs.drafter(b.input_ids, hidden, b.positions, tables, b.is_rejected)
        else:
            meta = AttnMeta([Span(s.num_rows + num_masks, s.ctx_len + num_masks, s.block_table) for s in spans], bs,
                            no_write=b.is_rejected)
            normed, prenorm = d(b.input_ids, hidden, b.positions, self.drafter_caches, meta)
        rows = b.sample_idx.flatten()
        logits = d.logits(normed[rows])
        best = greedy(logits)[0][:, None] if self.ranks == 1 else logits.topk(self.ranks, -1).indices
        drafts = d.to_target_ids(best).view(len(spans), -1, self.ranks)
        if parallel:
            return drafts
        h, pos, out = prenorm[rows], b.positions[rows], [drafts[:, 0, 0]]
        every_row_writes = torch.zeros(len(spans), dtype=torch.bool, device=dev) if tables is not None else None
        for step in range(1, k):
            if tables is not None:
                normed, h = self.graphs.drafter(out[-1], h, pos + step, tables, every_row_writes)
            else:
                meta = AttnMeta([Span(1, s.ctx_len + step, s.block_table) for s in spans], bs)
                normed, h = d(out[-1], h, pos + step, self.drafter_caches, meta)
            out.append(d.to_target_ids(greedy(d.logits(normed))[0]))
        return torch.stack(out, dim=1)[..., None]

    # ------------------------------------------------------------------ finishing
    def _append(self, seq: Sequence, tokens: list[int]) -> None:
        p = seq.params
        for t in tokens:
            seq.tokens.append(t)
            if seq.first_token_time is None:
                seq.first_token_time = time.perf_counter()
            if not p.ignore_eos and t in self.eos_token_ids:
                return self._finish(seq, "stop")
            cut = seq.detok.push(t) if seq.detok is not None else None
            if cut is not None:
                return self._finish(seq, "stop", cut)
            if len(seq.output_ids) >= p.max_tokens or seq.num_tokens >= self.max_model_len:
                return self._finish(seq, "length")

    def _finish(self, seq: Sequence, reason: str, text: str | None = None) -> None:
        """``text``: the output cut before a stop string; else all the detokenized output."""
        seq.status = Status.FINISHED
        seq.finish_reason = reason
        seq.finish_time = time.perf_counter()
        seq.set_drafts(Tree(()), [])
        seq.text = text if text is not None else seq.detok.text if seq.detok is not None else ""
        del seq.logprobs[len(seq.output_ids):]  # tokens of the last step after a stop are not emitted

    # ------------------------------------------------------------------ offline use
    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams] | None = None,
                 progress: bool = False) -> list[RequestOutput]:
        params_list = params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
        seqs = [self.add_request(p, sp) for p, sp in zip(prompts, params_list)]
        bar = None
        if progress:
            from tqdm import tqdm
            bar = tqdm(total=len(seqs), desc="generate", unit="req")
        while self.has_unfinished():
            done = self.step().finished
            if bar is not None:
                bar.update(len(done))
        if bar is not None:
            bar.close()
        return [RequestOutput.of(s) for s in seqs]
