"""The real server on a loopback port: OpenAI endpoints, streaming, errors, auth, queue limit,
client disconnects, metrics. The target is a tiny random Llama with SmolLM2's tokenizer."""
from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.serve.api import speculative_config

KEY = "sk-test"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(port: int, timeout: float = 120) -> bool:
    """Poll ``/health`` until the server answers 200 (True) or ``timeout`` seconds pass (False)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if request(port, "GET", "/health")[0] == 200:
                return True
        except OSError:
            time.sleep(0.3)
    return False


@pytest.fixture(scope="module")
def server(tiny_chat_dir, tmp_path_factory):
    port = free_port()
    env = {**os.environ, "PEAGLE_CACHE": str(tmp_path_factory.mktemp("cache"))}
    # P-EAGLE verifying a token tree every step: every test below runs through trees
    spec = json.dumps({"method": "eagle3", "num_speculative_tokens": 3, "parallel_drafting": True,
                       "speculative_token_tree": "[(0,), (1,), (0, 0), (1, 0), (0, 1), (0, 0, 0)]"})
    proc = subprocess.Popen([sys.executable, "-m", "peagle.cli", "serve", "--target", str(tiny_chat_dir),
                             "--speculative-config", spec, "--port", str(port), "--api-key", KEY,
                             "--max-num-seqs", "2", "--max-model-len", "128", "--max-queue", "2",
                             "--served-model-name", "tiny", "--dtype", "float32"],  # seeds: float32's guarantee
                            env=env, stderr=subprocess.PIPE, text=True)
    if not wait_healthy(port):
        proc.kill()
        raise RuntimeError(proc.stderr.read())
    yield port
    proc.terminate()
    proc.wait(timeout=30)


def request(port, method, path, body=None, key=KEY, raw: bytes | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    conn.request(method, path, body=data, headers=headers)
    r = conn.getresponse()
    text = r.read().decode()
    conn.close()
    try:
        return r.status, json.loads(text), dict(r.getheaders())
    except json.JSONDecodeError:
        return r.status, text, dict(r.getheaders())


def sse(port, path, body):
    status, text, _ = request(port, "POST", path, {**body, "stream": True})
    assert status == 200, text
    events = [line[len("data: "):] for line in text.split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def metric(port, name: str) -> float:
    _, text, _ = request(port, "GET", "/metrics")
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def counts(usage: dict) -> dict:
    """A usage's token counts, without the prompt tokens a request found in the prefix cache."""
    return {k: v for k, v in usage.items() if k != "prompt_tokens_details"}


def test_models_health_auth(server):
    assert request(server, "GET", "/health", key=None)[0] == 200
    status, body, _ = request(server, "GET", "/v1/models")
    assert status == 200 and body["data"][0]["id"] == "tiny" and body["data"][0]["max_model_len"] == 128
    for key in (None, "wrong"):
        status, body, _ = request(server, "GET", "/v1/models", key=key)
        assert status == 401 and body["error"]["type"] == "AuthenticationError"


def test_completion_is_the_targets_greedy_output(server, tiny_chat_dir):
    status, body, _ = request(server, "POST", "/v1/completions",
                              {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 12, "temperature": 0,
                               "ignore_eos": True})
    assert status == 200, body
    assert body["object"] == "text_completion" and body["usage"]["completion_tokens"] == 12
    plain = LLMEngine.from_pretrained(str(tiny_chat_dir), method="none", dtype="float32")
    ids = plain.encode_prompt("Once upon a time", chat=False)
    assert body["usage"]["prompt_tokens"] == len(ids)
    ref = plain.generate([ids], SamplingParams(max_tokens=12, ignore_eos=True))[0]
    assert body["choices"][0]["text"] == ref.text
    assert metric(server, "peagle:spec_decode_num_drafts_total") > 0
    nodes = metric(server, "peagle:spec_decode_num_draft_tokens_per_pos_total")
    assert nodes == metric(server, "peagle:spec_decode_num_draft_tokens_total") > 0


def test_a_next_turn_reads_the_kept_prefix(server, tiny_chat_dir):
    """A completion, then one whose prompt is the first prompt, its answer and more (a chat's next turn): the
    second finds the first's full blocks kept (the prefix-cache counters say so) and answers as plain decoding."""
    plain = LLMEngine.from_pretrained(str(tiny_chat_dir), method="none", dtype="float32",
                                      enable_prefix_caching=False)
    first = "The history of the lighthouse keepers on the northern coast is long, and " * 4   # 58 tokens
    body = {"model": "tiny", "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    status, one, _ = request(server, "POST", "/v1/completions", {**body, "prompt": first})
    assert status == 200, one
    second = first + one["choices"][0]["text"] + " And then"
    hits = metric(server, "peagle:prefix_cache_hits_total")
    status, two, _ = request(server, "POST", "/v1/completions", {**body, "prompt": second})
    assert status == 200, two
    # its first 48 tokens at least (the text after them is tokenized anew in the second prompt)
    assert two["usage"]["prompt_tokens_details"]["cached_tokens"] >= 48
    deadline = time.time() + 10   # (the engine's counters reach the metrics after its step, maybe after the answer)
    while metric(server, "peagle:prefix_cache_hits_total") - hits < 48 and time.time() < deadline:
        time.sleep(0.1)
    assert metric(server, "peagle:prefix_cache_hits_total") - hits >= 48
    assert one["usage"]["prompt_tokens_details"]["cached_tokens"] < 48
    ref = plain.generate([plain.encode_prompt(second, chat=False)], SamplingParams(max_tokens=8, ignore_eos=True))
    assert two["choices"][0]["text"] == ref[0].text


def test_fair_prefill_flags_are_checked_before_loading():
    for flags, msg in ((["--max-num-partial-prefills", "2", "--max-long-partial-prefills", "3"], "must not exceed"),
                       (["--long-prefill-token-threshold", "9999"], "long_prefill_token_threshold")):
        r = subprocess.run([sys.executable, "-m", "peagle.cli", "serve", "--target", "/nonexistent/model", *flags],
                           capture_output=True, text=True, timeout=120)
        errors = [line for line in r.stderr.strip().splitlines() if not line.startswith("peagle: AMX")]  # kernels' notices
        assert r.returncode == 1 and msg in r.stderr and len(errors) == 1, r.stderr


def test_chat_stream_equals_non_stream(server):
    body = {"messages": [{"role": "user", "content": "Hi there"}], "max_tokens": 10, "temperature": 0,
            "ignore_eos": True}
    status, full, _ = request(server, "POST", "/v1/chat/completions", body)
    assert status == 200 and full["choices"][0]["message"]["role"] == "assistant"
    chunks = sse(server, "/v1/chat/completions", {**body, "stream_options": {"include_usage": True}})
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)  # the usage chunk's included
    text = "".join(c["choices"][0]["delta"]["content"] for c in chunks if c["choices"])
    assert text == full["choices"][0]["message"]["content"]
    # the same counts (the second request finds the first one's prompt in the prefix cache: its own detail)
    assert counts(chunks[-1]["usage"]) == counts(full["usage"])
    assert chunks[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] >= full["usage"]["prompt_tokens_details"][
        "cached_tokens"]
    assert [c for c in chunks if c["choices"]][-1]["choices"][0]["finish_reason"] == "length"


def test_return_token_ids_are_the_generated_ids(server, tiny_chat_dir):
    """vLLM's ``return_token_ids``: a chat answer's prompt ids and each choice's generated ids (a stream's chunks
    add up to them), a completion's per choice beside its prompt; nothing of it unless asked."""
    from peagle.models.loader import load_tokenizer

    tok = load_tokenizer(tiny_chat_dir)
    body = {"messages": [{"role": "user", "content": "Hi there"}], "max_tokens": 10, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True}
    status, full, _ = request(server, "POST", "/v1/chat/completions", body)
    assert status == 200, full
    ids, prompt = full["choices"][0]["token_ids"], full["prompt_token_ids"]
    assert len(prompt) == full["usage"]["prompt_tokens"] and len(ids) == full["usage"]["completion_tokens"] == 10
    assert tok.decode(ids) == full["choices"][0]["message"]["content"]
    chunks = sse(server, "/v1/chat/completions", body)
    assert [t for c in chunks for ch in c["choices"] for t in ch["token_ids"]] == ids
    assert [c.get("prompt_token_ids") for c in chunks] == [prompt] + [None] * (len(chunks) - 1)  # the first's
    given = prompt[:5]
    status, out, _ = request(server, "POST", "/v1/completions", {"prompt": given, "max_tokens": 4, "n": 2, "ignore_eos": True,
                                                                  "temperature": 0, "return_token_ids": True})
    assert status == 200, out
    assert [c["prompt_token_ids"] for c in out["choices"]] == [given, given]
    assert all(tok.decode(c["token_ids"]) == c["text"] and len(c["token_ids"]) == 4 for c in out["choices"])
    streamed = [ch for c in sse(server, "/v1/completions", {"prompt": given, "max_tokens": 4, "n": 2,
                                                            "ignore_eos": True, "temperature": 0,
                                                            "return_token_ids": True}) for ch in c["choices"]]
    assert sorted(ch["index"] for ch in streamed if "prompt_token_ids" in ch) == [0, 1]  # each choice's first
    assert all(ch["prompt_token_ids"] == given for ch in streamed if "prompt_token_ids" in ch)
    _, plain, _ = request(server, "POST", "/v1/chat/completions", {**body, "return_token_ids": False})
    assert "prompt_token_ids" not in plain and "token_ids" not in plain["choices"][0]


def test_stop_strings_cut_streams_as_they_cut_answers(server):
    """A stop string's beginning is held back: streamed text equals the non-streamed text."""
    body = {"prompt": "The capital of France", "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    full = request(server, "POST", "/v1/completions", body)[1]["choices"][0]["text"]
    for stop in (full[6:13], [full[10:14], full[3:9]], full[-5:]):
        stops = [stop] if isinstance(stop, str) else stop
        want = full[:min(full.find(s) for s in stops)]
        status, out, _ = request(server, "POST", "/v1/completions", {**body, "stop": stop})
        assert status == 200 and out["choices"][0]["text"] == want and out["choices"][0]["finish_reason"] == "stop", out
        chunks = sse(server, "/v1/completions", {**body, "stop": stop})
        assert "".join(c["choices"][0]["text"] for c in chunks) == want, (stop, chunks)


def test_logprobs_chat_and_completions(server):
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "temperature": 0, "ignore_eos": True,
            "logprobs": True, "top_logprobs": 2}
    status, out, _ = request(server, "POST", "/v1/chat/completions", body)
    assert status == 200, out
    content = out["choices"][0]["logprobs"]["content"]
    assert len(content) == out["usage"]["completion_tokens"] == 8
    for e in content:  # greedy: each token is the target's most likely, its logprob the top one's
        assert e["logprob"] <= 0 and len(e["top_logprobs"]) == 2 and e["top_logprobs"][0]["logprob"] == e["logprob"]
        assert bytes(e["bytes"]).decode(errors="replace") == e["token"]
    chunks = sse(server, "/v1/chat/completions", body)
    assert [e for c in chunks for e in (c["choices"][0]["logprobs"] or {"content": []})["content"]] == content
    status, out, _ = request(server, "POST", "/v1/completions", {"prompt": "Once", "max_tokens": 6, "temperature": 0,
                                                                "ignore_eos": True, "logprobs": 3})
    lp = out["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 6
    assert "".join(lp["tokens"]) == out["choices"][0]["text"] and lp["text_offset"][0] == 0
    assert all(len(t) <= 3 and max(t.values()) == x for t, x in zip(lp["top_logprobs"], lp["token_logprobs"]))
    assert request(server, "POST", "/v1/chat/completions", {**body, "logprobs": False})[0] == 400


def test_n_choices_content_parts_and_prompt_lists(server):
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6, "temperature": 1.0, "seed": 5, "n": 3}
    status, out, _ = request(server, "POST", "/v1/chat/completions", body)
    assert status == 200 and [c["index"] for c in out["choices"]] == [0, 1, 2]
    texts = [c["message"]["content"] for c in out["choices"]]
    again = request(server, "POST", "/v1/chat/completions", body)[1]
    assert len(set(texts)) > 1 and texts == [c["message"]["content"] for c in again["choices"]]
    chunks = sse(server, "/v1/chat/completions", body)
    assert ["".join(c["choices"][0]["delta"]["content"] for c in chunks if c["choices"][0]["index"] == i)
            for i in range(3)] == texts
    greedy = {"max_tokens": 6, "temperature": 0, "ignore_eos": True}
    one = request(server, "POST", "/v1/chat/completions", {**greedy, "messages": [{"role": "user", "content": "Hi\nthere"}]})
    parts = request(server, "POST", "/v1/chat/completions", {**greedy, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]}]})
    assert one[1]["choices"][0]["message"] == parts[1]["choices"][0]["message"]
    assert counts(one[1]["usage"]) == counts(parts[1]["usage"])
    alone = [request(server, "POST", "/v1/completions", {**greedy, "prompt": p})[1]["choices"][0]["text"]
             for p in ("Once upon", "a time")]
    status, out, _ = request(server, "POST", "/v1/completions", {**greedy, "prompt": ["Once upon", "a time"], "n": 2})
    assert status == 200 and [c["text"] for c in out["choices"]] == [alone[0], alone[0], alone[1], alone[1]]
    ids = request(server, "POST", "/v1/completions", {**greedy, "prompt": [[9906, 1010], [9906]]})
    assert ids[0] == 200 and len(ids[1]["choices"]) == 2 and ids[1]["usage"]["prompt_tokens"] == 3
    too_many = request(server, "POST", "/v1/completions", {**greedy, "prompt": ["a", "b", "c"], "n": 2})
    assert too_many[0] == 400


def test_openapi_documents_the_400s(server):
    status, schema, _ = request(server, "GET", "/openapi.json")
    assert status == 200 and "422" not in json.dumps(schema["paths"])
    for path in ("/v1/completions", "/v1/chat/completions"):
        assert {"400", "401", "404", "503"} <= set(schema["paths"][path]["post"]["responses"])


def test_bad_requests_get_400_and_the_server_goes_on(server):
    long_prompt = list(range(100, 240))
    cases = [
        dict(raw=b"{not json"),
        dict(body={"prompt": "x", "max_tokens": "many"}),
        dict(body={"prompt": 5}),
        dict(body={"messages": []}, path="/v1/chat/completions"),
        dict(body={"prompt": long_prompt}),
        dict(body={"prompt": "hello", "max_tokens": 0}),
        dict(body={"prompt": "hello", "max_tokens": 1000}),
        dict(body={"prompt": "hello", "temperature": -1}),
        dict(body={"prompt": [1, 2, 10 ** 6]}),
        dict(body={"prompt": ""}),
    ]
    for c in cases:
        status, body, _ = request(server, "POST", c.get("path", "/v1/completions"), c.get("body"), raw=c.get("raw"))
        assert status == 400 and "message" in body["error"], (c, body)
    status, body, _ = request(server, "POST", "/v1/completions", {"model": "other", "prompt": "hi"})
    assert status == 404
    status, body, _ = request(server, "POST", "/v1/completions", {"prompt": "hi", "max_tokens": 3})
    assert status == 200 and body["usage"]["completion_tokens"] >= 1


def test_disconnect_aborts_and_frees(server):
    before = metric(server, 'peagle:request_success_total{finished_reason="abort"}')
    conn = http.client.HTTPConnection("127.0.0.1", server, timeout=60)
    conn.request("POST", "/v1/completions", body=json.dumps({"prompt": "go", "max_tokens": 110, "stream": True,
                                                             "ignore_eos": True, "temperature": 0}),
                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
    r = conn.getresponse()
    assert r.status == 200
    r.fp.readline()  # the first event
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    deadline = time.time() + 60
    while time.time() < deadline:
        if metric(server, 'peagle:request_success_total{finished_reason="abort"}') > before and \
                metric(server, "peagle:num_requests_running") == 0:
            return
        time.sleep(0.2)
    pytest.fail("the aborted request was never released")


def test_full_queue_answers_503(server):
    results = []

    def one():
        results.append(request(server, "POST", "/v1/completions",
                               {"prompt": "count", "max_tokens": 60, "ignore_eos": True}))

    threads = [threading.Thread(target=one) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    codes = sorted(r[0] for r in results)
    assert 200 in codes and 503 in codes, codes
    assert all(r[2].get("retry-after") == "1" for r in results if r[0] == 503)
    assert request(server, "GET", "/health", key=None)[0] == 200


def test_speculative_config_parsing():
    chain = {"speculative_token_tree": "chain", "speculative_tree_budget": 16, "prompt_lookup_max": 4,
             "prompt_lookup_min": 2, "response_lookup": "auto"}
    # no config: generate's default (P-EAGLE, the default head, auto K), not vLLM's none
    assert speculative_config(None) == speculative_config("") == {"method": "parallel", "k": "auto", "drafter": None,
                                                                 **chain}
    assert speculative_config({"method": "none"}) == {"method": "none", "k": 1, "drafter": None, **chain,
                                                      "response_lookup": "none"}
    assert speculative_config('{"method": "eagle3", "model": "h", "num_speculative_tokens": 5, '
                              '"parallel_drafting": true}') == {"method": "parallel", "k": 5, "drafter": "h", **chain}
    assert speculative_config({"method": "eagle3"}) == {"method": "eagle3", "k": "auto", "drafter": None, **chain}
    assert speculative_config({"num_speculative_tokens": "auto", "parallel_drafting": True})["k"] == "auto"
    assert speculative_config({"method": "none"})["method"] == "none"
    tree = speculative_config({"parallel_drafting": True, "speculative_token_tree": "auto", "speculative_tree_budget": 8})
    assert (tree["speculative_token_tree"], tree["speculative_tree_budget"]) == ("auto", 8)
    explicit = speculative_config('{"parallel_drafting": true, "speculative_token_tree": [[0], [1], [0, 0]]}')
    assert explicit["speculative_token_tree"] == "[(0,), (1,), (0, 0)]"
    lookup = speculative_config({"parallel_drafting": True, "prompt_lookup_max": 0, "prompt_lookup_min": 1})
    assert (lookup["prompt_lookup_max"], lookup["prompt_lookup_min"]) == (0, 1)   # vLLM's n-gram keys; 0: off
    assert speculative_config({"method": "ngram", "response_lookup": "none"})["response_lookup"] == "none"
    assert speculative_config({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}) == {
        "method": "ngram", "k": 4, "drafter": None, **chain, "prompt_lookup_max": 3}
    for bad, msg in [("{", "not valid JSON"), ('{"methd": "eagle3"}', "unknown"), ('{"method": "medusa"}', "not supported"),
                     ('{"num_speculative_tokens": 0}', ">= 1"), ('{"num_speculative_tokens": "max"}', "auto"), ('{"parallel_drafting": "yes"}', "true or false"),
                     ("[1]", "JSON object"), ('{"speculative_token_tree": 3}', "rank paths"),
                     ('{"speculative_tree_budget": "big"}', "integer"), ('{"prompt_lookup_min": 1.5}', "integer"),
                     ('{"method": "ngram", "model": "h"}', "no model"), ('{"response_lookup": 3}', "response_lookup must")]:
        with pytest.raises(ValueError, match=msg):
            speculative_config(bad)


@pytest.mark.parametrize("interval", [1, 4])
def test_stream_interval_groups_a_streams_tokens(tiny_chat_dir, interval):
    """``--stream-interval N``: a streamed request's first token goes at once, then a delta every N tokens,
    the rest with its end; a request that is not streamed hears once. Same tokens either way."""
    from peagle.serve.engine_core import EngineCore

    engine = LLMEngine.from_pretrained(str(tiny_chat_dir), method="none", dtype="float32", max_num_seqs=2)
    core = EngineCore(engine, outbox=None, stream_interval=interval)
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    core._handle(("add", "s", [1, 2, 3], params, True))
    core._handle(("add", "u", [1, 2, 3], params, False))
    while engine.has_unfinished():
        for seq in engine.step().updated:
            core._post(seq)
    deltas = {rid: [d for r, d, _ in core._out if r == rid] for rid in ("s", "u")}
    assert [len(d.token_ids) for d in deltas["s"]] == ([1] * 10 if interval == 1 else [1, 4, 4, 1])
    assert len(deltas["u"]) == 1
    assert [t for d in deltas["s"] for t in d.token_ids] == deltas["u"][0].token_ids
    assert "".join(d.text for d in deltas["s"]) == deltas["u"][0].text
