"""The drafter-batch expansion as one fused Triton kernel (one program per request; CUDA, or the CPU under
``TRITON_INTERPRET=1``): its own module so that CPU runs never import Triton (about 75 MB resident)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _expand_kernel(ids_ptr, pos_ptr, cu_ptr, valid_ptr, bonus_ptr, out_ids, out_pos, out_rej, out_mask,
                   out_map, out_sample, mask_id, NUM_MASKS: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0)
    start = tl.load(cu_ptr + i)
    n = tl.load(cu_ptr + i + 1) - start
    valid = tl.load(valid_ptr + i)
    bonus = tl.load(bonus_ptr + i)
    out0 = start + i * NUM_MASKS
    offs = tl.arange(0, BLOCK)
    for b in range(0, (n + BLOCK - 1) // BLOCK):
        j = b * BLOCK + offs
        inb = j < n
        nxt = tl.load(ids_ptr + start + j + 1, mask=inb & (j + 1 < n), other=0)
        tok = tl.where(j == valid - 1, bonus, tl.where(j < valid - 1, nxt, 0))
        tl.store(out_ids + out0 + j, tok, mask=inb)
        tl.store(out_pos + out0 + j, tl.load(pos_ptr + start + j, mask=inb, other=0), mask=inb)
        tl.store(out_rej + out0 + j, (j >= valid).to(tl.int8), mask=inb)
        tl.store(out_mask + out0 + j, (j * 0).to(tl.int8), mask=inb)
        tl.store(out_map + out0 + j, (start + j).to(tl.int64), mask=inb)
    last_pos = tl.load(pos_ptr + start + valid - 1)
    mm = offs < NUM_MASKS
    tl.store(out_ids + out0 + n + offs, (offs * 0).to(tl.int64) + mask_id, mask=mm)
    tl.store(out_pos + out0 + n + offs, last_pos + 1 + offs, mask=mm)
    tl.store(out_rej + out0 + n + offs, (offs * 0).to(tl.int8), mask=mm)
    tl.store(out_mask + out0 + n + offs, (offs * 0 + 1).to(tl.int8), mask=mm)
    tl.store(out_map + out0 + n + offs, (offs * 0 - 1).to(tl.int64), mask=mm)
    tl.store(out_sample + i * (NUM_MASKS + 1), (out0 + valid - 1).to(tl.int64))
    tl.store(out_sample + i * (NUM_MASKS + 1) + 1 + offs, (out0 + n + offs).to(tl.int64), mask=mm)


def expand_triton(ids: torch.Tensor, positions: torch.Tensor, cu_num_tokens: torch.Tensor,
                  num_valid: torch.Tensor, bonus: torch.Tensor, num_masks: int,
                  mask_id: int) -> tuple[torch.Tensor, ...]:
    """The fields of :class:`peagle.engine.expansion.DraftBatch`, in order (as ``peagle::expand`` returns them)."""
    B = num_valid.shape[0]
    R = ids.shape[0] + B * num_masks
    dev = ids.device
    out = [torch.empty(R, dtype=torch.long, device=dev), torch.empty(R, dtype=torch.long, device=dev),
           torch.empty(R, dtype=torch.int8, device=dev), torch.empty(R, dtype=torch.int8, device=dev),
           torch.empty(R, dtype=torch.long, device=dev), torch.empty(B, num_masks + 1, dtype=torch.long, device=dev)]
    _expand_kernel[(B,)](ids.long(), positions.long(), cu_num_tokens.long(), num_valid.long(), bonus.long(),
                         *out, mask_id, NUM_MASKS=num_masks, BLOCK=max(16, triton.next_power_of_2(num_masks + 1)))
    return out[0], out[1], out[2].bool(), out[3].bool(), out[4], out[5]
