"""Token trees from one drafting pass (peagle/engine/tree.py): the tree's shape, verification on the
device against a plain walk, and the engine's output with trees equal to plain decoding, greedy and
seeded, with the trees' near misses accepted."""
from __future__ import annotations

import random

import pytest
import torch
from conftest import native_from_hf, tiny_hf
from speculation import (TREE_FAULTS, RunnerUpOracle, Watch, assert_caught, fixed_costs, make_engine, oracle_run,
                         prompts, references)
from test_engine import assert_has_power, assert_matches

from peagle import kernels
from peagle.engine.config import Bounds
from peagle.engine.llm_engine import EngineConfig
from peagle.engine.sampling import SamplingParams, probs_from_logits, sample_tokens
from peagle.engine.tree import Tree, TreeBatch, accept_paths, accept_paths_torch, best_first


@pytest.fixture(scope="module")
def llama():
    return native_from_hf(tiny_hf("llama"))


# --------------------------------------------------------------------------- the tree's shape

def test_trees_parse_sort_and_refuse_bad_shapes():
    t = Tree.parse("[(0, 1), (1,), (0,), (0, 0)]")
    assert t.paths == ((0,), (1,), (0, 0), (0, 1)) and t.depth == 2 and t.ranks == 2 and len(t) == 4
    assert t.parents == [0, 0, 0, 1, 1] and t.depths == [0, 1, 1, 2, 2] and t.lineage[4] == [0, 1, 4]
    assert t.nodes_per_depth == [2, 2] and t.cut(1).paths == ((0,), (1,)) and not t.is_chain
    assert Tree.chain(3).is_chain and str(Tree.chain(3)) == "chain" and Tree.chain(0).depth == 0
    assert t.tokens([[10, 11], [20, 21]]) == [10, 11, 20, 21]
    for bad, msg in [("[(0, 0)]", "no parent"), ("[(0,), (0,)]", "twice"), ("[()]", "non-empty"), ("[(-1,)]", "ranks"),
                     ("[(99,)]", "ranks"), ("(0,", "list of tuples"), ("[]", "at least one"), ("5", "list of tuples")]:
        with pytest.raises(ValueError, match=msg):
            Tree.parse(bad)


def test_best_first_orders_nodes_by_path_acceptance():
    accept = [[0.6, 0.3, 0.05], [0.5, 0.2, 0.1], [0.4, 0.1, 0.0]]
    nodes, probs = best_first(accept, 10, 3)
    assert nodes[:4] == [(0,), (0, 0), (1,), (1, 0)] and probs == sorted(probs, reverse=True)
    for n in range(len(nodes) + 1):   # every prefix is a tree
        Tree(tuple(nodes[:n]))
    assert all(len(p) <= 2 for p in best_first(accept, 10, 2)[0]) and best_first(accept, 5, 0) == ([], [])


def walk(y: list[int], tree: Tree, tokens: list[int]) -> tuple[int, int, list[int]]:
    """Verification as a plain walk from the root: follow the child whose token is the node's y."""
    node, path = 0, [0]
    while True:
        child = next((i for i in range(1, len(tree) + 1) if tree.parents[i] == node and tokens[i - 1] == y[node]), None)
        if child is None:
            return len(path) - 1, y[node], path
        node = child
        path.append(node)


def random_tree(rng: random.Random, nodes: int, ranks: int, depth: int) -> Tree:
    paths = set()
    nodes = min(nodes, sum(ranks ** d for d in range(1, depth + 1)))   # what fits
    while len(paths) < nodes:
        parent = rng.choice([()] + [p for p in paths if len(p) < depth])
        paths.add(parent + (rng.randrange(ranks),))
    return Tree(tuple(paths))


@pytest.mark.parametrize("form", ["native", "torch"])
def test_verification_on_the_device_is_the_walk_over_random_trees(form):
    """Property test over 300 random trees in batches: the accepted count, the emitted token and the path
    equal a plain walk's, whatever the shapes padded together (y drawn so that deep paths happen); peagle's
    CPU op (``peagle::accept_paths``) and the torch form give the same tensors, the paths' padding included."""
    if form == "native" and not kernels.native(torch.device("cpu")):
        pytest.skip("native kernels not built")
    verify = accept_paths if form == "native" else accept_paths_torch
    rng = random.Random(0)
    for _ in range(60):
        trees = [random_tree(rng, rng.randint(0, 12), rng.randint(1, 4), rng.randint(1, 5)) for _ in range(5)]
        # distinct candidates per position (as top-k gives)
        cands = [[rng.sample(range(8), 4) for _ in range(5)] for _ in trees]
        toks = [t.tokens(c) for t, c in zip(trees, cands)]
        ys = [[rng.choice(c[min(t.depths[i], 4)][:2] + [7]) for i in range(len(t) + 1)] for t, c in zip(trees, cands)]
        first = [0, 20, 40, 60, 80]
        logits_rows = torch.zeros(100, dtype=torch.long)
        for f, y in zip(first, ys):
            logits_rows[f:f + len(y)] = torch.tensor(y)
        tb = TreeBatch.of(trees, toks, first, torch.device("cpu"))
        a, tok, path = verify(logits_rows[tb.rows], tb)
        assert all(torch.equal(u, v) for u, v in zip((a, tok, path), accept_paths_torch(logits_rows[tb.rows], tb)))
        for b, (t, tk, y) in enumerate(zip(trees, toks, ys)):
            na, ntok, npath = walk(y, t, tk)
            assert (int(a[b]), int(tok[b]), path[b, :na + 1].tolist()) == (na, ntok, npath)


# --------------------------------------------------------------------------- the engine with trees

TREES = ["[(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 1, 0)]", "[(0,), (1,), (2,)]", "auto"]


def tree_rate(tree: str) -> float:
    """A third of what a tree's nodes can be accepted at most (one a depth); auto's trees vary: a tenth."""
    return 1 / 10 if tree == "auto" else Tree.parse(tree).depth / len(Tree.parse(tree)) / 3


@pytest.mark.parametrize("tree,wrong_every", list(zip(TREES, (2, 3, 2))), ids=["explicit", "wide", "auto"])
def test_greedy_trees_are_plain_decoding_token_for_token(llama, tree, wrong_every):
    """A runner-up oracle (each sequence's continuation; where it is wrong, the right token its second
    choice), trees explicit and chosen, 4 prompts batched: the output is plain decoding's token for token,
    drafts are accepted, and a planted fault is caught (a verifier rejecting everything, the accepted path's
    KV left in its tree slots or another path's moved); alone, the right second choices are accepted (AL
    above the chain's with the same head)."""
    ps = prompts(4, seed=7)
    params = SamplingParams(max_tokens=64, ignore_eos=True)   # (auto's trees begin after its plain warm-up)
    ref = [o.token_ids for o in make_engine(llama, None, "none").generate(ps, params)]
    k = 3 if tree != "auto" else 4
    head = RunnerUpOracle.of(llama, references(ps, ref), wrong_every)
    run = oracle_run(llama, head, "parallel", k, ps, params, speculative_token_tree=tree)
    _, watch, got = run()
    watch.check(got, ref, rate=tree_rate(tree))
    for fault in TREE_FAULTS:
        assert_caught(fault, run, ref, rate=tree_rate(tree))
    oracle = RunnerUpOracle.of(llama, ps[0] + ref[0], wrong_every)
    outs = {}
    depth = k if tree == "auto" else Tree.parse(tree).depth   # against the chain as deep as the tree
    for shape in ("chain", tree):   # auto on fixed costs: rows nearly free, so the tree pays
        engine = fixed_costs(make_engine(llama, oracle, "parallel", depth if shape == "chain" else k,
                                         speculative_token_tree=shape))
        outs[shape] = engine.generate(ps[:1], params)[0]
        assert outs[shape].token_ids == ref[0], shape
    assert outs[tree].stats.acceptance_length > 1.3 * outs["chain"].stats.acceptance_length
    assert sum(outs[tree].stats.drafted_per_pos) == outs[tree].stats.num_draft_tokens


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.9, top_k=20, max_tokens=30, seed=11),
                                    SamplingParams(temperature=1.2, top_p=0.9, max_tokens=30, seed=3)],
                         ids=["t.9-k20", "t1.2-p.9"])
def test_seeded_trees_are_plain_sampling_token_for_token(llama, params):
    """Position-keyed sampling: with a seed, the tree's output is plain decoding's, whatever the tree, with
    a runner-up oracle's drafts of the seeded output accepted; planted faults are caught."""
    ps = prompts(3, seed=9)
    ref = [o.token_ids for o in make_engine(llama, None, "none").generate(ps, params)]
    head = RunnerUpOracle.of(llama, references(ps, ref), 3)
    for tree in TREES[:2]:
        run = oracle_run(llama, head, "parallel", 3, ps, params, speculative_token_tree=tree)
        _, watch, got = run()
        watch.check(got, ref, rate=tree_rate(tree))
    for fault in TREE_FAULTS:
        assert_caught(fault, run, ref, rate=tree_rate(tree))


def test_tree_sampling_keeps_the_target_distribution():
    """The first emitted token follows p whatever the tree drafts at depth 1 (its likeliest tokens, a
    zero-probability one among them), with temperature and top-k: 12,000 seeds, chi-square at p = 0.001."""
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(6, 12, generator=g) * 2
    params = SamplingParams(temperature=0.9, top_k=8)
    p = probs_from_logits(logits, params)
    order = p[0].argsort(descending=True).tolist()
    tree = Tree.parse("[(0,), (1,), (2,), (0, 0), (1, 0)]")
    drafts = [order[0], order[1], order[-1], int(p[1].argmax()), int(p[2].argmax())]
    tb = TreeBatch.of([tree], [drafts], [0], torch.device("cpu"))
    n = 12000
    assert_has_power(p[0], n)
    counts = torch.zeros(12)
    for seed in range(n):
        y = sample_tokens(logits, params, seed, [5 + d for d in tree.depths])
        a, tok, path = accept_paths(y[None], tb)
        counts[drafts[int(path[0, 1]) - 1] if int(a) >= 1 else int(tok)] += 1
    assert_matches(counts, p[0], n)


def test_tree_config_is_checked():
    with pytest.raises(ValueError, match="parallel drafting"):
        EngineConfig(method="eagle3", speculative_token_tree="auto")
    with pytest.raises(ValueError, match="deep"):
        EngineConfig(num_speculative_tokens=1, speculative_token_tree="[(0,), (0, 0)]")
    with pytest.raises(ValueError, match="no parent"):
        EngineConfig(speculative_token_tree="[(1, 0)]")
    with pytest.raises(ValueError, match="budget"):
        EngineConfig(speculative_token_tree="auto", speculative_tree_budget=0)


def test_a_config_reads_no_library_and_the_engine_start_checks_the_kernels_tree_limit(monkeypatch):
    """Building an EngineConfig (a tree, a budget) is validation alone: with the kernels' loader and limits made to
    fail, configs still build; the kernels' node limit is checked where the engine starts (Bounds.of), naming it."""
    def no_library():
        raise AssertionError("a config loaded or read the kernels' library")

    monkeypatch.setattr(kernels, "available", no_library)
    monkeypatch.setattr(kernels, "limits", no_library)
    wide = "[" + ", ".join(f"({r},)" for r in range(16)) + "]"
    for kw in ({"speculative_token_tree": "auto", "speculative_tree_budget": 62}, {"speculative_token_tree": wide},
               {"speculative_token_tree": "chain", "num_speculative_tokens": 5}):
        EngineConfig(**kw)
    monkeypatch.setattr(kernels, "limits", lambda: kernels.Limits(tree_nodes=15))
    assert Bounds.of(EngineConfig(speculative_token_tree="auto", speculative_tree_budget=13), None, 512).max_nodes == 15
    with pytest.raises(ValueError, match="speculative_tree_budget 14 .* at most 15 nodes"):
        Bounds.of(EngineConfig(speculative_token_tree="auto", speculative_tree_budget=14), None, 512)
    with pytest.raises(ValueError, match="a token tree of 16 nodes: .* at most 15 nodes"):
        Bounds.of(EngineConfig(speculative_token_tree=wide, num_speculative_tokens=1), None, 512)


def test_only_the_accepted_paths_kv_stays_where_a_chain_keeps_it(llama):
    """After tree steps, the target's KV of every cached position equals plain decoding's (the accepted
    nodes' KV moved from their tree slots to their depths; rejected branches left nothing behind): bit for
    bit on the CPU kernels (a row's result does not depend on the rows beside it), else up to rounding."""
    p = prompts(1, seed=12)[0]
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    ref = make_engine(llama, None, "none").generate([p], params)[0].token_ids
    kv = []
    for engine in (make_engine(llama, None, "none"),
                   make_engine(llama, RunnerUpOracle.of(llama, p + ref, 2), "parallel", 3, speculative_token_tree=TREES[0])):
        seq = engine.add_request(p, params)
        while seq.num_cached < len(p) + 30:
            engine.step()
        n = len(p) + 30
        slots = torch.tensor([seq.block_table[q // 16] * 16 + q % 16 for q in range(n)])
        kv.append([torch.cat([c.k[slots], c.v[slots]]) for c in engine.runner.target_caches])
    assert seq.stats.accepted_per_pos[1] > 0   # paths two deep were accepted
    for a, b in zip(*kv):
        if kernels.native(torch.device("cpu")):
            assert torch.equal(a, b)
        else:
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_move_rows_reads_every_source_before_writing():
    """The native op that moves the accepted path's KV in every layer equals torch's gather-then-scatter,
    a destination that is also a source included."""
    if not kernels.native(torch.device("cpu")):
        pytest.skip("native kernels not built")
    pools = [torch.randn(40, 3, 8) for _ in range(4)]
    src, dst = torch.tensor([5, 9, 2, 7]), torch.tensor([1, 2, 3, 4])
    want = [p.clone() for p in pools]
    for w in want:
        w[dst] = w[src].clone()
    torch.ops.peagle.move_rows(pools, src, dst)
    assert all(torch.equal(a, b) for a, b in zip(pools, want))


@pytest.mark.parametrize("budget,chunk,long", [(24, None, list(range(3, 90))),
                                               (200, 100, [3 + 7 * i % 150 for i in range(150)])],
                         ids=["short-chunks", "chunks-over-64"])
def test_trees_share_steps_with_chunked_prefill_and_late_arrivals(llama, budget, chunk, long):
    """Continuous batching: a long prompt prefilled in chunks of a token budget shares steps with sequences
    verifying trees (chunks over 64 rows are cut into the attention kernel's spans beside the trees' rows), and
    requests arrive while others decode; every output is plain decoding's, with a runner-up oracle's drafts
    accepted beside the chunks; planted faults are caught."""
    ps = prompts(3, seed=13) + [long]
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    ref = [o.token_ids for o in make_engine(llama, None, "none").generate(ps, params)]
    head = RunnerUpOracle.of(llama, references(ps, ref), 3)

    def run(patch=lambda e: e):
        engine = patch(head.bind(make_engine(llama, head, "parallel", 3, speculative_token_tree=TREES[0],
                                             max_num_batched_tokens=budget, long_prefill_token_threshold=chunk,
                                             max_num_seqs=4)))
        watch = Watch(engine)
        seqs = [engine.add_request(p, params) for p in ps[:2]]
        for _ in range(3):
            engine.step()
        seqs += [engine.add_request(p, params) for p in ps[2:]]
        while engine.has_unfinished():
            engine.step()
        return engine, watch, [s.output_ids for s in seqs]

    _, watch, got = run()
    watch.check(got, ref, rate=tree_rate(TREES[0]), crossing="chunk")
    for fault in TREE_FAULTS:
        assert_caught(fault, run, ref, rate=tree_rate(TREES[0]), crossing="chunk")
