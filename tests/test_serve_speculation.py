"""The server's answers under speculation, with drafts accepted: seeded and greedy requests, alone and among
others, with the sampling fields that change the logits, equal plain decoding's; each response's
``metrics.speculative_decoding`` shows its drafts accepted (an oracle head drafts plain decoding's output,
so a verifier that rejected everything would fail here); a request can opt out of speculation. The engine
runs in its own process (built by :func:`speculation.oracle_engine`), the HTTP side in this one."""
from __future__ import annotations

import json
import threading

import jsonschema
import openai
import pytest
from speculation import PERSON_SCHEMA, blank_tokens
from test_serve import request, sse
from test_serve_faults import Server

from peagle.engine.grammar import StructuredOutput
from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.serve.async_engine import AsyncEngine, EngineSpec

TREE = "[(0,), (1,), (0, 0), (1, 0), (0, 1), (0, 0, 0)]"
STORY = {"prompt": "Once upon a time", "max_tokens": 16, "temperature": 1.0, "top_k": 50, "seed": 5, "ignore_eos": True}
FIELDS = {"prompt": "The cat sat on", "max_tokens": 16, "temperature": 0, "ignore_eos": True, "presence_penalty": 1.5,
          "frequency_penalty": 0.8, "repetition_penalty": 1.4, "logit_bias": {"42": 0.3}, "min_tokens": 4}
CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 12, "temperature": 0.9, "seed": 11,
        "ignore_eos": True}
SCHEMA = PERSON_SCHEMA
JSON_CHAT = {"messages": [{"role": "user", "content": "A person as JSON."}], "max_tokens": 80, "temperature": 0,
             "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}}


@pytest.fixture(scope="module")
def plain(tiny_chat_dir):
    """The engine without a head. A random model likes JSON's optional whitespace: the JSON request biases
    the whitespace tokens down, so its output ends."""
    e = LLMEngine.from_pretrained(str(tiny_chat_dir), method="none", dtype="float32")
    JSON_CHAT["logit_bias"] = {str(i): -100 for i in blank_tokens(e.tokenizer)}
    return e


def params_of(body: dict) -> SamplingParams:
    """The engine's sampling for a request body (the fields both share)."""
    keep = ("max_tokens", "temperature", "top_k", "seed", "ignore_eos", "presence_penalty", "frequency_penalty",
            "repetition_penalty", "min_tokens")
    fields = {k: body[k] for k in keep if k in body}
    if "logit_bias" in body:
        fields["logit_bias"] = {int(t): v for t, v in body["logit_bias"].items()}
    if "response_format" in body:
        fields["structured"] = StructuredOutput("json_schema", json.dumps(body["response_format"]["json_schema"]["schema"]))
    return SamplingParams(**fields)


def cases(plain) -> list[tuple[list[int], dict]]:
    """What the oracle drafts: each request's prompt ids with its sampling (no two share a prompt)."""
    out = []
    for body, chat in ((STORY, False), (FIELDS, False), (CHAT, True), (JSON_CHAT, True)):
        ids = plain.encode_prompt(body["messages"][0]["content"] if chat else body["prompt"], chat=chat)
        out.append((ids, vars(params_of(body))))
    return out


def start(tiny_chat_dir, plain, cache, fault=None) -> Server:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PEAGLE_CACHE", str(cache))
        from speculation import oracle_engine
        spec = EngineSpec(dict(target=str(tiny_chat_dir), cases=cases(plain), fault=fault, method="parallel",
                               num_speculative_tokens=3, speculative_token_tree=TREE, max_num_seqs=4,
                               max_model_len=128), oracle_engine)
        return Server(AsyncEngine(spec, max_queue=8))


@pytest.fixture(scope="module")
def srv(tiny_chat_dir, plain, tmp_path_factory):
    server = start(tiny_chat_dir, plain, tmp_path_factory.mktemp("cache"))
    yield server
    server.close()


def completion(port, body) -> dict:
    status, out, _ = request(port, "POST", "/v1/completions", body)
    assert status == 200, out
    return out


def assert_accepted(response: dict, rate: float = 1 / 3) -> None:
    """At least ``rate`` of the draft positions verified were accepted (a tree's positions, not its nodes:
    at most one node a depth can be)."""
    m = response["metrics"]["speculative_decoding"]
    positions = m["num_spec_steps"] * len(m["drafted_per_position"])
    assert m["num_accepted_draft_tokens"] >= max(rate * positions, 1), f"accepted {m}"
    assert m["mean_acceptance_length"] > 1 and sum(m["acceptance_histogram"]) == m["num_spec_steps"]


def test_a_seed_gives_plain_decodings_completion_alone_and_among_others(srv, plain):
    """``seed`` in both endpoints: a request gives plain decoding's tokens with that seed, twice, and while
    other requests (unseeded, greedy) share its steps, with most of its drafts accepted (the server
    speculates with P-EAGLE over a token tree); choice i of ``n`` samples with seed + i."""
    ids = plain.encode_prompt(STORY["prompt"], chat=False)
    ref = plain.generate([ids], params_of(STORY))[0].text
    first = completion(srv.port, STORY)
    assert first["choices"][0]["text"] == ref
    assert_accepted(first)
    results = {}

    def send(name, b):
        results[name] = completion(srv.port, b)

    threads = [threading.Thread(target=send, args=(name, b)) for name, b in (
        ("seeded", STORY), ("other", {**STORY, "seed": None}), ("greedy", {**STORY, "temperature": 0}))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results["seeded"]["choices"][0]["text"] == ref
    assert_accepted(results["seeded"])
    six = completion(srv.port, {**STORY, "seed": 6})["choices"][0]["text"]
    assert six != ref and six == plain.generate([ids], SamplingParams(**{**vars(params_of(STORY)), "seed": 6}))[0].text
    both = completion(srv.port, {**STORY, "n": 2})["choices"]
    assert [c["text"] for c in both] == [ref, six]


def test_chat_with_a_seed_is_plain_decodings(srv, plain):
    ref = plain.generate([plain.encode_prompt("Hi")], params_of(CHAT))[0].text
    for _ in range(2):
        status, out, _ = request(srv.port, "POST", "/v1/chat/completions", CHAT)
        assert status == 200 and out["choices"][0]["message"]["content"] == ref, out
        assert_accepted(out)


def test_the_sampling_fields_are_applied_under_speculation(srv, plain):
    """Penalties, logit_bias and min_tokens: plain decoding's tokens with them (which differ from those
    without), drafts accepted; streamed, the last event of the choice carries the same metrics."""
    ids = plain.encode_prompt(FIELDS["prompt"], chat=False)
    ref = plain.generate([ids], params_of(FIELDS))[0].text
    assert ref != plain.generate([ids], SamplingParams(max_tokens=16, ignore_eos=True))[0].text
    out = completion(srv.port, FIELDS)
    assert out["choices"][0]["text"] == ref
    assert_accepted(out)
    events = sse(srv.port, "/v1/completions", {**FIELDS, "stream_options": {"include_usage": True}})
    assert "".join(e["choices"][0]["text"] for e in events if e["choices"]) == ref
    assert events[-2]["metrics"] == events[-1]["metrics"] == out["metrics"]


def test_a_request_can_opt_out_of_speculation(srv, plain):
    """``"speculative": false`` beside a speculating request: no drafts for it, the same tokens for both."""
    results = {}

    def send(name, b):
        results[name] = completion(srv.port, b)

    threads = [threading.Thread(target=send, args=(name, b)) for name, b in (
        ("off", {**STORY, "speculative": False}), ("on", FIELDS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    off = results["off"]
    assert off["metrics"]["speculative_decoding"]["num_spec_steps"] == 0
    assert off["choices"][0]["text"] == completion(srv.port, STORY)["choices"][0]["text"]
    assert_accepted(results["on"])


def test_a_verifier_that_rejects_every_draft_is_caught(tiny_chat_dir, plain, tmp_path_factory):
    """The planted fault: output still plain decoding's, so only the acceptance check sees it."""
    server = start(tiny_chat_dir, plain, tmp_path_factory.mktemp("cache"), fault="reject_all")
    try:
        out = completion(server.port, STORY)
        ids = plain.encode_prompt(STORY["prompt"], chat=False)
        assert out["choices"][0]["text"] == plain.generate([ids], params_of(STORY))[0].text
        with pytest.raises(AssertionError, match="accepted"):
            assert_accepted(out)
    finally:
        server.close()


def test_the_openai_sdk_asks_for_json_and_vllms_extra_fields(srv, plain):
    """``response_format`` with a JSON schema: schema-valid JSON, plain decoding's constrained output, drafts
    accepted; vLLM's ``structured_outputs`` and peagle's ``speculative`` through ``extra_body``."""
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{srv.port}/v1", api_key="none", max_retries=0)
    body = {k: v for k, v in JSON_CHAT.items()}
    r = client.chat.completions.create(model="tiny", **body)
    text = r.choices[0].message.content
    jsonschema.validate(json.loads(text), SCHEMA)
    assert r.choices[0].finish_reason == "stop"
    assert text == plain.generate([plain.encode_prompt("A person as JSON.")], params_of(JSON_CHAT))[0].text
    assert_accepted(r.model_extra)
    close = {str(plain.tokenizer.convert_tokens_to_ids(t)): 50 for t in ("{}", "}")}   # (a random model's keys never end)
    for extra, allowed in (({"structured_outputs": {"choice": ["yes", "no", "maybe"]}}, {"yes", "no", "maybe"}),
                           ({"guided_regex": "[0-9]{3}-[a-z]{2}"}, None), ({"response_format": {"type": "json_object"}}, None)):
        c = client.completions.create(model="tiny", prompt="Answer:", max_tokens=40, temperature=0,
                                      logit_bias={**JSON_CHAT["logit_bias"], **close},
                                      extra_body={**extra, "speculative": False})
        out = c.choices[0].text
        if allowed:
            assert out in allowed
        elif "guided_regex" in extra:
            assert len(out) == 6 and out[:3].isdigit() and out[3] == "-" and out[4:].isalpha(), out
        else:
            assert isinstance(json.loads(out), dict)
        assert c.model_extra["metrics"]["speculative_decoding"]["num_spec_steps"] == 0


@pytest.mark.parametrize("extra, words", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objec"}}}},
     "JSON schema"),
    ({"structured_outputs": {"regex": "(ab"}}, "regex"),
    ({"structured_outputs": {"grammar": "root ::= "}}, "grammar"),
    ({"guided_choice": ["a"], "structured_outputs": {"regex": "a"}}, "ask for one structured output"),
    ({"response_format": {"type": "json_schema"}}, "json_schema.schema")])
def test_malformed_structured_outputs_get_a_400(srv, extra, words):
    status, body, _ = request(srv.port, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 4, **extra})
    assert status == 400 and words in body["error"]["message"], body
    assert completion(srv.port, {**STORY, "max_tokens": 2})["choices"][0]["text"]   # and the server goes on


@pytest.mark.parametrize("stream", [False, True])
def test_a_grammars_dead_end_mid_output_is_that_requests_400_and_the_others_go_on(srv, plain, stream):
    """A regex that asks, after "ab", for a byte no token spells: that request gets a 400 (streamed: its text so
    far, or some of it, then an error event and [DONE]); a seeded request sent beside it gets plain decoding's completion with
    drafts accepted (the engine's own test puts the two in one step for certain)."""
    ref = plain.generate([plain.encode_prompt(STORY["prompt"], chat=False)], params_of(STORY))[0].text
    beside = {}
    t = threading.Thread(target=lambda: beside.update(completion(srv.port, STORY)))
    t.start()
    body = {"prompt": "x", "max_tokens": 8, "temperature": 0, "structured_outputs": {"regex": "ab\x14c"}}
    if stream:
        status, text, _ = request(srv.port, "POST", "/v1/completions", {**body, "stream": True})
        events = [line[len("data: "):] for line in text.split("\n") if line.startswith("data: ")]
        assert status == 200 and events[-1] == "[DONE]", text
        error = json.loads(events[-2])["error"]
        assert "ab".startswith("".join(c["text"] for e in events[:-2] for c in json.loads(e)["choices"]))
    else:
        status, out, _ = request(srv.port, "POST", "/v1/completions", body)
        assert status == 400, out
        error = out["error"]
    assert error["code"] == 400 and "regex allows no token this model's tokenizer can write" in error["message"]
    t.join()
    assert beside["choices"][0]["text"] == ref
    assert_accepted(beside)
    assert completion(srv.port, {**STORY, "max_tokens": 2})["choices"][0]["text"]   # and the server goes on


@pytest.mark.parametrize("stream", [False, True])
def test_token_origins_add_up_to_the_text_and_the_metrics(srv, stream):
    """``token_origins`` (asked for): each token's text, together exactly the response's text (a stop string
    cut included), and its origin: as many accepted drafts as the metrics count, a bonus after each round
    that took every draft; not asked for, nothing new in the answer."""
    long = {**STORY, "max_tokens": 40}
    full = completion(srv.port, long)["choices"][0]["text"]
    for body in (STORY, {**long, "stop": [full[len(full) // 2:len(full) // 2 + 3]]}):   # a stop string midway
        asked = {**body, "token_origins": True}
        if stream:
            events = sse(srv.port, "/v1/completions", asked)
            text = "".join(e["choices"][0]["text"] for e in events if e["choices"])
            origins = [t for e in events if e["choices"] for t in e["choices"][0]["token_origins"]]
            metrics = events[-1]["metrics"]["speculative_decoding"]
        else:
            out = completion(srv.port, asked)
            text, origins = out["choices"][0]["text"], out["choices"][0]["token_origins"]
            metrics = out["metrics"]["speculative_decoding"]
        assert "".join(t["text"] for t in origins) == text
        if "stop" in body:
            assert text == full[:full.index(body["stop"][0])]
        kinds = [t["origin"] for t in origins]
        assert sum(k >= 1 for k in kinds) == metrics["num_accepted_draft_tokens"] > 0
        assert kinds[0] == -2   # the first token comes from the prompt's pass
        assert all(k == (prev + 1 if prev >= 1 else 1) for prev, k in zip(kinds, kinds[1:]) if k >= 1), kinds
        assert all(prev >= 1 for prev, k in zip(kinds, kinds[1:]) if k == -1), "a bonus follows accepted drafts"
    assert "token_origins" not in completion(srv.port, STORY)["choices"][0]
