"""``peagle bench offline``: the engine in-process, no HTTP. For each method (parallel, eagle3, none)
and K it runs the workload with a closed-loop client that keeps ``concurrency`` requests in flight
(the engine's ``max_num_seqs`` is the same number), and reports tok/s, latencies and acceptance.
``bench sweep`` runs the same cells over a larger grid."""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from peagle.bench.workload import Workload, add_dataset_args, load_workload, messages
from peagle.engine.args import add_lookup_args, add_quantization_arg, add_runtime_args
from peagle.engine.auto_k import parse_k
from peagle.precision import dtype_name
from peagle.prompts import encode

if TYPE_CHECKING:
    from peagle.engine.llm_engine import LLMEngine
    from peagle.models.drafter import Drafter
    from peagle.models.llama import LlamaModel

METHODS = ("parallel", "eagle3", "ngram", "none")


@dataclass
class Models:
    """Loaded once and shared by every engine of a run: the target and a head per speculative method."""
    target: LlamaModel
    heads: dict[str, Drafter]
    tokenizer: object
    path: Path                   # the target's folder (HF baselines load it)
    max_model_len: int | None = None
    enforce_eager: bool = False  # CUDA: no graphs
    lookup: dict[str, int] = field(default_factory=dict)   # prompt_lookup_max/_min (none: the engine's defaults)

    @classmethod
    def load(cls, target: str | None, drafter: str | None, eagle3_drafter: str | None, methods: list[str],
             max_model_len: int | None = None, dtype: str = "auto", device: str = "auto",
             enforce_eager: bool = False, quantization: str | None = None, compute: str = "fast") -> "Models":
        """``drafter`` serves both methods unless ``eagle3_drafter`` is given; with neither, each
        method takes the target's shipped head for it."""
        from peagle.models.loader import load_drafter_for, load_target, load_tokenizer

        model, path = load_target(target, dtype, device=device, quantization=quantization, compute=compute)
        tok = load_tokenizer(path)
        heads = {m: load_drafter_for(model, path, (eagle3_drafter or drafter) if m == "eagle3" else drafter, tok, m)
                 for m in methods if m in ("parallel", "eagle3")}
        return cls(model, heads, tok, path, max_model_len, enforce_eager)

    @property
    def trained_k(self) -> int | None:
        """The K the P-EAGLE head was trained for (the engine refuses more)."""
        head = self.heads.get("parallel")
        return head.cfg.trained_k if head is not None else None

    def engine(self, method: str, k: int, concurrency: int, tree: str = "chain", budget: int = 16,
               prefix_caching: bool = True) -> LLMEngine:
        from peagle.engine.llm_engine import EngineConfig, LLMEngine

        cfg = EngineConfig(method=method, num_speculative_tokens=k or 1, max_num_seqs=concurrency,
                           max_model_len=self.max_model_len, enforce_eager=self.enforce_eager,
                           speculative_token_tree=tree, speculative_tree_budget=budget,
                           enable_prefix_caching=prefix_caching, **self.lookup)
        return LLMEngine(self.target, self.heads.get(method), cfg, self.tokenizer)


@dataclass
class _Conversation:
    turns: list[str]
    answers: list[str] = field(default_factory=list)


def run_closed_loop(engine: LLMEngine, work: Workload, temperature: float = 0.0, seed: int = 0, bar=None):
    """Send every request of ``work``, ``engine.cfg.max_num_seqs`` at a time (a new one as soon as
    one finishes; the next turn of a conversation goes first). Returns (records, speculation
    counters of this run, wall seconds)."""
    from peagle.bench.metrics import RequestRecord, spec_delta
    from peagle.engine.sampling import SamplingParams
    from peagle.engine.sequence import SpecStats

    tok = engine.tokenizer
    todo = deque(_Conversation(work.turns(p)) for p in work.prompts)
    live: dict[str, tuple[_Conversation, RequestRecord]] = {}
    records: list[RequestRecord] = []
    before = SpecStats()
    before.merge(engine.stats)
    n = 0
    t0 = time.perf_counter()
    while todo or live:
        while todo and len(live) < engine.cfg.max_num_seqs:
            conv = todo.popleft()
            ids = encode(tok, messages(conv.turns, conv.answers), work.chat)
            rec = RequestRecord(start_time=time.perf_counter(), prompt_len=len(ids), turn=len(conv.answers))
            records.append(rec)
            params = SamplingParams(temperature=temperature, max_tokens=work.output_len,
                                    seed=None if temperature == 0 else seed + n)
            n += 1
            try:
                live[engine.add_request(ids, params).request_id] = (conv, rec)
            except ValueError as e:  # e.g. a prompt longer than max_model_len: a failed request
                rec.error = str(e)
                if bar is not None:
                    bar.update(len(conv.turns) - len(conv.answers))
        result = engine.step()
        now = time.perf_counter()
        for seq in result.updated:
            live[seq.request_id][1].chunk(now)
        for seq in result.finished:
            conv, rec = live.pop(seq.request_id)
            rec.output_tokens, rec.text, rec.token_ids = len(seq.output_ids), seq.text, seq.output_ids
            conv.answers.append(seq.text)
            if len(conv.answers) < len(conv.turns):
                todo.appendleft(conv)
            if bar is not None:
                bar.update(1)
    return records, spec_delta(engine.stats, before), time.perf_counter() - t0


def run_cell(models: Models, work: Workload, method: str, k: int, concurrency: int, temperature: float = 0.0,
             seed: int = 0, bar=None, tree: str = "chain", budget: int = 16, prefix_caching: bool = True) -> dict:
    """One (method, K, token tree, concurrency) measurement on a fresh engine, after a short warm-up request (whose
    kept blocks are forgotten: the first prompt is prefilled as the others, whole)."""
    from peagle.bench.metrics import spec_summary, summarize
    from peagle.engine.sampling import SamplingParams

    engine = models.engine(method, k, concurrency, tree, budget, prefix_caching)
    warm = encode(models.tokenizer, messages(work.prompts[0].turns[:1], []), work.chat)
    engine.generate([warm[:engine.max_model_len - 8]], SamplingParams(max_tokens=4))
    engine.blocks.reset_prefix_cache()
    records, stats, duration = run_closed_loop(engine, work, temperature, seed, bar)
    cell = {"dataset": work.name, "method": method, "k": 0 if method == "none" else k, "concurrency": concurrency,
            "tree": tree, "tree_budget": budget if tree == "auto" else None}
    cell.update(summarize(records, duration))
    cell.update(spec_summary(stats))
    cell["outputs"] = [r.token_ids for r in records]   # for agreement(); dropped before reporting
    return cell


def agreement(cells: list[dict]) -> None:
    """Add to each speculative cell how often its output equals ``none``'s token for token (same
    requests, same concurrency: in float32 always; in bf16, one row and K+1 rows may round near-ties
    differently, as in vLLM) and where the differing ones first part; drop the outputs."""
    for c in cells:
        ref = next((r for r in cells if r["method"] == "none" and (r["dataset"], r["concurrency"])
                    == (c["dataset"], c["concurrency"])), None)
        if c["method"] != "none" and ref is not None:
            pairs = list(zip(c["outputs"], ref["outputs"]))
            firsts = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                      for a, b in pairs if a != b]
            c["agrees_with_none"] = (len(pairs) - len(firsts)) / len(pairs) if pairs else None
            c["first_difference_median"] = sorted(firsts)[len(firsts) // 2] if firsts else None
    for c in cells:
        c.pop("outputs", None)


def grid_cells(models: Models, methods: list[str], ks: list[int], concurrencies: list[int],
               trees: list[str] = ("chain",), budgets: list[int] = (16,)) -> list[tuple[str, int, int, str, int]]:
    """(method, K, concurrency, token tree, tree budget) to run: ``none`` once per concurrency; P-EAGLE
    only up to the K its head was trained for (the engine refuses more), with each tree (an ``auto``
    tree at each budget); EAGLE-3 chains only."""
    trained = models.trained_k
    cells = []
    for c in concurrencies:
        for m in methods:
            for k in ([0] if m == "none" else ks):
                if k == "auto" or not (m == "parallel" and trained is not None and k > trained):
                    for t in (trees if m == "parallel" else ["chain"]):
                        cells += [(m, k, c, t, b) for b in (budgets if t == "auto" else [16])]
    return cells


def k_order(k: int | str) -> tuple:
    """Fixed K values in order, ``auto`` after them."""
    return (k == "auto", 0 if k == "auto" else k)


def parse_list(text: str, kind=int) -> list:
    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"expected a comma-separated list, got {text!r}") from None
    if not values:
        raise ValueError(f"expected a comma-separated list, got {text!r}")
    return values


def tree_grid(args: argparse.Namespace) -> tuple[list[str], list[int]]:
    """The trees and auto-tree budgets asked for (each tree checked by the engine's own config)."""
    from peagle.engine.llm_engine import EngineConfig

    trees = [t.strip() for t in args.speculative_token_tree.split(";") if t.strip()] or ["chain"]
    budgets = parse_list(args.speculative_tree_budget)
    for t in trees:
        for b in budgets:
            EngineConfig(speculative_token_tree=t, speculative_tree_budget=b)
    return trees, budgets


def check_grid(methods: list[str], ks: list[int], concurrencies: list[int]) -> None:
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise ValueError(f"unknown method {bad[0]!r}; choose from {', '.join(METHODS)}")
    if min([k for k in ks if k != "auto"] or [1]) < 1 or min(concurrencies) < 1:
        raise ValueError("K and concurrency values must be >= 1")


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default=None, help="HF folder, .gguf file or hub id (default: SmolLM2-135M-Instruct)")
    p.add_argument("--drafter", default=None, help="vLLM-format head folder (default: the target's P-EAGLE head)")
    p.add_argument("--eagle3-drafter", default=None,
                   help="head for the eagle3 method (default: --drafter, else the target's EAGLE-3 head)")
    p.add_argument("--max-model-len", type=int, default=None)
    add_runtime_args(p, engine=True)
    add_quantization_arg(p)
    add_lookup_args(p)
    p.add_argument("--methods", default="parallel,eagle3,none",
                   help="comma-separated: parallel, eagle3, ngram (the text's drafts alone), none")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")


def add_tree_grid_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--speculative-token-tree", default="chain",
                   help="P-EAGLE's token trees to run, separated by ';': chain, auto (the engine chooses one each "
                        "step) or explicit rank paths such as \"[(0,), (1,), (0, 0)]\"")
    p.add_argument("--speculative-tree-budget", default="16", help="comma-separated node budgets of the auto tree")


def add_args(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    p.add_argument("-k", "--num-speculative-tokens", default="3,7,auto",
                   help="comma-separated K values; auto: the engine chooses K each step")
    add_tree_grid_args(p)
    p.add_argument("--max-concurrency", type=int, default=1, help="requests in flight (= the engine's max_num_seqs)")
    add_dataset_args(p, num_prompts=20, output_len=128)
    p.add_argument("--json", action="store_true", help="print one JSON object with every cell")
    p.add_argument("--disable-tqdm", action="store_true")


def main(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    methods, ks = parse_list(args.methods, str), parse_list(args.num_speculative_tokens, parse_k)
    check_grid(methods, ks, [args.max_concurrency])
    work = load_workload(args, args.dataset_name, args.dataset_path)
    models = Models.load(args.target, args.drafter, args.eagle3_drafter, methods, args.max_model_len,
                         args.dtype, args.device, args.enforce_eager, args.quantization, args.compute)
    models.lookup = dict(prompt_lookup_max=args.prompt_lookup_max, prompt_lookup_min=args.prompt_lookup_min)
    cells = grid_cells(models, methods, ks, [args.max_concurrency], *tree_grid(args))
    bar = tqdm(total=len(cells) * work.num_requests, desc="bench offline", unit="req", file=sys.stderr,
               disable=args.disable_tqdm)
    results = [run_cell(models, work, m, k, c, args.temperature, args.seed, bar, t, b) for m, k, c, t, b in cells]
    bar.close()
    agreement(results)
    if args.json:
        print(json.dumps({"dataset": work.name, "num_prompts": len(work.prompts), "output_len": work.output_len,
                          "concurrency": args.max_concurrency, "device": str(models.target.lm_weight.device),
                          "dtype": dtype_name(models.target.weight_dtype), "cells": results}))
    else:
        print(table(results))
    return 0


def table(cells: list[dict]) -> str:
    """One Markdown row per cell: AL, acceptance, per-position acceptance, throughput, latencies."""
    out = ["| method | K | tree | C | AL | nodes / round | acceptance rate | per-position acceptance | output tok/s "
           "| mean TTFT ms | mean TPOT ms | completed | = none |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in cells:
        nodes = c.get("spec_decode_num_drafts") and c["spec_decode_draft_tokens"] / c["spec_decode_num_drafts"]
        al = "-" if c["acceptance_length"] is None else f"{c['acceptance_length']:.2f}"
        rate = "-" if c["acceptance_rate"] is None else f"{c['acceptance_rate']:.2f}"
        pos = " ".join(f"{x:.2f}" for x in c.get("spec_decode_per_position_acceptance_rates", [])) or "-"
        out.append(f"| {c['method']} | {c['k'] or '-'} | {tree_label(c)} | {c['concurrency']} | {al} | "
                   f"{f'{nodes:.2f}' if nodes else '-'} | {rate} | {pos} | "
                   f"{c['output_throughput']:.1f} | {c['mean_ttft_ms']:.1f} | {c['mean_tpot_ms']:.1f} | "
                   f"{c['completed']}/{c['completed'] + c['failed']} | {agrees(c)} |")
    return "\n".join(out)


def tree_label(c: dict) -> str:
    """``chain``, ``auto/16`` (the auto tree and its budget) or the explicit tree; ``-`` without drafts."""
    t = c.get("tree", "chain")
    return "-" if c["method"] == "none" else f"auto/{c['tree_budget']}" if t == "auto" else t


def agrees(c: dict) -> str:
    a = c.get("agrees_with_none")
    if a is None:
        return "-"
    first = c.get("first_difference_median")
    return f"{a:.0%}" + (f" (first difference: token {first}, median)" if first is not None else "")
