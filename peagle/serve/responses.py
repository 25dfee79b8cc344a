"""What the server answers, as OpenAI's clients read it: error objects, completions and chat
completions (whole or as server-sent events), their choices, logprobs and usage. Pure functions of the
engine's :class:`Delta` s, so they are tested without HTTP."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import orjson
from fastapi.responses import Response
from pydantic import BaseModel

from peagle.engine.sequence import SpecStats
from peagle.serve.engine_core import Delta

MIN_LOGPROB = -9999.0   # what -inf is sent as (JSON has no infinity)
DONE_EVENT = b"data: [DONE]\n\n"


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None
    code: int


class ErrorResponse(BaseModel):
    error: ErrorInfo


def error_body(status: int, message: str, kind: str) -> dict:
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


def error(status: int, message: str, kind: str = "BadRequestError", headers: dict | None = None) -> Response:
    """An OpenAI error object. ASCII JSON: a message may quote input that UTF-8 cannot encode."""
    return Response(json.dumps(error_body(status, message, kind)), status_code=status, headers=headers,
                    media_type="application/json")


class Refusal(Exception):
    """A request the server answers with an error object instead of running it (the app turns it into
    :func:`error`'s response wherever a route raises it)."""

    def __init__(self, status: int, message: str, kind: str = "BadRequestError", headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.headers = status, message, kind, headers

    def response(self) -> Response:
        return error(self.status, self.message, self.kind, self.headers)


@dataclass
class Formatter:
    """One request's response objects: the same id, creation time and model on every one; completions'
    ``text_offset`` counted on across a choice's stream."""
    request_id: str
    model: str
    chat: bool
    logprobs: bool            # whether the request asked for logprobs
    num_prompt_tokens: int    # every prompt's tokens, once each (not once per choice)
    num_choices: int
    spec_metrics: bool = False  # whether answers carry ``metrics.speculative_decoding`` (the engine speculates)
    prompt_ids: list[list[int]] | None = None  # each choice's prompt ids, where the request asked for token ids
    created: int = field(default_factory=lambda: int(time.time()))
    offsets: list[int] = field(init=False)   # completions' next text_offset, per choice
    started: set[int] = field(init=False)    # the choices a stream has sent an event of
    head: dict = field(init=False)           # every streamed event's first fields

    def __post_init__(self):
        self.offsets = [0] * self.num_choices
        self.started = set()
        self.head = {"id": self.request_id, "object": self.object + ".chunk" if self.chat else self.object,
                     "created": self.created, "model": self.model}

    @property
    def object(self) -> str:
        return "chat.completion" if self.chat else "text_completion"

    def usage(self, done: list[Delta]) -> dict:
        """Usage from each choice's last delta, with OpenAI's ``prompt_tokens_details.cached_tokens``: the prompt
        tokens read from the prefix cache (the choices of one prompt: the most any of them found)."""
        n = sum(d.num_output_tokens for d in done)
        return {"prompt_tokens": self.num_prompt_tokens, "completion_tokens": n,
                "total_tokens": self.num_prompt_tokens + n,
                "prompt_tokens_details": {"cached_tokens": max((d.num_cached_tokens for d in done), default=0)}}

    def metrics(self, done: list[Delta]) -> dict:
        """vLLM's per-request ``metrics.speculative_decoding`` over the choices ``done`` (their last deltas),
        with peagle's per-position counts: a request that opted out of speculation shows no rounds."""
        s = SpecStats()
        for d in done:
            if d.spec is not None:
                s.merge(d.spec)
        return {"speculative_decoding": {
            "num_spec_steps": s.num_drafts, "num_draft_tokens": s.num_draft_tokens,
            "num_accepted_draft_tokens": s.num_accepted_tokens, "mean_acceptance_length": s.acceptance_length,
            "draft_acceptance_rate": s.num_accepted_tokens / s.num_draft_tokens if s.num_draft_tokens else 0.0,
            "acceptance_histogram": s.histogram, "drafted_per_position": s.drafted_per_pos,
            "accepted_per_position": s.accepted_per_pos}}

    def logprobs_json(self, i: int, deltas: list[Delta]) -> dict | None:
        """OpenAI's logprobs object for the tokens of ``deltas`` (choice ``i``), None if not asked for."""
        if not self.logprobs:
            return None
        lps = [x for d in deltas for x in d.logprobs]
        texts = {t: s for d in deltas for t, s in d.token_texts.items()}
        if self.chat:
            def entry(t: int, lp: float) -> dict:
                return {"token": texts[t], "logprob": max(lp, MIN_LOGPROB), "bytes": list(texts[t].encode())}
            return {"content": [{**entry(x.token_id, x.logprob), "top_logprobs": [entry(t, v) for t, v in x.top]}
                                for x in lps]}
        tokens = [texts[x.token_id] for x in lps]
        text_offset = []
        for s in tokens:
            text_offset.append(self.offsets[i])
            self.offsets[i] += len(s)
        return {"tokens": tokens, "token_logprobs": [max(x.logprob, MIN_LOGPROB) for x in lps],
                "top_logprobs": [{texts[t]: max(v, MIN_LOGPROB) for t, v in x.top} for x in lps],
                "text_offset": text_offset}

    def choice(self, i: int, deltas: list[Delta], delta: bool) -> dict:
        """Choice ``i`` made of ``deltas``: a whole answer, or (``delta``) one streamed piece of it; with
        ``token_origins`` where the request asked (each token's text and how it came)."""
        text, finish, lps = "".join(d.text for d in deltas), deltas[-1].finish_reason, self.logprobs_json(i, deltas)
        if not self.chat:
            out = {"index": i, "text": text, "logprobs": lps, "finish_reason": finish}
        else:
            out = {"index": i, ("delta" if delta else "message"): {"role": "assistant", "content": text},
                   "logprobs": lps, "finish_reason": finish}
        if deltas[-1].tokens is not None:
            out["token_origins"] = [{"text": t, "origin": o} for d in deltas for t, o in d.tokens or ()]
        if self.prompt_ids is not None:  # vLLM's return_token_ids: completions name each choice's prompt
            out["token_ids"] = [t for d in deltas for t in d.token_ids]
            if not self.chat and not delta:
                out["prompt_token_ids"] = self.prompt_ids[i]
        return out

    def completion(self, deltas: list[list[Delta]]) -> dict:
        """The whole (not streamed) response: every choice's deltas."""
        last = [ds[-1] for ds in deltas]
        out = {"id": self.request_id, "object": self.object, "created": self.created, "model": self.model,
               "choices": [self.choice(i, ds, False) for i, ds in enumerate(deltas)], "usage": self.usage(last)}
        if self.prompt_ids is not None and self.chat:  # vLLM's return_token_ids: a chat's one prompt
            out["prompt_token_ids"] = self.prompt_ids[0]
        if self.spec_metrics:
            out["metrics"] = self.metrics(last)
        return out

    def event(self, body: dict) -> bytes:
        """One SSE event (orjson: a stream's events are most of the server's own work per token)."""
        return b"data: " + orjson.dumps({**self.head, **body}) + b"\n\n"

    def chunk(self, i: int, d: Delta) -> bytes | None:
        """The event for choice ``i``'s delta ``d``; None where it carries nothing to send. With token ids asked
        for, a choice's first event carries its prompt's too, as vLLM's do (chat: on the event; completions: on
        the choice)."""
        ids = self.prompt_ids is not None
        if not (d.text or d.finish_reason or d.logprobs or d.tokens or (ids and d.token_ids)):
            return None
        body = {"choices": [self.choice(i, [d], True)]}
        if ids and i not in self.started:
            self.started.add(i)
            (body if self.chat else body["choices"][0])["prompt_token_ids"] = self.prompt_ids[i]
        if d.finish_reason and self.spec_metrics:   # a choice's last event: its speculation
            body["metrics"] = self.metrics([d])
        return self.event(body)

    def usage_event(self, last: list[Delta]) -> bytes:
        extra = {"metrics": self.metrics(last)} if self.spec_metrics else {}
        return self.event({"choices": [], "usage": self.usage(last), **extra})


def error_event(status: int, message: str, kind: str) -> bytes:
    """An error object as an SSE event: a stream fails after its 200 has been sent."""
    return b"data: " + orjson.dumps(error_body(status, message, kind)) + b"\n\n"
