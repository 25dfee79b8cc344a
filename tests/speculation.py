"""Helpers for the tests that speculative decoding is lossless and that they would see it fail.

An equality of speculative and plain decoding proves little when nothing is accepted: a verifier that rejects
every draft passes it. So the lossless tests run an oracle head that drafts each sequence's own plain
continuation (corrupted at a fixed rate, so rejections happen too), a :class:`Watch` asserts that drafts were
accepted (and crossed preemptions or prompt chunks in flight), and :func:`planted` faults in the engine's public
seams show that the checks catch a verifier that rejects everything, one that keeps a rejected draft, and
token trees' KV moved wrongly."""
from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from peagle.engine.auto_k import CostCurve
from peagle.engine.llm_engine import EngineConfig, LLMEngine
from peagle.engine.tree import Tree
from peagle.models.drafter import Drafter
from peagle.models.loader import init_drafter

MASK = 159  # the tiny vocabulary's last id, never produced by the tests' prompts
# a JSON schema a random model can finish (bounded strings and arrays), for the structured-output tests
PERSON_SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 6}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3}},
    "required": ["name", "age", "tags"], "additionalProperties": False}


def blank_tokens(tokenizer) -> list[int]:
    """The ids whose text is whitespace: a random model likes JSON's optional whitespace, so the structured
    tests bias these down (logit_bias beside the grammar) and its JSON ends."""
    return [i for i in tokenizer.get_vocab().values() if not tokenizer.decode([i]).strip()]

# a CPU in bf16: 8 rows cost about one row, then rows get dearer; drafting a tenth of a target pass
TARGET = CostCurve([1, 8, 16, 64, 256], [1.0, 1.1, 1.6, 4.0, 14.0])
DRAFTER = CostCurve([1, 8, 16, 64, 256], [0.05, 0.06, 0.09, 0.25, 0.9])


def make_engine(target, drafter, method="parallel", k=4, responses=None, **kw) -> LLMEngine:
    """An engine whose drafts are the head's alone unless ``prompt_lookup_max`` or a table of ``responses`` says
    otherwise: the oracle heads' tests control every draft (test_lookup.py and test_response_lookup.py run the
    text's and the table's beside them)."""
    kw.setdefault("prompt_lookup_max", 0)
    return LLMEngine(target, drafter, EngineConfig(method=method, num_speculative_tokens=k, **kw), responses=responses)


def fixed_costs(engine: LLMEngine) -> LLMEngine:
    """``auto`` on the fixed cost curves above (rows nearly free, drafting cheap), not this machine's timings:
    its choices depend on acceptance alone."""
    auto = engine.scheduler.auto
    if auto is not None:
        auto.target, auto.drafter, auto.observe = TARGET, DRAFTER, lambda *a: None
    return engine


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 150, (int(torch.randint(3, 20, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


class OracleDrafter(Drafter):
    """Proposes the target's own continuation, corrupted at a fixed rate: exercises long accepted runs,
    rejections at every depth and the bonus token, all through the real drafter plumbing (positions, mask
    slots, KV writes, EAGLE-3 feedback). ``reference``: one token list every sequence follows by position,
    or each prompt's full token list (prompt and plain output), read from the sequence a row belongs to in
    the engine :meth:`bind` names."""

    def __init__(self, cfg, reference: list[int] | dict[tuple[int, ...], list[int]], wrong_every: int):
        super().__init__(cfg)
        self.reference, self.wrong_every, self.engine = reference, wrong_every, None
        if isinstance(reference, dict):
            self.refs = list(reference.values())
            self.index = {p: i for i, p in enumerate(reference)}

    @classmethod
    def of(cls, target, reference, wrong_every: int, cfg=None) -> "OracleDrafter":
        """An initialised oracle for ``target`` (a 1-layer head's shape unless ``cfg``), ready to run."""
        head = cls(cfg or init_drafter(target, 1, MASK).cfg, reference, wrong_every)
        head.init_weights(0)
        return head.eval()

    def bind(self, engine: LLMEngine) -> LLMEngine:
        """Read each row's sequence from ``engine``'s running ones (references by prompt)."""
        self.engine = engine
        return engine

    def _sequence_tags(self, meta, rows: int) -> torch.Tensor:
        """Each row's reference (-1: none), from its span's sequence (spans are told apart by their block tables:
        sequences may share their first blocks, a kept prefix, but each writes its own last one)."""
        running = self.engine.running if self.engine is not None else []   # (none: the engine's start-up timing)
        by_table = {tuple(s.block_table): self.index.get(tuple(s.prompt_ids), -1) for s in running}
        tags = [by_table.get(tuple(span.block_table), -1) for span in meta.spans for _ in range(span.num_rows)]
        return torch.tensor(tags + [-1] * (rows - len(tags)), dtype=torch.float32)[:, None]

    def forward(self, ids, hidden, positions, caches, meta, keep=None):
        normed, prenorm = super().forward(ids, hidden, positions, caches, meta)
        tag = positions.to(normed.dtype)[:, None]  # the row at position p predicts token p + 2
        if isinstance(self.reference, dict):
            tag = torch.cat([tag, self._sequence_tags(meta, tag.shape[0]).to(normed.device, normed.dtype)], 1)
        n = tag.shape[1]
        normed, prenorm = torch.cat([tag, normed[:, n:]], 1), torch.cat([tag, prenorm[:, n:]], 1)
        return (normed, prenorm) if keep is None else (normed[keep], prenorm[keep])

    def reference_of(self, row: torch.Tensor) -> list[int]:
        if not isinstance(self.reference, dict):
            return self.reference
        i = int(row[1].round())
        return self.refs[i] if i >= 0 else []

    def target_token(self, row: torch.Tensor) -> tuple[int, int]:
        """(index, token) the row predicts: its reference's token two past its position (0 past the end)."""
        i, ref = int(row[0].round()) + 2, self.reference_of(row)
        return i, ref[i] if i < len(ref) else 0

    def logits(self, normed):
        if not hasattr(self, "_draft_id"):  # target id -> draft id (heads with a reduced draft vocabulary)
            targets = self.to_target_ids(torch.arange(self.cfg.draft_vocab_size, device=normed.device)).tolist()
            self._draft_id = {t: d for d, t in enumerate(targets)}
        out = torch.zeros(normed.shape[0], self.cfg.draft_vocab_size, device=normed.device)
        for r, row in enumerate(normed.float()):
            i, tok = self.target_token(row)
            if i % self.wrong_every == 0:
                tok = (tok + 1) % self.cfg.vocab_size
            out[r, self._draft_id.get(tok, 0)] = 1.0  # a token outside the draft vocabulary: another one
        return out


class RunnerUpOracle(OracleDrafter):
    """The oracle's continuation, but where it is corrupted the right token is its second choice: what a
    tree's second rank is for."""

    def logits(self, normed):
        out = super().logits(normed)
        for r, row in enumerate(normed.float()):
            i, tok = self.target_token(row)
            if i % self.wrong_every == 0:
                out[r, self._draft_id.get(tok, 0)] = 0.5
        return out


def references(ps: list[list[int]], outputs: list[list[int]]) -> dict[tuple[int, ...], list[int]]:
    """Each prompt's full token list (prompt, then its plain output), as :class:`OracleDrafter` reads them."""
    return {tuple(p): p + o for p, o in zip(ps, outputs)}


# --------------------------------------------------------------------------- watching speculation happen

class Watch:
    """What one engine's run shows of speculation: drafted and accepted tokens (its statistics), preemptions
    of sequences that had accepted drafts, and steps that accepted drafts beside a prompt chunk that stopped
    short; spied through the engine's public seams (``step``, ``scheduler.preempt``)."""

    def __init__(self, engine: LLMEngine):
        self.engine, self.preempted, self.chunked = engine, 0, 0
        step, preempt = engine.step, engine.scheduler.preempt

        def spy_preempt(seq):
            self.preempted += seq.stats.num_accepted_tokens > 0
            preempt(seq)

        def spy_step():
            chunking = {s: s.num_cached for s in [*engine.running, *engine.waiting] if s.num_tokens - s.num_cached > 1}
            accepted = engine.stats.num_accepted_tokens
            result = step()
            self.chunked += engine.stats.num_accepted_tokens > accepted and any(
                n < s.num_cached < s.num_tokens - 1 for s, n in chunking.items())
            return result

        engine.step, engine.scheduler.preempt = spy_step, spy_preempt

    def check(self, outputs, expected, rate: float = 1 / 3, crossing: str | None = None) -> tuple[int, int]:
        """Outputs equal plain decoding's, at least ``rate`` of the drafted tokens were accepted, and with
        ``crossing`` (``preempt``, ``chunk``) accepted drafts were in flight across one. Returns (accepted, drafted)."""
        assert outputs == expected, "not plain decoding's tokens"
        s = self.engine.stats
        assert s.num_accepted_tokens >= max(rate * s.num_draft_tokens, 1), \
            f"accepted {s.num_accepted_tokens} of {s.num_draft_tokens} drafted tokens"
        if crossing == "preempt":
            assert self.preempted, "no sequence with accepted drafts was preempted"
        if crossing == "chunk":
            assert self.chunked, "no drafts were accepted beside a prompt chunk"
        print(f"\n[speculation] {os.environ.get('PYTEST_CURRENT_TEST', '').split(' ')[0]}: accepted "
              f"{s.num_accepted_tokens}/{s.num_draft_tokens}, preempted {self.preempted}, chunked {self.chunked}")
        return s.num_accepted_tokens, s.num_draft_tokens


# --------------------------------------------------------------------------- planted faults

def _reject_all(engine: LLMEngine) -> None:
    accept = engine.runner.accept

    def fault(y, b):   # every node's token is one no target gives: nothing accepted, the target's token emitted
        if b.tree_batch is None:  # no drafts this step
            return accept(y, b)
        tb = dataclasses.replace(b.tree_batch, tokens=torch.full_like(b.tree_batch.tokens, -1))
        return accept(y, dataclasses.replace(b, tree_batch=tb))
    engine.runner.accept = fault


def _keep_rejected(engine: LLMEngine) -> None:
    accept = engine.runner.accept

    def fault(y, b):   # a chain's first rejected draft kept too (its token, its KV), the target's token after it
        a, _, path = accept(y, b)
        tb = b.tree_batch
        if tb is None:  # no drafts this step
            return a, _, path
        a = torch.where(a < tb.depths.max(1).values, a + 1, a)
        nodes = torch.minimum(torch.arange(path.shape[1], device=a.device)[None], a[:, None])
        return a, y[tb.rows].gather(1, a[:, None])[:, 0], nodes
    engine.runner.accept = fault


def _no_path_move(engine: LLMEngine) -> None:
    engine.runner.keep_paths = lambda *a: None   # rejected siblings' KV left where the path's belongs


def _wrong_path(engine: LLMEngine) -> None:
    keep = engine.runner.keep_paths

    def fault(b, path, meta):   # each accepted node's sibling (the next node at its depth) moved instead
        wrong = path.clone()
        for i, t in enumerate(b.layout):
            if t is not None:
                wrong[i] = torch.tensor(sibling_of(t[1]))[path[i]]
        keep(b, wrong, meta)
    engine.runner.keep_paths = fault


def sibling_of(tree: Tree) -> list[int]:
    """Node j's next node at its depth, cyclically (the root, and a node alone at its depth, itself)."""
    out = [0]
    for j, p in enumerate(tree.paths, 1):
        same = [i for i, q in enumerate(tree.paths, 1) if len(q) == len(p)]
        out.append(same[(same.index(j) + 1) % len(same)])
    return out


FAULTS = {"reject_all": _reject_all, "keep_rejected": _keep_rejected, "no_path_move": _no_path_move,
          "wrong_path": _wrong_path}
CHAIN_FAULTS = ("reject_all", "keep_rejected")
TREE_FAULTS = ("reject_all", "no_path_move", "wrong_path")


def planted(fault: str, engine: LLMEngine) -> LLMEngine:
    """``engine`` with ``fault`` monkeypatched into its public seams: ``reject_all`` (verification accepts no
    draft: still lossless, so only the acceptance check can see it), ``keep_rejected`` (a chain's verifier keeps
    the first rejected draft, its token and its KV), ``no_path_move`` (a tree's accepted path's KV is not moved,
    so rejected nodes' KV stands where the path's should), ``wrong_path`` (another path's KV is moved)."""
    FAULTS[fault](engine)
    return engine


def assert_caught(fault: str, run, expected, **check) -> None:
    """``run`` (an engine factory's run, returning (engine, outputs) with a :class:`Watch` on it) under the
    planted ``fault`` must fail the check: the acceptance check for ``reject_all``, the equality for the rest."""
    engine, watch, outputs = run(lambda e: planted(fault, e))
    with pytest.raises(AssertionError, match="accepted" if fault == "reject_all" else "plain decoding"):
        watch.check(outputs, expected, **check)


def oracle_run(target, head: OracleDrafter | None, method: str, k, ps: list[list[int]], params, **kw):
    """``run(patch)``: ``ps`` through a fresh engine with ``head`` bound to it (``auto`` on fixed costs), after
    ``patch`` (a planted fault) if given; returns (engine, its :class:`Watch`, the outputs' tokens)."""
    def run(patch=lambda e: e):
        engine = patch(fixed_costs(make_engine(target, head, method, k, **kw)))
        if head is not None:
            head.bind(engine)
        watch = Watch(engine)
        return engine, watch, [o.token_ids for o in engine.generate(ps, params)]
    return run


def assert_lossless_on_path(target, method: str, wrap=lambda head: head, **engine_kw) -> None:
    """A weight path's losslessness (the integer path, bf16 dot products): greedy and seeded, one sequence
    and four together with prompts prefilled in chunks of 7, chains and (P-EAGLE) a token tree, every output
    equals plain decoding's on the same path and the oracle head's drafts are accepted (a verifier that
    rejected them all would fail here); a random head's rejections still give plain decoding. ``wrap``
    puts a head on the path (packs it as the loader would); ``engine_kw`` goes to every engine (a KV dtype)."""
    from peagle.engine.sampling import SamplingParams

    prompt = prompts(1, seed=3)[0]
    greedy = SamplingParams(max_tokens=40, ignore_eos=True)
    seeded = dataclasses.replace(greedy, temperature=0.8, top_p=0.95, seed=11)
    for params in (greedy, seeded):
        ref = make_engine(target, None, "none", **engine_kw).generate([prompt], params)[0].token_ids
        for k, wrong_every, kw in ((3, 4, {}), (7, 1000, {}), (3, 5, dict(max_num_seqs=4, max_num_batched_tokens=7)),
                                   (3, 4, dict(speculative_token_tree="[(0,), (1,), (0, 0), (0, 0, 0)]"))):
            if method == "eagle3" and "speculative_token_tree" in kw:
                continue
            engine = make_engine(target, wrap(OracleDrafter.of(target, prompt + ref, wrong_every)), method, k, **kw,
                                 **engine_kw)
            n = kw.get("max_num_seqs", 1)
            outs = engine.generate([prompt] * n, [params] * n)
            assert [o.token_ids for o in outs] == [ref] * n, (method, k, kw)
            assert engine.stats.num_accepted_tokens > 0 and outs[0].stats.acceptance_length > 1.5, (k, kw)
    random_head = wrap(init_drafter(target, 1, MASK, seed=4))  # drafts the target rarely takes: rejections
    ps = prompts(4, seed=6)
    plain = [o.token_ids for o in make_engine(target, None, "none", **engine_kw).generate(ps, greedy)]
    assert [o.token_ids for o in make_engine(target, random_head, method, 3, **engine_kw).generate(ps, greedy)] == plain


def oracle_engine(target: str, cases: list[tuple[list[int], dict]], wrong_every: int = 5, fault: str | None = None,
                  **config) -> LLMEngine:
    """The server's engine for its lossless tests (an :class:`~peagle.serve.async_engine.EngineSpec` factory:
    the engine process builds it by name): ``target`` in float32, its head an oracle drafting each case's plain
    output (prompt ids -> :class:`SamplingParams` fields), ``config`` the engine's settings, ``fault`` planted."""
    from peagle.engine.sampling import SamplingParams
    from peagle.models.loader import load_target, load_tokenizer

    model, path = load_target(target, "float32", device="cpu")
    tokenizer = load_tokenizer(path)
    plain = LLMEngine(model, None, EngineConfig(method="none"), tokenizer)
    ps = [ids for ids, _ in cases]
    outs = [plain.generate([ids], SamplingParams(**fields))[0].token_ids for ids, fields in cases]
    head = OracleDrafter.of(model, references(ps, outs), wrong_every)
    engine = head.bind(LLMEngine(model, head, EngineConfig(**{"prompt_lookup_max": 0, **config}), tokenizer))
    return planted(fault, engine) if fault else engine
