"""The head being trained: a :class:`Drafter` whose embedding table is the target's, frozen, except
the mask token's row, which is learned (docs/design.md, "The drafter"). Initialised from the target where that
helps: its LM-head rows for the draft vocabulary and its final norm."""
from __future__ import annotations

import dataclasses

import torch
from torch import nn

from peagle.models.drafter import Drafter, DrafterConfig
from peagle.models.llama import LlamaModel
from peagle.models.quant import QuantTensor


class TrainHead(Drafter):
    def __init__(self, cfg: DrafterConfig):
        super().__init__(cfg)
        self.embed_tokens.weight.requires_grad_(False)
        self.mask_embedding = nn.Parameter(torch.zeros(cfg.hidden_size))

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        e = self.embed_tokens(ids)
        return torch.where((ids == self.cfg.mask_token_id)[:, None], self.mask_embedding, e)

    @classmethod
    def for_target(cls, target: LlamaModel, num_layers: int, draft_ids: torch.Tensor, mask_token_id: int,
                   trained_k: int, seed: int = 0) -> "TrainHead":
        cfg = DrafterConfig.for_target(target.cfg, num_layers, draft_ids.shape[0], mask_token_id,
                                       target.aux_layers, trained_k)
        head = cls(cfg)
        head.init_weights(seed)
        with torch.no_grad():
            emb = target.model.embed_tokens.weight
            if isinstance(emb, QuantTensor):  # a GGUF target's Q8_0 table: the head starts from its values
                emb = emb.dequantize(head.embed_tokens.weight.dtype)
            head.embed_tokens.weight.copy_(emb)
            head.mask_embedding.copy_(emb[mask_token_id])
            head.lm_head.weight.copy_(target.lm_weight[draft_ids.to(emb.device)])
            head.norm.weight.copy_(target.model.norm.weight)
        head.set_vocab_map(draft_ids)
        return head

    def load_from(self, drafter: Drafter) -> None:
        """Start from a trained head of the same shape: its weights, and its mask row as the learned
        mask embedding (the rest of the embedding stays the target's)."""
        mine, theirs = (dataclasses.replace(c, trained_k=None, extra={}) for c in (self.cfg, drafter.cfg))
        if mine != theirs:
            raise ValueError(f"head mismatch: {theirs} cannot start a head shaped {mine}")
        sd = {k: v for k, v in drafter.state_dict().items() if k != "embed_tokens.weight"}
        missing, unexpected = self.load_state_dict(sd, strict=False)
        if unexpected or set(missing) - {"embed_tokens.weight", "mask_embedding"}:
            raise ValueError(f"head mismatch: missing {missing}, unexpected {unexpected}")
        with torch.no_grad():
            self.mask_embedding.copy_(drafter.embed_tokens.weight[self.cfg.mask_token_id])

    def trainable(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def to_drafter(self, state: dict[str, torch.Tensor] | None = None) -> Drafter:
        """The plain vLLM-format head: the learned mask row written into the embedding table. ``state``:
        this head's whole state dict where its weights are sharded (FSDP)."""
        out = Drafter(self.cfg)
        state = self.state_dict() if state is None else state
        sd = {k: v.detach().clone() for k, v in state.items() if k != "mask_embedding"}
        sd["embed_tokens.weight"][self.cfg.mask_token_id] = state["mask_embedding"].detach()
        out.load_state_dict(sd)
        return out.eval()
