"""Expanding the verified batch into the drafter's batch, as vLLM lays it out (docs/design.md, "One round of
parallel drafting").

For request i the target read ``n_i`` rows (``cu_num_tokens[i]:cu_num_tokens[i+1]``), of which the
first ``num_valid[i]`` stay (prefill: all; decode: accepted drafts + 1). Its drafter block is the
``n_i`` rows shifted by one token, with the bonus token at row ``num_valid[i] - 1`` and the rows after
it marked rejected (they write no KV: slot -1), then ``num_masks`` mask rows whose positions continue
after the bonus. ``sample_idx[i]`` lists the ``num_masks + 1`` rows whose outputs are the drafts.
Example (K = 3): tokens [10, 11, 12, 13] at positions 5..8, two accepted, bonus 100 -> ids
[11, 12, 100, rej, M, M], positions [5, 6, 7, 8, 8, 9], drafts read at rows 2, 4, 5.

Three implementations with one interface: plain torch (the fallback), peagle's CPU kernel (one pass
over the requests: a decode step's few rows cost ~30 torch ops in plain torch) and one fused Triton kernel
(one program per request; used on CUDA, testable on CPU with ``TRITON_INTERPRET=1``; its own module,
:mod:`peagle.engine.expansion_triton`, imported on first use).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from peagle.kernels import table
from peagle.kernels.table import HAVE_TRITON


@dataclass
class DraftBatch:
    input_ids: torch.Tensor    # [R] int64
    positions: torch.Tensor    # [R] int64
    is_rejected: torch.Tensor  # [R] bool: rows after the bonus; they write no KV
    is_masked: torch.Tensor    # [R] bool: mask slots, fed fc(mask_hidden)
    hidden_map: torch.Tensor   # [R] int64: target hidden row for each row (-1 in mask slots)
    sample_idx: torch.Tensor   # [B, num_masks + 1] int64: rows whose outputs are the drafts


@table.provides("expand", "torch")
def expand_torch(ids: torch.Tensor, positions: torch.Tensor, cu_num_tokens: torch.Tensor,
                 num_valid: torch.Tensor, bonus: torch.Tensor, num_masks: int, mask_id: int) -> DraftBatch:
    B, dev = num_valid.shape[0], ids.device
    n = cu_num_tokens[1:] - cu_num_tokens[:-1]
    rows = n + num_masks
    out_start = cu_num_tokens[:-1] + torch.arange(B, device=dev) * num_masks
    total = ids.shape[0] + B * num_masks
    req = torch.repeat_interleave(torch.arange(B, device=dev), rows, output_size=total)   # request of each output row
    j = torch.arange(total, device=dev) - torch.repeat_interleave(out_start, rows, output_size=total)  # row within request
    src = cu_num_tokens[:-1][req] + j                                    # its target row (if not a mask)
    valid = num_valid[req]
    masked = j >= n[req]
    nxt = ids[(src + 1).clamp(max=ids.shape[0] - 1)]
    tok = torch.where(j == valid - 1, bonus[req], torch.where(j < valid - 1, nxt, torch.zeros_like(nxt)))
    last_pos = positions[cu_num_tokens[:-1] + num_valid - 1]
    mask_pos = last_pos[req] + 1 + (j - n[req])
    sample = torch.cat([(out_start + num_valid - 1)[:, None],
                        out_start[:, None] + n[:, None] + torch.arange(num_masks, device=dev)[None, :]], dim=1)
    return DraftBatch(
        input_ids=torch.where(masked, torch.full_like(tok, mask_id), tok),
        positions=torch.where(masked, mask_pos, positions[src.clamp(max=ids.shape[0] - 1)]),
        is_rejected=~masked & (j >= valid),
        is_masked=masked,
        hidden_map=torch.where(masked, torch.full_like(src, -1), src),
        sample_idx=sample)


@table.provides("expand", "triton")
def expand_triton(ids: torch.Tensor, positions: torch.Tensor, cu_num_tokens: torch.Tensor,
                  num_valid: torch.Tensor, bonus: torch.Tensor, num_masks: int, mask_id: int) -> DraftBatch:
    """The fused Triton kernel (:mod:`peagle.engine.expansion_triton`, imported on first use)."""
    if not HAVE_TRITON:
        raise RuntimeError("triton is not installed")
    from peagle.engine.expansion_triton import expand_triton as fused

    return DraftBatch(*fused(ids, positions, cu_num_tokens, num_valid, bonus, num_masks, mask_id))


@table.provides("expand", "cpu")
def expand_native(ids: torch.Tensor, positions: torch.Tensor, cu_num_tokens: torch.Tensor,
                  num_valid: torch.Tensor, bonus: torch.Tensor, num_masks: int, mask_id: int) -> DraftBatch:
    """peagle's CPU kernel (``peagle::expand``)."""
    return DraftBatch(*torch.ops.peagle.expand(ids.long(), positions.long(), cu_num_tokens.long(), num_valid.long(),
                                               bonus.long(), num_masks, mask_id))


def expand(ids, positions, cu_num_tokens, num_valid, bonus, num_masks: int, mask_id: int) -> DraftBatch:
    """The fused kernel on CUDA when Triton is there, peagle's kernel on the CPU when built, torch otherwise (the
    kernel table's choice)."""
    return table.run("expand", ids, positions, cu_num_tokens, num_valid, bonus, num_masks, mask_id)
