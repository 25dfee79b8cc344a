"""A random Llama-architecture target of about 1.64 GB in bf16, as a HF folder (config.json, model.safetensors,
SmolLM2's tokenizer, whose 49,152-token vocabulary it shares), for measuring what loading one costs (§29).

    python benchmarks/memory/make_bf16_target.py /tmp/rss/llama-820m-bf16
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

CONFIG = dict(model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=49152, hidden_size=2048,
              intermediate_size=5632, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
              max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True,
              bos_token_id=1, eos_token_id=2, torch_dtype="bfloat16")


def main(out: Path) -> None:
    from peagle.models.loader import resolve_target

    c = CONFIG
    H, inter, kv = c["hidden_size"], c["intermediate_size"], c["hidden_size"] // c["num_attention_heads"] * c["num_key_value_heads"]
    g = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.empty(shape, dtype=torch.bfloat16).normal_(0, 0.02, generator=g)

    ones = torch.ones(H, dtype=torch.bfloat16)
    sd = {"model.embed_tokens.weight": rand(c["vocab_size"], H), "model.norm.weight": ones.clone()}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        sd.update({p + "input_layernorm.weight": ones.clone(), p + "post_attention_layernorm.weight": ones.clone(),
                   p + "self_attn.q_proj.weight": rand(H, H), p + "self_attn.k_proj.weight": rand(kv, H),
                   p + "self_attn.v_proj.weight": rand(kv, H), p + "self_attn.o_proj.weight": rand(H, H),
                   p + "mlp.gate_proj.weight": rand(inter, H), p + "mlp.up_proj.weight": rand(inter, H),
                   p + "mlp.down_proj.weight": rand(H, inter)})
    out.mkdir(parents=True, exist_ok=True)
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(c, indent=2))
    tok = resolve_target(None, weights=False)  # the default model's folder: its tokenizer
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (tok / f).is_file():
            shutil.copy(tok / f, out / f)
    n = sum(t.numel() for t in sd.values())
    print(f"{out}: {n / 1e6:.1f}M parameters, {n * 2 / 1e9:.3f} GB of bf16 weights")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
