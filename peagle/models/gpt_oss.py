"""Native GPT-OSS target (openai/gpt-oss-20b, -120b), as HF transformers' modeling_gpt_oss.py.

What differs from the Llama family: every layer is a top-k MoE (router and experts with biases,
gate/up interleaved, a clamped SwiGLU), attention has q/k/v/o biases and per-head sinks, layers
alternate between a sliding window and full attention (``layer_types``), RoPE is YaRN. The
released checkpoints store the expert matrices in MXFP4 (``*_blocks``/``*_scales``), dequantized here
at load.
"""
from __future__ import annotations

import torch

from peagle.models.checkpoint import CheckpointError
from peagle.models.llama import LlamaModel
from peagle.models.moe import Experts, SparseMoE

# the 16 values of an FP4 (E2M1) code: sign bit, 2 exponent bits, 1 mantissa bit
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """MXFP4 -> dense. ``blocks [..., G, 16]`` uint8 packs two FP4 codes per byte (low nibble first);
    the 32 values of group g share the scale ``2 ** (scales[..., g] - 127)`` (E8M0). Returns
    ``[..., G * 32]``: for ``*_blocks [E, rows, G, 16]`` that is ``[E, rows, G * 32]``, each expert's
    matrix as ``[out, in]``."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8 or blocks.shape[-1] != 16 \
            or blocks.shape[:-1] != scales.shape:
        raise CheckpointError(f"MXFP4 tensors must be uint8 blocks [..., G, 16] and scales [..., G]; got "
                              f"{blocks.dtype} {tuple(blocks.shape)} and {scales.dtype} {tuple(scales.shape)}")
    lut = torch.tensor(FP4_VALUES, dtype=dtype, device=blocks.device)
    values = torch.stack([lut[(blocks & 0x0F).int()], lut[(blocks >> 4).int()]], dim=-1)  # [..., G, 16, 2]
    values = torch.ldexp(values.flatten(-2), scales.int()[..., None] - 127)               # [..., G, 32]
    return values.flatten(-2)


class GptOssExperts(Experts):
    """GPT-OSS experts: gate and up interleaved in ``gate_up_proj`` (even rows gate, odd rows up),
    both clamped, then ``(up + 1) * gate * sigmoid(alpha * gate)``."""

    def __init__(self, num_experts: int, hidden: int, inter: int, alpha: float, limit: float):
        super().__init__(num_experts, hidden, inter, bias=True)
        self.alpha, self.limit = alpha, limit

    def act(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate = gate_up[:, 0::2].clamp(max=self.limit)
        up = gate_up[:, 1::2].clamp(-self.limit, self.limit)
        return (up + 1) * gate * torch.sigmoid(gate * self.alpha)


class GptOssModel(LlamaModel):
    attention_sinks = True

    def make_mlp(self, layer: int) -> SparseMoE:
        c = self.cfg
        experts = GptOssExperts(c.num_experts, c.hidden_size, c.moe_intermediate_size, c.swiglu_alpha, c.swiglu_limit)
        return SparseMoE(c.hidden_size, experts, c.num_experts_per_tok, norm_topk_prob=True, router_bias=True)

    def convert_checkpoint(self, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Expert matrices as HF stores them -> ``[E, out, in]``: MXFP4 ``*_blocks``/``*_scales``
        (openai/gpt-oss-*) are dequantized; dense ones (``[E, in, out]``, bf16 copies and
        transformers' own state dict) are transposed."""
        dtype = next((t.dtype for t in sd.values() if t.is_floating_point()), torch.float32)
        out = {}
        for key, t in sd.items():
            if key.endswith("_scales"):
                continue  # read with its blocks
            if key.endswith("_blocks"):
                name = key.removesuffix("_blocks")
                if name + "_scales" not in sd:
                    raise CheckpointError(f"{key} has no {name}_scales")
                out[name] = dequantize_mxfp4(t, sd[name + "_scales"], dtype)  # exact in bf16 too: no float32 detour
            elif key.endswith(("experts.gate_up_proj", "experts.down_proj")) and t.dim() == 3:
                out[key] = t.transpose(1, 2)
            else:
                out[key] = t
        orphans = [k for k in sd if k.endswith("_scales") and k.removesuffix("_scales") + "_blocks" not in sd]
        if orphans:
            raise CheckpointError(f"MXFP4 scales without blocks: {orphans[:6]}")
        return out
