"""The engine on a GPU in float32 (what the README promises there): speculation equals the same GPU's plain
decoding, greedy and seeded, chains and a token tree, with the oracle head's drafts accepted; CUDA graphs
give the eager engine's tokens under seeded sampling too. Skipped without CUDA (CI has none); run on a
lent GPU (docs/results/gpu/, which also measures bfloat16 on the default model)."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from conftest import native_from_hf, tiny_hf
from speculation import MASK, assert_lossless_on_path, make_engine, prompts

from peagle.engine.sampling import SamplingParams
from peagle.models.loader import init_drafter

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


@pytest.mark.parametrize("method", ["parallel", "eagle3"])
def test_speculation_on_cuda_is_plain_decoding(method):
    """The oracle head reads the host for its drafts, so these engines run eagerly (graphs: below)."""
    target = native_from_hf(tiny_hf("llama")).cuda()
    assert_lossless_on_path(target, method, wrap=lambda head: head.cuda(), enforce_eager=True)


@pytest.mark.parametrize("method", ["none", "parallel", "eagle3"])
def test_cuda_graphs_equal_eager_when_seeded(method):
    target = native_from_hf(tiny_hf("llama")).cuda()
    head = init_drafter(target, 1, MASK, seed=1).cuda() if method != "none" else None
    ps = prompts(6, seed=5)
    params = [SamplingParams(temperature=0.9, top_p=0.9, max_tokens=12 + 5 * i, ignore_eos=True, seed=40 + i)
              for i in range(6)]
    eager = make_engine(target, head, method, 3, max_num_seqs=4, enforce_eager=True).generate(ps, params)
    engine = make_engine(target, head, method, 3, max_num_seqs=4)
    assert [o.token_ids for o in engine.generate(ps, params)] == [o.token_ids for o in eager]
    assert engine.graphs.num_graphs > 0
    other = [dataclasses.replace(p, seed=p.seed + 100) for p in params]
    assert [o.token_ids for o in engine.generate(ps, other)] != [o.token_ids for o in eager]


def test_training_on_cuda_learns_and_its_head_runs_losslessly(tmp_path):
    """``peagle train`` on the GPU (online target states, bf16 autocast, float32 master weights): the
    held-out accuracy rises, the head it writes round-trips through the compact form beside a GPU embedding,
    and it drafts on the GPU with plain decoding's tokens and some drafts accepted."""
    from peagle.engine.llm_engine import EngineConfig, LLMEngine
    from peagle.models.drafter import load_drafter, save_drafter
    from peagle.train.trainer import Trainer, TrainConfig

    hf = tiny_hf("llama")
    hf.save_pretrained(tmp_path / "target")
    target = native_from_hf(hf).cuda()
    ps = prompts(24, seed=9)
    greedy = SamplingParams(max_tokens=40, ignore_eos=True)
    outs = [o.token_ids for o in make_engine(target, None, "none").generate(ps, greedy)]
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "responses-00000.jsonl").write_text("".join(json.dumps(
        {"id": f"doc{i}", "source": "test", "prompt": "", "response": "", "prompt_token_ids": p,
         "response_token_ids": o}) + "\n" for i, (p, o) in enumerate(zip(ps, outs))))
    cfg = TrainConfig(data=str(tmp_path / "data"), out=str(tmp_path / "head"), target=str(tmp_path / "target"),
                      k=3, draft_vocab=128, mask_token_id=MASK, batch_size=8, micro_tokens=128, eval_fraction=0.2,
                      max_steps=60, eval_every=60, save_every=60, warmup_steps=2, lr=1e-2, progress=False,
                      device="cuda")
    trainer = Trainer(cfg)
    assert trainer.device.type == "cuda" and trainer.dtype == torch.bfloat16
    trainer.evaluate()
    before, after = trainer.last_eval, trainer.run()
    assert after["acc"][0] > before["acc"][0] + 0.02 and after["al"] > before["al"] + 0.03, (before, after)
    assert all(p.dtype == torch.float32 for p in trainer.head.trainable())
    head = load_drafter(tmp_path / "head").cuda()
    embedding = target.model.embed_tokens.weight   # on the GPU: the compact form compares rows against it
    save_drafter(head, tmp_path / "compact", base_embedding=embedding)
    again = load_drafter(tmp_path / "compact", base_embedding=embedding.cpu()).state_dict()
    assert all(torch.equal(again[k], v.cpu()) for k, v in head.state_dict().items())
    engine = LLMEngine(target, head, EngineConfig(method="parallel", num_speculative_tokens=3))
    got = engine.generate(ps[:6], greedy)
    assert [o.token_ids for o in got] == outs[:6] and engine.stats.num_accepted_tokens > 0
