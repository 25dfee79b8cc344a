"""Baseline benchmark on the default model (SmolLM2-135M-Instruct, ``--dtype``/``--device`` as the CLI), in one run:

1. plain decoding: our engine (method ``none``) against HF transformers ``generate`` (greedy), same
   chat-templated MT-Bench prompts, same number of new tokens (HF: ``min_new_tokens`` = max, ours:
   ``ignore_eos``), one request at a time; decode tok/s = (new tokens - 1) / (total time - time to
   first token), TTFT, and whether the greedy tokens agree; the speculative methods end to end, each
   with the head ``load_drafter_for`` gives for it (the shipped P-EAGLE and EAGLE-3 heads), at
   ``--k`` (default ``auto``, as ``peagle generate``: so the `parallel` row is generate's defaults);
2. the cost of one engine step verifying 1, 2, 4, 8, 16 tokens at a context of ~256 tokens (ours,
   and HF's forward with a DynamicCache for reference);
3. the prefill of a 4,000-token prompt, ours against HF's forward, in the same dtype;
4. the cost of drafting K tokens through the engine's own ``_propose``: one parallel (P-EAGLE)
   drafter pass, and K sequential EAGLE-3 passes, for K = 1..10, in ms and as a fraction of a
   one-token step. HF runs in the engine's dtype throughout.

The machine is shared, so every figure is a median of several repetitions, systems are
interleaved (each repetition runs every system back to back, in a rotating order), and the
headline numbers are ratios between figures taken in this same run.

    python -m peagle.bench.baseline --max-new-tokens 128 --prompts 3 --reps 3 --json out.json
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from peagle.engine.auto_k import parse_k
from peagle.prompts import MT_BENCH, read_prompt_file
from peagle.runtime import add_runtime_args

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

def make_first_token_streamer():
    from transformers.generation.streamers import BaseStreamer

    class FirstTokenTimer(BaseStreamer):
        """``generate`` puts the prompt first, then each new token: the second put is the first token."""

        def __init__(self):
            self.calls, self.first = 0, None

        def put(self, value):
            self.calls += 1
            if self.calls == 2 and self.first is None:
                self.first = time.perf_counter()

        def end(self):
            pass

    return FirstTokenTimer()


def run_hf(hf, ids: list[int], n: int, threads: int) -> dict:
    torch.set_num_threads(threads)
    x = torch.tensor([ids])
    streamer = make_first_token_streamer()
    with OtherLoad() as ol, torch.inference_mode():
        t0 = time.perf_counter()
        out = hf.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n,
                          min_new_tokens=n, pad_token_id=hf.config.eos_token_id, streamer=streamer)
        t1 = time.perf_counter()
    toks = out[0, len(ids):].tolist()
    return {"tokens": toks, "total_s": t1 - t0, "ttft_s": streamer.first - t0, "other_cores": ol.cores}


def run_ours(engine, ids: list[int], n: int) -> dict:
    from peagle.engine.sampling import SamplingParams
    from peagle.runtime import configure_cpu

    configure_cpu()
    with OtherLoad() as ol:
        t0 = time.perf_counter()
        out = engine.generate([ids], SamplingParams(max_tokens=n, ignore_eos=True))[0]
        t1 = time.perf_counter()
    return {"tokens": list(out.token_ids), "total_s": t1 - t0, "ttft_s": out.ttft_s,
            "acceptance_length": out.stats.acceptance_length, "other_cores": ol.cores}


def add_rates(r: dict) -> dict:
    n = len(r["tokens"])
    decode_s = r["total_s"] - r["ttft_s"]
    r["n_tokens"] = n
    r["decode_tok_s"] = (n - 1) / decode_s if n > 1 and decode_s > 0 else None
    r["total_tok_s"] = n / r["total_s"]
    return r


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


def compare_tokens(model, prompt: list[int], ours: list[int], ref: list[int], eos: set[int]) -> dict:
    i = first_mismatch(ours, ref)
    if i is None:
        return {"match": True, "first_mismatch": None}
    info = {"match": False, "first_mismatch": i}
    if i < len(ours) and i < len(ref):
        if ours[i] in eos:
            # HF's min_new_tokens masks EOS; ours with ignore_eos keeps the EOS the model chose
            info["note"] = "ours chose EOS (ignore_eos), HF masks EOS under min_new_tokens"
        else:
            d, gap = logit_margin(model, prompt + ours[:i], ours[i], ref[i])
            info["logit_ours_minus_hf"] = d
            info["top1_top2_gap"] = gap
    return info


def bench_end_to_end(args, engines: dict, hf, prompts_ids: list[list[int]], bar) -> dict:
    n = args.max_new_tokens
    systems = ["hf"] + list(engines)

    def run(name, ids):
        settle(args)
        if name == "hf":
            return add_rates(run_hf(hf, ids, n, args.hf_threads))
        return add_rates(run_ours(engines[name], ids, n))

    # warm-up (first-call allocations, thread-pool start-up, HF's lazy set-up)
    for name in systems:
        bar.set_postfix_str(f"warm-up {name}")
        settle(args)
        if name == "hf":
            run_hf(hf, prompts_ids[0], 8, args.hf_threads)
        else:
            run_ours(engines[name], prompts_ids[0], 8)
        bar.update(1)

    runs = {s: [[None] * args.reps for _ in prompts_ids] for s in systems}
    turn = 0
    for rep in range(args.reps):
        for p, ids in enumerate(prompts_ids):
            wait_for_idle(args.wait_idle, bar)
            order = systems[turn % len(systems):] + systems[:turn % len(systems)]   # rotate who goes first
            turn += 1
            for name in order:
                bar.set_postfix_str(f"rep {rep + 1} prompt {p + 1} {name}")
                runs[name][p][rep] = run(name, ids)
                bar.update(1)
    from peagle.runtime import configure_cpu
    configure_cpu()
    return runs


def summarize_end_to_end(args, runs: dict, model, prompts_ids, eos) -> dict:
    hf_runs = runs["hf"]
    summary = {"systems": {}, "prompts": []}
    for name, per_prompt in runs.items():
        flat = [r for rs in per_prompt for r in rs]
        summary["systems"][name] = {
            "decode_tok_s": median(r["decode_tok_s"] for r in flat),
            "decode_tok_s_min": min(r["decode_tok_s"] for r in flat),
            "decode_tok_s_max": max(r["decode_tok_s"] for r in flat),
            "ttft_ms": 1e3 * median(r["ttft_s"] for r in flat),
            "total_tok_s": median(r["total_tok_s"] for r in flat),
            "acceptance_length": median(r.get("acceptance_length") for r in flat) if name != "hf" else None,
            "other_cores": median(r.get("other_cores") for r in flat),
            "deterministic": all(r["tokens"] == rs[0]["tokens"] for rs in per_prompt for r in rs),
        }
        if name != "hf":
            paired = [o["decode_tok_s"] / h["decode_tok_s"]
                      for os_, hs in zip(per_prompt, hf_runs) for o, h in zip(os_, hs)]
            s = summary["systems"][name]
            s["ratio_vs_hf"] = s["decode_tok_s"] / summary["systems"]["hf"]["decode_tok_s"]
            s["paired_ratio_vs_hf"] = median(paired)
    for p, ids in enumerate(prompts_ids):
        row = {"prompt_tokens": len(ids),
               "decode_tok_s": {name: median(r["decode_tok_s"] for r in runs[name][p]) for name in runs}}
        ref = hf_runs[p][0]["tokens"]
        row["none_vs_hf"] = compare_tokens(model, ids, runs["none"][p][0]["tokens"], ref, eos)
        for name in runs:
            if name not in ("hf", "none"):
                row[f"{name}_vs_none"] = compare_tokens(model, ids, runs[name][p][0]["tokens"],
                                                        runs["none"][p][0]["tokens"], eos)
        summary["prompts"].append(row)
    return summary


# ----------------------------------------------------------------------------- 2. target passes

def build_context(prompts_ids: list[list[int]], outputs: list[list[int]], length: int) -> list[int]:
    """``length`` real tokens: the prompts and their greedy continuations, repeated as needed."""
    pool = [t for ids, out in zip(prompts_ids, outputs) for t in ids + out]
    return (pool * (length // len(pool) + 1))[:length]


def settle(args) -> None:
    """Pause before switching between HF and our engine, which may size torch's pool differently:
    a pool spins for a while after its last job, and spinning threads on 2 cores slow the next
    run down badly."""
    if args.settle > 0:
        time.sleep(args.settle)


def time_once(fn, device: torch.device | None = None) -> float:
    t0 = time.perf_counter()
    fn()
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def bench_target_passes(args, engine, hf, ctx: list[int], bar) -> dict:
    """Ours: one engine step (method ``none``) verifying n tokens (the last one and n-1 injected
    drafts) at a context of C tokens: scheduling, metadata, the target pass, verification and the
    host sync, the path production runs; the sequence is put back after each step so the context
    stays C. HF: its forward over n tokens with a DynamicCache (cropped back), for reference."""
    from peagle.engine.sampling import SamplingParams
    from peagle.runtime import configure_cpu

    C, sizes = len(ctx), args.verify_sizes
    verify_ids = (ctx * 2)[C:C + max(sizes)]   # the tokens being "verified": any real ids
    configure_cpu()
    seq = engine.add_request(ctx, SamplingParams(max_tokens=10 ** 6, ignore_eos=True))
    engine.step()   # prefill: C tokens cached, one emitted
    state = list(seq.tokens)

    def ours(n):
        seq.tokens[:], seq.num_cached, seq.drafts = state, C, verify_ids[:n - 1]
        return time_once(engine.step, engine.device)

    hf_cache = None
    if hf is not None:
        from transformers import DynamicCache
        torch.set_num_threads(args.hf_threads)
        hf_cache = DynamicCache(config=hf.config)
        with torch.inference_mode():
            hf(torch.tensor([ctx]), past_key_values=hf_cache, use_cache=True, logits_to_keep=1)

    def hf_pass(n):
        ids = torch.tensor([verify_ids[:n]])
        with torch.inference_mode():
            t = time_once(lambda: hf(ids, past_key_values=hf_cache, use_cache=True, logits_to_keep=0))
        hf_cache.crop(-n)
        return t

    ours_t, hf_t, load = timed_rounds(args, bar, sizes, ours, hf_pass if hf is not None else None, args.hf_threads)
    engine.abort(seq.request_id)
    base, hf_base = median(ours_t[1]), median(hf_t[1]) if hf is not None else None
    rows = []
    for n in sizes:
        r = {"tokens": n, "ours_ms": 1e3 * median(ours_t[n]), "ours_ratio_to_1": median(ours_t[n]) / base}
        if hf is not None:
            r["hf_ms"] = 1e3 * median(hf_t[n])
            r["hf_ratio_to_1"] = median(hf_t[n]) / hf_base
            r["ours_over_hf"] = median(ours_t[n]) / median(hf_t[n])
        rows.append(r)
    return {"context": C, "rows": rows, "other_cores": load}


def timed_rounds(args, bar, sizes: list[int], ours, other=None,
                 other_threads: int | None = None) -> tuple[dict, dict, float]:
    """Warm-up then ``micro_reps`` rounds; each round times ``ours`` at every size, then ``other``
    (HF on ``other_threads``: pools switched twice a round, with a pause so the other pool's
    spinning workers sleep first). Returns (our times by size, the other's, the cores other jobs
    kept busy meanwhile, median)."""
    from peagle.runtime import configure_cpu

    ours_t, hf_t, loads = {n: [] for n in sizes}, {n: [] for n in sizes}, []
    wait_for_idle(args.wait_idle, bar)
    for rep in range(args.micro_warmup + args.micro_reps):
        configure_cpu()
        settle(args)
        with OtherLoad() as ol:
            for n in sizes:
                t = ours(n)
                if rep >= args.micro_warmup:
                    ours_t[n].append(t)
        loads.append(ol.cores)
        if other is not None:
            if other_threads:
                torch.set_num_threads(other_threads)
                settle(args)
            for n in sizes:
                t = other(n)
                if rep >= args.micro_warmup:
                    hf_t[n].append(t)
        bar.update(1)
    configure_cpu()
    return ours_t, hf_t, median(loads)


# ----------------------------------------------------------------------------- 3. prefill

def bench_prefill(args, engine, hf, ctx: list[int], bar) -> dict:
    """Time to the first token of one ``len(ctx)``-token prompt: the engine's steps (method ``none``;
    its default chunked prefill, and the prompt whole) against HF's forward over the prompt into a
    fresh DynamicCache (logits of the last row only)."""
    from transformers import DynamicCache

    from peagle.engine.llm_engine import EngineConfig, LLMEngine
    from peagle.engine.sampling import SamplingParams

    whole = LLMEngine(engine.target, None, EngineConfig(method="none", enable_chunked_prefill=False,
                                                        max_num_batched_tokens=len(ctx)), engine.tokenizer)

    def first_token(e):
        e.add_request(ctx, SamplingParams(max_tokens=1))

        def run():
            while e.has_unfinished():
                e.step()
        return time_once(run, e.device)

    def ours(_):
        whole_t.append(first_token(whole))
        return first_token(engine)

    def hf_pass(_):
        with torch.inference_mode():
            return time_once(lambda: hf(torch.tensor([ctx]), past_key_values=DynamicCache(config=hf.config),
                                        use_cache=True, logits_to_keep=1))

    whole_t: list[float] = []
    reps = dict(vars(args), micro_warmup=1, micro_reps=args.prefill_reps)
    ours_t, hf_t, load = timed_rounds(argparse.Namespace(**reps), bar, [len(ctx)], ours, hf_pass, args.hf_threads)
    n, hf_s = len(ctx), median(hf_t[len(ctx)])
    return {"tokens": n, "chunk": engine.cfg.max_num_batched_tokens, "ours_s": median(ours_t[n]), "hf_s": hf_s,
            "ours_over_hf": median(ours_t[n]) / hf_s, "whole_s": median(whole_t[1:]),
            "whole_over_hf": median(whole_t[1:]) / hf_s, "other_cores": load}


# ----------------------------------------------------------------------------- 4. drafting

def bench_drafting(args, target, heads: dict, ctx: list[int], target_1tok_ms: float, bar) -> dict:
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
        engine = LLMEngine(target, head, EngineConfig(method=method, num_speculative_tokens=k, max_num_seqs=1))
        calls, propose = [], engine._propose
        engine._propose = lambda *a: calls.append(a) or propose(*a)
        engine.add_request(ctx, SamplingParams(max_tokens=10 ** 6, ignore_eos=True))
        engine.step()      # prefill, first drafts
        engine.step()      # verify K drafts, draft again: the call timed
        return lambda: time_once(lambda: propose(*calls[-1]), engine.device)

    ks = list(range(1, args.max_k + 1))
    with torch.inference_mode():
        calls = {(m, k): propose_call(m, k) for m in heads for k in ks}
        par, e3, load = timed_rounds(args, bar, ks, lambda k: calls[("parallel", k)](),
                               lambda k: calls[("eagle3", k)]())
    rows = []
    for k in ks:
        pm, em = 1e3 * median(par[k]), 1e3 * median(e3[k])
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
    return "\n".join(out)


def markdown_end_to_end(res: dict) -> list[str]:
    a, out = res["args"], []
    e2e = res["end_to_end"]
    out.append(f"### 1. Plain decoding, {a['max_new_tokens']} new tokens, {a['prompts']} MT-Bench prompts "
               f"x {a['reps']} reps (median over all runs)\n")
    out.append("| system | threads | decode tok/s | min-max | TTFT ms | total tok/s | ratio vs HF (paired) | AL "
               "| other jobs' cores |")
    out.append("|---|---|---|---|---|---|---|---|---|")
    for name, s in e2e["systems"].items():
        label = ("HF transformers `generate`" if name == "hf" else f"peagle `{name}`"
                 + ("" if name == "none" else f" (K={a['k']})"))
        threads = (f"torch {a['hf_threads']}" if name == "hf"
                   else f"torch {res['env']['engine_torch_threads']}")
        ratio = "1.00" if name == "hf" else f"{s['ratio_vs_hf']:.2f} ({s['paired_ratio_vs_hf']:.2f})"
        al = "-" if s["acceptance_length"] is None else f"{s['acceptance_length']:.2f}"
        out.append(f"| {label} | {threads} | {fmt(s['decode_tok_s'])} | {fmt(s['decode_tok_s_min'])}-"
                   f"{fmt(s['decode_tok_s_max'])} | {fmt(s['ttft_ms'], 0)} | {fmt(s['total_tok_s'])} | {ratio} | {al} "
                   f"| {fmt(s['other_cores'], 2)} |")
    out.append("")
    names = list(e2e["systems"])
    spec = [n for n in names if n not in ("hf", "none")]
    head = (["prompt", "prompt tokens"] + [f"{n} tok/s" for n in names] + ["none/HF", "none == HF greedy"]
            + [f"{n} == none" for n in spec])
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + "---|" * len(head))
    for i, p in enumerate(e2e["prompts"]):
        d = p["decode_tok_s"]
        cells = ([str(i + 1), str(p["prompt_tokens"])] + [fmt(d[n]) for n in names]
                 + [f"{d['none'] / d['hf']:.2f}", match_str(p["none_vs_hf"])]
                 + [match_str(p[f"{n}_vs_none"]) for n in spec])
        out.append("| " + " | ".join(cells) + " |")
    out.append("")
    none = e2e["systems"]["none"]
    goal = none["ratio_vs_hf"] >= 1.2
    out.append(f"Ours `none` / HF decode ({res['env']['dtype']}): **{none['ratio_vs_hf']:.2f}x** (paired median "
               f"{none['paired_ratio_vs_hf']:.2f}x); goal >= 1.2x: **{'met' if goal else 'not met'}**.")
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
    out.append(f"| ours, chunks of {pf['chunk']} s | ours, whole s | HF s | chunked / HF | whole / HF |")
    out.append("|---|---|---|---|---|")
    out.append(f"| {fmt(pf['ours_s'], 2)} | {fmt(pf['whole_s'], 2)} | {fmt(pf['hf_s'], 2)} | "
               f"{fmt(pf['ours_over_hf'], 2)} | {fmt(pf['whole_over_hf'], 2)} |")
    out.append("")
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

SECTIONS = ("e2e", "passes", "prefill", "drafting")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python -m peagle.bench.baseline", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=3, help="first N MT-Bench first turns")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of every end-to-end run")
    ap.add_argument("--json", type=Path, default=None, help="write every figure (and raw timings) here")
    ap.add_argument("--questions", type=Path, default=MT_BENCH)
    ap.add_argument("--methods", default="none,parallel,eagle3",
                    help="our engine's methods to run end to end ('none' is always run)")
    ap.add_argument("--k", type=parse_k, default="auto",
                    help="K for the end-to-end speculative methods (default auto, as generate)")
    ap.add_argument("--context", type=int, default=256, help="context length for the pass timings")
    ap.add_argument("--verify-sizes", default="1,2,4,8,16")
    ap.add_argument("--max-k", type=int, default=10)
    ap.add_argument("--prefill-tokens", type=int, default=4000, help="prompt length for the prefill timing")
    ap.add_argument("--prefill-reps", type=int, default=3)
    add_runtime_args(ap)
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
    args = ap.parse_args(argv)
    args.sections = [x for x in args.sections.split(",") if x]
    if unknown := set(args.sections) - set(SECTIONS):
        ap.error(f"unknown sections {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
    if "drafting" in args.sections and "passes" not in args.sections:
        args.sections.append("passes")
    args.verify_sizes = sorted({int(x) for x in args.verify_sizes.split(",")})
    if 1 not in args.verify_sizes:
        args.verify_sizes.insert(0, 1)
    args.methods = ["none"] + [m for m in args.methods.split(",") if m and m != "none"]
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    from tqdm import tqdm

    import transformers
    from transformers import AutoModelForCausalLM

    from peagle.engine.llm_engine import EngineConfig, LLMEngine
    from peagle.models.loader import load_drafter_for, resolve_target
    from peagle.runtime import dtype_name

    load0 = os.getloadavg()
    t_start = time.perf_counter()
    path = resolve_target(None)
    texts = load_prompts(args.questions, args.prompts)
    engine = LLMEngine.from_pretrained(None, method="none", dtype=args.dtype, device=args.device)
    engine_threads = torch.get_num_threads()
    log(f"default model: {path}; {engine.device} {engine.precision}; HF torch threads {args.hf_threads}")
    torch.set_num_threads(args.hf_threads)
    # HF in the weights' dtype (it has one dtype for weights and arithmetic): bf16 against bf16 weights
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=engine.weight_dtype).to(engine.device).eval()
    engines = {"none": engine}
    heads = {m: load_drafter_for(engine.target, path, None, engine.tokenizer, m) for m in ("parallel", "eagle3")}
    for m in args.methods[1:]:   # each method with its own shipped head (P-EAGLE, EAGLE-3)
        engines[m] = LLMEngine(engine.target, heads[m], EngineConfig(method=m, num_speculative_tokens=args.k),
                               engine.tokenizer)
    prompts_ids = [engine.encode_prompt(t, chat=True) for t in texts]

    n_systems = 1 + len(engines)
    rounds = args.micro_warmup + args.micro_reps
    sec = args.sections
    bar = tqdm(total=("e2e" in sec) * (n_systems + args.reps * args.prompts * n_systems)
               + ("passes" in sec) * (rounds + 1) + ("drafting" in sec) * rounds + ("prefill" in sec) * args.prefill_reps,
               desc="baseline", unit="run", file=sys.stderr, dynamic_ncols=True)
    found: dict = {}
    outputs = [[] for _ in prompts_ids]
    if "e2e" in sec:
        runs = bench_end_to_end(args, engines, hf, prompts_ids, bar)
        found["end_to_end"] = summarize_end_to_end(args, runs, engine.target, prompts_ids, engine.eos_token_ids)
        found["end_to_end_raw"] = runs
        outputs = [runs["hf"][p][0]["tokens"] for p in range(len(prompts_ids))]
    if "passes" in sec:
        bar.set_postfix_str("target passes")
        found["target_passes"] = bench_target_passes(args, engine, None if args.no_hf_passes else hf,
                                                     build_context(prompts_ids, outputs, args.context), bar)
    if "prefill" in sec:
        bar.set_postfix_str("prefill")
        found["prefill"] = bench_prefill(args, engine, hf, build_context(prompts_ids, outputs, args.prefill_tokens), bar)
    if "drafting" in sec:
        bar.set_postfix_str("drafting")
        found["drafting"] = bench_drafting(args, engine.target, heads, build_context(prompts_ids, outputs, args.context),
                                           found["target_passes"]["rows"][0]["ours_ms"], bar)
    bar.close()

    res = {
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "env": {"cpu": cpu_name(), "cpu_count": os.cpu_count(), "torch": torch.__version__,
                "transformers": transformers.__version__, "python": platform.python_version(),
                "hf_torch_threads": args.hf_threads, "engine_torch_threads": engine_threads,
                "model": str(path), "device": str(engine.device), "dtype": dtype_name(engine.weight_dtype),
                "compute_dtype": dtype_name(engine.dtype),
                "loadavg_start": load0, "loadavg_end": os.getloadavg(),
                "wall_s": time.perf_counter() - t_start},
        **found,
    }
    md = markdown(res)
    print(md)
    env = res["env"]
    print(f"_{env['cpu']}, {env['cpu_count']} CPUs, {env['device']} {env['dtype']}; torch {env['torch']}, "
          f"transformers {env['transformers']}; load average {env['loadavg_start'][0]:.2f} at start, "
          f"{env['loadavg_end'][0]:.2f} at end; {env['wall_s']:.0f} s in all._")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(res, indent=1, default=str) + "\n")
        log(f"wrote {args.json}")
    return res


if __name__ == "__main__":
    main()
