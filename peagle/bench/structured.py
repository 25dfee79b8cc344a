"""``peagle bench structured``: JSON-schema output with speculation on, against the same engine's free text
on the same prompts, over the 20 schemas of ``peagle/bench/data/json_schemas.json``: each request's decode
rate (its tokens after the first over the time after the first), acceptance length, and whether each
constrained output is valid against its schema (``jsonschema``). The two kinds run interleaved, their order
swapped from one schema to the next, after a warm-up; the grammar's compile falls before the first token.
The schemas bound their arrays (5 items) and free strings (60 characters, 240 for long text), as production
schemas do: unbounded, a 135M model loops in an array or a string until ``max_tokens``."""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from importlib import resources

from peagle.bench.machine import cpu_name
from peagle.engine.args import add_quantization_arg, add_runtime_args, add_tree_args
from peagle.engine.auto_k import parse_k


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default=None, help="HF folder, .gguf file or hub id (default: SmolLM2-135M-Instruct)")
    p.add_argument("--drafter", default=None, help="vLLM-format head folder (default: the target's P-EAGLE head)")
    p.add_argument("--method", choices=["parallel", "eagle3", "none"], default="parallel")
    p.add_argument("-k", "--num-speculative-tokens", dest="k", type=parse_k, default="auto")
    add_tree_args(p)
    add_runtime_args(p, engine=True)
    add_quantization_arg(p)
    p.add_argument("--max-tokens", type=int, default=512, help="per request (a JSON document that has not ended "
                                                               "by then is counted invalid)")
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="for both kinds (1 = off)")
    p.add_argument("--num-schemas", type=int, default=None, help="the first N schemas (default: all 20)")
    p.add_argument("--json", action="store_true", help="print one JSON object with every request")


def main(args: argparse.Namespace) -> int:
    import jsonschema

    from peagle.engine.grammar import StructuredOutput
    from peagle.engine.llm_engine import LLMEngine
    from peagle.engine.sampling import SamplingParams

    items = json.loads(resources.files("peagle.bench").joinpath("data/json_schemas.json").read_text())
    items = items[:args.num_schemas]
    engine = LLMEngine.from_pretrained(args.target, args.drafter, method=args.method, k=args.k, dtype=args.dtype,
                                       device=args.device, quantization=args.quantization, compute=args.compute, load_format=args.load_format,
                                       max_num_seqs=1, enforce_eager=args.enforce_eager,
                                       speculative_token_tree=args.speculative_token_tree,
                                       speculative_tree_budget=args.speculative_tree_budget)
    free = SamplingParams(max_tokens=args.max_tokens, repetition_penalty=args.repetition_penalty)
    engine.generate([engine.encode_prompt("Hello")], replace(free, max_tokens=32))   # warm-up
    rows = []
    for i, item in enumerate(items):
        ids = engine.encode_prompt(item["prompt"])
        constrained = replace(free, structured=StructuredOutput("json_schema", json.dumps(item["schema"])))
        kinds = [("free", free), ("json", constrained)]
        for kind, params in kinds if i % 2 == 0 else kinds[::-1]:
            out = engine.generate([ids], params)[0]
            n = len(out.token_ids)
            decode_s = (out.elapsed_s or 0) - (out.ttft_s or 0)
            valid = None
            if kind == "json":
                try:
                    jsonschema.validate(json.loads(out.text), item["schema"])
                    valid = True
                except (ValueError, jsonschema.ValidationError):
                    valid = False
            rows.append({"schema": item["name"], "kind": kind, "tokens": n, "decode_s": decode_s,
                         "decode_tok_s": (n - 1) / decode_s if decode_s > 0 and n > 1 else None,
                         "acceptance_length": out.stats.acceptance_length, "finish_reason": out.finish_reason,
                         "valid": valid, **({"text": out.text} if kind == "json" else {})})
    summary = {kind: _rate([r for r in rows if r["kind"] == kind]) for kind in ("free", "json")}
    result = {"machine": cpu_name(), "kernels": engine.kernels, "precision": engine.precision, "method": args.method,
              "k": args.k, "free": summary["free"], "json": summary["json"],
              "ratio": summary["json"]["decode_tok_s"] / summary["free"]["decode_tok_s"],
              "valid": sum(bool(r["valid"]) for r in rows), "schemas": len(items), "requests": rows}
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"| schema | free tok/s | JSON tok/s | JSON AL | JSON tokens | valid |\n|---|---|---|---|---|---|")
    for item in items:
        f, j = (next(r for r in rows if r["schema"] == item["name"] and r["kind"] == k) for k in ("free", "json"))
        print(f"| {item['name']} | {_fmt(f['decode_tok_s'])} | {_fmt(j['decode_tok_s'])} | "
              f"{j['acceptance_length']:.2f} | {j['tokens']} | {'yes' if j['valid'] else 'no'} |")
    print(f"\n{result['machine']}, {result['precision']}, {result['kernels']} kernels, {args.method} K={args.k}: "
          f"JSON {summary['json']['decode_tok_s']:.1f} tok/s against free text {summary['free']['decode_tok_s']:.1f} "
          f"({result['ratio']:.2f}x), {result['valid']}/{len(items)} outputs valid", file=sys.stderr)
    return 0


def _rate(rows: list[dict]) -> dict:
    """Tokens after the first over the decode time, summed over the requests."""
    tokens, seconds = sum(r["tokens"] - 1 for r in rows), sum(r["decode_s"] for r in rows)
    return {"tokens": tokens, "decode_s": seconds, "decode_tok_s": tokens / seconds if seconds else 0.0}


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"
