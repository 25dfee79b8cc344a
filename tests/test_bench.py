"""Benchmarks: the metric arithmetic on hand-made streams, the Prometheus speculation counters, the
dataset readers, ``bench serve`` against a live ``peagle serve``, tiny ``bench offline`` / ``bench sweep`` runs that
write the table and the plots, and the baseline's peers: its orchestration on fake peers (CI has no
llama.cpp), llama.cpp on the default model where it is installed."""
from __future__ import annotations

import dataclasses
import gzip
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_serve import KEY, server  # noqa: F401  (the live tiny server fixture)

from peagle.bench.peers.llamacpp import available as llamacpp_available
from peagle.bench.metrics import RequestRecord, parse_spec_counters, spec_delta, spec_summary, summarize
from peagle.bench.offline import grid_cells, k_order
from peagle.bench.peers import Decode, Peer, PeerError, Prefills, checked_decode
from peagle.engine.auto_k import parse_k
from peagle.bench.workload import load_workload, messages
from peagle.prompts import render
from peagle.cli import build_parser, main
from peagle.prompts import HUMANEVAL, MT_BENCH, read_prompt_file, read_prompts


# ----------------------------------------------------------------------------- arithmetic

def test_metrics_on_recorded_streams():
    # a completions stream: 3 chunks (5 tokens: speculative chunks carry several), then usage
    a = RequestRecord(start_time=10.0)
    for t, data in [(10.10, {"choices": [{"text": "Hel"}]}), (10.15, {"choices": [{"text": "lo"}]}),
                    (10.20, {"choices": [{"text": "!", "finish_reason": "length"}]}),
                    (10.25, {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 5}})]:
        a.event(data, t)
    assert a.success and a.text == "Hello!" and (a.prompt_len, a.output_tokens) == (7, 5)
    assert a.ttft == pytest.approx(0.1) and a.itl == pytest.approx([0.05, 0.05])
    assert a.latency == pytest.approx(0.2)   # the usage chunk is not output
    # a chat stream: 2 chunks
    b = RequestRecord(start_time=20.0, turn=1)   # a conversation's second turn
    b.event({"choices": [{"delta": {"role": "assistant", "content": "Hi"}}]}, 20.3)
    b.event({"choices": [{"delta": {"content": " there"}, "finish_reason": "stop"}]}, 20.4)
    b.event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}, 20.41)
    assert b.text == "Hi there"
    failed = RequestRecord(start_time=30.0, error="HTTP 503")

    r = summarize([a, b, failed], duration=2.0)
    assert (r["completed"], r["failed"], r["total_input_tokens"], r["total_output_tokens"]) == (2, 1, 10, 7)
    expect = {
        "request_throughput": 1.0, "output_throughput": 3.5, "total_token_throughput": 8.5,
        "mean_ttft_ms": 200, "median_ttft_ms": 200, "std_ttft_ms": 100, "p99_ttft_ms": 298,
        "mean_tpot_ms": 62.5, "median_tpot_ms": 62.5,        # (200-100)/4 = 25 and (400-300)/1 = 100
        "mean_itl_ms": 200 / 3, "median_itl_ms": 50, "p99_itl_ms": 99,   # 50, 50, 100
        "mean_e2el_ms": 300, "median_e2el_ms": 300, "p99_e2el_ms": 398,
    }
    for key, value in expect.items():
        assert r[key] == pytest.approx(value), key
    assert r["mean_ttft_ms_later_turns"] == pytest.approx(300)   # b's alone
    empty = summarize([failed], duration=1.0)
    assert empty["completed"] == 0 and empty["mean_ttft_ms"] == 0.0 and empty["mean_ttft_ms_later_turns"] is None


PEAGLE_METRICS = """\
# HELP peagle:spec_decode_num_drafts_total Verify rounds with drafts
# TYPE peagle:spec_decode_num_drafts_total counter
peagle:spec_decode_num_drafts_total 10.0
peagle:spec_decode_num_drafts_created 1.7e+09
peagle:spec_decode_num_draft_tokens_total 30.0
peagle:spec_decode_num_accepted_tokens_total 12.0
peagle:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 7.0
peagle:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 4.0
peagle:spec_decode_num_accepted_tokens_per_pos_total{position="2"} 1.0
peagle:generation_tokens_total 99.0
"""


def test_spec_counters_and_acceptance():
    after = parse_spec_counters(PEAGLE_METRICS)
    assert (after.num_drafts, after.num_draft_tokens, after.num_accepted_tokens) == (10, 30, 12)
    assert after.accepted_per_pos == [7, 4, 1]
    before = parse_spec_counters("peagle:spec_decode_num_drafts_total 4\npeagle:spec_decode_num_draft_tokens_total 12\n"
                                 "peagle:spec_decode_num_accepted_tokens_total 3\n"
                                 'peagle:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 2\n'
                                 'peagle:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 1\n')
    s = spec_summary(spec_delta(after, before))   # 6 rounds, 18 drafted, 9 accepted: 5, 3, 1 by position
    assert s["acceptance_length"] == pytest.approx(2.5) and s["acceptance_rate"] == pytest.approx(0.5)
    assert s["spec_decode_acceptance_rate"] == pytest.approx(50.0)
    assert s["spec_decode_per_position_acceptance_rates"] == pytest.approx([5 / 6, 0.5, 1 / 6])
    assert (s["spec_decode_num_drafts"], s["spec_decode_draft_tokens"], s["spec_decode_accepted_tokens"]) == (6, 18, 9)
    # vLLM's names, two engines summed, other labels around the position
    vllm = "\n".join(f'vllm:spec_decode_{name}_total{{engine="{e}",model_name="m"{pos}}} {v}'
                     for e in (0, 1) for name, pos, v in [("num_drafts", "", 5), ("num_draft_tokens", "", 15),
                                                          ("num_accepted_tokens", "", 6),
                                                          ("num_accepted_tokens_per_pos", ',position="0"', 4),
                                                          ("num_accepted_tokens_per_pos", ',position="1"', 2)])
    v = parse_spec_counters(vllm)
    assert (v.num_drafts, v.num_draft_tokens, v.num_accepted_tokens, v.accepted_per_pos) == (10, 30, 12, [8, 4])
    assert parse_spec_counters("peagle:generation_tokens_total 5\n") is None
    assert spec_summary(None) == {"acceptance_length": None, "acceptance_rate": None}


# ----------------------------------------------------------------------------- datasets

def write_jsonl(path, rows, gz=False):
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if gz:
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return path


def test_dataset_readers(tmp_path):
    mt = write_jsonl(tmp_path / "question.jsonl", [
        {"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Now shorter."]},
        {"question_id": 82, "category": "coding", "turns": ["Sort a list.", "In C."]},
        {"question_id": 83, "category": "coding", "turns": ["", "skipped: empty first turn"]}])
    ps = read_prompt_file(mt, "mt-bench")
    assert [p.id for p in ps] == ["question:81", "question:82"] and ps[0].turns == ["Write a poem.", "Now shorter."]
    assert ps[0].text == "Write a poem." and ps[1].category == "coding"
    assert [p.id for p in read_prompt_file(mt, "spec_bench", category="coding")] == ["question:82"]
    he = write_jsonl(tmp_path / "HumanEval.jsonl.gz", [{"task_id": "HumanEval/0", "prompt": "def f():\n"}], gz=True)
    (p,) = read_prompt_file(he, "humaneval")
    assert (p.id, p.source, p.turns) == ("HumanEval:HumanEval/0", "HumanEval", ["def f():\n"])
    sg = write_jsonl(tmp_path / "sg.jsonl", [{"id": "a", "turns": ["one", "two", "three"]}])
    assert read_prompt_file(sg, "sharegpt")[0].turns == ["one", "two", "three"]
    conv = tmp_path / "sharegpt.json"   # vLLM's ShareGPT file: a JSON list with conversations
    conv.write_text(json.dumps([{"id": "x", "conversations": [{"from": "human", "value": "hi"},
                                                              {"from": "gpt", "value": "hello"},
                                                              {"from": "human", "value": "bye"}]}]))
    assert read_prompt_file(conv, "sharegpt")[0].turns == ["hi", "bye"]
    custom = write_jsonl(tmp_path / "c.jsonl", [{"prompt": "p0"}, {"prompt": "p1"}])
    assert [p.id for p in read_prompt_file(custom, "custom")] == ["c:0", "c:1"]
    assert [p.text for p in read_prompts([str(mt), str(custom)])] == ["Write a poem.", "Sort a list.", "p0", "p1"]
    with pytest.raises(ValueError, match=r"c.jsonl:1: no 'turns' field"):
        read_prompt_file(custom, "mt-bench")
    with pytest.raises(ValueError, match="unknown dataset"):
        read_prompt_file(custom, "alpaca")
    with pytest.raises(FileNotFoundError, match="no such dataset file"):
        read_prompt_file(tmp_path / "missing.jsonl", "custom")
    (tmp_path / "bad.jsonl").write_text('{"prompt": "ok"}\n{oops\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not valid JSON"):
        read_prompt_file(tmp_path / "bad.jsonl", "custom")


def test_packaged_benchmark_files():
    """MT-Bench and HumanEval ship inside the package, each with its licence, and are the datasets' defaults."""
    from peagle.prompts import dataset_path

    assert dataset_path("mt-bench", None) == MT_BENCH and dataset_path("humaneval", None) == HUMANEVAL
    assert (MT_BENCH.parent / "LICENSE").is_file() and (HUMANEVAL.parent / "LICENSE").is_file()
    mt = read_prompt_file(MT_BENCH, "mt-bench")
    assert len(mt) == 80 and all(len(p.turns) == 2 for p in mt)
    assert len(read_prompt_file(HUMANEVAL, "humaneval")) == 164


def test_workload_selection_and_rendering(tmp_path, tiny_chat_dir):
    from peagle.models.loader import load_tokenizer

    path = write_jsonl(tmp_path / "c.jsonl", [{"prompt": f"p{i}"} for i in range(10)])

    def workload(*flags):
        args = build_parser().parse_args(["bench", "offline", "--dataset-name", "custom", "--dataset-path", str(path),
                                          *flags])
        return load_workload(args, args.dataset_name, args.dataset_path)

    a, b = workload("--num-prompts", "4"), workload("--num-prompts", "4")
    assert [p.id for p in a.prompts] == [p.id for p in b.prompts] != [f"c:{i}" for i in range(4)]  # seeded shuffle
    assert [p.id for p in workload("--num-prompts", "3", "--disable-shuffle").prompts] == ["c:0", "c:1", "c:2"]
    assert a.output_len == 128 and workload("--output-len", "9").output_len == 9 and a.chat
    assert messages(["q1", "q2"], ["a1"]) == [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"},
                                              {"role": "user", "content": "q2"}]
    tok = load_tokenizer(tiny_chat_dir)
    text = render(tok, messages(["q1", "q2"], ["a1"]), chat=True)
    assert text.index("q1") < text.index("a1") < text.index("q2") and text.endswith("<|im_start|>assistant\n")
    assert render(tok, messages(["q1"], []), chat=False) == "q1"


def test_grid_skips_k_beyond_the_trained_k():
    models = SimpleNamespace(trained_k=3)
    cells = [c[:3] for c in grid_cells(models, ["parallel", "eagle3", "none"], [1, 5], [1, 4])]
    assert cells == [("parallel", 1, 1), ("eagle3", 1, 1), ("eagle3", 5, 1), ("none", 0, 1),
                     ("parallel", 1, 4), ("eagle3", 1, 4), ("eagle3", 5, 4), ("none", 0, 4)]
    cells = [c[:3] for c in grid_cells(models, ["parallel", "none"], [parse_k("5"), parse_k("auto")], [1])]
    assert cells == [("parallel", "auto", 1), ("none", 0, 1)] and sorted([7, "auto", 1], key=k_order) == [1, 7, "auto"]


def test_grid_crosses_p_eagle_with_each_tree_and_budget():
    """Trees are P-EAGLE's alone; an ``auto`` tree runs at each budget, a chain or explicit tree once."""
    models = SimpleNamespace(trained_k=7)
    cells = grid_cells(models, ["parallel", "eagle3", "none"], ["auto"], [1], ["chain", "auto", "[(0,), (1,)]"], [4, 16])
    assert cells == [("parallel", "auto", 1, "chain", 16), ("parallel", "auto", 1, "auto", 4),
                     ("parallel", "auto", 1, "auto", 16), ("parallel", "auto", 1, "[(0,), (1,)]", 16),
                     ("eagle3", "auto", 1, "chain", 16), ("none", 0, 1, "chain", 16)]


# ----------------------------------------------------------------------------- live runs

@pytest.fixture
def prompts_file(tmp_path):
    return write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": f"Name {i} colours."} for i in range(4)])


def bench_serve(port, model_dir, prompts_file, out, capsys, *extra) -> tuple[dict, str]:
    """``peagle bench serve`` against the tiny server on the custom prompts: (saved result, printed report)."""
    rc = main(["bench", "serve", "--base-url", f"http://127.0.0.1:{port}", "--model", str(model_dir),
               "--served-model-name", "tiny", "--dataset-name", "custom", "--dataset-path", str(prompts_file),
               "--num-prompts", "4", "--temperature", "0", "--ignore-eos", "--save-result",
               "--result-filename", str(out), "--disable-tqdm", *extra])
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    return json.loads(out.read_text()), printed.out


def test_bench_serve_against_peagle_serve(server, tiny_chat_dir, prompts_file, tmp_path, monkeypatch, capsys):  # noqa: F811
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    res, printed = bench_serve(server, tiny_chat_dir, prompts_file, tmp_path / "result.json", capsys,
                               "--max-concurrency", "2", "--custom-output-len", "8")
    for key in ("completed", "failed", "duration", "request_throughput", "output_throughput", "total_token_throughput",
                "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms",
                "mean_itl_ms", "p99_itl_ms", "mean_e2el_ms", "median_e2el_ms", "p99_e2el_ms", "max_concurrency",
                "acceptance_length", "acceptance_rate", "spec_decode_acceptance_length"):
        assert key in res, key
    assert (res["completed"], res["failed"], res["total_output_tokens"]) == (4, 0, 32)
    assert res["max_concurrency"] == 2 and res["model_id"] == str(tiny_chat_dir)
    # the server runs P-EAGLE with K=3: AL and acceptance come from its /metrics
    rates = res["spec_decode_per_position_acceptance_rates"]
    assert res["spec_decode_num_drafts"] > 0 and len(rates) == 3
    al = 1 + res["spec_decode_accepted_tokens"] / res["spec_decode_num_drafts"]
    assert res["acceptance_length"] == pytest.approx(al) == pytest.approx(1 + sum(rates))
    assert "Serving Benchmark Result" in printed and "Acceptance length:" in printed


def test_bench_serve_mixed_long_prompts(server, tiny_chat_dir, prompts_file, tmp_path, monkeypatch, capsys):  # noqa: F811
    """Long prompts mixed among the short ones, Poisson arrivals: TTFT and E2EL for each group. At most 4 in
    flight: the server takes 2 running and 2 queued, and refuses more (a busy machine would fail the count)."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    res, printed = bench_serve(server, tiny_chat_dir, prompts_file, tmp_path / "mixed.json", capsys, "--long-prompts",
                               "2", "--long-prompt-len", "60", "--request-rate", "20", "--custom-output-len", "4",
                               "--max-concurrency", "4")
    assert (res["completed"], res["short_completed"], res["long_completed"]) == (6, 4, 2)
    assert res["total_input_tokens"] > 2 * 60
    for group in ("short", "long"):
        assert res[f"{group}_p99_ttft_ms"] >= res[f"{group}_median_ttft_ms"] > 0 and res[f"{group}_median_e2el_ms"] > 0
        assert f"{group} requests:" in printed


def test_bench_serve_errors_are_one_line(tiny_chat_dir, prompts_file, capsys):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]   # nothing listens here once closed
    tok = ["--tokenizer", str(tiny_chat_dir)]
    for argv, msg in [([f"--port={port}", "--dataset-path", str(prompts_file), *tok], "cannot reach the server"),
                      (["--dataset-path", str(prompts_file) + ".missing", *tok], "no such dataset file"),
                      (["--dataset-path", str(prompts_file), "--model", "tiny"], "neither a local folder")]:
        rc = main(["bench", "serve", "--dataset-name", "custom", *argv])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 1 and err[-1].startswith("peagle: error: ") and msg in err[-1], err


@pytest.fixture(scope="module")
def head_dir(tiny_chat_dir, tmp_path_factory):
    from peagle.models.drafter import save_drafter
    from peagle.models.loader import choose_mask_token, init_drafter, load_target, load_tokenizer

    target, path = load_target(str(tiny_chat_dir), "float32")
    out = tmp_path_factory.mktemp("head")
    save_drafter(init_drafter(target, 1, choose_mask_token(load_tokenizer(path))), out)
    return out


def test_bench_offline_json(tiny_chat_dir, head_dir, prompts_file, capsys):
    rc = main(["bench", "offline", "--target", str(tiny_chat_dir), "--drafter", str(head_dir), "-k", "2",
               "--max-concurrency", "2", "--dataset-name", "custom", "--dataset-path", str(prompts_file),
               "--num-prompts", "3", "--output-len", "6", "--json", "--disable-tqdm", "--enforce-eager"])
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    res = json.loads(printed.out.strip().splitlines()[-1])
    cells = {c["method"]: c for c in res["cells"]}
    assert set(cells) == {"parallel", "eagle3", "none"} and res["concurrency"] == 2
    for m in ("parallel", "eagle3"):
        c = cells[m]
        assert c["k"] == 2 and c["completed"] == 3 and c["spec_decode_num_drafts"] > 0
        al = 1 + c["spec_decode_accepted_tokens"] / c["spec_decode_num_drafts"]
        assert c["acceptance_length"] == pytest.approx(al)
        assert len(c["spec_decode_per_position_acceptance_rates"]) == 2 and c["output_throughput"] > 0
    assert cells["none"]["acceptance_length"] is None and cells["none"]["k"] == 0


def test_bench_serving_tiny(tiny_chat_dir, head_dir, tmp_path, capsys, monkeypatch):
    """The serving table on the tiny model: each server started, measured at each concurrency and
    stopped, the offline engine beside it, every turn of two conversations answered in full (the servers' as the
    offline engine's: --multi-turn reaches the client), the later turns' TTFT apart."""
    from test_serve import free_port

    monkeypatch.setenv("PEAGLE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "serving.json"
    chats = write_jsonl(tmp_path / "chats.jsonl", [{"turns": [f"Name {i} colours.", "And two more."]} for i in range(2)])
    rc = main(["bench", "serving", "--target", str(tiny_chat_dir), "--drafter", str(head_dir),
               "--systems", "peagle-none,peagle-parallel", "--concurrency", "1,2", "--dataset-name", "sharegpt",
               "--dataset-path", str(chats), "--multi-turn", "--num-prompts", "2", "--output-len", "6",
               "--port", str(free_port()), "--json", str(out)])
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    runs = json.loads(out.read_text())["runs"]
    cells = {(r["system"], r["via"], r["concurrency"]) for r in runs}
    assert cells == {(s, via, c) for s in ("peagle-none", "peagle-parallel") for via in ("server", "offline")
                     for c in (1, 2)}
    assert all(r["completed"] == 4 and r["failed"] == 0 and r["output_throughput"] > 0 for r in runs)
    assert all(r["mean_ttft_ms_later_turns"] > 0 for r in runs)
    # auto K may not draft at all with a random head; when it drafts, AL is at least 1
    assert all(r["acceptance_length"] is None or r["acceptance_length"] >= 1 for r in runs)
    rows = [line for line in printed.out.splitlines() if line.startswith("| peagle-")]
    assert len(rows) == 4 and all(line.count("|") == 11 for line in rows)


def test_llamacpp_peer_configuration(monkeypatch):
    from peagle.bench.peers import llamacpp
    from peagle.models.loader import default_gguf

    assert llamacpp.gguf_file("Q4_1") == default_gguf()   # the shipped file, as it ships
    with pytest.raises(ValueError, match="unknown llama.cpp precision"):
        llamacpp.gguf_file("Q2_K")
    monkeypatch.setattr(llamacpp, "cpu_flags", lambda: frozenset({"avx512f", "amx_tile"}))
    assert llamacpp.safe_batch("Q4_1") == 1 and "AMX" in llamacpp.config_note("Q4_1")
    assert llamacpp.safe_batch("F32") is None and llamacpp.config_note("F32") == "defaults"
    monkeypatch.setattr(llamacpp, "cpu_flags", lambda: frozenset({"avx2"}))
    assert llamacpp.safe_batch("Q4_1") is None
    monkeypatch.setattr(llamacpp, "native_bin", lambda name: None)
    monkeypatch.setattr(llamacpp, "available", lambda: False)
    with pytest.raises(RuntimeError, match=r"pip install 'peagle\[llamacpp\]'"):
        llamacpp.server_command("F32", 8000)
    with pytest.raises(RuntimeError, match="LLAMA_CPP_BIN"):
        llamacpp.llama_bench("Q4_1")
    assert "one request at a time" in llamacpp.server_note(4)
    monkeypatch.setattr(llamacpp, "native_bin", lambda name: Path("/opt/llama") / name)  # llama.cpp's own server
    cmd = llamacpp.server_command("Q4_1", 8000, parallel=4)
    assert cmd[0] == "/opt/llama/llama-server" and cmd[cmd.index("-np") + 1] == "4" and str(default_gguf()) in cmd
    assert llamacpp.server_note(4) == "llama-server, 4 slots (--parallel 4)"
    own = Path("/models/llama-3.2-3b-Q4_K_M.gguf")   # a user's own file, served as it is
    cmd = llamacpp.server_command(own, 8000, parallel=2)
    assert cmd[cmd.index("-m") + 1] == str(own) and cmd[cmd.index("-np") + 1] == "2" and "--no-repack" not in cmd

def test_bench_serving_refuses_llamacpp_on_another_target(capsys, tmp_path):
    rc = main(["bench", "serving", "--target", "x", "--systems", "llamacpp-F32", "--dataset-name", "mt-bench"])
    assert rc == 1 and "default model only" in capsys.readouterr().err
    for target in ([], ["--target", str(tmp_path)], ["--target", str(tmp_path / "absent.gguf")]):
        rc = main(["bench", "serving", *target, "--systems", "llamacpp", "--dataset-name", "mt-bench"])
        assert rc == 1 and "must name one" in capsys.readouterr().err


def test_bench_serving_refuses_a_port_another_server_answers_on():
    """A server left on the port would answer the readiness check and every request in place of the one
    started (which fails to bind): refused before anything starts."""
    import socket

    from peagle.bench import serving

    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        with pytest.raises(RuntimeError, match=f"port {port} is in use"):
            with serving.running([sys.executable, "-c", "import time; time.sleep(30)"], port):
                pytest.fail("ran beside the other server")


def test_a_gguf_files_tokenizer_converts_none_of_its_weights(monkeypatch, tmp_path):
    """``bench serve --tokenizer FILE.gguf`` reads the tokenizer from the file's metadata: converting the weights
    to a float32 folder wrote 12 GB for a 3B file and ran out of memory at 8B."""
    from peagle.bench.workload import load_tokenizer_for
    from peagle.models import loader

    own = tmp_path / "llama-3.2-3b-Q4_K_M.gguf"
    own.write_bytes(b"GGUF")
    meta = loader.resolve_target(None, weights=False)   # the default model's config and tokenizer stand in
    monkeypatch.setattr(loader, "convert_gguf", lambda *a: pytest.fail("converted the weights for a tokenizer"))
    monkeypatch.setattr(loader, "_gguf_meta", lambda gguf, out: meta)
    assert load_tokenizer_for(str(own))("Hello")["input_ids"]


def test_bench_serving_runs_llamacpp_on_the_targets_own_file(monkeypatch, tmp_path):
    """``llamacpp`` starts llama-server on --target's GGUF file itself: the file peagle's systems run."""
    from peagle.bench import serving
    from peagle.bench.peers import llamacpp

    own = tmp_path / "llama-3.2-1b-Q4_0.gguf"
    own.write_bytes(b"GGUF")
    monkeypatch.setattr(llamacpp, "native_bin", lambda name: Path("/opt/llama") / name)
    args = serving.argparse.Namespace(target=str(own), port=8123, llamacpp_parallel=4)
    cmd = serving.server_command("llamacpp", args, 4)
    assert cmd[0] == "/opt/llama/llama-server" and cmd[cmd.index("-m") + 1] == str(own)


def test_bench_serving_sends_the_servers_the_offline_engines_workload():
    """The ``bench serve`` client gets the workload the offline engine runs: every turn of a conversation with
    --multi-turn (a server's prefix cache is measured by them), no chat template with --skip-chat-template."""
    from peagle.bench import serve, serving

    parser = build_parser()
    for flags in ([], ["--multi-turn"], ["--multi-turn", "--skip-chat-template"]):
        args = parser.parse_args(["bench", "serving", "--dataset-name", "mt-bench", "--target", "m.gguf", *flags])
        p = serving.argparse.ArgumentParser()
        serve.add_args(p)
        got = p.parse_args(serving.client_argv(args, 4))
        assert (got.multi_turn, got.skip_chat_template) == (args.multi_turn, args.skip_chat_template), flags
        assert (got.max_concurrency, got.tokenizer, got.num_prompts) == (4, "m.gguf", args.num_prompts)


def test_bench_offline_sampled_outputs_equal_plain_decoding(tiny_chat_dir, head_dir, prompts_file, capsys):
    """Sampled (request n seeded with --seed + n), float32: every speculative cell writes what `none` writes."""
    rc = main(["bench", "offline", "--target", str(tiny_chat_dir), "--drafter", str(head_dir), "-k", "2,auto",
               "--max-concurrency", "2", "--dataset-name", "custom", "--dataset-path", str(prompts_file),
               "--num-prompts", "3", "--output-len", "8", "--temperature", "0.8", "--dtype", "float32", "--json",
               "--disable-tqdm", "--enforce-eager"])
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    cells = json.loads(printed.out.strip().splitlines()[-1])["cells"]
    assert len(cells) == 5 and all(c["agrees_with_none"] == 1.0 for c in cells if c["method"] != "none")


def test_bench_sweep_tiny(tiny_chat_dir, head_dir, prompts_file, tmp_path, capsys):
    out = tmp_path / "sweep"
    rc = main(["bench", "sweep", "--target", str(tiny_chat_dir), "--drafter", str(head_dir), "-k", "1,2",
               "--concurrency", "1,2", "--datasets", f"custom={prompts_file}", "--num-prompts", "2",
               "--output-len", "6", "--prompt-lookup-num-tokens", "3", "--out", str(out), "--disable-tqdm"])
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    res = json.loads((out / "sweep.json").read_text())
    assert len(res["cells"]) == 2 * (2 + 2 + 1)   # concurrency x (P-EAGLE K=1,2 + EAGLE-3 K=1,2 + none)
    assert {(b["system"], b["completed"]) for b in res["baselines"]} == {("hf", 2), ("hf-prompt-lookup", 2)}
    assert all(c["completed"] == 2 and c["output_throughput"] > 0 for c in res["cells"])
    md = (out / "sweep.md").read_text()
    for heading in ("Acceptance length (AL)", "| P-EAGLE | 2 |", "Output throughput", "P-EAGLE / EAGLE-3",
                    "HF prompt lookup, 3 tokens"):
        assert heading in md, heading
    for png in ("throughput.png", "acceptance_length.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_learning_curves_table_and_plot(tmp_path):
    from peagle.bench.curves import main as curves

    for name, layers, als, init in (("a", 1, [1.1, 1.2], None), ("b", 4, [1.05, 1.3], None),
                                    ("c", 1, [1.25, 1.4], str(tmp_path / "a"))):
        run = tmp_path / name
        run.mkdir()
        lines = [{"event": "start", "config": {"method": "peagle", "layers": layers, "k": 4, "lr": 1e-3,
                                                "batch_size": 4, "draft_vocab": 512, "init_from": init}}]
        lines += [{"event": "eval", "step": 10 * (i + 1), "tokens": 1000 * (i + 1), "acc": [0.5, 0.2, 0.1, 0.05],
                   "al": al, "elapsed_s": 60.0 * (i + 1)} for i, al in enumerate(als)]
        lines.append(lines[-1])  # a resumed run logs its last evaluation again: shown once
        (run / "train_log.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    curves([str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "c"), "--labels", "one", "four", "again",
            "--threads", "2", "--out", str(tmp_path / "out")])
    md = (tmp_path / "out" / "curves.md").read_text()
    assert "### one" in md and "### four" in md and "4 layer(s)" in md
    assert md.count("| 20 | 2,000 | 4.0 | 1.300 | 0.500 / 0.200 / 0.100 / 0.050 |") == 1
    # the run started from "a" counts on from a's end (2,000 tokens, 4 core-minutes)
    assert "| 20 | 4,000 | 8.0 | 1.400 |" in md and "started from" in md.split("### again")[1]
    assert (tmp_path / "out" / "curves.png").stat().st_size > 1000


# ----------------------------------------------------------------------------- baseline peers

@dataclasses.dataclass(kw_only=True)
class FakePeer(Peer):
    """Decodes ``tokens`` (cut to n, minus ``short`` of them) at ``rate`` tok/s after a 10 ms first token."""
    tokens: list[int]
    rate: float
    short: int = 0
    calls: list = dataclasses.field(default_factory=list)   # (event, name), shared among the peers of a test

    def prepare(self) -> None:
        self.calls.append(("prepare", self.name))

    def decode(self, ids: list[int], n: int) -> Decode:
        self.calls.append(("decode", self.name))
        return Decode(tokens=self.tokens[:n - self.short], ttft_s=0.01, elapsed_s=0.01 + (n - 1) / self.rate)


def fake_peers(calls: list, short: str | None = None) -> dict[str, Peer]:
    same, other = list(range(10, 20)), [10, 11, 99, 13, 14, 15, 16, 17, 18, 19]
    specs = [("hf", "HF transformers", "BF16", same, 10.0), ("none", "peagle", "BF16", same, 20.0),
             ("parallel", "peagle", "BF16", same, 30.0), ("llamacpp-BF16", "llama.cpp", "BF16", other, 40.0),
             ("llamacpp-Q4_1", "llama.cpp", "Q4_1", same, 50.0)]
    return {name: FakePeer(name=name, system=system, label=f"{system} `{name}`", precision=prec, threads="fake 1",
                           note="n_batch=1" if name.endswith("Q4_1") else "", tokens=toks, rate=rate,
                           short=int(name == short), calls=calls)
            for name, system, prec, toks, rate in specs}


def test_baseline_orchestration_with_fake_peers():
    """Every peer on every prompt, interleaved in a rotating order, each set up before it runs; the
    summary pairs peagle with llama.cpp at the same precision and says whose greedy tokens agree."""
    from tqdm import tqdm

    from peagle.bench.baseline.end_to_end import bench_end_to_end, summarize_end_to_end
    from peagle.bench.baseline.runner import markdown

    calls: list = []
    peers = fake_peers(calls)
    args = SimpleNamespace(max_new_tokens=6, reps=2, wait_idle=0, settle=0)
    prompts = [[1, 2, 3], [4, 5]]
    runs = bench_end_to_end(args, peers, prompts, tqdm(disable=True))
    decodes = [name for event, name in calls if event == "decode"]
    assert decodes[:5] == list(peers) and len(decodes) == 5 * (1 + 2 * 2)   # warm-up, then 2 reps x 2 prompts
    firsts = [decodes[5 + 5 * r] for r in range(4)]
    assert firsts == ["hf", "none", "parallel", "llamacpp-BF16"]              # who goes first rotates
    assert all(calls[i - 1] == ("prepare", name) for i, (event, name) in enumerate(calls) if event == "decode")

    explained = []
    summary = summarize_end_to_end(runs, peers, prompts, eos={2},
                                   explain=lambda prefix, a, b: explained.append((a, b)) or (0.5, 0.25))
    s = summary["systems"]
    assert s["none"]["decode_tok_s"] == pytest.approx(20.0) and s["none"]["ratio_vs_hf"] == pytest.approx(2.0)
    assert s["none"]["llamacpp_peer"] == "llamacpp-BF16" and s["none"]["ratio_vs_llamacpp"] == pytest.approx(0.5)
    assert s["parallel"]["paired_ratio_vs_llamacpp"] == pytest.approx(0.75)
    assert "llamacpp_peer" not in s["llamacpp-BF16"] and "ratio_vs_llamacpp" not in s["hf"]
    assert s["none"]["greedy_agreement"] == {"hf": 2} and s["llamacpp-Q4_1"]["greedy_agreement"] == {"none": 2, "hf": 2}
    assert s["llamacpp-BF16"]["greedy_agreement"] == {"none": 0, "hf": 0} and explained == [(99, 12)] * 4
    assert summary["prompts"][0]["llamacpp-BF16_vs_none"]["first_mismatch"] == 2

    md = markdown({"args": {"max_new_tokens": 6, "prompts": 2, "reps": 2, "k": "auto"}, "env": {"dtype": "bfloat16"},
                   "end_to_end": summary})
    assert "| llama.cpp `llamacpp-BF16` | BF16 | fake 1 | 40.0 |" in md and "`none` 0/2, `hf` 0/2" in md
    assert "| peagle `none` | BF16 | fake 1 | 20.0 | 20.0-20.0 | 10 | " in md and "| 0.50 (0.50) |" in md
    assert "Configuration: llama.cpp `llamacpp-Q4_1`: n_batch=1." in md
    assert "Ours `none` / llama.cpp `llamacpp-BF16` decode, the same weight precision: **0.50x**" in md


@pytest.mark.parametrize("short", ["none", "llamacpp-Q4_1"])
def test_a_peer_that_stops_early_is_caught(short):
    """A peer returning n-1 tokens (stopping at EOS, say) would be timed on other work than its peers."""
    from tqdm import tqdm

    from peagle.bench.baseline.end_to_end import bench_end_to_end

    peers = fake_peers([], short=short)
    with pytest.raises(PeerError, match=f"{short} gave 7 tokens, 8 asked for"):
        checked_decode(peers[short], [1, 2], 8)
    with pytest.raises(PeerError, match=short):
        bench_end_to_end(SimpleNamespace(max_new_tokens=6, reps=1, wait_idle=0, settle=0), peers, [[1]],
                         tqdm(disable=True))


def test_llamacpp_peers_chosen_and_skipped(monkeypatch, capsys):
    from peagle.bench.baseline import runner
    from peagle.bench.peers import llamacpp

    assert runner.llamacpp_kinds("auto", "BF16") == ["BF16", "Q4_1"]
    assert runner.llamacpp_kinds("auto", "Q4_1") == ["Q4_1"] and runner.llamacpp_kinds("none", "F32") == []
    assert runner.parse_args(["--llamacpp", "F32,Q4_1"]).llamacpp == ["F32", "Q4_1"]
    with pytest.raises(SystemExit):
        runner.parse_args(["--llamacpp", "F32,Q2_K"])
    assert main(["bench", "baseline", "--llamacpp", "Q2_K"]) == 1   # `peagle bench baseline`: one line
    assert "unknown llama.cpp precisions ['Q2_K']" in capsys.readouterr().err
    monkeypatch.setattr(llamacpp, "available", lambda: False)
    args = SimpleNamespace(max_new_tokens=8, prefill_tokens=64)
    peers, note = runner.llamacpp_peers(args, ["F32"], 1, [[1, 2]])
    assert peers == [] and "pip install '.[llamacpp]'" in note
    assert runner.llamacpp_peers(args, [], 1, [[1, 2]]) == ([], None)


@pytest.mark.skipif(not llamacpp_available(), reason="llama-cpp-python is not installed")
def test_llamacpp_peer_on_the_default_model():
    """llama.cpp's F32 file, fed the engine's chat-templated token ids, decodes the float32 engine's
    greedy tokens (its own tokenizer never runs), exactly n of them, and times a prefill."""
    from peagle.bench.peers import llamacpp as llamacpp_peer
    from peagle.engine.llm_engine import LLMEngine
    from peagle.engine.sampling import SamplingParams

    engine = LLMEngine.from_pretrained(None, method="none", dtype="float32", device="cpu", compute="exact")
    ids = engine.encode_prompt("Name three rivers.", chat=True)
    plain = engine.generate([ids], SamplingParams(max_tokens=8, ignore_eos=True))[0].token_ids
    peer = llamacpp_peer.load("F32", threads=1, n_ctx=len(ids) + 16)
    assert (peer.name, peer.system, peer.precision, peer.note) == ("llamacpp-F32", "llama.cpp", "F32", "")
    d = checked_decode(peer, ids, 8)
    assert d.tokens == list(plain) and checked_decode(peer, ids, 8).tokens == d.tokens
    assert isinstance(peer, Prefills) and peer.prefill_s(ids) > 0


def test_every_command_that_loads_a_target_takes_quantization():
    """``--quantization gguf|none`` and ``--compute fast|exact`` on every command that loads a target,
    benchmarks included, and ``bench serving`` hands them to the servers it starts."""
    from peagle.bench.serving import server_command

    parser = build_parser()
    for argv in (["generate", "hi"], ["serve"], ["synth", "--prompts", "p", "--out", "o"], ["hidden", "--data", "d",
                 "--out", "o"], ["train", "--data", "d", "--out", "o"], ["bench", "offline", "--dataset-name", "mt-bench"], ["bench", "sweep"],
                 ["bench", "serving", "--dataset-name", "mt-bench"], ["bench", "baseline"]):
        assert parser.parse_args([*argv, "--quantization", "none"]).quantization == "none", argv
        assert parser.parse_args(argv).quantization is None, argv  # the target's own default
        assert parser.parse_args([*argv, "--compute", "exact"]).compute == "exact", argv
        assert parser.parse_args(argv).compute == "fast", argv
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "offline", "--quantization", "q4"])
    with pytest.raises(SystemExit):
        parser.parse_args(["generate", "hi", "--compute", "int4"])
    for argv in (["generate", "hi"], ["serve"], ["synth", "--prompts", "p", "--out", "o"]):  # vLLM's --kv-cache-dtype
        assert parser.parse_args(argv).kv_cache_dtype == "auto", argv
        assert parser.parse_args([*argv, "--kv-cache-dtype", "float32"]).kv_cache_dtype == "float32", argv
    with pytest.raises(SystemExit):
        parser.parse_args(["generate", "hi", "--kv-cache-dtype", "fp8"])
    for argv in (["generate", "hi"], ["serve"], ["synth", "--prompts", "p", "--out", "o"]):  # vLLM's prefix caching
        assert parser.parse_args(argv).enable_prefix_caching is True, argv
        assert parser.parse_args([*argv, "--no-enable-prefix-caching"]).enable_prefix_caching is False, argv
    args = parser.parse_args(["bench", "serving", "--dataset-name", "mt-bench", "--quantization", "none",
                              "--compute", "exact"])
    cmd = server_command("peagle-none", args, 4)
    assert cmd[cmd.index("--quantization") + 1] == "none" and cmd[cmd.index("--compute") + 1] == "exact"
    assert "--no-enable-prefix-caching" not in cmd
    uncached = server_command("peagle-none-no-prefix-cache", args, 4)
    assert uncached == cmd + ["--no-enable-prefix-caching"]


def test_a_quantized_engine_meets_the_llama_cpp_file_of_its_format():
    """The baseline pairs each peagle row with llama.cpp at the same weight precision: a GGUF target
    running Q4_1 blocks is Q4_1 (not the nominal bf16 of its weights), a bf16 one BF16."""
    import torch

    from peagle.bench.peers.engine import weight_precision
    from peagle.models.layers import Linear
    from peagle.models.quant import QuantTensor

    layer = Linear(64, 8)
    layer.weight = torch.nn.Parameter(QuantTensor(torch.zeros(8, 2, 20, dtype=torch.uint8), torch.bfloat16),
                                      requires_grad=False)
    assert weight_precision(SimpleNamespace(target=layer)) == "Q4_1"
    plain = Linear(64, 8)
    plain.weight = torch.nn.Parameter(torch.zeros(8, 64, dtype=torch.bfloat16), requires_grad=False)
    assert weight_precision(SimpleNamespace(target=plain)) == "BF16"


def test_baseline_quotes_llama_bench_against_our_decode(monkeypatch):
    """The llama-bench section: tg128 from an empty context and after our prompts' mean length (``-d``), pp1/pp8/pp16
    a file, our `none` over each tg128 at the same precision; left out with a note where the binary is missing."""
    from peagle.bench.baseline import llamabench
    from peagle.bench.peers import llamacpp

    monkeypatch.setattr(llamacpp, "native_bin", lambda name: None)
    assert "left_out" in llamabench.bench_llama_bench(["Q4_1"], 2, 1, None)
    monkeypatch.setattr(llamacpp, "native_bin", lambda name: Path("/opt/llama") / name)
    speeds = {(0, 128, 0): 100.0, (0, 128, 61): 75.0, (1, 0, 0): 90.0, (8, 0, 0): 240.0, (16, 0, 0): 300.0}
    monkeypatch.setattr(llamacpp, "llama_bench", lambda kind, prompt, gen, reps, threads, depth=0:
                        {"avg_ts": speeds[prompt, gen, depth]})
    e2e = {"systems": {"none": {"precision": "Q4_1", "decode_tok_s": 150.0}},
           "prompts": [{"prompt_tokens": 50}, {"prompt_tokens": 72}]}
    res = llamabench.bench_llama_bench(["Q4_1", "BF16"], 2, 1, e2e)
    assert res["rows"][0]["ours_none_vs_tg128"] == 1.5 and "ours_none_vs_tg128" not in res["rows"][1]
    assert res["rows"][0]["ours_none_vs_tg128_at_depth"] == 2.0
    md = "\n".join(llamabench.markdown_llama_bench({"llama_bench": res}))
    assert "| Q4_1 | 100.0 | 75.0 (d61) | 90.0 | 240.0 | 300.0 | 3.00x | 1.50 | 2.00 |" in md and "| BF16 |" in md


def test_attack_victim_starts_the_attacks_on_a_short_stream():
    """A victim stream of fewer than 20 events (a speculating server sends several tokens an event) still
    releases the attacks when it ends; they once waited for a 20th event forever."""
    import http.server
    import threading

    from peagle.bench.attack import victim

    class SSE(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.end_headers()
            for word in ("a", "b", "c"):
                self.wfile.write(b'data: {"choices": [{"text": "%s"}]}\n\n' % word.encode())
            self.wfile.write(b"data: [DONE]\n\n")

        def log_message(self, *args):
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), SSE)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    started = threading.Event()
    try:
        out = victim(srv.server_address[1], {"prompt": "x", "stream": True}, started)
    finally:
        srv.shutdown()
    assert out["text"] == "abc" and len(out["times"]) == 3 and started.is_set()


def test_bench_attack_tiny(tiny_chat_dir, tmp_path, capsys, monkeypatch):
    """``bench attack`` on the tiny model: every victim writes the same text, alone and attacked, and every
    attack gets its error object (a chunked 64 MiB body may read as a reset: the server stops reading it)."""
    from test_serve import free_port

    monkeypatch.setenv("PEAGLE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "attack.json"
    rc = main(["bench", "attack", "--port", str(free_port()), "--max-tokens", "60", "--victims", "1", "--loris", "2",
               "--repeats", "1", "--wait-idle", "0", "--json", str(out), "--server-args",
               f"--target {tiny_chat_dir} --max-model-len 128 --request-read-timeout 1 "
               "--speculative-config '{\"method\": \"none\"}'"])   # one event a token, as counted below
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    res = json.loads(out.read_text())
    assert res["same_text"] and res["alone"]["events"] == 60
    assert res["attacked"]["events"] == 60 * res["attacked"]["victims"]
    got = {a["attack"]: (a["status"], a["error"]) for a in res["attacks"]}
    assert got["64 MiB body, Content-Length"] == (413, "RequestTooLargeError")
    assert got["64 MiB body, chunked"] in {(413, "RequestTooLargeError"), (None, "connection reset")}
    assert got["2M-character prompt"] == got["10^4 stop strings of 200 characters"] == (400, "BadRequestError")
    assert got["slow-loris headers, a byte a second"] == (408, "RequestTimeoutError")
    assert res["attacked"]["gap_ms_max_at_attacks"] is not None and "| attacked |" in printed.out
