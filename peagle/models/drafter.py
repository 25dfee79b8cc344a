"""The P-EAGLE / EAGLE-3 draft head and its vLLM checkpoint format (docs/design.md, "The drafter"; docs/vllm.md).

Layer 0 (``midlayer`` on disk) reads ``cat(input_layernorm(embed(tok)), hidden_norm(h))`` where
``h`` is ``fc(three target taps)``, ``fc(mask_hidden)`` in a mask slot, or the head's own
pre-norm output when EAGLE-3 drafts autoregressively. Layers 1..N-1 are plain Llama layers.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from peagle.files import written
from peagle.kernels import table
from peagle.memory import to_device
from peagle.models.attention import Attention, AttnMeta, ChainMask, DenseKV, KVCache
from peagle.models.checkpoint import (check_checkpoint, fuse_checkpoint, read_safetensors,
                                      split_checkpoint)
from peagle.models.layers import MLP, Linear, RMSNorm, Rotary, embedding, linear, parse_rope, set_precision
from peagle.models.llama import (CheckpointError, DecoderLayer, ModelConfig, native_layers, stack_key, stack_weights,
                                 stackable)
from peagle.models.quant import QuantTensor, operand, read_as_is
from peagle.models.speculators import drafter_tensors, read_config, speculators_config, speculators_tensors

ARCHITECTURE = "LlamaForCausalLMEagle3"
ACCEPTED_ARCHITECTURES = (ARCHITECTURE, "Eagle3LlamaForCausalLM")
MASK_ID_KEYS = ("mask_token_id", "pard_token", "ptd_token_id")  # vLLM's lookup order
# The draft vocabulary of peagle's own heads unless told otherwise: `peagle train`'s (the most frequent response
# tokens) and the random head's that drafts where no head ships, so that its pass reads what a trained head's
# would (a 3B target's K=3 round: 1.14-1.15x a plain step against 1.19-1.22x over the whole 49,152 tokens,
# docs/real-sizes.md). EAGLE-3's Llama heads keep 32,000 of 128,256.
DRAFT_VOCAB = 8192


class DrafterMismatchError(ValueError):
    pass


@dataclass
class DrafterConfig:
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
    vocab_size: int
    draft_vocab_size: int
    target_hidden_size: int
    aux_layer_ids: list[int]
    mask_token_id: int | None
    norm_before_residual: bool = False
    attention_bias: bool = False
    trained_k: int | None = None
    extra: dict = field(default_factory=dict)

    @classmethod
    def for_target(cls, target: ModelConfig, num_layers: int, draft_vocab_size: int | None = None,
                   mask_token_id: int | None = None, aux_layer_ids: tuple[int, ...] | None = None,
                   trained_k: int | None = None) -> "DrafterConfig":
        """A head shaped like the target's layers, as EAGLE-3 and the AWS heads are."""
        return cls(
            hidden_size=target.hidden_size, intermediate_size=target.intermediate_size, num_layers=num_layers,
            num_heads=target.num_heads, num_kv_heads=target.num_kv_heads, head_dim=target.head_dim,
            rms_norm_eps=target.rms_norm_eps, rope_theta=target.rope_theta, rope_scaling=target.rope_scaling,
            max_position_embeddings=target.max_position_embeddings, vocab_size=target.vocab_size,
            draft_vocab_size=draft_vocab_size or target.vocab_size, target_hidden_size=target.hidden_size,
            aux_layer_ids=list(aux_layer_ids or target.default_aux_layers()), mask_token_id=mask_token_id,
            trained_k=trained_k)

    @classmethod
    def from_dict(cls, cfg: dict) -> "DrafterConfig":
        archs = cfg.get("architectures") or []
        if not any(a in ACCEPTED_ARCHITECTURES for a in archs):
            raise CheckpointError(f"not an EAGLE-3 head: architectures {archs} (expected one of {ACCEPTED_ARCHITECTURES})")
        eagle = cfg.get("eagle_config") or {}
        if not eagle.get("use_aux_hidden_state", True):
            raise CheckpointError("eagle_config.use_aux_hidden_state=false (EAGLE-1 style heads) is not supported")
        aux = cfg.get("eagle_aux_hidden_state_layer_ids") or eagle.get("eagle_aux_hidden_state_layer_ids")
        theta, rope = parse_rope(cfg)
        heads = cfg["num_attention_heads"]
        mask_id = next((cfg[k] for k in MASK_ID_KEYS if cfg.get(k) is not None), None)
        known = {"architectures", "eagle_config", "eagle_aux_hidden_state_layer_ids", "rope_parameters",
                 "rope_scaling", "rope_theta", "num_attention_heads", *MASK_ID_KEYS, "hidden_size",
                 "intermediate_size", "num_hidden_layers", "num_key_value_heads", "head_dim", "rms_norm_eps",
                 "max_position_embeddings", "vocab_size", "draft_vocab_size", "target_hidden_size",
                 "norm_before_residual", "attention_bias", "peagle"}
        return cls(
            hidden_size=cfg["hidden_size"], intermediate_size=cfg["intermediate_size"],
            num_layers=cfg.get("num_hidden_layers", 1), num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6), rope_theta=theta, rope_scaling=rope,
            max_position_embeddings=cfg.get("max_position_embeddings", 4096), vocab_size=cfg["vocab_size"],
            draft_vocab_size=cfg.get("draft_vocab_size") or cfg["vocab_size"],
            target_hidden_size=cfg.get("target_hidden_size") or cfg["hidden_size"],
            aux_layer_ids=list(aux) if aux else [], mask_token_id=mask_id,
            norm_before_residual=bool(cfg.get("norm_before_residual", False)),
            attention_bias=bool(cfg.get("attention_bias", False)),
            trained_k=(cfg.get("peagle") or {}).get("trained_k"),
            extra={k: v for k, v in cfg.items() if k not in known})

    def to_dict(self) -> dict:
        """config.json in the layout vLLM's ``LlamaForCausalLMEagle3`` loader reads."""
        cfg = {
            "architectures": [ARCHITECTURE], "model_type": "llama",
            "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers, "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads, "head_dim": self.head_dim, "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps, "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling, "max_position_embeddings": self.max_position_embeddings,
            "vocab_size": self.vocab_size, "draft_vocab_size": self.draft_vocab_size,
            "target_hidden_size": self.target_hidden_size, "tie_word_embeddings": False,
            "eagle_aux_hidden_state_layer_ids": list(self.aux_layer_ids),
            "eagle_config": {"use_aux_hidden_state": True,
                             "eagle_aux_hidden_state_layer_ids": list(self.aux_layer_ids)},
            "norm_before_residual": self.norm_before_residual, "attention_bias": self.attention_bias,
            "torch_dtype": "float32",
        }
        if self.mask_token_id is not None:  # vLLM takes a key that is present but null as the id
            cfg["mask_token_id"] = cfg["ptd_token_id"] = self.mask_token_id
        if self.trained_k is not None:
            cfg["peagle"] = {"trained_k": self.trained_k}
        return {**self.extra, **cfg}

    def check_target(self, target: ModelConfig, aux_layers: tuple[int, ...]) -> None:
        """Refuse a head that does not fit the target, naming every mismatch."""
        problems = []
        if self.target_hidden_size != target.hidden_size:
            problems.append(f"target_hidden_size {self.target_hidden_size} != target hidden_size {target.hidden_size}")
        if self.vocab_size != target.vocab_size:
            problems.append(f"vocab_size {self.vocab_size} != target vocab_size {target.vocab_size}")
        if self.aux_layer_ids and tuple(self.aux_layer_ids) != tuple(aux_layers):
            problems.append(f"eagle_aux_hidden_state_layer_ids {self.aux_layer_ids} != target taps {list(aux_layers)}")
        if self.mask_token_id is None:
            problems.append("no mask token id (mask_token_id / ptd_token_id) in the head's config")
        elif not 0 <= self.mask_token_id < self.vocab_size:
            problems.append(f"mask token id {self.mask_token_id} outside the vocabulary 0..{self.vocab_size - 1}")
        elif self.mask_token_id in target.eos_token_ids:
            problems.append(f"mask token id {self.mask_token_id} is the target's EOS token")
        if problems:
            raise DrafterMismatchError("drafter does not match the target: " + "; ".join(problems))


class FirstLayer(nn.Module):
    """EAGLE-3's layer 0: attention over [normed embedding, normed hidden] (width 2H)."""

    def __init__(self, c: DrafterConfig):
        super().__init__()
        H = c.hidden_size
        self.self_attn = Attention(H, c.num_heads, c.num_kv_heads, c.head_dim, in_dim=2 * H,
                                   qkv_bias=c.attention_bias, o_bias=c.attention_bias)
        self.mlp = MLP(H, c.intermediate_size)
        self.input_layernorm = RMSNorm(H, c.rms_norm_eps)
        self.hidden_norm = RMSNorm(H, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(H, c.rms_norm_eps)
        self.norm_before_residual = c.norm_before_residual

    def inputs(self, emb: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the attention's input [normed embedding, normed hidden], the residual)."""
        normed = self.hidden_norm(hidden)
        return torch.cat([self.input_layernorm(emb), normed], dim=-1), normed if self.norm_before_residual else hidden

    def forward(self, emb, hidden, rope, cache, meta, keep: torch.Tensor | None = None):
        """``keep``: as :meth:`DecoderLayer.forward`'s."""
        x, residual = self.inputs(emb, hidden)
        attended = self.self_attn(x, rope, cache, meta)
        if keep is not None:
            attended, residual = attended[keep], residual[keep]
        h = residual + attended
        return h + self.mlp(self.post_attention_layernorm(h))


class Drafter(nn.Module):
    """State-dict names are exactly the vLLM checkpoint's (``midlayer.*``, ``layers.1.*``, ``d2t`` ...)."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.cfg = cfg
        H = cfg.hidden_size
        self.embed_tokens = embedding(cfg.vocab_size, H)
        self.fc = Linear(3 * cfg.target_hidden_size, H)
        self.mask_hidden = nn.Parameter(torch.zeros(1, 1, 3 * cfg.target_hidden_size))
        self.midlayer = FirstLayer(cfg)
        self.layers = nn.ModuleDict({
            str(i): DecoderLayer(H, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                                 cfg.rms_norm_eps, qkv_bias=cfg.attention_bias, o_bias=cfg.attention_bias)
            for i in range(1, cfg.num_layers)})
        self.norm = RMSNorm(H, cfg.rms_norm_eps)
        self.lm_head = Linear(H, cfg.draft_vocab_size)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(cfg.vocab_size, dtype=torch.bool)
                             if cfg.draft_vocab_size == cfg.vocab_size else torch.zeros(cfg.vocab_size, dtype=torch.bool))
        self.rotary = Rotary(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)

    def make_caches(self, num_slots: int, dtype: torch.dtype | None = None) -> list[KVCache]:
        p = self.embed_tokens.weight
        return [KVCache(num_slots, self.cfg.num_kv_heads, self.cfg.head_dim, dtype or p.dtype, p.device)
                for _ in range(self.cfg.num_layers)]

    def project(self, taps: torch.Tensor) -> torch.Tensor:
        """Target taps ``[T, 3*H_target]`` -> the head's width (``fc``)."""
        return self.fc(taps)

    def mask_feature(self) -> torch.Tensor:
        """``fc(mask_hidden)``: the stand-in feature of every mask slot, shape ``[H]``."""
        return self.fc(self.mask_hidden.reshape(1, -1))[0]

    def forward(self, ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                caches: list[KVCache] | list[DenseKV], meta: AttnMeta | ChainMask,
                keep: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``hidden`` is already at the head's width. Returns (normed, pre-norm) hidden states:
        the first feeds :meth:`logits`, the second is what EAGLE-3 feeds back; of the rows ``keep`` alone where
        given (the drafted rows: the others, the context it catches up on, need only their KV, and the last
        layer stops there for them). With :class:`DenseKV` caches (training), ``meta`` is a :class:`ChainMask`."""
        if isinstance(meta, AttnMeta):   # (a long catch-up through peagle's attention, as the target's prompts)
            c = self.cfg
            meta = meta.for_layers(positions, caches, hidden, c.head_dim, c.num_heads // c.num_kv_heads)
        rope = self.rotary.table(positions, hidden.dtype)
        if self.stacks(hidden, caches, meta):
            return self.native_stack(ids, hidden, rope, caches, meta, keep)
        last = self.cfg.num_layers - 1
        x = self.midlayer(self.embed(ids), hidden, rope, caches[0], meta, keep if last == 0 else None)
        for i in range(1, self.cfg.num_layers):
            x = self.layers[str(i)](x, rope, caches[i], meta, keep if i == last else None)
        return self.norm(x), x

    def stacks(self, hidden: torch.Tensor, caches: list, meta) -> bool:
        """Whether :meth:`native_stack` runs this pass (as the target's ``stacks``: peagle's CPU kernels, rows
        the attention kernel takes whole)."""
        c = self.cfg
        return table.pick("decoder_layers", hidden, caches, meta, c.head_dim, c.num_heads // c.num_kv_heads,
                            lambda: self._stack() is not None).native

    def _stack(self) -> list | None:
        """The layers' weights as ``peagle::decoder_layers`` takes them, None where they do not stack (or
        where a weight is not in the memory order peagle's linear reads); listed again when the weights are
        replaced (loaded, cast)."""
        layers = [self.midlayer, *self.layers.values()]
        if getattr(self, "_stack_key", None) != stack_key(layers):
            weights = stack_weights(layers)
            plain = all(w.is_contiguous() and not w.is_mkldnn for w in weights if w is not None)
            self._stack_weights = weights if stackable(layers) and plain else None
            self._stack_key = stack_key(layers)
        return self._stack_weights

    def native_stack(self, ids: torch.Tensor, hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                     caches: list[KVCache], meta: AttnMeta, keep: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """The layers in one call (:func:`native_layers`, the weights :meth:`stacks` just listed), layer 0's
        input made as :class:`FirstLayer` makes it: the same kernels in the same order as :meth:`forward`'s
        layers, without a drafting pass's ~15 Python and dispatcher round trips a layer."""
        c = self.cfg
        first, residual = self.midlayer.inputs(self.embed(ids), hidden)
        x, _ = native_layers(residual, self._stack_weights, rope, caches, meta, [0] * c.num_layers, c.num_heads,
                             c.head_dim, self.midlayer.self_attn.scale, c.rms_norm_eps, [], first, keep)
        return self.norm(x), x

    def fuses(self, taps: torch.Tensor, caches: list, longest: int) -> bool:
        """Whether :meth:`draft` runs a P-EAGLE drafting pass whose longest sequence feeds ``longest`` rows:
        peagle's CPU kernels take every op (:meth:`stacks`' conditions, spans the attention kernel takes whole,
        weights it reads as they are), and the pass is this class's own (a subclass's forward or logits runs
        the steps one by one)."""
        c = self.cfg
        return table.pick("draft", taps, caches, longest, c.head_dim, c.num_heads // c.num_kv_heads,
                            self._drafts_natively).native

    def _drafts_natively(self) -> bool:
        """:meth:`fuses`' conditions on the drafter itself: its own pass, stackable layers, an embedding and
        weights peagle's kernels read as they are."""
        e = self.embed_tokens.weight
        return (type(self).forward is Drafter.forward and type(self).logits is Drafter.logits
                and self._stack() is not None and e.dtype == torch.float32 and e.is_contiguous()
                and not isinstance(e, QuantTensor) and read_as_is(self.fc.weight) and read_as_is(self.lm_head.weight))

    def draft(self, ids: torch.Tensor, positions: torch.Tensor, cu: list[int], num_valid: torch.Tensor,
              bonus: torch.Tensor, taps: torch.Tensor, num_masks: int, spans: list, caches: list[KVCache],
              mask_feature: torch.Tensor, block_size: int) -> torch.Tensor:
        """P-EAGLE's drafts ``[B, num_masks + 1]`` (target ids) of the verified batch in one native call
        (``peagle::draft``, where :meth:`fuses`): the expansion, ``fc``, the layers, the final norm, the LM head
        and the argmax, the same operators in the same order as ``ModelRunner.propose`` runs them one by one."""
        c, dev = self.cfg, taps.device
        nb = max(len(s.block_table) for s in spans)
        table = to_device([s.block_table + [0] * (nb - len(s.block_table)) for s in spans], dev)
        cos, sin = self.rotary.rows(max(s.ctx_len for s in spans) + num_masks, taps.dtype)
        first = self.midlayer
        return torch.ops.peagle.draft(
            ids, positions, to_device(cu, dev), num_valid, bonus, taps.contiguous(), num_masks, c.mask_token_id,
            operand(self.fc.weight), self.fc.bias, mask_feature, self.embed_tokens.weight, first.input_layernorm.weight,
            first.hidden_norm.weight, first.norm_before_residual, self._stack(), cos.view(len(cos), -1),
            sin.view(len(sin), -1), [k.k for k in caches], [k.v for k in caches], table, block_size,
            caches[0].num_slots, c.num_heads, c.head_dim, first.self_attn.scale, c.rms_norm_eps, self.norm.weight,
            operand(self.lm_head.weight), self.d2t)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(ids)

    def logits(self, normed: torch.Tensor) -> torch.Tensor:
        return linear(normed, self.lm_head.weight)

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    def draft_vocab_ids(self) -> torch.Tensor:
        """The target id of every draft-vocabulary entry, in order, on the head's device."""
        return torch.arange(self.cfg.draft_vocab_size, device=self.d2t.device) + self.d2t

    def init_weights(self, seed: int = 0, std: float = 0.02) -> None:
        """Random init for a fresh head: normal(0, std) everywhere but unit norms. ``mask_hidden`` gets
        the same small scale: it enters the mask slots' residual stream as ``fc(mask_hidden)``, and a
        large constant there drowns what their attention reads, so every depth predicts one token."""
        g = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            with torch.no_grad():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                else:
                    p.copy_(torch.randn(p.shape, generator=g) * std)

    def set_vocab_map(self, draft_to_target: torch.Tensor) -> None:
        """Set ``d2t`` (offsets) and ``t2d`` from the sorted target ids of the draft vocabulary."""
        draft_to_target = draft_to_target.long()
        self.d2t.copy_(draft_to_target - torch.arange(len(draft_to_target)))
        self.t2d.zero_()
        self.t2d[draft_to_target] = True


# ----------------------------------------------------------------------------- checkpoint I/O

def _param_name(disk: str) -> str:
    """Checkpoint name -> our parameter name (identical except optional ``model.`` prefixes)."""
    return disk[len("model."):] if disk.startswith("model.") else disk


EMBED_ROWS = ("embed_tokens.rows", "embed_tokens.row_weights")  # the compact form's embedding rows


def head_tensors(drafter: Drafter, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The head's checkpoint tensors (vLLM names, q/k/v and gate/up apart), floating point ones in ``dtype``."""
    tensors = {}
    for name, t in split_checkpoint(drafter.state_dict(), drafter).items():
        t = t.detach().cpu()
        tensors[name] = (t.to(dtype) if t.is_floating_point() else t).contiguous()
    return tensors


def write_head(out_dir: str | os.PathLike, tensors: dict[str, torch.Tensor], cfg: dict) -> None:
    """``model.safetensors`` and ``config.json`` in ``out_dir``, each through a temp file of this process's own
    renamed durably: processes writing the same cached head at once (two servers starting, the suite's workers)
    each rename a whole file."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with written(out / "model.safetensors", durable=True) as tmp:
        save_file(tensors, str(tmp), metadata={"format": "pt"})
    with written(out / "config.json", durable=True) as tmp:
        tmp.write_text(json.dumps(cfg, indent=2) + "\n")


def save_drafter(drafter: Drafter, out_dir: str | os.PathLike, dtype: torch.dtype = torch.float32,
                 base_embedding: torch.Tensor | None = None) -> None:
    """Write ``config.json`` + ``model.safetensors`` atomically (temp files, then rename).

    With ``base_embedding`` (the target's), the compact form: ``embed_tokens.weight`` is left out
    and only the rows that differ from the target's are kept (``embed_tokens.rows`` and
    ``embed_tokens.row_weights``; for a P-EAGLE head, the learned mask-token row). :func:`load_drafter`
    rebuilds the table; vLLM needs the complete layout, which ``peagle export`` writes."""
    tensors = head_tensors(drafter, dtype)
    if base_embedding is not None:
        emb = tensors.pop("embed_tokens.weight")
        rows = (emb != base_embedding.detach().cpu().to(dtype)).any(1).nonzero().squeeze(1)
        tensors[EMBED_ROWS[0]], tensors[EMBED_ROWS[1]] = rows, emb[rows].contiguous()
    cfg = drafter.cfg.to_dict()
    cfg["torch_dtype"] = str(dtype).removeprefix("torch.")
    write_head(out_dir, tensors, cfg)


def save_speculators(drafter: Drafter, out_dir: str | os.PathLike, kind: str, k: int, verifier: str,
                     verifier_architectures: list[str], dtype: torch.dtype = torch.bfloat16) -> None:
    """Write the head in the speculators format (:mod:`peagle.models.speculators`) as a ``kind`` head
    ("peagle" or "eagle3") for K = ``k``, trained for the target ``verifier``."""
    cfg = speculators_config(drafter.cfg, kind, k, verifier, verifier_architectures, dtype)
    write_head(out_dir, speculators_tensors(head_tensors(drafter, dtype), kind), cfg)


def load_drafter(path: str | os.PathLike, dtype: torch.dtype = torch.float32,
                 base_embedding: torch.Tensor | None = None, device: torch.device | str = "cpu",
                 linear_dtype: torch.dtype | None = None) -> Drafter:
    """Load a vLLM-format or speculators-format head in ``dtype``, its linear layers' weights in ``linear_dtype`` if given (the
    target's, :func:`peagle.models.layers.set_precision`). Tensors the head leaves out are handled as vLLM does:
    ``embed_tokens`` falls back to ``base_embedding`` (the target's), ``d2t``/``t2d`` to identity
    when the draft vocabulary is the full one."""
    path = Path(path)
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise CheckpointError(f"{path} has no config.json: not a drafter checkpoint")
    try:
        raw, speculators = read_config(cfg_file.read_text())
        cfg = DrafterConfig.from_dict(raw)
    except (json.JSONDecodeError, KeyError) as e:
        raise CheckpointError(f"bad drafter config.json in {path}: {e!r}") from None
    tensors = {_param_name(k): v for k, v in read_safetensors(path).items()}
    drafter = Drafter(cfg)
    if speculators:  # layer 0's name; an EAGLE-3 head has no mask_hidden (never read by EAGLE-3 drafting)
        tensors = drafter_tensors(tensors)
        tensors.setdefault("mask_hidden", torch.zeros_like(drafter.mask_hidden))
    if "embed_tokens.weight" not in tensors:
        if base_embedding is None:
            raise CheckpointError(f"{path} has no embed_tokens.weight and no target embedding was given")
        emb = base_embedding.detach().to("cpu", copy=True)
        if EMBED_ROWS[0] in tensors:  # the compact form: the rows the head trained
            rows, weights = tensors.pop(EMBED_ROWS[0]), tensors.pop(EMBED_ROWS[1])
            if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= emb.shape[0] or weights.shape != (rows.numel(), emb.shape[1])):
                raise CheckpointError(f"{path}: embed_tokens.rows/row_weights do not fit a {tuple(emb.shape)} embedding")
            emb[rows] = weights.to(emb.dtype)
        tensors["embed_tokens.weight"] = emb
    if "d2t" not in tensors or "t2d" not in tensors:
        if cfg.draft_vocab_size != cfg.vocab_size:
            raise CheckpointError(f"{path}: draft_vocab_size {cfg.draft_vocab_size} < vocab_size but d2t/t2d are missing")
        tensors.setdefault("d2t", torch.zeros(cfg.vocab_size, dtype=torch.long))
        tensors.setdefault("t2d", torch.ones(cfg.vocab_size, dtype=torch.bool))
    mh = tensors.get("mask_hidden")
    if mh is not None and mh.numel() == drafter.mask_hidden.numel():
        tensors["mask_hidden"] = mh.reshape(drafter.mask_hidden.shape)
    try:
        check_checkpoint(tensors, drafter)
    except CheckpointError as e:
        raise CheckpointError(f"{path}: {e}") from None
    tensors = fuse_checkpoint(tensors)
    own = drafter.state_dict()
    if tensors["t2d"].dtype != torch.bool:
        tensors["t2d"] = tensors["t2d"].bool()
    # assigned, not copied into the head's own tensors: its embedding (the target's, de-quantized) is not held twice
    drafter.load_state_dict({k: v.to(own[k].dtype) for k, v in tensors.items()}, assign=True)
    drafter.to(device=device, dtype=dtype)
    set_precision(drafter, linear_dtype or dtype, dtype)
    target_ids = drafter.draft_vocab_ids()
    if int(target_ids.min()) < 0 or int(target_ids.max()) >= cfg.vocab_size:
        raise CheckpointError(f"{path}: d2t maps draft ids outside the target vocabulary")
    return drafter.eval()
