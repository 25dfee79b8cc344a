"""Training data: the documents ``peagle synth`` wrote, the draft vocabulary, and the target's view
of each document (auxiliary hidden states, final hidden state, greedy next token), computed online
or read from the sharded safetensors ``peagle hidden`` writes."""
from __future__ import annotations

import collections
import hashlib
import json
import os
from dataclasses import dataclass
from collections.abc import Iterator
from itertools import accumulate
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm import tqdm

from peagle.files import written
from peagle.models.attention import AttnMeta, Span
from peagle.models.checkpoint import CheckpointError
from peagle.models.llama import LlamaModel
from peagle.precision import dtype_name
from peagle.train.objective import Doc
from peagle.train.synth import read_responses

HIDDEN_SHARD = "hidden-{:05d}.safetensors"
PREFILL_TOKENS = 4096  # documents share target prefills of about this many tokens (target_views)


@dataclass
class Record:
    """A synthesized document: prompt and response token ids."""

    id: str
    ids: list[int]
    prompt_len: int


def load_records(data_dir: str | os.PathLike, max_len: int) -> list[Record]:
    """Every response in ``data_dir`` (prompt + response, cut to ``max_len`` tokens) with at least
    three response tokens, in the order synthesis wrote them."""
    if not Path(data_dir).is_dir():
        raise FileNotFoundError(f"no training data at {data_dir}: run `peagle synth --out {data_dir}` first")
    out = []
    for r in read_responses(data_dir):
        ids = (r["prompt_token_ids"] + r["response_token_ids"])[:max_len]
        if len(ids) - len(r["prompt_token_ids"]) >= 3:
            out.append(Record(r["id"], ids, len(r["prompt_token_ids"])))
    if not out:
        raise ValueError(f"{data_dir} holds no usable responses")
    return out


def is_eval(record_id: str, fraction: float) -> bool:
    """The held-out slice, chosen by a hash of the id so it stays put as more data is synthesized."""
    return int(hashlib.sha1(record_id.encode()).hexdigest()[:8], 16) < fraction * 2 ** 32


def draft_vocab(records: list[Record], size: int, vocab_size: int) -> torch.Tensor:
    """The ``size`` target ids most frequent in the responses, sorted (EAGLE-3's reduced vocabulary);
    when fewer distinct ids occur, the rest are the lowest unused ids."""
    if not 1 <= size <= vocab_size:
        raise ValueError(f"draft vocabulary size must be in 1..{vocab_size}, got {size}")
    counts = collections.Counter(t for r in records for t in r.ids[r.prompt_len:])
    ids = [t for t, _ in counts.most_common(size)]
    if len(ids) < size:
        used = set(ids)
        ids += [t for t in range(vocab_size) if t not in used][:size - len(ids)]
    return torch.tensor(sorted(ids))


@torch.no_grad()
def target_views(target: LlamaModel, docs: list[list[int]], budget: int = PREFILL_TOKENS,
                 chunk: int = 512) -> Iterator[tuple[torch.Tensor, ...]]:
    """The target's view of each document in turn, on the target's device: (aux hidden states, final normed
    hidden state, greedy next token). Documents share prefills of about ``budget`` tokens, each its own sequence
    (its own KV slots and positions), run as the views are asked for (one prefill's states held at a time): on a
    GPU a prefill is bound by launching its kernels, and one per document made training's online states launch
    ~1,800 kernels a document."""
    dev = target.lm_weight.device
    for group in budget_groups(docs, [len(d) for d in docs], budget):
        lens = [len(d) for d in group]
        starts = [0, *accumulate(lens)]
        meta = AttnMeta([Span(n, n, list(range(s, s + n)), 0) for n, s in zip(lens, starts)], 1)
        pos = torch.cat([torch.arange(n, device=dev) for n in lens])
        ids = torch.tensor([t for d in group for t in d], device=dev)
        final, taps = target.hidden(ids, pos, target.make_caches(starts[-1]), meta)
        argmax = torch.cat([target.logits(final[i:i + chunk]).argmax(-1) for i in range(0, starts[-1], chunk)])
        yield from ((taps[a:b], final[a:b], argmax[a:b]) for a, b in zip(starts, starts[1:]))


def target_view(target: LlamaModel, ids: list[int]) -> tuple[torch.Tensor, ...]:
    """One document's :func:`target_views`."""
    return next(target_views(target, [ids]))


def budget_groups(items: list, lengths: list[int], budget: int) -> list[list]:
    """Consecutive groups of about ``budget`` tokens (a longer item goes alone)."""
    groups, cur, used = [], [], 0
    for item, n in zip(items, lengths):
        if cur and used + n > budget:
            groups.append(cur)
            cur, used = [], 0
        cur.append(item)
        used += n
    return groups + [cur] if cur else groups


def write_hidden(target: LlamaModel, records: list[Record], out_dir: str | os.PathLike, shard_docs: int = 256,
                 progress: bool = True) -> int:
    """``peagle hidden``: the target's view of every record, ``shard_docs`` documents a shard, run
    in the target's own dtype and on its device, stored as bfloat16 (half of float32, and unlike
    float16 it keeps the range of the residual stream's outlier features). Shard i always holds records ``[i*shard_docs, (i+1)*shard_docs)``; a re-run keeps the
    shards that already hold exactly those records (each is written to a temp file and renamed, so
    a kill loses one shard) and redoes the rest, such as a last shard that more synthesis extended."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    shards = [records[i:i + shard_docs] for i in range(0, len(records), shard_docs)]

    def done(i: int) -> bool:
        f = out / HIDDEN_SHARD.format(i)
        if not f.exists():
            return False
        with safe_open(str(f), "pt") as fh:
            return json.loads((fh.metadata() or {}).get("ids", "[]")) == [r.id for r in shards[i]]

    todo = [i for i in range(len(shards)) if not done(i)]
    bar = None
    if progress:
        bar = tqdm(total=len(records), initial=len(records) - sum(len(shards[i]) for i in todo),
                   desc="hidden", unit="doc")
    meta = {"target_hidden_size": str(target.cfg.hidden_size), "aux_layers": json.dumps(list(target.aux_layers)),
            "target_dtype": dtype_name(target.weight_dtype)}
    for i in todo:
        taps, final, argmax = [], [], []
        for t, f, a in target_views(target, [rec.ids for rec in shards[i]]):
            taps.append(t.to("cpu", torch.bfloat16))
            final.append(f.to("cpu", torch.bfloat16))
            argmax.append(a.to("cpu", torch.int32))
            if bar is not None:
                bar.update(1)
        lens = torch.tensor([len(r.ids) for r in shards[i]], device="cpu")
        tensors = {"taps": torch.cat(taps), "final": torch.cat(final), "argmax": torch.cat(argmax),
                   "offsets": torch.cat([torch.zeros(1, dtype=torch.long, device="cpu"), lens.cumsum(0)])}
        with written(out / HIDDEN_SHARD.format(i), durable=True) as tmp:
            save_file(tensors, str(tmp), metadata={**meta, "ids": json.dumps([r.id for r in shards[i]])})
    if bar is not None:
        bar.close()
    return len(todo)


class HiddenSource:
    """The target's view of a record on the target's device, as float32: read from ``peagle hidden``
    shards when ``hidden_dir`` is given, else computed by running ``target`` in-process (online)."""

    def __init__(self, target: LlamaModel, hidden_dir: str | os.PathLike | None = None):
        self.target = target
        self.device = target.lm_weight.device
        self.where: dict[str, tuple[Path, int, int]] = {}
        if hidden_dir is None:
            return
        files = sorted(Path(hidden_dir).glob("hidden-*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no hidden-state shards in {hidden_dir}: run `peagle hidden` first")
        for f in files:
            with safe_open(str(f), "pt") as fh:
                meta = fh.metadata() or {}
                offsets = fh.get_tensor("offsets").tolist()
            if (int(meta.get("target_hidden_size", -1)) != target.cfg.hidden_size
                    or json.loads(meta.get("aux_layers", "null")) != list(target.aux_layers)):
                raise CheckpointError(f"{f} was written for another target (hidden size "
                                      f"{meta.get('target_hidden_size')}, aux layers {meta.get('aux_layers')})")
            for j, rid in enumerate(json.loads(meta["ids"])):
                self.where[rid] = (f, offsets[j], offsets[j + 1])

    def has(self, rec: Record) -> bool:
        """Whether this source can give ``rec``'s hidden states (online: always)."""
        return not self.where or rec.id in self.where

    def docs(self, recs: list[Record]) -> list[Doc]:
        """The records' :class:`Doc` s; online, their target prefills shared (:func:`target_views`)."""
        if not self.where:
            return [Doc(torch.tensor(rec.ids, device=self.device), rec.prompt_len, taps.float(), final.float(), argmax)
                    for rec, (taps, final, argmax) in zip(recs, target_views(self.target, [r.ids for r in recs]))]
        return [self.doc(rec) for rec in recs]

    def doc(self, rec: Record) -> Doc:
        if not self.where:
            return self.docs([rec])[0]
        ids = torch.tensor(rec.ids, device=self.device)
        if rec.id not in self.where:
            raise KeyError(f"record {rec.id} has no hidden states: re-run `peagle hidden` on the same data")
        f, lo, hi = self.where[rec.id]
        if hi - lo != len(rec.ids):
            raise CheckpointError(f"{f}: record {rec.id} has {hi - lo} rows, the data has {len(rec.ids)} tokens")
        with torch.device("cpu"), safe_open(str(f), "pt") as fh:  # read on the CPU, then moved
            rows = [fh.get_slice(name)[lo:hi].to(self.device) for name in ("taps", "final", "argmax")]
        return Doc(ids, rec.prompt_len, rows[0].float(), rows[1].float(), rows[2].long())
