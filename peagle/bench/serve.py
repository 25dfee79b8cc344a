"""``peagle bench serve``: a streaming load client for any OpenAI-compatible server (``peagle serve``,
vLLM), with ``vllm bench serve``'s flags where they overlap, its metrics and its result keys.

Requests are streamed (SSE) through httpx, at most ``--max-concurrency`` at a time, arriving all at
once or as a Poisson/gamma process (``--request-rate``, ``--burstiness``). Speculation statistics
come from the server's ``/metrics`` read before and after the run (``vllm:`` or ``peagle:`` names).
The API key, as for vLLM, is taken from ``OPENAI_API_KEY``.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import sys
import time
from datetime import datetime
from pathlib import Path

from peagle.bench.workload import Workload, add_dataset_args, load_tokenizer_for, load_workload, messages
from peagle.prompts import encode, render


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", default=None, help="server URL, e.g. http://127.0.0.1:8000 (default: --host/--port)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--endpoint", default="/v1/completions",
                   help="/v1/completions (prompt rendered client-side) or /v1/chat/completions (messages)")
    p.add_argument("--backend", default="openai", choices=["openai", "vllm", "openai-chat"],
                   help="as vLLM's: openai and vllm stream /v1/completions, openai-chat /v1/chat/completions")
    p.add_argument("--model", default=None, help="model name or path (default: the server's first model)")
    p.add_argument("--served-model-name", default=None, help="the name sent in requests (default: --model)")
    p.add_argument("--tokenizer", default=None,
                   help="tokenizer for the chat template and token counts (default: --model, else the default model's)")
    add_dataset_args(p, vllm_output_flags=True)
    p.add_argument("--max-concurrency", type=int, default=None, help="requests in flight at most (default: no limit)")
    p.add_argument("--request-rate", type=float, default=float("inf"),
                   help="requests per second (default inf: all at once)")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of the arrival gaps (1: Poisson)")
    p.add_argument("--temperature", type=float, default=None, help="sent when given (else the server's default)")
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--long-prompts", type=int, default=0,
                   help="mix this many long prompts (the dataset's text run together) into the requests, at "
                        "seeded places; TTFT and E2EL are then also reported for short and long requests apart")
    p.add_argument("--long-prompt-len", type=int, default=4000, help="tokens of each long prompt")
    p.add_argument("--metric-percentiles", default="99", help="comma-separated percentiles of the latencies")
    p.add_argument("--label", default=None, help="prefix of the result file name (default: --backend)")
    p.add_argument("--save-result", action="store_true", help="write the results as JSON")
    p.add_argument("--save-detailed", action="store_true", help="with per-request lengths, times, texts and errors")
    p.add_argument("--result-dir", default=None)
    p.add_argument("--result-filename", default=None)
    p.add_argument("--metadata", nargs="*", metavar="KEY=VALUE", help="extra keys for the result JSON")
    p.add_argument("--disable-tqdm", action="store_true")


def main(args: argparse.Namespace) -> int:
    asyncio.run(run(args))
    return 0


async def run(args: argparse.Namespace) -> dict:
    import httpx

    from peagle.bench.metrics import report, summarize

    base = (args.base_url or f"http://{args.host}:{args.port}").rstrip("/")
    chat = args.endpoint.rstrip("/").endswith("chat/completions")
    if args.backend == "openai-chat" and not chat:
        raise ValueError("--backend openai-chat needs --endpoint /v1/chat/completions")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise ValueError("--max-concurrency must be >= 1")
    if args.request_rate <= 0 or args.burstiness <= 0:
        raise ValueError("--request-rate and --burstiness must be > 0")
    percentiles = tuple(float(x) for x in args.metric_percentiles.split(","))
    metadata = dict(kv.split("=", 1) for kv in args.metadata or [] if "=" in kv)
    if len(metadata) != len(args.metadata or []):
        raise ValueError("--metadata takes KEY=VALUE pairs")
    work = load_workload(args, args.dataset_name, args.dataset_path)
    tokenizer = load_tokenizer_for(args.tokenizer or args.model)
    if args.long_prompts:
        work = with_long_prompts(work, tokenizer, args.long_prompts, args.long_prompt_len, args.seed)
    headers = {"Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"} if os.environ.get("OPENAI_API_KEY") else {}
    limits = httpx.Limits(max_connections=args.max_concurrency, max_keepalive_connections=args.max_concurrency)
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=httpx.Timeout(6 * 3600.0),
                                 limits=limits) as client:
        listed = await first_model(client, base)  # reachable, and the key accepted, before any load
        model = args.model or listed
        before = await spec_counters(client)
        records, duration = await send_all(client, args, work, tokenizer, args.served_model_name or model, chat)
        after = await spec_counters(client)
    result = {"date": datetime.now().strftime("%Y%m%d-%H%M%S"), "backend": args.backend, "label": args.label,
              "model_id": model, "tokenizer_id": args.tokenizer or args.model, "dataset_name": work.name,
              "num_prompts": len(work.prompts), "request_rate": "inf" if args.request_rate == float("inf")
              else args.request_rate, "burstiness": args.burstiness, "max_concurrency": args.max_concurrency,
              **metadata}
    result.update(summarize(records, duration, percentiles))
    result.update(spec_result(before, after))
    if args.long_prompts:
        result.update(by_group(records, duration, percentiles))
    if args.save_detailed:
        result.update({"input_lens": [r.prompt_len for r in records], "output_lens": [r.output_tokens for r in records],
                       "ttfts": [r.ttft for r in records], "itls": [r.itl for r in records],
                       "latencies": [r.latency for r in records], "generated_texts": [r.text for r in records],
                       "errors": [r.error for r in records]})
    print(report(result, percentiles))
    if args.long_prompts:
        for group in ("short", "long"):
            print(f"{group} requests: {result[f'{group}_completed']}, TTFT median {result[f'{group}_median_ttft_ms']:.1f} ms, "
                  + ", ".join(f"P{p:g} {result[f'{group}_p{p:g}_ttft_ms']:.1f} ms" for p in percentiles)
                  + f"; E2EL median {result[f'{group}_median_e2el_ms']:.1f} ms")
    errors = [r.error for r in records if r.error]
    if errors:
        print(f"peagle: {len(errors)} requests failed; the first: {errors[0]}", file=sys.stderr)
    if args.save_result:
        path = result_path(args, model, result["date"])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result) + "\n")
        print(f"peagle: wrote {path}", file=sys.stderr)
    return result


def with_long_prompts(work: Workload, tokenizer, n: int, length: int, seed: int) -> Workload:
    """``work`` with ``n`` long prompts of ``length`` tokens (its own prompts' text, run together and
    asked to be summarised) put among its prompts at seeded places."""
    from peagle.prompts import Prompt

    if n < 0 or length < 1:
        raise ValueError("--long-prompts must be >= 0 and --long-prompt-len >= 1")
    text = "\n\n".join(p.text for p in work.prompts)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    ids = (ids * (length // max(len(ids), 1) + 1))[:length]
    body = "Summarize the following text.\n\n" + tokenizer.decode(ids)
    prompts = list(work.prompts)
    rng = random.Random(seed)
    for i in range(n):
        prompts.insert(rng.randrange(len(prompts) + 1), Prompt(f"long:{i}", "long", [body]))
    return dataclasses.replace(work, prompts=prompts)


def by_group(records, duration: float, percentiles: tuple[float, ...]) -> dict:
    """TTFT and E2EL statistics of the requests with the long prompts and of the others."""
    from peagle.bench.metrics import summarize

    out = {}
    for group, recs in (("short", [r for r in records if r.source != "long"]),
                        ("long", [r for r in records if r.source == "long"])):
        part = summarize(recs, duration, percentiles)
        out[f"{group}_completed"] = part["completed"]
        for key in ("ttft", "e2el"):
            for stat in ("mean", "median", *(f"p{p:g}" for p in percentiles)):
                out[f"{group}_{stat}_{key}_ms"] = part[f"{stat}_{key}_ms"]
    return out


async def first_model(client, base: str) -> str:
    """The first model the server lists; one clear error if it cannot be reached or refuses us."""
    import httpx

    try:
        r = await client.get("/v1/models")
    except httpx.HTTPError as e:
        raise ConnectionError(f"cannot reach the server at {base} ({type(e).__name__}: {e})") from None
    if r.status_code != 200:
        hint = "; set OPENAI_API_KEY" if r.status_code == 401 else ""
        raise ConnectionError(f"{base}/v1/models answered HTTP {r.status_code}{hint}")
    data = r.json().get("data") or []
    if not data:
        raise ConnectionError(f"the server at {base} lists no models")
    return data[0]["id"]


async def spec_counters(client):
    """The server's speculation counters, or None (no /metrics, or no speculation metrics)."""
    import httpx

    from peagle.bench.metrics import parse_spec_counters

    try:
        r = await client.get("/metrics")
    except httpx.HTTPError:
        return None
    return parse_spec_counters(r.text) if r.status_code == 200 else None


def spec_result(before, after) -> dict:
    from peagle.bench.metrics import spec_delta, spec_summary

    if before is None or after is None:
        return spec_summary(None)
    return spec_summary(spec_delta(after, before))


def arrival_times(n: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """Send times in seconds from the start: all 0 at rate inf, else gamma-distributed gaps (shape
    ``burstiness``; 1 is a Poisson process) scaled so that the last one lands at n / rate, as vLLM does."""
    if rate == float("inf"):
        return [0.0] * n
    import numpy as np

    gaps = np.random.default_rng(seed).gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)
    times = np.cumsum(gaps)
    return list(times * (n / rate) / times[-1])


async def send_all(client, args: argparse.Namespace, work: Workload, tokenizer, model: str, chat: bool):
    """Every conversation of the workload (each turn after the answer to the one before); returns
    (records in send order, wall seconds)."""
    from tqdm import tqdm

    from peagle.bench.metrics import RequestRecord

    limit = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else None
    sampling = {k: v for k, v in (("temperature", args.temperature), ("top_p", args.top_p), ("top_k", args.top_k))
                if v is not None}
    bar = tqdm(total=work.num_requests, desc="bench serve", unit="req", file=sys.stderr, disable=args.disable_tqdm)
    records: list[RequestRecord] = []

    async def conversation(turns: list[str], source: str, delay: float, t0: float):
        await asyncio.sleep(max(0.0, t0 + delay - time.perf_counter()))
        answers: list[str] = []
        for _ in turns:
            msgs = messages(turns, answers)
            body = {"model": model, "max_tokens": work.output_len, "stream": True,
                    "stream_options": {"include_usage": True}, **sampling}
            if args.ignore_eos:  # ignore_eos: vLLM and peagle; min_tokens: vLLM and llama.cpp
                body.update(ignore_eos=True, min_tokens=work.output_len)
            if chat:
                body["messages"] = msgs
                prompt_len = len(encode(tokenizer, msgs, True))  # the server's usage chunk corrects it
            else:
                body["prompt"] = render(tokenizer, msgs, work.chat)
                prompt_len = len(tokenizer(body["prompt"])["input_ids"])
            rec = RequestRecord(prompt_len=prompt_len, source=source, turn=len(answers))
            records.append(rec)
            if limit is None:
                await stream(client, args.endpoint, body, rec)
            else:
                async with limit:
                    await stream(client, args.endpoint, body, rec)
            if rec.success and not rec.output_tokens:  # no usage chunk: count the text
                rec.output_tokens = len(tokenizer(rec.text, add_special_tokens=False)["input_ids"])
            bar.update(1)
            if not rec.success:
                bar.update(len(turns) - len(answers) - 1)
                return
            answers.append(rec.text)

    delays = arrival_times(len(work.prompts), args.request_rate, args.burstiness, args.seed)
    t0 = time.perf_counter()
    await asyncio.gather(*(conversation(work.turns(p), p.source, d, t0) for p, d in zip(work.prompts, delays)))
    duration = time.perf_counter() - t0
    bar.close()
    return records, duration


async def stream(client, endpoint: str, body: dict, rec) -> None:
    """POST one streamed request and fold its SSE events into ``rec``; failures land in ``rec.error``."""
    import httpx

    rec.start_time = time.perf_counter()
    try:
        async with client.stream("POST", endpoint, json=body) as r:
            if r.status_code != 200:
                rec.error = f"HTTP {r.status_code}: {(await r.aread()).decode(errors='replace')[:300]}"
                return
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue  # blank separators, SSE comments
                data = line[len("data:"):].strip()
                if data == "[DONE]":
                    break
                rec.event(json.loads(data), time.perf_counter())
        if rec.ttft is None:
            rec.error = "the stream carried no output"
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        rec.error = f"{type(e).__name__}: {e}"


def result_path(args: argparse.Namespace, model: str, date: str) -> Path:
    """``--result-filename``, else vLLM's ``{label}-{rate}qps[-concurrency{C}]-{model}-{date}.json``,
    under ``--result-dir``."""
    conc = f"-concurrency{args.max_concurrency}" if args.max_concurrency is not None else ""
    name = args.result_filename or (f"{args.label or args.backend}-{args.request_rate}qps{conc}-"
                                    f"{model.rstrip('/').split('/')[-1]}-{date}.json")
    return Path(args.result_dir or ".") / name
