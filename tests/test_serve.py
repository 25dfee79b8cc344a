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


@pytest.fixture(scope="module")
def server(tiny_chat_dir, tmp_path_factory):
    port = free_port()
    env = {**os.environ, "PEAGLE_CACHE": str(tmp_path_factory.mktemp("cache"))}
    spec = json.dumps({"method": "eagle3", "num_speculative_tokens": 3, "parallel_drafting": True})
    proc = subprocess.Popen([sys.executable, "-m", "peagle.cli", "serve", "--target", str(tiny_chat_dir),
                             "--speculative-config", spec, "--port", str(port), "--api-key", KEY,
                             "--max-num-seqs", "2", "--max-model-len", "128", "--max-queue", "2",
                             "--served-model-name", "tiny"], env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            if request(port, "GET", "/health")[0] == 200:
                break
        except OSError:
            time.sleep(0.3)
    else:
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
    _, text, _ = request(port, "GET", "/metrics", key=None)
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


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
    plain = LLMEngine.from_pretrained(str(tiny_chat_dir), method="none")
    ids = plain.encode_prompt("Once upon a time", chat=False)
    assert body["usage"]["prompt_tokens"] == len(ids)
    ref = plain.generate([ids], SamplingParams(max_tokens=12, ignore_eos=True))[0]
    assert body["choices"][0]["text"] == ref.text
    assert metric(server, "peagle:spec_decode_num_drafts_total") > 0


def test_chat_stream_equals_non_stream(server):
    body = {"messages": [{"role": "user", "content": "Hi there"}], "max_tokens": 10, "temperature": 0,
            "ignore_eos": True}
    status, full, _ = request(server, "POST", "/v1/chat/completions", body)
    assert status == 200 and full["choices"][0]["message"]["role"] == "assistant"
    chunks = sse(server, "/v1/chat/completions", {**body, "stream_options": {"include_usage": True}})
    text = "".join(c["choices"][0]["delta"]["content"] for c in chunks if c["choices"])
    assert text == full["choices"][0]["message"]["content"]
    assert chunks[-1]["usage"] == full["usage"]
    assert [c for c in chunks if c["choices"]][-1]["choices"][0]["finish_reason"] == "length"


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
    assert speculative_config(None) == {"method": "none", "k": 1, "drafter": None}
    assert speculative_config('{"method": "eagle3", "model": "h", "num_speculative_tokens": 5, '
                              '"parallel_drafting": true}') == {"method": "parallel", "k": 5, "drafter": "h"}
    assert speculative_config({"method": "eagle3"})["method"] == "eagle3"
    assert speculative_config({"method": "none"})["method"] == "none"
    for bad, msg in [("{", "not valid JSON"), ('{"methd": "eagle3"}', "unknown"), ('{"method": "medusa"}', "not supported"),
                     ('{"num_speculative_tokens": 0}', ">= 1"), ('{"parallel_drafting": "yes"}', "true or false"),
                     ("[1]", "JSON object")]:
        with pytest.raises(ValueError, match=msg):
            speculative_config(bad)
