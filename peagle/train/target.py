"""What training reads of the target when its hidden states come from ``peagle hidden``: its config,
embedding, final norm and LM head, for the head's frozen embedding, its initialisation and the soft
labels. The decoder layers stay on the meta device: no memory, and any use of them fails."""
from __future__ import annotations

import os

import torch
from safetensors import safe_open

from peagle.kernels import table
from peagle.models.checkpoint import CheckpointError, split_checkpoint
from peagle.models.llama import LlamaModel, ModelConfig, build_target
from peagle.models.loader import read_config, resolve_quantization, resolve_target, target_gguf
from peagle.models.quant import read_gguf
from peagle.precision import compute_dtype, resolve_device, resolve_dtype

LAYERS = "model.layers."
STORED = "stored"


def stored_dtype(name: str | os.PathLike | None, quantization: str | None = None,
                 device: torch.device | None = None) -> str:
    """The dtype a target's checkpoint keeps its weights in (its config's ``torch_dtype`` or ``dtype``; float32
    where it names none): training loads the target as it is, never widened. A GGUF file's quantized blocks stay
    blocks whatever this is, except on CUDA, which has no block kernels: there they become bfloat16, what serving
    on a GPU runs them in (``--dtype auto``), rather than a float32 copy twice that size."""
    gguf = target_gguf(name)
    blocks = resolve_quantization(quantization, gguf) == "gguf"
    if blocks and device is not None and device.type == "cuda":
        return "bfloat16"
    cfg = read_config(resolve_target(name, weights=not blocks))
    return cfg.get("torch_dtype") or cfg.get("dtype") or "float32"


def load_target_ends(name: str | os.PathLike | None, dtype: str | torch.dtype = "auto",
                     device: str | torch.device = "auto", quantization: str | None = None) -> LlamaModel:
    """The target with every tensor outside its decoder layers, each in the checkpoint's form (``dtype``;
    a GGUF file's blocks kept as stored, as :func:`peagle.models.loader.load_target` keeps them), the
    layers on the meta device. A safetensors checkpoint is read for those tensors only; a GGUF file is read
    whole (its reader takes every tensor) and the layers' blocks dropped before training starts."""
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    gguf = target_gguf(name)
    from_gguf = resolve_quantization(quantization, gguf) == "gguf"
    path = resolve_target(name, weights=not from_gguf)
    cfg = ModelConfig.from_hf(read_config(path))
    with torch.device("meta"):
        model = build_target(cfg)
    wanted = [n for n in model.state_dict() if not n.startswith(LAYERS)]
    if cfg.tie_word_embeddings:
        wanted = [n for n in wanted if n != "lm_head.weight"]
    if from_gguf:
        everything = read_gguf(gguf, list(split_checkpoint(model.state_dict(), model)), cfg, table.on_device(dev), dt,
                               compute_dtype(dt, dev), dev)
        sd = {n: everything.pop(n) for n in wanted if n in everything}
        everything.clear()
    else:
        sd = {}
        for f in sorted(path.glob("*.safetensors")):
            with safe_open(str(f), framework="pt", device="cpu") as st:
                for n in set(wanted) & set(st.keys()):
                    t = st.get_tensor(n)
                    sd[n] = t.to(device=dev, dtype=dt if t.is_floating_point() else None)
    missing = [n for n in wanted if n not in sd]
    if missing:
        raise CheckpointError(f"{gguf or path}: no {', '.join(missing)}")
    model.load_state_dict(sd, strict=False, assign=True)
    return model.eval()
