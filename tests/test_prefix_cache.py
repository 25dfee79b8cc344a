"""Prefix caching: a request's KV blocks kept for the next prompt that starts with the same tokens. The block
manager's keys, keeping and reuse on their own; then the engine's promise, that a prompt whose prefix was kept
gives the target and drafter KV, the tokens and the drafts of a prefill from scratch, each check shown to catch
a planted fault (a key without the next token, blocks kept before the drafter read them, a reordered prefix)."""
from __future__ import annotations

import hashlib
from array import array

import pytest
import torch
from conftest import native_from_hf, tiny_hf
from speculation import MASK, OracleDrafter, Watch, fixed_costs, make_engine, references

from peagle.engine import block_manager
from peagle.engine.block_manager import BlockManager
from peagle.engine.sampling import SamplingParams
from peagle.engine.sequence import Sequence
from peagle.engine.tree import Tree
from peagle.models.loader import init_drafter
from peagle.serve.engine_core import Snapshot
from peagle.serve.metrics import Metrics

B = 16   # the engine's default block size


def seq(tokens: list[int]) -> Sequence:
    return Sequence(tokens, SamplingParams())


def finished(bm: BlockManager, tokens: list[int], num_cached: int, lag: int = 0) -> list[int]:
    """A sequence of ``tokens`` admitted, its KV valid below ``num_cached`` (``lag`` rows the drafter has not
    read), released; returns its block table."""
    s = seq(tokens)
    assert bm.admit(s, len(tokens))
    s.num_cached, s.draft_lag_rows = num_cached, lag
    table = list(s.block_table)
    bm.release(s)
    return table


def test_blocks_are_found_by_their_tokens_and_the_one_after():
    bm = BlockManager(8, 4)
    tokens = list(range(10, 23))                      # 13 tokens: blocks 0-2 full, each with a next token
    table = finished(bm, tokens, 12)
    assert bm.lookup(tokens) == table[:3]
    assert bm.lookup(tokens + [7, 8]) == table[:3]    # a longer prompt with the same start
    assert bm.lookup(tokens[:12]) == table[:2]        # block 2 needs token 12 after it
    assert bm.lookup(tokens[:12] + [99]) == table[:2]  # ... and that token: the drafter's KV at 11 was made from it
    assert bm.lookup([0] + tokens[1:]) == []          # a key chains the blocks before it
    assert bm.num_free == 8 and sorted(bm.idle) == sorted(table[:3])


def test_only_blocks_with_target_and_drafter_kv_are_kept():
    bm = BlockManager(8, 4)
    tokens = list(range(10, 30))
    table = finished(bm, tokens, 13, lag=6)           # the drafter read positions 0..6: block 0 alone is complete
    assert bm.lookup(tokens) == table[:1]
    off = BlockManager(8, 4, prefix_caching=False)
    finished(off, tokens, 19)
    assert off.lookup(tokens) == [] and not off.kept and len(off.free) == 8


def test_shared_blocks_idle_eviction_and_a_refused_admission():
    bm = BlockManager(5, 4)
    tokens = list(range(10, 19))                      # 9 tokens: blocks 0 and 1 kept
    table = finished(bm, tokens, 8)
    a, b = seq(tokens + [1, 2]), seq(tokens + [3])
    assert bm.admit(a, 12) and not bm.admit(b, 20)   # a: the kept 2 and 1 new; b would need 3 new, 2 are left
    assert a.block_table[:2] == table[:2] and a.num_cached == 8 and bm.users[table[0]] == 1
    assert not b.block_table and not b.num_cached and bm.users[table[0]] == 1   # refused: nothing taken
    assert bm.num_free == 2
    assert bm.admit(b, 8)                             # the kept prefix alone: both read it
    assert a.cached_prompt_tokens == b.cached_prompt_tokens == 8   # (OpenAI's usage.prompt_tokens_details)
    assert bm.users[table[0]] == 2 and bm.hits == 16 and bm.queries == len(tokens) + len(a.tokens) + len(b.tokens)
    bm.release(b)
    assert table[0] not in bm.idle                    # a still reads it
    bm.release(a)
    assert set(bm.idle) >= set(table[:2])
    # new KV takes free blocks first, then idle kept ones, a sequence's last blocks before its first
    order = [bm._take() for _ in range(bm.num_free)]
    assert order.index(table[1]) < order.index(table[0]) and not bm.kept and not bm.lookup(tokens)


def test_reset_forgets_idle_blocks():
    bm = BlockManager(6, 4)
    tokens = list(range(10, 19))
    finished(bm, tokens, 8)
    bm.reset_prefix_cache()
    assert bm.lookup(tokens) == [] and len(bm.free) == 6 and not bm.idle


# --------------------------------------------------------------------------- the engine

@pytest.fixture(scope="module")
def llama():
    return native_from_hf(tiny_hf("llama"))


def kv_of(engine, s: Sequence, n: int) -> list[torch.Tensor]:
    """Target and drafter K and V of positions 0..n-1 of ``s``."""
    slots = torch.tensor([s.block_table[p // B] * B + p % B for p in range(n)])
    return [torch.cat([c.k[slots], c.v[slots]]) for c in engine.runner.target_caches + engine.runner.drafter_caches]


def second_turn(llama, head, method: str, first: list[int], second: list[int], caching: bool = True,
                first_patch=None, finish_first: bool = True):
    """``first`` run to its end (or, ``finish_first`` False, to its first output token: it goes on beside the
    second), ``first_patch(engine)`` in force and undone by what it returns, then ``second`` in the same engine,
    read after its first output token and at its end: (the engine, KV of ``second``'s prompt positions, its
    tokens, how they came)."""
    engine = make_engine(llama, head, method, 4, enable_prefix_caching=caching)
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    if caching:
        undo = first_patch(engine) if first_patch else lambda: None
        a = engine.add_request(first, SamplingParams(max_tokens=12 if finish_first else 40, ignore_eos=True))
        while not a.finished if finish_first else not a.output_ids:
            engine.step()
        undo()
    s = engine.add_request(second, params)
    while not s.output_ids:
        engine.step()
    kv = kv_of(engine, s, len(second))
    assert any(r is not s for r in engine.running) == (caching and not finish_first)   # the first one beside it
    while engine.has_unfinished():
        engine.step()
    return engine, kv, s.output_ids, s.origins


def turns(n: int = 3 * B, seed: int = 4) -> tuple[list[int], list[int]]:
    """Two prompts sharing ``n`` tokens (three blocks), then told apart by the very next token."""
    g = torch.Generator().manual_seed(seed)
    shared = torch.randint(3, 150, (n,), generator=g).tolist()
    return shared + [5, 6, 7, 8, 9], shared + [10] + torch.randint(3, 150, (20,), generator=g).tolist()


def assert_same_second_turn(llama, head, method, first, second, first_patch=None, finish_first=True) -> int:
    """The second request's KV, tokens and origins equal a fresh engine's; returns the prompt tokens it found kept."""
    engine, kv, out, origins = second_turn(llama, head, method, first, second, first_patch=first_patch,
                                           finish_first=finish_first)
    _, ref_kv, ref_out, ref_origins = second_turn(llama, head, method, first, second, caching=False)
    assert out == ref_out and origins == ref_origins
    for a, b in zip(kv, ref_kv):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    return engine.blocks.hits


@pytest.mark.parametrize("method", ["none", "parallel", "eagle3"])
def test_a_kept_prefix_gives_a_fresh_prefills_kv_tokens_and_drafts(llama, method):
    """A chat's next turn (the first prompt and its output, then more) and a prompt that leaves the first one at
    a block's end, after the first request and beside it: the second request reads the kept blocks (the hits say
    so) and its target and drafter KV, tokens and drafts (each output token's origin: the drafter's KV decides
    them) equal a fresh engine's."""
    head = None if method == "none" else init_drafter(llama, 2, MASK, seed=6)
    first, second = turns()
    engine = make_engine(llama, None, "none")
    out = engine.generate([first], SamplingParams(max_tokens=12, ignore_eos=True))[0].token_ids
    chat = first + out + torch.randint(3, 150, (9,), generator=torch.Generator().manual_seed(1)).tolist()
    # first, its 12 output tokens, KV below position 64: 4 blocks; the next turn's token 64 is the same
    assert assert_same_second_turn(llama, head, method, first, chat) == 4 * B
    # block 2 ends the shared tokens and is followed by 5 in the first prompt, by 10 in the second: not reused
    assert assert_same_second_turn(llama, head, method, first, second) == 2 * B
    # a shared system prompt: the first request still runs, its prompt's complete blocks are read already
    assert assert_same_second_turn(llama, head, method, first, second, finish_first=False) == 2 * B


@pytest.mark.parametrize("seeded", [False, True])
@pytest.mark.parametrize("method", ["none", "parallel", "eagle3"])
def test_next_turns_of_many_chats_are_plain_decodings(llama, method, seeded):
    """Four chats' first turns, then two next turns of each (the two of a chat read its kept blocks at once), four
    at a time, in a pool that holds them all and in one of 40 blocks of 4 (kept blocks are reused for new KV,
    sequences preempted): every output plain decoding's without prefix caching, every kept block found (where none
    was reused), an oracle head's drafts accepted; greedy and seeded."""
    g = torch.Generator().manual_seed(8)
    firsts = [torch.randint(3, 150, (n,), generator=g).tolist() for n in (21, 30, 38, 25)]
    params = SamplingParams(max_tokens=10, ignore_eos=True, **(dict(temperature=0.9, seed=5) if seeded else {}))
    plain = make_engine(llama, None, "none", enable_prefix_caching=False)
    outs = [o.token_ids for o in plain.generate(firsts, params)]
    nexts = [f + o + torch.randint(3, 150, (5,), generator=g).tolist() for f, o in zip(firsts, outs) for _ in (0, 1)]
    ref = [o.token_ids for o in plain.generate(nexts, params)]
    head = None if method == "none" else OracleDrafter.of(llama, references(firsts + nexts, outs + ref), 5)
    # each first turn leaves its full blocks with KV (prompt and 9 of its 10 tokens), each next turn finds them
    kept = 2 * sum((len(f) + 9) // 4 * 4 for f in firsts)
    for pool in (None, 160):
        engine = fixed_costs(make_engine(llama, head, method, 3, max_num_seqs=4, block_size=4, kv_cache_tokens=pool))
        if head is not None:
            head.bind(engine)
        watch = Watch(engine)
        got = [o.token_ids for o in engine.generate(firsts, params)]
        got += [o.token_ids for o in engine.generate(nexts, params)]
        assert got == outs + ref, pool
        if head is not None:
            watch.check(got, outs + ref)
        assert engine.blocks.num_free == engine.blocks.num_blocks
        assert engine.blocks.hits == kept if pool is None else engine.blocks.hits > 0   # (preempted ones: their own)


def key_without_the_next_token(previous: bytes, tokens: list[int], i: int, bs: int) -> bytes:
    return hashlib.sha256(previous + array("q", tokens[i * bs:(i + 1) * bs]).tobytes()).digest()


def test_the_checks_catch_planted_faults(llama, monkeypatch):
    head = init_drafter(llama, 2, MASK, seed=6)
    first, second = turns()
    with monkeypatch.context() as m:   # block 2 reused where another token follows: the drafter's KV at 47 wrong
        m.setattr(block_manager, "block_key", key_without_the_next_token)
        with pytest.raises(AssertionError):
            assert_same_second_turn(llama, head, "parallel", first, second)

    def lagging(engine):   # the first request drafts nothing: its rows wait for the drafter, unread
        engine.scheduler.next_tree = lambda work: Tree(())
        return lambda: vars(engine.scheduler).pop("next_tree")

    assert assert_same_second_turn(llama, head, "parallel", first, first + [1, 2], lagging) == 0
    keep = BlockManager.keep
    with monkeypatch.context() as m:   # blocks kept before the drafter read their rows
        def keeps_lagging(self, s):
            lag, s.draft_lag_rows = s.draft_lag_rows, 0
            keep(self, s)
            s.draft_lag_rows = lag
        m.setattr(BlockManager, "keep", keeps_lagging)
        with pytest.raises(AssertionError):
            assert_same_second_turn(llama, head, "parallel", first, first + [1, 2], lagging)
    assert assert_same_second_turn(llama, head, "parallel", first, first + [1, 2]) == 3 * B
    lookup = BlockManager.lookup
    with monkeypatch.context() as m:   # the kept prefix's blocks in another order
        m.setattr(BlockManager, "lookup", lambda self, tokens: lookup(self, tokens)[::-1])
        with pytest.raises(AssertionError):
            assert_same_second_turn(llama, head, "parallel", first, first + [1, 2])


def test_metrics_count_prefix_cache_tokens():
    from peagle.engine.sequence import SpecStats

    m = Metrics()
    for queries, hits in ((10, 0), (30, 16)):
        m.observe_step(Snapshot(SpecStats(), 0, 0, 0.0, queries, hits))
    assert m.prefix_queries._value.get() == 30 and m.prefix_hits._value.get() == 16
