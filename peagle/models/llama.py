"""Native Llama-family targets: Llama 2/3 (llama3 RoPE), Mistral, Qwen2/2.5 (qkv bias), Qwen3 (q/k norm),
and what the other families (GPT-OSS, Qwen3-MoE, Gemma 3) build on: the config, the registry, the model skeleton.

One forward over a flat batch returns the logits of the rows asked for and the three auxiliary
hidden states EAGLE-3 heads read (vLLM's meaning: the residual stream entering layer ``i``).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import nn

from peagle.kernels import table
from peagle.models.attention import Attention, AttnMeta, KVCache
from peagle.models.checkpoint import CheckpointError, check_checkpoint, fuse_checkpoint
from peagle.models.layers import (MLP, Linear, RMSNorm, Rotary, embedding, linear, pack_for_inference,
                                  pack_weight, packs, parse_rope, set_fast_layout, wants_in_out, weight_dtype)
from peagle.models.quant import QuantParts, QuantTensor, bf16_dots, formats, operand, read_as_is
from peagle.precision import dtype_name, precision_name


class Target(NamedTuple):
    architecture: str  # the HF class name, e.g. "GptOssForCausalLM"
    model: str         # our class, "module:Class" in peagle.models


# The native targets by HF ``model_type``, the one registry: ModelConfig.from_hf refuses what is not
# here and build_target picks the class. Classes outside this module are imported on first use
# (their modules import this one).
SUPPORTED_ARCHITECTURES: dict[str, Target] = {
    "llama": Target("LlamaForCausalLM", "llama:LlamaModel"),
    "mistral": Target("MistralForCausalLM", "llama:LlamaModel"),
    "qwen2": Target("Qwen2ForCausalLM", "llama:LlamaModel"),
    "qwen3": Target("Qwen3ForCausalLM", "llama:LlamaModel"),
    "gpt_oss": Target("GptOssForCausalLM", "gpt_oss:GptOssModel"),
    "qwen3_moe": Target("Qwen3MoeForCausalLM", "qwen3_moe:Qwen3MoeModel"),
    "gemma3_text": Target("Gemma3ForCausalLM", "gemma3:Gemma3Model"),
}
LAYER_TYPES = ("full_attention", "sliding_attention")


class UnsupportedModelError(ValueError):
    pass


@dataclass
class ModelConfig:
    """The fields of a HF ``config.json`` that the supported families need, normalised across versions."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    sliding_window: int | None = None
    layer_types: list[str] | None = None       # per layer: "sliding_attention" or "full_attention" (GPT-OSS, Gemma 3)
    rope_local_theta: float | None = None      # the sliding layers' RoPE base (Gemma 3; None: rope_theta everywhere)
    query_pre_attn_scalar: float | None = None  # attention scores scaled by its -1/2 power (None: head_dim's)
    final_logit_softcapping: float | None = None  # logits -> cap * tanh(logits / cap) (Gemma)
    hidden_activation: str = "silu"            # the gated MLP's: silu (SwiGLU) or gelu_pytorch_tanh (Gemma)
    eos_token_ids: list[int] = field(default_factory=list)
    # mixture of experts (GPT-OSS, Qwen3-MoE): which layers route, among how many experts of which width
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    moe_layers: list[int] = field(default_factory=list)
    norm_topk_prob: bool = False               # renormalise the chosen experts' weights to sum to 1
    swiglu_alpha: float = 1.702                # GPT-OSS's clamped SwiGLU
    swiglu_limit: float = 7.0

    @classmethod
    def from_hf(cls, cfg: dict) -> "ModelConfig":
        mt = cfg.get("model_type")
        if mt not in SUPPORTED_ARCHITECTURES:
            archs = cfg.get("architectures") or [mt]
            raise UnsupportedModelError(
                f"unsupported architecture {archs[0]!r} (model_type {mt!r}); supported: "
                + ", ".join(f"{t.architecture} ({k})" for k, t in SUPPORTED_ARCHITECTURES.items()))
        theta, rope = parse_rope(cfg)
        local_theta = None
        if mt == "gemma3_text":
            theta, rope, local_theta = parse_gemma_rope(cfg)
            if cfg.get("attn_logit_softcapping") is not None:
                raise UnsupportedModelError("attention logit soft-capping (Gemma 2) is not supported")
            if cfg.get("use_bidirectional_attention"):
                raise UnsupportedModelError("bidirectional attention (EmbeddingGemma) is not a causal LM")
        heads = cfg["num_attention_heads"]
        num_layers = cfg["num_hidden_layers"]
        eos = cfg.get("eos_token_id")
        sliding = cfg.get("sliding_window")
        if mt in ("qwen2", "qwen3", "qwen3_moe") and not cfg.get("use_sliding_window", False):
            sliding = None
        attention_bias = bool(cfg.get("attention_bias", mt == "gpt_oss"))
        experts = cfg.get("num_local_experts") or cfg.get("num_experts") or 0
        moe: dict = {}
        layer_types = None
        if mt in ("gpt_oss", "gemma3_text"):  # GPT-OSS alternates; Gemma 3 has one global layer in `pattern`
            pattern = 2 if mt == "gpt_oss" else cfg.get("sliding_window_pattern", 6)
            layer_types = cfg.get("layer_types") or [LAYER_TYPES[int((i + 1) % pattern != 0)] for i in range(num_layers)]
            if len(layer_types) != num_layers or set(layer_types) - set(LAYER_TYPES):
                raise ValueError(f"layer_types must name {num_layers} layers, each one of {LAYER_TYPES}: {layer_types}")
            layer_types = list(layer_types)
        if mt == "gpt_oss":
            moe = dict(moe_intermediate_size=cfg["intermediate_size"],
                       moe_layers=list(range(num_layers)), norm_topk_prob=True,
                       swiglu_alpha=cfg.get("swiglu_alpha", 1.702), swiglu_limit=cfg.get("swiglu_limit", 7.0))
        elif mt == "qwen3_moe":
            step, dense = cfg.get("decoder_sparse_step", 1), set(cfg.get("mlp_only_layers") or [])
            moe = dict(moe_intermediate_size=cfg["moe_intermediate_size"],
                       moe_layers=[i for i in range(num_layers) if experts and i not in dense and (i + 1) % step == 0],
                       norm_topk_prob=bool(cfg.get("norm_topk_prob", False)))
        if moe:
            moe.update(num_experts=experts, num_experts_per_tok=cfg.get("num_experts_per_tok", 0))
            if moe["moe_layers"] and not 0 < moe["num_experts_per_tok"] <= experts:
                raise ValueError(f"num_experts_per_tok {moe['num_experts_per_tok']} must be in 1..{experts} (experts)")
        return cls(
            model_type=mt,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=num_layers,
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=theta,
            rope_scaling=rope,
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            qkv_bias=mt == "qwen2" or attention_bias,
            o_bias=attention_bias and mt != "qwen2",
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            qk_norm=mt in ("qwen3", "qwen3_moe"),
            sliding_window=sliding,
            layer_types=layer_types,
            rope_local_theta=local_theta,
            query_pre_attn_scalar=cfg.get("query_pre_attn_scalar") if mt == "gemma3_text" else None,
            final_logit_softcapping=cfg.get("final_logit_softcapping"),
            hidden_activation=cfg.get("hidden_activation") or cfg.get("hidden_act") or "silu",
            eos_token_ids=[eos] if isinstance(eos, int) else list(eos or []),
            **moe,
        )

    def default_aux_layers(self) -> tuple[int, int, int]:
        L = self.num_layers
        return (2, L // 2, L - 3)

    @property
    def attn_scale(self) -> float:
        """What attention scores are scaled by."""
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    def window(self, layer: int) -> int | None:
        """Layer ``layer``'s attention window (None: full attention)."""
        if self.layer_types is not None and self.layer_types[layer] != "sliding_attention":
            return None
        return self.sliding_window


def parse_gemma_rope(cfg: dict) -> tuple[float, dict | None, float]:
    """Gemma 3's (global theta, global scaling, local theta): transformers 5's ``rope_parameters`` by layer
    type, or 4.x's ``rope_theta`` + ``rope_scaling`` (global) and ``rope_local_base_freq``."""
    by_type = cfg.get("rope_parameters") or {}
    if "full_attention" in by_type:
        theta, rope = parse_rope({"rope_parameters": by_type["full_attention"]})
        local, local_rope = parse_rope({"rope_parameters": by_type.get("sliding_attention") or {}})
    else:
        (theta, rope), local, local_rope = parse_rope(cfg), float(cfg.get("rope_local_base_freq", 10000.0)), None
    if local_rope is not None:
        raise UnsupportedModelError(f"scaled RoPE on the sliding layers ({local_rope}) is not supported")
    return theta, rope, local


def build_target(cfg: ModelConfig, aux_layers: tuple[int, ...] | None = None) -> "LlamaModel":
    """The native model for ``cfg``'s family (uninitialised; load a checkpoint next)."""
    module, name = SUPPORTED_ARCHITECTURES[cfg.model_type].model.split(":")
    return getattr(importlib.import_module(f"peagle.models.{module}"), name)(cfg, aux_layers)


class DecoderLayer(nn.Module):
    """Pre-norm attention and feed-forward block. ``mlp`` replaces the dense SwiGLU (the MoE families)."""

    def __init__(self, hidden: int, inter: int, heads: int, kv_heads: int, head_dim: int, eps: float, *,
                 in_dim: int | None = None, qkv_bias=False, o_bias=False, mlp_bias=False, qk_norm=False,
                 sliding_window: int | None = None, sinks: bool = False, mlp: nn.Module | None = None,
                 scale: float | None = None):
        super().__init__()
        self.self_attn = Attention(hidden, heads, kv_heads, head_dim, in_dim=in_dim, qkv_bias=qkv_bias,
                                   o_bias=o_bias, qk_norm_eps=eps if qk_norm else None,
                                   sliding_window=sliding_window, sinks=sinks, scale=scale)
        self.mlp = mlp if mlp is not None else MLP(hidden, inter, mlp_bias)
        self.input_layernorm = RMSNorm(hidden, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)

    def forward(self, x, rope, cache, meta, keep: torch.Tensor | None = None):
        """``keep``: the rows whose output is read (a drafting pass's drafted rows); every row's KV is written, the
        MLP runs for these alone and the output has these rows."""
        attended = self.self_attn(self.input_layernorm(x), rope, cache, meta)
        if keep is not None:
            attended, x = attended[keep], x[keep]
        normed, h = self.post_attention_layernorm.add_forward(attended, x)
        return h + self.mlp(normed)


def stackable(layers) -> bool:
    """Whether ``peagle::decoder_layers`` computes these layers: plain Llama-style ones (dense SwiGLU, no
    q/k norms, no sinks)."""
    return all(type(layer.mlp) is MLP and layer.mlp.act == "silu" and layer.self_attn.q_norm is None
               and layer.self_attn.sinks is None for layer in layers)


def stack_key(layers) -> tuple:
    """Changes when the layers' weights are replaced (loaded, cast), so their list is made again."""
    return (id(layers[0].self_attn.qkv_proj.weight), id(layers[-1].mlp.down_proj.weight),
            id(layers[0].input_layernorm.weight))


def parts_of(w: torch.Tensor, n: int) -> list[torch.Tensor | None]:
    """A fused weight as ``peagle::decoder_layers`` takes it in ``n`` slots: its parts' blocks
    (:class:`~peagle.models.quant.QuantParts`), or itself then None."""
    ts = [p.blocks for p in w.parts] if isinstance(w, QuantParts) else [operand(w)]
    return ts + [None] * (n - len(ts))


def stack_weights(layers) -> list[torch.Tensor | None]:
    """Each layer's 13 tensors in ``peagle::decoder_layers``' order (a GGUF matrix as its blocks: the operator
    takes them as they are, no per-step unwrapping; q/k/v and gate/up in three and two slots, for their parts)."""
    return [t for layer in layers for t in (
        layer.input_layernorm.weight, *parts_of(layer.self_attn.qkv_proj.weight, 3), layer.self_attn.qkv_proj.bias,
        operand(layer.self_attn.o_proj.weight), layer.self_attn.o_proj.bias, layer.post_attention_layernorm.weight,
        *parts_of(layer.mlp.gate_up_proj.weight, 2), layer.mlp.gate_up_proj.bias, operand(layer.mlp.down_proj.weight),
        layer.mlp.down_proj.bias)]


def native_layers(x: torch.Tensor, weights: list, rope: tuple[torch.Tensor, torch.Tensor], caches: list[KVCache],
                  meta: AttnMeta, windows: list[int], heads: int, head_dim: int, scale: float, eps: float,
                  taps: list[int], first_normed: torch.Tensor | None = None,
                  keep: torch.Tensor | None = None) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Every layer in one call to ``peagle::decoder_layers``: the same kernels in the same order as the layers'
    own forwards (the same bits), without ~10 Python and dispatcher round trips a layer. Returns the last
    layer's output (of the rows ``keep`` alone, where given: see :meth:`DecoderLayer.forward`) and the inputs
    of the layers in ``taps``."""
    cos, sin = rope
    return torch.ops.peagle.decoder_layers(
        x.contiguous(), weights, cos, sin, [k.k for k in caches], [k.v for k in caches], meta.slot_mapping, meta.table,
        meta.seq_of_row, meta.positions, meta.short_rows, meta.block_size, windows, heads, head_dim, scale, eps, taps,
        **meta.tree_args, first_normed=first_normed, out_rows=keep)


class LlamaModel(nn.Module):
    """The target. State-dict names are HF's (``model.layers.0.self_attn.q_proj.weight``, ``lm_head.weight``).
    Other families subclass it and change what differs: ``make_layer``, ``make_mlp``, ``attention_sinks``,
    ``convert_checkpoint``, ``embed``, ``logits``."""

    attention_sinks = False
    packed = False  # see pack_for_inference

    def __init__(self, cfg: ModelConfig, aux_layers: tuple[int, ...] | None = None):
        super().__init__()
        self.cfg = c = cfg
        self.aux_layers = tuple(aux_layers if aux_layers is not None else c.default_aux_layers())
        for i in self.aux_layers:
            if not 0 <= i <= c.num_layers:
                raise ValueError(f"aux hidden-state layer id {i} out of range 0..{c.num_layers}")
        self.model = nn.Module()
        self.model.embed_tokens = embedding(c.vocab_size, c.hidden_size)
        self.model.layers = nn.ModuleList(self.make_layer(i) for i in range(c.num_layers))
        self.model.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = None if c.tie_word_embeddings else Linear(c.hidden_size, c.vocab_size)
        self.make_rotary()
        self.windows = tuple(dict.fromkeys(c.window(i) for i in range(c.num_layers)))

    def make_layer(self, i: int) -> nn.Module:
        """Layer ``i``."""
        c = self.cfg
        return DecoderLayer(c.hidden_size, c.intermediate_size, c.num_heads, c.num_kv_heads, c.head_dim, c.rms_norm_eps,
                            qkv_bias=c.qkv_bias, o_bias=c.o_bias, qk_norm=c.qk_norm, sliding_window=c.window(i),
                            sinks=self.attention_sinks, mlp=self.make_mlp(i), scale=c.attn_scale)

    def make_rotary(self, device: torch.device | None = None) -> None:
        """RoPE's tables: ``rotary`` for every layer, ``local_rotary`` for the sliding ones where their base
        differs (Gemma 3), else None."""
        c = self.cfg
        self.rotary = Rotary(c.head_dim, c.rope_theta, c.rope_scaling).to(device)
        self.local_rotary = None if c.rope_local_theta is None else Rotary(c.head_dim, c.rope_local_theta, None).to(device)

    def make_mlp(self, layer: int) -> nn.Module:
        """Layer ``layer``'s feed-forward block."""
        return MLP(self.cfg.hidden_size, self.cfg.intermediate_size, self.cfg.mlp_bias, self.cfg.hidden_activation)

    @property
    def graph_safe(self) -> bool:
        """Whether a CUDA graph can replay its forward: no host reads inside (the mixture-of-experts
        layers' routing reads the chosen experts on the host, so those targets decode eagerly)."""
        return not self.cfg.moe_layers

    @property
    def lm_weight(self) -> torch.Tensor:
        return self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    @property
    def dtype(self) -> torch.dtype:
        """The activations' dtype (the embedding's); the linear layers' weights may be 16-bit
        (:attr:`weight_dtype`, :func:`peagle.models.layers.set_precision`)."""
        return self.model.embed_tokens.weight.dtype

    @property
    def weight_dtype(self) -> torch.dtype:
        return weight_dtype(self)

    @property
    def precision(self) -> str:
        """What runs, as the commands and the server's start line say it: ``float16 weights, float32
        compute``, ``bfloat16 weights, bf16 dot products`` where they are packed for that path, or ``GGUF
        Q4_1/Q8_0 weights, int8 compute`` where GGUF blocks are kept (packed: every GGUF format; ``float32
        compute`` with ``--compute exact``)."""
        quant = formats(self)
        if quant:  # packed blocks run the integer path, the file's blocks float32 arithmetic
            return "; ".join(f"GGUF {'/'.join(f.upper() for f in fs)} weights, {arith} compute" for fs, arith in (
                (formats(self, packed=True), "int8"), (formats(self, packed=False), dtype_name(self.dtype))) if fs)
        if bf16_dots(self):
            return f"{dtype_name(self.weight_dtype)} weights, bf16 dot products"
        return precision_name(self.weight_dtype, self.dtype)

    def load_checkpoint(self, sd: dict[str, torch.Tensor]) -> None:
        """Load a HF state dict (separate q/k/v and gate/up names), checking names and shapes. Takes ``sd``'s
        tensors over and empties it: fused in place, no tensor is held twice (a caller's dict would keep the
        unfused parts beside the model's fused copies)."""
        if self.cfg.tie_word_embeddings:
            sd.pop("lm_head.weight", None)
        given, sd = sd, self.convert_checkpoint(sd)
        check_checkpoint(sd, self)
        sd = fuse_checkpoint(sd)
        self.load_state_dict(sd, assign=True)  # the tensors as read: no copy (and off the meta device)
        given.clear()
        self.make_rotary(self.lm_weight.device)
        set_fast_layout(self)

    def convert_checkpoint(self, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A family's on-disk layouts -> the names and shapes of ``state_dict`` (before q/k/v and
        gate/up fusion), in place where it can be (a new dict keeps the old one's tensors until loading
        ends). The Llama family stores none of its own."""
        return sd

    def head_weight(self) -> torch.Tensor:
        """The LM head weight as :func:`linear` runs it fastest. A tied head that needs another form
        than the embedding's rows (in the layers' 16-bit weight dtype, transposed for float32 on a CPU
        without peagle's kernels, packed once the model is packed for inference) gets its own copy,
        rebuilt if the embedding changes."""
        if self.lm_head is not None:
            return self.lm_head.weight
        w = self.model.embed_tokens.weight
        if isinstance(w, QuantTensor):  # a GGUF embedding: the head multiplies by its blocks as they are
            return w
        if self.weight_dtype != w.dtype:  # 16-bit layer weights: the head too (it is the largest matrix)
            make = lambda: w.detach().to(self.weight_dtype).contiguous()  # noqa: E731
        elif wants_in_out(w):
            make = lambda: w.detach().t().contiguous().t()  # noqa: E731
        elif self.packed and packs(w):
            make = lambda: pack_weight(w)  # noqa: E731
        else:
            return w
        key = (w.data_ptr(), w.dtype, w._version)
        if getattr(self, "_head_key", None) != key:
            self._head_t, self._head_key = make(), key
        return self._head_t

    def pack_for_inference(self) -> None:
        """oneDNN-packed weights where they pay (bf16 on CPU, :func:`packs`); inference only."""
        pack_for_inference(self)
        self.packed = True

    def make_caches(self, num_slots: int, dtype: torch.dtype | None = None) -> list[KVCache]:
        p = self.model.embed_tokens.weight
        return [KVCache(num_slots, self.cfg.num_kv_heads, self.cfg.head_dim, dtype or p.dtype, p.device)
                for _ in range(self.cfg.num_layers)]

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, caches: list[KVCache], meta: AttnMeta,
                logits_rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (logits of ``logits_rows`` (all rows if None), aux hidden states ``[T, 3*H]``)."""
        x, taps = self.hidden(ids, positions, caches, meta, logits_rows)
        return self.logits(x), taps

    def hidden(self, ids: torch.Tensor, positions: torch.Tensor, caches: list[KVCache], meta: AttnMeta,
               rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(final normed hidden states of ``rows`` (all if None), aux hidden states ``[T, 3*H]``):
        training reads the target's distribution over a draft vocabulary from the first."""
        x, c = self.embed(ids), self.cfg
        meta = meta.for_layers(positions, caches, x, c.head_dim, c.num_heads // c.num_kv_heads, self.windows)
        rope = self.rotary.table(positions, x.dtype)
        local = rope if self.local_rotary is None else self.local_rotary.table(positions, x.dtype)
        if self.stacks(x, caches, meta):
            x, tapped = self.native_stack(x, rope, caches, meta)
            taps = dict(zip(self.aux_layers, tapped))
        else:
            taps = {}
            for i, layer in enumerate(self.model.layers):
                if i in self.aux_layers:
                    taps[i] = x
                x = layer(x, local if layer.self_attn.sliding_window else rope, caches[i], meta)
            taps[self.cfg.num_layers] = x
        if rows is not None:
            x = x[rows]
        return self.model.norm(x), torch.cat([taps[i] for i in self.aux_layers], dim=-1)

    def decode(self, ids: torch.Tensor, positions: torch.Tensor, caches: list[KVCache], meta: AttnMeta,
               rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """:meth:`forward` over a step's rows with each verified row's argmax: (logits of ``rows``, taps,
        (tokens, finite rows) or None). One native call (``peagle::target_pass``: the embedding, the layers, the
        final norm, the LM head, the argmax) where :meth:`stacks` holds and the embedding and the LM head are
        weights it reads as they are (the same bits); else :meth:`forward`, and None."""
        c = self.cfg
        probe = torch.empty(0, c.hidden_size, dtype=self.dtype, device=ids.device)  # the layers' input, as the kernels see it
        if self.fuses():
            cut = meta.for_layers(positions, caches, probe, c.head_dim, c.num_heads // c.num_kv_heads, self.windows)
            if self.stacks(probe, caches, cut):
                weights = self.native_weights()
                cos, sin = self.rotary.rows(int(positions.max()) + 1, self.dtype)
                logits, taps, tokens, finite = torch.ops.peagle.target_pass(
                    ids, operand(self.model.embed_tokens.weight), weights, cos.view(len(cos), -1), sin.view(len(sin), -1),
                    [k.k for k in caches], [k.v for k in caches], cut.slot_mapping, cut.table, cut.seq_of_row,
                    cut.positions, cut.short_rows, cut.block_size, self._stack_windows, c.num_heads, c.head_dim,
                    c.attn_scale, c.rms_norm_eps, list(self.aux_layers), cut.tree_args.get("tree_base"),
                    cut.tree_args.get("tree_map"), rows, self.model.norm.weight, operand(self.head_weight()))
                return logits, taps, (tokens, finite)
        logits, taps = self(ids, positions, caches, meta, rows)
        return logits, taps, None

    def fuses(self) -> bool:
        """Whether this model's pass may run as one ``peagle::target_pass`` (where :meth:`stacks` holds too):
        an embedding of GGUF or packed rows or a float32 table, an LM head peagle's linear reads as it is, no
        logit soft-capping."""
        e, h = self.model.embed_tokens.weight, self.head_weight()
        own = all(getattr(type(self), f) is getattr(LlamaModel, f) for f in ("embed", "hidden", "logits"))
        return (own and self.cfg.final_logit_softcapping is None
                and e.dtype == torch.float32 and read_as_is(e) and read_as_is(h))

    def stacks(self, x: torch.Tensor, caches: list, meta: AttnMeta) -> bool:
        """Whether :meth:`native_stack` runs this pass: peagle's CPU kernels take every op of every layer
        (plain Llama-style layers; rows the attention kernel takes whole, as in decoding and verification)."""
        if getattr(self, "_stackable", None) is None:
            self._stackable = self.local_rotary is None and all(
                type(layer) is DecoderLayer for layer in self.model.layers) and stackable(self.model.layers)
        c = self.cfg
        return table.pick("decoder_layers", x, caches, meta, c.head_dim, c.num_heads // c.num_kv_heads,
                            lambda: self._stackable).native

    def native_stack(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], caches: list[KVCache],
                     meta: AttnMeta) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Every layer in one call (:func:`native_layers`; a step's ~300 Python and dispatcher round trips
        saved). Returns the last layer's output and the aux layers' inputs."""
        c = self.cfg
        return native_layers(x, self.native_weights(), rope, caches, meta, self._stack_windows, c.num_heads,
                             c.head_dim, c.attn_scale, c.rms_norm_eps, list(self.aux_layers))

    def native_weights(self) -> list:
        """The layers' weights as ``peagle::decoder_layers`` takes them (:func:`stack_weights`), listed again when
        they are replaced (loaded, cast); ``_stack_windows`` beside them."""
        layers = self.model.layers
        if getattr(self, "_stack_key", None) != stack_key(layers):
            self._stack_weights, self._stack_key = stack_weights(layers), stack_key(layers)
            self._stack_windows = [layer.self_attn.sliding_window or 0 for layer in layers]
        return self._stack_weights

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """The rows entering the first layer (a GGUF table's straight from its blocks: the same rows as
        ``embedding`` gives through :class:`QuantTensor`'s dispatch, without it)."""
        w = self.model.embed_tokens.weight
        return w.rows(ids) if isinstance(w, QuantTensor) else self.model.embed_tokens(ids)

    def logits(self, normed: torch.Tensor) -> torch.Tensor:
        out = linear(normed, self.head_weight())
        cap = self.cfg.final_logit_softcapping
        return out if cap is None else torch.tanh(out / cap) * cap
