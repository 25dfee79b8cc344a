"""Decode steps in the padded layout CUDA graphs replay (peagle.engine.graphs): run here without
capture, they must give the eager engine's tokens exactly, and their graphed passes must read
nothing from the host (what capture forbids). On a GPU the last test captures and replays."""
from __future__ import annotations

import pytest
import torch
from conftest import native_from_hf, tiny_hf
from speculation import MASK, OracleDrafter, fixed_costs, make_engine, prompts
from torch.utils._python_dispatch import TorchDispatchMode

from peagle.engine.graphs import bucket
from peagle.engine.llm_engine import EngineConfig, LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.models.loader import init_drafter


def padded_engine(target, drafter, method, k, **kw) -> LLMEngine:
    """``auto`` on fixed cost curves: timed on a loaded machine, it could stop drafting, and a sequence whose
    drafter lags never takes the padded layout (a CI run saw no graph at all for ``auto``)."""
    engine = fixed_costs(make_engine(target, drafter, method, k, **kw))
    engine.runner.graphs = engine.runner.make_graphs(capture=False)
    return engine


def test_buckets_are_powers_of_two_up_to_the_cap():
    assert [bucket(n, 8) for n in (1, 2, 3, 4, 5, 8, 9)] == [1, 2, 4, 4, 8, 8, 8]
    assert bucket(5, 6) == 6


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen3"])   # mistral: a sliding window of 8
def test_padded_decode_steps_equal_eager(family):
    """Batches that need padding sequences (3, 5 of a bucket of 4, 8), every method, fixed and auto K,
    requests of different lengths (so draft counts differ near max_tokens and tables differ in width)."""
    target = native_from_hf(tiny_hf(family))
    drafter = init_drafter(target, 2, MASK, seed=1)
    ps = prompts(5, seed=4)
    params = [SamplingParams(max_tokens=10 + 7 * i, ignore_eos=True) for i in range(5)]
    for method, k in (("none", 1), ("parallel", 3), ("parallel", 7), ("eagle3", 4), ("parallel", "auto"),
                      ("ngram", 3)):
        for n in (1, 3, 5):
            # (ngram: sequences with and without the text's drafts side by side, as filler rows)
            kw = dict(max_num_seqs=n, block_size=4, **(dict(prompt_lookup_max=4, prompt_lookup_min=1)
                                                        if method == "ngram" else {}))
            eager_engine = fixed_costs(make_engine(target, drafter, method, k, **kw))
            eager = [o.token_ids for o in eager_engine.generate(ps, params)]
            engine = padded_engine(target, drafter, method, k, **kw)
            assert [o.token_ids for o in engine.generate(ps, params)] == eager, (family, method, k, n)
            assert engine.graphs.num_graphs > 0
            assert engine.blocks.num_free == engine.blocks.num_blocks


@pytest.mark.parametrize("method", ["parallel", "eagle3"])
def test_padded_steps_with_deep_acceptance_equal_the_target(method):
    """An oracle head: long accepted runs, the bonus token and rejections at every depth, in padded steps."""
    target = native_from_hf(tiny_hf("llama"))
    prompt = prompts(1, seed=3)[0]
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    ref = make_engine(target, None, "none").generate([prompt], params)[0].token_ids
    for k in (1, 4, 9):
        for wrong_every in (3, 1000):
            head = OracleDrafter.of(target, prompt + ref, wrong_every)
            out = padded_engine(target, head, method, k).generate([prompt], params)[0]
            assert out.token_ids == ref, (k, wrong_every)


class HostReads(TorchDispatchMode):
    """Fails on what a CUDA graph cannot hold: reading a tensor's value on the host, an output whose
    shape depends on values, a tensor made from host data."""

    FORBIDDEN = ("local_scalar_dense", "nonzero", "masked_select", "is_nonzero", "equal", "lift_fresh", "unique")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.lstrip("_").startswith(self.FORBIDDEN):  # nonzero_numpy, _unique2, ...
            raise AssertionError(f"{func} inside a graphed pass")
        return func(*args, **(kwargs or {}))


def guard(engine: LLMEngine) -> list:
    """Run the engine's graphed passes under :class:`HostReads`; returns a list that counts their calls."""
    calls = []
    for g in (engine.graphs.target, engine.graphs.drafter):
        if g is not None:
            def guarded(*args, fn=g.fn):
                calls.append(1)
                with HostReads():
                    return fn(*args)
            g.fn = guarded
    return calls


@pytest.mark.parametrize("method", ["none", "parallel", "eagle3"])
def test_graphed_passes_read_nothing_from_the_host(method):
    target = native_from_hf(tiny_hf("llama"))
    head = init_drafter(target, 2, MASK, seed=3) if method != "none" else None
    engine = padded_engine(target, head, method, 3, max_num_seqs=3)
    calls = guard(engine)
    params = [SamplingParams(max_tokens=12, ignore_eos=True),
              SamplingParams(max_tokens=12, ignore_eos=True, temperature=0.8, seed=7)]
    engine.generate(prompts(2, seed=5), params)
    assert len(calls) > 10


def test_mixture_of_experts_targets_are_not_graphed():
    """Their routing reads expert ids on the host: the check that keeps them eager is needed."""
    from test_moe_models import native, tiny_moe

    target = native(tiny_moe("qwen3_moe"))
    assert not target.graph_safe and native_from_hf(tiny_hf("llama")).graph_safe
    engine = padded_engine(target, None, "none", 1)
    guard(engine)
    with pytest.raises(AssertionError, match="inside a graphed pass"):
        engine.generate(prompts(1), SamplingParams(max_tokens=3, ignore_eos=True))


def test_graphs_only_on_cuda_and_enforce_eager_turns_them_off():
    target = native_from_hf(tiny_hf("llama"))
    assert make_engine(target, None, "none").graphs is None   # the CPU never captures
    if torch.cuda.is_available():
        cuda = native_from_hf(tiny_hf("llama")).cuda()
        assert LLMEngine(cuda, None, EngineConfig(method="none")).graphs is not None
        assert LLMEngine(cuda, None, EngineConfig(method="none", enforce_eager=True)).graphs is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("method", ["none", "parallel", "eagle3"])
def test_cuda_graphs_equal_eager(method):
    target = native_from_hf(tiny_hf("llama")).cuda()
    head = init_drafter(target, 2, MASK, seed=1).cuda() if method != "none" else None
    ps = prompts(5, seed=4)
    params = [SamplingParams(max_tokens=10 + 7 * i, ignore_eos=True) for i in range(5)]
    eager = make_engine(target, head, method, 3, max_num_seqs=3, enforce_eager=True).generate(ps, params)
    engine = make_engine(target, head, method, 3, max_num_seqs=3)
    assert [o.token_ids for o in engine.generate(ps, params)] == [o.token_ids for o in eager]
    assert engine.graphs.num_graphs > 0
