"""The MoE targets (GPT-OSS, Qwen3-MoE) against HF transformers: logits and auxiliary hidden states,
paged-cache decoding past the sliding window, MXFP4 checkpoints, loading from disk, bad input, and
speculative decoding that stays lossless on them."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, GptOssConfig, Qwen3MoeConfig
from transformers.integrations.mxfp4 import convert_moe_packed_tensors
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from conftest import randomize, run_full
from speculation import CHAIN_FAULTS, OracleDrafter, assert_caught, make_engine, oracle_run, references
from peagle.engine.sampling import SamplingParams
from peagle.models.gpt_oss import GptOssModel, dequantize_mxfp4
from peagle.models.attention import AttnMeta, Span
from peagle.models.checkpoint import CheckpointError
from peagle.models.layers import rope_frequencies
from peagle.models.llama import ModelConfig, UnsupportedModelError, build_target
from peagle.models.loader import init_drafter, load_target
from peagle.models.qwen3_moe import Qwen3MoeModel

ATOL = 1e-4
MASK = 159  # the tiny vocabulary's last id: never in the prompts below, not EOS
BASE = dict(vocab_size=160, hidden_size=64, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=2048, eos_token_id=2, bos_token_id=1)
# YaRN whose ramp falls inside the 8 frequency pairs of head_dim 16 (GPT-OSS's own 4096-token
# original context would leave a tiny model's dimensions all on one side)
YARN = {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
        "original_max_position_embeddings": 512, "rope_theta": 10000.0}
WINDOW = 4

CONFIGS = {
    # swiglu_limit far below GPT-OSS's 7.0 so the clamp bites on tiny random weights
    "gpt_oss": lambda: GptOssConfig(**BASE, intermediate_size=32, head_dim=16, num_local_experts=4,
                                    num_experts_per_tok=2, sliding_window=WINDOW, rope_parameters=YARN,
                                    swiglu_limit=0.3),
    "qwen3_moe": lambda: Qwen3MoeConfig(**BASE, intermediate_size=96, moe_intermediate_size=32, head_dim=24,
                                        num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
                                        mlp_only_layers=[4]),
    "qwen3_moe-step2": lambda: Qwen3MoeConfig(**BASE, intermediate_size=96, moe_intermediate_size=32, num_experts=6,
                                              num_experts_per_tok=3, norm_topk_prob=False, decoder_sparse_step=2),
}


def tiny_moe(family: str, seed: int = 0):
    return random_hf(CONFIGS[family](), seed)


def random_hf(config, seed: int = 0):
    """A HF model with random weights (float32, eval), randomised as the dense ones (peaked
    attention included); sinks are randomised too, and routers are scaled up so that routing is
    decisive: a wrong expert or weight shows in the logits."""
    torch.manual_seed(seed)
    hf = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    randomize(hf, bias_std=0.3)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("sinks"):
                p.copy_(0.3 * torch.randn_like(p))
            elif name.endswith(("router.weight", "mlp.gate.weight")):
                p.normal_(0, 0.5)
            elif ".experts." in name:
                p.normal_(0, 0.1)
    return hf


def native(hf, **overrides):
    """Our model for ``hf`` (config fields in ``overrides`` replaced), loaded from its state dict."""
    model = build_target(ModelConfig.from_hf({**hf.config.to_dict(), **overrides}))
    model.load_checkpoint({k: v.detach().clone() for k, v in hf.state_dict().items()})
    return model.eval()


def hf_forward(hf, ids):
    with torch.no_grad():
        out = hf(ids[None], output_hidden_states=True)
    return out.logits[0], [h[0] for h in out.hidden_states]


def rand_ids(n: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, 150, (n,), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module", params=list(CONFIGS))
def pair(request):
    hf = tiny_moe(request.param)
    return request.param, hf, native(hf)


# ----------------------------------------------------------------------------- numerics vs HF

def test_logits_and_aux_hidden_states_match_hf(pair):
    family, hf, model = pair
    assert type(model) is (GptOssModel if family == "gpt_oss" else Qwen3MoeModel)
    ids = rand_ids(40)
    ref, hs = hf_forward(hf, ids)
    logits, aux = run_full(model, ids)
    L, H = hf.config.num_hidden_layers, hf.config.hidden_size
    assert model.aux_layers == (2, L // 2, L - 3)
    assert (logits - ref).abs().max().item() <= ATOL
    for tap, i in zip(aux.split(H, dim=-1), model.aux_layers):  # the residual stream entering layer i
        assert (tap - hs[i]).abs().max().item() <= ATOL, f"aux layer {i}"


@pytest.mark.parametrize("change", ["no window", "no sinks", "no clamp", "experts permuted"])
def test_each_gpt_oss_feature_is_exercised(change):
    """Guards for the HF match above: a model without the window, the sinks or the clamp, or with
    its experts in another order, gives different logits, so the match really checks each of them."""
    hf = tiny_moe("gpt_oss")
    ids = rand_ids(40)
    ref, _ = hf_forward(hf, ids)
    if change == "no window":
        model = native(hf, sliding_window=None)
    elif change == "no clamp":
        model = native(hf, swiglu_limit=7.0)
    else:
        model = native(hf)
        with torch.no_grad():
            for layer in model.model.layers:
                if change == "no sinks":
                    layer.self_attn.sinks.zero_()
                else:
                    layer.mlp.experts.gate_up_proj.copy_(layer.mlp.experts.gate_up_proj.flip(0))
    logits, _ = run_full(model, ids)
    assert (logits - ref).abs().max().item() > 1e-3


def test_qwen3_moe_layer_layout_and_routing_norm():
    cfg = CONFIGS["qwen3_moe-step2"]().to_dict()
    cfg["num_experts"] = cfg.pop("num_local_experts")  # the hub files' key
    c = ModelConfig.from_hf(cfg)
    assert c.num_experts == 6 and c.moe_layers == [1, 3, 5] and not c.norm_topk_prob
    model = build_target(c)
    assert [type(layer.mlp).__name__ for layer in model.model.layers] == ["MLP", "SparseMoE"] * 3
    hf = tiny_moe("qwen3_moe")
    ids = rand_ids(30)
    ref, _ = hf_forward(hf, ids)
    logits, _ = run_full(native(hf, norm_topk_prob=False), ids)
    assert (logits - ref).abs().max().item() > 1e-3


@pytest.mark.parametrize("rope", [YARN, {**YARN, "truncate": True, "beta_fast": 16.0},
                                  {**YARN, "mscale": 0.8, "mscale_all_dim": 1.2},
                                  {**YARN, "attention_factor": 1.5, "factor": 32.0}])
def test_yarn_frequencies_match_transformers(rope):
    cfg = GptOssConfig(**BASE, head_dim=16, rope_parameters=dict(rope))
    ref_inv, ref_scale = ROPE_INIT_FUNCTIONS["yarn"](cfg)
    theta = rope["rope_theta"]
    inv, scale = rope_frequencies(16, theta, {k: v for k, v in rope.items() if k != "rope_theta"})
    assert torch.allclose(inv, ref_inv, rtol=1e-6) and scale == pytest.approx(ref_scale)


# ----------------------------------------------------------------------------- paged cache

def paged_slots(n: int, block: int = 4, seed: int = 0) -> torch.Tensor:
    """Slots of positions 0..n-1 in blocks of ``block`` slots laid out in a shuffled order."""
    table = torch.randperm(-(-n // block) + 3, generator=torch.Generator().manual_seed(seed))
    return (table[:, None] * block + torch.arange(block)).flatten()[:n]


def feed(model, caches, ids, slots, start, end):
    """Positions start..end-1 of one sequence whose context is 0..end-1."""
    pos = torch.arange(start, end)
    with torch.inference_mode():
        return model(ids[start:end], pos, caches, AttnMeta.single(slots, start, end))


def test_incremental_decoding_past_the_window_equals_full_pass(pair):
    _, _, model = pair
    n = 30
    ids = rand_ids(n, seed=6)
    full, full_aux = run_full(model, ids)
    slots = paged_slots(n)
    caches = model.make_caches(int(slots.max()) + 1)
    bounds = [0, 7] + list(range(8, 16)) + [20, 25, 30]  # prefill, one token at a time, chunks; window 4
    outs = [feed(model, caches, ids, slots, a, b) for a, b in zip(bounds, bounds[1:])]
    assert (torch.cat([o[0] for o in outs]) - full).abs().max().item() <= ATOL
    assert (torch.cat([o[1] for o in outs]) - full_aux).abs().max().item() <= ATOL


def test_flat_batch_decode_next_to_prefill():
    """One sequence decodes a token far past the window while another prefills, in one flat batch:
    sliding and full layers each get their own masks."""
    hf = tiny_moe("gpt_oss", seed=1)
    model = native(hf)
    a, b = rand_ids(20, seed=10), rand_ids(13, seed=11)
    ref_a, _ = run_full(model, a)
    ref_b, _ = run_full(model, b)
    sa, sb = paged_slots(20, seed=4), paged_slots(13, seed=5) + 500
    caches = model.make_caches(600)
    feed(model, caches, a, sa, 0, 19)
    ids = torch.cat([a[19:], b])
    pos = torch.cat([torch.tensor([19]), torch.arange(13)])
    meta = AttnMeta([Span(1, 20, sa.tolist(), 19), Span(13, 13, sb.tolist(), 0)], 1)
    with torch.inference_mode():
        logits, _ = model(ids, pos, caches, meta)
    assert (logits[0] - ref_a[19]).abs().max().item() <= ATOL
    assert (logits[1:] - ref_b).abs().max().item() <= ATOL


# ----------------------------------------------------------------------------- MXFP4 and checkpoints

def random_mxfp4(shape: tuple[int, ...], g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random packed codes ``shape = [..., G, 16]`` and E8M0 scales ``[..., G]`` (2**-9 .. 2**-4)."""
    blocks = torch.randint(0, 256, shape, generator=g).to(torch.uint8)
    scales = torch.randint(118, 124, shape[:-1], generator=g).to(torch.uint8)
    return blocks, scales


@pytest.mark.parametrize("shape", [(1, 1, 1, 16), (3, 10, 2, 16), (4, 64, 1, 16), (2, 32, 4, 16)])
def test_mxfp4_dequantizer_matches_transformers(shape):
    blocks, scales = random_mxfp4(shape, torch.Generator().manual_seed(sum(shape)))
    flat = scales.view(-1)
    flat[:3] = torch.tensor([0, 255, 127], dtype=torch.uint8)[:flat.numel()]  # the extreme exponents too
    ref = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)  # [E, in, out]
    assert torch.equal(dequantize_mxfp4(blocks, scales).transpose(1, 2), ref)


def mxfp4_folder(tmp_path, hf) -> dict[str, torch.Tensor]:
    """Write ``hf`` as the openai/gpt-oss checkpoints are stored (experts as ``*_blocks``/``*_scales``),
    after setting its expert weights to what transformers dequantizes from them."""
    c = hf.config
    E, H, I = c.num_local_experts, c.hidden_size, c.intermediate_size
    g = torch.Generator().manual_seed(3)
    sd = {k: v.detach().clone() for k, v in hf.state_dict().items() if not k.endswith("_proj")}
    for i, layer in enumerate(hf.model.layers):
        for name, rows, cols in (("gate_up_proj", 2 * I, H), ("down_proj", H, I)):
            blocks, scales = random_mxfp4((E, rows, cols // 32, 16), g)
            with torch.no_grad():
                getattr(layer.mlp.experts, name).copy_(convert_moe_packed_tensors(blocks, scales, dtype=torch.float32))
            sd[f"model.layers.{i}.mlp.experts.{name}_blocks"] = blocks
            sd[f"model.layers.{i}.mlp.experts.{name}_scales"] = scales
    save_file(sd, str(tmp_path / "model.safetensors"))
    cfg = c.to_dict()
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return sd


def test_gpt_oss_mxfp4_checkpoint(tmp_path):
    hf = tiny_moe("gpt_oss", seed=2)
    mxfp4_folder(tmp_path, hf)
    model, _ = load_target(tmp_path, "float32")
    ids = rand_ids(24)
    ref, _ = hf_forward(hf, ids)
    logits, _ = run_full(model, ids)
    assert (logits - ref).abs().max().item() <= ATOL


@pytest.mark.parametrize("family", list(CONFIGS))
def test_load_target_from_saved_folder(tmp_path, family):
    """``save_pretrained`` writes Qwen3-MoE experts one by one and GPT-OSS's as dense ``[E, in, out]``."""
    hf = tiny_moe(family, seed=3)
    hf.save_pretrained(tmp_path)
    model, _ = load_target(tmp_path, "float32")
    ids = rand_ids(24, seed=4)
    ref, _ = hf_forward(hf, ids)
    assert (run_full(model, ids)[0] - ref).abs().max().item() <= ATOL


def test_bad_expert_checkpoints_are_named(tmp_path):
    from safetensors.torch import load_file
    hf = tiny_moe("qwen3_moe")
    hf.save_pretrained(tmp_path)
    f = tmp_path / "model.safetensors"
    sd = load_file(str(f))
    del sd["model.layers.1.mlp.experts.3.up_proj.weight"]
    save_file(sd, str(f))
    with pytest.raises(CheckpointError, match=r"model\.layers\.1\.mlp\.experts.*\(3, 'up_proj'\)"):
        load_target(tmp_path, "float32")

    model = build_target(ModelConfig.from_hf(tiny_moe("gpt_oss").config.to_dict()))
    sd = {"model.layers.0.mlp.experts.down_proj_scales": torch.zeros(4, 64, 1, dtype=torch.uint8)}
    with pytest.raises(CheckpointError, match="scales without blocks"):
        model.convert_checkpoint(sd)
    blocks = {"x.gate_up_proj_blocks": torch.zeros(4, 64, 2, 16), "x.gate_up_proj_scales": torch.zeros(4, 64, 2)}
    with pytest.raises(CheckpointError, match="uint8"):
        model.convert_checkpoint(blocks)


# ----------------------------------------------------------------------------- configs

def test_registry_lists_and_dispatches_every_family(tmp_path):
    with pytest.raises(UnsupportedModelError) as ei:
        ModelConfig.from_hf({"model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"]})
    for arch in ("LlamaForCausalLM", "GptOssForCausalLM", "Qwen3MoeForCausalLM"):
        assert arch in str(ei.value)
    c = ModelConfig.from_hf({**CONFIGS["gpt_oss"]().to_dict(), "layer_types": None})
    assert [c.window(i) for i in range(6)] == [WINDOW, None] * 3  # HF's default: sliding first
    assert c.qkv_bias and c.o_bias and c.norm_topk_prob and c.moe_layers == list(range(6))
    with pytest.raises(ValueError, match="layer_types"):
        ModelConfig.from_hf({**CONFIGS["gpt_oss"]().to_dict(), "layer_types": ["sliding_attention"] * 5})
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        ModelConfig.from_hf({**CONFIGS["qwen3_moe"]().to_dict(), "num_experts_per_tok": 5})


# ----------------------------------------------------------------------------- speculative decoding

@pytest.mark.parametrize("family", ["gpt_oss", "qwen3_moe"])
def test_speculative_output_equals_greedy(family):
    """A 2-layer head drafting each sequence's own continuation (every 5th position wrong) through the MoE
    targets' verification: plain decoding's tokens with drafts accepted at K 1, 3, 7; a verifier that rejects
    every draft (planted: still these tokens) and one that keeps a rejected draft are caught."""
    target = native(tiny_moe(family, seed=5))
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 150, (n,), generator=g).tolist() for n in (3, 9, 17)]
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    ref = [o.token_ids for o in make_engine(target, None, "none").generate(prompts, params)]
    head = OracleDrafter.of(target, references(prompts, ref), 5, cfg=init_drafter(target, 2, MASK).cfg)
    for method in ("parallel", "eagle3"):
        for k in (1, 3, 7):
            _, watch, got = oracle_run(target, head, method, k, prompts, params)()
            watch.check(got, ref, rate=0.25)
    for fault in CHAIN_FAULTS:
        assert_caught(fault, oracle_run(target, head, "parallel", 3, prompts, params), ref, rate=0.25)
