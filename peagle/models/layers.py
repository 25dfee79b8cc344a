"""Building blocks shared by the target models and the drafter.

Everything works on a flat batch of tokens (``[T, ...]``) from many sequences at once, the
layout vLLM uses: a step's metadata (:class:`AttnMeta`) says where each sequence's queries are,
where their keys go in the paged KV cache and which cache slots make up their context.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from peagle.kernels import table
from peagle.cpu import cpu_has_native_bf16
from peagle.models.quant import (GROUP, QBLOCK, QuantParts, QuantTensor, bf16_packable, onto_huge_pages, pack,
                                 pack_bf16, pack_bf16_rows, pack_owned, packable, quantize, quantized)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T (+ bias)`` by the kernel :func:`peagle.table.pick` chooses for ``x`` and the weight's
    format: peagle's CPU kernel (GGUF blocks, packed or not, several formats fused as
    :class:`~peagle.models.quant.QuantParts`, or a plain contiguous ``[out, in]`` matrix of any float dtype;
    float32 arithmetic, batch-invariant), else torch's, for either memory order of ``weight``
    (:func:`set_fast_layout`), a weight packed for oneDNN (:func:`pack_for_inference`), or a GGUF-quantized one
    (de-quantized per call)."""
    return table.run("linear", x, weight, bias)


def packs(w: torch.Tensor) -> bool:
    """bf16 on a CPU with native bf16 and without peagle's kernels: oneDNN's blocked weight layout runs
    the few rows of decoding and verification 1.6-1.8x faster than torch's ``mm`` on the same weights,
    with identical results (measured, 1-512 rows). float32 keeps ``mm`` (packed results differ from it
    in the last bits)."""
    return (w.device.type == "cpu" and w.dtype == torch.bfloat16 and not w.is_mkldnn and not table.on_device(w.device)
            and torch.backends.mkldnn.is_available() and cpu_has_native_bf16())


def pack_weight(w: torch.Tensor) -> torch.Tensor:
    """``w`` (``[out, in]``) in oneDNN's blocked layout: an opaque tensor only :func:`linear` reads."""
    return torch.ops.mkldnn._reorder_linear_weight(w.detach().contiguous())


def pack_for_inference(model: nn.Module) -> None:
    """Pack every :class:`Linear` weight for oneDNN where :func:`packs` says so, in place (one copy:
    the plain weight is replaced). For inference only: a packed model does not train or save."""
    for m in model.modules():
        if isinstance(m, Linear) and packs(m.weight):
            m.weight = nn.Parameter(pack_weight(m.weight), requires_grad=False)


def wants_in_out(w: torch.Tensor) -> bool:
    """float32 on a CPU without peagle's kernels multiplies the few rows of decoding faster with weights
    stored ``[in, out]``; bf16, CUDA and the kernels want ``[out, in]``."""
    return w.dtype == torch.float32 and w.device.type == "cpu" and not table.on_device(w.device)


def set_fast_layout(model: nn.Module) -> None:
    """Store every :class:`Linear` weight in its dtype's fast order, exposed as an ``[out, in]`` view
    either way (state dicts keep HF names and shapes). Call after loading or changing dtype."""
    for m in model.modules():
        if isinstance(m, Linear) and not m.weight.is_mkldnn and not isinstance(m.weight, (QuantTensor, QuantParts)):
            w = m.weight.data
            m.weight.data = w.t().contiguous().t() if wants_in_out(w) else w.contiguous()


def set_precision(model: nn.Module, weights: torch.dtype, compute: torch.dtype) -> None:
    """Every :class:`Linear` weight in ``weights`` (``[out, in]``), every other floating-point parameter
    (embeddings, norms, biases) in ``compute``, the activations' dtype: 16-bit weights with float32
    arithmetic where peagle's CPU kernels run. In place; a cast leaves the weight frozen (inference)."""
    for m in model.modules():
        for name, p in m.named_parameters(recurse=False):
            want = weights if isinstance(m, Linear) and name == "weight" else compute
            if p.is_floating_point() and p.dtype != want:
                setattr(m, name, nn.Parameter(p.detach().to(want).contiguous(), requires_grad=False))
    set_fast_layout(model)


def weight_dtype(model: nn.Module) -> torch.dtype:
    """The dtype of ``model``'s :class:`Linear` weights (see :func:`set_precision`)."""
    return next(m.weight.dtype for m in model.modules() if isinstance(m, Linear))


class Linear(nn.Module):
    """A linear layer whose weight lives in ``[in, out]`` memory order (see :func:`linear`).
    Left uninitialised: weights are loaded, or set by the owner's ``init_weights``."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(in_features, out_features).t())
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


def embedding(num: int, dim: int) -> nn.Embedding:
    """An uninitialised embedding table (nn.Embedding's own init costs seconds on big vocabularies)."""
    return nn.Embedding(num, dim, _weight=torch.empty(num, dim))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return table.run("rms_norm", x, self.weight, self.eps)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm of ``residual + x``, ``residual + x``): the residual add fused into the norm on the CPU kernels."""
        return table.run("add_rms_norm", x, residual, self.weight, self.eps)


def parse_rope(cfg: dict) -> tuple[float, dict | None]:
    """(theta, scaling) from a HF config: ``rope_parameters`` (transformers 5) or
    ``rope_theta`` + ``rope_scaling`` (4.x). Plain RoPE gives ``None`` scaling."""
    rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    theta = float(rope.pop("rope_theta", cfg.get("rope_theta", 10000.0)))
    if rope.get("rope_type", rope.get("type", "default")) == "default":
        rope = {}
    return theta, rope or None


def rope_frequencies(head_dim: int, theta: float, scaling: dict | None) -> tuple[torch.Tensor, float]:
    """(inverse RoPE frequencies, factor on cos/sin) for the rope types of the supported families:
    default, linear, llama3 (Llama 3.x, the GPT-OSS heads), yarn (GPT-OSS). As in HF transformers."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind == "default":
        return inv.float(), 1.0
    if kind == "linear":
        return (inv / scaling["factor"]).float(), 1.0
    if kind == "llama3":
        factor, lo, hi = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        lo_wavelen, hi_wavelen = old_len / lo, old_len / hi
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > lo_wavelen, inv / factor, inv)
        smooth = (old_len / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = (wavelen >= hi_wavelen) & (wavelen <= lo_wavelen)
        return torch.where(is_medium, smoothed, scaled).float(), 1.0
    if kind == "yarn":
        # interpolate the slow dimensions by `factor`, keep the fast ones, ramp linearly between the
        # dimensions that turn beta_fast and beta_slow times over the original context
        factor, old_len = scaling["factor"], scaling["original_max_position_embeddings"]

        def mscale(m: float) -> float:
            return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

        attn = scaling.get("attention_factor")
        if attn is None:
            m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
            attn = mscale(m) / mscale(m_all) if m and m_all else mscale(1.0)

        def dim_of(rotations: float) -> float:
            return head_dim * math.log(old_len / (rotations * 2 * math.pi)) / (2 * math.log(theta))

        lo, hi = dim_of(scaling.get("beta_fast") or 32), dim_of(scaling.get("beta_slow") or 1)
        if scaling.get("truncate", True):
            lo, hi = math.floor(lo), math.ceil(hi)
        lo, hi = max(lo, 0), min(hi, head_dim - 1)
        ramp = ((torch.arange(head_dim // 2, dtype=torch.float64) - lo) / (hi - lo if hi != lo else 0.001)).clamp(0, 1)
        return (inv / factor * ramp + inv * (1 - ramp)).float(), float(attn)
    raise ValueError(f"unsupported rope_type {kind!r} (supported: default, linear, llama3, yarn)")


class Rotary(nn.Module):
    """RoPE in HF's rotate-half layout. ``table`` is computed once per forward and shared by all layers."""

    def __init__(self, head_dim: int, theta: float, scaling: dict | None):
        super().__init__()
        # on the CPU when the model is built on the meta device (the loader remakes the tables on the weights'
        # device): meta's float64 arange runs through torch._refs, which imports torch._dynamo (147 MB, 1 s)
        device = torch.get_default_device()
        with torch.device("cpu" if device.type == "meta" else device):
            inv_freq, self.attention_scaling = rope_frequencies(head_dim, theta, scaling)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._rows: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}  # table's cache (CPU)

    def table(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of ``positions`` ``[T]``, each ``[T, 1, head_dim]`` in ``dtype``. On a CPU, rows of a
        table kept for the positions up to the largest seen (grown by doubling): the same bits as
        :meth:`compute`, in three operators instead of eight, twice a decoding step. Elsewhere computed
        each call (no host sync; CUDA graphs capture it)."""
        if positions.device.type != "cpu" or positions.dim() != 1 or not len(positions):
            return self.compute(positions, dtype)
        cos, sin = self.rows(int(positions.max()) + 1, dtype)
        return cos.index_select(0, positions), sin.index_select(0, positions)

    def rows(self, need: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The CPU table of :meth:`table`, ``[n, 1, head_dim]`` for at least ``need`` positions."""
        have = self._rows.get(dtype)
        if have is None or len(have[0]) < need:
            n = max(need, 256 if have is None else 2 * len(have[0]))
            self._rows[dtype] = self.compute(torch.arange(n, device=self.inv_freq.device), dtype)
        return self._rows[dtype]

    def compute(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)[:, None, :]  # [T, 1, head_dim]
        cos, sin = emb.cos(), emb.sin()
        if self.attention_scaling != 1.0:
            cos, sin = cos * self.attention_scaling, sin * self.attention_scaling
        return cos.to(dtype), sin.to(dtype)


def apply_rope(x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    cos, sin = rope
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


ACTIVATIONS = {"silu": F.silu, "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh")}


class MLP(nn.Module):
    """A gated MLP, ``down(act(gate) * up)``: SwiGLU (``silu``) or Gemma's GELU-tanh (``gelu_pytorch_tanh``),
    gate and up fused into one projection (checkpoints keep separate names)."""

    def __init__(self, hidden: int, inter: int, bias: bool = False, act: str = "silu"):
        super().__init__()
        if act not in ACTIVATIONS:
            raise ValueError(f"unsupported MLP activation {act!r} (supported: {', '.join(ACTIVATIONS)})")
        self.inter, self.act = inter, act
        self.gate_up_proj = Linear(hidden, 2 * inter, bias)
        self.down_proj = Linear(inter, hidden, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if self.act == "silu":
            return self.down_proj(table.run("silu_mul", gate_up, self.inter))
        return self.down_proj(ACTIVATIONS[self.act](gate_up[..., :self.inter]) * gate_up[..., self.inter:])


def pack_model(model: torch.nn.Module, tied: torch.nn.Embedding | None = None, owned: bool = False) -> None:
    """``model``'s weights packed for the kernels' paths that this CPU runs, in place (after loading: fused
    q/k/v and gate/up matrices are packed whole): every quantized weight whose rows come in groups of 16
    :func:`pack`-ed for the integer path (``owned``: the model alone holds its blocks, which may then be packed
    where they lie, :func:`pack_owned`); every bfloat16 :class:`~peagle.models.layers.Linear` weight
    :func:`pack_bf16`-ed for the bf16 dot-product path, and with them ``tied``, an embedding that is also the
    LM head, when its values are bfloat16 ones (it keeps its nominal dtype: lookups give the same values)."""
    blocks, bf16 = table.runs_packed("packed"), table.runs_packed("packed-bf16")
    packer = pack_owned if owned else pack
    for m in model.modules():
        for name, p in m.named_parameters(recurse=False):
            if blocks and isinstance(p, QuantParts) and not p.packed and all(packable(q.blocks) for q in p.parts):
                w = QuantParts([QuantTensor(packer(q.blocks), q.dtype) for q in p.parts], p.dtype)
            elif blocks and quantized(p) and not p.packed and packable(p.blocks):
                w = QuantTensor(packer(p.blocks), p.dtype)
            elif bf16 and isinstance(m, Linear) and name == "weight" and bf16_packable(p):
                w = QuantTensor(pack_bf16(p.detach()), p.dtype)
            else:
                continue
            setattr(m, name, torch.nn.Parameter(w, requires_grad=False))
    if bf16 and tied is not None and not isinstance(tied.weight, QuantTensor) and weight_dtype(model) == torch.bfloat16:
        # the head multiplies by the layers' dtype (LlamaModel.head_weight): one packed table serves both
        w = tied.weight.detach()
        shaped = w.dim() == 2 and w.device.type == "cpu" and w.shape[0] % GROUP == 0 and w.shape[1] % 2 == 0
        packed = pack_bf16_rows(w) if shaped else None
        if packed is not None:
            tied.weight = torch.nn.Parameter(QuantTensor(packed, w.dtype), requires_grad=False)
    onto_huge_pages([q for p in model.parameters() if isinstance(p, (QuantTensor, QuantParts)) and p.packed
                     for q in (p.parts if isinstance(p, QuantParts) else [p])]
                    + ([tied.weight] if tied is not None and isinstance(tied.weight, QuantTensor) else []))


def quantize_linears(model: torch.nn.Module, fmt: str) -> None:
    """Every linear layer's float weight of ``model`` quantized to GGUF ``fmt`` blocks (gguf's quantizer's
    bytes: :func:`peagle.models.quant.quantize`), in place (:func:`pack_model` then packs them): a drafter beside
    a target on the integer path reads a quarter of the bytes of its bf16 weights (Q4_1), and its drafts barely
    move."""
    for m in model.modules():
        w = m.weight if isinstance(m, Linear) else None
        if w is not None and not quantized(w) and not w.is_mkldnn and w.shape[1] % QBLOCK == 0:
            m.weight = torch.nn.Parameter(QuantTensor(quantize(w, fmt).to(w.device), w.dtype), requires_grad=False)
