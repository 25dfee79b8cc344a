"""The drafter's on-disk format (vLLM's LlamaForCausalLMEagle3 layout, docs/vllm.md, "The checkpoint format"):
round trips, hand-built heads, refusing heads that do not fit the target, and broken checkpoints."""
from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from conftest import native_from_hf, tiny_hf
from peagle.engine.llm_engine import EngineConfig, LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.models.drafter import Drafter, DrafterConfig, DrafterMismatchError, load_drafter, save_drafter
from peagle.models.attention import AttnMeta
from peagle.models.llama import CheckpointError
from peagle.models.loader import choose_mask_token, init_drafter, load_tokenizer, resolve_target

MASK = 150  # a valid, non-EOS id of the tiny vocabulary (160)


@pytest.fixture(scope="module")
def target():
    return native_from_hf(tiny_hf("llama"))


def layer_names(prefix: str, hidden_norm: bool) -> set[str]:
    names = {f"{prefix}.self_attn.{p}_proj.weight" for p in "qkvo"}
    names |= {f"{prefix}.mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
    names |= {f"{prefix}.input_layernorm.weight", f"{prefix}.post_attention_layernorm.weight"}
    if hidden_norm:
        names.add(f"{prefix}.hidden_norm.weight")
    return names


def vllm_names(num_layers: int) -> set[str]:
    names = {"embed_tokens.weight", "fc.weight", "mask_hidden", "norm.weight", "lm_head.weight", "d2t", "t2d"}
    names |= layer_names("midlayer", True)
    for i in range(1, num_layers):
        names |= layer_names(f"layers.{i}", False)
    return names


def file_tensors(path) -> dict[str, torch.Tensor]:
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def cfg_fields(cfg: DrafterConfig) -> dict:
    d = dataclasses.asdict(cfg)
    d.pop("extra")
    return d


# ----------------------------------------------------------------------------- round trip

@pytest.mark.parametrize("fam", ["llama", "llama3", "qwen3"])
def test_round_trip_and_vllm_layout(tmp_path, fam):
    tgt = native_from_hf(tiny_hf(fam))
    d = init_drafter(tgt, num_layers=2, mask_token_id=MASK, trained_k=6)
    save_drafter(d, tmp_path)
    loaded = load_drafter(tmp_path)

    # every tensor identical, config identical
    assert cfg_fields(loaded.cfg) == cfg_fields(d.cfg)
    assert loaded.cfg.to_dict() == d.cfg.to_dict()
    sd0, sd1 = d.state_dict(), loaded.state_dict()
    assert sd0.keys() == sd1.keys()
    for k in sd0:
        assert sd0[k].dtype == sd1[k].dtype and torch.equal(sd0[k], sd1[k]), k

    # config.json
    H, tc = tgt.cfg.hidden_size, tgt.cfg
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["draft_vocab_size"] == tc.vocab_size and cfg["vocab_size"] == tc.vocab_size
    assert cfg["target_hidden_size"] == H
    L = tc.num_layers
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, L // 2, L - 3]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, L // 2, L - 3]
    assert cfg["eagle_config"]["use_aux_hidden_state"] is True
    assert cfg["norm_before_residual"] is False
    assert cfg["mask_token_id"] == MASK and cfg["ptd_token_id"] == MASK
    assert cfg["num_hidden_layers"] == 2 and cfg["head_dim"] == tc.head_dim
    assert cfg["peagle"] == {"trained_k": 6}
    assert not list(tmp_path.glob("*.tmp"))  # written through temp files, all renamed

    # the safetensors file: exactly vLLM's names and shapes
    t = file_tensors(tmp_path)
    assert set(t) == vllm_names(2)
    hd, nh, nkv, I, V = tc.head_dim, tc.num_heads, tc.num_kv_heads, tc.intermediate_size, tc.vocab_size
    assert t["embed_tokens.weight"].shape == (V, H)
    assert t["fc.weight"].shape == (H, 3 * H)
    assert t["mask_hidden"].shape == (1, 1, 3 * H)
    assert t["midlayer.self_attn.q_proj.weight"].shape == (nh * hd, 2 * H)
    assert t["midlayer.self_attn.k_proj.weight"].shape == (nkv * hd, 2 * H)
    assert t["midlayer.self_attn.v_proj.weight"].shape == (nkv * hd, 2 * H)
    assert t["midlayer.self_attn.o_proj.weight"].shape == (H, nh * hd)
    assert t["layers.1.self_attn.q_proj.weight"].shape == (nh * hd, H)
    assert t["midlayer.mlp.gate_proj.weight"].shape == (I, H)
    assert t["midlayer.mlp.up_proj.weight"].shape == (I, H)
    assert t["midlayer.mlp.down_proj.weight"].shape == (H, I)
    assert t["midlayer.hidden_norm.weight"].shape == (H,)
    assert t["lm_head.weight"].shape == (V, H)
    assert t["d2t"].dtype == torch.int64 and t["d2t"].shape == (V,) and not t["d2t"].any()
    assert t["t2d"].dtype == torch.bool and t["t2d"].shape == (V,) and t["t2d"].all()
    # the split names hold the right slices of our fused weights
    qkv = d.midlayer.self_attn.qkv_proj.weight
    assert torch.equal(t["midlayer.self_attn.q_proj.weight"], qkv[: nh * hd])
    assert torch.equal(t["midlayer.self_attn.v_proj.weight"], qkv[(nh + nkv) * hd:])
    gu = d.layers["1"].mlp.gate_up_proj.weight
    assert torch.equal(t["layers.1.mlp.up_proj.weight"], gu[I:])


def test_round_trip_reduced_vocab_and_bf16(tmp_path, target):
    d = init_drafter(target, num_layers=1, mask_token_id=MASK, draft_vocab_size=50)
    ids = torch.sort(torch.randperm(160, generator=torch.Generator().manual_seed(0))[:50]).values
    d.set_vocab_map(ids)
    save_drafter(d, tmp_path, dtype=torch.bfloat16)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["draft_vocab_size"] == 50 and cfg["torch_dtype"] == "bfloat16"
    t = file_tensors(tmp_path)
    assert set(t) == vllm_names(1)
    assert t["fc.weight"].dtype == torch.bfloat16
    assert t["lm_head.weight"].shape == (50, 64)
    assert t["d2t"].dtype == torch.int64 and t["t2d"].dtype == torch.bool
    assert torch.equal(t["d2t"] + torch.arange(50), ids)
    assert int(t["t2d"].sum()) == 50 and t["t2d"][ids].all()
    loaded = load_drafter(tmp_path)
    assert loaded.fc.weight.dtype == torch.float32
    assert torch.equal(loaded.fc.weight, d.fc.weight.to(torch.bfloat16).float())
    assert torch.equal(loaded.to_target_ids(torch.arange(50)), ids)
    assert torch.equal(loaded.t2d, d.t2d)


# ----------------------------------------------------------------------------- hand-built heads

HB = dict(H=32, TH=48, NH=4, NKV=2, HD=8, I=64, V=160, DV=40, EPS=1e-5, THETA=10000.0)


def hand_config(**over) -> dict:
    c = HB
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": c["H"],
           "intermediate_size": c["I"], "num_hidden_layers": 2, "num_attention_heads": c["NH"],
           "num_key_value_heads": c["NKV"], "head_dim": c["HD"], "rms_norm_eps": c["EPS"],
           "rope_theta": c["THETA"], "max_position_embeddings": 256, "vocab_size": c["V"],
           "draft_vocab_size": c["DV"], "target_hidden_size": c["TH"], "hidden_act": "silu",
           "tie_word_embeddings": False, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 5]},
           "ptd_token_id": MASK}
    cfg.update(over)
    return cfg


def hand_tensors(seed: int = 0) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Random tensors with exactly vLLM's names; returns (tensors, target ids of the draft vocab)."""
    c = HB
    g = torch.Generator().manual_seed(seed)
    H, TH, NH, NKV, HD, I, V, DV = (c[k] for k in ("H", "TH", "NH", "NKV", "HD", "I", "V", "DV"))

    def r(*shape, scale=0.2):
        return torch.randn(*shape, generator=g) * scale

    t = {"embed_tokens.weight": r(V, H, scale=1.0), "fc.weight": r(H, 3 * TH, scale=0.1),
         "mask_hidden": r(1, 1, 3 * TH, scale=1.0), "norm.weight": 1 + r(H, scale=0.1),
         "lm_head.weight": r(DV, H)}
    for pre, width in (("midlayer", 2 * H), ("layers.1", H)):
        t[f"{pre}.self_attn.q_proj.weight"] = r(NH * HD, width)
        t[f"{pre}.self_attn.k_proj.weight"] = r(NKV * HD, width)
        t[f"{pre}.self_attn.v_proj.weight"] = r(NKV * HD, width)
        t[f"{pre}.self_attn.o_proj.weight"] = r(H, NH * HD)
        t[f"{pre}.mlp.gate_proj.weight"] = r(I, H)
        t[f"{pre}.mlp.up_proj.weight"] = r(I, H)
        t[f"{pre}.mlp.down_proj.weight"] = r(H, I)
        t[f"{pre}.input_layernorm.weight"] = 1 + r(H, scale=0.1)
        t[f"{pre}.post_attention_layernorm.weight"] = 1 + r(H, scale=0.1)
    t["midlayer.hidden_norm.weight"] = 1 + r(H, scale=0.1)
    ids = torch.sort(torch.randperm(V, generator=g)[:DV]).values
    t["d2t"] = ids - torch.arange(DV)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[ids] = True
    t["t2d"] = t2d
    return t, ids


def write_head(path, cfg: dict, tensors: dict[str, torch.Tensor]) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"))


# a plain-torch reference of the EAGLE-3 head, written from docs/design.md, "The drafter" and the HF Llama layer

def _rms(x, w, eps=HB["EPS"]):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope(x, pos):
    hd = x.shape[-1]
    inv = 1.0 / (HB["THETA"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    f = (pos[:, None].double() * inv[None]).float()
    emb = torch.cat([f, f], dim=-1)[:, None, :]
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return x * emb.cos() + torch.cat([-x2, x1], dim=-1) * emb.sin()


def _attn(x, t, pre, pos):
    T, NH, NKV, HD = x.shape[0], HB["NH"], HB["NKV"], HB["HD"]
    q = (x @ t[f"{pre}.self_attn.q_proj.weight"].T).view(T, NH, HD)
    k = (x @ t[f"{pre}.self_attn.k_proj.weight"].T).view(T, NKV, HD)
    v = (x @ t[f"{pre}.self_attn.v_proj.weight"].T).view(T, NKV, HD)
    q, k = _rope(q, pos), _rope(k, pos)
    k, v = k.repeat_interleave(NH // NKV, dim=1), v.repeat_interleave(NH // NKV, dim=1)
    s = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(HD)
    s = s.masked_fill(pos[None, None, :] > pos[None, :, None], float("-inf"))
    o = torch.einsum("hqk,khd->qhd", s.softmax(-1), v).reshape(T, NH * HD)
    return o @ t[f"{pre}.self_attn.o_proj.weight"].T


def _mlp(x, t, pre):
    gate = x @ t[f"{pre}.mlp.gate_proj.weight"].T
    up = x @ t[f"{pre}.mlp.up_proj.weight"].T
    return (torch.nn.functional.silu(gate) * up) @ t[f"{pre}.mlp.down_proj.weight"].T


def reference_head(t, ids, hidden, pos, norm_before_residual):
    emb = t["embed_tokens.weight"][ids]
    normed = _rms(hidden, t["midlayer.hidden_norm.weight"])
    x = torch.cat([_rms(emb, t["midlayer.input_layernorm.weight"]), normed], dim=-1)
    h = (normed if norm_before_residual else hidden) + _attn(x, t, "midlayer", pos)
    h = h + _mlp(_rms(h, t["midlayer.post_attention_layernorm.weight"]), t, "midlayer")
    a = h + _attn(_rms(h, t["layers.1.input_layernorm.weight"]), t, "layers.1", pos)
    out = a + _mlp(_rms(a, t["layers.1.post_attention_layernorm.weight"]), t, "layers.1")
    return _rms(out, t["norm.weight"]), out


@pytest.mark.parametrize("nbr", [False, True])
def test_hand_built_head(tmp_path, nbr):
    tensors, ids = hand_tensors()
    write_head(tmp_path, hand_config(norm_before_residual=nbr), tensors)
    d = load_drafter(tmp_path)
    c = d.cfg
    assert c.mask_token_id == MASK  # from ptd_token_id only
    assert c.aux_layer_ids == [1, 3, 5]  # from eagle_config only
    assert (c.hidden_size, c.target_hidden_size, c.draft_vocab_size, c.vocab_size) == (32, 48, 40, 160)
    assert c.norm_before_residual is nbr

    # the vocabulary map: target_id = draft_id + d2t[draft_id]
    assert torch.equal(d.to_target_ids(torch.arange(40)), ids)
    assert torch.equal(d.to_target_ids(torch.tensor([0, 39, 7])), ids[[0, 39, 7]])
    assert torch.equal(d.t2d, tensors["t2d"])

    # weights landed in the right places
    g = torch.Generator().manual_seed(5)
    taps = torch.randn(6, 3 * 48, generator=g)
    assert torch.allclose(d.project(taps), taps @ tensors["fc.weight"].T, atol=1e-5)
    assert torch.allclose(d.mask_feature(), tensors["fc.weight"] @ tensors["mask_hidden"].flatten(), atol=1e-5)
    normed = torch.randn(3, 32, generator=g)
    assert torch.allclose(d.logits(normed), normed @ tensors["lm_head.weight"].T, atol=1e-5)
    assert torch.equal(d.midlayer.self_attn.qkv_proj.weight, torch.cat(
        [tensors[f"midlayer.self_attn.{p}_proj.weight"] for p in "qkv"]))
    assert torch.equal(d.layers["1"].mlp.gate_up_proj.weight, torch.cat(
        [tensors[f"layers.1.mlp.{p}_proj.weight"] for p in ("gate", "up")]))

    # one forward over a P-EAGLE-style row layout (real features, then mask slots) against plain torch
    T = 7
    tok = torch.tensor([5, 17, 99, 3, MASK, MASK, MASK])
    pos = torch.arange(T)
    hidden = torch.cat([taps[:4] @ tensors["fc.weight"].T,
                        (tensors["fc.weight"] @ tensors["mask_hidden"].flatten()).expand(3, 32)])
    slots = torch.randperm(32, generator=g)[:T]  # scattered cache slots
    caches = d.make_caches(32)
    # the context is this step's rows, in scattered slots
    meta = AttnMeta.single(slots, 0, T)
    with torch.inference_mode():
        got_normed, got_pre = d(tok, hidden, pos, caches, meta)
        got_tokens = d.to_target_ids(d.logits(got_normed).argmax(-1))
    ref_normed, ref_pre = reference_head(tensors, tok, hidden, pos, nbr)
    assert (got_pre - ref_pre).abs().max().item() <= 1e-4
    assert (got_normed - ref_normed).abs().max().item() <= 1e-4
    assert torch.equal(got_tokens, ids[(ref_normed @ tensors["lm_head.weight"].T).argmax(-1)])


def test_hand_built_head_model_prefix_and_flat_mask_hidden(tmp_path):
    """Names with a ``model.`` prefix and a flat ``mask_hidden`` [3*H_target] also load."""
    tensors, _ = hand_tensors(seed=1)
    t2 = {("model." + k if k.startswith(("midlayer", "layers")) else k): v for k, v in tensors.items()}
    t2["mask_hidden"] = tensors["mask_hidden"].flatten()
    write_head(tmp_path, hand_config(), t2)
    d = load_drafter(tmp_path)
    assert torch.equal(d.mask_hidden, tensors["mask_hidden"])
    assert torch.equal(d.midlayer.hidden_norm.weight, tensors["midlayer.hidden_norm.weight"])


@pytest.mark.parametrize("keys,expect", [
    ({"mask_token_id": 151, "pard_token": 152, "ptd_token_id": 153}, 151),
    ({"pard_token": 152, "ptd_token_id": 153}, 152),
    ({"ptd_token_id": 153}, 153),
    ({"mask_token_id": None, "ptd_token_id": 153}, 153),
    ({}, None),
])
def test_mask_token_lookup_order(keys, expect):
    cfg = hand_config()
    cfg.pop("ptd_token_id")
    cfg.update(keys)
    assert DrafterConfig.from_dict(cfg).mask_token_id == expect


def test_alternative_architecture_and_top_level_aux_ids():
    cfg = hand_config(architectures=["Eagle3LlamaForCausalLM"], eagle_aux_hidden_state_layer_ids=[0, 2, 4])
    c = DrafterConfig.from_dict(cfg)
    assert c.aux_layer_ids == [0, 2, 4]


def test_head_without_embedding_uses_base(tmp_path):
    tensors, _ = hand_tensors(seed=2)
    del tensors["embed_tokens.weight"]
    write_head(tmp_path, hand_config(), tensors)
    base = torch.randn(160, 32, generator=torch.Generator().manual_seed(3))
    d = load_drafter(tmp_path, base_embedding=base)
    assert torch.equal(d.embed_tokens.weight, base)
    with pytest.raises(CheckpointError, match="embed_tokens"):
        load_drafter(tmp_path)


def test_full_vocab_head_without_vocab_map_gets_identity(tmp_path):
    tensors, _ = hand_tensors(seed=4)
    del tensors["d2t"], tensors["t2d"]
    tensors["lm_head.weight"] = torch.randn(160, 32)
    write_head(tmp_path, hand_config(draft_vocab_size=160), tensors)
    d = load_drafter(tmp_path)
    assert torch.equal(d.to_target_ids(torch.arange(160)), torch.arange(160))
    assert d.t2d.all()


def test_reduced_vocab_head_without_vocab_map_refused(tmp_path):
    tensors, _ = hand_tensors(seed=4)
    del tensors["d2t"]
    write_head(tmp_path, hand_config(), tensors)
    with pytest.raises(CheckpointError, match="d2t"):
        load_drafter(tmp_path)


def test_vocab_map_outside_target_vocab_refused(tmp_path):
    tensors, _ = hand_tensors(seed=4)
    tensors["d2t"][-1] = 200
    write_head(tmp_path, hand_config(), tensors)
    with pytest.raises(CheckpointError, match="d2t"):
        load_drafter(tmp_path)


# ----------------------------------------------------------------------------- mismatch with the target

def _mismatches(target):
    base = init_drafter(target, 1, MASK).cfg
    L = target.cfg.num_layers
    return {
        "hidden": (dataclasses.replace(base, target_hidden_size=48), "target_hidden_size 48"),
        "vocab": (dataclasses.replace(base, vocab_size=170, draft_vocab_size=170), "vocab_size 170"),
        "aux": (dataclasses.replace(base, aux_layer_ids=[1, 3, 5]), "eagle_aux_hidden_state_layer_ids"),
        "aux-order": (dataclasses.replace(base, aux_layer_ids=[L - 3, L // 2, 2]), "eagle_aux_hidden_state_layer_ids"),
        "mask-missing": (dataclasses.replace(base, mask_token_id=None), "no mask token"),
        "mask-too-big": (dataclasses.replace(base, mask_token_id=160), "outside the vocabulary"),
        "mask-negative": (dataclasses.replace(base, mask_token_id=-1), "outside the vocabulary"),
        "mask-eos": (dataclasses.replace(base, mask_token_id=2), "EOS"),
    }


@pytest.mark.parametrize("case", ["hidden", "vocab", "aux", "aux-order", "mask-missing", "mask-too-big",
                                  "mask-negative", "mask-eos"])
def test_mismatch_refused(target, case):
    cfg, needle = _mismatches(target)[case]
    with pytest.raises(DrafterMismatchError, match=needle):
        cfg.check_target(target.cfg, target.aux_layers)
    threads = torch.get_num_threads()
    try:
        with pytest.raises(DrafterMismatchError, match=needle):
            LLMEngine(target, Drafter(cfg), EngineConfig())
    finally:
        torch.set_num_threads(threads)


def test_every_mismatch_is_named(target):
    base = init_drafter(target, 1, MASK).cfg
    cfg = dataclasses.replace(base, target_hidden_size=48, vocab_size=170, aux_layer_ids=[0, 1, 2], mask_token_id=None)
    with pytest.raises(DrafterMismatchError) as ei:
        cfg.check_target(target.cfg, target.aux_layers)
    msg = str(ei.value)
    for needle in ("target_hidden_size", "vocab_size 170", "eagle_aux_hidden_state_layer_ids", "no mask token"):
        assert needle in msg


def test_mask_equal_to_any_eos_refused(target):
    cfg = dataclasses.replace(init_drafter(target, 1, MASK).cfg, mask_token_id=7)
    tcfg = dataclasses.replace(target.cfg, eos_token_ids=[2, 7])
    with pytest.raises(DrafterMismatchError, match="EOS"):
        cfg.check_target(tcfg, target.aux_layers)


def test_drafter_config_rope_formats():
    l3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32}
    c = DrafterConfig.from_dict(hand_config(rope_parameters={**l3, "rope_theta": 5e5}))
    assert c.rope_theta == 5e5 and c.rope_scaling == l3
    c = DrafterConfig.from_dict(hand_config(rope_parameters={"rope_type": "default", "rope_theta": 7.0}))
    assert c.rope_theta == 7.0 and c.rope_scaling is None
    back = DrafterConfig.from_dict(c.to_dict())
    assert cfg_fields(back) == cfg_fields(c)


def test_matching_head_accepted(target, tmp_path):
    """A head saved and loaded back is the same head, fits its target, and the engine drafts with it."""
    d = init_drafter(target, 1, MASK)
    save_drafter(d, tmp_path)
    loaded = load_drafter(tmp_path)
    saved, back = d.state_dict(), loaded.state_dict()
    assert saved.keys() == back.keys() and all(torch.equal(saved[k], back[k]) for k in saved)
    loaded.cfg.check_target(target.cfg, target.aux_layers)
    # a head with no aux ids in its config takes the target's taps (vLLM's default)
    dataclasses.replace(loaded.cfg, aux_layer_ids=[]).check_target(target.cfg, target.aux_layers)
    threads = torch.get_num_threads()
    try:
        engine = LLMEngine(target, loaded, EngineConfig(num_speculative_tokens=3, max_num_seqs=1, max_model_len=64))
        out = engine.generate([[5, 6, 7, 8]], SamplingParams(max_tokens=8, ignore_eos=True))[0]
    finally:
        torch.set_num_threads(threads)
    assert out.stats.num_drafts > 0 and len(out.token_ids) == 8


def test_head_from_disk_for_other_target_refused_by_engine(tmp_path, target):
    tensors, _ = hand_tensors(seed=6)
    write_head(tmp_path, hand_config(), tensors)
    d = load_drafter(tmp_path)
    threads = torch.get_num_threads()
    try:
        with pytest.raises(DrafterMismatchError, match="target_hidden_size 48"):
            LLMEngine(target, d, EngineConfig())
    finally:
        torch.set_num_threads(threads)


# ----------------------------------------------------------------------------- broken checkpoints

@pytest.fixture()
def saved_head(tmp_path, target):
    save_drafter(init_drafter(target, 2, MASK), tmp_path)
    return tmp_path


@pytest.mark.parametrize("how", ["truncate", "header", "empty"])
def test_corrupt_safetensors(saved_head, how):
    f = saved_head / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes({"truncate": data[: len(data) // 2], "header": b"\xff" * 16 + data[16:], "empty": b""}[how])
    with pytest.raises(CheckpointError) as ei:
        load_drafter(saved_head)
    assert "model.safetensors" in str(ei.value)


def test_no_weights(saved_head):
    (saved_head / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="safetensors"):
        load_drafter(saved_head)


def test_missing_config(saved_head):
    (saved_head / "config.json").unlink()
    with pytest.raises(CheckpointError, match="config.json"):
        load_drafter(saved_head)


@pytest.mark.parametrize("text", ["{not json", json.dumps({"architectures": ["LlamaForCausalLMEagle3"]})])
def test_bad_config(saved_head, text):
    (saved_head / "config.json").write_text(text)
    with pytest.raises(CheckpointError, match="config"):
        load_drafter(saved_head)


@pytest.mark.parametrize("archs", [["LlamaForCausalLM"], [], None])
def test_wrong_architecture(saved_head, archs):
    cfg = json.loads((saved_head / "config.json").read_text())
    cfg["architectures"] = archs
    (saved_head / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="EAGLE-3"):
        load_drafter(saved_head)


def test_eagle1_style_head_refused(saved_head):
    cfg = json.loads((saved_head / "config.json").read_text())
    cfg["eagle_config"]["use_aux_hidden_state"] = False
    (saved_head / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="use_aux_hidden_state"):
        load_drafter(saved_head)


def _rewrite(path, fn):
    f = path / "model.safetensors"
    t = load_file(str(f))
    fn(t)
    save_file(t, str(f))


@pytest.mark.parametrize("name,shape", [
    ("fc.weight", (64, 190)),
    ("lm_head.weight", (150, 64)),
    ("mask_hidden", (1, 1, 64)),
    ("norm.weight", (63,)),
    ("midlayer.hidden_norm.weight", (65,)),
    ("embed_tokens.weight", (160, 32)),
    ("t2d", (150,)),
])
def test_wrong_shape_named(saved_head, name, shape):
    _rewrite(saved_head, lambda t: t.__setitem__(name, torch.zeros(shape, dtype=t[name].dtype)))
    with pytest.raises(CheckpointError) as ei:
        load_drafter(saved_head)
    assert name in str(ei.value)


FUSED_PART_CASES = [
    ("midlayer.self_attn.q_proj.weight", (72, 128)),       # wrong output rows (input width right)
    ("layers.1.mlp.gate_proj.weight", (100, 64)),          # wrong output rows
    ("midlayer.self_attn.q_proj.weight", (64, 64)),        # midlayer q_proj must read 2H, not H
    ("layers.1.self_attn.k_proj.weight", (32, 65)),        # wrong input width
    ("midlayer.mlp.up_proj.weight", (128, 65)),            # wrong input width
]


@pytest.mark.parametrize("name,shape", FUSED_PART_CASES)
def test_wrong_shape_of_fused_part_is_checkpoint_error(saved_head, name, shape):
    """q/k/v and gate/up are stored separately on disk but fused on load: a wrong shape in one
    part must still be a CheckpointError (not a raw torch error) that points at its layer."""
    _rewrite(saved_head, lambda t: t.__setitem__(name, torch.zeros(shape)))
    with pytest.raises(CheckpointError) as ei:
        load_drafter(saved_head)
    assert name.rsplit(".", 2)[0] in str(ei.value)  # e.g. "midlayer.self_attn"


@pytest.mark.parametrize("name,shape", FUSED_PART_CASES)
def test_wrong_shape_of_fused_part_names_file_tensor(saved_head, name, shape):
    """... and the message names the tensor as the file calls it (q_proj, not our fused qkv_proj)."""
    _rewrite(saved_head, lambda t: t.__setitem__(name, torch.zeros(shape)))
    with pytest.raises(CheckpointError) as ei:
        load_drafter(saved_head)
    assert name in str(ei.value)


def test_missing_and_unexpected_tensors_named(saved_head):
    def fn(t):
        del t["midlayer.hidden_norm.weight"]
        t["layers.1.hidden_norm.weight"] = torch.ones(64)
    _rewrite(saved_head, fn)
    with pytest.raises(CheckpointError) as ei:
        load_drafter(saved_head)
    assert "midlayer.hidden_norm.weight" in str(ei.value) and "layers.1.hidden_norm.weight" in str(ei.value)


# ----------------------------------------------------------------------------- the real tokenizer

@pytest.mark.slow
def test_choose_mask_token_on_default_tokenizer():
    tok = load_tokenizer(resolve_target(None))
    m = choose_mask_token(tok)
    assert m in tok.added_tokens_decoder and tok.added_tokens_decoder[m].special
    assert m not in {tok.bos_token_id, tok.eos_token_id, tok.pad_token_id}
    assert 0 <= m < len(tok)
    conv = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Write a Python function that reverses a list, and explain it."},
            {"role": "assistant", "content": "def rev(xs):\n    return xs[::-1]\n\nSlicing with step -1 copies."},
            {"role": "user", "content": "What is 17 * 23? Also: <b>bold</b> & emoji 😀, tabs\tand\nnewlines."}]
    text = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert m not in ids
    ids2 = tok.apply_chat_template(conv, tokenize=True, add_generation_prompt=True)
    ids2 = ids2["input_ids"] if not isinstance(ids2, list) else ids2
    assert m not in ids2
    assert m not in tok("plain text without any template at all.")["input_ids"]


def test_default_heads_per_method(tmp_path, monkeypatch):
    """A target's shipped P-EAGLE head serves `parallel`; `eagle3` takes its EAGLE-3 head when one ships."""
    from peagle.models import loader

    monkeypatch.setattr(loader, "HEADS", tmp_path)
    target = tmp_path / "models" / "Tiny"
    assert loader.default_drafter_path(target) is None
    for name in ("Tiny", "Tiny-eagle3"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text("{}")
        if name == "Tiny":
            assert loader.default_drafter_path(target, "eagle3") == tmp_path / "Tiny"  # falls back
    assert loader.default_drafter_path(target, "parallel") == tmp_path / "Tiny"
    assert loader.default_drafter_path(target, "eagle3") == tmp_path / "Tiny-eagle3"


def test_the_gemma_file_finds_its_shipped_head(tmp_path, monkeypatch):
    """Gemma 3 270M's GGUF, assembled in the cache, gets a folder named after the file (other GGUF files: a key
    of path, size and time), so `peagle/heads/gemma-3-270m-q4_k_m` is its default head."""
    from peagle.models import loader

    monkeypatch.setenv("PEAGLE_CACHE", str(tmp_path))
    (tmp_path / "models").mkdir()
    gemma = tmp_path / "models" / loader.GEMMA_GGUF[1]
    other = tmp_path / "models" / "other.gguf"
    gemma.write_bytes(b"GGUF")
    other.write_bytes(b"GGUF")
    assert loader._gguf_cache(gemma) == tmp_path / "models" / "gemma-3-270m-q4_k_m"
    assert loader._gguf_cache(other).name.startswith("other-")
    assert (loader.HEADS / "gemma-3-270m-q4_k_m" / "config.json").is_file()
    assert loader.default_drafter_path(loader._gguf_cache(gemma)) == loader.HEADS / "gemma-3-270m-q4_k_m"
