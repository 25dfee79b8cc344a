"""Benchmark arithmetic, shared by ``bench serve`` (HTTP) and the in-process runs, with the
definitions and result keys of ``vllm bench serve``:

* TTFT: request sent -> first streamed chunk; ITL: gaps between chunks (a chunk may carry several
  tokens: with speculative decoding it carries one verify round); TPOT: (E2EL - TTFT) / (tokens - 1);
  E2EL: request sent -> last chunk. Reported as mean, median, std and percentiles, in ms.
* Throughput: completed requests and tokens over the wall time of the whole run.
* Speculation, from counters taken before and after the run (the server's Prometheus
  ``vllm:``/``peagle:spec_decode_*``, or the engine's own): acceptance rate = accepted / draft
  tokens, acceptance length (AL) = 1 + accepted / drafts, per-position acceptance = accepted at
  position i / drafts.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from peagle.engine.sequence import SpecStats

LATENCIES = (("ttft", "TTFT", "Time to First Token"), ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
             ("itl", "ITL", "Inter-token Latency"), ("e2el", "E2EL", "End-to-end Latency"))


@dataclass
class RequestRecord:
    """One request as the client saw it; times in seconds from ``start_time`` (perf_counter)."""
    start_time: float = 0.0
    prompt_len: int = 0
    output_tokens: int = 0
    ttft: float | None = None          # None until the first chunk
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0               # to the last chunk
    text: str = ""
    token_ids: list[int] = field(default_factory=list)   # offline runs only
    error: str = ""
    source: str = ""                   # the prompt's dataset (bench serve --long-prompts: "long")
    turn: int = 0                      # its conversation's turn (0: the first; --multi-turn sends the later ones)

    @property
    def success(self) -> bool:
        return self.ttft is not None and not self.error

    def chunk(self, now: float, text: str = "") -> None:
        """A chunk of output arrived at ``now``."""
        if self.ttft is None:
            self.ttft = now - self.start_time
        else:
            self.itl.append(now - self.start_time - self.latency)
        self.latency = now - self.start_time
        self.text += text

    def event(self, data: dict, now: float) -> None:
        """Fold one streamed OpenAI chunk (completions or chat) into the record: a chunk with a
        choice is output (even when its text is empty, as vLLM counts it); the usage chunk gives
        the token counts."""
        choices = data.get("choices")
        if choices:
            c = choices[0]
            self.chunk(now, (c["text"] if "text" in c else (c.get("delta") or {}).get("content")) or "")
        elif data.get("usage"):
            self.output_tokens = data["usage"].get("completion_tokens") or 0
            self.prompt_len = data["usage"].get("prompt_tokens") or self.prompt_len


def summarize(records: list[RequestRecord], duration: float, percentiles: tuple[float, ...] = (99,)) -> dict:
    """vLLM's result dict: counts, throughputs and latency statistics (ms) of the successful requests."""
    ok = [r for r in records if r.success]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_len for r in ok)
    values = {
        "ttft": [r.ttft for r in ok],
        "tpot": [(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1],
        "itl": [x for r in ok for x in r.itl],
        "e2el": [r.latency for r in ok],
    }
    res = {"duration": duration, "completed": len(ok), "failed": len(records) - len(ok),
           "total_input_tokens": in_tokens, "total_output_tokens": out_tokens,
           "request_throughput": len(ok) / duration, "output_throughput": out_tokens / duration,
           "total_token_throughput": (in_tokens + out_tokens) / duration}
    for key, _, _ in LATENCIES:
        ms = np.asarray(values[key] or [0.0]) * 1000
        res[f"mean_{key}_ms"] = float(ms.mean())
        res[f"median_{key}_ms"] = float(np.median(ms))
        res[f"std_{key}_ms"] = float(ms.std())
        for p in percentiles:
            res[f"p{p:g}_{key}_ms"] = float(np.percentile(ms, p))
    later = [r.ttft for r in ok if r.turn]   # a conversation's later turns resend its history: a prefix cache's share
    res["mean_ttft_ms_later_turns"] = float(np.mean(later)) * 1000 if later else None
    return res


_SPEC = re.compile(r'^(?:vllm|peagle):spec_decode_(num_drafts|num_draft_tokens|num_accepted_tokens|'
                   r'num_accepted_tokens_per_pos|num_draft_tokens_per_pos)_total(?:\{[^}]*?position="(\d+)"[^}]*\}|\{[^}]*\})?\s+(\S+)')


def parse_spec_counters(prometheus_text: str) -> SpecStats | None:
    """The speculation counters in a Prometheus exposition (``vllm:`` or ``peagle:`` names; samples
    of several engines are summed), or None when the server exposes none."""
    stats, found = SpecStats(), False
    per_pos: dict[str, dict[int, int]] = {"num_accepted_tokens_per_pos": {}, "num_draft_tokens_per_pos": {}}
    for line in prometheus_text.splitlines():
        m = _SPEC.match(line.strip())
        if not m:
            continue
        found = True
        name, pos, value = m.group(1), m.group(2), int(float(m.group(3)))
        if name in per_pos:
            if pos is not None:
                per_pos[name][int(pos)] = per_pos[name].get(int(pos), 0) + value
        else:
            setattr(stats, name, getattr(stats, name) + value)
    stats.accepted_per_pos, stats.drafted_per_pos = (
        [p.get(i, 0) for i in range(max(p) + 1)] if p else [] for p in per_pos.values())
    return stats if found else None


def spec_delta(after: SpecStats, before: SpecStats) -> SpecStats:
    """What happened between two readings of cumulative counters."""
    def minus(a: list[int], b: list[int]) -> list[int]:
        return [(a[i] if i < len(a) else 0) - (b[i] if i < len(b) else 0) for i in range(max(len(a), len(b)))]

    return SpecStats(after.num_drafts - before.num_drafts, after.num_draft_tokens - before.num_draft_tokens,
                     after.num_accepted_tokens - before.num_accepted_tokens,
                     minus(after.accepted_per_pos, before.accepted_per_pos),
                     minus(after.drafted_per_pos, before.drafted_per_pos))


def spec_summary(stats: SpecStats | None) -> dict:
    """``acceptance_length`` and ``acceptance_rate`` (a fraction; None when nothing was drafted), and,
    when there were drafts, vLLM's ``spec_decode_*`` keys (its acceptance rate is in percent)."""
    if stats is None or stats.num_draft_tokens == 0:
        return {"acceptance_length": None, "acceptance_rate": None}
    rate = stats.num_accepted_tokens / stats.num_draft_tokens
    return {"acceptance_length": stats.acceptance_length, "acceptance_rate": rate,
            "spec_decode_acceptance_rate": 100 * rate, "spec_decode_acceptance_length": stats.acceptance_length,
            "spec_decode_num_drafts": stats.num_drafts, "spec_decode_draft_tokens": stats.num_draft_tokens,
            "spec_decode_accepted_tokens": stats.num_accepted_tokens,
            "spec_decode_per_position_acceptance_rates": stats.per_position_acceptance}


def report(res: dict, percentiles: tuple[float, ...] = (99,)) -> str:
    """The console report, laid out as ``vllm bench serve`` prints it."""
    lines = ["{:=^50}".format(" Serving Benchmark Result ")]

    def row(label, value, fmt="{:<10.2f}"):
        lines.append("{:<40} ".format(label) + fmt.format(value))

    row("Successful requests:", res["completed"], "{:<10}")
    row("Failed requests:", res["failed"], "{:<10}")
    if res.get("max_concurrency") is not None:
        row("Maximum request concurrency:", res["max_concurrency"], "{:<10}")
    row("Benchmark duration (s):", res["duration"])
    row("Total input tokens:", res["total_input_tokens"], "{:<10}")
    row("Total generated tokens:", res["total_output_tokens"], "{:<10}")
    row("Request throughput (req/s):", res["request_throughput"])
    row("Output token throughput (tok/s):", res["output_throughput"])
    row("Total token throughput (tok/s):", res["total_token_throughput"])
    for key, name, header in LATENCIES:
        lines.append("{:-^50}".format(header))
        row(f"Mean {name} (ms):", res[f"mean_{key}_ms"])
        row(f"Median {name} (ms):", res[f"median_{key}_ms"])
        for p in percentiles:
            row(f"P{p:g} {name} (ms):", res[f"p{p:g}_{key}_ms"])
    if "spec_decode_acceptance_length" in res:
        lines.append("{:-^50}".format("Speculative Decoding"))
        row("Acceptance rate (%):", res["spec_decode_acceptance_rate"])
        row("Acceptance length:", res["spec_decode_acceptance_length"])
        row("Drafts:", res["spec_decode_num_drafts"], "{:<10}")
        row("Draft tokens:", res["spec_decode_draft_tokens"], "{:<10}")
        row("Accepted tokens:", res["spec_decode_accepted_tokens"], "{:<10}")
        lines.append("Per-position acceptance (%):")
        for i, r in enumerate(res["spec_decode_per_position_acceptance_rates"]):
            row(f"  Position {i}:", 100 * r)
    lines.append("=" * 50)
    return "\n".join(lines)
