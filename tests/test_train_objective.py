"""The training objective sees what inference sees: the training forward of every (anchor, depth)
element equals the drafter's output in the engine's own paged-cache passes, for P-EAGLE and for
EAGLE-3; documents packed together do not see each other; sequence partition changes nothing but
memory; position sampling keeps what docs/design.md ("Training") says."""
from __future__ import annotations

import pytest
import torch
from conftest import kernels_on, native_from_hf, tiny_hf

from peagle.engine.llm_engine import EngineConfig, LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.models.drafter import Drafter, DrafterConfig
from peagle.models import attention
from peagle.models.attention import AttnMeta
from peagle.train.data import target_view, target_views
from peagle.train.head import TrainHead
from peagle.train.objective import (Batch, Doc, Objective, Piece, chain_mask, evaluate, num_segments, pieces,
                                       sample_elements)

MASK = 159
K = 5


@pytest.fixture(scope="module")
def target():
    return native_from_hf(tiny_hf("llama"))


def make_doc(target, n: int, prompt_len: int, seed: int) -> Doc:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 150, (n,), generator=g)
    taps, final, argmax = target_view(target, ids.tolist())
    return Doc(ids, prompt_len, taps, final, argmax)


def test_documents_sharing_a_prefill_each_get_their_own_view(target):
    """Online states come from prefills that several documents share (:func:`target_views`), each its own
    sequence: a document's taps, final states and argmax are those of its prefill alone, whatever shares
    it (the same bits on peagle's batch-invariant CPU kernels; within rounding on torch's matmul)."""
    g = torch.Generator().manual_seed(5)
    docs = [torch.randint(3, 150, (n,), generator=g).tolist() for n in (9, 70, 3, 33, 120)]
    alone = [target_view(target, d) for d in docs]
    for budget in (4096, 80, 1):   # all in one prefill; groups of about 80 tokens; one each
        for a, b in zip(alone, target_views(target, docs, budget=budget)):
            for x, y in zip(a, b):
                torch.testing.assert_close(y, x, rtol=0, atol=0) if kernels_on() else torch.testing.assert_close(y, x)


def make_head(target, seed=0, dtype=torch.float32) -> TrainHead:
    draft_ids = torch.arange(0, 160, 2)  # half the vocabulary: some labels fall outside it
    head = TrainHead.for_target(target, 2, draft_ids, MASK, trained_k=K, seed=seed)
    with torch.no_grad():  # make the learned pieces differ from their initial copies
        head.mask_embedding.normal_()
        head.mask_hidden.normal_()
    return head.to(dtype)


def inference_pass(drafter, ids, hidden, positions):
    """One drafter pass over a fresh paged cache holding exactly these rows (positions 0..)."""
    n = ids.shape[0]
    meta = AttnMeta.single(torch.arange(n), 0, n)
    return drafter(ids, hidden, positions, drafter.make_caches(n), meta)


def training_forward(target, method: str, seed: int):
    """A document, the head's training forward over all its elements, and the same head as a plain drafter."""
    doc = make_doc(target, 40, 12, seed=seed)
    head = make_head(target)
    obj = Objective(head, method, K, target.lm_weight[head.to_target_ids(torch.arange(80))])
    batch = Batch.pack([doc])
    el = sample_elements(batch, K, 1.0, 1.0, None)
    with torch.no_grad():
        return doc, el, obj.hidden(batch, el), head.to_drafter()


def test_peagle_training_forward_equals_inference(target):
    doc, el, train_out, drafter = training_forward(target, "peagle", seed=1)
    for a in (11, 20, 33):
        # the engine's drafter batch after verifying up to position a: x[1..a+1] paired with g[0..a],
        # then K-1 mask slots (docs/design.md, "One round of parallel drafting")
        ids = torch.cat([doc.ids[1:a + 2], torch.full((K - 1,), MASK)])
        with torch.no_grad():
            hidden = torch.cat([drafter.project(doc.taps[:a + 1]), drafter.mask_feature().expand(K - 1, -1)])
            normed, _ = inference_pass(drafter, ids, hidden, torch.arange(a + K))
        for d in range(K):
            row = ((el.tok == a) & (el.depth == d)).nonzero()
            if row.numel():
                torch.testing.assert_close(train_out[row[0, 0]], normed[a + d], atol=1e-5, rtol=1e-5)


def test_eagle3_training_forward_equals_autoregressive_inference(target):
    doc, el, train_out, drafter = training_forward(target, "eagle3", seed=2)
    a = 25
    n = a + K
    caches, slots = drafter.make_caches(n), torch.arange(n)
    with torch.no_grad():
        # first pass: verified context; then one row per depth: token x[a+d+1] and the head's own
        # pre-norm output of the previous row (the engine's EAGLE-3 loop, fed the true tokens)
        pos = torch.arange(a + 1)
        normed, pre = drafter(doc.ids[1:a + 2], drafter.project(doc.taps[:a + 1]), pos, caches,
                              AttnMeta.single(slots, 0, a + 1))
        outs, h = [normed[a]], pre[a:a + 1]
        for d in range(1, K):
            p = torch.tensor([a + d])
            normed, h = drafter(doc.ids[a + d + 1:a + d + 2], h, p, caches,
                                AttnMeta.single(slots, a + d, a + d + 1))
            outs.append(normed[0])
    for d in range(K):
        row = ((el.tok == a) & (el.depth == d)).nonzero()[0, 0]
        torch.testing.assert_close(train_out[row], outs[d], atol=1e-5, rtol=1e-5)


def test_engine_drafts_are_the_training_elements(target, monkeypatch):
    """Black box over the engine: record each drafter pass of a greedy P-EAGLE generation (its
    normed rows and their positions) and the rows it turns into drafts (those handed to
    ``Drafter.logits``), then run the training objective over the finished document (prompt +
    output). Each draft row at position ``a + d`` after anchor ``a`` (the bonus row) must equal the
    training element ``(a, d)``: a shifted hidden map, token or position in the engine fails here."""
    head = make_head(target)
    drafter = head.to_drafter()
    passes, drafted = [], []
    forward, logits = Drafter.forward, Drafter.logits

    def recording_forward(self, ids, hidden, positions, caches, meta, keep=None):   # (the rows it outputs)
        normed, pre = forward(self, ids, hidden, positions, caches, meta, keep)
        passes.append((positions.clone() if keep is None else positions[keep], normed.clone()))
        return normed, pre

    def recording_logits(self, normed):
        drafted.append((len(passes) - 1, normed.clone()))
        return logits(self, normed)

    monkeypatch.setattr(Drafter, "forward", recording_forward)
    monkeypatch.setattr(Drafter, "logits", recording_logits)
    prompt = torch.randint(3, 150, (12,), generator=torch.Generator().manual_seed(8)).tolist()
    engine = LLMEngine(target, drafter, EngineConfig(method="parallel", num_speculative_tokens=K, max_num_seqs=1))
    out = engine.generate([prompt], SamplingParams(max_tokens=40, ignore_eos=True))[0]
    monkeypatch.undo()

    ids = prompt + out.token_ids
    taps, final, argmax = target_view(target, ids)
    batch = Batch.pack([Doc(torch.tensor(ids), len(prompt), taps, final, argmax)])
    el = sample_elements(batch, K, 1.0, 1.0, None)
    obj = Objective(head, "peagle", K, target.lm_weight[head.to_target_ids(torch.arange(80))])
    with torch.no_grad():
        train_out = obj.hidden(batch, el)
    seen = set()
    for i, rows in drafted:
        positions, normed = passes[i]
        at = [int((normed == row).all(1).nonzero()[0, 0]) for row in rows]  # which rows of the pass
        pos = positions[at]
        a = int(pos.min())                              # the bonus row: depth 0 of this anchor
        assert pos.tolist() == list(range(a, a + K))
        for j, p in enumerate(pos.tolist()):
            match = ((el.tok == a) & (el.depth == p - a)).nonzero()
            if match.numel():                           # the label exists inside the document
                torch.testing.assert_close(rows[j], train_out[match[0, 0]], atol=1e-4, rtol=1e-4)
                seen.add((a, p - a))
    assert len({a for a, _ in seen}) >= 5 and {d for _, d in seen} == set(range(K))


@pytest.mark.parametrize("method", ["peagle", "eagle3"])
def test_hard_labels_are_the_targets_greedy_token_in_draft_ids(target, method):
    """``labels="hard"``: cross-entropy against the target's argmax, spelled here by a dictionary
    from target to draft ids; soft labels give a different loss on the same elements."""
    doc = make_doc(target, 40, 12, seed=5)
    head = make_head(target)
    rows = target.lm_weight[head.to_target_ids(torch.arange(80))]
    batch = Batch.pack([doc])
    el = sample_elements(batch, K, 1.0, 1.0, None)
    draft_of = {int(t): d for d, t in enumerate(head.to_target_ids(torch.arange(80)))}
    with torch.no_grad():
        normed = Objective(head, method, K, rows).hidden(batch, el)
        loss, _, supervised = Objective(head, method, K, rows, labels="hard").score(batch, el, normed)
        soft, _, _ = Objective(head, method, K, rows).score(batch, el, normed)
    want = batch.argmax[el.tok + el.depth + 1]
    assert supervised.tolist() == [int(w) in draft_of for w in want] and 0 < int(supervised.sum()) < len(el)
    labels = torch.tensor([draft_of[int(w)] for w in want[supervised]])
    logp = torch.log_softmax(head.logits(normed[supervised]).float(), -1)
    torch.testing.assert_close(loss, -logp[torch.arange(len(labels)), labels].sum())
    assert not torch.isclose(loss, soft)
    with pytest.raises(ValueError, match="labels"):
        Objective(head, method, K, rows, labels="argmax")


@pytest.mark.parametrize("method", ["peagle", "eagle3"])
def test_packed_documents_do_not_see_each_other(target, method):
    docs = [make_doc(target, 30, 8, seed=3), make_doc(target, 22, 5, seed=4)]
    head = make_head(target)
    obj = Objective(head, method, K, target.lm_weight[head.to_target_ids(torch.arange(80))])
    packed = Batch.pack(docs)
    el = sample_elements(packed, K, 1.0, 1.0, None)
    with torch.no_grad():
        out = obj.hidden(packed, el)
        offset = 0
        for doc in docs:
            alone = Batch.pack([doc])
            el1 = sample_elements(alone, K, 1.0, 1.0, None)
            out1 = obj.hidden(alone, el1)
            for i in range(len(el1)):
                j = ((el.tok == el1.tok[i] + offset) & (el.depth == el1.depth[i])).nonzero()[0, 0]
                torch.testing.assert_close(out[j], out1[i], atol=1e-5, rtol=1e-5)
            offset += len(doc.ids)


def dense_chain(q, k, v, m):
    """The attention the trainer ran before it was chunked: every query scored against every key
    under a dense mask, here spelled from the rule itself (:meth:`ChainMask.mask_mod`)."""
    T, H, d = q.shape
    Hkv = k.shape[1]
    rows, cols = torch.arange(T, device=q.device), torch.arange(k.shape[0], device=q.device)
    seen = m.mask_mod()(0, 0, rows[:, None], cols[None, :])
    qg = q.view(T, Hkv, H // Hkv, d) * d ** -0.5
    p = torch.einsum("thgd,shd->hgts", qg, k).masked_fill(~seen, float("-inf")).softmax(-1)
    return torch.einsum("hgts,shd->thgd", p, v).reshape(T, H * d)


def loss_and_grads(obj, work, count):
    obj.head.zero_grad()
    stats = obj.run(work, 1.0 / count, backward=True)
    return stats.loss, {n: p.grad.clone() for n, p in obj.head.named_parameters() if p.grad is not None}


def assert_same(a, b, rel):
    (la, ga), (lb, gb) = a, b
    torch.testing.assert_close(lb, la, rtol=rel, atol=0)
    assert ga.keys() == gb.keys() and len(ga) > 5
    for n in ga:
        err = (gb[n] - ga[n]).norm() / ga[n].norm().clamp(min=1e-30)
        assert err <= rel, (n, float(err))


def sampled(target, method, n=(48, 30), dtype=torch.float32, device="cpu"):
    docs = [make_doc(target, n[0], 10, seed=5), make_doc(target, n[1], 6, seed=6)]
    head = make_head(target, dtype=dtype).to(device)
    rows = target.lm_weight[head.to_target_ids(torch.arange(80, device=device)).cpu()]
    obj = Objective(head, method, K, rows.to(device, dtype))
    batch = Batch.pack([Doc(d.ids.to(device), d.prompt_len, d.taps.to(device, dtype), d.final.to(device, dtype),
                            d.argmax.to(device)) for d in docs])
    gens = [torch.Generator().manual_seed(i) for i in range(2)]
    el = sample_elements(batch, K, 0.8, 0.2, gens if method == "peagle" else None)
    return obj, batch, el


@pytest.mark.parametrize("saved", [True, False], ids=["weights-kept", "weights-recomputed"])
@pytest.mark.parametrize("method", ["peagle", "eagle3"])
def test_chunked_attention_gives_the_dense_loss_and_gradients(target, method, saved, monkeypatch):
    """The chunked chain attention (in query blocks of 16 here, so that blocks straddle depths and
    documents) against the dense masked softmax the trainer ran before: the same loss and gradients
    in float32, through a 2-layer head over two packed documents, with backward reusing forward's
    weights and, past ``SAVED_BUDGET``, recomputing them."""
    obj, batch, el = sampled(target, method)
    count = obj.count(batch, el)
    monkeypatch.setattr(attention, "SCORE_BUDGET", 1)
    monkeypatch.setattr(attention, "SAVED_BUDGET", attention.SAVED_BUDGET if saved else 0)
    chunked = loss_and_grads(obj, pieces(batch, el, 1, method), count)
    monkeypatch.setattr(attention, "attend_chain", lambda q, k, v, m: dense_chain(q, k, v, m))
    dense = loss_and_grads(obj, pieces(batch, el, 1, method), count)
    assert_same(dense, chunked, 2e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("method", ["peagle", "eagle3"])
def test_flex_attention_on_cuda_gives_the_dense_loss_and_gradients(target, method, monkeypatch):
    """On CUDA training attends through compiled FlexAttention: the dense path's loss and gradients, one
    pass and in 3 segments."""
    obj, batch, el = sampled(target, method, device="cuda")
    count = obj.count(batch, el)
    flex = loss_and_grads(obj, pieces(batch, el, 1, method), count)
    parted = loss_and_grads(obj, pieces(batch, el, 3, method), count)
    monkeypatch.setattr(attention, "attend_chain", lambda q, k, v, m: dense_chain(q, k, v, m))
    dense = loss_and_grads(obj, pieces(batch, el, 1, method), count)
    assert_same(dense, flex, 1e-4)
    assert_same(dense, parted, 1e-4)


def test_flex_attention_mask_mod_gives_the_chunked_output(target):
    """FlexAttention (CUDA's path) under :meth:`ChainMask.mask_mod`, in torch's eager reference on the CPU
    (forward only there), gives the chunked attention's output: the rule and its two views agree."""
    obj, batch, el = sampled(target, "peagle")
    m = chain_mask(batch, el, el)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(len(el), h, 16, generator=g) for h in (4, 2, 2))
    with torch.no_grad():
        want = attention.ChunkedChainAttention.apply(q, k, v, m, 16 ** -0.5)
        got = attention.flex_chain(q, k, v, m, compiled=False)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


class PeakSaved:
    """The largest total size of activations autograd keeps for backward within one piece's forward and
    backward (the count restarts at each piece's forward; the weights, saved as they are, not counted)."""

    def __init__(self, obj, monkeypatch):
        self.peak, self.live = 0, 0
        self.weights = {t.untyped_storage().data_ptr() for t in [*obj.parameters(), *obj.buffers(), obj.target_head]}
        forward = type(obj).forward

        def counted(this, piece):
            self.live = 0
            return forward(this, piece)

        monkeypatch.setattr(type(obj), "forward", counted)

    def __enter__(self):
        def pack(t):
            if t.untyped_storage().data_ptr() not in self.weights:
                self.live += t.numel() * t.element_size()
            self.peak = max(self.peak, self.live)
            return t
        self.hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self.hooks.__exit__(*exc)


@pytest.mark.parametrize("method", ["peagle", "eagle3"])
def test_sequence_partition_gradients_equal_and_memory_falls(target, method, monkeypatch):
    """1, 2 and 7 segments give the gradients of one pass (float64, a 2-layer head, so the
    depth-0 keys a segment reads come from layers that themselves attend across the cut), and a
    segment keeps only its own elements for backward: 7 segments keep under a quarter of one
    pass's saved tensors."""
    obj, batch, el = sampled(target, method, n=(60, 40), dtype=torch.float64)
    count = obj.count(batch, el)
    ref = loss_and_grads(obj, [Piece(batch, el)], count)
    peaks = {}
    for s in (1, 2, 7):
        work = pieces(batch, el, s, method)
        assert len(work) == s and sum(len(p.el) for p in work) == len(el)
        with PeakSaved(obj, monkeypatch) as peak:
            got = loss_and_grads(obj, work, count)
        monkeypatch.undo()
        peaks[s] = peak.peak
        assert_same(ref, got, 1e-6)  # the loss runs in float32 (score)
    assert peaks[7] < 0.25 * peaks[1], peaks


def test_segments_are_used_exactly_when_a_micro_batch_needs_them(target):
    """One segment while the elements fit ``max_elements``, more from one element past it, each
    holding about ``max_elements`` at most (cut between rows: within a rollout's K elements)."""
    _, batch, el = sampled(target, "peagle")
    n = len(el)
    assert num_segments(el, 1, n) == 1 and num_segments(el, 3, n) == 3
    assert num_segments(el, 1, n - 1) == 2 and num_segments(el, 1, n // 4) == 5
    for cap in (n // 2, n // 5):
        work = pieces(batch, el, num_segments(el, 1, cap), "peagle")
        assert max(len(p.el) for p in work) <= cap + K, [len(p.el) for p in work]


def test_position_sampling_follows_the_recipe(target):
    doc = make_doc(target, 200, 20, seed=7)
    batch = Batch.pack([doc])
    r, r_min, k = 0.7, 0.2, 8
    el = sample_elements(batch, k, r, r_min, [torch.Generator().manual_seed(0)])
    n_valid = 200 - 2 - 19          # anchors 19..197 have a depth-0 label
    assert int((el.depth == 0).sum()) == 198            # every row with a label is depth-0 context
    prev = set(range(19, 198))
    for d in range(1, k):
        kept = el.tok[el.depth == d].tolist()
        assert len(kept) == min(len([a for a in prev if a <= 197 - d]), round((n_valid - d) * max(r ** d, r_min)))
        assert set(kept) <= prev and kept == sorted(kept)
        prev = set(kept)
    again = sample_elements(batch, k, r, r_min, [torch.Generator().manual_seed(0)])
    assert torch.equal(el.tok, again.tok)


def test_chain_mask_rule():
    batch = Batch.pack([Doc(torch.arange(6), 1, torch.zeros(6, 3), torch.zeros(6, 1), torch.zeros(6, dtype=torch.long)),
                        Doc(torch.arange(4), 1, torch.zeros(4, 3), torch.zeros(4, 1), torch.zeros(4, dtype=torch.long))])
    el = sample_elements(batch, 3, 1.0, 1.0, None)
    m = chain_mask(batch, el, el)
    seen = torch.zeros(len(el), len(el), dtype=torch.bool)  # the ranges and chains as a dense mask
    for i, (a, b) in enumerate(zip(m.first.tolist(), m.end.tolist())):
        seen[i, a:b] = True
    for i, row in enumerate(m.chain.tolist()):
        for j in row:
            if j >= 0:
                seen[i, j] = True
    for i in range(len(el)):
        for j in range(len(el)):
            qa, qd, ka, kd = int(el.tok[i]), int(el.depth[i]), int(el.tok[j]), int(el.depth[j])
            same = int(batch.doc[qa]) == int(batch.doc[ka])
            want = same and ((kd == 0 and ka <= qa) or (ka == qa and kd <= qd))
            assert bool(seen[i, j]) == want
            assert bool(m.mask_mod()(0, 0, torch.tensor(i), torch.tensor(j))) == want  # FlexAttention's view


@pytest.mark.parametrize("method", ["peagle", "eagle3"])
def test_mask_slots_learn_depth_dependent_predictions(method):
    """Counting sequences (x[i+1] = x[i] + 1): the right draft at depth d is x[a+1] + d + 1, so a
    P-EAGLE mask slot, whose inputs are the same at every depth, must infer its depth from the
    attention context. A 1-layer head learns all depths within a hundred steps."""
    torch.manual_seed(0)
    V, H, k = 160, 64, 4
    cfg = DrafterConfig(hidden_size=H, intermediate_size=128, num_layers=1, num_heads=4, num_kv_heads=2, head_dim=16,
                        rms_norm_eps=1e-6, rope_theta=10000.0, rope_scaling=None, max_position_embeddings=512,
                        vocab_size=V, draft_vocab_size=V, target_hidden_size=H, aux_layer_ids=[0, 1, 2],
                        mask_token_id=V - 1, trained_k=k)
    head = TrainHead(cfg)
    head.init_weights(0)
    features = torch.randn(V, 3 * H)  # the target's taps: a fixed feature per token

    def doc(n=48):
        ids = (int(torch.randint(0, 150, (1,))) + torch.arange(n)) % 150 + 5
        nxt = torch.cat([ids[1:], ids[-1:]])  # the target's next token; its distribution is one-hot
        return Doc(ids, 8, features[ids], 8 * torch.nn.functional.one_hot(nxt, V).float(), nxt)

    obj = Objective(head, method, k, torch.eye(V))
    opt = torch.optim.AdamW(head.trainable(), lr=3e-3)
    held_out = [doc() for _ in range(4)]
    assert evaluate(obj, held_out, k)["al"] < 1.1
    for step in range(120):
        batch = Batch.pack([doc() for _ in range(4)])
        gens = [torch.Generator().manual_seed(step * 10 + i) for i in range(4)] if method == "peagle" else None
        el = sample_elements(batch, k, 0.8, 0.5, gens)
        obj.run(pieces(batch, el, 1, method), 1.0 / obj.count(batch, el), backward=True)
        opt.step()
        opt.zero_grad()
    res = evaluate(obj, held_out, k)
    assert res["al"] > 4.5 and min(res["acc"]) > 0.9, res


def test_evaluate_acceptance_length_on_a_constructed_case(target):
    """A head right at depth d exactly when d < a % 5 for anchor a: greedy verification accepts
    min(a % 5, K) drafts there, so the estimate is 1 + their mean over anchors with all K labels."""
    class Constructed(Objective):
        def hidden(self, batch, el):
            return torch.zeros(len(el), 1)

        def score(self, batch, el, normed):
            return torch.zeros(()), el.depth < el.tok % 5, torch.ones(len(el), dtype=torch.bool)

    k, n, prompt_len = 4, 40, 6
    head = make_head(target)
    doc = Doc(torch.arange(n), prompt_len, torch.zeros(n, 3), torch.zeros(n, 1), torch.zeros(n, dtype=torch.long))
    res = evaluate(Constructed(head, "peagle", k, torch.zeros(80, 1)), [doc], k)
    anchors = range(prompt_len - 1, n - 1 - k)
    assert res["anchors"] == len(anchors)
    assert res["al"] == round(1 + sum(min(a % 5, k) for a in anchors) / len(anchors), 4)
    assert res["al"] > 2.5
