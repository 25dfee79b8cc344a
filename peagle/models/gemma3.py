"""Native Gemma 3 target (text only: google/gemma-3-270m, -1b; ``Gemma3ForCausalLM``), as HF transformers'
modeling_gemma3.py.

What differs from the Llama family: GELU-tanh gated MLP; four norms per layer (the attention's and the
MLP's outputs are normed too before their residual add); norms weighted by ``1 + w`` (folded into the
weight at load: the same float32 product HF computes); the embedding scaled by ``sqrt(hidden)``; q/k RMSNorm;
sliding-window layers with their own RoPE base among global ones (``layer_types``); scores scaled by
``query_pre_attn_scalar ** -0.5``; optional final logit soft-capping (``ModelConfig``, ``LlamaModel.logits``).
"""
from __future__ import annotations

import torch
from torch import nn

from peagle.models.llama import DecoderLayer, LlamaModel
from peagle.models.layers import RMSNorm


class Gemma3DecoderLayer(DecoderLayer):
    """Pre- and post-norms around both blocks: ``h = x + post_attn(attn(in(x)))``,
    ``out = h + post_ffw(mlp(pre_ffw(h)))``."""

    def __init__(self, hidden: int, inter: int, heads: int, kv_heads: int, head_dim: int, eps: float, **kw):
        super().__init__(hidden, inter, heads, kv_heads, head_dim, eps, qk_norm=True, **kw)
        self.pre_feedforward_layernorm = RMSNorm(hidden, eps)
        self.post_feedforward_layernorm = RMSNorm(hidden, eps)

    def forward(self, x, rope, cache, meta):
        attn = self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), rope, cache, meta))
        normed, h = self.pre_feedforward_layernorm.add_forward(attn, x)
        return h + self.post_feedforward_layernorm(self.mlp(normed))


class Gemma3Model(LlamaModel):
    def make_layer(self, i: int) -> nn.Module:
        c = self.cfg
        return Gemma3DecoderLayer(c.hidden_size, c.intermediate_size, c.num_heads, c.num_kv_heads, c.head_dim,
                                  c.rms_norm_eps, sliding_window=c.window(i), mlp=self.make_mlp(i), scale=c.attn_scale)

    def convert_checkpoint(self, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Every norm's ``w`` -> ``1 + w`` in float32 (HF's ``1.0 + weight.float()``), so the plain RMSNorm runs it;
        in place."""
        for k in [k for k in sd if k.endswith("norm.weight")]:
            sd[k] = sd[k].float() + 1
        return sd

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows scaled by ``sqrt(hidden)`` rounded to their dtype, as HF does."""
        x = super().embed(ids)
        return x * torch.tensor(self.cfg.hidden_size ** 0.5, dtype=x.dtype)
