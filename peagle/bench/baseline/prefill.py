"""Section 3, prefill: the time to the first token of one long prompt, the engine's chunks and the
prompt whole, against the other peers' prefill of the same token ids."""
from __future__ import annotations

import argparse

from peagle.bench.baseline.common import fmt, median, timed_rounds
from peagle.bench.peers import Peer
from peagle.bench.peers.engine import EnginePeer


def bench_prefill(args, ours: EnginePeer, whole: EnginePeer, others: list[Peer], ctx: list[int], bar) -> dict:
    """Time to the first token of one ``len(ctx)``-token prompt: the engine's steps (method ``none``;
    its default chunked prefill, and the prompt whole) against each other peer's prefill (HF's
    forward into a fresh DynamicCache; llama.cpp's prompt eval) of the same token ids."""
    timers = {p.name: (p, lambda _, p=p: p.prefill_s(ctx)) for p in (ours, whole, *others)}
    reps = argparse.Namespace(**dict(vars(args), micro_warmup=1, micro_reps=args.prefill_reps))
    t, load = timed_rounds(reps, bar, [len(ctx)], timers)
    s = {name: median(t[name][len(ctx)]) for name in timers}
    out = {"tokens": len(ctx), "chunk": ours.engine.cfg.max_num_batched_tokens, "ours_s": s[ours.name],
           "whole_s": s[whole.name], "other_cores": load, "peers": {}}
    for p in others:
        out["peers"][p.name] = {"label": f"{p.system} {p.precision}", "s": s[p.name],
                                "ours_over": s[ours.name] / s[p.name], "whole_over": s[whole.name] / s[p.name]}
    return out


def markdown_prefill(res: dict) -> list[str]:
    a, out = res["args"], []
    pf = res["prefill"]
    out.append(f"### 3. Prefill of a {pf['tokens']}-token prompt (time to the first token, median of "
               f"{a['prefill_reps']})\n")
    out.append("| system | s | ours chunked / it | ours whole / it |")
    out.append("|---|---|---|---|")
    out.append(f"| peagle `none`, chunks of {pf['chunk']} | {fmt(pf['ours_s'], 2)} | | |")
    out.append(f"| peagle `none`, whole | {fmt(pf['whole_s'], 2)} | | |")
    for p in pf["peers"].values():
        out.append(f"| {p['label']} | {fmt(p['s'], 2)} | {fmt(p['ours_over'], 2)} | {fmt(p['whole_over'], 2)} |")
    out.append("")
    if pf.get("left_out"):
        out += [f"Left out: {pf['left_out']}.", ""]
    return out
