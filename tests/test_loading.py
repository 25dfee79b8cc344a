"""Loading without copies: a sharded bf16 checkpoint of about 1 GB is read tensor by tensor, each
materialised once in the target dtype, so the process peaks near the weights' size (issue: <= 1.3x
the weights plus the runtime), not at a float32 copy or a second full copy."""
from __future__ import annotations

import json
import subprocess
import sys

import torch
from safetensors.torch import save_file

CONFIG = dict(model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=32000, hidden_size=2048,
              intermediate_size=5504, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=16,
              max_position_embeddings=2048, rms_norm_eps=1e-5, tie_word_embeddings=True, eos_token_id=2)

MEASURE = """
import json, resource, sys, torch
from peagle.models.loader import load_target
torch.ones(8) @ torch.ones(8)  # the runtime: torch, its thread pool, peagle's imports
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
model, _ = load_target(sys.argv[1], "bfloat16", device="cpu")
for p in model.parameters():  # touch every page: weights left memory-mapped count once read (packed: their bytes)
    getattr(p, "blocks", p).max()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
n = sum(p.numel() * p.element_size() for p in model.parameters())
linear = {str(p.dtype) for k, p in model.named_parameters() if k.endswith("proj.weight")}
rest = {str(p.dtype) for k, p in model.named_parameters() if not k.endswith("proj.weight")}
print(json.dumps({"base_kb": base, "peak_kb": peak, "param_bytes": n, "linear": sorted(linear), "rest": sorted(rest),
                  "rest_numel": sum(p.numel() for k, p in model.named_parameters() if not k.endswith("proj.weight")),
                  "compute": str(model.dtype)}))
"""


def write_checkpoint(path) -> int:
    """A random bf16 Llama of about 0.95 GB in shards of two layers; returns its weight bytes."""
    c = CONFIG
    H, inter, L = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    g = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.empty(shape, dtype=torch.bfloat16).uniform_(-0.02, 0.02, generator=g)

    shards = [{"model.embed_tokens.weight": rand(c["vocab_size"], H), "model.norm.weight": torch.ones(H, dtype=torch.bfloat16)}]
    for i in range(L):
        if i % 2 == 0:
            shards.append({})
        p = f"model.layers.{i}."
        shards[-1].update({p + "input_layernorm.weight": torch.ones(H, dtype=torch.bfloat16),
                           p + "post_attention_layernorm.weight": torch.ones(H, dtype=torch.bfloat16),
                           **{p + f"self_attn.{n}_proj.weight": rand(H, H) for n in "qkvo"},
                           p + "mlp.gate_proj.weight": rand(inter, H), p + "mlp.up_proj.weight": rand(inter, H),
                           p + "mlp.down_proj.weight": rand(H, inter)})
    index, total = {}, 0
    for s, tensors in enumerate(shards):
        name = f"model-{s + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(tensors, str(path / name), metadata={"format": "pt"})
        index.update({k: name for k in tensors})
        total += sum(t.numel() * 2 for t in tensors.values())
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": index}))
    (path / "config.json").write_text(json.dumps({**CONFIG, "torch_dtype": "bfloat16"}))
    return total


def test_bf16_checkpoint_loads_near_its_size(tmp_path):
    weights = write_checkpoint(tmp_path)
    assert weights > 0.9e9
    r = subprocess.run([sys.executable, "-c", MEASURE, str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    m = json.loads(r.stdout.strip().splitlines()[-1])
    # the linear layers keep the file's bf16; embeddings and norms take the compute dtype (float32 on the
    # CPU with peagle's kernels: 16-bit weights, float32 arithmetic; packed for bf16 dot products where the CPU has
    # them, nominally bf16 all the same)
    assert m["linear"] == ["torch.bfloat16"] and m["rest"] == [m["compute"]]
    upcast = m["rest_numel"] * 2 if m["compute"] == "torch.float32" else 0
    assert m["param_bytes"] == weights + upcast
    extra = (m["peak_kb"] - m["base_kb"]) * 1024
    assert extra <= 1.3 * (weights + upcast), f"loading peaked at {extra / weights:.2f}x the weights"
