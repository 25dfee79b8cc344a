"""What the server accepts: the request bodies (pydantic: their shape, answered with a 400 when
wrong) and the checks a schema cannot make (the model's name, the prompt against the model's limits,
the server's room), each a :class:`Refusal` with the error the client gets. Tested without HTTP."""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Annotated, Any, ClassVar, Literal

from jinja2 import TemplateError
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from peagle.engine.grammar import StructuredOutput
from peagle.engine.sampling import MAX_BIAS, MAX_LOGPROBS, SamplingParams
from peagle.prompts import encode
from peagle.request_checks import RequestError, check_prompt
from peagle.serve.responses import Refusal

MAX_N = 16  # choices per request


def _utf8(s: str) -> str:   # its name shows in the 400's message: "function-after[_utf8(), str]"
    s.encode("utf-8")  # a lone surrogate ("\ud800") raises UnicodeEncodeError, a ValueError: 400
    return s


Text = Annotated[str, AfterValidator(_utf8)]
Bias = Annotated[float, Field(ge=-MAX_BIAS, le=MAX_BIAS, allow_inf_nan=False)]

# fields OpenAI's or vLLM's clients send that this server does not honour, each with the values that ask for
# nothing (sent with any other value: a 400 naming the field, never silently dropped)
UNSUPPORTED: dict[str, tuple] = {
    "best_of": (None, 1), "echo": (None, False), "suffix": (None, ""), "tools": (None, []),
    "tool_choice": (None, "none"), "functions": (None, []), "function_call": (None, "none"), "audio": (None,),
    "modalities": (None, ["text"]), "prediction": (None,), "web_search_options": (None,), "min_p": (None, 0, 0.0),
    "stop_token_ids": (None, []), "bad_words": (None, []), "allowed_token_ids": (None,), "use_beam_search": (None, False),
    "prompt_logprobs": (None,), "include_stop_str_in_output": (None, False), "skip_special_tokens": (None, True),
    "truncate_prompt_tokens": (None,), "logits_processors": (None, []), "parallel_tool_calls": (None, False, True),
}


class StreamOptions(BaseModel):
    include_usage: bool = False


class JsonSchema(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    name: Text | None = None
    description: Text | None = None
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's ``response_format``: free text, any JSON object, or JSON that follows ``json_schema.schema``."""
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchema | None = None


class StructuredOutputs(BaseModel):
    """vLLM's ``structured_outputs`` (one of them): a JSON schema, a regex, one of a list of choices, an
    EBNF grammar (xgrammar's, ``root ::= ...``), or any JSON object."""
    model_config = ConfigDict(extra="forbid")
    json_: dict[str, Any] | Text | None = Field(None, alias="json")
    regex: Text | None = None
    choice: list[Text] | None = None
    grammar: Text | None = None
    json_object: bool | None = None


class SamplingRequest(BaseModel):
    """The fields completions and chat completions share."""
    model_config = ConfigDict(extra="ignore")
    default_max_tokens: ClassVar[int | None] = None   # None: the room the context leaves
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
    logit_bias: dict[str, Bias] | None = None
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    repetition_penalty: float = Field(1.0, gt=0, le=100)
    min_tokens: int = Field(0, ge=0)
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict[str, Any] | Text | None = None     # vLLM's older spellings of structured_outputs
    guided_regex: Text | None = None
    guided_choice: list[Text] | None = None
    guided_grammar: Text | None = None
    return_token_ids: bool = Field(False, description="vLLM's: each choice carries token_ids, the ids generated "
                                                      "(a stream's chunk its new ones), and the prompt's "
                                                      "prompt_token_ids come once (chat: on the answer or a "
                                                      "stream's first chunk; completions: on each choice)")
    token_origins: bool = Field(False, description="peagle's: each choice carries token_origins, the text and "
                                                   "origin of each token (the playground colours by it)")
    speculative: bool = Field(True, description="peagle's: false decodes this request without drafts (others "
                                                "in its batch keep speculating); its output is the same")

    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported(cls, data):
        if isinstance(data, dict):
            for name, harmless in UNSUPPORTED.items():
                if name in data and data[name] not in harmless:
                    raise ValueError(f"{name} is not supported by this server")
        return data

    def structured(self) -> StructuredOutput | None:
        """What the output must follow: ``response_format``, ``structured_outputs`` or a ``guided_*`` field
        (at most one of them asks for something)."""
        asked = []
        rf = self.response_format
        if rf is not None and rf.type == "json_object":
            asked.append(("response_format", StructuredOutput("json")))
        elif rf is not None and rf.type == "json_schema":
            if rf.json_schema is None:
                raise Refusal(400, "response_format: type json_schema needs json_schema.schema")
            asked.append(("response_format", StructuredOutput("json_schema", json.dumps(rf.json_schema.schema_))))
        so = self.structured_outputs
        fields = [("json", so.json_ if so else None, self.guided_json), ("regex", so.regex if so else None,
                  self.guided_regex), ("choice", so.choice if so else None, self.guided_choice),
                  ("grammar", so.grammar if so else None, self.guided_grammar)]
        for kind, new, old in fields:
            for name, value in ((f"structured_outputs.{kind}", new), (f"guided_{kind}", old)):
                if value is not None:
                    spec = value if isinstance(value, str) else json.dumps(value)
                    asked.append((name, StructuredOutput({"json": "json_schema"}.get(kind, kind), spec)))
        if so is not None and so.json_object:
            asked.append(("structured_outputs.json_object", StructuredOutput("json")))
        if len(asked) > 1:
            raise Refusal(400, f"ask for one structured output, not {len(asked)}: {', '.join(n for n, _ in asked)}")
        return asked[0][1] if asked else None

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else (self.stop or [])


class CompletionRequest(SamplingRequest):
    default_max_tokens: ClassVar[int | None] = 16   # OpenAI's default for completions
    prompt: Text | list[int] | list[Text] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)

    @property
    def num_logprobs(self) -> int | None:
        """Alternatives a token asked for (0: the token's own logprob only); None: no logprobs."""
        return self.logprobs

    @property
    def prompt_list(self) -> list[str | list[int]]:
        """One prompt (text or token ids) or a list of them, as a list."""
        p = self.prompt
        return [p] if isinstance(p, str) or (p and isinstance(p[0], int)) or not p else p

    def prompts(self, tokenizer) -> list[list[int]]:
        """Every prompt as token ids."""
        return [tokenizer(x)["input_ids"] if isinstance(x, str) else x for x in self.prompt_list]


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Text
    text: Text | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Text
    content: Text | list[ContentPart]


class ChatRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)

    @property
    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def prompt(self, tokenizer) -> list[int]:
        """The messages through the model's chat template, as token ids; text content parts only."""
        if not tokenizer.chat_template:
            raise Refusal(400, "this model has no chat template; use /v1/completions")
        msgs = []
        for m in self.messages:
            parts = [m.content] if isinstance(m.content, str) else m.content
            if any(not isinstance(x, str) and (x.type != "text" or x.text is None) for x in parts):
                raise Refusal(400, "only text content parts ({\"type\": \"text\", \"text\": ...}) are supported")
            msgs.append({"role": m.role, "content": "\n".join(x if isinstance(x, str) else x.text for x in parts)})
        if self.top_logprobs is not None and not self.logprobs:
            raise Refusal(400, "top_logprobs needs logprobs: true")
        try:
            return encode(tokenizer, msgs, True)
        except Exception as e:  # a template's own error (raise_exception) or any other it runs into: never a 500
            why = str(e) if isinstance(e, TemplateError) else f"{type(e).__name__}: {e}"
            raise Refusal(400, f"the chat template refused these messages: {why}") from None


GenerationRequest = CompletionRequest | ChatRequest


@dataclass(frozen=True)
class Limits:
    """What a request is checked against: the served model and the requests the server takes at once."""
    model_name: str
    vocab_size: int
    max_model_len: int
    max_requests: int   # the queue and the running batch


def sampling_params(req: GenerationRequest, prompt_ids: list[int], limits: Limits) -> SamplingParams:
    """One prompt's sampling: :func:`check_prompt`, then ``max_tokens`` (default: the request kind's,
    within the context's room) and the sampling fields."""
    try:
        room = check_prompt(prompt_ids, limits.vocab_size, limits.max_model_len)
    except RequestError as e:
        raise Refusal(400, str(e)) from None
    max_tokens = req.max_tokens if req.max_tokens is not None else req.max_completion_tokens
    max_tokens = max_tokens if max_tokens is not None else min(req.default_max_tokens or room, room)
    if max_tokens > room:
        raise Refusal(400, f"max_tokens must be in 1..{room} (maximum context length {limits.max_model_len}, "
                           f"prompt {len(prompt_ids)} tokens), got {max_tokens}")
    stop = req.stop_strings
    try:
        return SamplingParams(temperature=req.temperature, top_p=req.top_p, top_k=max(req.top_k, 0),
                              max_tokens=max_tokens, seed=req.seed, stop=stop, ignore_eos=req.ignore_eos,
                              logprobs=req.num_logprobs, logit_bias=logit_bias(req.logit_bias, limits.vocab_size),
                              min_tokens=req.min_tokens, presence_penalty=req.presence_penalty,
                              frequency_penalty=req.frequency_penalty, repetition_penalty=req.repetition_penalty,
                              structured=req.structured(), speculative=req.speculative,
                              token_origins=req.token_origins)
    except ValueError as e:
        raise Refusal(400, str(e)) from None


def logit_bias(bias: dict[str, float] | None, vocab_size: int) -> dict[int, float] | None:
    """OpenAI's ``logit_bias`` (token ids as strings) as the engine takes it, each id checked."""
    if not bias:
        return None
    out = {}
    for key, value in bias.items():
        if not (key.isascii() and key.isdigit() and int(key) < vocab_size):
            raise Refusal(400, f"logit_bias: {key!r} is not a token id in 0..{vocab_size - 1}")
        out[int(key)] = value
    return out


def choice_params(req: GenerationRequest, prompts: list[list[int]], limits: Limits) -> list[SamplingParams]:
    """Every choice's sampling, checked: choice ``i`` is sample ``i % n`` of prompt ``i // n``; with a
    seed, sample ``j`` draws with ``seed + j``."""
    if req.model is not None and req.model != limits.model_name:
        raise Refusal(404, f"the model {req.model!r} does not exist; this server serves {limits.model_name!r}",
                      "NotFoundError")
    if len(prompts) * req.n > limits.max_requests:
        raise Refusal(400, f"{len(prompts)} prompts x n={req.n} choices are more than the {limits.max_requests} "
                           "requests the server takes at once")
    params = [sampling_params(req, ids, limits) for ids in prompts]
    return [replace(p, seed=p.seed + j if p.seed is not None else None)
            for p in params for j in range(req.n)]
