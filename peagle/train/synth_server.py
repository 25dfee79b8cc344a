"""``peagle synth --server URL``: the responses written by the engine users serve the target with (vLLM,
SGLang, ``llama-server``, ``peagle serve``: any OpenAI-compatible server), in the shards and records the
in-process ``peagle synth`` writes (:mod:`peagle.train.synth`), resumable the same way.

Requests run ``concurrency`` at a time. A request that fails for a reason that may pass (the connection, a
timeout, HTTP 408, 429 or 5xx) is retried ``retries`` times after growing waits (``backoff`` seconds,
doubled each time, or the server's ``Retry-After``); one that still fails, or fails for good (another 4xx:
say, a prompt longer than the server's context), is appended to ``failed.jsonl`` with its error and
reported at the end, and the run goes on. A re-run tries the failed ones again.

Token ids are the target's own. Where the server returns the ids it generated (vLLM with
``return_token_ids``, which every request asks for, servers that do not know the field ignore it), those
are kept: they are exactly the sequence the target produced, where re-tokenizing the text can give another
(a word generated in two pieces comes back as one). Elsewhere the prompt is encoded with the target's
tokenizer and chat template, as the in-process engine encodes it, and the response's text is tokenized
with it, plus the EOS token when the response ended on one (``finish_reason`` "stop": synth sets no stop
strings), as the engine's records end.
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from peagle.prompts import encode, render
from peagle.train.synth import Job, ShardWriter, SynthRun, plan

FAILED = "failed.jsonl"
RETRY_STATUS = {408, 429}   # and every 5xx


@dataclass
class ServerConfig:
    """How to reach the server and how hard to try."""
    url: str
    model: str | None = None       # default: the first model the server lists
    api_key: str | None = None
    concurrency: int = 32
    retries: int = 4
    backoff: float = 1.0           # seconds before the first retry; doubled after each
    timeout: float = 600.0         # seconds for one request

    def __post_init__(self):
        if self.concurrency < 1 or self.retries < 0 or self.backoff < 0 or self.timeout <= 0:
            raise ValueError("concurrency must be >= 1, retries and backoff >= 0, and timeout > 0")
        self.url = self.url.rstrip("/").removesuffix("/v1")


class RequestFailed(Exception):
    def __init__(self, message: str, attempts: int):
        super().__init__(message)
        self.attempts = attempts


def _retryable(status: int) -> bool:
    return status in RETRY_STATUS or status >= 500


def _wait(server: ServerConfig, attempt: int, resp: httpx.Response | None) -> float:
    """Seconds before retry ``attempt`` (0-based): the server's Retry-After where it gives one, else the
    backoff doubled per attempt, with up to a quarter more at random so that requests that failed together
    do not all come back together."""
    after = resp.headers.get("retry-after") if resp is not None else None
    if after is not None and after.replace(".", "", 1).isdigit():
        return min(float(after), 60.0)
    return server.backoff * 2 ** attempt * (1 + random.random() / 4)


async def _post(client: httpx.AsyncClient, server: ServerConfig, path: str, body: dict) -> dict:
    """The server's JSON answer to ``body``, retried as the module docstring says; RequestFailed after."""
    for attempt in range(server.retries + 1):
        resp = None
        try:
            resp = await client.post(path, json=body)
            if resp.status_code == 200:
                return resp.json()
            error = f"HTTP {resp.status_code}: {resp.text[:300]}"
            if not _retryable(resp.status_code):
                raise RequestFailed(error, attempt + 1)
        except (httpx.TransportError, json.JSONDecodeError) as e:
            error = f"{type(e).__name__}: {e}"
        if attempt < server.retries:
            await asyncio.sleep(_wait(server, attempt, resp))
    raise RequestFailed(error, server.retries + 1)


async def _served_model(client: httpx.AsyncClient, server: ServerConfig) -> str:
    """The model to ask for: ``server.model``, else the first the server lists. Also a check, before any
    prompt is sent, that an OpenAI-compatible server answers at all."""
    try:
        resp = await client.get("/v1/models")
        resp.raise_for_status()
        models = [m["id"] for m in resp.json()["data"]]
    except (httpx.HTTPError, KeyError, TypeError, json.JSONDecodeError) as e:
        raise ConnectionError(f"no OpenAI-compatible server answers at {server.url} (GET /v1/models: "
                              f"{type(e).__name__}: {e})") from None
    if server.model is not None:
        return server.model
    if not models:
        raise ConnectionError(f"the server at {server.url} lists no models; name one with --model")
    return models[0]


def synthesize_server(server: ServerConfig, tokenizer, prompt_files: list[str], out_dir: str | os.PathLike,
                      num_prompts: int | None = None, max_new_tokens: int = 512, temperature: float = 0.0,
                      seed: int = 0, shard_size: int = 2000, progress: bool = True, turns: int = 1,
                      samples: int = 1, sample_temperature: float = 0.7, chat: bool = True) -> SynthRun:
    """:func:`peagle.train.synth.synthesize` through a server: the same prompts, records, shards and
    resumption; ``tokenizer`` is the target's. Returns what this run wrote, ``failed`` counting the requests
    that failed (each in ``failed.jsonl``)."""
    out = Path(out_dir)
    work = plan(prompt_files, out, num_prompts, seed, turns, samples, sample_temperature)
    settings = {"server": server.url, "prompt_files": [str(f) for f in prompt_files], "num_prompts": work.num_prompts,
                "seed": seed, "max_new_tokens": max_new_tokens, "temperature": temperature, "turns": turns,
                "samples": samples, "sample_temperature": sample_temperature, "concurrency": server.concurrency,
                "chat": chat}
    failures: list[dict] = []

    def request(model: str, job: Job) -> tuple[str, dict]:
        body = {"model": model, "max_tokens": max_new_tokens, "seed": job.seed(seed), "return_token_ids": True,
                "temperature": temperature if job.sample == 0 else sample_temperature}
        if chat:
            return "/v1/chat/completions", {**body, "messages": job.messages()}
        return "/v1/completions", {**body, "prompt": render(tokenizer, job.messages(), chat=False)}

    def record(job: Job, answer: dict) -> dict:
        choice = answer["choices"][0]
        text = choice["message"]["content"] if chat else choice["text"]
        finish = choice.get("finish_reason") or "length"
        prompt = choice.get("prompt_token_ids") or answer.get("prompt_token_ids")  # completions' / chat's place
        if choice.get("token_ids") is not None and prompt is not None:
            prompt_ids, ids = list(prompt), list(choice["token_ids"])
        else:
            prompt_ids = encode(tokenizer, job.messages(), chat)
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            if finish == "stop" and tokenizer.eos_token_id is not None:
                ids.append(tokenizer.eos_token_id)
        return job.record(text, prompt_ids, ids, finish)

    async def one(client: httpx.AsyncClient, model: str, job: Job) -> tuple[Job, dict | RequestFailed]:
        try:
            answer = await _post(client, server, *request(model, job))
            return job, record(job, answer)
        except RequestFailed as e:
            return job, e
        except (KeyError, IndexError, TypeError) as e:   # a 200 that is no completion
            return job, RequestFailed(f"unexpected answer ({type(e).__name__}: {e})", 1)

    async def run_all(writer: ShardWriter) -> None:
        headers = {"Authorization": f"Bearer {server.api_key}"} if server.api_key else {}
        limits = httpx.Limits(max_connections=server.concurrency, max_keepalive_connections=server.concurrency)
        async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=server.timeout,
                                     limits=limits) as client:
            model = await _served_model(client, server)
            queue, live = list(reversed(work.todo)), set()
            while queue or live:
                while queue and len(live) < server.concurrency:
                    live.add(asyncio.ensure_future(one(client, model, queue.pop())))
                finished, live = await asyncio.wait(live, return_when=asyncio.FIRST_COMPLETED)
                for task in finished:
                    job, result = task.result()
                    if isinstance(result, RequestFailed):
                        failures.append({"id": job.id, "error": str(result), "attempts": result.attempts,
                                         "time": time.strftime("%Y-%m-%dT%H:%M:%S")})
                        with open(out / FAILED, "a") as fh:
                            fh.write(json.dumps(failures[-1]) + "\n")
                        continue
                    writer.write(result)
                    if work.more_turns(job):  # the conversation goes on next
                        queue.append(job.next(result["response"]))

    writer = ShardWriter(out, work, shard_size, progress, settings)
    try:
        asyncio.run(run_all(writer))
    finally:
        writer.run.failed = len(failures)
        run = writer.close()
        if failures:
            shown = "; ".join(f"{f['id']}: {f['error'][:120]}" for f in failures[:5])
            print(f"peagle: {len(failures)} request(s) failed after retries, listed in {out / FAILED} (a re-run "
                  f"tries them again): {shown}{' ...' if len(failures) > 5 else ''}", file=sys.stderr)
    return run
