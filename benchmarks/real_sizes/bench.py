"""Real model sizes on the CPU: peagle against llama.cpp's own binaries on the same GGUF files (random weights at
Llama-3.2-1B, Llama-3.2-3B and Llama-3.1-8B dimensions, written by ``peagle dummy-gguf`` and quantized by
``llama-quantize``: ``make_files.sh``), in one run, per file and thread count:

- decoding (tg128) and prompt processing (pp512): ``llama-bench`` against peagle's engine (median step times);
- start to the first token and peak RSS: the whole process, ``llama-bench -p 0 -n 1`` against ``peagle generate
  --max-new-tokens 1`` on a one-token prompt without the chat template (the same work: load, one token in, one
  out), a warm page cache;
- a speculative round (verify K + 1 rows, one P-EAGLE drafting pass; the random 1-layer head, with a trained
  head's draft vocabulary since 2026-12-02; lookups off) at K = 1, 3, 7 against a plain step;
- the memory floor: the bytes a step reads (the packed weights) over the read bandwidth measured here.

Decoding's ratio is the median of ``--pairs`` alternating pairs (llama-bench tg128 and peagle's plain steps, each a
process of its own, the order swapped every pair): a host whose speed drifts over minutes moves both of a pair.

    python benchmarks/real_sizes/bench.py FILE.gguf [...] --threads 1,2 --llama BIN --out DIR
    python benchmarks/real_sizes/bench.py FILE.gguf [...] --only start --reps 3   # starts alone: start.json
    python benchmarks/real_sizes/bench.py FILE.gguf [...] --only pairs           # decoding's pairs alone: pairs.json

Raw outputs (llama-bench's JSON, each child's stderr) and ``results.json`` go to DIR; the table is printed.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def timed(cmd: list[str], env: dict | None = None) -> tuple[float, int, str]:
    """(wall s, peak RSS bytes, stderr) of a whole process, through GNU time."""
    out = subprocess.run(["/usr/bin/time", "-f", "TIME %e %M", *cmd], capture_output=True, text=True, env=env)
    if out.returncode:
        raise RuntimeError(f"{cmd[0]} failed ({out.returncode}): {out.stderr[-2000:]}")
    wall, rss = out.stderr.strip().splitlines()[-1].split()[1:]
    return float(wall), int(rss) * 1024, out.stderr


def llama_bench(binary: str, path: str, threads: int, reps: int, raw: Path) -> dict:
    out = subprocess.run([binary, "-m", path, "-t", str(threads), "-p", "512", "-n", "128", "-r", str(reps),
                          "-o", "json"], capture_output=True, text=True, check=True)
    raw.write_text(out.stdout)
    rows = json.loads(out.stdout)
    get = lambda p, n: next(r for r in rows if r["n_prompt"] == p and r["n_gen"] == n)  # noqa: E731
    return {"tg": get(0, 128)["avg_ts"], "tg_sd": get(0, 128)["stddev_ts"], "pp512": get(512, 0)["avg_ts"]}


def warm(*files: Path) -> None:
    """``files`` read once, so that a start finds them in the page cache (a GGUF and peagle's packed cache of it are
    two copies: on a machine whose memory holds both only just, one start's file pushes the other's out)."""
    for f in files:
        with open(f, "rb") as fh:
            while fh.read(1 << 24):
                pass


def peagle_start(path: str) -> list[str]:
    """peagle's start, the work of llama-bench's ``-p 0 -n 1`` (load, one token in, one out): a one-token prompt
    ("Hello"), no chat template. With the default model's template "Hello" is 31 tokens, whose prefill is a
    first step's work that llama-bench's start does not do (0.6 s of a 1B start here, about 1 s at 3B)."""
    return [sys.executable, "-m", "peagle.cli", "generate", "--target", path, "--method", "none", "--no-chat",
            "--max-new-tokens", "1", "Hello"]


def starts(bench: str, path: str, threads: int, env: dict) -> tuple[tuple[float, int], tuple[float, int, str]]:
    """One start each, llama.cpp's then peagle's, each with its file warm: ((wall s, peak RSS), (wall s, peak RSS,
    peagle's stderr))."""
    from peagle.models.loader import packed_cache_dir

    warm(Path(path))
    l_wall, l_rss, _ = timed([bench, "-m", path, "-t", str(threads), "-p", "0", "-n", "1", "-r", "1"])
    where = packed_cache_dir()
    warm(*(where.glob(f"{Path(path).name}.*.packed") if where else []))
    return (l_wall, l_rss), timed(peagle_start(path), env)


def runs(args):
    """(file, threads, its results' key, the child's environment) for every file and thread count asked for."""
    for path in args.files:
        for t in (int(x) for x in args.threads.split(",")):
            env = {**os.environ, "PEAGLE_TORCH_THREADS": str(t), "OMP_NUM_THREADS": str(t)}
            yield path, t, f"{Path(path).name} t{t}", env


def start_only(args, bench: str, out: Path) -> None:
    """``--only start``: per file, peagle's first start (its packed cache written; ``PEAGLE_PACKED_CACHE`` as set),
    then ``--reps`` alternating pairs of later starts, then the cache deleted; medians, all raw figures to
    ``start.json``."""
    from peagle.models.loader import packed_cache_dir

    results = {}
    for path, t, key, env in runs(args):
        where = packed_cache_dir()
        for f in (where.glob(f"{Path(path).name}.*.packed") if where else []):
            f.unlink()
        first = timed(peagle_start(path), env)[:2]
        pairs = [starts(bench, path, t, env) for _ in range(args.reps)]
        med = lambda xs: statistics.median(xs)  # noqa: E731
        r = {"file_bytes": Path(path).stat().st_size, "peagle_first": first,
             "llama": [p[0] for p in pairs], "peagle": [p[1][:2] for p in pairs]}
        results[key] = r
        (out / "start.json").write_text(json.dumps(results, indent=1))
        for f in (where.glob(f"{Path(path).name}.*.packed") if where else []):
            f.unlink()  # a cache is the file's size again: the next file's may not fit beside it
        lw, pw = med([x[0] for x in r["llama"]]), med([x[0] for x in r["peagle"]])
        print(f"{key}: start {pw:.2f} / {lw:.2f} s = {pw / lw:.2f}x (first {first[0]:.1f} s); "
              f"peak RSS {max(x[1] for x in r['peagle']) / 1e9:.2f} / {max(x[1] for x in r['llama']) / 1e9:.2f} GB "
              f"(file {r['file_bytes'] / 1e9:.2f}, first {first[1] / 1e9:.2f})", flush=True)


def tg_pair(bench: str, path: str, threads: int, env: dict, swap: bool) -> tuple[float, float]:
    """(llama-bench's tg128, peagle's plain decoding) in tokens/s, each a process of its own, peagle's first where
    ``swap``."""
    def llama() -> float:
        out = subprocess.run([bench, "-m", path, "-t", str(threads), "-p", "0", "-n", "128", "-r", "1", "-o", "json"],
                             capture_output=True, text=True, check=True)
        return json.loads(out.stdout)[0]["avg_ts"]

    def peagle() -> float:
        return child_run(path, env, "--reps", "2", "--only", "tg")[0]["tg"]

    if swap:
        p = peagle()
        return llama(), p
    lt = llama()
    return lt, peagle()


def tg_pairs(bench: str, path: str, threads: int, env: dict, n: int) -> dict:
    """``n`` alternating :func:`tg_pair` runs, the order swapped every pair: each engine's tokens/s and the median of
    the pairs' ratios (peagle / llama-bench)."""
    pairs = [tg_pair(bench, path, threads, env, swap=i % 2 == 1) for i in range(n)]
    return {"llama": [x[0] for x in pairs], "peagle": [x[1] for x in pairs],
            "ratio_median": statistics.median(p / lt for lt, p in pairs)}


def pair_ratios(r: dict) -> list[float]:
    """A file's decoding pairs (``tg_pairs``): each pair's peagle / llama-bench tok/s, sorted."""
    return sorted(p / lt for lt, p in zip(r["llama"], r["peagle"]))


def pairs_line(key: str, r: dict) -> str:
    """A file's decoding pairs as the table's lines give them: median ratio (range; median tok/s each)."""
    ratios = pair_ratios(r)
    return (f"{key}: tg pairs {r['ratio_median']:.2f}x ({ratios[0]:.2f}-{ratios[-1]:.2f}; "
            f"{statistics.median(r['peagle']):.2f} / {statistics.median(r['llama']):.2f} tok/s)")


def table(results: dict) -> str:
    """The run's table as docs/real-sizes.md gives it (Markdown), from results.json: one line a file and thread
    count. The memory floor's column is each engine's tg over the tg its bytes allow at the measured bandwidth."""
    lines = ["| file | tg pairs' median (range) | the full run's tg | pp512 peagle / llama-bench | start s (ratio) | "
             "peak RSS GB (limit) | round / step, K=1 / 3 / 7 | of the torch sum's rate (llama.cpp) |",
             "|---|---|---|---|---|---|---|---|"]
    for key, r in results.items():
        pg, lb, pairs = r["peagle"], r["llama"], r["tg_pairs"]
        ratios = pair_ratios(pairs)
        rounds = " / ".join(f"{pg['round_over_step'][k]:.2f}" for k in ("1", "3", "7"))
        lines.append(
            f"| {key.replace('.gguf', '')} | **{pairs['ratio_median']:.2f}x** ({ratios[0]:.2f}-{ratios[-1]:.2f}) | "
            f"{pg['tg']:.2f} / {lb['tg']:.2f} = {pg['tg'] / lb['tg']:.2f}x | {pg['pp512']:.0f} / {lb['pp512']:.0f} | "
            f"{pg['start_s']:.1f} / {lb['start_s']:.1f} ({pg['start_s'] / lb['start_s']:.1f}x) | "
            f"{pg['rss'] / 1e9:.2f} ({(1.1 * r['file_bytes'] + 0.8e9) / 1e9:.2f}) | {rounds} | "
            f"{pg['tg'] / pg['floor_tg']:.0%} ({lb['tg'] / pg['floor_tg']:.0%}) |")
    return "\n".join(lines)


def child_run(path: str, env: dict, *args: str) -> tuple[dict, str]:
    """``inner`` on ``path`` in a child process (its thread count in ``env``): (its result, its stderr)."""
    child = subprocess.run([sys.executable, __file__, "--inner", path, *args], capture_output=True, text=True, env=env)
    if child.returncode:
        raise RuntimeError(f"peagle on {path} failed: {child.stderr[-2000:]}")
    return json.loads(child.stdout.strip().splitlines()[-1]), child.stderr


def inner(path: str, reps: int, only_tg: bool = False) -> dict:
    """In a child with its thread count set: peagle's engine on ``path``: step times, prefill rate, bytes a step
    (``only_tg``: the plain steps alone)."""
    import torch

    from peagle.bench.steps import begin, step_times
    from peagle.engine.config import EngineConfig
    from peagle.engine.llm_engine import LLMEngine
    from peagle.engine.sampling import SamplingParams
    from peagle.models.layers import Linear
    from peagle.models.loader import load_drafter_for, load_target, load_tokenizer, resolve_target
    from peagle.models.quant import weight_bytes

    tok = load_tokenizer(resolve_target(path, weights=False))
    target, folder = load_target(path)
    off = dict(prompt_lookup_max=0, response_lookup="none", max_num_seqs=1, max_model_len=1024)
    prompt = tok("The quick brown fox jumps over the lazy dog. " * 4)["input_ids"]
    if only_tg:
        engines = {0: LLMEngine(target, None, EngineConfig(method="none", **off), tok)}
        begin(engines, prompt)
        return {"tg": 1 / statistics.median(step_times(engines, reps, 8)[0])}
    head = load_drafter_for(target, folder, None, tok)
    weights = {id(m.weight): m.weight for m in target.modules() if isinstance(m, Linear)}
    weights.setdefault(id(target.head_weight()), target.head_weight())
    step_bytes = sum(weight_bytes(w) for w in weights.values())
    engines = {0: LLMEngine(target, None, EngineConfig(method="none", **off), tok)}
    for k in (1, 3, 7):
        engines[k] = LLMEngine(target, head, EngineConfig(method="parallel", num_speculative_tokens=k, **off), tok)
    begin(engines, prompt)
    ms = {k: statistics.median(v) * 1e3 for k, v in step_times(engines, reps, 8).items()}
    long = (prompt * 64)[:512]
    pp = []
    for _ in range(2):
        e = LLMEngine(target, None, EngineConfig(method="none", **off, max_num_batched_tokens=512), tok)
        e.add_request(list(long), SamplingParams(max_tokens=1, ignore_eos=True))
        t = time.perf_counter()
        while e.has_unfinished():
            e.step()
        pp.append(time.perf_counter() - t)
    n = torch.get_num_threads()
    big = torch.ones(1 << 28)  # 1 GiB of float32, read by a sum: the read bandwidth with this many threads
    bw = []
    for _ in range(5):
        t = time.perf_counter()
        big.sum()
        bw.append(big.numel() * 4 / (time.perf_counter() - t))
    return {"threads": n, "precision": engines[0].precision, "step_ms": ms[0], "tg": 1e3 / ms[0],
            "round_ms": {k: ms[k] for k in (1, 3, 7)}, "round_over_step": {k: ms[k] / ms[0] for k in (1, 3, 7)},
            "pp512": 512 / min(pp), "step_bytes": step_bytes, "bandwidth": max(bw),
            "floor_tg": max(bw) / step_bytes}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*")
    ap.add_argument("--threads", default="2")
    ap.add_argument("--llama", default=os.path.expanduser(
        "~/.cache/llama-native/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin"), help="llama.cpp's bin folder")
    ap.add_argument("--reps", type=int, default=3, help="llama-bench repetitions; peagle's rounds of steps x 4")
    ap.add_argument("--out", default="docs/results/real-sizes")
    ap.add_argument("--pairs", type=int, default=3, help="alternating pairs of decoding runs (the ratio's median)")
    ap.add_argument("--only", choices=["start", "pairs", "tg"], default=None,
                    help="start: only the starts (and peak RSS); pairs: only decoding's alternating pairs; "
                         "tg: a child's plain steps alone (with --inner)")
    ap.add_argument("--inner", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner:
        print(json.dumps(inner(args.inner, 4 * args.reps, args.only == "tg")))
        return 0
    if args.only == "tg":
        ap.error("--only tg is the decoding pairs' child (--inner FILE); a run measures them with --pairs")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    bench = str(Path(args.llama) / "llama-bench")
    if args.only == "start":
        start_only(args, bench, out)
        return 0
    if args.only == "pairs":  # a second look at a file's decoding ratio without the whole run (15 min at 8B)
        results = {}
        for path, t, key, env in runs(args):
            results[key] = tg_pairs(bench, path, t, env, args.pairs)
            (out / "pairs.json").write_text(json.dumps(results, indent=1))
            print(pairs_line(key, results[key]), flush=True)
        return 0
    results = json.loads((out / "results.json").read_text()) if (out / "results.json").is_file() else {}
    for path, t, key, env in runs(args):
        stem = out / key.replace(" ", "-")
        pairs = tg_pairs(bench, path, t, env, args.pairs)
        lb = llama_bench(bench, path, t, args.reps, stem.with_suffix(".llama-bench.json"))
        (l_wall, l_rss), (p_wall, p_rss, err) = starts(bench, path, t, env)
        log = stem.with_suffix(".peagle.log")
        log.write_text(err)  # the start's, kept where the full run's child fails (its tail in the error)
        pg, child_err = child_run(path, env, "--reps", str(args.reps))
        log.write_text(err + child_err)
        size = Path(path).stat().st_size
        results[key] = {"file_bytes": size, "llama": {**lb, "start_s": l_wall, "rss": l_rss},
                        "peagle": {**pg, "start_s": p_wall, "rss": p_rss}, "tg_pairs": pairs}
        (out / "results.json").write_text(json.dumps(results, indent=1))
        r = results[key]
        print(f"{pairs_line(key, pairs)}; "
              f"tg {pg['tg']:.2f} / {lb['tg']:.2f} = {pg['tg'] / lb['tg']:.2f}x; pp512 {pg['pp512']:.1f} / "
              f"{lb['pp512']:.1f}; start {p_wall:.1f} / {l_wall:.1f} s; RSS {p_rss / 1e9:.2f} / "
              f"{l_rss / 1e9:.2f} GB (file {size / 1e9:.2f}); rounds {r['peagle']['round_over_step']}; floor "
              f"{pg['tg'] / pg['floor_tg']:.0%} (llama {lb['tg'] / pg['floor_tg']:.0%})", flush=True)
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
