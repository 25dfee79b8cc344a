"""``peagle synth --server``: the records ``peagle serve`` writes equal the in-process engine's, runs resume,
server errors are retried and then reported per prompt, servers' own token ids are kept, and prompts come
from Hugging Face datasets (or a clear error offline)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from test_serve import free_port, wait_healthy

from peagle.engine.llm_engine import LLMEngine
from peagle.models.loader import load_tokenizer
from peagle.prompts import encode, read_prompts
from peagle.train.synth import read_responses, synthesize
from peagle.train.synth_server import FAILED, ServerConfig, synthesize_server


@pytest.fixture(scope="module")
def served(tiny_chat_dir):
    """``peagle serve`` on the tiny target (the target alone), as a user starts it."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "peagle.cli", "serve", "--target", str(tiny_chat_dir),
                             "--port", str(port), "--max-num-seqs", "4", "--max-model-len", "256",
                             "--served-model-name", "tiny", "--dtype", "float32", "--api-key", "sk-synth"],
                            stderr=subprocess.PIPE, text=True)
    if not wait_healthy(port):
        proc.kill()
        raise RuntimeError(proc.stderr.read())
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture
def prompts(tmp_path):
    p = tmp_path / "prompts.jsonl"
    p.write_text("".join(json.dumps({"id": i, "turns": [f"Tell me about {w}.", "Why?"]}) + "\n"
                         for i, w in enumerate(["cats", "rain", "bread", "maths", "rivers"])))
    return str(p)


def by_id(out) -> dict[str, dict]:
    return {r["id"]: r for r in read_responses(out)}


def test_served_records_equal_the_in_process_engines_and_resume(tiny_chat_dir, served, prompts, tmp_path):
    tok = load_tokenizer(tiny_chat_dir)
    kw = dict(max_new_tokens=8, turns=2, shard_size=3, progress=False)
    server = ServerConfig(served, api_key="sk-synth", concurrency=3)
    first = synthesize_server(server, tok, [prompts], tmp_path / "srv", num_prompts=2, **kw)
    assert first.responses == 4 and first.failed == 0
    again = subprocess.run([sys.executable, "-m", "peagle.cli", "synth", "--server", served + "/v1", "--api-key",
                            "sk-synth", "--target", str(tiny_chat_dir), "--prompts", prompts, "--out",
                            str(tmp_path / "srv"), "--num-prompts", "3", "--max-new-tokens", "8", "--turns", "2",
                            "--shard-size", "3"], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "wrote 2 responses" in again.stderr, again.stderr  # only the new prompt's
    engine = LLMEngine.from_pretrained(str(tiny_chat_dir), method="none", max_num_seqs=4, max_model_len=256)
    synthesize(engine, [prompts], tmp_path / "local", num_prompts=3, **kw)
    srv, local = by_id(tmp_path / "srv"), by_id(tmp_path / "local")
    assert sorted(srv) == sorted(local) and len(srv) == 6 and any("#t2" in i for i in srv)
    for rid, r in srv.items():   # the same greedy text, the second turn after the server's own first answer
        # peagle serve returns the ids it generated (vLLM's return_token_ids): the engine's own, not the text's
        keys = ("prompt", "response", "prompt_token_ids", "response_token_ids")
        assert [r[k] for k in keys] == [local[rid][k] for k in keys], rid


class FlakyServer(BaseHTTPRequestHandler):
    """A server that answers every prompt's first try with 503, a prompt holding "always" with 500 every time,
    and one holding "refused" with 400; the rest the second time, with vLLM's ``return_token_ids`` fields
    (but for one holding "plain": no ids, and a response that stopped on EOS)."""
    calls: dict[str, int] = {}

    def log_message(self, *args):
        pass

    def reply(self, status: int, body: dict, headers: dict | None = None):
        data = json.dumps(body).encode()
        self.send_response(status)
        for k, v in {"Content-Type": "application/json", "Content-Length": str(len(data)), **(headers or {})}.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.reply(200, {"object": "list", "data": [{"id": "flaky", "object": "model"}]})

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        text = req["messages"][-1]["content"]
        n = self.calls[text] = self.calls.get(text, 0) + 1
        if "refused" in text:
            return self.reply(400, {"error": {"message": "prompt too long"}})
        if "always" in text or n == 1:
            return self.reply(503 if n == 1 else 500, {"error": {"message": "busy"}}, {"Retry-After": "0"})
        assert req["return_token_ids"] is True and req["model"] == "flaky"
        if "plain" in text:
            return self.reply(200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": "fine"},
                                                 "finish_reason": "stop"}]})
        self.reply(200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": "fine"},
                                      "finish_reason": "length", "token_ids": [7, 8, len(text)]}],
                         "prompt_token_ids": [1, 2, 3]})


def test_errors_are_retried_then_reported_per_prompt_and_the_run_goes_on(tiny_chat_dir, tmp_path):
    prompts = tmp_path / "p.jsonl"
    texts = ["one", "always fails", "two", "refused here", "three", "plain"]
    prompts.write_text("".join(json.dumps({"id": i, "prompt": t}) + "\n" for i, t in enumerate(texts)))
    FlakyServer.calls = {}
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), FlakyServer)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        server = ServerConfig(f"http://127.0.0.1:{httpd.server_port}", concurrency=2, retries=2, backoff=0.01)
        tok = load_tokenizer(tiny_chat_dir)
        run = synthesize_server(server, tok, [str(prompts)], tmp_path / "out", progress=False)
        assert (run.responses, run.failed) == (4, 2)
        recs = by_id(tmp_path / "out")
        plain = recs.pop("p:5")
        assert sorted(r["prompt"] for r in recs.values()) == ["one", "three", "two"]
        # the server's own ids, as it generated them
        assert all(r["prompt_token_ids"] == [1, 2, 3] and r["response_token_ids"] == [7, 8, len(r["prompt"])]
                   for r in recs.values())
        # none returned: the target's tokenizer and chat template, and the EOS the response stopped on
        assert plain["prompt_token_ids"] == encode(tok, [{"role": "user", "content": "plain"}], chat=True)
        assert plain["response_token_ids"] == tok("fine", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        failed = {json.loads(line)["id"]: json.loads(line) for line in (tmp_path / "out" / FAILED).open()}
        assert {f["attempts"] for f in failed.values()} == {3, 1}  # 500s retried twice; the 400 not retried
        assert "HTTP 500" in failed["p:1"]["error"] and "HTTP 400" in failed["p:3"]["error"]
        assert FlakyServer.calls == {"one": 2, "always fails": 3, "two": 2, "refused here": 1, "three": 2, "plain": 2}
        # a re-run asks again for the failed prompts alone
        FlakyServer.calls = {}
        assert synthesize_server(server, tok, [str(prompts)], tmp_path / "out", progress=False).failed == 2
        assert set(FlakyServer.calls) == {"always fails", "refused here"}
    finally:
        httpd.shutdown()
    with pytest.raises(ConnectionError, match="no OpenAI-compatible server answers"):
        synthesize_server(ServerConfig(f"http://127.0.0.1:{free_port()}"), tok, [str(prompts)], tmp_path / "x",
                          progress=False)


def read_prompts_offline(arg: str, tmp_path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    code = f"from peagle.prompts import read_prompts; print([p.turns for p in read_prompts([{arg!r}])])"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_prompts_from_a_hugging_face_dataset_and_a_clear_error_offline(tmp_path):
    pytest.importorskip("datasets")
    folder = tmp_path / "chats"
    folder.mkdir()
    (folder / "train.jsonl").write_text(json.dumps({"prompt_id": "a", "messages": [
        {"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "More?"}]}) + "\n")
    res = read_prompts_offline(str(folder), tmp_path)
    assert res.returncode == 0 and res.stdout.strip() == "[['Hi?', 'More?']]", res.stderr
    # a dataset with several configs (as GSM8K's main and socratic): NAME:CONFIG:SPLIT picks one
    configs = tmp_path / "configs"
    for config in ("main", "socratic"):
        (configs / config).mkdir(parents=True)
        (configs / config / "train.jsonl").write_text(json.dumps({"question": f"Sum? ({config})"}) + "\n")
    (configs / "README.md").write_text("---\nconfigs:\n" + "".join(
        f"- config_name: {c}\n  data_files:\n  - split: train\n    path: {c}/train.jsonl\n"
        for c in ("main", "socratic")) + "---\n")
    res = read_prompts_offline(f"{configs}:socratic:train", tmp_path)
    assert res.returncode == 0 and res.stdout.strip() == "[['Sum? (socratic)']]", res.stderr
    res = read_prompts_offline("nobody-here/no-such-prompts:train", tmp_path)
    assert res.returncode != 0 and "Offline, give a JSONL file of prompts instead" in res.stderr, res.stderr
    with pytest.raises(FileNotFoundError, match="no such dataset file"):   # a mistyped file is no dataset id
        read_prompts([str(tmp_path / "prompts.jsonl")])
