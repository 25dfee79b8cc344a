"""Which checkpoint tensors peagle fuses into one (HF's separate q/k/v and gate/up projections into its qkv_proj
and gate_up_proj), by name alone: read by the checkpoint code and by the GGUF reader, which fuses as it reads."""
from __future__ import annotations

FUSED = {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
         "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj")}


def fused_groups(names) -> dict[str, list[str]]:
    """The fused name of each q/k/v or gate/up group whose parts are all among ``names``, and its parts, in the order
    of ``names`` (not a set's: a packed load's layout, and its cache's key, must not change between processes)."""
    names = dict.fromkeys(names)
    groups = {}
    for key in names:
        for fused, parts in FUSED.items():
            if f".{parts[0]}." in f".{key}":
                pre, suf = key.split(parts[0])
                group = [pre + p + suf for p in parts]
                if all(n in names for n in group):
                    groups[pre + fused + suf] = group
    return groups
