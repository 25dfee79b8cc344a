"""OpenAI-compatible HTTP API (the subset vLLM's clients use): completions, chat completions
(streamed or not), models, health and Prometheus metrics."""
from __future__ import annotations

import json
import time
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import generate_latest
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from peagle.engine.sampling import SamplingParams
from peagle.serve.async_engine import AsyncEngine, QueueFullError


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict | None = None
    ignore_eos: bool = False
    n: int = 1


class CompletionRequest(_Sampling):
    prompt: str | list[int]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: str
    content: str


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)


def error(status: int, message: str, kind: str = "BadRequestError", headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": status}},
                        status_code=status, headers=headers)


def build_app(engine: AsyncEngine, model_name: str, api_key: str | None = None) -> FastAPI:
    app = FastAPI(title="peagle", description="P-EAGLE speculative decoding server")
    llm = engine.engine

    @app.exception_handler(RequestValidationError)
    async def _invalid(_, exc: RequestValidationError):
        parts = [f"{'.'.join(str(x) for x in e['loc'] if x != 'body')}: {e['msg']}" for e in exc.errors()]
        return error(400, "; ".join(parts) or "invalid request")

    @app.exception_handler(StarletteHTTPException)
    async def _http(_, exc: StarletteHTTPException):
        return error(exc.status_code, str(exc.detail), "NotFoundError" if exc.status_code == 404 else "Error")

    @app.middleware("http")
    async def _auth(request: Request, call_next):
        if api_key and request.url.path.startswith("/v1/"):
            if request.headers.get("authorization") != f"Bearer {api_key}":
                return error(401, "invalid or missing API key", "AuthenticationError")
        return await call_next(request)

    @app.get("/health")
    async def health():
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics():
        return Response(generate_latest(engine.metrics.registry), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": int(time.time()),
                                            "owned_by": "peagle", "max_model_len": llm.max_model_len}]}

    def sampling(req: _Sampling, prompt_len: int, default_max: int | None) -> SamplingParams | JSONResponse:
        if req.n != 1:
            return error(400, "n must be 1")
        room = llm.max_model_len - prompt_len
        if room < 1:
            return error(400, f"the prompt has {prompt_len} tokens; this model's maximum context length is "
                              f"{llm.max_model_len}")
        max_tokens = req.max_tokens if req.max_tokens is not None else req.max_completion_tokens
        max_tokens = max_tokens if max_tokens is not None else min(default_max or room, room)
        if max_tokens < 1 or max_tokens > room:
            return error(400, f"max_tokens must be in 1..{room} (maximum context length {llm.max_model_len}, "
                              f"prompt {prompt_len} tokens), got {max_tokens}")
        stop = [req.stop] if isinstance(req.stop, str) else (req.stop or [])
        try:
            return SamplingParams(temperature=req.temperature, top_p=req.top_p, top_k=max(req.top_k, 0),
                                  max_tokens=max_tokens, seed=req.seed, stop=stop, ignore_eos=req.ignore_eos)
        except ValueError as e:
            return error(400, str(e))

    async def run(req: _Sampling, prompt_ids: list[int], default_max: int | None, chat: bool):
        if req.model is not None and req.model != model_name:
            return error(404, f"the model {req.model!r} does not exist; this server serves {model_name!r}",
                         "NotFoundError")
        if not prompt_ids:
            return error(400, "the prompt is empty")
        if max(prompt_ids) >= llm.target.cfg.vocab_size or min(prompt_ids) < 0:
            return error(400, f"prompt token ids must be in 0..{llm.target.cfg.vocab_size - 1}")
        params = sampling(req, len(prompt_ids), default_max)
        if isinstance(params, JSONResponse):
            return params
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        stream = engine.generate(prompt_ids, params, rid)
        try:
            first = await stream.__anext__()
        except QueueFullError as e:
            return error(503, str(e), "ServiceUnavailableError", {"Retry-After": "1"})
        except ValueError as e:
            return error(400, str(e))
        obj = "chat.completion" if chat else "text_completion"

        def usage(d):
            return {"prompt_tokens": d.num_prompt_tokens, "completion_tokens": d.num_output_tokens,
                    "total_tokens": d.num_prompt_tokens + d.num_output_tokens}

        def choice(text: str, finish, delta: bool):
            if not chat:
                return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
            body = {"role": "assistant", "content": text}
            return {"index": 0, ("delta" if delta else "message"): body, "finish_reason": finish}

        if not req.stream:
            last = first
            if last.finish_reason is None:
                async for last in stream:
                    pass
            return {"id": rid, "object": obj, "created": created, "model": model_name,
                    "choices": [choice(last.text, last.finish_reason, False)], "usage": usage(last)}

        async def events():
            sent = ""
            d = first
            while True:
                text = d.text if d.finish_reason else d.text.rstrip("\ufffd")  # hold back split characters
                piece = text[len(sent):] if text.startswith(sent) else ""
                sent = text if text.startswith(sent) else sent
                if piece or d.finish_reason:
                    chunk = {"id": rid, "object": obj + ".chunk" if chat else obj, "created": created,
                             "model": model_name, "choices": [choice(piece, d.finish_reason, True)]}
                    yield f"data: {json.dumps(chunk)}\n\n"
                if d.finish_reason:
                    if (req.stream_options or {}).get("include_usage"):
                        yield f"data: {json.dumps({'id': rid, 'object': obj, 'created': created, 'model': model_name, 'choices': [], 'usage': usage(d)})}\n\n"
                    yield "data: [DONE]\n\n"
                    return
                d = await stream.__anext__()

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest):
        tok = llm.tokenizer
        ids = req.prompt if isinstance(req.prompt, list) else tok(req.prompt)["input_ids"] if req.prompt else []
        return await run(req, ids, 16, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest):
        tok = llm.tokenizer
        if not tok.chat_template:
            return error(400, "this model has no chat template; use /v1/completions")
        return await run(req, llm.encode_prompt([m.model_dump() for m in req.messages]), None, chat=True)

    return app


def speculative_config(raw: str | dict | None) -> dict[str, Any]:
    """vLLM's ``--speculative-config`` -> ``method``, ``k`` and ``drafter`` for the engine.

    ``{"method": "eagle3", "model": DIR, "num_speculative_tokens": K, "parallel_drafting": true}`` is
    P-EAGLE; without ``parallel_drafting`` it is EAGLE-3; ``method: "none"`` or no config serves the
    target alone. A missing ``model`` means the target's default head."""
    if raw is None or raw == "":
        return {"method": "none", "k": 1, "drafter": None}
    try:
        cfg = json.loads(raw) if isinstance(raw, str) else dict(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"--speculative-config is not valid JSON: {e}") from None
    if not isinstance(cfg, dict):
        raise ValueError("--speculative-config must be a JSON object")
    allowed = {"method", "model", "num_speculative_tokens", "parallel_drafting"}
    unknown = sorted(set(cfg) - allowed)
    if unknown:
        raise ValueError(f"unknown --speculative-config keys {unknown}; allowed: {sorted(allowed)}")
    method = cfg.get("method", "eagle3")
    if method == "none":
        return {"method": "none", "k": 1, "drafter": None}
    if method != "eagle3":
        raise ValueError(f"speculative method {method!r} is not supported; use 'eagle3' (with "
                         "parallel_drafting for P-EAGLE) or 'none'")
    k = cfg.get("num_speculative_tokens", 7)
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"num_speculative_tokens must be an integer >= 1, got {k!r}")
    parallel = cfg.get("parallel_drafting", False)
    if not isinstance(parallel, bool):
        raise ValueError(f"parallel_drafting must be true or false, got {parallel!r}")
    model = cfg.get("model")
    if model is not None and not isinstance(model, str):
        raise ValueError("model must be a path or hub id")
    return {"method": "parallel" if parallel else "eagle3", "k": k, "drafter": model}
