"""The target's pass (``peagle::target_pass``, csrc/stack.cpp) and P-EAGLE's drafting pass (``peagle::draft``,
csrc/draft.cpp) in one native call each, against the same passes run step by step (``LlamaModel.forward`` and
``greedy``; ``ModelRunner.propose``'s torch path): the same logits, drafts and KV, bit for bit, over ragged batches
(a prompt cut in pieces, accepted and rejected rows, mask slots, a reduced draft vocabulary)."""
from __future__ import annotations

import pytest
import torch
from conftest import native_from_hf, tiny_hf
from speculation import MASK
from test_int8 import quantized_copy

from peagle import kernels
from peagle.engine.llm_engine import EngineConfig, LLMEngine
from peagle.engine.model_runner import ModelRunner
from peagle.engine.sampling import greedy
from peagle.models.attention import AttnMeta, Span
from peagle.models.drafter import Drafter
from peagle.models.layers import pack_model, quantize_linears, set_fast_layout
from peagle.models.loader import head_format, init_drafter

native = pytest.mark.skipif(not kernels.available(), reason="native kernels not built")


def sharp_head(target, quantized: bool, num_layers: int = 1) -> Drafter:
    """A random head whose outputs a wrong row, position, slot or mask would change: norms and
    biases away from their defaults, peaked attention, a draft vocabulary of 96 of the 160 ids, scattered."""
    head = init_drafter(target, num_layers, MASK, draft_vocab_size=96)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            elif name == "mask_hidden" or name.endswith(("qkv_proj.weight", "lm_head.weight")):
                p.mul_(20)
    head.set_vocab_map(torch.randperm(160, generator=g)[:96].sort().values)
    if quantized:
        quantize_linears(head, head_format(target, head))
        pack_model(head)
    else:
        set_fast_layout(head)   # (as the loader leaves it: [out, in] weights, what peagle's kernels read)
    return head


def verified_batch(runner: ModelRunner, num_masks: int, g: torch.Generator):
    """Three sequences' verified rows (a 5-row verify pass with 2 accepted, one row, 3 rows all kept) at
    contexts across block boundaries, on scattered blocks, and the target taps the drafter reads."""
    bs, width = runner.cfg.block_size, runner.drafter.cfg.target_hidden_size * 3
    rows, starts, kept = [5, 1, 3], [37, 12, 30], [3, 1, 3]
    tables = [[6, 2, 9, 4], [1, 8], [3, 5, 7]]
    assert all(-(-(s + n + num_masks) // bs) <= len(t) for s, n, t in zip(starts, rows, tables))
    spans = [Span(n, s + n, t, s) for n, s, t in zip(rows, starts, tables)]
    ids = torch.randint(0, 150, (sum(rows),), generator=g)
    positions = torch.cat([torch.arange(s, s + n) for s, n in zip(starts, rows)])
    cu = [0, 5, 6, 9]
    taps = torch.randn(sum(rows), width, generator=g)
    return spans, ids, positions, cu, torch.tensor(kept), taps, torch.randint(0, 150, (3,), generator=g)


def every_row(forward):
    """``Drafter.forward`` run to the end for every row, the drafted ones (``keep``) read after it: the pass as it
    was before the other rows stopped at their KV."""
    def run(self, ids, hidden, positions, caches, meta, keep=None):
        normed, prenorm = forward(self, ids, hidden, positions, caches, meta)
        return (normed, prenorm) if keep is None else (normed[keep], prenorm[keep])
    return run


@native
@pytest.mark.parametrize("quantized", [False, True])
def test_the_drafting_pass_in_one_call_gives_the_step_by_step_bits(quantized, monkeypatch):
    """The fused pass, the step-by-step one (both running the last layer past its KV for the drafted rows alone)
    and the step-by-step one run to the end for every row: the same drafts and KV."""
    target = quantized_copy(tiny_hf("llama")) if quantized else native_from_hf(tiny_hf("llama"))
    head = sharp_head(target, quantized)
    engine = LLMEngine(target, head, EngineConfig(method="parallel", num_speculative_tokens=4, max_num_seqs=3,
                                                  prompt_lookup_max=0))
    runner, g = engine.runner, torch.Generator().manual_seed(0)
    calls, draft, forward = [], Drafter.draft, Drafter.forward
    monkeypatch.setattr(Drafter, "draft", lambda self, *a: calls.append(1) or draft(self, *a))
    for num_masks in (0, 1, 3):
        batch = verified_batch(runner, num_masks, g)
        pools = [c.k for c in runner.drafter_caches] + [c.v for c in runner.drafter_caches]
        for p in pools:   # a context the rows attend: any key or slot read wrongly shows
            p.copy_(torch.randn(p.shape, generator=g).to(p.dtype))
        before = [p.clone() for p in pools]
        out = {}
        for mode in ("fused", "step by step", "every row"):
            for p, b in zip(pools, before):
                p.copy_(b)
            monkeypatch.setattr(ModelRunner, "fused_drafting", mode == "fused")
            monkeypatch.setattr(Drafter, "forward", every_row(forward) if mode == "every row" else forward)
            with torch.inference_mode():
                drafts = runner.propose(*batch, num_masks + 1)
            out[mode] = drafts, [p.clone() for p in pools]
        assert out["fused"][0].shape == (3, num_masks + 1, 1)
        for mode in ("step by step", "every row"):
            assert torch.equal(out["fused"][0], out[mode][0]), mode
            assert all(torch.equal(a, b) for a, b in zip(out["fused"][1], out[mode][1])), mode
        assert not all(torch.equal(a, b) for a, b in zip(out["fused"][1], before))  # KV was written
    assert len(calls) == 3


@native
@pytest.mark.parametrize("method,num_layers", [("parallel", 1), ("parallel", 2), ("eagle3", 1)])
def test_a_long_catch_up_stops_at_its_kv_with_the_full_passs_bits(method, num_layers, monkeypatch):
    """A drafting pass with a catch-up longer than a span (70 rows, cut into spans) beside short ones: the rows
    before the drafted ones stop at their KV in the last layer, the layers in one call or one by one, and the drafts
    (EAGLE-3's too, which feed back the drafted rows' pre-norm state) and the KV are the layer-by-layer pass's run to
    the end for every row."""
    target = native_from_hf(tiny_hf("llama"))
    engine = LLMEngine(target, sharp_head(target, False, num_layers),
                       EngineConfig(method=method, num_speculative_tokens=3, max_num_seqs=3, prompt_lookup_max=0))
    runner, g = engine.runner, torch.Generator().manual_seed(3)
    rows, starts, kept = [70, 1, 4], [10, 40, 25], [70, 1, 2]
    tables = [list(range(2, 8)), [9, 11, 10, 12], [14, 13]]
    spans = [Span(n, s + n, t, s) for n, s, t in zip(rows, starts, tables)]
    batch = (spans, torch.randint(0, 150, (75,), generator=g),
             torch.cat([torch.arange(s, s + n) for s, n in zip(starts, rows)]), [0, 70, 71, 75], torch.tensor(kept),
             torch.randn(75, target.cfg.hidden_size * 3, generator=g), torch.randint(0, 150, (3,), generator=g))
    pools = [c.k for c in runner.drafter_caches] + [c.v for c in runner.drafter_caches]
    for p in pools:
        p.copy_(torch.randn(p.shape, generator=g).to(p.dtype))
    before, out, forward, stacks = [p.clone() for p in pools], {}, Drafter.forward, Drafter.stacks
    for mode in ("in one call", "layer by layer", "every row"):
        for p, b in zip(pools, before):
            p.copy_(b)
        monkeypatch.setattr(Drafter, "forward", every_row(forward) if mode == "every row" else forward)
        monkeypatch.setattr(Drafter, "stacks", stacks if mode == "in one call" else lambda *a: False)
        with torch.inference_mode():
            out[mode] = [runner.propose(*batch, 3), *(p.clone() for p in pools)]
    assert out["every row"][0].shape == (3, 3, 1)
    for mode in ("in one call", "layer by layer"):
        assert all(torch.equal(a, b) for a, b in zip(out[mode], out["every row"])), mode
    assert not all(torch.equal(a, b) for a, b in zip(out["every row"][1:], before))  # KV was written


@native
@pytest.mark.parametrize("quantized", [False, True])
def test_the_targets_pass_in_one_call_gives_the_step_by_step_bits(quantized, monkeypatch):
    """``peagle::target_pass`` (LlamaModel.decode) against forward() and greedy(): the same logits, taps,
    tokens, finiteness and KV, over a prompt longer than a span (cut in pieces), a verify pass and one row."""
    target = quantized_copy(tiny_hf("llama")) if quantized else native_from_hf(tiny_hf("llama"))
    target.pack_for_inference()
    assert target.fuses()
    g, bs = torch.Generator().manual_seed(2), 16
    caches = target.make_caches(40 * bs, torch.float16 if quantized else torch.float32)
    spans = [Span(100, 100, list(range(0, 7)), 0), Span(5, 41, [9, 12, 20], 36), Span(1, 18, [30, 31], 17)]
    ids = torch.randint(0, 150, (106,), generator=g)
    positions = torch.cat([torch.arange(s.start, s.ctx_len) for s in spans])
    rows = torch.tensor([99, 100, 101, 102, 103, 104, 105])   # each sequence's verified rows
    pools = [c.k for c in caches] + [c.v for c in caches]
    for p in pools:
        p.copy_(torch.randn(p.shape, generator=g).to(p.dtype))
    before, out = [p.clone() for p in pools], {}
    for fused in (True, False):
        for p, b in zip(pools, before):
            p.copy_(b)
        with torch.inference_mode():
            if fused:
                logits, taps, best = target.decode(ids, positions, caches, AttnMeta(spans, bs), rows)
                assert best is not None
            else:
                logits, taps = target(ids, positions, caches, AttnMeta(spans, bs), rows)
                best = greedy(logits)
        out[fused] = [logits, taps, *best, *(p.clone() for p in pools)]
    assert all(torch.equal(a, b) for a, b in zip(out[True], out[False]))
    assert not all(torch.equal(a, b) for a, b in zip(out[True][4:], before))  # KV was written
    assert out[True][3].all()
    with torch.inference_mode():   # NaN logits: the row not finite, as greedy says (float32 weights: the integer
        target.model.norm.weight[5] = float("nan")   # path's 8-bit activations carry no NaN, as llama.cpp's)
        logits, _, (_, finite) = target.decode(ids[-1:], positions[-1:], caches, AttnMeta([spans[-1]], bs),
                                               torch.tensor([0]))
        assert torch.equal(finite, greedy(logits)[1]) and (quantized or not finite.any())


@native
def test_the_fused_passes_read_the_weights_the_models_hold_now():
    """The passes' layer weights are listed once and listed again when replaced (``native_weights``, ``_stack``);
    weights replaced after a pass (as a load or a cast replaces them: the LM heads, the final norms, the last layer's
    matrix), one at a time, are the ones the next pass reads: the same bits as the step-by-step passes over the new
    weights, not the first ones."""
    target = native_from_hf(tiny_hf("llama"))
    target.pack_for_inference()
    head = sharp_head(target, False)
    engine = LLMEngine(target, head, EngineConfig(method="parallel", num_speculative_tokens=4, max_num_seqs=3,
                                                  prompt_lookup_max=0))
    runner, g, bs = engine.runner, torch.Generator().manual_seed(3), engine.runner.cfg.block_size
    spans, ids, positions, rows = [Span(5, 41, [9, 12, 20], 36)], torch.randint(0, 150, (5,), generator=g), \
        torch.arange(36, 41), torch.arange(5)
    batch = verified_batch(runner, 2, g)

    def passes():
        with torch.inference_mode():
            logits, _, _ = target.decode(ids, positions, runner.target_caches, AttnMeta(spans, bs), rows)
            reference, _ = target(ids, positions, runner.target_caches, AttnMeta(spans, bs), rows)
            drafts = runner.propose(*batch, 3)
            runner.fused_drafting = False
            step_by_step = runner.propose(*batch, 3)
            del runner.fused_drafting
        assert torch.equal(logits, reference) and torch.equal(drafts, step_by_step)
        return logits, drafts

    before = passes()
    for m, drafter in ((target.model.norm, False), (target.model.layers[-1].mlp.down_proj, False),
                       (target.lm_head or target.model.embed_tokens, False), (head.lm_head, True), (head.norm, True)):
        with torch.no_grad():   # one at a time: each must be seen on its own
            m.weight = torch.nn.Parameter(m.weight.flip(0).contiguous(), requires_grad=False)
        after = passes()
        assert not torch.equal(before[drafter], after[drafter]), m
        before = after
