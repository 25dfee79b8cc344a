"""Learning curves of ``peagle train`` runs, side by side: the held-out evaluations each run logged
(estimated acceptance length and per-depth top-1 accuracy) against training tokens and against
core-seconds (wall seconds x threads), so runs of different head depths compare at equal compute.

    python -m peagle.bench.curves runs/p1 runs/p4 --labels "1 layer" "4 layers" --threads 1 --out docs/results/curves

writes ``curves.md`` (one table per run) and ``curves.png`` (estimated AL against tokens and
against core-minutes). A run started ``--init-from`` another run of the list is drawn after it: its
tokens and core-minutes count from where that one ended.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def read_evals(run: str | Path) -> tuple[dict, list[dict]]:
    """(the run's config, its evaluations in step order; a resumed run's repeats are dropped)."""
    cfg, evals = {}, {}
    for line in Path(run, "train_log.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("event") == "start":
            cfg = rec["config"]
        elif rec.get("event") == "eval":
            evals[rec["step"]] = rec
    return cfg, [evals[s] for s in sorted(evals)]


def table(label: str, cfg: dict, evals: list[dict], threads: int, offset: tuple[int, float] = (0, 0.0)) -> str:
    depths = len(evals[0]["acc"]) if evals else 0
    shown = [d for d in (0, 1, 2, 3, 6, 9) if d < depths]
    out = [f"### {label}", "",
           f"`{cfg.get('method')}`, {cfg.get('layers')} layer(s), K={cfg.get('k')}, lr {cfg.get('lr')}, "
           f"batch {cfg.get('batch_size')} documents, draft vocabulary {cfg.get('draft_vocab')}, {threads} thread(s)"
           + (f"; started from `{cfg['init_from']}` (tokens and core-minutes count on from its end)"
              if offset != (0, 0.0) else ""), "",
           "| step | training tokens | core-minutes | est. AL | top-1 acc, depths " + " / ".join(str(d + 1) for d in shown) + " |",
           "|---|---|---|---|---|"]
    for e in evals:
        acc = " / ".join(f"{e['acc'][d]:.3f}" for d in shown)
        out.append(f"| {e['step']} | {offset[0] + e['tokens']:,} | {offset[1] + e['elapsed_s'] * threads / 60:.1f} | "
                   f"{e['al']:.3f} | {acc} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="`peagle train --out` folders")
    ap.add_argument("--labels", nargs="+", help="one per run (default: the folder names)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1], help="torch threads of each run (one, or one per run)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    labels = args.labels or [Path(r).name for r in args.runs]
    threads = args.threads * len(args.runs) if len(args.threads) == 1 else args.threads
    if len(labels) != len(args.runs) or len(threads) != len(args.runs):
        ap.error("--labels and --threads need one value per run")
    runs = [(lab, *read_evals(r), t) for lab, r, t in zip(labels, args.runs, threads)]
    start = {Path(r).resolve(): (ev[-1]["tokens"], ev[-1]["elapsed_s"] * t / 60) if ev else (0, 0.0)
             for r, (_, _, ev, t) in zip(args.runs, runs)}
    offsets = [start.get(Path(cfg["init_from"]).resolve(), (0, 0.0)) if cfg.get("init_from") else (0, 0.0)
               for _, cfg, _, _ in runs]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "curves.md").write_text("\n".join(table(lab, cfg, ev, t, off) for (lab, cfg, ev, t), off in zip(runs, offsets)))

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for (lab, _, ev, t), (tok0, min0) in zip(runs, offsets):
        axes[0].plot([(tok0 + e["tokens"]) / 1e6 for e in ev], [e["al"] for e in ev], marker="o", label=lab)
        axes[1].plot([min0 + e["elapsed_s"] * t / 60 for e in ev], [e["al"] for e in ev], marker="o", label=lab)
    axes[0].set(xlabel="training tokens (millions)", ylabel="held-out estimated AL")
    axes[1].set(xlabel="core-minutes", ylabel="held-out estimated AL")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
