"""Checkpoint names and files: reading safetensors tensor by tensor, checking names and shapes against a
model, and fusing HF's separate q/k/v and gate/up projections into ours (and back)."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from peagle.models.attention import Attention
from peagle.models.fused import FUSED, fused_groups
from peagle.models.layers import MLP
from peagle.models.quant import cat_rows


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded: unreadable, corrupt, or not matching its config."""


def check_checkpoint(sd: dict[str, torch.Tensor], model: nn.Module, optional: tuple[str, ...] = ()) -> None:
    """Compare a checkpoint's on-disk names and shapes with what ``model`` expects, before fusing,
    so errors name the tensors that are in the file. ``optional`` names may be absent."""
    want = {k: tuple(v.shape) for k, v in split_checkpoint(model.state_dict(), model).items()}
    missing = sorted(k for k in set(want) - set(sd) if k not in optional)
    unexpected = sorted(set(sd) - set(want))
    bad = [f"{k}: {tuple(sd[k].shape)} != {want[k]}" for k in want if k in sd and tuple(sd[k].shape) != want[k]]
    if missing or unexpected or bad:
        raise CheckpointError(f"weights do not match the config: missing {missing[:6]}, unexpected "
                              f"{unexpected[:6]}, wrong shapes {bad[:6]}")


SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                      "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
                      "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}


def read_safetensors(path: Path, dtype: torch.dtype | None = None,
                     device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """All tensors of a folder's ``*.safetensors`` files (sharded or not), or of one file, each read
    once and materialised straight in ``dtype`` (floating point tensors; None keeps the file's) on
    ``device``: no float32 detour, no second copy. Read (``readinto``), not mapped: a tensor left on the
    file's map (one the cast leaves as it is) would keep the whole file's pages mapped and counted as
    resident after its other tensors were copied (fused, packed): the file twice at the peak."""
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    if not files:
        raise CheckpointError(f"no .safetensors weights in {path}")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as st:  # checks the header against the file's size
                names = list(st.keys())
            with open(f, "rb") as fh:
                size = int.from_bytes(fh.read(8), "little")
                header = json.loads(fh.read(size))
                for name in names:
                    t = _read_tensor(fh, 8 + size, header[name])
                    tensors[name] = t.to(device=device, dtype=dtype if dtype is not None and t.is_floating_point() else None)
        except (SafetensorError, OSError, ValueError, KeyError) as e:
            raise CheckpointError(f"corrupt or unreadable safetensors file {f}: {e}") from None
    return tensors


def _read_tensor(fh, start: int, info: dict) -> torch.Tensor:
    """One tensor of a safetensors file, from its header entry (data offsets past the header at ``start``)."""
    if info["dtype"] not in SAFETENSORS_DTYPES:
        raise ValueError(f"unsupported dtype {info['dtype']}")
    t = torch.empty(info["shape"], dtype=SAFETENSORS_DTYPES[info["dtype"]])
    begin, end = info["data_offsets"]
    if end - begin != t.numel() * t.element_size():
        raise ValueError(f"{end - begin} bytes for a {info['dtype']} tensor of shape {info['shape']}")
    fh.seek(start + begin)
    if t.numel() and fh.readinto(t.reshape(-1).view(torch.uint8).numpy()) != end - begin:
        raise ValueError("a tensor ends past the end of the file")
    return t


def fuse_checkpoint(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """HF/vLLM checkpoint names -> ours: stack q/k/v into qkv_proj and gate/up into gate_up_proj, in ``sd``
    itself (returned), each group's parts dropped as it is fused: a loader's peak holds one group twice, not
    every layer's."""
    for fused, names in fused_groups(sd).items():
        sd[fused] = cat_rows([sd.pop(n) for n in names])
    return sd


def split_checkpoint(sd: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """Ours -> checkpoint names (the inverse of :func:`fuse_checkpoint`); sizes come from ``model``."""
    out = dict(sd)
    for name, mod in model.named_modules():
        pre = f"{name}." if name else ""
        if isinstance(mod, Attention):
            q, kv = mod.heads * mod.head_dim, mod.kv_heads * mod.head_dim
            fused, parts, sizes = "self_attn.qkv_proj", FUSED["self_attn.qkv_proj"], [q, kv, kv]
            pre = pre[: -len("self_attn.")]
        elif isinstance(mod, MLP):
            fused, parts, sizes = "mlp.gate_up_proj", FUSED["mlp.gate_up_proj"], [mod.inter, mod.inter]
            pre = pre[: -len("mlp.")]
        else:
            continue
        for suf in (".weight", ".bias"):
            key = pre + fused + suf
            if key in out:
                for part, t in zip(parts, out.pop(key).split(sizes, dim=0)):
                    out[pre + part + suf] = t
    return out
