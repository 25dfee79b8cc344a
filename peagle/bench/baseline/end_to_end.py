"""Section 1, end to end: plain decoding on every peer and the speculative methods, every prompt,
interleaved; decode rates, TTFT and whether the greedy tokens agree (and where they part, why)."""
from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

from peagle.bench.baseline.common import fmt, median, settle
from peagle.bench.machine import OtherLoad, wait_for_idle
from peagle.bench.peers import Peer, checked_decode
from peagle.cpu import configure_cpu


def run_decode(args, peer: Peer, ids: list[int], n: int) -> dict:
    """One request through ``peer``, after a pause and its pool set up: its tokens, times and rates,
    and the cores other jobs kept busy meanwhile."""
    settle(args)
    peer.prepare()
    with OtherLoad() as ol:
        d = checked_decode(peer, ids, n)
    return add_rates({"tokens": d.tokens, "total_s": d.elapsed_s, "ttft_s": d.ttft_s,
                      "acceptance_length": d.acceptance_length, "other_cores": ol.cores})


def add_rates(r: dict) -> dict:
    n = len(r["tokens"])
    decode_s = r["total_s"] - r["ttft_s"]
    r["n_tokens"] = n
    r["decode_tok_s"] = (n - 1) / decode_s if n > 1 and decode_s > 0 else None
    r["total_tok_s"] = n / r["total_s"]
    return r


def bench_end_to_end(args, peers: dict[str, Peer], prompts_ids: list[list[int]], bar) -> dict:
    """Every peer on every prompt, ``args.reps`` times: each round runs every peer on one prompt back
    to back, the peer going first rotating from round to round."""
    n = args.max_new_tokens
    names = list(peers)
    # warm-up (first-call allocations, thread-pool start-up, HF's lazy set-up)
    for name in names:
        bar.set_postfix_str(f"warm-up {name}")
        run_decode(args, peers[name], prompts_ids[0], 8)
        bar.update(1)

    runs = {name: [[None] * args.reps for _ in prompts_ids] for name in names}
    turn = 0
    for rep in range(args.reps):
        for p, ids in enumerate(prompts_ids):
            wait_for_idle(args.wait_idle, bar)
            order = names[turn % len(names):] + names[:turn % len(names)]
            turn += 1
            for name in order:
                bar.set_postfix_str(f"rep {rep + 1} prompt {p + 1} {name}")
                runs[name][p][rep] = run_decode(args, peers[name], ids, n)
                bar.update(1)
    configure_cpu()
    return runs


def first_mismatch(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def logit_margin(model, prefix: list[int], tok_a: int, tok_b: int) -> tuple[float, float]:
    """Our target's logit of ``tok_a`` minus that of ``tok_b`` after ``prefix``, and the gap between
    its two best logits there (near 0: a float tie)."""
    from peagle.models.attention import AttnMeta

    n, dev = len(prefix), model.lm_weight.device
    pos = torch.arange(n, device=dev)
    with torch.inference_mode():
        logits, _ = model(torch.tensor(prefix, device=dev), pos, model.make_caches(n), AttnMeta.single(pos, 0, n),
                          torch.tensor([n - 1], device=dev))
    row = logits[0]
    top2 = row.topk(2).values
    return float(row[tok_a] - row[tok_b]), float(top2[0] - top2[1])


Explain = Callable[[list[int], int, int], tuple[float, float]]   # logit_margin on our target


def compare_tokens(explain: Explain, prompt: list[int], ours: list[int], ref: list[int], eos: set[int],
                   ref_masks_eos: bool) -> dict:
    """Whether ``ours`` are ``ref``'s greedy tokens; where they part, why: a near-tie of the top two
    logits (float rounding), or EOS, which the reference masked (HF's ``min_new_tokens``)."""
    i = first_mismatch(ours, ref)
    if i is None:
        return {"match": True, "first_mismatch": None}
    info = {"match": False, "first_mismatch": i}
    if i < len(ours) and i < len(ref):
        if ours[i] in eos and ref_masks_eos:
            info["note"] = "ours chose EOS (ignore_eos), HF masks EOS under min_new_tokens"
        else:
            d, gap = explain(prompt + ours[:i], ours[i], ref[i])
            info["logit_ours_minus_hf"] = d
            info["top1_top2_gap"] = gap
    return info


def references(peer: Peer) -> list[str]:
    """The peers whose greedy tokens ``peer``'s are checked against: HF for plain decoding, plain
    decoding for the speculative methods (exact by construction), both for llama.cpp."""
    if peer.name == "hf":
        return []
    if peer.name == "none":
        return ["hf"]
    return ["none"] + (["hf"] if peer.system != "peagle" else [])


def summarize_end_to_end(runs: dict, peers: dict[str, Peer], prompts_ids: list[list[int]], eos: set[int],
                         explain: Explain) -> dict:
    summary = {"systems": {}, "prompts": []}

    def paired_ratio(name: str, other: str) -> tuple[float, float]:
        """Median rate of ``name`` over ``other``'s, and the median of their ratios run by run."""
        paired = [a["decode_tok_s"] / b["decode_tok_s"] for xs, ys in zip(runs[name], runs[other])
                  for a, b in zip(xs, ys)]
        return (summary["systems"][name]["decode_tok_s"] / summary["systems"][other]["decode_tok_s"], median(paired))

    for name, per_prompt in runs.items():
        flat = [r for rs in per_prompt for r in rs]
        p = peers[name]
        als = [r["acceptance_length"] for r in flat if r["acceptance_length"] is not None]
        summary["systems"][name] = {
            "label": p.label, "system": p.system, "precision": p.precision, "threads": p.threads, "note": p.note,
            "decode_tok_s": median(r["decode_tok_s"] for r in flat),
            "decode_tok_s_min": min(r["decode_tok_s"] for r in flat),
            "decode_tok_s_max": max(r["decode_tok_s"] for r in flat),
            "ttft_ms": 1e3 * median(r["ttft_s"] for r in flat),
            "total_tok_s": median(r["total_tok_s"] for r in flat),
            "acceptance_length": statistics.median(als) if als else None,
            "other_cores": median(r.get("other_cores") for r in flat),
            "deterministic": all(r["tokens"] == rs[0]["tokens"] for rs in per_prompt for r in rs),
        }
    llama_at = {s["precision"]: n for n, s in summary["systems"].items() if s["system"] == "llama.cpp"}
    for name, s in summary["systems"].items():
        if name != "hf":
            s["ratio_vs_hf"], s["paired_ratio_vs_hf"] = paired_ratio(name, "hf")
        if s["system"] == "peagle" and s["precision"] in llama_at:
            s["llamacpp_peer"] = llama_at[s["precision"]]
            s["ratio_vs_llamacpp"], s["paired_ratio_vs_llamacpp"] = paired_ratio(name, s["llamacpp_peer"])
    for p, ids in enumerate(prompts_ids):
        row = {"prompt_tokens": len(ids),
               "decode_tok_s": {name: median(r["decode_tok_s"] for r in runs[name][p]) for name in runs}}
        for name in runs:
            for ref in references(peers[name]):
                row[f"{name}_vs_{ref}"] = compare_tokens(explain, ids, runs[name][p][0]["tokens"],
                                                         runs[ref][p][0]["tokens"], eos, ref_masks_eos=ref == "hf")
        summary["prompts"].append(row)
    for name, s in summary["systems"].items():
        s["greedy_agreement"] = {ref: sum(row[f"{name}_vs_{ref}"]["match"] for row in summary["prompts"])
                                 for ref in references(peers[name])}
    return summary


def match_str(info: dict) -> str:
    if info["match"]:
        return "yes"
    s = f"no, from token {info['first_mismatch']}"
    if "top1_top2_gap" in info:
        s += f" (top-2 logit gap {info['top1_top2_gap']:.2g})"
    if "note" in info:
        s += f" ({info['note']})"
    return s


def markdown_end_to_end(res: dict) -> list[str]:
    a, out = res["args"], []
    e2e = res["end_to_end"]
    systems, n_prompts = e2e["systems"], len(e2e["prompts"])
    out.append(f"### 1. Plain decoding, {a['max_new_tokens']} new tokens, {a['prompts']} MT-Bench prompts "
               f"x {a['reps']} reps (median over all runs)\n")
    out.append("| system | weights | threads | decode tok/s | min-max | TTFT ms | total tok/s | ratio vs HF (paired) "
               "| peagle / llama.cpp (paired) | same greedy tokens as | AL | other jobs' cores |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, s in systems.items():
        ratio = "1.00" if name == "hf" else f"{s['ratio_vs_hf']:.2f} ({s['paired_ratio_vs_hf']:.2f})"
        vs_llama = (f"{s['ratio_vs_llamacpp']:.2f} ({s['paired_ratio_vs_llamacpp']:.2f})"
                    if "llamacpp_peer" in s else "-")
        agree = ", ".join(f"`{ref}` {k}/{n_prompts}" for ref, k in s["greedy_agreement"].items()) or "(reference)"
        al = "-" if s["acceptance_length"] is None else f"{s['acceptance_length']:.2f}"
        out.append(f"| {s['label']} | {s['precision']} | {s['threads']} | {fmt(s['decode_tok_s'])} | "
                   f"{fmt(s['decode_tok_s_min'])}-{fmt(s['decode_tok_s_max'])} | {fmt(s['ttft_ms'], 0)} | "
                   f"{fmt(s['total_tok_s'])} | {ratio} | {vs_llama} | {agree} | {al} | {fmt(s['other_cores'], 2)} |")
    out.append("")
    notes = [f"{s['label']}: {s['note']}" for s in systems.values() if s["note"]]
    if "llamacpp_skipped" in e2e:
        notes.append(e2e["llamacpp_skipped"])
    if notes:
        out += ["Configuration: " + "; ".join(notes) + ".", ""]
    names = list(systems)
    others = [n for n in names if n not in ("hf", "none")]
    head = (["prompt", "prompt tokens"] + [f"{n} tok/s" for n in names] + ["none/HF", "none == HF greedy"]
            + [f"{n} == none" for n in others])
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + "---|" * len(head))
    for i, p in enumerate(e2e["prompts"]):
        d = p["decode_tok_s"]
        cells = ([str(i + 1), str(p["prompt_tokens"])] + [fmt(d[n]) for n in names]
                 + [f"{d['none'] / d['hf']:.2f}", match_str(p["none_vs_hf"])]
                 + [match_str(p[f"{n}_vs_none"]) for n in others])
        out.append("| " + " | ".join(cells) + " |")
    out.append("")
    none = systems["none"]
    goal = none["ratio_vs_hf"] >= 1.2
    out.append(f"Ours `none` / HF decode ({res['env']['dtype']}): **{none['ratio_vs_hf']:.2f}x** (paired median "
               f"{none['paired_ratio_vs_hf']:.2f}x); goal >= 1.2x: **{'met' if goal else 'not met'}**.")
    if "llamacpp_peer" in none:
        out.append(f"Ours `none` / {systems[none['llamacpp_peer']]['label']} decode, the same weight precision: "
                   f"**{none['ratio_vs_llamacpp']:.2f}x** (paired median {none['paired_ratio_vs_llamacpp']:.2f}x).")
    out.append("")
    return out
