"""Token trees against chains on MT-Bench (greedy, the shipped P-EAGLE head, K up to 7; BENCHMARKS.md §17).

* by budget, one request at a time: an ``auto`` tree of at most 1, 2, 4, 8, 16, 32 nodes as the engine
  chooses it (real costs), and as it chooses it when verify rows are priced free (the target's cost curve
  flattened to one row's: a GPU at batch 1, where every step verifies the whole budget): AL is then the
  tree's reach;
* by concurrency 1, 4, 16: ``none``, P-EAGLE chain ``auto``, P-EAGLE tree ``auto`` (budget 16), EAGLE-3 at
  its best fixed K and chain K=7.

Every cell runs the same requests on a fresh engine and is checked against ``none`` token for token.

    python benchmarks/trees/campaign.py [--quantization none] [--num-prompts 10] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from peagle.bench.offline import Models, add_model_args, agreement, run_cell, table
from peagle.bench.workload import add_dataset_args, load_workload
from peagle.engine.auto_k import CostCurve

BUDGETS = (1, 2, 4, 8, 16, 32)


class FreeRows(Models):
    """Engines whose ``auto`` prices a verify pass of any size as one row and keeps that price (no correction
    by measured step times): the tree fills its budget wherever a node has any chance."""

    def engine(self, *a, **kw):
        e = super().engine(*a, **kw)
        if e.auto is not None:
            one = e.auto.target(1)
            e.auto.target = CostCurve([1, 2], [one, one])
            e.auto.drafter = CostCurve([1, 2], [0.0, 0.0])
            e.auto.observe = lambda *a: None
        return e


def main() -> None:
    p = argparse.ArgumentParser()
    add_model_args(p)
    add_dataset_args(p, num_prompts=10, output_len=128)
    p.add_argument("--concurrency", default="1,4,16")
    p.add_argument("--eagle3-ks", default="1,2,3")
    p.add_argument("--out", default="docs/results/trees")
    p.add_argument("--free-only", action="store_true",
                   help="run only the rows-free cells, replacing those of an earlier run's JSON")
    args = p.parse_args()
    work = load_workload(args, args.dataset_name or "mt-bench", args.dataset_path)
    models = Models.load(args.target, args.drafter, args.eagle3_drafter, ["parallel", "eagle3"], args.max_model_len,
                         args.dtype, args.device, args.enforce_eager, args.quantization)
    free = FreeRows(**vars(models))
    cells = []

    def run(m, k, c, tree="chain", budget=16, priced=True):
        cell = run_cell(models if priced else free, work, m, k, c, tree=tree, budget=budget)
        if not priced:
            cell["tree_budget"] = f"{budget}, rows free"
        cells.append(cell)
        print(f"{m} K={k} {tree}/{budget} C={c} priced={priced}: AL {cell['acceptance_length']} "
              f"{cell['output_throughput']:.1f} tok/s", file=sys.stderr, flush=True)
        return cell

    out = Path(args.out)
    tag = args.quantization or "gguf"
    if args.free_only:   # (a fresh `none` to check them against, not kept)
        ref = run("none", 0, 1)
        for b in BUDGETS:
            run("parallel", "auto", 1, "auto", b, priced=False)
        agreement(cells)
        cells = [c for c in json.loads((out / f"campaign-{tag}.json").read_text())
                 if not str(c.get("tree_budget")).endswith("free")] + [c for c in cells if c is not ref]
        write(cells, out, tag)
        return
    for c in (int(x) for x in args.concurrency.split(",")):
        run("none", 0, c)
        run("parallel", 7, c)
        run("parallel", "auto", c)
        run("parallel", "auto", c, "auto", 16)
        best = max((run("eagle3", k, c) for k in (int(x) for x in args.eagle3_ks.split(","))),
                   key=lambda x: x["output_throughput"])
        best["eagle3_best"] = True
        if c == 1:
            for b in BUDGETS:
                if b != 16:
                    run("parallel", "auto", c, "auto", b)
                run("parallel", "auto", c, "auto", b, priced=False)
    agreement(cells)
    write(cells, out, tag)


def write(cells: list[dict], out: Path, tag: str) -> None:
    (out / f"campaign-{tag}.json").write_text(json.dumps(cells, indent=1) + "\n")
    (out / f"campaign-{tag}.md").write_text(table(cells) + "\n")
    plot(cells, out / f"by_budget-{tag}.png", tag)
    print(table(cells))


def plot(cells: list[dict], path: Path, tag: str) -> None:
    """AL and tok/s by tree budget at one request, the chain and EAGLE-3 as lines across."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    one = [c for c in cells if c["concurrency"] == 1]
    def of(free: bool) -> list[dict]:
        return sorted((c for c in one if c.get("tree") == "auto" and str(c["tree_budget"]).endswith("free") == free),
                      key=lambda c: int(str(c["tree_budget"]).split(",")[0]))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, name in ((axes[0], "acceptance_length", "acceptance length"),
                          (axes[1], "output_throughput", "output tok/s")):
        for free, label in ((False, "tree auto (rows priced)"), (True, "tree auto (rows free)")):
            pts = of(free)
            ax.plot([int(str(c["tree_budget"]).split(",")[0]) for c in pts], [c[key] or 1.0 for c in pts], "o-",
                    label=label)
        for c, label, style, color in ((next(c for c in one if c["method"] == "parallel" and c["k"] == "auto"
                                             and c.get("tree") == "chain"), "P-EAGLE chain auto", "--", "tab:green"),
                                       (next(c for c in one if c["method"] == "parallel" and c["k"] == 7),
                                        "P-EAGLE chain K=7", ":", "tab:red"),
                                       (next(c for c in one if c.get("eagle3_best")), "EAGLE-3 best K", "-.", "tab:purple"),
                                       (next(c for c in one if c["method"] == "none"), "none", "-", "gray")):
            if c[key] is not None:
                ax.axhline(c[key], linestyle=style, color=color, label=label)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tree budget (nodes per step)")
        ax.set_title(name)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"P-EAGLE token trees, MT-Bench, one request, SmolLM2-135M ({tag})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
