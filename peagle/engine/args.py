"""The command line's engine arguments, as vLLM names them (its ``engine/arg_utils.py``): what every command
that loads a target or runs the engine adds to its parser (``peagle`` and the benchmarks)."""
from __future__ import annotations

import argparse

from peagle.engine.config import KV_CACHE_DTYPES, EngineConfig
from peagle.models.quant import FORMATS
from peagle.precision import COMPUTE_CHOICES, DEVICE_HELP, DTYPE_CHOICES, LOAD_FORMATS, QUANTIZATION_CHOICES


def add_quantization_arg(p) -> None:
    """``--quantization``, ``--load-format`` (vLLM's names) and ``--compute`` for every command that loads a target."""
    p.add_argument("--quantization", choices=QUANTIZATION_CHOICES + tuple(FORMATS), default=None,
                   help="gguf (the default for a .gguf target, the default model's too): its GGUF matrices "
                        "run as stored on peagle's CPU kernels; none: de-quantize the weights into --dtype; a block "
                        "format (q4_0, q4_k, ...): with --load-format dummy, random blocks of that format")
    p.add_argument("--load-format", choices=LOAD_FORMATS, default="auto",
                   help="auto: the target's weights; dummy: random weights at its dimensions (--target: a preset "
                        "such as llama-3.1-8b, a HF folder, a config.json or a .gguf file), as vLLM's")
    p.add_argument("--compute", choices=COMPUTE_CHOICES, default="fast",
                   help="fast (default): GGUF blocks through integer dot products, each row's activations rounded to "
                        "8 bits as llama.cpp does, and bfloat16 weights through bf16 dot products (AVX512_BF16, or "
                        "its steps in FMAs on AVX2) (batch-invariant: speculation stays exact); exact: float32 arithmetic on the "
                        "de-quantized or bf16 weights, bit for bit")


def add_runtime_args(p, engine: bool = False) -> None:
    """``--dtype`` and ``--device`` for a command-line parser, as vLLM names them; with ``engine``
    (commands that run the engine) ``--enforce-eager`` too."""
    p.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto",
                   help="the weights' dtype: auto = bfloat16 (on CUDA the arithmetic too; on the CPU the arithmetic "
                        "is float32 whatever the weights; float32 on torch's CPU fallback, batch-invariant there)")
    p.add_argument("--device", default="auto", help=DEVICE_HELP)
    if engine:
        p.add_argument("--enforce-eager", action="store_true",
                       help="CUDA: run decode steps eagerly, without CUDA graphs (the CPU always does)")


def add_kv_args(p) -> None:
    """``--kv-cache-dtype`` and ``--enable-prefix-caching`` (vLLM's names) for the commands that run the engine."""
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                   default=EngineConfig.enable_prefix_caching,
                   help="keep a request's KV blocks for the next prompt that starts with the same tokens: a chat's "
                        "next turn prefills only what is new (default: on, as vLLM's)")
    p.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto",
                   help="what the KV cache stores: auto = float16 where peagle's CPU kernels run their fast paths "
                        "(as llama.cpp's F16 cache: half the bytes attention reads), else the model's dtype "
                        "(float32 on the CPU with --compute exact)")


def add_lookup_args(p) -> None:
    """``--prompt-lookup-max/-min``: drafts from the text itself beside the head's (vLLM's n-gram keys);
    ``--response-lookup``: from the target's earlier responses."""
    p.add_argument("--prompt-lookup-max", type=int, default=EngineConfig.prompt_lookup_max,
                   help="drafts from the text itself beside the head's: where the last n tokens occurred before, "
                        "what followed them then; the longest n looked up (default %(default)s; 0: off)")
    p.add_argument("--prompt-lookup-min", type=int, default=EngineConfig.prompt_lookup_min,
                   help="the shortest n looked up (default %(default)s)")
    p.add_argument("--response-lookup", default=EngineConfig.response_lookup,
                   help="where the text proposes nothing: drafts from the target's earlier responses, a table "
                        "(`peagle index-responses`): auto (the one beside the head, if any), none, or its path")


def add_tree_args(p) -> None:
    """``--speculative-token-tree`` and its budget (P-EAGLE; vLLM's ``speculative_token_tree``)."""
    p.add_argument("--speculative-token-tree", default="chain",
                   help="chain (default: the top draft of each position), auto (the engine chooses a tree of "
                        "candidates each step, by measured acceptance and verify cost) or an explicit tree of rank "
                        "paths as vLLM writes it, e.g. \"[(0,), (1,), (0, 0)]\"")
    p.add_argument("--speculative-tree-budget", type=int, default=16,
                   help="the most nodes an auto tree verifies per sequence and step (default 16)")
