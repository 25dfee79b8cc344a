"""Random weights at real dimensions (vLLM's ``--load-format dummy``): speed and memory of any size without
downloading a model. The bytes and the arithmetic are the real model's; the text is not.

A dummy target is named by a preset (:data:`PRESETS`: the published configs of common models), a HF folder or
``config.json`` (its weights, if any, are not read) or a ``.gguf`` file (its header's config). Its weights are
drawn in ``--dtype``, or, with ``--quantization`` naming a GGUF block format (``q4_0``, ``q4_k``, ...), drawn
directly as blocks of that format (random quants, small positive scales): what the integer path reads.
:func:`write_gguf` writes the same dimensions as a GGUF file that llama.cpp's ``llama-quantize`` and
``llama-bench`` take, so both engines run the identical file (``benchmarks/real_sizes``).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from peagle.files import written
from peagle.models.quant import FORMATS, QuantTensor

_LLAMA3_ROPE = {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}
# what Llama 3.1 and 3.2 share: tokenizer, KV heads, norm, RoPE base, context
_LLAMA3 = dict(model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=128256, num_key_value_heads=8,
               rms_norm_eps=1e-5, rope_theta=500000.0, max_position_embeddings=131072, bos_token_id=128000,
               eos_token_id=128001)
# The published config.json fields (as the models' hub folders give them) that peagle's loader reads.
PRESETS: dict[str, dict] = {
    "llama-3.2-1b": dict(**_LLAMA3, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                         num_attention_heads=32, head_dim=64, rope_scaling={**_LLAMA3_ROPE, "factor": 32.0},
                         tie_word_embeddings=True),
    "llama-3.2-3b": dict(**_LLAMA3, hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
                         num_attention_heads=24, head_dim=128, rope_scaling={**_LLAMA3_ROPE, "factor": 32.0},
                         tie_word_embeddings=True),
    "llama-3.1-8b": dict(**_LLAMA3, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, head_dim=128, rope_scaling={**_LLAMA3_ROPE, "factor": 8.0},
                         tie_word_embeddings=False),
    "qwen3-8b": dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], vocab_size=151936, hidden_size=4096,
                     intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=128, rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=40960,
                     tie_word_embeddings=False, bos_token_id=151643, eos_token_id=151645),
    "gpt-oss-20b": dict(model_type="gpt_oss", architectures=["GptOssForCausalLM"], vocab_size=201088, hidden_size=2880,
                        intermediate_size=2880, num_hidden_layers=24, num_attention_heads=64, num_key_value_heads=8,
                        head_dim=64, rms_norm_eps=1e-5, rope_theta=150000.0, max_position_embeddings=131072,
                        rope_scaling={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                      "original_max_position_embeddings": 4096, "truncate": False},
                        num_local_experts=32, num_experts_per_tok=4, experts_per_token=4, sliding_window=128,
                        attention_bias=True, swiglu_limit=7.0, tie_word_embeddings=False,
                        layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(24)],
                        bos_token_id=199998, eos_token_id=200002),
}
STD = 0.02  # the weights' spread (HF's initializer_range): activations stay finite through any depth


# A random block's |value| per unit of its float16 scale: the spread of its quants (less their offset), times
# a K-quant's sub-block scales (uniform 6-bit, or int8 for Q6_K).
_SPREAD = {"q8_0": 73.0, "q4_0": 4.6, "q4_1": 4.6, "q5_0": 9.2, "q5_1": 9.2, "q4_k": 147.0, "q5_k": 294.0,
           "q6_k": 1350.0}


def random_blocks(rows: int, cols: int, fmt: str, gen: torch.Generator) -> torch.Tensor:
    """``[rows, cols / block weights, block bytes]`` random blocks of GGUF format ``fmt``: random quants and
    sub-block scales, and float16 scales (and mins) drawn so that the values spread about :data:`STD`: what the
    kernels read, every value finite."""
    f = FORMATS[fmt]
    blocks = torch.randint(0, 256, (rows, cols // f.weights, f.block_bytes), dtype=torch.uint8, generator=gen)
    scale = (torch.rand(rows, cols // f.weights, 1, generator=gen) + 0.5) * (STD / _SPREAD[fmt])
    at = {"q6_k": [208], "q4_k": [0, 2], "q5_k": [0, 2]}.get(fmt, [0, 2] if f.has_min else [0])
    for i in at:  # d (and dmin, or m: a 32-weight block's min is a value, centring its quants)
        v = -scale * 8 if f.has_min and i == 2 and f.weights == 32 else scale
        blocks[..., i:i + 2] = v.half().view(torch.uint8)
    return blocks


def random_state_dict(shapes: dict[str, torch.Size], dtype: torch.dtype, fmt: str | None,
                      seed: int = 0) -> dict[str, torch.Tensor]:
    """A checkpoint of random tensors for ``shapes`` (HF names): norms 1, biases and sinks 0, the rest uniform
    with standard deviation :data:`STD`, in ``dtype``; with ``fmt`` (a GGUF block format) every matrix whose rows
    are whole blocks is drawn as blocks of it (:func:`random_blocks`)."""
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name, shape in shapes.items():
        leaf = name.rsplit(".", 1)[-1]
        if "norm" in name:
            out[name] = torch.ones(shape, dtype=dtype)
        elif leaf in ("bias", "sinks") or name.endswith("_bias"):
            out[name] = torch.zeros(shape, dtype=dtype)
        elif fmt is not None and len(shape) == 2 and shape[1] % FORMATS[fmt].weights == 0:
            out[name] = QuantTensor(random_blocks(shape[0], shape[1], fmt, gen), dtype)
        else:
            bound = STD * 3 ** 0.5
            out[name] = torch.empty(shape, dtype=dtype).uniform_(-bound, bound, generator=gen)
    return out


# ---------------------------------------------------------------------------------------- GGUF files
# What write_gguf writes (llama-quantize makes the block formats): the file type; the tensor type and its numpy
# dtype (bfloat16 as its raw uint16 bits, as llama.cpp's convert_hf_to_gguf.py writes it: numpy has no bfloat16).
GGUF_TYPES = {"f32": ("ALL_F32", "F32"), "f16": ("MOSTLY_F16", "F16"), "bf16": ("MOSTLY_BF16", "BF16")}
_NUMPY = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}


def write_gguf(cfg: dict, out: Path, tokenizer_gguf: Path, ftype: str = "f16", seed: int = 0) -> Path:
    """A Llama config's dimensions (a :data:`PRESETS` entry or a ``config.json``'s fields) as a GGUF file of random
    ``ftype`` weights, with the tokenizer of ``tokenizer_gguf`` (its vocabulary replaces the config's, as llama.cpp
    needs a tokenizer that covers the embedding). Written tensor by tensor, never holding the model, atomically;
    ``llama-quantize`` turns it into any format llama.cpp writes."""
    import gguf

    if cfg.get("model_type") != "llama":
        raise ValueError(f"write_gguf writes Llama models, not model_type {cfg.get('model_type')!r}")
    src = gguf.GGUFReader(str(tokenizer_gguf))
    tokens = src.fields["tokenizer.ggml.tokens"]
    vocab = len(tokens.data)
    H, I, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    heads = cfg["num_attention_heads"]
    kv, hd = cfg.get("num_key_value_heads") or heads, cfg.get("head_dim") or H // heads
    tensors = [("token_embd.weight", (vocab, H))]
    for i in range(L):
        tensors += [(f"blk.{i}.attn_norm.weight", (H,)), (f"blk.{i}.attn_q.weight", (heads * hd, H)),
                    (f"blk.{i}.attn_k.weight", (kv * hd, H)), (f"blk.{i}.attn_v.weight", (kv * hd, H)),
                    (f"blk.{i}.attn_output.weight", (H, heads * hd)), (f"blk.{i}.ffn_norm.weight", (H,)),
                    (f"blk.{i}.ffn_gate.weight", (I, H)), (f"blk.{i}.ffn_up.weight", (I, H)),
                    (f"blk.{i}.ffn_down.weight", (H, I))]
    tensors.append(("output_norm.weight", (H,)))
    if not cfg.get("tie_word_embeddings", False):
        tensors.append(("output.weight", (vocab, H)))
    out = Path(out)
    with written(out) as tmp:
        w = gguf.GGUFWriter(str(tmp), "llama")
        w.add_name("random weights")
        w.add_block_count(L)
        w.add_context_length(cfg.get("max_position_embeddings", 4096))
        w.add_embedding_length(H)
        w.add_feed_forward_length(I)
        w.add_head_count(heads)
        w.add_head_count_kv(kv)
        w.add_key_length(hd)
        w.add_value_length(hd)
        w.add_rope_dimension_count(hd)
        w.add_rope_freq_base(cfg.get("rope_theta", 10000.0))
        w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-6))
        w.add_vocab_size(vocab)
        file_type, tensor_type = GGUF_TYPES[ftype]
        w.add_file_type(gguf.LlamaFileType[file_type])
        for key, field in src.fields.items():  # the tokenizer, as the source file stores it
            if key.startswith("tokenizer."):
                kind = field.types[0]
                if kind == gguf.GGUFValueType.ARRAY:
                    item = field.types[1]
                    vals = [field.contents(i) for i in range(len(field.data))] if item == gguf.GGUFValueType.STRING \
                        else list(field.contents())
                    w.add_array(key, vals)
                else:
                    w.add_key_value(key, field.contents(), kind)
        gen = torch.Generator().manual_seed(seed)
        for name, shape in tensors:  # numpy's order: the writer stores ggml's (fastest dimension first)
            kind = "F32" if name.endswith("norm.weight") else tensor_type
            dt = np.dtype(_NUMPY[kind])
            w.add_tensor_info(name, list(shape), dt, int(np.prod(shape)) * dt.itemsize,
                              raw_dtype=gguf.GGMLQuantizationType[kind])
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        bound = STD * 3 ** 0.5
        for name, shape in tensors:
            if name.endswith("norm.weight"):
                w.write_tensor_data(np.ones(shape, np.float32))
            else:
                t = torch.empty(shape).uniform_(-bound, bound, generator=gen)
                w.write_tensor_data(t.bfloat16().view(torch.int16).numpy().view(np.uint16) if tensor_type == "BF16"
                                    else t.numpy().astype(_NUMPY[tensor_type]))
        w.close()
    return out
