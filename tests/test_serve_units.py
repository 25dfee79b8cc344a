"""The server's request checks and response objects, called directly (no HTTP, no engine): what a
request may ask, the error each refusal gets, and the JSON and SSE bytes a client reads."""
from __future__ import annotations

import dataclasses
import json

import pytest
from jinja2 import TemplateError

from peagle.engine.sampling import TokenLogprob
from peagle.request_checks import RequestError, check_prompt
from peagle.serve.engine_core import Delta
from peagle.serve.requests import ChatRequest, CompletionRequest, Limits, choice_params, sampling_params
from peagle.serve.responses import DONE_EVENT, Formatter, Refusal, error_event

LIMITS = Limits(model_name="tiny", vocab_size=100, max_model_len=32, max_requests=4)


class Tokenizer:
    """Characters as token ids (``ord(c) % 100``); a chat template that joins the turns, or refuses."""

    def __init__(self, template: str | None = "chat", refuse: bool = False):
        self.chat_template, self.refuse = template, refuse

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": [ord(c) % 100 for c in text]}

    def apply_chat_template(self, msgs, tokenize, add_generation_prompt):
        if self.refuse:
            raise TemplateError("roles must alternate")
        return "|".join(f"{m['role']}:{m['content']}" for m in msgs) + "|assistant:"


def refusal(fn, *args) -> Refusal:
    with pytest.raises(Refusal) as e:
        fn(*args)
    return e.value


def test_check_prompt_is_the_one_set_of_prompt_checks():
    assert check_prompt([1, 2, 3], 100, 32) == 29   # the room left for new tokens
    for ids, words in (([], "empty"), ([1, 100], "0..99"), ([-1], "0..99"), ([1] * 32, "32 tokens; this model's "
                                                                                      "maximum context length is 32")):
        with pytest.raises(RequestError, match=words):
            check_prompt(ids, 100, 32)
    with pytest.raises(RequestError, match="0..99"):   # ids are checked before length
        check_prompt([100] * 40, 100, 32)


def test_sampling_params_defaults_and_limits():
    p = sampling_params(CompletionRequest(prompt="x"), [1] * 4, LIMITS)
    assert (p.max_tokens, p.temperature, p.top_k, p.stop, p.logprobs) == (16, 1.0, 0, [], None)  # OpenAI's 16
    assert sampling_params(CompletionRequest(prompt="x"), [1] * 20, LIMITS).max_tokens == 12     # within the room
    assert sampling_params(ChatRequest(messages=[{"role": "user", "content": "x"}]), [1] * 4, LIMITS).max_tokens == 28
    p = sampling_params(CompletionRequest(prompt="x", max_completion_tokens=5, stop="\n", top_k=7, logprobs=2,
                                          seed=3), [1], LIMITS)
    assert (p.max_tokens, p.stop, p.top_k, p.logprobs, p.seed) == (5, ["\n"], 7, 2, 3)
    both = CompletionRequest(prompt="x", max_tokens=4, max_completion_tokens=9)
    assert sampling_params(both, [1], LIMITS).max_tokens == 4
    r = refusal(sampling_params, CompletionRequest(prompt="x", max_tokens=30), [1] * 4, LIMITS)
    assert (r.status, r.kind, r.message) == (400, "BadRequestError", "max_tokens must be in 1..28 (maximum context "
                                                                     "length 32, prompt 4 tokens), got 30")
    assert refusal(sampling_params, CompletionRequest(prompt="x"), [], LIMITS).message == "the prompt is empty"
    assert refusal(sampling_params, CompletionRequest(prompt="x", stop=["a", ""]), [1], LIMITS).message == \
        "stop must be a list of non-empty strings"


def test_chat_logprobs_ask_for_alternatives_only_with_logprobs():
    chat = {"messages": [{"role": "user", "content": "x"}]}
    assert ChatRequest(**chat).num_logprobs is None
    assert ChatRequest(**chat, logprobs=True).num_logprobs == 0
    assert ChatRequest(**chat, logprobs=True, top_logprobs=3).num_logprobs == 3
    r = refusal(ChatRequest(**chat, top_logprobs=3).prompt, Tokenizer())
    assert (r.status, r.message) == (400, "top_logprobs needs logprobs: true")


def test_choices_checked_in_order_and_seeded_per_sample():
    req = CompletionRequest(prompt=["a", "b", "c"], n=2, model="other")
    r = refusal(choice_params, req, [[1], [2], [3]], LIMITS)   # the model before the room
    assert (r.status, r.kind) == (404, "NotFoundError") and "'other'" in r.message and "'tiny'" in r.message
    r = refusal(choice_params, CompletionRequest(prompt=["a", "b", "c"], n=2), [[1], [2], [3]], LIMITS)
    assert (r.status, r.message) == (400, "3 prompts x n=2 choices are more than the 4 requests the server takes "
                                          "at once")
    params = choice_params(CompletionRequest(prompt=["a", "b"], n=2, seed=10, max_tokens=2), [[1], [2, 3]], LIMITS)
    assert [p.seed for p in params] == [10, 11, 10, 11]
    assert [p.seed for p in choice_params(CompletionRequest(prompt="a", n=2), [[1]], LIMITS)] == [None, None]


def test_prompts_from_completions_and_chats():
    tok = Tokenizer()
    assert CompletionRequest(prompt="ab").prompts(tok) == [[97, 98]]
    assert CompletionRequest(prompt=[5, 6]).prompts(tok) == [[5, 6]]
    assert CompletionRequest(prompt=["a", "b"]).prompts(tok) == [[97], [98]]
    assert CompletionRequest(prompt=[[5], [6, 7]]).prompts(tok) == [[5], [6, 7]]
    assert CompletionRequest(prompt=[]).prompts(tok) == [[]]   # refused later, as an empty prompt
    text = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    parts = ChatRequest(messages=[{"role": "user", "content": text}])
    assert parts.prompt(tok) == tok("user:a\nb|assistant:")["input_ids"]
    image = ChatRequest(messages=[{"role": "user", "content": [{"type": "image_url"}]}])
    assert "only text content parts" in refusal(image.prompt, tok).message
    plain = ChatRequest(messages=[{"role": "user", "content": "a"}])
    assert "no chat template" in refusal(plain.prompt, Tokenizer(template=None)).message
    assert refusal(plain.prompt, Tokenizer(refuse=True)).message == \
        "the chat template refused these messages: roles must alternate"


def delta(ids: list[int], finish: str | None = None, lps: bool = False, total: int = 0) -> Delta:
    text = "".join(chr(96 + t) for t in ids)
    """Tokens 1, 2, ... read a, b, ...; token 2's logprob is -inf; each token's runner-up is 9 ("i")."""
    if not lps:
        return Delta(ids, text, finish, 3, total or len(ids), [], {})
    logprobs = [TokenLogprob(t, float("-inf") if t == 2 else -0.5, [(t, -0.5), (9, -3.0)]) for t in ids]
    return Delta(ids, text, finish, 3, total or len(ids), logprobs, {t: chr(96 + t) for t in [*ids, 9]})


def test_a_whole_completion_and_chat_completion():
    fmt = Formatter("cmpl-1", "tiny", chat=False, logprobs=True, num_prompt_tokens=3, num_choices=2, created=7)
    body = fmt.completion([[delta([1, 2], lps=True), delta([3], "length", lps=True, total=3)],
                           [delta([4], "stop", lps=True)]])
    assert body["id"] == "cmpl-1" and body["object"] == "text_completion" and body["created"] == 7
    first = body["choices"][0]
    assert (first["text"], first["finish_reason"]) == ("abc", "length")
    assert first["logprobs"] == {"tokens": ["a", "b", "c"], "token_logprobs": [-0.5, -9999.0, -0.5],
                                 "top_logprobs": [{"a": -0.5, "i": -3.0}, {"b": -0.5, "i": -3.0},
                                                  {"c": -0.5, "i": -3.0}], "text_offset": [0, 1, 2]}
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7,
                             "prompt_tokens_details": {"cached_tokens": 0}}
    kept = dataclasses.replace(delta([4], "stop"), num_cached_tokens=16)   # one choice found its prompt kept
    assert fmt.usage([delta([3], "stop"), kept])["prompt_tokens_details"] == {"cached_tokens": 16}
    chat = Formatter("chatcmpl-1", "tiny", chat=True, logprobs=False, num_prompt_tokens=3, num_choices=1, created=7)
    body = chat.completion([[delta([1]), delta([2], "stop")]])
    assert body["object"] == "chat.completion"
    assert body["choices"] == [{"index": 0, "message": {"role": "assistant", "content": "ab"}, "logprobs": None,
                                "finish_reason": "stop"}]


def test_stream_events():
    fmt = Formatter("cmpl-1", "tiny", chat=False, logprobs=True, num_prompt_tokens=3, num_choices=1, created=7)
    events = [fmt.chunk(0, delta([1], lps=True)), fmt.chunk(0, delta([], lps=True)),
              fmt.chunk(0, delta([2], "length", lps=True))]
    assert events[1] is None   # nothing to send
    first, last = (json.loads(e.removeprefix(b"data: ")) for e in (events[0], events[2]))
    assert first["object"] == "text_completion" and first["choices"][0]["finish_reason"] is None
    assert last["choices"][0]["logprobs"]["text_offset"] == [1]   # counted on from the first event
    assert all(e.endswith(b"\n\n") for e in (events[0], events[2]))
    chat = Formatter("chatcmpl-1", "tiny", chat=True, logprobs=True, num_prompt_tokens=3, num_choices=1, created=7)
    event = json.loads(chat.chunk(0, delta([1], lps=True)).removeprefix(b"data: "))
    assert event["object"] == "chat.completion.chunk"
    assert event["choices"][0]["delta"] == {"role": "assistant", "content": "a"}
    assert event["choices"][0]["logprobs"]["content"][0] == {
        "token": "a", "logprob": -0.5, "bytes": [97],
        "top_logprobs": [{"token": "a", "logprob": -0.5, "bytes": [97]},
                         {"token": "i", "logprob": -3.0, "bytes": [105]}]}
    usage = json.loads(chat.usage_event([delta([1, 2], "stop", total=2)]).removeprefix(b"data: "))
    assert usage["choices"] == [] and usage["usage"]["total_tokens"] == 5
    assert json.loads(error_event(500, "boom", "InternalServerError").removeprefix(b"data: ")) == \
        {"error": {"message": "boom", "type": "InternalServerError", "param": None, "code": 500}}
    assert DONE_EVENT == b"data: [DONE]\n\n"


def test_a_refusal_is_an_openai_error_object():
    r = Refusal(503, "the request queue is full", "ServiceUnavailableError", {"Retry-After": "1"}).response()
    assert r.status_code == 503 and r.headers["retry-after"] == "1" and r.media_type == "application/json"
    assert json.loads(r.body) == {"error": {"message": "the request queue is full", "type": "ServiceUnavailableError",
                                            "param": None, "code": 503}}


def test_the_sampling_fields_clients_send_reach_the_engine():
    req = CompletionRequest(prompt="x", logit_bias={"5": -100, "99": 2.5}, presence_penalty=0.5, frequency_penalty=-1,
                            repetition_penalty=1.2, min_tokens=3, speculative=False)
    p = sampling_params(req, [1], LIMITS)
    assert (p.logit_bias, p.presence_penalty, p.frequency_penalty, p.repetition_penalty, p.min_tokens,
            p.speculative) == ({5: -100, 99: 2.5}, 0.5, -1, 1.2, 3, False)
    for bias in ({"100": 1.0}, {"-1": 1.0}, {"a": 1.0}):
        assert refusal(sampling_params, CompletionRequest(prompt="x", logit_bias=bias), [1], LIMITS).message == \
            f"logit_bias: {next(iter(bias))!r} is not a token id in 0..99"
    assert "min_tokens" in refusal(sampling_params, CompletionRequest(prompt="x", min_tokens=20, max_tokens=5), [1],
                                   LIMITS).message


@pytest.mark.parametrize("field, value", [("tools", [{"type": "function"}]), ("echo", True), ("best_of", 3),
                                          ("suffix", "end"), ("min_p", 0.1), ("stop_token_ids", [3])])
def test_fields_the_server_cannot_honour_are_refused_by_name(field, value):
    from pydantic import ValidationError
    with pytest.raises(ValidationError, match=f"{field} is not supported"):
        CompletionRequest(prompt="x", **{field: value})
    CompletionRequest(prompt="x", **{field: {"tools": [], "echo": False, "best_of": 1, "suffix": "", "min_p": 0,
                                             "stop_token_ids": []}[field]})   # the values that ask for nothing


def test_answers_carry_the_requests_speculation():
    from peagle.engine.sequence import SpecStats
    s = SpecStats()
    for accepted in (3, 0, 2):
        s.record([1, 1, 1], accepted)
    fmt = Formatter("cmpl-1", "tiny", False, False, 3, 1, spec_metrics=True)
    done = Delta([1, 2], "ab", "length", 3, 2, [], {}, s)
    m = fmt.completion([[done]])["metrics"]["speculative_decoding"]
    assert m == {"num_spec_steps": 3, "num_draft_tokens": 9, "num_accepted_draft_tokens": 5,
                 "mean_acceptance_length": 1 + 5 / 3, "draft_acceptance_rate": 5 / 9,
                 "acceptance_histogram": [1, 0, 1, 1], "drafted_per_position": [3, 3, 3],
                 "accepted_per_position": [2, 2, 1]}
    last = json.loads(fmt.chunk(0, done)[6:])
    assert last["metrics"]["speculative_decoding"] == m
    assert "metrics" not in Formatter("cmpl-1", "tiny", False, False, 3, 1).completion([[done]])


def test_large_bodies_are_validated_off_the_event_loop(monkeypatch):
    """A body of OFF_LOOP_VALIDATION_BYTES or more is parsed and validated as the route's model on the parse
    thread (FastAPI then takes the instance as it is); a small one is validated on the loop, as is a large one
    that fails (FastAPI names its problems)."""
    import json
    import threading

    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from peagle.serve import api
    from peagle.serve.requests import CompletionRequest

    validated_on = []
    real = CompletionRequest.model_validate.__func__

    def spy(cls, *a, **kw):
        validated_on.append(threading.current_thread().name)
        return real(cls, *a, **kw)

    monkeypatch.setattr(CompletionRequest, "model_validate", classmethod(spy))
    app = FastAPI()
    app.router.route_class = api._Route
    app.add_exception_handler(api.RequestValidationError, api._invalid)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest):
        return {"prompt_len": len(req.prompt)}

    big = list(range(api.OFF_LOOP_VALIDATION_BYTES // 4))  # over 64 KiB of JSON integers
    with TestClient(app) as client:
        r = client.post("/v1/completions", json={"model": "m", "prompt": big})
        assert r.status_code == 200 and r.json()["prompt_len"] == len(big)
        assert validated_on == ["peagle-parse_0"], validated_on
        validated_on.clear()
        assert client.post("/v1/completions", json={"model": "m", "prompt": [1, 2]}).status_code == 200
        assert validated_on == []  # small: FastAPI's own validation on the loop
        r = client.post("/v1/completions", json={"model": "m", "prompt": big, "max_tokens": "many"})
        assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"]
    assert len(json.dumps({"model": "m", "prompt": big})) >= api.OFF_LOOP_VALIDATION_BYTES


def test_metrics_move_by_what_each_step_added():
    """The speculation counters grow by each step's drafts, also where a caller hands the engine's own (live)
    counters every step, as an in-process engine would: what was moved is a copy, not the live object."""
    from peagle.engine.sequence import SpecStats
    from peagle.serve.engine_core import Snapshot
    from peagle.serve.metrics import Metrics

    m, live = Metrics(), SpecStats()
    for _ in range(3):
        live.record([1, 1], 1)   # a round of 2 drafts, the first accepted
        m.observe_step(Snapshot(live, 0, 0, 0.0))
    assert m.num_drafts._value.get() == 3 and m.num_draft_tokens._value.get() == 6
    assert m.num_accepted._value.get() == 3
    assert [m.accepted_per_pos.labels(position=p)._value.get() for p in "01"] == [3, 0]
    assert [m.drafted_per_pos.labels(position=p)._value.get() for p in "01"] == [3, 3]
