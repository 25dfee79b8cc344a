"""What the playground's ``"token_origins": true`` costs a streamed request: one chat request at a time to a
running ``peagle serve``, alternately without and with the field (ABBA order, so a drift of the machine's
speed falls on both alike), each run's decode rate measured at the client. Printed: each kind's median and
best (other jobs only ever slow a run down), and the median of each pair's ratio (a pair runs back to back:
on a shared machine, other jobs slow both alike).

Decode rate: the completion's tokens but the first (the prompt's pass) over the time from the first event with
text to the last one. ``python benchmarks/origins_cost.py --port 8000 --runs 6``."""
from __future__ import annotations

import argparse
import json
import statistics
import time

import httpx

PROMPT = "Explain speculative decoding to a new engineer in three sentences."


def decode_rate(client: httpx.Client, url: str, body: dict) -> float:
    """One streamed request's tokens per second after its first token."""
    first = last = None
    tokens = 0
    with client.stream("POST", url, json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
            elif event["choices"] and event["choices"][0]["delta"].get("content"):
                now = time.perf_counter()
                first = now if first is None else first
                last = now
    return (tokens - 1) / (last - first)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--runs", type=int, default=6, help="requests of each kind")
    p.add_argument("--max-tokens", type=int, default=256)
    args = p.parse_args(argv)
    url = f"http://127.0.0.1:{args.port}/v1/chat/completions"
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": args.max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    rates: dict[bool, list[float]] = {False: [], True: []}
    with httpx.Client(timeout=600) as client:
        decode_rate(client, url, body)   # warm-up
        for i in range(args.runs):
            for origins in ((False, True) if i % 2 == 0 else (True, False)):
                rates[origins].append(decode_rate(client, url, {**body, "token_origins": origins}))
                print(f"token_origins={str(origins).lower():5} {rates[origins][-1]:.1f} tok/s", flush=True)
    without, with_ = statistics.median(rates[False]), statistics.median(rates[True])
    paired = statistics.median(b / a for a, b in zip(rates[False], rates[True]))
    best_without, best_with = max(rates[False]), max(rates[True])
    print(f"median without {without:.1f} tok/s, with {with_:.1f} tok/s: {with_ / without:.3f}x; best "
          f"{best_without:.1f} and {best_with:.1f} tok/s: {best_with / best_without:.3f}x; median of the pairs' "
          f"ratios {paired:.3f}x ({len(rates[False])} runs each, {args.max_tokens} tokens)")


if __name__ == "__main__":
    main()
