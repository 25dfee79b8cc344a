"""OpenAI-compatible HTTP API (the subset vLLM's clients use): completions, chat completions
(streamed or not, ``n`` choices, logprobs), models, health and Prometheus metrics.

Every error is an OpenAI error object: 400 for any request the server cannot take (never 422),
401, 404, 503 when the queue is full, 500 for the requests an engine fault failed."""
from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from typing import Annotated, Any, AsyncIterator

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import Response, StreamingResponse
from jinja2 import TemplateError
from prometheus_client import generate_latest
from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from peagle.engine.sampling import MAX_LOGPROBS, SamplingParams
from peagle.prompts import encode
from peagle.serve.async_engine import AsyncEngine, Delta, EngineError, QueueFullError

MAX_N = 16  # choices per request


def _utf8(s: str) -> str:
    s.encode("utf-8")  # a lone surrogate ("\ud800") raises UnicodeEncodeError, a ValueError: 400
    return s


Text = Annotated[str, AfterValidator(_utf8)]


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: Text | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = -1
    seed: int | None = Field(None, ge=-(2 ** 63), lt=2 ** 63)
    stop: Text | list[Text] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    n: int = Field(1, ge=1, le=MAX_N)


class CompletionRequest(_Sampling):
    prompt: Text | list[int] | list[Text] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Text
    text: Text | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Text
    content: Text | list[ContentPart]


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None
    code: int


class ErrorResponse(BaseModel):
    error: ErrorInfo


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {c: {"model": ErrorResponse, "description": "an OpenAI error object"} for c in codes}


def error_body(status: int, message: str, kind: str) -> dict:
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


def error(status: int, message: str, kind: str = "BadRequestError", headers: dict | None = None) -> Response:
    """An OpenAI error object. ASCII JSON: a message may quote input that UTF-8 cannot encode."""
    return Response(json.dumps(error_body(status, message, kind)), status_code=status, headers=headers,
                    media_type="application/json")


class _Refused(Exception):
    """A request the server answers with an error instead of running it."""

    def __init__(self, response: Response):
        self.response = response


async def _merge(streams: list[AsyncIterator[Delta]], live: list[int]) -> AsyncIterator[tuple[int, Delta]]:
    """(choice index, delta) from the ``live`` choices' streams as they come."""
    if len(live) == 1:  # the common case, without a task per delta
        async for d in streams[live[0]]:
            yield live[0], d
        return
    tasks = {asyncio.ensure_future(anext(streams[i])): i for i in live}
    try:
        while tasks:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for t in sorted(done, key=tasks.get):
                i = tasks.pop(t)
                d = t.result()  # the engine's error, if it failed the request
                if d.finish_reason is None:
                    tasks[asyncio.ensure_future(anext(streams[i]))] = i
                yield i, d
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def build_app(engine: AsyncEngine, model_name: str, api_key: str | None = None) -> FastAPI:
    app = FastAPI(title="peagle", description="P-EAGLE speculative decoding server")
    info = engine.info
    tok = info.tokenizer  # this process's copy (the engine process detokenizes with its own)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_, exc: RequestValidationError):
        parts = [f"{'.'.join(str(x) for x in e['loc'] if x != 'body')}: {e['msg']}" for e in exc.errors()]
        return error(400, "; ".join(parts) or "invalid request")

    @app.exception_handler(StarletteHTTPException)
    async def _http(_, exc: StarletteHTTPException):
        kind = {400: "BadRequestError", 404: "NotFoundError"}.get(exc.status_code, "Error")
        return error(exc.status_code, str(exc.detail), kind, exc.headers)

    if api_key:
        app.add_middleware(_Auth, api_key=api_key)

    def openapi() -> dict:
        """FastAPI's schema, with the 400 this server answers for invalid input in place of 422."""
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            for op in (op for path in schema["paths"].values() for op in path.values()):
                op["responses"].pop("422", None)
            for name in ("HTTPValidationError", "ValidationError"):
                schema.get("components", {}).get("schemas", {}).pop(name, None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi

    @app.get("/health", response_class=Response,
             responses={200: {"description": "the engine is running (empty body)"}, **_errors(503)})
    async def health():
        if not engine.alive:
            return error(503, "the engine process has stopped", "ServiceUnavailableError")
        return Response(status_code=200)

    @app.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
    async def metrics():
        return Response(generate_latest(engine.metrics.registry), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models", responses=_errors(401))
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": int(time.time()),
                                            "owned_by": "peagle", "max_model_len": info.max_model_len}]}

    def sampling(req: _Sampling, prompt_ids: list[int], default_max: int | None,
                 logprobs: int | None) -> SamplingParams:
        if not prompt_ids:
            raise _Refused(error(400, "the prompt is empty"))
        if max(prompt_ids) >= info.vocab_size or min(prompt_ids) < 0:
            raise _Refused(error(400, f"prompt token ids must be in 0..{info.vocab_size - 1}"))
        room = info.max_model_len - len(prompt_ids)
        if room < 1:
            raise _Refused(error(400, f"the prompt has {len(prompt_ids)} tokens; this model's maximum context "
                                      f"length is {info.max_model_len}"))
        max_tokens = req.max_tokens if req.max_tokens is not None else req.max_completion_tokens
        max_tokens = max_tokens if max_tokens is not None else min(default_max or room, room)
        if max_tokens > room:
            raise _Refused(error(400, f"max_tokens must be in 1..{room} (maximum context length "
                                      f"{info.max_model_len}, prompt {len(prompt_ids)} tokens), got {max_tokens}"))
        stop = [req.stop] if isinstance(req.stop, str) else (req.stop or [])
        try:
            return SamplingParams(temperature=req.temperature, top_p=req.top_p, top_k=max(req.top_k, 0),
                                  max_tokens=max_tokens, seed=req.seed, stop=stop, ignore_eos=req.ignore_eos,
                                  logprobs=logprobs)
        except ValueError as e:
            raise _Refused(error(400, str(e))) from None

    async def start(streams: list[AsyncIterator[Delta]]) -> list[Delta]:
        """Submit every choice at once (they share the first step) and wait for its first delta."""
        firsts = await asyncio.gather(*(anext(s) for s in streams), return_exceptions=True)
        failed = next((f for f in firsts if isinstance(f, BaseException)), None)
        if failed is None:
            return firsts
        for s in streams:
            await s.aclose()
        if isinstance(failed, QueueFullError):
            raise _Refused(error(503, str(failed), "ServiceUnavailableError", {"Retry-After": "1"}))
        if isinstance(failed, EngineError):
            raise _Refused(error(500, str(failed), "InternalServerError"))
        if isinstance(failed, ValueError):
            raise _Refused(error(400, str(failed)))
        raise failed

    async def run(request: Request, req: _Sampling, prompts: list[list[int]], default_max: int | None,
                  chat: bool, logprobs: int | None):
        if req.model is not None and req.model != model_name:
            return error(404, f"the model {req.model!r} does not exist; this server serves {model_name!r}",
                         "NotFoundError")
        room = engine.max_queue + info.max_num_seqs
        if len(prompts) * req.n > room:
            return error(400, f"{len(prompts)} prompts x n={req.n} choices are more than the {room} requests "
                              "the server takes at once")
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        try:
            params = [sampling(req, ids, default_max, logprobs) for ids in prompts]
            # choice i is sample i % n of prompt i // n; with a seed, sample j draws with seed + j
            choices = [dataclasses.replace(p, seed=p.seed + j if p.seed is not None else None)
                       for p in params for j in range(req.n)]
            streams = [engine.generate(prompts[i // req.n], p, f"{rid}-{i}", req.stream) for i, p in enumerate(choices)]
            # not streamed, the first delta is the whole answer: a client that leaves meanwhile aborts it
            firsts = await (start(streams) if req.stream else _unless_disconnected(request, start(streams)))
        except _Refused as r:
            return r.response
        if firsts is None:
            return Response(status_code=499)  # nobody reads it: the client has gone
        obj = "chat.completion" if chat else "text_completion"
        num_prompt_tokens = sum(len(ids) for ids in prompts)
        offsets = [0] * len(streams)  # completions' text_offset, per choice

        async def replay() -> AsyncIterator[tuple[int, Delta]]:
            """Every choice's deltas; closed early (a client gone), it aborts the unfinished ones."""
            try:
                for i, d in enumerate(firsts):
                    yield i, d
                async for item in _merge(streams, [i for i, d in enumerate(firsts) if d.finish_reason is None]):
                    yield item
            finally:
                for s in streams:
                    await s.aclose()

        def usage(done: list[Delta]) -> dict:
            n = sum(d.num_output_tokens for d in done)
            return {"prompt_tokens": num_prompt_tokens, "completion_tokens": n, "total_tokens": num_prompt_tokens + n}

        def lp_json(i: int, deltas: list[Delta]) -> dict | None:
            """OpenAI's logprobs object for the tokens of ``deltas`` (choice ``i``); -inf is sent as -9999."""
            if logprobs is None:
                return None
            lps = [x for d in deltas for x in d.logprobs]
            texts = {t: s for d in deltas for t, s in d.token_texts.items()}
            if chat:
                def entry(t: int, lp: float) -> dict:
                    return {"token": texts[t], "logprob": max(lp, -9999.0), "bytes": list(texts[t].encode())}
                return {"content": [{**entry(x.token_id, x.logprob), "top_logprobs": [entry(t, v) for t, v in x.top]}
                                    for x in lps]}
            tokens = [texts[x.token_id] for x in lps]
            text_offset = []
            for s in tokens:
                text_offset.append(offsets[i])
                offsets[i] += len(s)
            return {"tokens": tokens, "token_logprobs": [max(x.logprob, -9999.0) for x in lps],
                    "top_logprobs": [{texts[t]: max(v, -9999.0) for t, v in x.top} for x in lps],
                    "text_offset": text_offset}

        def choice(i: int, text: str, finish: str | None, lps: dict | None, delta: bool) -> dict:
            if not chat:
                return {"index": i, "text": text, "logprobs": lps, "finish_reason": finish}
            return {"index": i, ("delta" if delta else "message"): {"role": "assistant", "content": text},
                    "logprobs": lps, "finish_reason": finish}

        if not req.stream:
            async def collect() -> list[list[Delta]]:
                deltas: list[list[Delta]] = [[] for _ in streams]
                async for i, d in replay():
                    deltas[i].append(d)
                return deltas

            try:
                deltas = await _unless_disconnected(request, collect())
            except EngineError as e:
                return error(500, str(e), "InternalServerError")
            if deltas is None:
                return Response(status_code=499)  # nobody reads it: the client has gone
            out = [choice(i, "".join(d.text for d in ds), ds[-1].finish_reason, lp_json(i, ds), False)
                   for i, ds in enumerate(deltas)]
            return {"id": rid, "object": obj, "created": created, "model": model_name, "choices": out,
                    "usage": usage([ds[-1] for ds in deltas])}

        chunk_obj = obj + ".chunk" if chat else obj

        head = {"id": rid, "object": chunk_obj, "created": created, "model": model_name}

        def event(body: dict) -> bytes:
            """One SSE event (orjson: a stream's events are most of the server's own work per token)."""
            return b"data: " + orjson.dumps({**head, **body}) + b"\n\n"

        async def events():
            last: list[Delta | None] = [None] * len(streams)
            try:
                async for i, d in replay():
                    last[i] = d
                    if d.text or d.finish_reason or d.logprobs:
                        yield event({"choices": [choice(i, d.text, d.finish_reason, lp_json(i, [d]), True)]})
            except EngineError as e:
                yield b"data: " + orjson.dumps(error_body(500, str(e), "InternalServerError")) + b"\n\n"
            else:
                if req.stream_options is not None and req.stream_options.include_usage:
                    yield event({"choices": [], "usage": usage(last)})
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    post_responses = {200: {"content": {"text/event-stream": {}}}, **_errors(400, 401, 404, 500, 503)}

    @app.post("/v1/completions", responses=post_responses)
    async def completions(req: CompletionRequest, request: Request):
        p = req.prompt
        prompts = [p] if isinstance(p, str) or (p and isinstance(p[0], int)) or not p else p
        prompts = [tok(x)["input_ids"] if isinstance(x, str) else x for x in prompts]
        return await run(request, req, prompts, 16, chat=False, logprobs=req.logprobs)

    @app.post("/v1/chat/completions", responses=post_responses)
    async def chat(req: ChatRequest, request: Request):
        if not tok.chat_template:
            return error(400, "this model has no chat template; use /v1/completions")
        msgs = []
        for m in req.messages:
            parts = [m.content] if isinstance(m.content, str) else m.content
            if any(not isinstance(x, str) and (x.type != "text" or x.text is None) for x in parts):
                return error(400, "only text content parts ({\"type\": \"text\", \"text\": ...}) are supported")
            msgs.append({"role": m.role, "content": "\n".join(x if isinstance(x, str) else x.text for x in parts)})
        if req.top_logprobs is not None and not req.logprobs:
            return error(400, "top_logprobs needs logprobs: true")
        try:
            ids = encode(tok, msgs, True)
        except TemplateError as e:
            return error(400, f"the chat template refused these messages: {e}")
        return await run(request, req, [ids], None, chat=True,
                         logprobs=(req.top_logprobs or 0) if req.logprobs else None)

    return app


class _Auth:
    """Bearer-token check on /v1/ (plain ASGI: Starlette's BaseHTTPMiddleware hides client disconnects)."""

    def __init__(self, app, api_key: str):
        self.app, self.expected = app, f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            if dict(scope["headers"]).get(b"authorization") != self.expected:
                return await error(401, "invalid or missing API key", "AuthenticationError")(scope, receive, send)
        await self.app(scope, receive, send)


async def _unless_disconnected(request: Request, work):
    """Await ``work``; None if the client disconnects first (``work`` is cancelled: its requests abort)."""
    task = asyncio.ensure_future(work)
    while True:
        done, _ = await asyncio.wait({task}, timeout=0.25)
        if done:
            return task.result()
        if await request.is_disconnected():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return None


def speculative_config(raw: str | dict | None) -> dict[str, Any]:
    """vLLM's ``--speculative-config`` -> ``method``, ``k``, ``drafter`` and the tree's settings for the engine.

    ``{"method": "eagle3", "model": DIR, "num_speculative_tokens": K, "parallel_drafting": true}`` is
    P-EAGLE; without ``parallel_drafting`` it is EAGLE-3; K may be ``"auto"`` (the default: the
    engine chooses it each step); ``method: "none"`` or no config serves the
    target alone. A missing ``model`` means the target's default head. ``speculative_token_tree``
    (vLLM's key: ``"chain"``, ``"auto"`` or an explicit list of rank paths) and peagle's
    ``speculative_tree_budget`` shape P-EAGLE's drafts (:class:`peagle.engine.llm_engine.EngineConfig`)."""
    none = {"method": "none", "k": 1, "drafter": None, "speculative_token_tree": "chain", "speculative_tree_budget": 16}
    if raw is None or raw == "":
        return none
    try:
        cfg = json.loads(raw) if isinstance(raw, str) else dict(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"--speculative-config is not valid JSON: {e}") from None
    if not isinstance(cfg, dict):
        raise ValueError("--speculative-config must be a JSON object")
    allowed = {"method", "model", "num_speculative_tokens", "parallel_drafting", "speculative_token_tree",
               "speculative_tree_budget"}
    unknown = sorted(set(cfg) - allowed)
    if unknown:
        raise ValueError(f"unknown --speculative-config keys {unknown}; allowed: {sorted(allowed)}")
    method = cfg.get("method", "eagle3")
    if method == "none":
        return none
    if method != "eagle3":
        raise ValueError(f"speculative method {method!r} is not supported; use 'eagle3' (with "
                         "parallel_drafting for P-EAGLE) or 'none'")
    k = cfg.get("num_speculative_tokens", "auto")
    if k != "auto" and (not isinstance(k, int) or isinstance(k, bool) or k < 1):
        raise ValueError(f"num_speculative_tokens must be an integer >= 1 or \"auto\", got {k!r}")
    parallel = cfg.get("parallel_drafting", False)
    if not isinstance(parallel, bool):
        raise ValueError(f"parallel_drafting must be true or false, got {parallel!r}")
    model = cfg.get("model")
    if model is not None and not isinstance(model, str):
        raise ValueError("model must be a path or hub id")
    tree = cfg.get("speculative_token_tree", "chain")
    if not isinstance(tree, (str, list)):
        raise ValueError(f"speculative_token_tree must be \"chain\", \"auto\" or a list of rank paths, got {tree!r}")
    budget = cfg.get("speculative_tree_budget", 16)
    if not isinstance(budget, int) or isinstance(budget, bool):
        raise ValueError(f"speculative_tree_budget must be an integer, got {budget!r}")
    return {"method": "parallel" if parallel else "eagle3", "k": k, "drafter": model,
            "speculative_token_tree": tree if isinstance(tree, str) else str([tuple(p) for p in tree]),
            "speculative_tree_budget": budget}
