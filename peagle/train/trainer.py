"""``peagle train``: fit a P-EAGLE (or, for comparison, an EAGLE-3) head to a target on the responses
``peagle synth`` wrote, on one process or many (``torchrun --nproc_per_node N``).

A step takes ``batch_size`` documents per process from a seeded per-epoch permutation, packs them
into micro-batches, runs the objective (:mod:`peagle.train.objective`) on each, and divides every
loss by one global count of supervised elements. Many processes are DistributedDataParallel (or,
with ``--parallel fsdp``, FSDP2's ``fully_shard``) over gloo (CPU) or NCCL (GPUs, one each), the
gradients reduced in the last micro-batch's last segment only: once per step. Position sampling is
seeded per document, so N processes reproduce one process with an N-times larger batch.

Matmuls run under autocast in ``--dtype`` (bf16 where the device multiplies it natively); the
head's weights and the optimizer state stay float32.

Checkpoints (weights, optimizer, scheduler, RNG, step) are written atomically every ``save_every``
steps, each fsynced before its rename; ``--resume`` continues exactly from the last one, and refuses
(naming each difference) a run whose settings, data, hidden states or target differ from it. The
output folder is always a vLLM-format head (``config.json`` + ``model.safetensors``), refreshed at
every checkpoint.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import random
import sys
import time
from array import array
from dataclasses import dataclass
from inspect import signature
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from peagle.files import written
from peagle.cpu import configure_cpu
from peagle.models.checkpoint import CheckpointError
from peagle.models.drafter import DRAFT_VOCAB, load_drafter, save_drafter
from peagle.models.layers import Linear
from peagle.models.loader import choose_mask_token, load_target, load_tokenizer, resolve_target, target_gguf
from peagle.precision import DTYPE_CHOICES, autocast_dtype, resolve_device
from peagle.train.data import HiddenSource, Record, budget_groups, draft_vocab, is_eval, load_records
from peagle.train.head import TrainHead
from peagle.train.objective import (LABELS, METHODS, Batch, Objective, Piece, evaluate, num_segments, pieces,
                                    sample_elements)
from peagle.train.target import STORED, load_target_ends, stored_dtype

STATE = "checkpoint/state.pt"
PARALLEL = ("ddp", "fsdp")
LOG = "train_log.jsonl"


@dataclass
class TrainConfig:
    data: str
    out: str
    target: str | None = None
    quantization: str | None = None  # a GGUF target's blocks kept (gguf, its default) or de-quantized (none)
    target_dtype: str = "stored"     # the target's weights as loaded: stored = its checkpoint's own dtype, never widened
    compute: str = "fast"  # a GGUF target's blocks through integer dot products (fast) or float32 (exact)
    load_format: str = "auto"  # dummy: random target weights at its dimensions (memory and speed at any size)
    method: str = "peagle"
    layers: int = 1
    k: int = 8                       # depths trained (P-EAGLE: parallel groups; EAGLE-3: unrolled steps)
    draft_vocab: int = DRAFT_VOCAB
    labels: str = "soft"             # soft: the target's distribution over the draft vocabulary; hard: its greedy token
    mask_token_id: int | None = None  # default: a spare special token of the tokenizer
    hidden: str | None = None        # `peagle hidden` output; None computes the target's states online
    init_from: str | None = None     # a vLLM-format head to start from (its weights; a fresh optimizer)
    epochs: float = 1.0
    max_steps: int | None = None
    batch_size: int = 8              # documents per process per step
    micro_tokens: int = 512          # documents are packed into micro-batches of about this many tokens
    segments: int = 1                # sequence partition (more are used when a micro-batch needs them)
    max_elements: int = 8192         # elements one segment may hold
    lr: float = 5e-4
    min_lr: float = 5e-5
    warmup_steps: int = 50
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    r: float = 0.7                   # position sampling: depth d keeps (n - d) * max(r**d, r_min) anchors
    r_min: float = 0.2
    max_len: int = 2048
    eval_fraction: float = 0.02
    eval_docs: int = 64
    eval_every: int = 100
    save_every: int = 50
    log_every: int = 10
    seed: int = 0
    resume: bool = False
    progress: bool = True
    device: str = "auto"             # auto (CUDA when present), cpu, cuda, cuda:N
    dtype: str = "auto"              # autocast dtype; auto: bfloat16 on CUDA and native-bf16 CPUs, else float32
    deterministic: bool = False      # torch's deterministic kernels (a GPU run then resumes bit for bit)
    parallel: str = "ddp"            # many processes: ddp (each holds the head) or fsdp (FSDP2: each holds a shard)

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"unknown method {self.method!r}; choose one of {', '.join(METHODS)}")
        for name in ("layers", "k", "batch_size", "micro_tokens", "segments", "save_every", "eval_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if not (0 < self.r <= 1 and 0 < self.r_min <= 1):
            raise ValueError("r and r_min must be in (0, 1]")
        if self.labels not in LABELS:
            raise ValueError(f"unknown labels {self.labels!r}; choose one of {', '.join(LABELS)}")
        if self.parallel not in PARALLEL:
            raise ValueError(f"unknown parallel {self.parallel!r}; choose one of {', '.join(PARALLEL)}")
        if self.target_dtype not in (*DTYPE_CHOICES, "stored"):
            raise ValueError(f"unknown target dtype {self.target_dtype!r}; "
                             f"choose stored or one of {', '.join(DTYPE_CHOICES)}")
        if self.dtype not in DTYPE_CHOICES:
            raise ValueError(f"unknown dtype {self.dtype!r}; choose one of {', '.join(DTYPE_CHOICES)}")


# Settings a resumed run must share with the run it continues: each changes which documents a step takes,
# what they are trained towards, or the schedule (epochs set the number of steps the learning rate decays over).
RESUME_KEYS = ("data", "hidden", "target", "quantization", "target_dtype", "load_format", "compute", "method", "layers",
               "k", "draft_vocab", "labels", "mask_token_id", "epochs", "batch_size", "micro_tokens", "segments",
               "max_elements", "r", "r_min", "max_len", "eval_fraction", "seed", "lr", "min_lr", "warmup_steps",
               "weight_decay", "parallel")


def records_fingerprint(records: list[Record]) -> str:
    """The training documents as a short hash: ids, token ids and prompt lengths, in order. The same folder
    name can hold other data (more synthesis, another target's responses, hidden states for fewer records)."""
    h = hashlib.sha256()
    for r in records:
        h.update(f"{r.id}\0{r.prompt_len}\0".encode())
        h.update(array("q", r.ids).tobytes())
    return h.hexdigest()[:16]


def files_fingerprint(files: list[Path], sample: int = 1 << 20) -> str:
    """Files as a short hash of their names, sizes and first and last ``sample`` bytes: a target's weights or
    ``peagle hidden``'s shards rewritten for another model change it (a fine-tune differs in its first
    tensors), cheaply (a few MB of an 8B target's 16 GB) and alike on every node (no modification times)."""
    h = hashlib.sha256()
    for f in sorted(files):
        size = f.stat().st_size
        h.update(f"{f.name}\0{size}\0".encode())
        with open(f, "rb") as fh:
            h.update(fh.read(sample))
            fh.seek(max(0, size - sample))
            h.update(fh.read(sample))
    return h.hexdigest()[:16]


def target_files(name: str | None, path: Path) -> list[Path]:
    """The files that hold a target's weights: its GGUF file (read from there, beside a folder of its
    config and tokenizer alone), else its folder's safetensors and config."""
    gguf = target_gguf(name)
    return [gguf] if gguf is not None else [*path.glob("*.safetensors"), path / "config.json"]


def lr_lambda(cfg: TrainConfig, total_steps: int):
    """Linear warm-up, then cosine decay to ``min_lr``."""
    def f(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        t = min(1.0, (step - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps))
        return (cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * t))) / cfg.lr
    return f


def doc_generator(seed: int, epoch: int, index: int) -> torch.Generator:
    """Position sampling for one document in one epoch: the same whichever process draws it."""
    return torch.Generator(device="cpu").manual_seed((seed * 1_000_003 + epoch) * 10_000_019 + index)


def placement(device: torch.device) -> tuple[torch.device, str]:
    """This process's device and its process group's backend. One GPU per process; more processes than GPUs
    share them round-robin over gloo, as NCCL refuses two ranks on one device (for steps that leave a GPU idle:
    four on one H100 trained the default head 1.04x faster than one)."""
    if device.type != "cuda":
        return device, "gloo"
    if device.index is not None:
        return device, "nccl"
    gpus = torch.cuda.device_count()
    shared = int(os.environ.get("LOCAL_WORLD_SIZE", "1")) > gpus
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % gpus), "gloo" if shared else "nccl"


class Trainer:
    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.device, backend = placement(resolve_device(cfg.device))
        self.dtype = autocast_dtype(cfg.dtype, self.device)
        if cfg.deterministic:  # process-wide, as HF's full_determinism; cuBLAS needs its workspace fixed first
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.use_deterministic_algorithms(True, warn_only=True)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        else:  # every core, shared by the processes on this machine
            configure_cpu()
            torch.set_num_threads(max(1, torch.get_num_threads() // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
        if self.world > 1 and not dist.is_initialized():
            dist.init_process_group(backend)
        self.out = Path(cfg.out)
        target_dtype = cfg.target_dtype
        if target_dtype == STORED:  # random weights have no stored dtype: vLLM's dummy weights take bf16's
            dummy = cfg.load_format == "dummy"
            target_dtype = "bfloat16" if dummy else stored_dtype(cfg.target, cfg.quantization, self.device)
        if cfg.hidden is None:
            self.target, path = load_target(cfg.target, target_dtype, device=self.device, quantization=cfg.quantization,
                                            compute=cfg.compute, load_format=cfg.load_format)
        else:  # the states are on disk: the target's embedding, norm and LM head only
            self.target = load_target_ends(cfg.target, target_dtype, self.device, cfg.quantization)
            path = resolve_target(cfg.target, weights=False)
        self.target.requires_grad_(False)
        records = load_records(cfg.data, cfg.max_len)
        self.source = HiddenSource(self.target, cfg.hidden)
        covered = [r for r in records if self.source.has(r)]
        if not covered:
            raise ValueError(f"none of the {len(records)} documents in {cfg.data} has hidden states in {cfg.hidden}")
        if len(covered) < len(records) and self.rank == 0:
            print(f"peagle: {len(records) - len(covered)} of {len(records)} documents have no hidden states in "
                  f"{cfg.hidden} yet and are left out (run `peagle hidden` again to add them)", file=sys.stderr)
        records = covered
        self.eval_records = [r for r in records if is_eval(r.id, cfg.eval_fraction)][:cfg.eval_docs]
        held = {r.id for r in self.eval_records}
        self.train_records = [r for r in records if r.id not in held]
        self.steps_per_epoch = len(self.train_records) // (self.world * cfg.batch_size)
        if self.steps_per_epoch < 1:
            raise ValueError(f"{len(self.train_records)} training documents are fewer than one step's "
                             f"{self.world * cfg.batch_size} (processes x --batch-size)")
        self.total_steps = cfg.max_steps or max(1, math.ceil(cfg.epochs * self.steps_per_epoch))
        self.fingerprints = {
            "data": records_fingerprint(records),
            "target": files_fingerprint(target_files(cfg.target, Path(path))),
            "hidden": files_fingerprint(list(Path(cfg.hidden).glob("hidden-*.safetensors"))) if cfg.hidden else None}

        state = self._load_state() if cfg.resume else None
        init = None if state is not None or cfg.init_from is None else self._init_head()
        if state is not None:
            draft_ids, mask_id = state["draft_ids"], state["mask_token_id"]
        elif init is not None:
            draft_ids, mask_id = init.draft_vocab_ids(), init.cfg.mask_token_id
        else:
            draft_ids = draft_vocab(self.train_records, cfg.draft_vocab, self.target.cfg.vocab_size)
            mask_id = cfg.mask_token_id if cfg.mask_token_id is not None else choose_mask_token(load_tokenizer(path))
        self.head = TrainHead.for_target(self.target, cfg.layers, draft_ids, mask_id, cfg.k, cfg.seed).to(self.device)
        self.head.cfg.check_target(self.target.cfg, self.target.aux_layers)
        if init is not None:
            self.head.load_from(init.to(self.device))
        if cfg.method == "eagle3":  # EAGLE-3 never reads the mask token or mask_hidden
            self.head.mask_hidden.requires_grad_(False)
            self.head.mask_embedding.requires_grad_(False)
        self.objective = Objective(self.head, cfg.method, cfg.k, self.target.lm_weight[draft_ids.to(self.device)],
                                   self.dtype, cfg.labels)
        self.fsdp = self.world > 1 and cfg.parallel == "fsdp"
        if state is not None:
            self._restore_head(state)
        self.model = self._parallel()
        self.opt = torch.optim.AdamW(self.head.trainable(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_lambda(cfg, self.total_steps))
        self.step, self.tokens, self.elapsed = 0, 0, 0.0
        self.last_eval: dict | None = None
        if state is not None:
            self._restore(state)

    def _parallel(self) -> torch.nn.Module:
        """The objective as the step runs it. Data parallel over processes (gloo on CPU, NCCL on GPUs), the
        gradients averaged in the step's last backward only: DDP, each process holding the whole head; or FSDP2
        (``fully_shard`` on each head layer, then the whole), each holding a shard of every weight and of Adam's
        state, the layers gathered as they run (for heads too big for one device)."""
        if self.world == 1:
            return self.objective
        if self.fsdp:
            from torch.distributed.fsdp import fully_shard

            for m in self.head.modules():  # FSDP shards row-major parameters: Linear's [in, out] order given up
                if isinstance(m, Linear):
                    m.weight.data = m.weight.data.contiguous()
            for layer in [self.head.midlayer, *self.head.layers.values()]:
                fully_shard(layer)
            return fully_shard(self.objective)
        # buffers (vocabulary maps, RoPE) never change, so DDP does not re-broadcast them (the flag's name
        # before torch 2.13 was broadcast_buffers, as GPU images often carry an older torch)
        no_sync = "forward_sync_buffers" if "forward_sync_buffers" in signature(DistributedDataParallel).parameters \
            else "broadcast_buffers"
        return DistributedDataParallel(self.objective, device_ids=[self.device] if self.device.type == "cuda" else None,
                                       **{no_sync: False})

    # ------------------------------------------------------------------ one step
    def _my_docs(self, step: int) -> list[tuple[int, Record]]:
        epoch, i = divmod(step, self.steps_per_epoch)
        gen = torch.Generator(device="cpu").manual_seed(self.cfg.seed * 7919 + epoch)
        perm = torch.randperm(len(self.train_records), generator=gen, device="cpu")
        n = self.world * self.cfg.batch_size
        chosen = perm[i * n:(i + 1) * n].tolist()[self.rank::self.world]
        return [(j, self.train_records[j]) for j in chosen]

    def step_work(self) -> tuple[list[Piece], int, int]:
        """This process's share of the current step: (pieces to run, supervised elements, tokens)."""
        cfg = self.cfg
        epoch = self.step // self.steps_per_epoch
        mine = self._my_docs(self.step)
        work, n_sup, n_tok = [], 0, 0
        for group in budget_groups(mine, [len(r.ids) for _, r in mine], cfg.micro_tokens):
            batch = Batch.pack(self.source.docs([r for _, r in group]))
            gens = [doc_generator(cfg.seed, epoch, j) for j, _ in group] if cfg.method == "peagle" else None
            el = sample_elements(batch, cfg.k, cfg.r, cfg.r_min, gens)
            n_sup += self.objective.count(batch, el)
            n_tok += batch.ids.shape[0]
            work += pieces(batch, el, num_segments(el, cfg.segments, cfg.max_elements), cfg.method)
        return work, n_sup, n_tok

    def train_step(self) -> dict:
        cfg = self.cfg
        work, n_sup, n_tok = self.step_work()
        counts = torch.tensor([n_sup, n_tok], dtype=torch.float64, device=self.device)
        if self.world > 1:
            dist.all_reduce(counts)
        n_sup = max(1.0, float(counts[0]))
        # every loss over the global count; times the world size, as DDP averages over processes
        s = self.objective.run(work, self.world / n_sup, backward=True, model=self.model)
        totals = torch.cat([s.loss[None], s.correct, s.count])
        if self.world > 1:
            dist.all_reduce(totals)
        loss, correct, count = float(totals[0]), totals[1:cfg.k + 1], totals[cfg.k + 1:]
        grad_norm = torch.nn.utils.clip_grad_norm_(self.head.trainable(), cfg.grad_clip)
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        self.step += 1
        self.tokens += int(counts[1])
        return {"step": self.step, "epoch": round(self.step / self.steps_per_epoch, 4), "loss": round(loss / n_sup, 5),
                "acc": [round(a, 4) for a in (correct / count.clamp(min=1)).tolist()],
                "grad_norm": round(float(grad_norm), 4), "lr": self.sched.get_last_lr()[0], "tokens": self.tokens}

    # ------------------------------------------------------------------ loop
    def run(self) -> dict | None:
        cfg = self.cfg
        lead = self.rank == 0
        bar = None
        if lead and cfg.progress:
            bar = tqdm(total=self.total_steps, initial=self.step, desc=f"train {cfg.method}", unit="step")
        self._log({"event": "start", "step": self.step, "total_steps": self.total_steps, "world_size": self.world,
                   "train_docs": len(self.train_records), "eval_docs": len(self.eval_records),
                   "config": dataclasses.asdict(cfg)})
        t0 = time.perf_counter() - self.elapsed
        while self.step < self.total_steps:
            rec = self.train_step()
            self.elapsed = time.perf_counter() - t0
            rec["elapsed_s"] = round(self.elapsed, 1)
            last = self.step == self.total_steps
            if self.step % cfg.log_every == 0 or last:
                self._log(rec)
            if self.step % cfg.eval_every == 0 or last:
                self.evaluate()
            if self.step % cfg.save_every == 0 or last:
                self.save()
            if bar is not None:
                post = {"loss": rec["loss"], "acc0": rec["acc"][0]}
                if self.last_eval:
                    post["eval_AL"] = self.last_eval["al"]
                bar.set_postfix(post)
                bar.update(1)
        if bar is not None:
            bar.close()
        return self.last_eval

    def evaluate(self) -> None:
        if self.eval_records and (self.rank == 0 or self.fsdp):  # under FSDP every process gathers the layers
            self.head.eval()
            res = evaluate(self.objective, self.source.docs(self.eval_records), self.cfg.k,
                           self.cfg.max_elements)
            self.head.train()
            self.last_eval = {"step": self.step, "tokens": self.tokens, **res}
            self._log({"event": "eval", **self.last_eval, "elapsed_s": round(self.elapsed, 1)})

    # ------------------------------------------------------------------ checkpoints
    def save(self) -> None:
        """The vLLM-format head in ``out`` and the training state in ``out/checkpoint``, each atomically."""
        head, optimizer = self._full_state()
        if self.rank == 0:
            save_drafter(self.head.to_drafter(head), self.out)
            state = {
                "step": self.step, "tokens": self.tokens, "elapsed": self.elapsed, "last_eval": self.last_eval,
                "config": dataclasses.asdict(self.cfg), "world_size": self.world, "fingerprints": self.fingerprints,
                "draft_ids": self.head.draft_vocab_ids().cpu(),
                "mask_token_id": self.head.cfg.mask_token_id,
                "head": {k: v for k, v in head.items() if k != "embed_tokens.weight"},
                "optimizer": optimizer, "scheduler": self.sched.state_dict(),
                "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
            }
            path = self.out / STATE
            path.parent.mkdir(parents=True, exist_ok=True)
            with written(path, durable=True) as tmp:
                torch.save(state, tmp)
        if self.world > 1:
            dist.barrier()

    def _full_state(self) -> tuple[dict, dict]:
        """The head's and the optimizer's whole state (under FSDP gathered from every process's shard: each
        process takes part, rank 0 gets them)."""
        if not self.fsdp:
            return self.head.state_dict(), self.opt.state_dict()
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                             get_optimizer_state_dict)
        full = StateDictOptions(full_state_dict=True, cpu_offload=True)
        head = get_model_state_dict(self.head, options=full)
        return head, get_optimizer_state_dict(self.model, self.opt, options=full)

    def _init_head(self):
        """The head ``--init-from`` names, checked against this run's shape."""
        cfg = self.cfg
        init = load_drafter(cfg.init_from, base_embedding=self.target.model.embed_tokens.weight)
        init.cfg.check_target(self.target.cfg, self.target.aux_layers)
        diff = [f"{name} {mine} != the head's {theirs}" for name, mine, theirs in (
            ("--layers", cfg.layers, init.cfg.num_layers), ("--draft-vocab", cfg.draft_vocab, init.cfg.draft_vocab_size),
            ("--mask-token-id", cfg.mask_token_id, init.cfg.mask_token_id)) if mine is not None and mine != theirs]
        if diff:
            raise ValueError(f"--init-from {cfg.init_from} does not fit this run: " + "; ".join(diff))
        return init

    def _load_state(self) -> dict | None:
        """The checkpoint to resume from, refused (naming each setting) where this run differs from it."""
        path = self.out / STATE
        if not path.is_file():
            return None
        try:
            state = torch.load(path, weights_only=True, map_location="cpu")
        except Exception as e:  # noqa: BLE001  (a damaged or foreign file: name it, whatever torch raises)
            raise CheckpointError(f"cannot read the training state {path}: {e}") from None
        old = state["config"]
        # a setting added after the checkpoint was written had its default there
        defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
        was = {k: old.get(k, defaults[k]) for k in RESUME_KEYS}
        diff = [f"{k}: {was[k]!r} -> {getattr(self.cfg, k)!r}" for k in RESUME_KEYS if was[k] != getattr(self.cfg, k)]
        if state["world_size"] != self.world:
            diff.append(f"processes: {state['world_size']} -> {self.world}")
        what = {"data": f"the documents in {self.cfg.data} (those with hidden states, cut to --max-len)",
                "target": f"the target's files ({self.cfg.target or 'the default target'})",
                "hidden": f"the hidden-state shards in {self.cfg.hidden}"}
        old_fp = state.get("fingerprints", {})
        diff += [f"{k}: {what[k]} are not those the checkpoint was trained on" for k in what
                 if k in old_fp and old_fp[k] != self.fingerprints[k] and not any(d.startswith(f"{k}:") for d in diff)]
        if diff:
            raise ValueError(f"--resume with settings that differ from the checkpoint in {path}: " + "; ".join(diff))
        return state

    def _restore_head(self, state: dict) -> None:
        """The checkpoint's head weights, strictly (the embedding table is the target's, never saved), before the head
        is sharded."""
        self.head.load_state_dict({**state["head"], "embed_tokens.weight": self.head.embed_tokens.weight})

    def _restore(self, state: dict) -> None:
        """The rest of the checkpoint: optimizer (sharded again under FSDP), schedule, RNG, counters."""
        if self.fsdp:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
            set_optimizer_state_dict(self.model, self.opt, state["optimizer"],
                                     options=StateDictOptions(full_state_dict=True))
        else:
            self.opt.load_state_dict(state["optimizer"])
        self.sched.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        self.step, self.tokens, self.elapsed = state["step"], state["tokens"], state["elapsed"]
        self.last_eval = state["last_eval"]

    def _log(self, rec: dict) -> None:
        if self.rank == 0:
            self.out.mkdir(parents=True, exist_ok=True)
            with open(self.out / LOG, "a") as f:
                f.write(json.dumps(rec) + "\n")


def train(cfg: TrainConfig) -> dict | None:
    """Train (or resume) and return the last evaluation."""
    trainer = Trainer(cfg)
    try:
        return trainer.run()
    finally:
        if trainer.world > 1 and dist.is_initialized():
            dist.destroy_process_group()
