"""Attention under a token-tree mask (tree speculative decoding): a tree node sees its context and its
ancestors only, with the bits of its root-to-node path run alone as a chain (the native kernels) or
the same values up to rounding (torch's path), and writes the K/V that chain writes at its depth."""
from __future__ import annotations

import pytest
import torch

from peagle import kernels
from test_kernels import LANES, NATIVE_OFF, each_isa, native

# root (depth 0); a, b, c at depth 1; two nodes under a and one under b at depth 2; one at depth 3 under
# a's first child and one at depth 4 under it. Nodes in BFS order, node i writing its K/V at KV index p0 + i.
PARENTS = [-1, 0, 0, 0, 1, 1, 2, 4, 7]


def path(i: int) -> list[int]:
    """The nodes from the root to node ``i``."""
    return path(PARENTS[i]) + [i] if i >= 0 else []


def tree_layout(p0: int, base_at_root: bool) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """(positions, tree_base, tree_map) of the tree's rows at p0: logical key p0 + k of node i is its
    ancestor at depth k (from the root, or from depth 1 with the root read in place), unread entries -1."""
    W = max(len(path(i)) for i in range(len(PARENTS)))
    base = p0 if base_at_root else p0 + 1
    rows = [[p0 + j for j in path(i)][base - p0:] for i in range(len(PARENTS))]
    tree_map = torch.tensor([r + [-1] * (W - len(r)) for r in rows])
    return [p0 + len(path(i)) - 1 for i in range(len(PARENTS))], torch.full((len(PARENTS),), base), tree_map


def tree_case(d: int, bs: int, base_at_root: bool, H: int = 9, Hkv: int = 3, seed: int = 0):
    """Trees at p0 = 62, 64 and 125 (regions across a KEY_BLOCK boundary, p0 on and off a block) and an
    ordinary sequence's three verification rows in one pass, in shuffled blocks of a pool; then one
    sequence per tree node holding its context and its path at p0, p0+1, ... (the chains)."""
    g = torch.Generator().manual_seed(seed)
    trees, n = [62, 64, 125], len(PARENTS)
    paths = [path(i) for i in range(n)]
    ctx = [p0 + n for p0 in trees] + [70] + [p0 + len(p) for p0 in trees for p in paths]
    nbs = [-(-c // bs) for c in ctx]
    order = torch.randperm(sum(nbs), generator=g).tolist()
    tables, i = [], 0
    for nb in nbs:
        tables.append(order[i:i + nb] + [0] * (max(nbs) - nb))
        i += nb
    table = torch.tensor(tables)
    k, v = torch.randn(sum(nbs) * bs + 1, Hkv, d, generator=g) * 2, torch.randn(sum(nbs) * bs + 1, Hkv, d, generator=g)
    slot = lambda s, j: int(table[s, j // bs]) * bs + j % bs  # noqa: E731
    seq, pos, base, maps = [], [], [], []
    for s, p0 in enumerate(trees):
        ps, b, m = tree_layout(p0, base_at_root)
        seq += [s] * n
        pos += ps
        base.append(b)
        maps.append(m)
    seq += [3, 3, 3]
    pos += [67, 68, 69]
    base.append(torch.tensor([68, 69, 70]))
    maps.append(torch.full((3, maps[0].shape[1]), -1))
    chains = []  # (sequence, path) of each tree node's chain, its keys copied from the tree's slots
    for t, p0 in enumerate(trees):
        for p in paths:
            c = len(trees) + 1 + len(chains)
            src = list(range(p0)) + [p0 + j for j in p]
            dst = torch.tensor([slot(c, j) for j in range(len(src))])
            k[dst], v[dst] = k[[slot(t, j) for j in src]], v[[slot(t, j) for j in src]]
            chains.append((c, p0, p))
    q = torch.randn(len(seq), H, d, generator=g)
    as_long = lambda x: torch.tensor(x, dtype=torch.long)  # noqa: E731
    return dict(q=q, k=k, v=v, table=table, seq=as_long(seq), pos=as_long(pos), bs=bs, tree_base=torch.cat(base),
                tree_map=torch.cat(maps), trees=trees, chains=chains, slot=slot)


def chain_pass(c: dict) -> dict:
    """Each tree node's path as an ordinary sequence's rows p0 .. p0 + depth (its query the last row's)."""
    q, seq, pos, last = [], [], [], []
    n = len(PARENTS)
    for s, p0, p in c["chains"]:
        node = c["trees"].index(p0) * n + p[-1]
        q += [c["q"][node]] * len(p)
        seq += [s] * len(p)
        pos += range(p0, p0 + len(p))
        last.append(len(pos) - 1)
    return dict(q=torch.stack(q), seq=torch.tensor(seq), pos=torch.tensor(pos), last=torch.tensor(last))


def tree_f64(c: dict, window: int) -> torch.Tensor:
    """Each tree row in float64 over its context and its ancestors' keys (from PARENTS, not the map)."""
    q, k, v = c["q"], c["k"], c["v"]
    H, d, Hkv = q.shape[1], q.shape[2], k.shape[1]
    out = []
    for t, p0 in enumerate(c["trees"]):
        for i in range(len(PARENTS)):
            keys = list(range(p0)) + [p0 + j for j in path(i)]  # KV index of logical key 0 .. p0 + depth
            pos = len(keys) - 1
            keys = keys[max(0, pos - window + 1) if window else 0:]
            slots = [c["slot"](t, j) for j in keys]
            row = t * len(PARENTS) + i
            o = []
            for h in range(H):
                s = (k[slots, h // (H // Hkv)].double() @ q[row, h].double()) * d ** -0.5
                o.append(s.softmax(0) @ v[slots, h // (H // Hkv)].double())
            out.append(torch.cat(o))
    return torch.stack(out)


@each_isa()
@pytest.mark.parametrize("d,bs", [(64, 16), (24, 5)])  # 24: a tail in every lane width; 5: blocks off KEY_BLOCK
@pytest.mark.parametrize("window", [0, 3, 50])  # 3: the window cuts into the tree; 50: below it, across a block
@pytest.mark.parametrize("base_at_root", [False, True])
def test_tree_rows_get_the_bits_of_their_chains(d, bs, window, base_at_root, isa):
    """Tree rows mixed with ordinary rows: every ISA gives its reference's bits, float64's values, and each
    tree node the bits of its path run as an ordinary chain; the ordinary rows keep their own bits."""
    c = tree_case(d, bs, base_at_root)
    ch = chain_pass(c)
    tree = dict(tree_base=c["tree_base"], tree_map=c["tree_map"])
    rows, n_tree = torch.arange(len(c["q"])), len(c["trees"]) * len(PARENTS)
    exact = tree_f64(c, window)
    common = (c["k"], c["v"], c["table"])
    args = lambda q, seq, pos, rows: (q, *common, seq, pos, rows, c["bs"], window, d ** -0.5, None)  # noqa: E731
    got = torch.ops.peagle.attention(*args(c["q"], c["seq"], c["pos"], rows), isa, **tree)
    ref = torch.ops.peagle.attention_ref(*args(c["q"], c["seq"], c["pos"], rows), LANES[isa], **tree)
    assert torch.equal(got, ref), isa
    assert (got[:n_tree].double() - exact).abs().max() < 1e-5, isa
    chain = torch.ops.peagle.attention(*args(ch["q"], ch["seq"], ch["pos"], torch.arange(len(ch["q"]))), isa)
    assert torch.equal(got[:n_tree], chain[ch["last"]]), isa
    plain = torch.ops.peagle.attention(*args(c["q"], c["seq"], c["pos"], rows[n_tree:]), isa)
    assert torch.equal(got[n_tree:], plain[n_tree:]), isa
    for r in range(0, n_tree, 4):  # a row alone, out of its tile, gets its bits too
        alone = torch.ops.peagle.attention(*args(c["q"], c["seq"], c["pos"], rows[r:r + 1]), isa, **tree)
        assert torch.equal(alone[r], got[r]), (isa, r)


@native
def test_a_bad_tree_is_refused_clearly():
    c = tree_case(64, 16, False)
    args = (c["q"], c["k"], c["v"], c["table"], c["seq"], c["pos"], torch.arange(len(c["q"])), c["bs"], 0, 0.125)
    with pytest.raises(RuntimeError, match="go together"):
        torch.ops.peagle.attention(*args, tree_base=c["tree_base"])
    bad = c["tree_map"].clone()
    bad[5, 0] = c["table"].shape[1] * c["bs"]
    with pytest.raises(RuntimeError, match="outside its block table"):
        torch.ops.peagle.attention(*args, tree_base=c["tree_base"], tree_map=bad)
    with pytest.raises(RuntimeError, match="its map has"):
        torch.ops.peagle.attention(*args, tree_base=c["tree_base"], tree_map=c["tree_map"][:, :2].contiguous())


@pytest.fixture(params=["native", "torch"])
def kernels_on(request, monkeypatch) -> bool:
    """Each model test on peagle's kernels (bitwise) and on torch's path (``PEAGLE_NATIVE=0``: SDPA under masks)."""
    if request.param == "native":
        if NATIVE_OFF or not kernels.available():
            pytest.skip("the native kernels are off")
        return True
    monkeypatch.setenv("PEAGLE_NATIVE", "0")
    kernels.available.cache_clear()
    request.addfinalizer(kernels.available.cache_clear)
    return False


@pytest.mark.parametrize("fam", ["llama", "mistral", "qwen2", "qwen3"])  # mistral: window 8; qwen3: q/k norm
def test_a_tree_pass_gives_each_node_its_chain(fam, kernels_on):
    """A prefilled context, then one pass of the root and the tree's nodes beside another sequence's decoding
    row: each node's logits and written K/V are its path's run alone as a chain on a copy of the cache, and
    the other row's are its own decoding step's."""
    from conftest import native_from_hf, tiny_hf

    from peagle.models.attention import AttnMeta, Span, TreeRows

    model = native_from_hf(tiny_hf(fam))
    bs, p0, n, V = 4, 21, len(PARENTS), model.cfg.vocab_size
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, V, (p0 + 1,), generator=gen)            # the context and the root's token
    tokens = torch.cat([ids[p0:], torch.randint(0, V, (n - 1,), generator=gen)])
    other = torch.randint(0, V, (26,), generator=gen)              # a sequence decoding its 26th token
    order = torch.randperm(16, generator=gen).tolist()
    table, table_o = order[:8], order[8:]                           # shuffled blocks of 4 slots
    slot = lambda t, j: t[j // bs] * bs + j % bs  # noqa: E731
    caches = model.make_caches(16 * bs)
    with torch.inference_mode():
        model(torch.cat([ids[:p0], other[:25]]), torch.cat([torch.arange(p0), torch.arange(25)]), caches,
              AttnMeta([Span(p0, p0, table, 0), Span(25, 25, table_o, 0)], bs))
    cached = [(c.k.clone(), c.v.clone()) for c in caches]

    def run(ids, positions, spans, tree=None):
        fresh = model.make_caches(16 * bs)
        for c, (k, v) in zip(fresh, cached):
            c.k.copy_(k), c.v.copy_(v)
        with torch.inference_mode():
            return model(ids, positions, fresh, AttnMeta(spans, bs, tree=tree))[0], fresh

    positions, base, tree_map = tree_layout(p0, base_at_root=False)
    tree = TreeRows(torch.tensor([p0 + i for i in range(n)] + [25]), torch.cat([base, torch.tensor([26])]),
                    torch.cat([tree_map, torch.full((1, tree_map.shape[1]), -1)]))
    logits, tree_caches = run(torch.cat([tokens, other[25:]]), torch.tensor(positions + [25]),
                              [Span(n, p0 + n, table), Span(1, 26, table_o, 25)], tree)
    same = torch.equal if kernels_on else lambda a, b: torch.allclose(a, b, rtol=1e-5, atol=1e-5)
    for i in range(n):
        p = path(i)
        want, chain_caches = run(tokens[p], torch.arange(p0, p0 + len(p)), [Span(len(p), p0 + len(p), table, p0)])
        assert same(logits[i], want[-1]), (fam, i)
        for c, w in zip(tree_caches, chain_caches):
            got, exp = slot(table, p0 + i), slot(table, p0 + len(p) - 1)
            assert same(c.k[got], w.k[exp]) and same(c.v[got], w.v[exp]), (fam, i)
    alone, _ = run(other[25:], torch.tensor([25]), [Span(1, 26, table_o, 25)])
    assert same(logits[n], alone[0]), fam


def test_cuda_graph_metas_refuse_trees():
    from peagle.models.attention import PaddedMeta, TreeRows

    one = torch.zeros(1, dtype=torch.long)
    with pytest.raises(ValueError, match="no token-tree layout"):
        PaddedMeta(torch.zeros(1, 2, dtype=torch.long), 1, 4, tree=TreeRows(one, one + 1, one[None]))


def test_a_short_pass_computes_its_kv_slots_on_the_host_as_the_gather_does():
    """AttnMeta.prepare's host path (a decode or verify step's few rows of consecutive positions: the slot of each
    from its block table in Python, one copy) against the gather over the padded tables it replaces, on random
    ragged batches of several sequences and block sizes; past HOST_SLOT_ROWS, with a tree or rows that write
    nothing, the gather runs."""
    import random

    from peagle.models import attention
    from peagle.models.attention import AttnMeta, Span

    rng = random.Random(0)
    for _ in range(200):
        bs = rng.choice([1, 4, 16])
        spans = []
        for _ in range(rng.randrange(1, 5)):
            start, n = rng.randrange(0, 200), rng.randrange(1, 9)
            table = rng.sample(range(1000), -(-(start + n) // bs))
            spans.append(Span(n, start + n, table, start))
        positions = torch.tensor([p for s in spans for p in range(s.start, s.start + s.num_rows)])
        meta = AttnMeta(spans, bs).prepare(positions, 10_000)
        assert sum(s.num_rows for s in spans) <= attention.HOST_SLOT_ROWS
        want = meta.slots(meta.seq_of_row, positions)   # the gather over the padded tables
        assert torch.equal(meta.slot_mapping, want), (spans, bs)
        assert meta.slot_mapping.dtype == want.dtype
