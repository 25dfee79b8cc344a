"""The speculators format (vllm-project/speculators, the library RedHat's and the P-EAGLE anchors' heads
are trained and shipped with), both ways: a head written as speculators writes it, and a speculators
P-EAGLE or EAGLE-3 head read as a :class:`~peagle.models.drafter.Drafter`. docs/speculators.md shows both
formats served by vLLM.

``config.json`` (speculators' ``Eagle3SpeculatorConfig`` / ``PEagleSpeculatorConfig``, pydantic models
over a transformers ``PretrainedConfig``):

- ``speculators_model_type``: ``"peagle"`` (vLLM turns it into eagle3 with ``parallel_drafting``) or
  ``"eagle3"``; ``architectures``: ``PEagleSpeculator`` / ``Eagle3Speculator``;
- ``transformer_layer_config``: the decoder layers' Llama config (its ``vocab_size`` is the target's);
- ``draft_vocab_size``, ``target_hidden_size``, ``eagle_aux_hidden_state_layer_ids``,
  ``norm_before_residual`` (written always: vLLM takes an absent one as true for eagle3, false for peagle);
- ``mask_token_id`` (P-EAGLE's mask token; vLLM reads it as ``pard_token``);
- ``speculators_config``: ``algorithm``, ``proposal_methods`` (one ``greedy`` method whose
  ``speculative_tokens`` is the K the head was trained for; vLLM's default ``num_speculative_tokens``),
  ``default_proposal_method``, ``verifier`` (``name_or_path`` and ``architectures`` of the target).

Weights: the vLLM layout's (docs/vllm.md, "The checkpoint format") but layer 0 is ``layers.0.*`` (vLLM's native heads call it
``midlayer.*``; vLLM maps one to the other), the embedding is always complete, and ``mask_hidden``
(``[1, 1, 3 * hidden]``) belongs to P-EAGLE heads only (speculators' EAGLE-3 model has none).
"""
from __future__ import annotations

import json

import torch

from peagle.models.checkpoint import CheckpointError
from peagle.models.layers import parse_rope

KINDS = {"peagle": "PEagleSpeculator", "eagle3": "Eagle3Speculator"}   # speculators_model_type: architecture
FIRST = ("midlayer.", "layers.0.")   # layer 0: ours (vLLM's native name), speculators'
VERIFIER_ONLY = ("verifier_norm.", "verifier_lm_head.")   # speculators' training-time copies of the target's


def is_speculators(cfg: dict) -> bool:
    return "speculators_model_type" in cfg


def speculators_config(dcfg, kind: str, k: int, verifier: str, verifier_architectures: list[str],
                       dtype: torch.dtype) -> dict:
    """The config.json of head config ``dcfg`` (a DrafterConfig) as a speculators ``kind`` head for K = ``k``."""
    if kind not in KINDS:
        raise ValueError(f"unknown speculators head kind {kind!r}; choose one of {', '.join(KINDS)}")
    if kind == "peagle" and dcfg.mask_token_id is None:
        raise ValueError("a P-EAGLE head needs a mask token id")
    if k < 1:
        raise ValueError(f"speculative tokens must be >= 1, got {k}")
    rope = {"rope_type": "default", **(dcfg.rope_scaling or {}), "rope_theta": dcfg.rope_theta}
    layer = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": dcfg.vocab_size,
             "hidden_size": dcfg.hidden_size, "intermediate_size": dcfg.intermediate_size,
             "num_hidden_layers": dcfg.num_layers, "num_attention_heads": dcfg.num_heads,
             "num_key_value_heads": dcfg.num_kv_heads, "head_dim": dcfg.head_dim, "hidden_act": "silu",
             "rms_norm_eps": dcfg.rms_norm_eps, "rope_parameters": rope, "rope_theta": dcfg.rope_theta,
             "max_position_embeddings": dcfg.max_position_embeddings,
             "attention_bias": dcfg.attention_bias, "mlp_bias": False, "tie_word_embeddings": False}
    if dcfg.rope_scaling:  # transformers 4.x's name, for readers that predate rope_parameters
        layer["rope_scaling"] = dcfg.rope_scaling
    cfg = {"architectures": [KINDS[kind]], "speculators_model_type": kind, "transformer_layer_config": layer,
           "draft_vocab_size": dcfg.draft_vocab_size, "target_hidden_size": dcfg.target_hidden_size,
           "eagle_aux_hidden_state_layer_ids": list(dcfg.aux_layer_ids),
           "norm_before_residual": dcfg.norm_before_residual,
           "speculators_config": {
               "algorithm": kind, "default_proposal_method": "greedy",
               "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": k, "verifier_accept_k": 1}],
               "verifier": {"name_or_path": verifier, "architectures": list(verifier_architectures)}},
           "torch_dtype": str(dtype).removeprefix("torch.")}
    if dcfg.mask_token_id is not None:  # an EAGLE-3 head keeps its id too (an extra field speculators keeps)
        cfg["mask_token_id"] = dcfg.mask_token_id
    return cfg


def speculators_tensors(tensors: dict[str, torch.Tensor], kind: str) -> dict[str, torch.Tensor]:
    """A head's checkpoint tensors (vLLM names) under speculators' names."""
    out = {}
    for name, t in tensors.items():
        if name == "mask_hidden" and kind != "peagle":
            continue
        out[FIRST[1] + name[len(FIRST[0]):] if name.startswith(FIRST[0]) else name] = t
    return out


def drafter_dict(cfg: dict) -> dict:
    """A speculators config.json as the vLLM-layout config :meth:`DrafterConfig.from_dict` reads."""
    kind = cfg["speculators_model_type"]
    if kind not in KINDS:
        raise CheckpointError(f"speculators_model_type {kind!r}: peagle reads {' and '.join(KINDS)} heads")
    layer = cfg.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise CheckpointError("a speculators config.json needs a transformer_layer_config object")
    if layer.get("model_type", "llama") != "llama":
        raise CheckpointError(f"transformer_layer_config.model_type {layer.get('model_type')!r}: peagle's heads "
                              "are Llama layers")
    if layer.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"transformer_layer_config.hidden_act {layer['hidden_act']!r} is not silu")
    for flag in ("norm_before_fc", "fc_norm", "norm_output"):
        if cfg.get(flag):
            raise CheckpointError(f"{flag}=true (a norm on the target taps or the outputs) is not supported")
    methods = (cfg.get("speculators_config") or {}).get("proposal_methods") or [{}]
    # speculators writes the layer config as a diff against transformers' defaults (to_diff_dict): filled
    # back by transformers' LlamaConfig, as speculators itself reads it (imported here: transformers takes
    # ~1 s to import, which every start would pay for a format few heads use)
    from transformers import LlamaConfig

    layer = LlamaConfig(**{k: v for k, v in layer.items() if k != "model_type"}).to_dict()
    theta, rope = parse_rope(layer)
    out = {**{k: v for k, v in layer.items() if k not in ("architectures", "rope_parameters", "rope_scaling",
                                                          "rope_theta")},
           "architectures": ["LlamaForCausalLMEagle3"], "rope_theta": theta, "rope_scaling": rope,
           "draft_vocab_size": cfg.get("draft_vocab_size") or layer["vocab_size"],
           "target_hidden_size": cfg.get("target_hidden_size") or layer["hidden_size"],
           "eagle_aux_hidden_state_layer_ids": cfg.get("eagle_aux_hidden_state_layer_ids") or [],
           # absent: speculators' own default (false), which vLLM shares for peagle but not for eagle3
           "norm_before_residual": bool(cfg.get("norm_before_residual", False)),
           "peagle": {"trained_k": methods[0].get("speculative_tokens")}}
    if cfg.get("mask_token_id") is not None:
        out["mask_token_id"] = cfg["mask_token_id"]
    elif kind == "peagle":
        raise CheckpointError("a speculators P-EAGLE head without mask_token_id")
    return out


def drafter_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Speculators' tensor names as the vLLM layout's (the verifier's copies dropped)."""
    return {FIRST[0] + k[len(FIRST[1]):] if k.startswith(FIRST[1]) else k: v for k, v in tensors.items()
            if not k.startswith(VERIFIER_ONLY)}


def read_config(text: str) -> tuple[dict, bool]:
    """config.json's text as the vLLM-layout dict, and whether it was a speculators config."""
    cfg = json.loads(text)
    return (drafter_dict(cfg), True) if is_speculators(cfg) else (cfg, False)
