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
4. the cost of drafting K tokens through the engine's own ``ModelRunner.propose``: one parallel (P-EAGLE)
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

This module: the command line and the run (the flags, the peers set up once, each section asked for in turn,
the report printed and the figures written, ``--json``); a module beside it per section.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

from peagle.bench.baseline.common import build_context, log
from peagle.bench.baseline.drafting import bench_drafting, markdown_drafting
from peagle.bench.baseline.end_to_end import bench_end_to_end, logit_margin, markdown_end_to_end, summarize_end_to_end
from peagle.bench.baseline.llamabench import bench_llama_bench, markdown_llama_bench
from peagle.bench.baseline.passes import bench_target_passes, markdown_passes
from peagle.bench.baseline.prefill import bench_prefill, markdown_prefill
from peagle.bench.machine import DEFAULT_TORCH_THREADS, cpu_name
from peagle.bench.peers import Peer, Prefills, llamacpp
from peagle.engine.args import add_quantization_arg, add_runtime_args
from peagle.engine.auto_k import parse_k
from peagle.prompts import MT_BENCH, read_prompt_file


def load_prompts(path: Path, n: int) -> list[str]:
    out = [p.text for p in read_prompt_file(path, "mt-bench")][:n]
    if len(out) < n:
        raise SystemExit(f"{path} has only {len(out)} questions, {n} asked for")
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
    # the package's docstring, which `peagle bench baseline --help` shows too
    ap = argparse.ArgumentParser(prog="python -m peagle.bench.baseline", description=sys.modules[__package__].__doc__,
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
    from peagle.precision import dtype_name

    load0 = os.getloadavg()
    t_start = time.perf_counter()
    path = resolve_target(None)
    texts = load_prompts(args.questions, args.prompts)
    engine = LLMEngine.from_pretrained(None, method="none", dtype=args.dtype, device=args.device,
                                       quantization=args.quantization, compute=args.compute, load_format=args.load_format)
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
