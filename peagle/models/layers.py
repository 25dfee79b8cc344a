"""Building blocks shared by the target models and the drafter.

Everything works on a flat batch of tokens (``[T, ...]``) from many sequences at once, the
layout vLLM uses: a step's metadata (:class:`AttnMeta`) says where each sequence's queries are,
where their keys go in the paged KV cache and which cache slots make up their context.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T (+ bias)``. Weights are stored transposed (``[in, out]`` contiguous, exposed as
    an ``[out, in]`` view so state dicts keep HF names and shapes): on the CPU this was tuned on, torch's
    GEMM ran the few rows of decoding and verification up to 2x faster in that order."""
    out = x @ weight.t()
    return out if bias is None else out + bias


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded: unreadable, corrupt, or not matching its config."""


def configure_cpu_threads() -> None:
    """CPU inference: one torch thread pool over every core (``PEAGLE_TORCH_THREADS`` overrides).
    One pool only: a second one (numpy's OpenBLAS, say) spinning on the same cores slows decoding
    several-fold."""
    torch.set_num_threads(int(os.environ.get("PEAGLE_TORCH_THREADS", 0)) or os.cpu_count() or 1)


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
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


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
        inv_freq, self.attention_scaling = rope_frequencies(head_dim, theta, scaling)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def table(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
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


GROUP_MAX_ROWS = 16     # sequences with at most this many query rows (decoding, verifying) attend in batches
GROUP_MAX_PADDING = 1.25  # ... of sequences whose contexts, padded to the longest, hold at most 25% padding


@dataclass
class DecodeGroup:
    """Sequences with few query rows, padded into one batched attention call per layer (on CPU one
    call per sequence costs more in dispatch than the arithmetic). ``rows[b, j]``: the flat query row
    (padding repeats a row of the same sequence; ``valid`` marks real ones); ``blocks[b, i]``: the KV
    block holding key positions ``i*block_size ...`` (padding: the first block), gathered whole;
    ``masks``: ``[B, rows, keys]`` per window."""

    seqs: list[int]
    rows: torch.Tensor
    valid: torch.Tensor
    blocks: torch.Tensor
    block_size: int
    masks: dict[int | None, torch.Tensor]

    def gather(self, pool: torch.Tensor) -> torch.Tensor:
        """``[B, keys, Hkv, d]`` from a ``[num_slots, Hkv, d]`` pool (block rows are contiguous)."""
        B, nb = self.blocks.shape
        rows = pool.view(-1, self.block_size * pool.shape[1] * pool.shape[2])
        return rows.index_select(0, self.blocks.flatten()).view(B, nb * self.block_size, *pool.shape[1:])


def causal_mask(pos: torch.Tensor, n_ctx: torch.Tensor, length: int, window: int | None) -> torch.Tensor:
    """``[..., rows, length]``: key l is visible to a query at ``pos`` iff l <= pos, l < n_ctx, and
    (with a sliding window) l > pos - window."""
    keys = torch.arange(length)
    m = (keys <= pos[..., None]) & (keys < n_ctx[..., None, None])
    if window:
        m &= keys > pos[..., None] - window
    return m


@dataclass
class AttnMeta:
    """Where one forward's tokens sit in the paged KV cache.

    ``slot_mapping[t]`` is the cache slot token t writes its key/value to (-1: write nothing).
    Sequence i owns query rows ``q_start[i]:q_start[i+1]`` and attends to the cache slots
    ``ctx_slots[i]`` (its whole context in position order, this step's tokens included);
    ``q_pos[i]`` holds the positions of its query rows, which gives the causal mask. Contexts start
    at a block boundary of ``block_size`` slots (the paged cache's layout).
    """

    slot_mapping: torch.Tensor
    q_start: list[int]
    ctx_slots: list[torch.Tensor]
    q_pos: list[torch.Tensor]
    block_size: int = 1
    masks: dict[int | None, list[torch.Tensor | None]] = field(default_factory=dict)
    ctx: list[slice | torch.Tensor] = field(default_factory=list)
    singles: list[int] = field(default_factory=list)
    groups: list[DecodeGroup] = field(default_factory=list)
    write_rows: torch.Tensor | None = None

    def prepare(self, *windows: int | None) -> "AttnMeta":
        """Build what every layer shares, once per forward, for each attention window the layers use
        (None: full causal attention, the default): :class:`DecodeGroup` batches of short sequences
        of similar context length, and for every other sequence its boolean ``[n_q, ctx]`` mask
        (None where plain causal decoding needs none) and its context as a slice where its slots
        are contiguous (a view instead of a gather); then the rows that write KV."""
        windows = windows or (None,)
        n_ctx = [s.shape[0] for s in self.ctx_slots]
        short = sorted((i for i, pos in enumerate(self.q_pos) if pos.shape[0] <= GROUP_MAX_ROWS), key=n_ctx.__getitem__)
        batches, cur = [], []
        for i in short:  # by growing length: a batch ends before padding would pass the bound
            if cur and (len(cur) + 1) * n_ctx[i] > GROUP_MAX_PADDING * (sum(n_ctx[j] for j in cur) + n_ctx[i]):
                batches.append(cur)
                cur = []
            cur.append(i)
        batches = [b for b in batches + [cur] if len(b) > 1]
        self.groups = [self._group(b, windows) for b in batches]
        grouped = {i for b in batches for i in b}
        self.singles = [i for i in range(len(self.q_pos)) if i not in grouped]
        self.masks, self.ctx = {w: [] for w in windows}, []
        for i in self.singles:
            slots, pos = self.ctx_slots[i], self.q_pos[i]
            first, n_ctx = int(slots[0]), slots.shape[0]
            contiguous = int(slots[-1]) - first == n_ctx - 1 and bool((slots.diff() == 1).all())
            self.ctx.append(slice(first, first + n_ctx) if contiguous else slots)
            decoding = pos.shape[0] == 1 and int(pos[0]) == n_ctx - 1
            for w in windows:
                plain = decoding and not (w and n_ctx > w)
                self.masks[w].append(None if plain else causal_mask(pos, torch.tensor(n_ctx), n_ctx, w))
        keep = self.slot_mapping >= 0
        if not bool(keep.all()):
            self.write_rows = keep.nonzero().squeeze(1)
            self.slot_mapping = self.slot_mapping[self.write_rows]
        return self

    def _group(self, seqs: list[int], windows: tuple[int | None, ...]) -> DecodeGroup:
        n_q = torch.tensor([self.q_pos[i].shape[0] for i in seqs])
        n_ctx = torch.tensor([self.ctx_slots[i].shape[0] for i in seqs])
        Q, L = int(n_q.max()), int(n_ctx.max())
        j = torch.minimum(torch.arange(Q)[None, :], n_q[:, None] - 1)              # padding repeats the last row
        rows = torch.tensor([self.q_start[i] for i in seqs])[:, None] + j
        pos = torch.stack([self.q_pos[i][j[b]] for b, i in enumerate(seqs)])
        bs = self.block_size
        nb = -(-L // bs)
        firsts = [self.ctx_slots[i][::bs] // bs for i in seqs]
        blocks = torch.stack([torch.cat([f, f[:1].expand(nb - f.shape[0])]) for f in firsts])
        return DecodeGroup(seqs, rows, torch.arange(Q)[None, :] < n_q[:, None], blocks, bs,
                           {w: causal_mask(pos, n_ctx, nb * bs, w) for w in windows})


class KVCache:
    """One layer's paged key/value pool: ``[num_slots, kv_heads, head_dim]`` each. Zeroed once:
    batched attention reads whole blocks, and a masked key still multiplies its value by a zero
    weight, which never-written memory could turn into NaN (stale values of freed blocks are finite)."""

    def __init__(self, num_slots: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device | str):
        self.k = torch.zeros(num_slots, kv_heads, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)

    def write(self, meta: AttnMeta, k: torch.Tensor, v: torch.Tensor) -> None:
        if meta.write_rows is not None:
            k, v = k[meta.write_rows], v[meta.write_rows]
        self.k[meta.slot_mapping] = k
        self.v[meta.slot_mapping] = v


class DenseKV:
    """Training's stand-in for :class:`KVCache`: one layer's keys and values, kept in the autograd
    graph and extended by each forward, so EAGLE-3's unrolled passes (training-time test) attend to
    what earlier passes computed. The forward's ``meta`` is then a :class:`ChainMask`."""

    def __init__(self):
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k = k if self.k is None else torch.cat([self.k, k])
        self.v = v if self.v is None else torch.cat([self.v, v])
        return self.k, self.v


@dataclass
class ChainMask:
    """Which keys a training query sees, in the shape of P-EAGLE's attention rule: part of the first
    ``n_context`` keys (the depth-0 context; ``context[q, j]``) and at most a few keys of its own
    chain (``chain[q, c]``: a key index, -1 for none). Same result as a dense ``[queries, keys]``
    mask at a fraction of the work: a query never sees another anchor's deeper elements."""

    context: torch.Tensor  # [queries, n_context] bool
    chain: torch.Tensor    # [queries, C] long


def attend_chain(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: ChainMask) -> torch.Tensor:
    """Grouped-query attention under a :class:`ChainMask`: q ``[T, H, d]``, k/v ``[S, Hkv, d]`` ->
    ``[T, H*d]``; one softmax over the context keys and the chain keys together."""
    T, H, d = q.shape
    Hkv = k.shape[1]
    n0 = m.context.shape[1]
    qg = q.view(T, Hkv, H // Hkv, d) * d ** -0.5
    s0 = torch.einsum("thgd,shd->hgts", qg, k[:n0]).masked_fill(~m.context, float("-inf"))
    idx = m.chain.clamp(min=0)
    kc, vc = k[idx], v[idx]                                                      # [T, C, Hkv, d]
    sc = torch.einsum("thgd,tchd->hgtc", qg, kc).masked_fill(m.chain < 0, float("-inf"))
    p = torch.cat([s0, sc], dim=-1).softmax(-1)
    o = torch.einsum("hgts,shd->thgd", p[..., :n0], v[:n0]) + torch.einsum("hgtc,tchd->thgd", p[..., n0:], vc)
    return o.reshape(T, H * d)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
           sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Grouped-query attention: q ``[B, n, H, d]``, k/v ``[B, L, Hkv, d]``, mask ``[B, n, L]`` (True:
    attend; None: all) -> ``[B, n, H*d]``.

    The query heads that share a KV head are folded into the query axis, so SDPA runs its fast
    kernel without repeating K/V (``enable_gqa`` falls back to the slow math path on CPU); a
    single unmasked query (decoding) is two small batched matmuls, cheaper than SDPA's setup.
    Attention sinks (GPT-OSS: a learned logit per head joins every row's softmax denominator, so a
    query may attend to "nothing") are spelled out, as SDPA cannot express them."""
    B, n, H, d = q.shape
    Hkv = k.shape[2]
    g = H // Hkv
    kt, vt = k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3)                          # [B, Hkv, L, d]
    if n == 1 and mask is None and sinks is None:
        scores = torch.matmul(q.view(B, Hkv, g, d) * d ** -0.5, kt.transpose(-1, -2)).softmax(-1)
        return torch.matmul(scores, vt).reshape(B, 1, H * d)
    qt = q.view(B, n, Hkv, g, d).permute(0, 2, 3, 1, 4).reshape(B, Hkv, g * n, d)
    if mask is not None:
        mask = mask[:, None].repeat(1, 1, g, 1)                                     # [B, 1, g*n, L]
    if sinks is None:
        o = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask)
    else:
        scores = torch.matmul(qt * d ** -0.5, kt.transpose(-1, -2))                 # [B, Hkv, g*n, L]
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        sink = sinks.to(scores.dtype).view(1, Hkv, g, 1, 1).expand(B, Hkv, g, n, 1).reshape(B, Hkv, g * n, 1)
        o = torch.matmul(torch.cat([scores, sink], dim=-1).softmax(-1)[..., :-1], vt)
    return o.view(B, Hkv, g, n, d).permute(0, 3, 1, 2, 4).reshape(B, n, H * d)


class Attention(nn.Module):
    """Attention over the paged cache with the options the supported families need: q/k/v bias
    (Qwen2), per-head q/k RMSNorm (Qwen3), a wider input (EAGLE-3's first layer), a sliding window
    (Mistral; GPT-OSS on every other layer) and attention sinks (GPT-OSS). q, k and v are one fused
    projection, as in vLLM (checkpoints keep separate names)."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, *, in_dim: int | None = None,
                 qkv_bias: bool = False, o_bias: bool = False, qk_norm_eps: float | None = None,
                 sliding_window: int | None = None, sinks: bool = False):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.sliding_window = sliding_window or None
        self.qkv_proj = Linear(in_dim or hidden, (heads + 2 * kv_heads) * head_dim, qkv_bias)
        self.o_proj = Linear(heads * head_dim, hidden, o_bias)
        self.q_norm = RMSNorm(head_dim, qk_norm_eps) if qk_norm_eps is not None else None
        self.k_norm = RMSNorm(head_dim, qk_norm_eps) if qk_norm_eps is not None else None
        self.sinks = nn.Parameter(torch.zeros(heads)) if sinks else None

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], cache: KVCache | DenseKV,
                meta: AttnMeta | ChainMask) -> torch.Tensor:
        T = x.shape[0]
        qkv = self.qkv_proj(x).view(T, self.heads + 2 * self.kv_heads, self.head_dim)
        nqk = self.heads + self.kv_heads
        if self.q_norm is not None:
            qk = torch.cat([self.q_norm(qkv[:, :self.heads]), self.k_norm(qkv[:, self.heads:nqk])], dim=1)
        else:
            qk = qkv[:, :nqk]
        qk = apply_rope(qk, rope)
        q, k, v = qk[:, :self.heads], qk[:, self.heads:], qkv[:, nqk:]
        if isinstance(cache, DenseKV):  # training: meta is a ChainMask
            k, v = cache.extend(k, v)
            return self.o_proj(attend_chain(q, k, v, meta))
        cache.write(meta, k, v)
        w = self.sliding_window
        outs = [attend(q[None, meta.q_start[i]:meta.q_start[i + 1]], cache.k[ctx][None], cache.v[ctx][None],
                       None if mask is None else mask[None], self.sinks)[0]
                for i, ctx, mask in zip(meta.singles, meta.ctx, meta.masks[w])]
        if not meta.groups:
            return self.o_proj(outs[0] if len(outs) == 1 else torch.cat(outs, dim=0))
        out = q.new_empty(T, self.heads * self.head_dim)
        for grp in meta.groups:
            o = attend(q[grp.rows], grp.gather(cache.k), grp.gather(cache.v), grp.masks[w], self.sinks)
            out[grp.rows[grp.valid]] = o[grp.valid]
        for i, oi in zip(meta.singles, outs):
            out[meta.q_start[i]:meta.q_start[i + 1]] = oi
        return self.o_proj(out)


class MLP(nn.Module):
    """SwiGLU with gate and up fused into one projection (checkpoints keep separate names)."""

    def __init__(self, hidden: int, inter: int, bias: bool = False):
        super().__init__()
        self.inter = inter
        self.gate_up_proj = Linear(hidden, 2 * inter, bias)
        self.down_proj = Linear(inter, hidden, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        return self.down_proj(F.silu(gate_up[..., :self.inter]) * gate_up[..., self.inter:])


_FUSED = {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
          "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj")}


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


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of a folder's ``*.safetensors`` files (sharded or not), or of one file."""
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    if not files:
        raise CheckpointError(f"no .safetensors weights in {path}")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            tensors.update(load_file(str(f)))
        except (SafetensorError, OSError, ValueError) as e:
            raise CheckpointError(f"corrupt or unreadable safetensors file {f}: {e}") from None
    return tensors


def fuse_checkpoint(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """HF/vLLM checkpoint names -> ours: stack q/k/v into qkv_proj and gate/up into gate_up_proj."""
    out = dict(sd)
    for key in sd:
        for fused, parts in _FUSED.items():
            if f".{parts[0]}." in f".{key}":
                pre, suf = key.split(parts[0])
                names = [pre + p + suf for p in parts]
                if all(n in sd for n in names):
                    out[pre + fused + suf] = torch.cat([sd[n] for n in names], dim=0)
                    for n in names:
                        out.pop(n)
    return out


def split_checkpoint(sd: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """Ours -> checkpoint names (the inverse of :func:`fuse_checkpoint`); sizes come from ``model``."""
    out = dict(sd)
    for name, mod in model.named_modules():
        pre = f"{name}." if name else ""
        if isinstance(mod, Attention):
            q, kv = mod.heads * mod.head_dim, mod.kv_heads * mod.head_dim
            fused, parts, sizes = "self_attn.qkv_proj", _FUSED["self_attn.qkv_proj"], [q, kv, kv]
            pre = pre[: -len("self_attn.")]
        elif isinstance(mod, MLP):
            fused, parts, sizes = "mlp.gate_up_proj", _FUSED["mlp.gate_up_proj"], [mod.inter, mod.inter]
            pre = pre[: -len("mlp.")]
        else:
            continue
        for suf in (".weight", ".bias"):
            key = pre + fused + suf
            if key in out:
                for part, t in zip(parts, out.pop(key).split(sizes, dim=0)):
                    out[pre + part + suf] = t
    return out
