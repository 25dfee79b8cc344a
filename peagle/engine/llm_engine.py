"""The engine: continuous batching over a paged KV cache, with speculative decoding, in three rooms.

* :mod:`peagle.engine.scheduler`: what runs each step (queues, KV blocks, admission, preemption, the drafts'
  shape) and what becomes of it (tokens emitted, drafts kept, finished requests released);
* :mod:`peagle.engine.model_runner`: how it runs on the device (the caches, the batch's layout, the target
  pass, verification, the token trees' KV, drafting; CUDA graphs);
* this module: the loop over them, and the requests' way in.
"""
from __future__ import annotations

import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable

import torch
from tqdm import tqdm

from peagle import kernels
from peagle.kernels import table
from peagle.cpu import configure_cpu
from peagle.engine.auto_k import AutoK
from peagle.engine.block_manager import BlockManager
from peagle.engine.config import Bounds, EngineConfig
from peagle.engine.costs import pass_costs
from peagle.engine.detokenizer import Detokenizer
from peagle.engine.grammar import Grammars
from peagle.engine.lookup import RESPONSES_FILE, ResponseLookup
from peagle.engine.graphs import StepGraphs
from peagle.engine.model_runner import ModelRunner
from peagle.engine.sampling import SamplingParams
from peagle.engine.scheduler import Scheduler, StepResult
from peagle.engine.sequence import RequestOutput, Sequence, SpecStats
from peagle.engine.tree import Tree
from peagle.models.drafter import Drafter
from peagle.models.llama import LlamaModel
from peagle.models.loader import (ModelNotFoundError, cache_dir, default_drafter_path, dummy_target, load_drafter_for,
                                  load_target, load_tokenizer, resolve_target)
from peagle.models.quant import formats
from peagle.prompts import encode
from peagle.request_checks import RequestError, check_prompt


class LLMEngine:
    def __init__(self, target: LlamaModel, drafter: Drafter | None, config: EngineConfig, tokenizer=None,
                 eos_token_ids: Iterable[int] | None = None, responses: ResponseLookup | None = None):
        self.target, self.drafter, self.cfg, self.tokenizer = target, drafter, config, tokenizer
        self.device, self.dtype, self.weight_dtype = target.lm_weight.device, target.dtype, target.weight_dtype
        if self.device.type == "cpu":
            configure_cpu()
        self.bounds = b = Bounds.of(config, drafter.cfg.trained_k if drafter is not None else None,
                                    target.cfg.max_position_embeddings)
        slots = config.kv_cache_tokens or max(min(config.max_num_seqs * b.max_positions, 16384), b.max_positions)
        blocks = BlockManager(-(-slots // config.block_size), config.block_size, config.enable_prefix_caching)
        eos = set(eos_token_ids or []) | set(target.cfg.eos_token_ids)
        if tokenizer is not None and tokenizer.eos_token_id is not None:
            eos.add(tokenizer.eos_token_id)
        self.runner = ModelRunner(target, drafter, config, b, blocks.num_blocks, eos)
        auto = AutoK(b.k_max, config.method == "parallel", *pass_costs(self.runner, cache_dir() / "costs.json"),
                     ranks=b.ranks, warmup=6,
                     budget=config.speculative_tree_budget if b.token_tree == "auto" else None) if config.priced else None
        self.scheduler = Scheduler(config, b, blocks, eos, auto, responses)
        self._grammars: Grammars | None = None   # made for the first structured output

    @torch.inference_mode()
    def step(self) -> StepResult:
        """Schedule, run on the device (one target pass, verification, drafting; one host sync), take the
        tokens in."""
        t0 = time.perf_counter()
        work = self.scheduler.schedule()
        if not work:
            return StepResult()
        tree = self.scheduler.next_tree(work)
        result = self.scheduler.postprocess(work, self.runner.run(work, tree), tree)
        self.scheduler.observe(work, tree, time.perf_counter() - t0)
        return result

    # ------------------------------------------------------------------ what the server and the CLI read
    @property
    def running(self) -> list[Sequence]:
        return self.scheduler.running

    @property
    def waiting(self) -> deque[Sequence]:
        return self.scheduler.waiting

    @property
    def blocks(self) -> BlockManager:
        return self.scheduler.blocks

    @property
    def stats(self) -> SpecStats:
        """Speculation counters over every request so far."""
        return self.scheduler.stats

    @property
    def eos_token_ids(self) -> set[int]:
        return self.scheduler.eos_token_ids

    @property
    def graphs(self) -> StepGraphs | None:
        """The CUDA graphs of decode steps (None: every step runs eagerly)."""
        return self.runner.graphs

    @property
    def max_model_len(self) -> int:
        return self.bounds.max_model_len

    @property
    def token_tree(self) -> str | Tree:
        """``chain``, ``auto`` or the explicit tree the drafts form."""
        return self.bounds.token_tree

    @property
    def kernels(self) -> str:
        """The linear layers' kernels: ``avx512``/``avx2``/``scalar`` (peagle's CPU kernels), ``torch``."""
        return kernels.isa() if table.on_device(self.device) else "torch"

    @property
    def kv_dtype(self) -> torch.dtype:
        """What the KV cache stores (:func:`peagle.engine.model_runner.kv_cache_dtype`)."""
        return self.runner.kv_dtype

    @property
    def quantization(self) -> str:
        """``gguf`` where the target's weights run GGUF-quantized (:mod:`peagle.models.quant`), else ``none``."""
        return "gguf" if formats(self.target) else "none"

    @property
    def precision(self) -> str:
        """What runs, as the CLI and the server's start line say it, e.g. ``float16 weights, float32 compute``
        or ``GGUF Q4_1/Q8_0 weights, float32 compute``."""
        return self.target.precision

    # ------------------------------------------------------------------ requests
    @classmethod
    def from_pretrained(cls, target: str | None = None, drafter: str | None = None, method: str = "parallel",
                        k: int = 7, dtype: str | torch.dtype = "auto", device: str | torch.device = "auto",
                        quantization: str | None = None, compute: str = "fast", load_format: str = "auto",
                        **engine_kwargs) -> "LLMEngine":
        """Load a target (HF folder, GGUF, hub id; None = the default model), its tokenizer and a head,
        on ``device``, the weights in ``dtype`` (see :mod:`peagle.precision`: ``auto`` is CUDA when present,
        bf16 there, bf16 weights with float32 arithmetic on the CPU), a GGUF target's quantized matrices
        kept as they ship unless ``quantization`` is ``none``, run through integer dot products unless ``compute``
        is ``exact`` (:func:`peagle.models.loader.load_target`), and the response lookup table its config names."""
        config = EngineConfig(method=method, num_speculative_tokens=k, **engine_kwargs)
        folder = dummy_target(target) if load_format == "dummy" else resolve_target(target, weights=False)
        # the tokenizer (importing transformers, parsing its files: ~1 s) is read beside the weights, whose load
        # is mostly native code without the GIL (mapping, checking, packing)
        with ThreadPoolExecutor(1, thread_name_prefix="peagle-tokenizer") as pool:
            tokenizer = pool.submit(load_tokenizer, folder)
            model, path = load_target(target, dtype, device=device, quantization=quantization, compute=compute,
                                      load_format=load_format)
            tokenizer = tokenizer.result()
        head = load_drafter_for(model, path, drafter, tokenizer, method) if config.uses_head else None
        responses = load_response_lookup(config, path, drafter, model.cfg.vocab_size)
        return cls(model, head, config, tokenizer, responses=responses)

    def encode_prompt(self, prompt: str | list[dict], chat: bool = True) -> list[int]:
        """Token ids of ``prompt`` (a user message, or a list of chat messages), wrapped in the chat
        template when ``chat`` (and the model has one)."""
        msgs = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        return encode(self.tokenizer, msgs, chat)

    def add_request(self, prompt_ids: list[int], params: SamplingParams | None = None,
                    request_id: str | None = None) -> Sequence:
        params, b = params or SamplingParams(), self.bounds
        check_prompt(prompt_ids, self.target.cfg.vocab_size, b.max_model_len)  # the server's checks, its words
        # the most KV positions it can need (Scheduler.positions_needed); admitted, it always fits alone
        need = min(len(prompt_ids) + params.max_tokens + max(b.k_max, b.max_nodes), b.max_positions)
        if -(-need // self.cfg.block_size) > self.blocks.num_blocks:
            raise RequestError(f"the prompt ({len(prompt_ids)} tokens) with max_tokens {params.max_tokens} needs "
                               f"{need} KV positions, more than the {self.blocks.num_blocks * self.cfg.block_size} "
                               "the KV cache holds")
        seq = Sequence(prompt_ids, params, request_id)
        seq.detok = Detokenizer(self.tokenizer, params.stop) if self.tokenizer is not None else None
        if params.structured is not None:
            seq.matcher = self.grammars.matcher(params.structured)   # GrammarError (a ValueError) if malformed
        self.scheduler.add(seq)
        return seq

    @property
    def grammars(self) -> Grammars:
        """Structured outputs' compiler and cache, over this engine's tokenizer and vocabulary."""
        if self._grammars is None:
            if self.tokenizer is None:
                raise RequestError("structured outputs need the model's tokenizer")
            self._grammars = Grammars(self.tokenizer, self.target.cfg.vocab_size, self.eos_token_ids)
        return self._grammars

    def grammars_ready(self, so) -> bool:
        """Whether ``so`` is compiled already (a request for it is added without waiting)."""
        return self._grammars is not None and self._grammars.compiled(so)

    def abort(self, request_id: str) -> bool:
        return self.scheduler.abort(request_id)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # ------------------------------------------------------------------ offline use
    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams] | None = None,
                 progress: bool = False) -> list[RequestOutput]:
        params_list = params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
        seqs = [self.add_request(p, sp) for p, sp in zip(prompts, params_list)]
        bar = None
        if progress:
            bar = tqdm(total=len(seqs), desc="generate", unit="req")
        while self.has_unfinished():
            done = self.step().finished
            if bar is not None:
                bar.update(len(done))
        if bar is not None:
            bar.close()
        return [RequestOutput.of(s) for s in seqs]


def load_response_lookup(config: EngineConfig, target_path: Path, drafter: str | Path | None, vocab_size: int):
    """The table of the target's earlier responses ``config.response_lookup`` names (None: none, or no
    speculation): ``auto`` the one beside the named head, else beside the target's shipped P-EAGLE head, where
    there is one; a path must be a table of this vocabulary (a clear error otherwise)."""
    spec = config.response_lookup
    if spec == "none" or config.method == "none":
        return None
    if spec == "auto":
        head = Path(drafter) if drafter else default_drafter_path(target_path)
        path = head / RESPONSES_FILE if head is not None else None
        return ResponseLookup.load(path, vocab_size) if path is not None and path.is_file() else None
    if not Path(spec).is_file():
        raise ModelNotFoundError(f"no response lookup table at {spec}")
    return ResponseLookup.load(spec, vocab_size)
