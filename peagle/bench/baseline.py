"""Baseline benchmark on the default model (SmolLM2-135M-Instruct, ``--dtype``/``--device`` as the CLI), in one run:

1. plain decoding: our engine (method ``none``) against its peers (:mod:`peagle.bench.peers`): HF
   transformers ``generate`` (greedy) and llama.cpp in-process on the default model's GGUF
   (``--llamacpp``: by default the file at the engine's weight precision and the shipped Q4_1), same
   chat-templated MT-Bench prompts and token ids, same number of new tokens, EOS ignored, one request
   at a time; decode tok/s = (new tokens - 1) / (total time - time to first token), TTFT, whether the
   greedy tokens agree, and peagle over llama.cpp at the same weight precision; the speculative
   methods end to end, each with the head ``load_drafter_for`` gives for it (the shipped P-EAGLE and
   EAGLE-3 heads), at ``--k`` (default ``auto``, as ``peagle generate``: so the `parallel` row is
   generate's defaults);
2. the cost of one engine step verifying 1, 2, 4, 8, 16 tokens at a context of ~256 tokens (ours,
   and HF's forward with a DynamicCache for reference);
3. the prefill of a 4,000-token prompt, ours against HF's forward and llama.cpp's prompt eval, in the
   same precision;
4. the cost of drafting K tokens through the engine's own ``_propose``: one parallel (P-EAGLE)
   drafter pass, and K sequential EAGLE-3 passes, for K = 1..10, in ms and as a fraction of a
   one-token step. HF runs in the engine's dtype throughout;
5. llama.cpp's own ``llama-bench`` on the same files (tg128, and pp1 / pp8 / pp16: what a batch of
   verify rows costs it), with our ``none`` decode rate over its tg128 at the same precision: the figure
   quoted against llama.cpp (the binding's per-token Python loop charges its own cost to llama.cpp).

The machine is shared, so every figure is a median of several repetitions, systems are
interleaved (each repetition runs every system back to back, in a rotating order), and the
headline numbers are ratios between figures taken in this same run. llama.cpp's in-process peers need
``pip install '.[llamacpp]'``, ``llama-bench`` its binaries (:func:`peagle.bench.peers.llamacpp.native_bin`);
without them their rows are left out, with a note.

    python -m peagle.bench.baseline --max-new-tokens 128 --prompts 3 --reps 3 --json out.json
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import torch

from peagle.bench.peers import Peer, Prefills, checked_decode, time_once
from peagle.bench.peers import llamacpp
from peagle.bench.peers.engine import EnginePeer
from peagle.engine.auto_k import parse_k
from peagle.prompts import MT_BENCH, read_prompt_file
from peagle.runtime import add_quantization_arg, add_runtime_args, configure_cpu

# torch's default pool size, read before anything (the engine) changes it: HF runs with this.
DEFAULT_TORCH_THREADS = torch.get_num_threads()


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")


def load_prompts(path: Path, n: int) -> list[str]:
    out = [p.text for p in read_prompt_file(path, "mt-bench")][:n]
    if len(out) < n:
        raise SystemExit(f"{path} has only {len(out)} questions, {n} asked for")
    return out


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# ----------------------------------------------------------------------------- other jobs' load

def _busy_cpu_s() -> float | None:
    """CPU seconds all processes have spent busy since boot (``/proc/stat``), or None off Linux."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = (v + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


class OtherLoad:
    """Average number of cores other processes kept busy during a ``with`` block (None if unknown)."""

    def __enter__(self):
        self.w, self.p, self.b = time.perf_counter(), time.process_time(), _busy_cpu_s()
        self.cores = None
        return self

    def __exit__(self, *exc):
        b = _busy_cpu_s()
        wall = time.perf_counter() - self.w
        if b is not None and self.b is not None and wall > 0:
            self.cores = max(0.0, (b - self.b) - (time.process_time() - self.p)) / wall
        return False


def wait_for_idle(max_wait_s: float, bar=None, threshold: float = 0.25) -> float | None:
    """Wait (at most ``max_wait_s``) until other processes use less than ``threshold`` cores over
    one second; returns the last reading. The machine is shared: this only lowers the odds of
    measuring during someone else's burst."""
    if max_wait_s <= 0:
        return None
    deadline = time.perf_counter() + max_wait_s
    last = None
    while True:
        with OtherLoad() as ol:
            time.sleep(1.0)
        last = ol.cores
        if last is None or last < threshold or time.perf_counter() >= deadline:
            return last
        if bar is not None:
            bar.set_postfix_str(f"waiting for other jobs ({last:.1f} cores busy)")


# ----------------------------------------------------------------------------- 1. end to end

def settle(args) -> None:
    """Pause before switching peers, which size their thread pools differently: a pool spins for a
    while after its last job, and spinning threads on 2 cores slow the next run down badly."""
    if args.settle > 0:
        time.sleep(args.settle)


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


# ----------------------------------------------------------------------------- 2. target passes

def build_context(prompts_ids: list[list[int]], outputs: list[list[int]], length: int) -> list[int]:
    """``length`` real tokens: the prompts and their greedy continuations, repeated as needed."""
    pool = [t for ids, out in zip(prompts_ids, outputs) for t in ids + out]
    return (pool * (length // len(pool) + 1))[:length]


Timer = tuple[Peer, Callable[[int], float]]   # the peer timed (its pool set up first), and its timing at a size


def timed_rounds(args, bar, sizes: list[int], timers: dict[str, Timer]) -> tuple[dict, float]:
    """Warm-up then ``micro_reps`` rounds; each round times every timer at every size, in order;
    before each switch of peer (and at a round's start) a pause, then that peer sets up its pool.
    Returns (times by timer and size, the cores other jobs kept busy during the first timer, median)."""
    times, loads = {name: {n: [] for n in sizes} for name in timers}, []
    wait_for_idle(args.wait_idle, bar)
    for rep in range(args.micro_warmup + args.micro_reps):
        last = None
        for i, (name, (peer, timer)) in enumerate(timers.items()):
            if peer is not last:
                settle(args)
                peer.prepare()
                last = peer
            with OtherLoad() as ol:
                for n in sizes:
                    t = timer(n)
                    if rep >= args.micro_warmup:
                        times[name][n].append(t)
            if i == 0:
                loads.append(ol.cores)
        bar.update(1)
    configure_cpu()
    return times, median(loads)


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


# ----------------------------------------------------------------------------- 3. prefill

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


# ----------------------------------------------------------------------------- 4. drafting

def bench_drafting(args, ours: EnginePeer, heads: dict, ctx: list[int], target_1tok_ms: float, bar) -> dict:
    """The engine's own drafting call (``LLMEngine._propose``) in a decode step's shape: a sequence
    at a context of C tokens has had K drafts verified; its expansion, the head's pass (P-EAGLE) or
    passes (EAGLE-3), the LM head and argmax are timed, re-run on the arguments the engine passed."""
    from peagle.engine.llm_engine import EngineConfig, LLMEngine
    from peagle.engine.sampling import SamplingParams

    def propose_call(method: str, k: int):
        # a pass costs the same whatever K the head was trained for: lift the engine's guard so the
        # table runs past it (a copy of the head sharing its weights, with no trained K)
        head = copy.copy(heads[method])
        head.cfg = dataclasses.replace(head.cfg, trained_k=None)
        engine = LLMEngine(ours.engine.target, head, EngineConfig(method=method, num_speculative_tokens=k,
                                                                  max_num_seqs=1))
        calls, propose = [], engine._propose
        engine._propose = lambda *a: calls.append(a) or propose(*a)
        engine.add_request(ctx, SamplingParams(max_tokens=10 ** 6, ignore_eos=True))
        engine.step()      # prefill, first drafts
        engine.step()      # verify K drafts, draft again: the call timed
        return lambda: time_once(lambda: propose(*calls[-1]), engine.device)

    ks = list(range(1, args.max_k + 1))
    with torch.inference_mode():
        calls = {(m, k): propose_call(m, k) for m in heads for k in ks}
        t, load = timed_rounds(args, bar, ks, {m: (ours, lambda k, m=m: calls[(m, k)]()) for m in heads})
    rows = []
    for k in ks:
        pm, em = 1e3 * median(t["parallel"][k]), 1e3 * median(t["eagle3"][k])
        rows.append({"k": k, "parallel_ms": pm, "parallel_frac_of_target": pm / target_1tok_ms,
                     "eagle3_ms": em, "eagle3_frac_of_target": em / target_1tok_ms, "eagle3_over_parallel": em / pm})
    return {"context": len(ctx), "other_cores": load, "target_1tok_ms": target_1tok_ms, "rows": rows,
            "heads": {m: {"num_layers": h.cfg.num_layers, "draft_vocab_size": h.cfg.draft_vocab_size}
                      for m, h in heads.items()}}


# ----------------------------------------------------------------------------- report

def fmt(x, nd=1):
    if x is None or (isinstance(x, float) and x != x):
        return "-"
    return f"{x:.{nd}f}"


def match_str(info: dict) -> str:
    if info["match"]:
        return "yes"
    s = f"no, from token {info['first_mismatch']}"
    if "top1_top2_gap" in info:
        s += f" (top-2 logit gap {info['top1_top2_gap']:.2g})"
    if "note" in info:
        s += f" ({info['note']})"
    return s


def bench_llama_bench(kinds: list[str], threads: int, reps: int, e2e: dict | None) -> dict:
    """``llama-bench`` on each of ``kinds``: tg128 and pp1 / pp8 / pp16 (tokens/s), and our ``none`` decode
    rate of this run over tg128 at the same precision."""
    if llamacpp.native_bin("llama-bench") is None:
        return {"left_out": "llama-bench not found (LLAMA_CPP_BIN): its rows are left out"}
    ours = (e2e or {}).get("systems", {}).get("none", {})
    rows = []
    for kind in kinds:
        r = {"kind": kind, "tg128": llamacpp.llama_bench(kind, 0, 128, reps, threads)["avg_ts"]}
        r.update({f"pp{p}": llamacpp.llama_bench(kind, p, 0, reps, threads)["avg_ts"] for p in (1, 8, 16)})
        if ours.get("precision") == kind:
            r["ours_none_vs_tg128"] = ours["decode_tok_s"] / r["tg128"]
        rows.append(r)
    return {"rows": rows}


def markdown_llama_bench(res: dict) -> list[str]:
    lb = res["llama_bench"]
    out = ["", "### llama.cpp's own `llama-bench` (tokens/s)", ""]
    if "left_out" in lb:
        return out + [lb["left_out"]]
    out += ["| file | tg128 | pp1 | pp8 | pp16 | 8 tokens / 1 | ours `none` / tg128 |", "|---|---|---|---|---|---|---|"]
    for r in lb["rows"]:
        out.append(f"| {r['kind']} | {fmt(r['tg128'])} | {fmt(r['pp1'])} | {fmt(r['pp8'])} | {fmt(r['pp16'])} | "
                   f"{fmt(8 * r['pp1'] / r['pp8'], 2)}x | {fmt(r.get('ours_none_vs_tg128'), 2)} |")
    return out


def markdown(res: dict) -> str:
    out = []
    if "end_to_end" in res:
        out += markdown_end_to_end(res)
    if "target_passes" in res:
        out += markdown_passes(res)
    if "prefill" in res:
        out += markdown_prefill(res)
    if "drafting" in res:
        out += markdown_drafting(res)
    if "llama_bench" in res:
        out += markdown_llama_bench(res)
    return "\n".join(out)


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


def markdown_drafting(res: dict) -> list[str]:
    a, out = res["args"], []
    dr = res["drafting"]
    hd = ", ".join(f"{m}: {h['num_layers']} layer(s), draft vocabulary {h['draft_vocab_size']}"
                   for m, h in dr["heads"].items())
    out.append(f"### 4. Drafting K tokens through `LLMEngine._propose` after a verify step (shipped heads, {hd}; "
               f"context {dr['context']}; median of {a['micro_reps']}; fraction of a {dr['target_1tok_ms']:.2f} ms "
               f"one-token step; other jobs kept {fmt(dr['other_cores'], 2)} cores busy, median)\n")
    out.append("| K | P-EAGLE 1 pass ms | / target | EAGLE-3 K passes ms | / target | EAGLE-3 / P-EAGLE |")
    out.append("|---|---|---|---|---|---|")
    for r in dr["rows"]:
        out.append(f"| {r['k']} | {fmt(r['parallel_ms'], 2)} | {fmt(r['parallel_frac_of_target'], 2)} | "
                   f"{fmt(r['eagle3_ms'], 2)} | {fmt(r['eagle3_frac_of_target'], 2)} | "
                   f"{fmt(r['eagle3_over_parallel'], 2)} |")
    out.append("")
    return out


# ----------------------------------------------------------------------------- main

SECTIONS = ("e2e", "passes", "prefill", "drafting", "llamabench")


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=3, help="first N MT-Bench first turns")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of every end-to-end run")
    ap.add_argument("--json", type=Path, default=None, help="write every figure (and raw timings) here")
    ap.add_argument("--questions", type=Path, default=MT_BENCH)
    ap.add_argument("--methods", default="none,parallel,eagle3",
                    help="our engine's methods to run end to end ('none' is always run)")
    ap.add_argument("--k", type=parse_k, default="auto",
                    help="K for the end-to-end speculative methods (default auto, as generate)")
    ap.add_argument("--llamacpp", default="auto",
                    help="llama.cpp's GGUF precisions to run as peers, comma-separated, of "
                         f"{', '.join(llamacpp.FTYPES)}; auto (default): the engine's weight precision and the shipped "
                         f"{llamacpp.SHIPPED}; none: no llama.cpp")
    ap.add_argument("--llamacpp-threads", type=int, default=None,
                    help="llama.cpp's threads, decode and prompt alike (default: the engine's torch threads)")
    ap.add_argument("--context", type=int, default=256, help="context length for the pass timings")
    ap.add_argument("--verify-sizes", default="1,2,4,8,16")
    ap.add_argument("--max-k", type=int, default=10)
    ap.add_argument("--prefill-tokens", type=int, default=4000, help="prompt length for the prefill timing")
    ap.add_argument("--prefill-reps", type=int, default=3)
    add_runtime_args(ap)
    add_quantization_arg(ap)
    ap.add_argument("--micro-reps", type=int, default=30)
    ap.add_argument("--micro-warmup", type=int, default=3)
    ap.add_argument("--hf-threads", type=int, default=DEFAULT_TORCH_THREADS,
                    help="torch threads for HF (default: torch's own default)")
    ap.add_argument("--settle", type=float, default=0.3,
                    help="seconds to pause before each end-to-end run and each switch of thread pools")
    ap.add_argument("--wait-idle", type=float, default=20.0,
                    help="before each round of end-to-end runs and each pass-timing phase, wait up to this "
                         "many seconds for other processes to go quiet (0: do not wait)")
    ap.add_argument("--no-hf-passes", action="store_true", help="skip HF's column in the pass timings")
    ap.add_argument("--sections", default=",".join(SECTIONS),
                    help="comma-separated, of " + ", ".join(SECTIONS) + " (drafting also times passes; without "
                         "e2e, contexts repeat the prompts alone)")


def check_args(args: argparse.Namespace) -> argparse.Namespace:
    """The comma-separated flags as lists; a ValueError names a bad value."""
    args.sections = [x for x in args.sections.split(",") if x]
    if unknown := set(args.sections) - set(SECTIONS):
        raise ValueError(f"unknown sections {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
    if "drafting" in args.sections and "passes" not in args.sections:
        args.sections.append("passes")
    args.verify_sizes = sorted({int(x) for x in args.verify_sizes.split(",")})
    if 1 not in args.verify_sizes:
        args.verify_sizes.insert(0, 1)
    args.methods = ["none"] + [m for m in args.methods.split(",") if m and m != "none"]
    if args.llamacpp not in ("auto", "none"):
        args.llamacpp = [x for x in args.llamacpp.split(",") if x]
        if unknown := set(args.llamacpp) - set(llamacpp.FTYPES):
            raise ValueError(f"unknown llama.cpp precisions {sorted(unknown)}; choose from "
                             f"{', '.join(llamacpp.FTYPES)}")
    return args


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m peagle.bench.baseline", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_args(ap)
    try:
        return check_args(ap.parse_args(argv))
    except ValueError as e:
        ap.error(str(e))


def llamacpp_kinds(asked: str | list[str], engine_precision: str) -> list[str]:
    """The GGUF precisions ``--llamacpp`` names: auto = the engine's weight precision (the peer its
    rows are compared with) and the shipped file."""
    if asked == "none":
        return []
    return list(dict.fromkeys([engine_precision, llamacpp.SHIPPED] if asked == "auto" else asked))


def llamacpp_peers(args, kinds: list[str], threads: int, prompts_ids: list[list[int]]) -> tuple[list[Peer], str | None]:
    """llama.cpp's peers, with a context that holds the longest request and the prefill prompt; none,
    and a line saying why, where llama-cpp-python is not installed."""
    if not kinds:
        return [], None
    if not llamacpp.available():
        return [], "llama.cpp not installed (pip install '.[llamacpp]'): its rows are left out"
    n_ctx = max([len(ids) + args.max_new_tokens for ids in prompts_ids] + [args.prefill_tokens]) + 1
    return [llamacpp.load(kind, threads, n_ctx) for kind in kinds], None


def main(args: argparse.Namespace) -> int:
    """``peagle bench baseline``."""
    run(check_args(args))
    return 0


def run(args: argparse.Namespace) -> dict:
    """Every section asked for: the report printed, every figure returned (and written to ``--json``)."""
    from tqdm import tqdm

    import transformers

    from peagle.bench.peers import engine as engine_peer
    from peagle.bench.peers import hf as hf_peer
    from peagle.engine.llm_engine import EngineConfig, LLMEngine
    from peagle.models.loader import load_drafter_for, resolve_target
    from peagle.runtime import dtype_name

    load0 = os.getloadavg()
    t_start = time.perf_counter()
    path = resolve_target(None)
    texts = load_prompts(args.questions, args.prompts)
    engine = LLMEngine.from_pretrained(None, method="none", dtype=args.dtype, device=args.device,
                                       quantization=args.quantization, compute=args.compute)
    engine_threads = torch.get_num_threads()
    log(f"default model: {path}; {engine.device} {engine.precision}; HF torch threads {args.hf_threads}")
    # HF in the weights' dtype (it has one dtype for weights and arithmetic): bf16 against bf16 weights
    hf = hf_peer.load(path, engine.weight_dtype, engine.device, args.hf_threads)
    ours = engine_peer.peer(engine, "none", engine_threads)
    peers: dict[str, Peer] = {"hf": hf, "none": ours}
    heads = {m: load_drafter_for(engine.target, path, None, engine.tokenizer, m) for m in ("parallel", "eagle3")}
    for m in args.methods[1:]:   # each method with its own shipped head (P-EAGLE, EAGLE-3)
        cfg = EngineConfig(method=m, num_speculative_tokens=args.k)
        spec = LLMEngine(engine.target, heads[m], cfg, engine.tokenizer)
        peers[m] = engine_peer.peer(spec, m, engine_threads, args.k)
    prompts_ids = [engine.encode_prompt(t, chat=True) for t in texts]
    kinds = llamacpp_kinds(args.llamacpp, ours.precision)
    llama, skipped = llamacpp_peers(args, kinds, args.llamacpp_threads or engine_threads, prompts_ids)
    if skipped:
        log(skipped)
    peers.update((p.name, p) for p in llama)

    rounds = args.micro_warmup + args.micro_reps
    sec = args.sections
    bar = tqdm(total=("e2e" in sec) * len(peers) * (1 + args.reps * args.prompts) + ("passes" in sec) * rounds
               + ("drafting" in sec) * rounds + ("prefill" in sec) * (args.prefill_reps + 1),
               desc="baseline", unit="run", file=sys.stderr, dynamic_ncols=True)
    found: dict = {}
    outputs = [[] for _ in prompts_ids]
    if "e2e" in sec:
        runs = bench_end_to_end(args, peers, prompts_ids, bar)
        found["end_to_end"] = summarize_end_to_end(runs, peers, prompts_ids, engine.eos_token_ids,
                                                   functools.partial(logit_margin, engine.target))
        if skipped:
            found["end_to_end"]["llamacpp_skipped"] = skipped
        found["end_to_end_raw"] = runs
        outputs = [runs["hf"][p][0]["tokens"] for p in range(len(prompts_ids))]
    if "passes" in sec:
        bar.set_postfix_str("target passes")
        found["target_passes"] = bench_target_passes(args, ours, None if args.no_hf_passes else hf,
                                                     build_context(prompts_ids, outputs, args.context), bar)
    if "prefill" in sec:
        bar.set_postfix_str("prefill")
        whole = LLMEngine(engine.target, None, EngineConfig(method="none", enable_chunked_prefill=False,
                                                            max_num_batched_tokens=args.prefill_tokens),
                          engine.tokenizer)
        # a prompt fed a token at a time (n_batch=1) is not a prefill: those peers sit this one out
        others = [p for p in peers.values() if p.system != "peagle" and isinstance(p, Prefills)]
        found["prefill"] = bench_prefill(args, ours, engine_peer.peer(whole, "none-whole", engine_threads),
                                         [p for p in others if not p.note],
                                         build_context(prompts_ids, outputs, args.prefill_tokens), bar)
        found["prefill"]["left_out"] = "; ".join([f"{p.label} ({p.note})" for p in others if p.note]
                                                 + ([skipped] if skipped else []))
    if "drafting" in sec:
        bar.set_postfix_str("drafting")
        found["drafting"] = bench_drafting(args, ours, heads, build_context(prompts_ids, outputs, args.context),
                                           found["target_passes"]["rows"][0]["ours_ms"], bar)
    if "llamabench" in sec and args.llamacpp != "none":
        bar.set_postfix_str("llama-bench")
        found["llama_bench"] = bench_llama_bench(kinds, args.llamacpp_threads or engine_threads, args.reps,
                                                 found.get("end_to_end"))
    bar.close()

    res = {
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "env": {"cpu": cpu_name(), "cpu_count": os.cpu_count(), "torch": torch.__version__,
                "transformers": transformers.__version__, "python": platform.python_version(),
                "llama_cpp": llamacpp_version(), "hf_torch_threads": args.hf_threads,
                "engine_torch_threads": engine_threads,
                "model": str(path), "device": str(engine.device), "dtype": dtype_name(engine.weight_dtype),
                "compute_dtype": dtype_name(engine.dtype),
                "loadavg_start": load0, "loadavg_end": os.getloadavg(),
                "wall_s": time.perf_counter() - t_start},
        **found,
    }
    md = markdown(res)
    print(md)
    env = res["env"]
    llama_v = f", llama-cpp-python {env['llama_cpp']}" if llama else ""
    print(f"_{env['cpu']}, {env['cpu_count']} CPUs, {env['device']} {env['dtype']}; torch {env['torch']}, "
          f"transformers {env['transformers']}{llama_v}; load average {env['loadavg_start'][0]:.2f} at start, "
          f"{env['loadavg_end'][0]:.2f} at end; {env['wall_s']:.0f} s in all._")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(res, indent=1, default=str) + "\n")
        log(f"wrote {args.json}")
    return res


def llamacpp_version() -> str | None:
    if not llamacpp.available():
        return None
    import llama_cpp

    return llama_cpp.__version__


if __name__ == "__main__":
    run(parse_args())
