"""Drafts from the target's earlier responses (peagle/engine/lookup.py's ResponseLookup): the table says what a
count over the corpus says, its drafts stop where their chance does, it loads only as it was saved and for the
vocabulary it was built on, and the engine's output stays plain decoding's while it accepts the table's drafts."""
from __future__ import annotations

import gzip
import json
import random
from collections import Counter

import numpy as np
import pytest
from conftest import native_from_hf, tiny_hf
from speculation import OracleDrafter, Watch, fixed_costs, make_engine, planted, prompts, references

from peagle.cli import main as cli_main
from peagle.engine.config import EngineConfig
from peagle.engine.lookup import RESPONSES_FILE, ResponseLookup
from peagle.engine.sampling import SamplingParams
from peagle.engine.scheduler import Scheduler
from peagle.engine.llm_engine import load_response_lookup
from peagle.models.loader import ModelNotFoundError


def counted(responses: list[list[int]], orders: int, min_count: int, least_share: float):
    """The reference: per context of 1..orders tokens inside one response, a Counter of what came next; the
    contexts the table keeps (seen min_count times, the top follower's share at least least_share)."""
    after: dict[tuple[int, ...], Counter] = {}
    for r in responses:
        for i in range(1, len(r)):
            for n in range(1, min(orders, i) + 1):
                after.setdefault(tuple(r[i - n:i]), Counter())[r[i]] += 1
    kept = {}
    for ctx, c in after.items():
        total, best = sum(c.values()), max(c.values())
        if total >= min_count and best >= least_share * total:
            kept[ctx] = (min(t for t, n in c.items() if n == best), best * 255 // total / 255)
    return kept


def follower(kept, context: list[int], orders: int):
    for n in range(min(orders, len(context)), 0, -1):
        if tuple(context[len(context) - n:]) in kept:
            return kept[tuple(context[len(context) - n:])]
    return None


def corpus(seed: int, vocab: int, n: int = 60) -> list[list[int]]:
    """Responses that share phrases (a few fixed runs spliced into random text), as a model's answers do."""
    rng = random.Random(seed)
    phrases = [[rng.randrange(vocab) for _ in range(rng.randrange(2, 6))] for _ in range(6)]
    out = []
    for _ in range(n):
        r = []
        while len(r) < rng.randrange(5, 40):
            r += rng.choice(phrases) if rng.random() < 0.5 else [rng.randrange(min(vocab, 12))]
        out.append(r)
    return out


@pytest.mark.parametrize("vocab,orders", [(50, 4), (40000, 4), (262144, 3)])
@pytest.mark.parametrize("min_count,least_share", [(1, 0.0), (2, 0.1), (3, 0.4)])
def test_the_table_answers_as_a_count_does(vocab, orders, min_count, least_share):
    """Every context of the corpus and random ones: the longest kept suffix's top follower (ties: the lowest id)
    and its share, as a count over the responses says; contexts never packed across two responses; a 262,144-token
    vocabulary (Gemma 3's) takes 18 bits a token, so 3 of them a context."""
    rs = corpus(vocab + min_count, vocab)
    table = ResponseLookup.build(rs, vocab, min_count, least_share)
    assert table.orders == orders
    kept = counted(rs, orders, min_count, least_share)
    assert sum(map(len, table.keys)) == len(kept)
    rng = random.Random(1)
    contexts = [r[:i] for r in rs for i in range(1, len(r))] + \
        [[rng.randrange(min(vocab, 12)) for _ in range(rng.randrange(1, 7))] for _ in range(300)]
    hits = 0
    for ctx in contexts:
        want, got = follower(kept, ctx, orders), table.follower(ctx)
        assert got == (None if want is None else (want[0], pytest.approx(want[1]))), ctx
        hits += got is not None
    assert hits > len(contexts) // 4   # (the comparison is not all misses)
    assert table.follower([rs[0][-1], rs[1][0]]) == follower(kept, [rs[0][-1], rs[1][0]], orders)


def test_drafts_stop_where_their_chance_does():
    """Each draft the top follower of the context so far (the drafts before it included); drafting stops at ``k``
    or where the product of the shares would fall below the least chance."""
    rs = [[1, 2, 3, 4, 5]] * 4 + [[1, 2, 3, 9]] * 2 + [[7, 7, 8]] * 3
    table = ResponseLookup.build(rs, 16, min_count=1)
    kept = counted(rs, 4, 1, 0.1)
    assert table.propose([6, 1], 5, least_chance=0.0) == [2, 3, 4, 5]   # after 5 nothing follows
    assert table.propose([6, 1], 2, least_chance=0.0) == [2, 3]
    # [1, 2, 3] -> 4 in 4 of 6: the chain's chance falls to 1 * 1 * 4/6
    share = kept[(1, 2, 3)][1]
    assert table.propose([1], 4, least_chance=share + 0.01) == [2, 3]
    assert table.propose([1], 4, least_chance=share - 0.01) == [2, 3, 4, 5]
    assert table.propose([15], 3) == []   # a token never seen


def test_a_table_saves_and_loads_whole_or_says_why_not(tmp_path):
    rs = corpus(3, 300)
    table = ResponseLookup.build(rs, 300)
    path = tmp_path / "t.npz"
    table.save(path)
    assert not list(tmp_path.glob("*.tmp*"))
    back = ResponseLookup.load(path, 300)
    for a, b in zip(table.keys + table.tokens + table.shares, back.keys + back.tokens + back.shares):
        assert np.array_equal(a, b) and a.dtype == b.dtype
    assert back.meta == table.meta and back.meta["responses"] == len(rs)
    wider = ResponseLookup.load(path, 49152)   # a target with more ids: its table fits, and its new ids are not in it
    assert wider.follower(rs[0][:3]) == table.follower(rs[0][:3])
    assert wider.follower(rs[0][:3] + [40000]) is None and wider.follower([rs[0][0], 1 << 9 | rs[0][1]]) is None
    assert wider.follower([1 << 9 | rs[0][0], rs[0][1]]) == table.follower([rs[0][1]])
    with pytest.raises(ValueError, match="300-token vocabulary, the target has 299"):
        ResponseLookup.load(path, 299)
    cut = tmp_path / "cut.npz"
    cut.write_bytes(path.read_bytes()[:len(path.read_bytes()) // 2])
    with pytest.raises(ValueError, match="not a response lookup table"):
        ResponseLookup.load(cut, 300)
    other = tmp_path / "other.npz"
    np.savez(other, x=np.zeros(3))
    with pytest.raises(ValueError, match="not a response lookup table"):
        ResponseLookup.load(other, 300)
    bad = tmp_path / "bad.npz"
    arrays = {f"{k}1": v for k, v in (("keys", table.keys[0]), ("tokens", table.tokens[0][:-1]),
                                      ("shares", table.shares[0]))}
    np.savez(bad, bits=np.asarray(table.bits), meta=np.asarray(json.dumps(table.meta)), **arrays)
    with pytest.raises(ValueError, match="mismatched"):
        ResponseLookup.load(bad, 300)


def test_the_table_is_found_beside_the_head_and_refused_when_missing(tmp_path):
    head = tmp_path / "head"
    head.mkdir()
    cfg = EngineConfig()
    assert load_response_lookup(cfg, tmp_path / "target", head, 300) is None   # none beside it: off
    ResponseLookup.build(corpus(4, 300), 300).save(head / RESPONSES_FILE)
    assert load_response_lookup(cfg, tmp_path / "target", head, 300) is not None
    assert load_response_lookup(EngineConfig(response_lookup="none"), tmp_path / "target", head, 300) is None
    assert load_response_lookup(EngineConfig(method="none"), tmp_path / "target", head, 300) is None
    explicit = EngineConfig(response_lookup=str(head / RESPONSES_FILE))
    assert load_response_lookup(explicit, tmp_path / "target", None, 300) is not None
    with pytest.raises(ModelNotFoundError, match="no response lookup table at"):
        load_response_lookup(EngineConfig(response_lookup=str(tmp_path / "nope.npz")), tmp_path, None, 300)
    with pytest.raises(ValueError, match="response_lookup is"):
        EngineConfig(response_lookup="")


def test_index_responses_tables_a_synth_folder(tmp_path, capsys):
    """``peagle index-responses`` reads a ``peagle synth`` folder (finished shards gzipped, the open one not)."""
    rs = corpus(5, 300)
    data = tmp_path / "synth"
    data.mkdir()
    record = lambda i, r: json.dumps({"id": str(i), "response": "", "prompt_token_ids": [1],  # noqa: E731
                                      "response_token_ids": r}) + "\n"  # what peagle synth writes
    with gzip.open(data / "responses-00000.jsonl.gz", "wt") as f:
        f.writelines(record(i, r) for i, r in enumerate(rs[:30]))
    (data / "responses-00001.jsonl").write_text("".join(record(i, r) for i, r in enumerate(rs[30:])))
    out = tmp_path / "t.npz"
    assert cli_main(["index-responses", str(data), "--out", str(out), "--vocab-size", "300"]) == 0
    assert "indexed 60 responses" in capsys.readouterr().err
    want = ResponseLookup.build(rs, 300)
    got = ResponseLookup.load(out, 300)
    assert all(np.array_equal(a, b) for a, b in zip(want.keys + want.tokens, got.keys + got.tokens))
    (tmp_path / "empty").mkdir()
    assert cli_main(["index-responses", str(tmp_path / "empty"), "--out", str(out)]) != 0
    assert "no responses in" in capsys.readouterr().err


@pytest.fixture(scope="module")
def llama():
    return native_from_hf(tiny_hf("llama"))


@pytest.mark.parametrize("method", ["ngram", "parallel"])
def test_the_tables_drafts_are_accepted_and_the_output_is_plain_decodings(llama, method, monkeypatch):
    """A table of the target's own earlier responses (its plain outputs for other prompts, and for these), and
    for P-EAGLE an always-wrong head under ``auto`` (it settles at K=0) with prompt lookup off, for ``ngram``
    prompt lookup on (the table drafts where it finds nothing): the table's drafts verified are its proposals,
    they are accepted, and the output is plain decoding's, greedy and through the sampler (top-k 1, seeded); a
    verifier that rejects everything is caught."""
    earlier, ps = prompts(8, seed=3), prompts(4, seed=4)
    ps = [p[:2] + e for p, e in zip(ps, earlier)]
    params = SamplingParams(max_tokens=64, ignore_eos=True)
    table = ResponseLookup.build([o.token_ids for o in make_engine(llama, None, "none").generate(earlier, params)]
                                 + [o.token_ids for o in make_engine(llama, None, "none").generate(ps, params)],
                                 llama.cfg.vocab_size, min_count=1)
    next_drafts, seen = Scheduler._next_drafts, []

    def spy(self, seq, v, tree):
        next_drafts(self, seq, v, tree)
        if seq.drafts_from == "responses":
            seen.append(list(seq.drafts) == self.responses.propose(seq.tokens, len(seq.drafts)))

    monkeypatch.setattr(Scheduler, "_next_drafts", spy)
    for params in (SamplingParams(max_tokens=64, ignore_eos=True),
                   SamplingParams(max_tokens=64, ignore_eos=True, temperature=0.8, top_k=1, seed=5)):
        ref = [o.token_ids for o in make_engine(llama, None, "none").generate(ps, params)]
        head = OracleDrafter.of(llama, references(ps, ref), wrong_every=1) if method == "parallel" else None

        def run(fault=None):
            engine = make_engine(llama, head, method, "auto", table, max_num_seqs=4,
                                 prompt_lookup_max=4 if method == "ngram" else 0)
            if head is not None:
                engine = fixed_costs(head.bind(engine))
            watch = Watch(planted(fault, engine) if fault else engine)
            return watch, [o.token_ids for o in engine.generate(ps, [params] * 4)]

        seen.clear()
        watch, got = run()
        assert seen and all(seen)
        watch.check(got, ref, rate=0.2)
        watch, got = run("reject_all")
        with pytest.raises(AssertionError, match="accepted"):
            watch.check(got, ref, rate=0.2)

