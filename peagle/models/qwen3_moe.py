"""Native Qwen3-MoE target (Qwen3-30B-A3B, Qwen3-Coder-30B-A3B-Instruct, ...), as HF transformers'
modeling_qwen3_moe.py: Qwen3's attention (q/k RMSNorm, no biases) with a top-k MoE in the layers
``decoder_sparse_step`` picks and ``mlp_only_layers`` leaves dense.
"""
from __future__ import annotations

import re

import torch

from peagle.models.checkpoint import CheckpointError
from peagle.models.layers import MLP
from peagle.models.llama import LlamaModel
from peagle.models.moe import Experts, SparseMoE

_EXPERT = re.compile(r"(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight")


class Qwen3MoeModel(LlamaModel):
    def make_mlp(self, layer: int) -> MLP | SparseMoE:
        c = self.cfg
        if layer not in c.moe_layers:
            return super().make_mlp(layer)
        experts = Experts(c.num_experts, c.hidden_size, c.moe_intermediate_size)
        return SparseMoE(c.hidden_size, experts, c.num_experts_per_tok, c.norm_topk_prob)

    def convert_checkpoint(self, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The router is ``mlp.gate`` on disk; experts are stored one by one
        (``mlp.experts.{e}.{gate,up,down}_proj.weight``, what the hub files and ``save_pretrained``
        hold) or already stacked (transformers' own state dict)."""
        out, parts = {}, {}
        for key, t in sd.items():
            if m := _EXPERT.fullmatch(key):
                parts.setdefault(m[1], {})[int(m[2]), m[3]] = t
            else:
                out[key.replace(".mlp.gate.weight", ".mlp.router.weight")] = t
        E = self.cfg.num_experts
        for prefix, p in parts.items():
            want = {(e, name) for e in range(E) for name in ("gate_proj", "up_proj", "down_proj")}
            if set(p) != want:
                raise CheckpointError(f"{prefix}: expected experts 0..{E - 1} with gate/up/down_proj; missing "
                                      f"{sorted(want - set(p))[:6]}, unexpected {sorted(set(p) - want)[:6]}")
            try:
                out[prefix + ".gate_up_proj"] = torch.stack([torch.cat([p[e, "gate_proj"], p[e, "up_proj"]])
                                                             for e in range(E)])
                out[prefix + ".down_proj"] = torch.stack([p[e, "down_proj"] for e in range(E)])
            except RuntimeError as err:
                raise CheckpointError(f"{prefix}: expert weights of mismatched shapes ({err})") from None
        return out
