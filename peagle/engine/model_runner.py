"""How a step runs on the device: the KV caches, one flat batch laid out for the target's pass (CUDA graphs for
decode steps, :mod:`peagle.engine.graphs`), verification, the accepted tree paths' KV, and drafting:

* ``parallel`` (P-EAGLE): one drafter pass over [accepted tokens, bonus, K-1 mask slots] yields K drafts,
  or the top candidates of each position, of which a token tree is verified next (:mod:`peagle.engine.tree`);
* ``eagle3``: the same head run K times, feeding its own pre-norm hidden state back;
* ``none``: the target alone.

:meth:`ModelRunner.run` does it all with one host sync at the end, which reads every sequence's accepted
count, emitted token, accepted path and next drafts.
"""
from __future__ import annotations

import statistics
import time
from functools import cached_property
from itertools import accumulate

import torch
import torch.nn.functional as F

from peagle import kernels
from peagle.kernels import table
from peagle.engine.auto_k import CostCurve
from peagle.engine.batch import Batch, Verified, offsets
from peagle.engine.config import Bounds, EngineConfig
from peagle.engine.expansion import expand
from peagle.engine.graphs import StepGraphs, bucket
from peagle.engine.processors import process
from peagle.engine.sampling import SamplingError, argmax, greedy, logprobs_of, sample_tokens
from peagle.engine.sequence import Sequence
from peagle.engine.tree import Tree, TreeBatch, accept_paths, path_rows, path_slots, tree_rows
from peagle.memory import to_device
from peagle.models.attention import AttnMeta, KVCache, Span
from peagle.models.drafter import Drafter
from peagle.models.layers import pack_for_inference, weight_dtype
from peagle.models.llama import LlamaModel
from peagle.models.loader import cache_dir
from peagle.models.quant import bf16_dots, integer_path, packed_matrices
from peagle.precision import precision_name


def kv_cache_dtype(name: str, target: LlamaModel) -> torch.dtype:
    """The KV pools' dtype for :attr:`EngineConfig.kv_cache_dtype` ``name``: ``auto`` is float16 where the
    target's attention runs peagle's CPU kernel and its matmuls their fast paths (integer or bf16 dot
    products: ``--compute exact`` keeps float32), else the model's dtype."""
    if name != "auto":
        return getattr(torch, name)
    c = target.cfg
    if table.on_device(target.lm_weight.device, c.head_dim, c.num_heads // c.num_kv_heads) and (
            integer_path(target) or bf16_dots(target)):
        return torch.float16
    return target.dtype


class ModelRunner:
    fused_drafting = True   # P-EAGLE chains drafted in one native call where the drafter fuses (tests compare both)

    def __init__(self, target: LlamaModel, drafter: Drafter | None, config: EngineConfig, bounds: Bounds,
                 num_blocks: int, stop_ids: set[int]):
        drafter = drafter if config.uses_head else None   # (none, ngram: a head given is not used)
        self.target, self.drafter, self.cfg, self.bounds = target, drafter, config, bounds
        self.stop_ids = sorted(stop_ids)   # what ``min_tokens`` holds off
        self.device, self.dtype = target.lm_weight.device, target.dtype
        target.pack_for_inference()
        if drafter is not None:
            pack_for_inference(drafter)
        if self.device.type == "cpu":  # the tiles' shape for this CPU, timed on the target's own matrices
            kernels.tune_streaming(packed_matrices(target), remember=cache_dir() / "streaming.json")
        if config.uses_head:
            if drafter is None:
                raise ValueError(f"method {config.method!r} needs a drafter")
            drafter.cfg.check_target(target.cfg, target.aux_layers)
            mine = (drafter.lm_head.weight.device, weight_dtype(drafter), drafter.embed_tokens.weight.dtype)
            if mine != (self.device, target.weight_dtype, self.dtype):
                raise ValueError(f"the drafter is {precision_name(*mine[1:])} on {mine[0]}, the target "
                                 f"{precision_name(target.weight_dtype, self.dtype)} on {self.device}: "
                                 "load both with the same dtype and device")
        self.num_blocks = num_blocks
        self.pad_block = num_blocks  # one more block, never handed out: padding sequences write there
        num_slots = (num_blocks + 1) * config.block_size
        self.kv_dtype = kv_cache_dtype(config.kv_cache_dtype, target)
        self.target_caches = target.make_caches(num_slots, self.kv_dtype)
        self.drafter_caches = drafter.make_caches(num_slots, self.kv_dtype) if drafter is not None else []
        use_graphs = self.device.type == "cuda" and not config.enforce_eager and target.graph_safe
        self.graphs = self.make_graphs(capture=True) if use_graphs else None

    def make_graphs(self, capture: bool) -> StepGraphs:
        """The padded decode passes (:mod:`peagle.engine.graphs`); ``capture=False`` runs them eagerly
        (the CPU tests of the layout)."""
        return StepGraphs(self.target, self.drafter, self.target_caches,
                          self.drafter_caches, self.cfg.block_size, capture)

    def cost_rows(self) -> list[int]:
        """The row counts the passes are timed at: 1, 2, 4, ... up to twice the tallest verify pass."""
        b, slots = self.bounds, self.num_blocks * self.cfg.block_size
        most = min(self.cfg.max_num_seqs * (max(b.k_max, b.max_nodes) + 1) * 2, 512, slots // 2)
        return sorted({r for r in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512) if r < most} | {max(most, 2)})

    def cost_context(self) -> int:
        """The context the passes are timed at: 128 tokens where the pool holds them."""
        return min(128, self.num_blocks * self.cfg.block_size - self.cost_rows()[-1])

    @torch.inference_mode()
    def measure_costs(self, rounds: int = 5) -> tuple[CostCurve, CostCurve]:
        """The target's pass (logits of every row) and the drafter's pass (its LM head too) over
        1, 2, 4, ... rows at a 128-token context, timed on the empty KV pool's first blocks (written by
        :func:`~peagle.engine.costs.pass_costs` first): what
        :class:`~peagle.engine.auto_k.AutoK` weighs K by. P-EAGLE's pass is timed as a step drafts
        (:meth:`propose`: n rows are a chain's verified rows and its mask slots, about half each; the native
        drafting call where it runs), EAGLE-3's as one bare pass. Round-robin, medians of ``rounds`` after a
        warm-up round: each drafter pass right after a target pass of its size, as a step runs them (its weights
        then cold: on a Zen 4 0.29 ms a row warm, about twice that after the target), and a burst of the host's
        other work touches every size alike, not one. Without a drafter (ngram) its curve is
        zero."""
        bs, dev, rows, ctx = self.cfg.block_size, self.device, self.cost_rows(), self.cost_context()
        d = self.drafter

        def one_pass(n: int, drafter: bool) -> float:
            ids, pos = torch.zeros(n, dtype=torch.long, device=dev), torch.arange(ctx, ctx + n, device=dev)
            meta = AttnMeta([Span(n, ctx + n, list(range(-(-(ctx + n) // bs))), ctx)], bs)
            t0 = time.perf_counter()
            if drafter and self.cfg.method == "parallel":
                m = max(0, n // 2 - 1)   # mask slots; the verified rows, all kept, the rest
                v = n - m
                self.propose([Span(v, ctx + v, meta.spans[0].block_table, ctx)], ids[:v], pos[:v], [0, v],
                             to_device([v], dev), torch.zeros(v, d.fc.weight.shape[1], dtype=self.dtype, device=dev),
                             ids[:1], m + 1)
            elif drafter:
                hidden = torch.zeros(n, d.cfg.hidden_size, dtype=self.dtype, device=dev)
                greedy(d.logits(d(ids, hidden, pos, self.drafter_caches, meta)[0]))
            else:   # the target's pass as a step runs it (its argmax in the pass where the pass takes it)
                logits, _, best = self.target.decode(ids, pos, self.target_caches, meta, pos - ctx)
                if best is None:
                    greedy(logits)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            return time.perf_counter() - t0

        times: dict[tuple[int, bool], list[float]] = {(n, dr): [] for n in rows for dr in (False, True) if d or not dr}
        for r in range(rounds + 1):
            for (n, dr), ts in times.items():
                t = one_pass(n, dr)
                if r:
                    ts.append(t)
        return tuple(CostCurve(rows, [statistics.median(times[n, dr]) if (n, dr) in times else 0.0 for n in rows])
                     for dr in (False, True))

    # ------------------------------------------------------------------ one step
    def run(self, work: list[tuple[Sequence, int]], tree: Tree) -> list[Verified]:
        """One target pass over ``work`` (prompts or chunks of them, and [last token, drafts...] of decoding
        sequences), verification, and drafting of ``tree`` for the next step; one host sync at the end.
        Raises :class:`SamplingError` before any sequence's tokens change if a verified row is not finite."""
        b = self.prepare(work)
        logits, taps, meta, best = self.forward(b)
        y, finite_rows = self.sample(b, logits, best)
        accepted, tokens, path = self.accept(y, b)
        if any(b.partial):  # the drafter reads the prompt's next token where a chunk stops short
            nxt = [seq.tokens[seq.num_cached + n] if p else 0 for (seq, n), p in zip(work, b.partial)]
            tokens = torch.where(to_device(b.partial, self.device, torch.bool), to_device(nxt, self.device), tokens)
        ids, positions, spans, cu = b.ids, b.positions, b.spans, b.cu   # the rows as the drafter reads them
        if any(b.layout):  # the accepted paths' KV where a chain's would be; the drafter reads the paths
            self.keep_paths(b, path, meta)
            rows, spans = path_rows(b.layout, path, b.spans, b.cu)
            ids, positions, taps, cu = ids[rows], positions[rows], taps[rows], offsets(spans)
        finite = finite_rows if b.tree_batch is None else finite_rows[b.tree_batch.rows].all(1)
        out = [finite[:, None].long(), accepted[:, None], tokens[:, None], path]
        k = tree.depth
        if k:  # rows whose KV stays valid: the new tokens and the accepted drafts
            num_valid, bonus = to_device([n for _, n in work], self.device) + accepted, tokens
            if b.num_pad:  # padding sequences keep one row and read token 0
                num_valid, bonus = F.pad(num_valid, (0, b.num_pad), value=1), F.pad(tokens, (0, b.num_pad))
            drafter_in = (spans, ids, positions, cu, num_valid, taps)
            if any(seq.draft_lag for seq in b.seqs):
                drafter_in = self._with_lag(b.seqs, *drafter_in)
            out.append(self.propose(*drafter_in, bonus, k, b.tables)[:len(work)].flatten(1))
        packed = torch.cat(out, dim=1).tolist()
        if not all(row[0] for row in packed):  # before any state changes: the caller fails these requests
            raise SamplingError("the model produced non-finite logits")
        return [self._read_back(b, i, row, path.shape[1], k, (ids, positions, taps, cu), logits)
                for i, row in enumerate(packed)]

    def prepare(self, work: list[tuple[Sequence, int]]) -> Batch:
        """The target pass's rows: a tree's node i at position start + its depth, keeping its KV at index
        start + i. A decode step takes the padded layout under CUDA graphs: every sequence feeds ``width``
        rows (filler rows after its drafts, verified by no one, rejected), padding sequences fill the batch
        to a bucket."""
        seqs, dev = [seq for seq, _ in work], self.device
        layout = [(seq.num_cached, seq.tree) if not seq.tree.is_chain else None for seq in seqs]
        padded = (self.graphs is not None and all(n == 1 for _, n in work) and not any(s.draft_lag for s in seqs)
                  and not any(layout))
        width = max(len(seq.drafts) for seq in seqs) + 1 if padded else 0
        num_pad = bucket(len(seqs), self.cfg.max_num_seqs) - len(seqs) if padded else 0
        ids, positions, spans, verify_rows, partial = [], [], [], [], []
        for (seq, n), t in zip(work, layout):
            start = seq.num_cached
            inp = seq.tokens[start:start + n] + seq.drafts   # drafts only when decoding
            inp += [0] * (width - len(inp))
            ids += inp
            positions += [start + d for d in seq.tree.depths] if t else range(start, start + len(inp))
            spans.append(Span(len(inp), start + len(inp), seq.block_table, None if t else start))
            verify_rows.append(len(seq.drafts) + 1)
            partial.append(start + n < seq.num_tokens)
        tables = None
        if padded:
            ids += [0] * (num_pad * width)
            positions += [0] * (num_pad * width)
            spans += [Span(width, 1, [self.pad_block], 0)] * num_pad
            nb = bucket(max(len(s.block_table) for s in spans), -(-self.bounds.max_positions // self.cfg.block_size))
            tables = to_device([s.block_table + [self.pad_block] * (nb - len(s.block_table)) for s in spans], dev)
        cu, first = offsets(spans), list(accumulate(verify_rows, initial=0))
        # the verified rows: each sequence's last new token and its drafts
        logit_rows = to_device([c + n - 1 + j for c, (_, n), v in zip(cu, work, verify_rows) for j in range(v)], dev)
        return Batch(work, layout, partial, to_device(ids, dev), to_device(positions, dev), spans, cu, first,
                     logit_rows, TreeBatch.of([s.tree for s in seqs], [s.drafts for s in seqs], first[:-1], dev)
                     if any(s.drafts for s in seqs) else None,
                     tree_rows(layout, spans, positions, dev) if any(layout) else None, tables, num_pad)

    def forward(self, b: Batch) -> tuple[torch.Tensor, torch.Tensor, AttnMeta | None, tuple | None]:
        """The target's pass: logits of the verified rows, the aux hidden states of every row, the attention
        metadata (None in the graphed layout), and the verified rows' argmax and finiteness where the pass
        took them (:meth:`LlamaModel.decode`), else None."""
        if b.tables is not None:
            logits, taps = self.graphs.target(b.ids, b.positions, b.tables)
            return logits[b.logit_rows], taps, None, None
        meta = AttnMeta(b.spans, self.cfg.block_size, tree=b.tree_rows)
        logits, taps, best = self.target.decode(b.ids, b.positions, self.target_caches, meta, b.logit_rows)
        return logits, taps, meta, best

    def sample(self, b: Batch, logits: torch.Tensor, best: tuple | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The target's token ``y`` at every verified row (argmax, or sampled keyed by the output position)
        after each request's sampling fields (:mod:`peagle.engine.processors`), and whether each row is finite
        (before them: their -inf entries are the fields', not the model's); ``best``: the rows' argmax and
        finiteness where the target's pass took them."""
        y, finite_rows = best if best is not None else greedy(logits)
        for (seq, _), partial, f, f1 in zip(b.work, b.partial, b.first, b.first[1:]):
            p = seq.params
            if partial or (p.greedy and not p.processed):
                continue
            rows = process(logits[f:f1], seq, self.stop_ids) if p.processed else logits[f:f1]
            y[f:f1] = argmax(rows) if p.greedy else \
                sample_tokens(rows, p, seq.seed, [len(seq.output_ids) + d for d in seq.tree.depths])
        return y, finite_rows

    def accept(self, y: torch.Tensor, b: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Verification on the device (:func:`peagle.engine.tree.accept_paths`): accepted drafts ``[B]``, the
        token emitted after them ``[B]`` and the accepted path's nodes by depth ``[B, D+1]``. Without drafts
        (plain steps, prompt chunks) each sequence's one row is its token: nothing to verify."""
        if b.tree_batch is None:
            none = torch.zeros(len(y), 1, dtype=torch.long, device=y.device)
            return none[:, 0], y, none
        return accept_paths(y[b.tree_batch.rows], b.tree_batch)

    def keep_paths(self, b: Batch, path: torch.Tensor, meta: AttnMeta) -> None:
        """Move the target KV of each tree's accepted path to where a chain's would be (:func:`path_slots`)."""
        KVCache.move(self.target_caches, *path_slots(b.layout, path, meta))

    def _read_back(self, b: Batch, i: int, row: list[int], depth1: int, k: int, drafter_rows: tuple,
                   logits: torch.Tensor) -> Verified:
        """Sequence ``i``'s outcome from its row of the step's one host read; where the drafter skipped
        this step (K = 0), the rows it will read when drafting resumes are kept on the sequence."""
        (seq, n), a, token, nodes, cands = b.work[i], row[1], row[2], row[3:3 + depth1], row[3 + depth1:]
        if self.drafter is not None and not k:   # (taps may be a graph's output: copied)
            ids, positions, taps, cu = drafter_rows
            rows = slice(cu[i], cu[i] + n + a)
            seq.lag(ids[rows], positions[rows], taps[rows].clone())
        if b.partial[i]:
            return Verified(a)
        tokens = [seq.drafts[j - 1] for j in nodes[1:a + 1]] + [token]
        r = self.bounds.ranks
        logprobs = [] if seq.params.logprobs is None else logprobs_of(  # the target's, at each emitted position
            logits[[b.first[i] + j for j in nodes[:a + 1]]], tokens, seq.params.logprobs)
        return Verified(a, tokens, [cands[d * r:(d + 1) * r] for d in range(k)], logprobs)

    # ------------------------------------------------------------------ drafting
    def _with_lag(self, seqs: list[Sequence], spans: list[Span], ids: torch.Tensor, positions: torch.Tensor,
                  cu: list[int], num_valid: torch.Tensor, taps: torch.Tensor) -> tuple:
        """The drafter's inputs with each sequence's lagging rows (steps at K = 0) before its rows of
        this pass: they are kept rows at the positions just before, so the expansion reads them as
        one longer prefix and the drafter's KV has no holes. Rare (drafting resumes), so per sequence."""
        parts, lags = [], []
        for i, seq in enumerate(seqs):
            rows = slice(cu[i], cu[i + 1])
            lags.append(seq.draft_lag_rows)
            lag = seq.take_lag() + [(ids[rows], positions[rows], taps[rows])]
            parts.append([torch.cat(x) for x in zip(*lag)])
        spans = [Span(s.num_rows + n, s.ctx_len, s.block_table) for s, n in zip(spans, lags)]
        ids, positions, taps = (torch.cat(x) for x in zip(*parts))
        return spans, ids, positions, offsets(spans), num_valid + to_device(lags, self.device), taps

    @cached_property
    def mask_feature(self) -> torch.Tensor:
        """The drafter's mask-slot feature, ``fc(mask_hidden)``: its weights are fixed while it serves."""
        return self.drafter.mask_feature()

    def propose(self, spans: list[Span], ids: torch.Tensor, positions: torch.Tensor, cu: list[int],
                num_valid: torch.Tensor, taps: torch.Tensor, bonus: torch.Tensor, k: int,
                tables: torch.Tensor | None = None) -> torch.Tensor:
        """``k`` drafts ``[B, k, ranks]`` (the top ``ranks`` candidates of each position, best first: one
        for a chain) for each sequence of the target pass (``spans``; ``cu`` its row
        offsets; ``num_valid`` rows kept, ``taps`` the target's aux hidden states, ``bonus`` the
        emitted token): the verified batch is expanded as vLLM does (:mod:`peagle.engine.expansion`),
        one drafter pass reads the drafts at the bonus and mask rows, and EAGLE-3 then continues one
        token at a time, feeding back the head's own pre-norm hidden state. With ``tables`` (the
        padded block tables of a decode step) the drafter's passes are the graphed ones."""
        d, dev, ranks = self.drafter, self.device, self.bounds.ranks
        parallel = self.cfg.method == "parallel"
        num_masks = k - 1 if parallel else 0
        if parallel and ranks == 1 and tables is None and self.fused_drafting and \
                d.fuses(taps, self.drafter_caches, max(s.num_rows for s in spans) + num_masks):
            return d.draft(ids, positions, cu, num_valid, bonus, taps, num_masks, spans, self.drafter_caches,
                           self.mask_feature, self.cfg.block_size)[..., None]
        b = expand(ids, positions, to_device(cu, dev), num_valid, bonus, num_masks, d.cfg.mask_token_id)
        hidden = d.project(taps)[b.hidden_map.clamp(min=0)]
        if num_masks:
            hidden = torch.where(b.is_masked[:, None], self.mask_feature, hidden)
        bs, rows = self.cfg.block_size, b.sample_idx.flatten()
        if tables is not None:
            normed, prenorm = self.graphs.drafter(b.input_ids, hidden, b.positions, tables, b.is_rejected)
            normed, prenorm = normed[rows], prenorm[rows]
        else:   # (the rows before the drafted ones stop at their KV)
            meta = AttnMeta([Span(s.num_rows + num_masks, s.ctx_len + num_masks, s.block_table) for s in spans], bs,
                            no_write=b.is_rejected)
            normed, prenorm = d(b.input_ids, hidden, b.positions, self.drafter_caches, meta, keep=rows)
        logits = d.logits(normed)
        best = argmax(logits)[:, None] if ranks == 1 else logits.topk(ranks, -1).indices
        drafts = d.to_target_ids(best).view(len(spans), -1, ranks)
        if parallel:
            return drafts
        h, pos, out = prenorm, b.positions[rows], [drafts[:, 0, 0]]
        every_row_writes = torch.zeros(len(spans), dtype=torch.bool, device=dev) if tables is not None else None
        for step in range(1, k):
            if tables is not None:
                normed, h = self.graphs.drafter(out[-1], h, pos + step, tables, every_row_writes)
            else:
                meta = AttnMeta([Span(1, s.ctx_len + step, s.block_table) for s in spans], bs)
                normed, h = d(out[-1], h, pos + step, self.drafter_caches, meta)
            out.append(d.to_target_ids(argmax(d.logits(normed))))
        return torch.stack(out, dim=1)[..., None]

