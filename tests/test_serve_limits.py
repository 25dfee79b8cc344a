"""The server against a hostile client (``peagle/serve/limits.py``): an oversize body or header, a
prompt too long to tokenize, too many choices or stop strings, a slow-loris, more connections than
allowed, a template that raises, paths that need the key. Each gets its OpenAI error object while a
stream runs beside it, and that stream ends exactly as it does alone. The server runs as in
``test_serve_faults`` (uvicorn in a thread, the engine in its own process) with small limits."""
from __future__ import annotations

import http.client
import json
import select
import socket
import time
from contextlib import contextmanager

import pytest
from fault_engines import SLOW
from test_serve import KEY, request
from test_serve_faults import Server, start_engine

from peagle.serve.limits import ServerLimits, check_request
from peagle.serve.requests import ChatRequest, CompletionRequest
from peagle.serve.responses import Refusal

# max_model_len 128: prompts of up to 16 x 128 = 2048 characters
LIMITS = ServerLimits(max_body_bytes=256 * 1024, max_header_bytes=8 * 1024, read_timeout=2.0, limit_concurrency=8,
                      max_choices=4, max_stop_strings=4, max_stop_chars=20)
# the stream beside each attack: slow steps (the fault engine's marker), so it runs through the attack
VICTIM = {"prompt": f"Once upon a time {SLOW}", "max_tokens": 60, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def srv(tiny_chat_dir, tmp_path_factory):
    server = Server(start_engine(tiny_chat_dir, tmp_path_factory.mktemp("cache"), method="none", max_num_seqs=4,
                                 max_model_len=128), api_key=KEY, limits=LIMITS)
    yield server
    server.close()


@pytest.fixture(scope="module")
def alone(srv) -> str:
    """The victim's text with nothing beside it."""
    status, body, _ = request(srv.port, "POST", "/v1/completions", VICTIM)
    assert status == 200, body
    return body["choices"][0]["text"]


@contextmanager
def beside_a_stream(srv: Server, alone: str):
    """Run the block while the victim streams (its first token already out); then it must end as alone."""
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
    conn.request("POST", "/v1/completions", body=json.dumps({**VICTIM, "stream": True}),
                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
    r = conn.getresponse()
    assert r.status == 200
    first = r.readline()
    yield
    events = [json.loads(e[6:]) for e in (first + r.read()).decode().split("\n") if e.startswith("data: {")]
    conn.close()
    assert "".join(e["choices"][0]["text"] for e in events) == alone
    assert events[-1]["choices"][0]["finish_reason"] == "length"


def assert_error(result, status: int, kind: str, words: str) -> None:
    got, body, headers = result
    assert got == status and headers["content-type"] == "application/json", result
    assert body["error"]["type"] == kind and words in body["error"]["message"], body


def response(conn: http.client.HTTPConnection) -> tuple[int, dict, dict]:
    r = conn.getresponse()
    out = r.status, json.loads(r.read()), {k.lower(): v for k, v in r.getheaders()}
    conn.close()
    return out


def raw_response(sock: socket.socket) -> tuple[int, dict, dict]:
    """The server's answer on a raw socket, read to its close."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    sock.close()
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    return int(lines[0].split()[1]), json.loads(body), headers


def post_head(path: str = "/v1/completions", **headers: str) -> bytes:
    fields = {"Host": "x", "Content-Type": "application/json", "Authorization": f"Bearer {KEY}", **headers}
    return f"POST {path} HTTP/1.1\r\n".encode() + b"".join(f"{k}: {v}\r\n".encode() for k, v in fields.items())


def test_an_oversize_body_or_header_is_refused_unread(srv, alone):
    """A 64 MiB Content-Length: 413 before a byte of the body is sent; a chunked body: 413 at the first
    byte past the limit; 9 KiB of headers: 431. Each closes its connection."""
    with beside_a_stream(srv, alone):
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
        conn.putrequest("POST", "/v1/completions")
        for k, v in (("Content-Type", "application/json"), ("Authorization", f"Bearer {KEY}"),
                     ("Content-Length", str(64 * 2 ** 20))):
            conn.putheader(k, v)
        conn.endheaders()
        result = response(conn)
        assert_error(result, 413, "RequestTooLargeError", "larger than 262144 bytes")
        assert result[2]["connection"] == "close"

        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
        conn.putrequest("POST", "/v1/completions")
        for k, v in (("Content-Type", "application/json"), ("Authorization", f"Bearer {KEY}"),
                     ("Transfer-Encoding", "chunked")):
            conn.putheader(k, v)
        conn.endheaders()
        for _ in range(4):   # exactly the limit: taken
            conn.send(b"10000\r\n" + b" " * 65536 + b"\r\n")
        conn.send(b"1\r\n \r\n")   # one byte more (and nothing after it, so none is left unread)
        assert_error(response(conn), 413, "RequestTooLargeError", "larger than 262144 bytes")

        sock = socket.create_connection(("127.0.0.1", srv.port))
        sock.sendall(post_head(**{f"X-Pad-{i}": "x" * 100 for i in range(90)}))
        assert_error(raw_response(sock), 431, "RequestHeaderFieldsTooLargeError", "larger than 8192 bytes")


def test_a_long_prompt_is_refused_before_it_is_tokenized(srv, alone, monkeypatch):
    tok = srv.engine.info.tokenizer
    calls = []
    long = "x" * 2049
    parts = [{"type": "text", "text": "y" * 1000}] * 3
    with beside_a_stream(srv, alone):
        for name in ("__call__", "apply_chat_template"):   # spies on this process's tokenizer (the server's)
            real = getattr(type(tok), name)
            monkeypatch.setattr(type(tok), name,
                                lambda *a, real=real, name=name, **kw: calls.append(name) or real(*a, **kw))
        for path, body in (("/v1/completions", {"prompt": long}), ("/v1/completions", {"prompt": ["hi", long]}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": long}]}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": parts}]})):
            assert_error(request(srv.port, "POST", path, body), 400, "BadRequestError", "characters; this server "
                                                                                        "takes at most 2048")
        assert_error(request(srv.port, "POST", "/v1/completions", {"prompt": [5] * 20000}), 400, "BadRequestError",
                     "20000 tokens")
        assert calls == []
        assert request(srv.port, "POST", "/v1/chat/completions",
                       {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})[0] == 200
        assert calls == ["apply_chat_template", "__call__"]   # the spies see the prompts that are tokenized


def test_more_choices_or_stop_strings_than_allowed(srv, alone):
    with beside_a_stream(srv, alone):
        for body, words in (({"prompt": ["a", "b", "c"], "n": 2}, "3 prompts x n=2 choices are more than the 4"),
                            ({"prompt": "a", "stop": [str(i) for i in range(10 ** 4)]},
                             "10000 stop strings are more than the 4"),
                            ({"prompt": "a", "stop": "s" * 21}, "at most 20 characters")):
            assert_error(request(srv.port, "POST", "/v1/completions", body), 400, "BadRequestError", words)
        chat = {"messages": [{"role": "user", "content": "hi"}], "n": 5}
        assert_error(request(srv.port, "POST", "/v1/chat/completions", chat), 400, "BadRequestError", "n=5")
        status, out, _ = request(srv.port, "POST", "/v1/completions", {"prompt": ["a", "b"], "n": 2, "max_tokens": 1,
                                                                       "stop": ["s" * 20] * 4})
        assert status == 200 and len(out["choices"]) == 4


def test_a_slow_loris_is_cut_and_blocks_no_one(srv, alone):
    """Headers trickled, a body trickled, a connection that sends nothing: each gets a 408 after the
    read timeout and is closed; meanwhile other requests are served."""
    head = post_head()
    trickles = [(head[:20], head[20:]), (head + b"Content-Length: 1000\r\n\r\n", b"{" * 1000), (b"", b"")]
    with beside_a_stream(srv, alone):
        socks = [socket.create_connection(("127.0.0.1", srv.port)) for _ in trickles]
        for s, (start, _) in zip(socks, trickles):
            s.sendall(start)
        cut: dict[int, tuple] = {}
        deadline = time.time() + 30
        for n in range(10 ** 6):
            readable, _, _ = select.select([s for i, s in enumerate(socks) if i not in cut], [], [], 0.1)
            for s in readable:
                cut[socks.index(s)] = raw_response(s)
            if len(cut) == len(socks) or time.time() > deadline:
                break
            for i, (_, rest) in enumerate(trickles):
                if i not in cut and n < len(rest):
                    socks[i].send(rest[n:n + 1])
            if n == 3:   # the others' requests go on
                assert request(srv.port, "GET", "/health", key=None)[0] == 200
                assert request(srv.port, "POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2})[0] == 200
        assert_error(cut[0], 408, "RequestTimeoutError", "headers did not arrive within 2 s")
        assert_error(cut[1], 408, "RequestTimeoutError", "body did not arrive within 2 s")
        assert_error(cut[2], 408, "RequestTimeoutError", "headers did not arrive within 2 s")


def test_connections_past_the_limit_get_a_503_object(srv, alone):
    with beside_a_stream(srv, alone):
        idle = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(LIMITS.limit_concurrency)]
        status, body, headers = request(srv.port, "GET", "/v1/models")
        assert status == 503 and body["error"]["type"] == "ServiceUnavailableError", body
        assert headers["retry-after"] == "1"
        for s in idle:
            s.close()
        deadline = time.time() + 30   # until the server has seen them close
        while request(srv.port, "GET", "/v1/models")[0] == 503 and time.time() < deadline:
            time.sleep(0.05)
        assert request(srv.port, "GET", "/v1/models")[0] == 200


def test_the_key_guards_everything_but_health(srv, alone):
    with beside_a_stream(srv, alone):
        for path in ("/metrics", "/docs", "/redoc", "/openapi.json", "/v1/models", "/nowhere"):
            for key in (None, "sk-tesT"):   # wrong in its last byte: compared whole
                assert_error(request(srv.port, "GET", path, key=key), 401, "AuthenticationError", "API key")
            assert request(srv.port, "GET", path)[0] == (404 if path == "/nowhere" else 200)
        assert request(srv.port, "GET", "/health", key=None)[0] == 200


def test_a_template_that_raises_gets_a_400_object(srv, alone, monkeypatch):
    monkeypatch.setattr(srv.engine.info.tokenizer, "chat_template", "{{ (messages | length) / 0 }}")
    with beside_a_stream(srv, alone):
        chat = {"messages": [{"role": "user", "content": "hi"}]}
        assert_error(request(srv.port, "POST", "/v1/chat/completions", chat), 400, "BadRequestError",
                     "the chat template refused these messages: ZeroDivisionError")


def test_check_request_without_http():
    limits = ServerLimits(max_prompt_chars=10, max_choices=4, max_stop_strings=2, max_stop_chars=3)

    def refused(req) -> str:
        with pytest.raises(Refusal) as e:
            check_request(req, limits, max_model_len=1000)
        assert e.value.status == 400
        return e.value.message

    check_request(CompletionRequest(prompt=["x" * 10, "y"], n=2, stop=["abc", "d"]), limits, 1000)
    check_request(CompletionRequest(prompt=[[1] * 50]), limits, 1000)   # token ids: checked as tokens, later
    assert refused(CompletionRequest(prompt=["a", "b", "c"], n=2)) == \
        "3 prompts x n=2 choices are more than the 4 a request may ask for"
    assert refused(CompletionRequest(prompt="x" * 11)) == "a prompt has 11 characters; this server takes at most 10 " \
                                                          "per prompt"
    chat = [{"role": "user", "content": "x" * 3}, {"role": "assistant", "content": [{"type": "text", "text": "y"}]}]
    assert refused(ChatRequest(messages=chat)).startswith("a prompt has 17 characters")   # roles and text: 4+3+9+1
    assert refused(CompletionRequest(prompt="x", stop=["a", "b", "c"])) == \
        "3 stop strings are more than the 2 a request may have"
    assert refused(CompletionRequest(prompt="x", stop="abcd")) == "a stop string may have at most 3 characters"
    assert ServerLimits().most_prompt_chars(8192) == 16 * 8192
    with pytest.raises(ValueError, match="max_stop_strings must be positive, got 0"):
        ServerLimits(max_stop_strings=0)


def test_each_limit_is_a_serve_flag_that_sets_it():
    """``peagle serve``'s flags come from the limits' fields: every field has one, the defaults are the fields', and
    each flag sets its own field (a flag wired to the wrong field, or a field without a flag, fails here)."""
    from dataclasses import fields

    from peagle.cli import build_parser

    parse = lambda *a: ServerLimits.from_args(build_parser("serve").parse_args(["serve", *a]))  # noqa: E731
    assert parse() == ServerLimits()
    values = {"max_body_bytes": 5, "max_header_bytes": 6, "read_timeout": 2.5, "limit_concurrency": 7,
              "max_prompt_chars": 8, "max_choices": 9, "max_stop_strings": 10, "max_stop_chars": 11}
    assert set(values) == {f.name for f in fields(ServerLimits)}
    flags = [a for f in fields(ServerLimits) for a in (f.metadata["flag"], str(values[f.name]))]
    assert parse(*flags) == ServerLimits(**values)
    assert parse("--request-read-timeout", "0.5").read_timeout == 0.5
    with pytest.raises(ValueError, match="must be positive"):
        parse("--max-stop-strings", "0")
