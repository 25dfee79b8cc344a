"""Section 2, target passes: one engine step verifying 1, 2, 4, ... tokens at a fixed context (HF's
forward with a DynamicCache beside it, for reference)."""
from __future__ import annotations

from contextlib import ExitStack

from peagle.bench.baseline.common import fmt, median, timed_rounds
from peagle.bench.peers import Peer


def bench_target_passes(args, ours: Peer, hf: Peer | None, ctx: list[int], bar) -> dict:
    """Ours: one engine step (method ``none``) verifying n tokens at a context of C tokens, the path
    production runs (:meth:`EnginePeer.verify_timer`). HF: its forward over n tokens with a
    DynamicCache (cropped back), for reference."""
    C, sizes = len(ctx), args.verify_sizes
    verify_ids = (ctx * 2)[C:C + max(sizes)]   # the tokens being "verified": any real ids
    with ExitStack() as stack:
        timers = {}
        for name, peer in (("ours", ours), ("hf", hf)):
            if peer is not None:
                peer.prepare()
                timers[name] = (peer, stack.enter_context(peer.verify_timer(ctx, verify_ids)))
        t, load = timed_rounds(args, bar, sizes, timers)
    rows = []
    for n in sizes:
        r = {"tokens": n, "ours_ms": 1e3 * median(t["ours"][n]),
             "ours_ratio_to_1": median(t["ours"][n]) / median(t["ours"][1])}
        if hf is not None:
            r["hf_ms"] = 1e3 * median(t["hf"][n])
            r["hf_ratio_to_1"] = median(t["hf"][n]) / median(t["hf"][1])
            r["ours_over_hf"] = median(t["ours"][n]) / median(t["hf"][n])
        rows.append(r)
    return {"context": C, "rows": rows, "other_cores": load}


def markdown_passes(res: dict) -> list[str]:
    a, out = res["args"], []
    tp = res["target_passes"]
    eight = next((r for r in tp["rows"] if r["tokens"] == 8), None)
    if eight:
        out.append(f"A verify step over 8 tokens costs **{eight['ours_ratio_to_1']:.2f}x** a one-token step "
                   f"(goal <= 1.2x in bf16: **{'met' if eight['ours_ratio_to_1'] <= 1.2 else 'not met'}**).")
    out.append("")
    out.append(f"### 2. One engine step (method `none`) verifying n tokens at a context of {tp['context']} tokens "
               f"(median of {a['micro_reps']}: scheduling, metadata, target pass, verification, host sync; HF: "
               f"its forward with a DynamicCache; other jobs kept {fmt(tp['other_cores'], 2)} cores busy, median)\n")
    has_hf = "hf_ms" in tp["rows"][0]
    out.append("| tokens | ours ms | ours / 1-token |" + (" HF ms | HF / 1-token | ours / HF |" if has_hf else ""))
    out.append("|---|---|---|" + ("---|---|---|" if has_hf else ""))
    for r in tp["rows"]:
        line = f"| {r['tokens']} | {fmt(r['ours_ms'], 2)} | {fmt(r['ours_ratio_to_1'], 2)} |"
        if has_hf:
            line += f" {fmt(r['hf_ms'], 2)} | {fmt(r['hf_ratio_to_1'], 2)} | {fmt(r['ours_over_hf'], 2)} |"
        out.append(line)
    out.append("")
    return out
