"""Top-k routed mixture of experts, shared by GPT-OSS and Qwen3-MoE.

Each token goes to its ``top_k`` highest-scoring experts and gets their outputs summed with the
router's weights. Tokens are grouped by expert, so each expert runs one small matrix product over
the rows that chose it (the few-row products the ``linear`` fast path is for).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from peagle.models.layers import Linear, linear


class Experts(nn.Module):
    """``E`` SwiGLU experts as stacked weights with HF transformers' names: ``gate_up_proj``
    ``[E, 2I, H]`` (gate rows, then up rows) and ``down_proj`` ``[E, H, I]``, optional biases.
    Like :class:`Linear`, each expert's weight is an ``[out, in]`` view of ``[in, out]`` memory."""

    def __init__(self, num_experts: int, hidden: int, inter: int, bias: bool = False):
        super().__init__()
        self.inter = inter
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, hidden, 2 * inter).transpose(1, 2))
        self.down_proj = nn.Parameter(torch.empty(num_experts, inter, hidden).transpose(1, 2))
        self.gate_up_proj_bias = nn.Parameter(torch.zeros(num_experts, 2 * inter)) if bias else None
        self.down_proj_bias = nn.Parameter(torch.zeros(num_experts, hidden)) if bias else None

    def act(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``[rows, 2I]`` -> ``[rows, I]``: silu(gate) * up."""
        return F.silu(gate_up[:, :self.inter]) * gate_up[:, self.inter:]

    def forward(self, x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """``x [T, H]``; ``experts``/``weights`` ``[T, k]``: each row's chosen experts and their weights."""
        out = torch.zeros_like(x)
        for e in experts.unique().tolist():
            rows, slot = (experts == e).nonzero(as_tuple=True)
            b1 = None if self.gate_up_proj_bias is None else self.gate_up_proj_bias[e]
            b2 = None if self.down_proj_bias is None else self.down_proj_bias[e]
            h = self.act(linear(x[rows], self.gate_up_proj[e], b1))
            out.index_add_(0, rows, linear(h, self.down_proj[e], b2) * weights[rows, slot, None])
        return out


class SparseMoE(nn.Module):
    """Router + experts. The weights are the softmax over all experts at the chosen ones, or with
    ``norm_topk_prob`` the softmax over the chosen ones only (GPT-OSS, most Qwen3-MoE checkpoints)."""

    def __init__(self, hidden: int, experts: Experts, top_k: int, norm_topk_prob: bool, router_bias: bool = False):
        super().__init__()
        self.router = Linear(hidden, experts.gate_up_proj.shape[0], router_bias)
        self.experts = experts
        self.top_k, self.norm_topk_prob = top_k, norm_topk_prob

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.router(x)
        top, chosen = logits.topk(self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = top.softmax(-1)
        else:
            weights = (top - logits.logsumexp(-1, keepdim=True)).exp()
        return self.experts(x, chosen, weights)
