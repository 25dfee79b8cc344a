"""Native Llama-family target: Llama 2/3 (llama3 RoPE), Mistral, Qwen2/2.5 (qkv bias), Qwen3 (q/k norm).

One forward over a flat batch returns the logits of the rows asked for and the three auxiliary
hidden states EAGLE-3 heads read (vLLM's meaning: the residual stream entering layer ``i``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from peagle.models.layers import (MLP, Attention, AttnMeta, CheckpointError, KVCache, Linear, RMSNorm, Rotary, embedding,
                                  check_checkpoint, fuse_checkpoint, linear, parse_rope)

SUPPORTED_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


class UnsupportedModelError(ValueError):
    pass



@dataclass
class ModelConfig:
    """The fields of a HF ``config.json`` that the Llama family needs, normalised across versions."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    sliding_window: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)

    @classmethod
    def from_hf(cls, cfg: dict) -> "ModelConfig":
        mt = cfg.get("model_type")
        if mt not in SUPPORTED_ARCHITECTURES:
            archs = cfg.get("architectures") or [mt]
            raise UnsupportedModelError(
                f"unsupported architecture {archs[0]!r} (model_type {mt!r}); supported: "
                + ", ".join(f"{v} ({k})" for k, v in SUPPORTED_ARCHITECTURES.items()))
        theta, rope = parse_rope(cfg)
        heads = cfg["num_attention_heads"]
        eos = cfg.get("eos_token_id")
        sliding = cfg.get("sliding_window")
        if mt in ("qwen2", "qwen3") and not cfg.get("use_sliding_window", False):
            sliding = None
        return cls(
            model_type=mt,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=theta,
            rope_scaling=rope,
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            qkv_bias=mt == "qwen2" or bool(cfg.get("attention_bias", False)),
            o_bias=bool(cfg.get("attention_bias", False)) and mt in ("llama", "mistral"),
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            qk_norm=mt == "qwen3",
            sliding_window=sliding,
            eos_token_ids=[eos] if isinstance(eos, int) else list(eos or []),
        )

    def default_aux_layers(self) -> tuple[int, int, int]:
        L = self.num_layers
        return (2, L // 2, L - 3)


class DecoderLayer(nn.Module):
    def __init__(self, hidden: int, inter: int, heads: int, kv_heads: int, head_dim: int, eps: float, *,
                 in_dim: int | None = None, qkv_bias=False, o_bias=False, mlp_bias=False, qk_norm=False):
        super().__init__()
        self.self_attn = Attention(hidden, heads, kv_heads, head_dim, in_dim=in_dim, qkv_bias=qkv_bias,
                                   o_bias=o_bias, qk_norm_eps=eps if qk_norm else None)
        self.mlp = MLP(hidden, inter, mlp_bias)
        self.input_layernorm = RMSNorm(hidden, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)

    def forward(self, x, rope, cache, meta):
        h = x + self.self_attn(self.input_layernorm(x), rope, cache, meta)
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaModel(nn.Module):
    """The target. State-dict names are HF's (``model.layers.0.self_attn.q_proj.weight``, ``lm_head.weight``)."""

    def __init__(self, cfg: ModelConfig, aux_layers: tuple[int, ...] | None = None):
        super().__init__()
        self.cfg = cfg
        self.aux_layers = tuple(aux_layers if aux_layers is not None else cfg.default_aux_layers())
        for i in self.aux_layers:
            if not 0 <= i <= cfg.num_layers:
                raise ValueError(f"aux hidden-state layer id {i} out of range 0..{cfg.num_layers}")
        self.model = nn.Module()
        self.model.embed_tokens = embedding(cfg.vocab_size, cfg.hidden_size)
        self.model.layers = nn.ModuleList(
            DecoderLayer(cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                         cfg.rms_norm_eps, qkv_bias=cfg.qkv_bias, o_bias=cfg.o_bias, mlp_bias=cfg.mlp_bias,
                         qk_norm=cfg.qk_norm)
            for _ in range(cfg.num_layers))
        self.model.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = None if cfg.tie_word_embeddings else Linear(cfg.hidden_size, cfg.vocab_size)
        self.rotary = Rotary(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)

    @property
    def lm_weight(self) -> torch.Tensor:
        return self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def load_checkpoint(self, sd: dict[str, torch.Tensor]) -> None:
        """Load a HF state dict (separate q/k/v and gate/up names), checking names and shapes."""
        if self.cfg.tie_word_embeddings:
            sd = {k: v for k, v in sd.items() if k != "lm_head.weight"}
        check_checkpoint(sd, self)
        sd = fuse_checkpoint(sd)
        self.load_state_dict(sd)

    def head_weight(self) -> torch.Tensor:
        """The LM head weight in the fast ``[hidden, vocab]`` memory order. A tied head gets its own
        transposed copy (the embedding keeps row order for lookups), rebuilt if the embedding changes."""
        if self.lm_head is not None:
            return self.lm_head.weight
        w = self.model.embed_tokens.weight
        key = (w.data_ptr(), w.dtype, w._version)
        if getattr(self, "_head_key", None) != key:
            self._head_t, self._head_key = w.detach().t().contiguous().t(), key
        return self._head_t

    def make_caches(self, num_slots: int, dtype: torch.dtype | None = None) -> list[KVCache]:
        p = self.model.embed_tokens.weight
        return [KVCache(num_slots, self.cfg.num_kv_heads, self.cfg.head_dim, dtype or p.dtype, p.device)
                for _ in range(self.cfg.num_layers)]

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, caches: list[KVCache], meta: AttnMeta,
                logits_rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (logits of ``logits_rows`` (all rows if None), aux hidden states ``[T, 3*H]``)."""
        meta.prepare(self.cfg.sliding_window)
        x = self.model.embed_tokens(ids)
        rope = self.rotary.table(positions, x.dtype)
        taps: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.model.layers):
            if i in self.aux_layers:
                taps[i] = x
            x = layer(x, rope, caches[i], meta)
        taps[self.cfg.num_layers] = x
        if logits_rows is not None:
            x = x[logits_rows]
        x = self.model.norm(x)
        logits = linear(x, self.head_weight())
        return logits, torch.cat([taps[i] for i in self.aux_layers], dim=-1)
