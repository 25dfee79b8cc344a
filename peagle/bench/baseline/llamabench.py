"""Section 5, llama.cpp's own ``llama-bench`` on the same GGUF files, and our decode rate over its tg128:
the figure quoted against llama.cpp."""
from __future__ import annotations

from peagle.bench.baseline.common import fmt
from peagle.bench.peers import llamacpp


def bench_llama_bench(kinds: list[str], threads: int, reps: int, e2e: dict | None) -> dict:
    """``llama-bench`` on each of ``kinds``: tg128 from an empty context and after as many tokens as our end-to-end
    prompts hold on average (``-d``: our decode rate is timed after a prompt, and each token attends to it), pp1 /
    pp8 / pp16 (tokens/s), and our ``none`` decode rate of this run over each tg128 at the same precision."""
    if llamacpp.native_bin("llama-bench") is None:
        return {"left_out": "llama-bench not found (LLAMA_CPP_BIN): its rows are left out"}
    ours = (e2e or {}).get("systems", {}).get("none", {})
    prompts = [p["prompt_tokens"] for p in (e2e or {}).get("prompts", [])]
    depth = round(sum(prompts) / len(prompts)) if prompts else 0
    rows = []
    for kind in kinds:
        r = {"kind": kind, "depth": depth, "tg128": llamacpp.llama_bench(kind, 0, 128, reps, threads)["avg_ts"],
             "tg128_at_depth": llamacpp.llama_bench(kind, 0, 128, reps, threads, depth)["avg_ts"] if depth else None}
        r.update({f"pp{p}": llamacpp.llama_bench(kind, p, 0, reps, threads)["avg_ts"] for p in (1, 8, 16)})
        if ours.get("precision") == kind:
            r["ours_none_vs_tg128"] = ours["decode_tok_s"] / r["tg128"]
            r["ours_none_vs_tg128_at_depth"] = ours["decode_tok_s"] / r["tg128_at_depth"] if depth else None
        rows.append(r)
    return {"rows": rows}


def markdown_llama_bench(res: dict) -> list[str]:
    lb = res["llama_bench"]
    out = ["", "### llama.cpp's own `llama-bench` (tokens/s)", ""]
    if "left_out" in lb:
        return out + [lb["left_out"]]
    out += ["| file | tg128 | tg128 after our prompts (`-d`) | pp1 | pp8 | pp16 | 8 tokens / 1 | ours `none` / tg128 | "
            "ours / tg128 after the prompts |", "|---|---|---|---|---|---|---|---|---|"]
    for r in lb["rows"]:
        out.append(f"| {r['kind']} | {fmt(r['tg128'])} | {fmt(r.get('tg128_at_depth'))} (d{r.get('depth', 0)}) | "
                   f"{fmt(r['pp1'])} | {fmt(r['pp8'])} | {fmt(r['pp16'])} | {fmt(8 * r['pp1'] / r['pp8'], 2)}x | "
                   f"{fmt(r.get('ours_none_vs_tg128'), 2)} | {fmt(r.get('ours_none_vs_tg128_at_depth'), 2)} |")
    return out
