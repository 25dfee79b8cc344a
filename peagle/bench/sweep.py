"""``peagle bench sweep``: method x K x concurrency x dataset, in-process (``bench offline``'s
closed-loop cells), plus peer baselines on the same prompts at concurrency 1: HF transformers
``generate`` (greedy) and HF prompt-lookup decoding (:mod:`peagle.bench.peers.hf`). Writes, under ``--out``:

* ``sweep.json``: every cell (vLLM's result keys, acceptance) and baseline, the settings, the machine;
* ``sweep.md``: the paper's tables: AL per dataset and K; tok/s per concurrency with the speedup of
  P-EAGLE over the best EAGLE-3 and over no speculation; the peers at concurrency 1;
* ``throughput.png`` (tok/s against concurrency, each method at its best K) and
  ``acceptance_length.png`` (AL against K).
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from peagle.bench.offline import (Models, add_model_args, agreement, check_grid, grid_cells, k_order, parse_list,
                                  run_cell)
from peagle.bench.peers import hf as hf_peer
from peagle.engine.args import add_tree_args
from peagle.engine.auto_k import parse_k
from peagle.engine.llm_engine import EngineConfig
from peagle.bench.workload import Workload, add_dataset_args, load_workload, messages
from peagle.prompts import encode

LABELS = {"parallel": "P-EAGLE", "eagle3": "EAGLE-3", "none": "no speculation"}


@dataclass
class SweepConfig:
    methods: list[str]
    ks: list[int | str]
    concurrencies: list[int]
    datasets: list[tuple[str, str | None]]   # (name, file; None: the packaged copy)
    out: Path
    temperature: float = 0.0
    seed: int = 0
    baselines: bool = True
    prompt_lookup_num_tokens: int = 10
    hf_threads: int | None = None            # None: torch's default pool
    tree: str = "chain"                      # every P-EAGLE cell's token tree (EngineConfig.speculative_token_tree)
    tree_budget: int = 16

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "SweepConfig":
        datasets = [(d.split("=", 1)[0], d.split("=", 1)[1] if "=" in d else None) for d in args.datasets]
        cfg = cls(parse_list(args.methods, str), parse_list(args.num_speculative_tokens, parse_k),
                  parse_list(args.concurrency), datasets, Path(args.out), args.temperature, args.seed,
                  not args.no_baselines, args.prompt_lookup_num_tokens, args.hf_threads,
                  args.speculative_token_tree, args.speculative_tree_budget)
        check_grid(cfg.methods, cfg.ks, cfg.concurrencies)
        EngineConfig(speculative_token_tree=cfg.tree, speculative_tree_budget=cfg.tree_budget)   # refused here if bad
        return cfg


def add_args(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    p.add_argument("-k", "--num-speculative-tokens", default="1,3,5,7,10,auto",
                   help="comma-separated K values; auto: the engine chooses K each step")
    add_tree_args(p)
    p.add_argument("--concurrency", default="1,2,4,8,16", help="comma-separated requests in flight")
    p.add_argument("--datasets", nargs="+", default=["mt-bench", "humaneval"], metavar="NAME[=PATH]",
                   help="datasets to sweep (mt-bench and humaneval default to the packaged copies)")
    add_dataset_args(p, single=False, num_prompts=20, output_len=128)
    p.add_argument("--no-baselines", action="store_true", help="skip the HF transformers peers")
    p.add_argument("--prompt-lookup-num-tokens", type=int, default=10, help="HF prompt-lookup decoding's K")
    p.add_argument("--hf-threads", type=int, default=None, help="torch threads for HF (default: torch's own)")
    p.add_argument("--out", default="sweep-results", help="folder for sweep.json, sweep.md and the PNGs")
    p.add_argument("--disable-tqdm", action="store_true")


def main(args: argparse.Namespace) -> int:
    cfg = SweepConfig.from_args(args)
    workloads = [load_workload(args, name, path) for name, path in cfg.datasets]
    res = run_sweep(cfg, workloads, args.target, args.drafter, args.eagle3_drafter, args.max_model_len,
                    progress=not args.disable_tqdm, dtype=args.dtype, device=args.device,
                    enforce_eager=args.enforce_eager, quantization=args.quantization, compute=args.compute)
    write_outputs(res, cfg.out)
    print(res["markdown"])
    print(f"peagle: wrote {cfg.out}/sweep.json, sweep.md, throughput.png, acceptance_length.png", file=sys.stderr)
    return 0


def run_sweep(cfg: SweepConfig, workloads: list[Workload], target: str | None = None, drafter: str | None = None,
              eagle3_drafter: str | None = None, max_model_len: int | None = None, progress: bool = True,
              dtype: str = "auto", device: str = "auto", enforce_eager: bool = False,
              quantization: str | None = None, compute: str = "fast") -> dict:
    import torch
    from tqdm import tqdm

    from peagle.bench.machine import DEFAULT_TORCH_THREADS, cpu_name

    hf_threads = cfg.hf_threads or DEFAULT_TORCH_THREADS
    models = Models.load(target, drafter, eagle3_drafter, cfg.methods, max_model_len, dtype, device, enforce_eager,
                         quantization, compute)
    cells = grid_cells(models, cfg.methods, cfg.ks, cfg.concurrencies, [cfg.tree], [cfg.tree_budget])
    n_base = 2 if cfg.baselines else 0
    bar = tqdm(total=sum(w.num_requests for w in workloads) * (len(cells) + n_base), desc="bench sweep",
               unit="req", file=sys.stderr, disable=not progress)
    t0 = time.perf_counter()
    results, baselines = [], []
    like = models.target.lm_weight   # HF in the engine's dtype, on its device (same-dtype comparisons)
    hf = hf_peer.load(models.path, like.dtype, like.device, hf_threads) if cfg.baselines else None
    for work in workloads:
        for m, k, c, t, b in cells:
            bar.set_postfix_str(f"{work.name} {m} K={k} C={c}")
            results.append(run_cell(models, work, m, k, c, cfg.temperature, cfg.seed, bar, t, b))
        if hf is not None:
            for lookup in (None, cfg.prompt_lookup_num_tokens):
                bar.set_postfix_str(f"{work.name} HF {'prompt lookup' if lookup else 'generate'}")
                baselines.append(run_hf(hf, models.tokenizer, work, lookup, bar))
    bar.close()
    agreement(results)
    res = {
        "config": {**asdict(cfg), "out": str(cfg.out), "target": target, "drafter": drafter,
                   "eagle3_drafter": eagle3_drafter, "trained_k": models.trained_k,
                   "num_prompts": {w.name: len(w.prompts) for w in workloads},
                   "output_len": workloads[0].output_len, "chat_template": workloads[0].chat,
                   "multi_turn": workloads[0].multi_turn},
        "env": {"cpu": cpu_name(), "torch": torch.__version__, "python": platform.python_version(),
                "device": models.target.lm_weight.device.type,
                "dtype": str(models.target.lm_weight.dtype).removeprefix("torch."), "hf_threads": hf_threads,
                "wall_s": time.perf_counter() - t0},
        "cells": results,
        "baselines": baselines,
    }
    res["markdown"] = markdown(res)
    return res


# ----------------------------------------------------------------------------- HF peers

def run_hf(hf: hf_peer.HFPeer, tokenizer, work: Workload, lookup: int | None, bar=None) -> dict:
    """HF ``generate``, one request at a time, greedy (with ``prompt_lookup_num_tokens`` when
    ``lookup``): the same requests and the same metrics as an engine cell at concurrency 1."""
    import torch

    from peagle.bench.metrics import RequestRecord, summarize
    from peagle.cpu import configure_cpu

    records = []
    hf.prepare()
    with torch.inference_mode():
        hf.generate(encode(tokenizer, messages(work.prompts[0].turns[:1], []), work.chat), 4,
                    prompt_lookup=lookup)  # warm-up, untimed
        t0 = time.perf_counter()
        for p in work.prompts:
            turns, answers = work.turns(p), []
            for _ in turns:
                ids = encode(tokenizer, messages(turns, answers), work.chat)
                rec = RequestRecord(start_time=time.perf_counter(), prompt_len=len(ids))
                new = hf.generate(ids, work.output_len, hf_peer.token_streamer(rec.chunk), prompt_lookup=lookup)
                rec.output_tokens = len(new)
                rec.text = tokenizer.decode(new, skip_special_tokens=True)
                records.append(rec)
                answers.append(rec.text)
                if bar is not None:
                    bar.update(1)
    duration = time.perf_counter() - t0
    configure_cpu()
    return {"dataset": work.name, "system": "hf-prompt-lookup" if lookup else "hf", "k": lookup or 0,
            "concurrency": 1, **summarize(records, duration)}


# ----------------------------------------------------------------------------- report

def best(cells: list[dict], dataset: str, method: str, concurrency: int) -> dict | None:
    """The cell of ``method`` with the highest output tok/s at this dataset and concurrency."""
    pick = [c for c in cells if c["dataset"] == dataset and c["method"] == method and c["concurrency"] == concurrency]
    return max(pick, key=lambda c: c["output_throughput"], default=None)


def _tps(cell: dict | None, with_k: bool = False) -> str:
    if cell is None:
        return "-"
    return f"{cell['output_throughput']:.1f}" + (f" (K={cell['k']})" if with_k and cell.get("k") else "")


def _ratio(a: dict | None, b: dict | None) -> str:
    return "-" if a is None or b is None or not b["output_throughput"] else \
        f"{a['output_throughput'] / b['output_throughput']:.2f}x"


def markdown(res: dict) -> str:
    cells, cfg = res["cells"], res["config"]
    datasets = list(dict.fromkeys(c["dataset"] for c in cells))
    concurrencies = sorted({c["concurrency"] for c in cells})
    c0 = concurrencies[0]
    spec = [m for m in ("parallel", "eagle3") if any(c["method"] == m for c in cells)]
    heads = f"P-EAGLE head {cfg['drafter'] or 'default'}, EAGLE-3 head {cfg.get('eagle3_drafter') or cfg['drafter'] or 'default'}"
    out = [f"# Sweep: {cfg['target'] or 'SmolLM2-135M-Instruct'}, {heads}",
           "",
           f"{', '.join(f'{n} ({k} prompts)' for n, k in cfg['num_prompts'].items())}; up to {cfg['output_len']} "
           f"output tokens; temperature {cfg['temperature']}; chat template "
           f"{'on' if cfg['chat_template'] else 'off'}; {res['env']['cpu']} ({res['env']['device']}); "
           f"{res['env']['wall_s']:.0f} s in all.", ""]
    if spec:
        out += [f"## Acceptance length (AL), concurrency {c0}", "",
                "| method | K | " + " | ".join(datasets) + " |", "|---|---|" + "---|" * len(datasets)]
        for m in spec:
            for k in sorted({c["k"] for c in cells if c["method"] == m}, key=k_order):
                row = []
                for d in datasets:
                    cell = next((c for c in cells if (c["dataset"], c["method"], c["k"], c["concurrency"])
                                 == (d, m, k, c0)), None)
                    al = cell and cell["acceptance_length"]
                    row.append("-" if al is None else f"{al:.2f}")
                out.append(f"| {LABELS[m]} | {k} | " + " | ".join(row) + " |")
        out.append("")
    out += ["## Output throughput (tok/s), each method at its best K", ""]
    for d in datasets:
        out += [f"### {d}", "", "| concurrency | no speculation | EAGLE-3 | P-EAGLE | P-EAGLE / EAGLE-3 "
                "| P-EAGLE / none |", "|---|---|---|---|---|---|"]
        for c in concurrencies:
            none, e3, pe = (best(cells, d, m, c) for m in ("none", "eagle3", "parallel"))
            out.append(f"| {c} | {_tps(none)} | {_tps(e3, True)} | {_tps(pe, True)} | {_ratio(pe, e3)} "
                       f"| {_ratio(pe, none)} |")
        out.append("")
    if res["baselines"]:
        out += ["## Peers at concurrency 1 (same prompts; output tok/s, ratio to HF `generate`)", "",
                "| system | " + " | ".join(datasets) + " |", "|---|" + "---|" * len(datasets)]
        hf = {(b["dataset"], b["system"]): b for b in res["baselines"]}
        rows = [("HF transformers `generate`, greedy", lambda d: hf.get((d, "hf"))),
                (f"HF prompt lookup, {cfg['prompt_lookup_num_tokens']} tokens",
                 lambda d: hf.get((d, "hf-prompt-lookup")))]
        rows += [(f"peagle {LABELS[m]}" + ("" if m == "none" else " (best K)"), lambda d, m=m: best(cells, d, m, 1))
                 for m in ("none", "eagle3", "parallel") if any(c["method"] == m for c in cells)]
        for label, get in rows:
            out.append(f"| {label} | " + " | ".join(
                f"{_tps(get(d), True)}, {_ratio(get(d), hf.get((d, 'hf')))}" if get(d) else "-"
                for d in datasets) + " |")
        out.append("")
    return "\n".join(out)


def write_outputs(res: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps({k: v for k, v in res.items() if k != "markdown"}, indent=1) + "\n")
    (out / "sweep.md").write_text(res["markdown"] + "\n")
    plot(res, out)


def plot(res: dict, out: Path) -> None:
    """throughput.png: tok/s against concurrency per dataset, each method at its best K (labelled);
    acceptance_length.png: AL against K per method and dataset."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = res["cells"]
    datasets = list(dict.fromkeys(c["dataset"] for c in cells))
    methods = [m for m in ("parallel", "eagle3", "ngram", "none") if any(c["method"] == m for c in cells)]
    concurrencies = sorted({c["concurrency"] for c in cells})

    fig, axes = plt.subplots(1, len(datasets), figsize=(5 * len(datasets), 4), squeeze=False)
    for ax, d in zip(axes[0], datasets):
        for i, m in enumerate(methods):
            pts = [(c, best(cells, d, m, c)) for c in concurrencies]
            pts = [(c, b) for c, b in pts if b is not None]
            (line,) = ax.plot([c for c, _ in pts], [b["output_throughput"] for _, b in pts], marker="o",
                              label=LABELS[m])
            if m != "none":  # label each point with its best K, P-EAGLE above the line and EAGLE-3 below
                for c, b in pts:
                    ax.annotate(f"K={b['k']}", (c, b["output_throughput"]), textcoords="offset points",
                                xytext=(0, 7 if i == 0 else -12), ha="center", fontsize=7, color=line.get_color())
        ax.set_xscale("log", base=2)
        ax.margins(y=0.12)
        ax.set_xticks(concurrencies, [str(c) for c in concurrencies])
        ax.set(title=d, xlabel="concurrency (requests in flight)", ylabel="output tok/s")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / "throughput.png", dpi=120)
    plt.close(fig)

    c0 = concurrencies[0]
    fig, ax = plt.subplots(figsize=(6, 4))
    for color, d in zip(plt.rcParams["axes.prop_cycle"].by_key()["color"] * len(datasets), datasets):
        for m, style in (("parallel", "-"), ("eagle3", "--")):
            pts = sorted((c["k"], c["acceptance_length"]) for c in cells if c["dataset"] == d and c["method"] == m
                         and c["concurrency"] == c0 and c["acceptance_length"] is not None and c["k"] != "auto")
            if pts:
                ax.plot([k for k, _ in pts], [a for _, a in pts], style, color=color, marker="o",
                        label=f"{LABELS[m]}, {d}")
    ks = sorted({c["k"] for c in cells if c["k"] and c["k"] != "auto"})
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.set_ylim(bottom=0.9)
    ax.set(title=f"Acceptance length (concurrency {c0})", xlabel="K (draft tokens per round)",
           ylabel="acceptance length")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / "acceptance_length.png", dpi=120)
    plt.close(fig)
