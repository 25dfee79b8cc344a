"""``peagle bench serving``: the serving table. Each system's OpenAI server is started on a loopback
port, the ``bench serve`` client streams the same prompts to it at each concurrency (greedy, the chat
template applied client-side, ``ignore_eos`` and ``min_tokens`` so every system writes the same
number of tokens), and the server is stopped; each concurrency gets a fresh server, so that none finds
the prompts of the one before in a prefix cache (llama-server keeps idle slots' prompts, ``--cache-ram``).
peagle's own engine then runs the same prompts in this process, without HTTP (what ``peagle generate`` and
``bench offline`` run), so the table shows what the server costs. Repeats go round every system in turn; the table gives medians.

Systems: ``peagle-none``, ``peagle-parallel`` (P-EAGLE), ``peagle-eagle3`` (K chosen by the engine,
the default model and its shipped heads), each also ``-no-prefix-cache`` (``--no-enable-prefix-caching``: a
conversation's second turn prefills its first again), ``llamacpp-F32|F16|BF16|Q8_0|Q4_1``: llama.cpp's own
``llama-server`` with ``--llamacpp-parallel`` slots (else the binding's ``llama_cpp.server``, one request at a
time) on the default model's GGUF in that precision (:mod:`peagle.bench.peers.llamacpp`), and ``llamacpp``: the
same server on ``--target``'s own GGUF file, the file peagle's systems run (a 1B-8B model as users download it).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from peagle.bench.peers import llamacpp
from peagle.bench.workload import add_dataset_args, load_workload
from peagle.engine.args import add_quantization_arg
from peagle.precision import DTYPE_CHOICES

PEAGLE = ("peagle-none", "peagle-parallel", "peagle-eagle3")
UNCACHED = "-no-prefix-cache"
SYSTEMS = (*PEAGLE, *(s + UNCACHED for s in PEAGLE), "llamacpp", *(f"llamacpp-{k}" for k in llamacpp.FTYPES))
KEYS = ("output_throughput", "mean_tpot_ms", "mean_ttft_ms", "mean_ttft_ms_later_turns", "acceptance_length",
        "completed", "failed")


def add_args(p: argparse.ArgumentParser) -> None:
    add_dataset_args(p, num_prompts=8, output_len=128)
    p.add_argument("--target", default=None, help="peagle's target (default: SmolLM2-135M-Instruct; llamacpp-KIND "
                                                  "systems run only the default model, llamacpp the target's GGUF)")
    p.add_argument("--drafter", default=None, help="head for peagle-parallel and peagle-eagle3 (default: the shipped ones)")
    p.add_argument("--systems", default="peagle-none,peagle-parallel,llamacpp-F32,llamacpp-BF16",
                   help="comma-separated: peagle-none|parallel|eagle3 (each also with -no-prefix-cache), "
                        "llamacpp-F32|F16|BF16|Q8_0|Q4_1, llamacpp (--target's own GGUF file)")
    p.add_argument("--concurrency", default="1,4,16", help="comma-separated requests in flight")
    p.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto", help="peagle's dtype (servers and offline engine)")
    add_quantization_arg(p)
    p.add_argument("--llamacpp-parallel", type=int, default=4, help="llama-server's slots (--parallel)")
    p.add_argument("--repeats", type=int, default=1, help="rounds over every system (medians are reported)")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--json", default=None, help="also write every measurement to this JSON file")


def main(args: argparse.Namespace) -> int:
    from peagle.bench.offline import Models, parse_list, run_cell

    systems = parse_list(args.systems, str)
    concurrencies = parse_list(args.concurrency)
    bad = [s for s in systems if s not in SYSTEMS]
    if bad:
        raise ValueError(f"unknown system {bad[0]!r}; choose from {', '.join(SYSTEMS)}")
    if min(concurrencies) < 1 or args.repeats < 1:
        raise ValueError("--concurrency and --repeats must be >= 1")
    if any(s.startswith("llamacpp-") for s in systems) and args.target is not None:
        raise ValueError("llamacpp-KIND systems run the default model only: leave out --target, or use llamacpp "
                         "with a GGUF --target")
    if "llamacpp" in systems and not (args.target and args.target.endswith(".gguf") and Path(args.target).is_file()):
        raise ValueError(f"llamacpp serves --target's own GGUF file: --target must name one (got {args.target!r})")
    if any(s.startswith("llamacpp") for s in systems):
        if llamacpp.native_bin("llama-server") is None:
            llamacpp.require()
    work = load_workload(args, args.dataset_name, args.dataset_path)
    methods = [method_of(s) for s in systems if s.startswith("peagle-")]
    models = Models.load(args.target, args.drafter, None, methods, dtype=args.dtype,
                         quantization=args.quantization, compute=args.compute) if methods else None
    runs: list[dict] = []
    for rep in range(args.repeats):
        for system in systems:
            for c in concurrencies:  # a fresh server each: no level finds an earlier one's prompts in a prefix cache
                with running(server_command(system, args, max(concurrencies)), args.port) as (log, _):
                    res = client(args, c)
                    runs.append({"system": system, "via": "server", "concurrency": c, "repeat": rep,
                                 **{k: res.get(k) for k in KEYS}})
                    print(f"peagle: {system} server C={c}: {res['output_throughput']:.1f} tok/s"
                          + (f", {res['failed']} requests failed (server log {log})" if res["failed"] else ""),
                          file=sys.stderr)
            if system.startswith("peagle-"):
                for c in concurrencies:
                    cell = run_cell(models, work, method_of(system), "auto", c,
                                    prefix_caching=not system.endswith(UNCACHED))
                    runs.append({"system": system, "via": "offline", "concurrency": c, "repeat": rep,
                                 **{k: cell.get(k) for k in KEYS}})
                    print(f"peagle: {system} offline C={c}: {cell['output_throughput']:.1f} tok/s", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps({"dataset": work.name, "num_prompts": len(work.prompts),
                                               "output_len": work.output_len, "runs": runs}) + "\n")
    print(table(runs, systems, concurrencies, args.llamacpp_parallel))
    return 0


def method_of(system: str) -> str:
    """A peagle system's method (``peagle-none-no-prefix-cache``: none)."""
    return system.removeprefix("peagle-").removesuffix(UNCACHED)


def server_command(system: str, args: argparse.Namespace, max_seqs: int) -> list[str]:
    if system.startswith("llamacpp"):
        model = Path(args.target) if system == "llamacpp" else system.removeprefix("llamacpp-")
        return llamacpp.server_command(model, args.port, args.llamacpp_parallel)
    method = method_of(system)
    spec = {"method": "none"} if method == "none" else {
        "method": "eagle3", "num_speculative_tokens": "auto", "parallel_drafting": method == "parallel",
        **({"model": args.drafter} if args.drafter else {})}
    return [sys.executable, "-m", "peagle.cli", "serve", "--port", str(args.port), "--dtype", args.dtype,
            "--max-num-seqs", str(max_seqs), "--speculative-config", json.dumps(spec),
            *(["--target", args.target] if args.target else []),
            *(["--quantization", args.quantization] if args.quantization else []), "--compute", args.compute,
            *(["--no-enable-prefix-caching"] if system.endswith(UNCACHED) else [])]


@contextlib.contextmanager
def running(cmd: list[str], port: int, timeout: float = 600):
    """A server started with ``cmd``, ready to answer (it lists its models); stopped on exit. Yields its
    log's path and its process. A port something already answers on is refused: the server started there
    would fail to bind while the other answered the readiness check and every request (a server left behind
    by a killed run served a whole table so)."""
    import httpx

    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        raise RuntimeError(f"port {port} is in use: another server answers there (stop it, or pass --port)")
    log = Path(tempfile.mkstemp(prefix="peagle-bench-server-", suffix=".log")[1])
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited ({proc.returncode}): {log.read_text()[-600:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                raise RuntimeError(f"the server did not answer within {timeout:.0f} s: {log.read_text()[-600:]}")
            time.sleep(0.5)
        if proc.poll() is not None:  # it answered, then died: not the server measured
            raise RuntimeError(f"the server exited ({proc.returncode}): {log.read_text()[-600:]}")
        # a warm-up request, as the offline engine gets one: a serving process is measured warm
        httpx.post(f"http://127.0.0.1:{port}/v1/completions", json={"prompt": "Hello", "max_tokens": 16},
                   timeout=120).raise_for_status()
        yield log, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def client_argv(args: argparse.Namespace, concurrency: int) -> list[str]:
    """``bench serve``'s arguments for one run: the workload the offline engine runs too (its conversations'
    every turn with ``--multi-turn``, the chat template unless ``--skip-chat-template``)."""
    argv = ["--port", str(args.port), "--dataset-name", args.dataset_name, "--num-prompts", str(args.num_prompts),
            "--output-len", str(args.output_len), "--max-concurrency", str(concurrency), "--temperature", "0",
            "--ignore-eos", "--disable-tqdm", "--seed", str(args.seed)]
    argv += ["--dataset-path", args.dataset_path] if args.dataset_path else []
    argv += ["--tokenizer", args.target] if args.target else []
    argv += ["--multi-turn"] if args.multi_turn else []
    return argv + (["--skip-chat-template"] if args.skip_chat_template else [])


def client(args: argparse.Namespace, concurrency: int) -> dict:
    """One ``bench serve`` run at ``concurrency`` (its report kept out of the way)."""
    from peagle.bench import serve

    p = argparse.ArgumentParser()
    serve.add_args(p)
    with contextlib.redirect_stdout(io.StringIO()):
        return asyncio.run(serve.run(p.parse_args(client_argv(args, concurrency))))


def table(runs: list[dict], systems: list[str], concurrencies: list[int], parallel: int = 4) -> str:
    """Markdown: per system and concurrency, the server's and the offline engine's medians, and their ratio."""
    def med(system, via, c, key):
        xs = [r[key] for r in runs if (r["system"], r["via"], r["concurrency"]) == (system, via, c)
              and r[key] is not None]
        return statistics.median(xs) if xs else None

    def f(x, nd=1):
        return "-" if x is None else f"{x:.{nd}f}"

    out = ["| system | C | server tok/s | offline tok/s | server / offline | server decode tok/s per request "
           "| offline decode tok/s per request | server TTFT ms | its later turns' | AL |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for s in systems:
        for c in concurrencies:
            tput, off = med(s, "server", c, "output_throughput"), med(s, "offline", c, "output_throughput")
            tpot, off_tpot = med(s, "server", c, "mean_tpot_ms"), med(s, "offline", c, "mean_tpot_ms")
            ratio = tput / off if tput and off else None
            al = med(s, "server", c, "acceptance_length")
            out.append(f"| {s} | {c} | {f(tput)} | {f(off)} | {f(ratio, 2)} | {f(tpot and 1000 / tpot)} | "
                       f"{f(off_tpot and 1000 / off_tpot)} | {f(med(s, 'server', c, 'mean_ttft_ms'), 0)} | "
                       f"{f(med(s, 'server', c, 'mean_ttft_ms_later_turns'), 0)} | "
                       f"{f(al, 2)} |")
    note = ", ".join(f"{s}: {llamacpp.config_note(s.removeprefix('llamacpp-'))}" for s in systems
                     if s.startswith("llamacpp"))
    return "\n".join(out) + (f"\n\nllama.cpp: {note}; {llamacpp.server_note(parallel)}." if note else "")
