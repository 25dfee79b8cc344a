"""OpenAI-compatible HTTP API (the subset vLLM's clients use): completions, chat completions
(streamed or not, ``n`` choices, logprobs), models, health and Prometheus metrics; the playground page at
``/`` and its ``/v1/server_info`` (:mod:`peagle.serve.playground`).

Every error is an OpenAI error object: 400 for any request the server cannot take (never 422),
401, 404, 408, 413 and 431 past the limits on a client (:mod:`peagle.serve.limits`), 503 when the
queue or the connections are full, 500 for the requests an engine fault failed.

The routes are here, with the streams they run through the engine; what a request may ask is checked
in :mod:`peagle.serve.requests`, the answers are made in :mod:`peagle.serve.responses`."""
from __future__ import annotations

import asyncio
import functools
import json
import secrets
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator, Callable, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import Response, StreamingResponse
from fastapi.routing import APIRoute
from prometheus_client import generate_latest
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from peagle.engine.config import EngineConfig
from peagle.request_checks import RequestError
from peagle.serve.async_engine import AsyncEngine, Delta, EngineError, QueueFullError
from peagle.serve.limits import BodyLimit, ServerLimits, check_request
from peagle.serve.playground import mount_playground
from peagle.serve.requests import ChatRequest, CompletionRequest, GenerationRequest, Limits, choice_params
from peagle.serve.responses import DONE_EVENT, ErrorResponse, Formatter, Refusal, error, error_event


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {c: {"model": ErrorResponse, "description": "an OpenAI error object"} for c in codes}


def build_app(engine: AsyncEngine, model_name: str, api_key: str | None = None,
              server_limits: ServerLimits = ServerLimits()) -> FastAPI:
    """The app; uvicorn runs it with ``server_limits.uvicorn_kwargs()`` (the limits on connections)."""
    app = FastAPI(title="peagle", description="P-EAGLE speculative decoding server")
    app.router.route_class = _Route
    info = engine.info
    tok = info.tokenizer  # this process's copy (the engine process detokenizes with its own)
    limits = Limits(model_name, info.vocab_size, info.max_model_len, engine.max_queue + info.max_num_seqs)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(Refusal, _refused)
    app.add_middleware(BodyLimit, limits=server_limits)
    if api_key:  # outermost: a client without the key gets its 401 before its body is read
        app.add_middleware(_Auth, api_key=api_key)
    mount_playground(app, info, model_name)   # after _Auth: the page's files (no data) need no key
    app.openapi = functools.partial(_openapi, app)

    @app.get("/health", response_class=Response,
             responses={200: {"description": "the engine is running (empty body)"}, **_errors(503)})
    async def health():
        if not engine.alive:
            return error(503, "the engine process has stopped", "ServiceUnavailableError")
        return Response(status_code=200)

    @app.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}, **_errors(401)})
    async def metrics():
        return Response(generate_latest(engine.metrics.registry), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models", responses=_errors(401))
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": int(time.time()),
                                            "owned_by": "peagle", "max_model_len": info.max_model_len}]}

    post_responses = {200: {"content": {"text/event-stream": {}}}, **_errors(400, 401, 404, 408, 413, 500, 503)}

    @app.post("/v1/completions", responses=post_responses)
    async def completions(req: CompletionRequest, request: Request):
        check_request(req, server_limits, info.max_model_len)
        return await _generate(engine, limits, request, req, await _off_loop(req.prompts, tok))

    @app.post("/v1/chat/completions", responses=post_responses)
    async def chat(req: ChatRequest, request: Request):
        check_request(req, server_limits, info.max_model_len)
        return await _generate(engine, limits, request, req, [await _off_loop(req.prompt, tok)])

    return app


# JSON bodies are parsed, prompts templated and tokenized on this thread, not on the event loop, so a
# long one delays its own request, not /health or another stream's next token. One thread: more would
# take turns at the GIL with the event loop (the tokenizer lets go of it, JSON and templates do not),
# and the tokenizer is never used by two threads at once.
_WORKER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="peagle-parse")
_T = TypeVar("_T")


async def _off_loop(fn: Callable[..., _T], *args) -> _T:
    return await asyncio.get_running_loop().run_in_executor(_WORKER, fn, *args)


# Bodies of at least this many bytes are validated on :data:`_WORKER` too (pydantic takes ~15 ms for a
# 1.5M-integer prompt); smaller ones on the loop, where the hop to the thread would cost more than they do.
OFF_LOOP_VALIDATION_BYTES = 64 << 10


class _OffLoopRequest(Request):
    """A request whose JSON body is parsed on :data:`_WORKER` (8 MiB of JSON takes ~70 ms to parse) and, from
    :data:`OFF_LOOP_VALIDATION_BYTES` on, validated there as the route's body ``model``: FastAPI takes the model
    instance as it is. A large body that fails validation is handed on as parsed, for FastAPI to name every
    problem (so an invalid large body is validated twice, the second time on the loop)."""

    def __init__(self, scope, receive, model: type[BaseModel] | None = None):
        super().__init__(scope, receive)
        self._model = model

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = await _off_loop(self._parse, await self.body())
        return self._json

    def _parse(self, raw: bytes) -> Any:
        data = json.loads(raw)
        if self._model is None or len(raw) < OFF_LOOP_VALIDATION_BYTES:
            return data
        try:
            return self._model.model_validate(data)
        except ValidationError:
            return data


class _Route(APIRoute):
    """FastAPI's route, handing FastAPI an :class:`_OffLoopRequest` to read the body from (its model: the
    route's one body parameter's type, where it is a pydantic model)."""

    def get_route_handler(self) -> Callable:
        handle = super().get_route_handler()
        body = self.body_field.field_info.annotation if self.body_field is not None else None
        model = body if isinstance(body, type) and issubclass(body, BaseModel) else None

        async def handler(request: Request) -> Response:
            return await handle(_OffLoopRequest(request.scope, request.receive, model))
        return handler


async def _invalid(_, exc: RequestValidationError) -> Response:
    """A body that does not fit the schema: 400 (never FastAPI's 422), every problem named."""
    parts = [f"{'.'.join(str(x) for x in e['loc'] if x != 'body')}: {e['msg']}" for e in exc.errors()]
    return error(400, "; ".join(parts) or "invalid request")


async def _refused(_, r: Refusal) -> Response:
    return r.response()


async def _http(_, exc: StarletteHTTPException) -> Response:
    kind = {400: "BadRequestError", 404: "NotFoundError"}.get(exc.status_code, "Error")
    return error(exc.status_code, str(exc.detail), kind, exc.headers)


def _openapi(app: FastAPI) -> dict:
    """FastAPI's schema, with the 400 this server answers for invalid input in place of 422."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        for op in (op for path in schema["paths"].values() for op in path.values()):
            op["responses"].pop("422", None)
        for name in ("HTTPValidationError", "ValidationError"):
            schema.get("components", {}).get("schemas", {}).pop(name, None)
        app.openapi_schema = schema
    return app.openapi_schema


async def _generate(engine: AsyncEngine, limits: Limits, request: Request, req: GenerationRequest,
                    prompts: list[list[int]]):
    """Every choice of ``req`` through the engine: the whole answer, or its stream of events."""
    params = choice_params(req, prompts, limits)
    chat = isinstance(req, ChatRequest)
    fmt = Formatter(("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex, limits.model_name, chat,
                    req.num_logprobs is not None, sum(len(ids) for ids in prompts), len(params),
                    engine.info.method != "none",
                    [list(prompts[i // req.n]) for i in range(len(params))] if req.return_token_ids else None)
    streams = [engine.generate(prompts[i // req.n], p, f"{fmt.request_id}-{i}", req.stream)
               for i, p in enumerate(params)]
    # not streamed, the first delta is the whole answer: a client that leaves meanwhile aborts it
    firsts = await (_start(streams) if req.stream else _unless_disconnected(request, _start(streams)))
    if firsts is None:
        return Response(status_code=499)  # nobody reads it: the client has gone
    deltas = _replay(streams, firsts)
    if req.stream:
        return StreamingResponse(_events(fmt, deltas, req.include_usage), media_type="text/event-stream")
    try:
        done = await _unless_disconnected(request, _collect(deltas, len(streams)))
    except EngineError as e:
        raise Refusal(500, str(e), "InternalServerError") from None
    if done is None:
        return Response(status_code=499)  # nobody reads it: the client has gone
    return fmt.completion(done)


async def _start(streams: list[AsyncIterator[Delta]]) -> list[Delta]:
    """Submit every choice at once (they share the first step) and wait for its first delta; an
    engine that refuses one refuses the request."""
    firsts = await asyncio.gather(*(anext(s) for s in streams), return_exceptions=True)
    failed = next((f for f in firsts if isinstance(f, BaseException)), None)
    if failed is None:
        return firsts
    for s in streams:
        await s.aclose()
    if isinstance(failed, QueueFullError):
        raise Refusal(503, str(failed), "ServiceUnavailableError", {"Retry-After": "1"})
    if isinstance(failed, EngineError):
        raise Refusal(500, str(failed), "InternalServerError")
    if isinstance(failed, ValueError):
        raise Refusal(400, str(failed))
    raise failed


async def _replay(streams: list[AsyncIterator[Delta]], firsts: list[Delta]) -> AsyncIterator[tuple[int, Delta]]:
    """Every choice's deltas, the first ones first; closed early (a client gone), it aborts the unfinished ones."""
    try:
        for i, d in enumerate(firsts):
            yield i, d
        async for item in _merge(streams, [i for i, d in enumerate(firsts) if d.finish_reason is None]):
            yield item
    finally:
        for s in streams:
            await s.aclose()


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


async def _collect(deltas: AsyncIterator[tuple[int, Delta]], n: int) -> list[list[Delta]]:
    """Each of the ``n`` choices' deltas, in order."""
    out: list[list[Delta]] = [[] for _ in range(n)]
    async for i, d in deltas:
        out[i].append(d)
    return out


async def _events(fmt: Formatter, deltas: AsyncIterator[tuple[int, Delta]],
                  include_usage: bool) -> AsyncIterator[bytes]:
    """The SSE stream: an event per delta with something in it, the usage if asked for, ``[DONE]``;
    an engine fault after the 200 is an error event, and so is the request's own (a grammar's dead end)."""
    last: list[Delta | None] = [None] * fmt.num_choices
    try:
        async for i, d in deltas:
            last[i] = d
            if (event := fmt.chunk(i, d)) is not None:
                yield event
    except EngineError as e:
        yield error_event(500, str(e), "InternalServerError")
    except RequestError as e:
        yield error_event(400, str(e), "BadRequestError")
    else:
        if include_usage:
            yield fmt.usage_event(last)
    yield DONE_EVENT


class _Auth:
    """Bearer-token check on every path but /health (load balancers probe it without a key), so the
    metrics and the API's schema and docs need the key too (vLLM's ``--api-key`` covers /v1 only). The
    key is compared in constant time. Plain ASGI: Starlette's BaseHTTPMiddleware hides client disconnects."""
    OPEN = frozenset({"/health"})

    def __init__(self, app, api_key: str):
        self.app, self.expected = app, f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] not in self.OPEN:
            if not secrets.compare_digest(dict(scope["headers"]).get(b"authorization", b""), self.expected):
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
    engine chooses it each step); no config means P-EAGLE with the target's default head and ``"auto"`` K, the
    speculation ``peagle generate`` runs by default (vLLM's default is none: ``method: "none"`` serves the
    target alone); ``method: "ngram"`` (vLLM's) drafts from the text alone, no head. A missing ``model`` means
    the target's default head. ``speculative_token_tree``
    (vLLM's key: ``"chain"``, ``"auto"`` or an explicit list of rank paths) and peagle's
    ``speculative_tree_budget`` shape P-EAGLE's drafts (:class:`peagle.engine.llm_engine.EngineConfig`), and
    vLLM's n-gram keys ``prompt_lookup_max``/``prompt_lookup_min`` set the drafts from the text itself beside
    the head's (0: off), and peagle's ``response_lookup`` those from the target's earlier responses (``auto``,
    ``none`` or a table's path)."""
    lookup = {"prompt_lookup_max": EngineConfig.prompt_lookup_max, "prompt_lookup_min": EngineConfig.prompt_lookup_min}
    none = {"method": "none", "k": 1, "drafter": None, "speculative_token_tree": "chain", "speculative_tree_budget": 16,
            "response_lookup": "none", **lookup}
    try:
        cfg = {"parallel_drafting": True} if raw is None or raw == "" else json.loads(raw) if isinstance(raw, str) \
            else dict(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"--speculative-config is not valid JSON: {e}") from None
    if not isinstance(cfg, dict):
        raise ValueError("--speculative-config must be a JSON object")
    allowed = {"method", "model", "num_speculative_tokens", "parallel_drafting", "speculative_token_tree",
               "speculative_tree_budget", "response_lookup", *lookup}
    unknown = sorted(set(cfg) - allowed)
    if unknown:
        raise ValueError(f"unknown --speculative-config keys {unknown}; allowed: {sorted(allowed)}")
    method = cfg.get("method", "eagle3")
    if method == "none":
        return none
    if method not in ("eagle3", "ngram"):
        raise ValueError(f"speculative method {method!r} is not supported; use 'eagle3' (with "
                         "parallel_drafting for P-EAGLE), 'ngram' or 'none'")
    if method == "ngram" and (cfg.get("model") is not None or cfg.get("parallel_drafting")):
        raise ValueError("method 'ngram' drafts from the text alone: it takes no model and no parallel_drafting")
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
    responses = cfg.get("response_lookup", EngineConfig.response_lookup)
    if not isinstance(responses, str) or not responses:
        raise ValueError(f"response_lookup must be \"auto\", \"none\" or a table's path, got {responses!r}")
    for key in lookup:
        n = cfg.get(key, lookup[key])
        if not isinstance(n, int) or isinstance(n, bool):
            raise ValueError(f"{key} must be an integer, got {n!r}")
        lookup[key] = n
    return {"method": "ngram" if method == "ngram" else "parallel" if parallel else "eagle3", "k": k, "drafter": model,
            "speculative_token_tree": tree if isinstance(tree, str) else str([tuple(p) for p in tree]),
            "speculative_tree_budget": budget, "response_lookup": responses, **lookup}
