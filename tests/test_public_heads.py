"""The public P-EAGLE heads' checkpoint format, and what vLLM requires of a head.

Scaled-down replicas of amazon/GPT-OSS-20B-P-EAGLE, amazon/gpt-oss-120b-p-eagle and
amazon/Qwen3-Coder-30B-A3B-Instruct-P-EAGLE (their config fields and tensor names, tiny sizes) load
with ``load_drafter`` and keep speculative output lossless on a tiny target of their family. A port of
vLLM's loading checks (``vllm_problems``) then shows that heads saved by ``save_drafter`` give vLLM
everything it reads and nothing it would refuse.

Facts the replicas copy, and where they come from:

- amazon/GPT-OSS-20B-P-EAGLE: aws-neuron/nkipy, examples/models/gpt_oss/eagle/ (README.md, config.py,
  drafter_cpu.py), a reimplementation that loads the real checkpoint. Its config.json is read by
  transformers' AutoConfig and has hidden_size (2880), num_hidden_layers (4: ``midlayer`` plus
  ``layers.1..3``), num_attention_heads, num_key_value_heads, head_dim, intermediate_size, rms_norm_eps,
  ``rope_scaling`` of rope_type "llama3" (while the target uses YaRN), vocab_size = draft_vocab_size
  (201088) and ``ptd_token_id`` 201020. One model.safetensors holds embed_tokens.weight, fc.weight
  (8640 -> 2880), mask_hidden (1, 1, 8640), midlayer.* with hidden_norm, layers.{1,2,3}.* without it,
  norm.weight, lm_head.weight (2880 -> 201088) and an identity d2t/t2d. It reads target layers
  2, 12, 21 of 24, which are the default ids (2, L//2, L-3), so the replica names none.
  ``architectures`` ["LlamaForCausalLMEagle3"] and trained for K = 10: docs/design.md
  ("The drafter"). The intermediate size is not known; the replica's is arbitrary.
- amazon/gpt-oss-120b-p-eagle: its model card, as captured by onlylabs.fyi (4 layers, 8 parallel
  tokens, 1.7B parameters, served by vLLM with eagle3 + parallel_drafting at K = 5). Its config.json
  was not found in the sources searched: the replica assumes the 20B head's field set at 120B's
  sizes (target: hidden 2880, 36 layers, so taps (2, 18, 33)), and writes the tap ids in
  ``eagle_config``, as EAGLE-3 heads commonly do.
- amazon/Qwen3-Coder-30B-A3B-Instruct-P-EAGLE: public heads (4 layers, trained for K = 18) and
  vllm-project/vllm-ascend's e2e test (served on Qwen/Qwen3-Coder-30B-A3B-Instruct with parallel
  drafting, 8 speculative tokens). Its config.json was not found either: the replica assumes the same
  field set with default RoPE at the target's theta (1e7), ``ptd_token_id`` on a spare id, and a
  reduced draft vocabulary (EAGLE-3's usual choice), so a partial d2t/t2d is covered too.

Scaled down: hidden 64 (2880 / 2048), vocabularies of 160, 8 or 9 target layers (24, 36, 48), the
head's attention shaped like its target's; the mask token id keeps its place near the end of the
vocabulary.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoConfig, GptOssConfig, LlamaConfig, Qwen3MoeConfig

from conftest import native_from_hf, tiny_hf
from speculation import OracleDrafter, assert_caught, make_engine, oracle_run, references
from peagle.engine.llm_engine import EngineConfig, LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.models.drafter import load_drafter, save_drafter
from peagle.models.loader import init_drafter
from test_moe_models import native, random_hf

TINY = dict(vocab_size=160, hidden_size=64, max_position_embeddings=4096, eos_token_id=2, bos_token_id=1)
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}
TARGETS = {  # scaled-down targets: attention, experts and RoPE shaped like the real ones
    "gpt-oss-20b": lambda: GptOssConfig(**TINY, num_hidden_layers=8, intermediate_size=32, num_attention_heads=4,
                                        num_key_value_heads=2, head_dim=16, num_local_experts=8,
                                        num_experts_per_tok=4, sliding_window=8),
    "gpt-oss-120b": lambda: GptOssConfig(**TINY, num_hidden_layers=9, intermediate_size=32, num_attention_heads=4,
                                         num_key_value_heads=2, head_dim=16, num_local_experts=8,
                                         num_experts_per_tok=4, sliding_window=8),
    "qwen3-coder-30b-a3b": lambda: Qwen3MoeConfig(**TINY, num_hidden_layers=8, intermediate_size=96,
                                                  moe_intermediate_size=32, num_attention_heads=8,
                                                  num_key_value_heads=1, head_dim=16, num_experts=8,
                                                  num_experts_per_tok=4, norm_topk_prob=True,
                                                  rope_parameters={"rope_type": "default", "rope_theta": 1e7}),
}


def head_config(mask_id: int, draft_vocab: int, **fields) -> dict:
    """The public heads' config.json field set (module docstring), at the replica's sizes."""
    return {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 64,
            "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 16, "hidden_act": "silu", "rms_norm_eps": 1e-5, "max_position_embeddings": 4096,
            "vocab_size": 160, "draft_vocab_size": draft_vocab, "tie_word_embeddings": False,
            "torch_dtype": "bfloat16", "ptd_token_id": mask_id, **fields}


PUBLIC_HEADS = {
    "amazon/GPT-OSS-20B-P-EAGLE": ("gpt-oss-20b", head_config(
        158, 160, rope_theta=500000.0, rope_scaling=LLAMA3)),
    "amazon/gpt-oss-120b-p-eagle": ("gpt-oss-120b", head_config(
        158, 160, rope_theta=500000.0, rope_scaling=LLAMA3,
        eagle_config={"eagle_aux_hidden_state_layer_ids": [2, 4, 6]})),
    "amazon/Qwen3-Coder-30B-A3B-Instruct-P-EAGLE": ("qwen3-coder-30b-a3b", head_config(
        157, 100, num_attention_heads=8, num_key_value_heads=1, rope_theta=1e7)),
}


def write_head(path: Path, cfg: dict, target_hidden: int, seed: int = 0) -> torch.Tensor:
    """A head with ``cfg`` and random weights under the public heads' tensor names; returns the
    target ids of its draft vocabulary (all of them, or a random sorted subset)."""
    g = torch.Generator().manual_seed(seed)
    H, I, V, DV = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["draft_vocab_size"]
    q, kv = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"]

    def r(*shape, scale=0.1):
        return torch.randn(*shape, generator=g) * scale

    t = {"embed_tokens.weight": r(V, H, scale=1.0), "fc.weight": r(H, 3 * target_hidden),
         "mask_hidden": r(1, 1, 3 * target_hidden, scale=1.0), "norm.weight": 1 + r(H), "lm_head.weight": r(DV, H)}
    for i in range(cfg["num_hidden_layers"]):
        pre, width = ("midlayer", 2 * H) if i == 0 else (f"layers.{i}", H)
        t |= {f"{pre}.self_attn.q_proj.weight": r(q, width), f"{pre}.self_attn.k_proj.weight": r(kv, width),
              f"{pre}.self_attn.v_proj.weight": r(kv, width), f"{pre}.self_attn.o_proj.weight": r(H, q),
              f"{pre}.mlp.gate_proj.weight": r(I, H), f"{pre}.mlp.up_proj.weight": r(I, H),
              f"{pre}.mlp.down_proj.weight": r(H, I), f"{pre}.input_layernorm.weight": 1 + r(H),
              f"{pre}.post_attention_layernorm.weight": 1 + r(H)}
        if i == 0:
            t[f"{pre}.hidden_norm.weight"] = 1 + r(H)
    ids = torch.arange(V) if DV == V else torch.randperm(V, generator=g)[:DV].sort().values
    t["d2t"] = ids - torch.arange(DV)
    t["t2d"] = torch.zeros(V, dtype=torch.bool)
    t["t2d"][ids] = True
    save_file({k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in t.items()},
              str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    return ids


@pytest.mark.parametrize("name", list(PUBLIC_HEADS))
def test_public_head_replica_loads_and_stays_lossless(tmp_path, name):
    family, cfg = PUBLIC_HEADS[name]
    target = native(random_hf(TARGETS[family](), seed=1))
    ids = write_head(tmp_path, cfg, target.cfg.hidden_size)
    assert vllm_problems(tmp_path) == []
    head = load_drafter(tmp_path)
    assert head.cfg.mask_token_id == cfg["ptd_token_id"]
    assert head.cfg.rope_scaling == cfg.get("rope_scaling") and head.cfg.rope_theta == cfg["rope_theta"]
    assert head.cfg.aux_layer_ids in ([], list(target.aux_layers))
    assert torch.equal(head.to_target_ids(torch.arange(cfg["draft_vocab_size"])), ids)
    head.cfg.check_target(target.cfg, target.aux_layers)

    # the replica's config, layers and tensors drafting each sequence's own continuation (every 4th position
    # wrong; tokens outside a reduced draft vocabulary cannot be drafted): lossless with drafts accepted; a
    # verifier that rejects every draft (planted) is caught
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, 150, (n,), generator=g).tolist() for n in (4, 11, 19)]
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    ref = [o.token_ids for o in make_engine(target, None, "none").generate(prompts, params)]
    oracle = OracleDrafter(dataclasses.replace(head.cfg, trained_k=None), references(prompts, ref), 4)
    oracle.load_state_dict(head.state_dict(), assign=True)
    oracle.eval()
    rate = 0.1 if cfg["draft_vocab_size"] < cfg["vocab_size"] else 0.25
    for method, k in (("parallel", 3), ("parallel", 8), ("eagle3", 3)):
        _, watch, got = oracle_run(target, oracle, method, k, prompts, params)()
        watch.check(got, ref, rate=rate)
    assert_caught("reject_all", oracle_run(target, oracle, "parallel", 3, prompts, params), ref, rate=rate)

    save_drafter(head, tmp_path / "resaved")  # what we write back is vLLM-loadable too
    assert vllm_problems(tmp_path / "resaved") == []


# ----------------------------------------------------------------------------- what vLLM requires

VLLM_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")
STACKED = {".q_proj.": ".qkv_proj.", ".k_proj.": ".qkv_proj.", ".v_proj.": ".qkv_proj.",
           ".gate_proj.": ".gate_up_proj.", ".up_proj.": ".gate_up_proj."}


def vllm_problems(path: Path, parallel_drafting: bool = True) -> list[str]:
    """What vLLM would refuse in the head at ``path``, from reading its source (vllm-project/vllm):

    - model_executor/models/registry.py: both names in VLLM_ARCHITECTURES map to llama_eagle3's
      Eagle3LlamaForCausalLM (transformers_utils/configs/eagle.py keeps an architecture ending in
      "Eagle3" as it is); config.json is read through transformers' AutoConfig (a LlamaConfig);
    - model_executor/models/llama_eagle3.py: LlamaMLP (silu only); layer 0's q/k/v read 2 * hidden;
      ``fc`` reads 3 * target_hidden_size (hidden_size if absent); q/k/v/o biases iff attention_bias;
      ``lm_head`` has draft_vocab_size rows (vocab_size if absent); ``load_weights`` skips ``t2d``,
      renames ``d2t`` to ``draft_id_to_target_id`` (int64 [draft_vocab]), copies ``mask_hidden`` into a
      buffer of 3 * hidden_size values and refuses a parallel-drafting head without it, prefixes the
      rest with ``model.``, maps ``midlayer.`` to ``layers.0.`` and stacks q/k/v and gate/up; a name
      with no parameter is a KeyError;
    - v1/spec_decode/llm_base_proposer.py: the mask token is ``mask_token_id`` if not null, else the
      first present of ``pard_token``, ``ptd_token_id`` (a present null is taken as the id);
    - v1/worker/gpu_model_runner.py: the target taps come from a top-level
      ``eagle_aux_hidden_state_layer_ids`` (some versions also read ``eagle_config``).
    """
    cfg = json.loads((path / "config.json").read_text())
    problems = []
    if not set(cfg.get("architectures") or []) & set(VLLM_ARCHITECTURES):
        problems.append(f"architectures {cfg.get('architectures')} has none of {VLLM_ARCHITECTURES}")
    hf = AutoConfig.from_pretrained(str(path))
    if not isinstance(hf, LlamaConfig):
        problems.append(f"config.json loads as {type(hf).__name__}, not a LlamaConfig")
    if hf.hidden_act != "silu":
        problems.append(f"hidden_act {hf.hidden_act!r}: vLLM's LlamaMLP supports only silu")
    if not (getattr(hf, "eagle_config", None) or {}).get("use_aux_hidden_state", True):
        problems.append("eagle_config.use_aux_hidden_state is false: no fc, no target taps")
    taps = getattr(hf, "eagle_aux_hidden_state_layer_ids", None)
    if taps is not None and not (isinstance(taps, list) and all(isinstance(i, int) for i in taps)):
        problems.append(f"eagle_aux_hidden_state_layer_ids {taps!r} is not a list of layer ids")
    H, V = hf.hidden_size, hf.vocab_size
    if parallel_drafting:
        mask = hf.mask_token_id if getattr(hf, "mask_token_id", None) is not None else next(
            (getattr(hf, k) for k in ("pard_token", "ptd_token_id") if hasattr(hf, k)), None)
        if not isinstance(mask, int) or not 0 <= mask < V:
            problems.append(f"mask token {mask!r} (mask_token_id / pard_token / ptd_token_id) is not an id < {V}")

    nh = hf.num_attention_heads
    nkv, hd = hf.num_key_value_heads or nh, getattr(hf, "head_dim", None) or H // nh
    inter, DV = hf.intermediate_size, getattr(hf, "draft_vocab_size", None) or V
    TH = getattr(hf, "target_hidden_size", None) or H
    params = {"model.embed_tokens.weight": (V, H), "model.fc.weight": (H, 3 * TH), "model.norm.weight": (H,),
              "lm_head.weight": (DV, H), "draft_id_to_target_id": (DV,)}
    for i in range(hf.num_hidden_layers):
        p = f"model.layers.{i}."
        params |= {p + "self_attn.qkv_proj.weight": ((nh + 2 * nkv) * hd, 2 * H if i == 0 else H),
                   p + "self_attn.o_proj.weight": (H, nh * hd), p + "mlp.gate_up_proj.weight": (2 * inter, H),
                   p + "mlp.down_proj.weight": (H, inter), p + "input_layernorm.weight": (H,),
                   p + "post_attention_layernorm.weight": (H,), p + "hidden_norm.weight": (H,)}
        if hf.attention_bias:
            params |= {p + "self_attn.qkv_proj.bias": ((nh + 2 * nkv) * hd,), p + "self_attn.o_proj.bias": (H,)}
    shard_rows = {".q_proj.": nh * hd, ".k_proj.": nkv * hd, ".v_proj.": nkv * hd, ".gate_proj.": inter,
                  ".up_proj.": inter}

    loaded, has_mask_hidden = set(), False
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        for disk in f.keys():
            t = f.get_tensor(disk)
            name = disk
            if "t2d" in name:
                continue
            if "d2t" in name:
                name = name.replace("d2t", "draft_id_to_target_id")
                if t.dtype != torch.int64:
                    problems.append(f"d2t is {t.dtype}, not int64")
            elif "mask_hidden" in name:
                has_mask_hidden = True
                if t.numel() != 3 * H:
                    problems.append(f"mask_hidden has {t.numel()} values; vLLM's buffer holds 3 * hidden_size")
                continue
            elif "lm_head" not in name:
                name = "model." + name.replace("midlayer.", "layers.0.")
            part = next((s for s in STACKED if s in name), None)
            if part is not None:
                name = name.replace(part, STACKED[part])
            if name not in params:
                problems.append(f"{disk}: vLLM has no parameter {name}")
                continue
            want = params[name] if part is None else (shard_rows[part],) + params[name][1:]
            if tuple(t.shape) != want:
                problems.append(f"{disk}: shape {tuple(t.shape)}, vLLM loads {want} into {name}")
            loaded.add(name)
    optional = {"model.embed_tokens.weight"} | {n for n in params if "hidden_norm" in n and ".layers.0." not in n}
    if DV == V:
        optional.add("draft_id_to_target_id")
    missing = sorted(set(params) - loaded - optional)
    if missing:
        problems.append(f"missing weights {missing[:6]}")
    if parallel_drafting and not has_mask_hidden:
        problems.append("no mask_hidden: vLLM refuses a parallel-drafting head without it")
    return problems


@pytest.mark.parametrize("family", ["llama", "llama3", "llama-bias-tied", "qwen3"])
def test_saved_head_gives_vllm_what_it_reads(tmp_path, family):
    target = native_from_hf(tiny_hf(family))
    head = init_drafter(target, 3, 150, draft_vocab_size=100 if family == "qwen3" else None, trained_k=7)
    if family == "llama-bias-tied":
        head = type(head)(dataclasses.replace(head.cfg, attention_bias=True))
        head.init_weights(1)
    save_drafter(head, tmp_path, dtype=torch.bfloat16)
    assert vllm_problems(tmp_path) == []
    hf = AutoConfig.from_pretrained(str(tmp_path))
    assert hf.eagle_aux_hidden_state_layer_ids == list(target.aux_layers)
    assert hf.mask_token_id == hf.ptd_token_id == 150
    assert hf.draft_vocab_size == head.cfg.draft_vocab_size and hf.target_hidden_size == target.cfg.hidden_size


def test_saved_moe_target_heads_give_vllm_what_it_reads(tmp_path):
    for family in TARGETS:
        target = native(random_hf(TARGETS[family]()))
        save_drafter(init_drafter(target, 2, 158), tmp_path / family)
        assert vllm_problems(tmp_path / family) == [], family


def _drop(d: dict, *keys: str) -> dict:
    return {k: v for k, v in d.items() if k not in keys}


@pytest.mark.parametrize("case,needle", [
    ("architecture", "architectures"), ("no mask token", "mask token"), ("null ptd_token_id", "mask token"),
    ("gelu", "silu"), ("renamed tensor", "no parameter"), ("no mask_hidden", "no mask_hidden"),
    ("no fc", "missing weights"), ("wide head", "mask_hidden"), ("short d2t", "d2t"),
])
def test_vllm_problems_names_what_vllm_refuses(tmp_path, case, needle):
    """The checker is not vacuous: each thing vLLM would refuse is named."""
    target = native_from_hf(tiny_hf("llama"))
    head = init_drafter(target, 2, 150, draft_vocab_size=100)
    if case == "wide head":  # vLLM sizes mask_hidden by the head's own hidden_size, not the target's
        head = type(head)(dataclasses.replace(head.cfg, hidden_size=96, num_heads=6))
        head.init_weights(0)
    save_drafter(head, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg = {"architecture": lambda c: {**c, "architectures": ["LlamaForCausalLM"]},
           "no mask token": lambda c: _drop(c, "mask_token_id", "ptd_token_id"),
           "null ptd_token_id": lambda c: {**_drop(c, "mask_token_id"), "ptd_token_id": None},
           "gelu": lambda c: {**c, "hidden_act": "gelu"}}.get(case, lambda c: c)(cfg)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        t = {k: f.get_tensor(k) for k in f.keys()}
    t = {"renamed tensor": lambda t: {**_drop(t, "layers.1.self_attn.q_proj.weight"),
                                      "layers.1.self_attn.query.weight": t["layers.1.self_attn.q_proj.weight"]},
         "no mask_hidden": lambda t: _drop(t, "mask_hidden"),
         "no fc": lambda t: _drop(t, "fc.weight"),
         "short d2t": lambda t: {**t, "d2t": t["d2t"][:50]}}.get(case, lambda t: t)(t)
    save_file(t, str(tmp_path / "model.safetensors"))
    problems = vllm_problems(tmp_path)
    assert any(needle in p for p in problems), problems
