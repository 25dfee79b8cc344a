"""``peagle synth``: reads the shared prompt formats, writes shards, resumes without repeats."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from speculation import OracleDrafter, fixed_costs, make_engine, planted, references

from peagle.engine.llm_engine import LLMEngine
from peagle.train.synth import read_prompts, read_responses, synthesize


@pytest.fixture
def prompt_files(tmp_path):
    files = {
        "chat.jsonl": [{"id": f"c{i}", "turns": [f"Tell me about number {i}.", "And more?"]} for i in range(5)],
        "math.jsonl": [{"question": f"What is {i} + {i}?", "answer": "..."} for i in range(4)],
        "custom.jsonl": [{"prompt": f"Write {i} words."} for i in range(3)],
    }
    paths = []
    for name, rows in files.items():
        p = tmp_path / name
        p.write_text("".join(json.dumps(r) + "\n" for r in rows))
        paths.append(str(p))
    return paths


def records(out):
    return list(read_responses(out))


def test_formats_resume_and_torn_lines(tiny_chat_dir, prompt_files, tmp_path):
    assert {p.source for p in read_prompts(prompt_files)} == {"chat", "math", "custom"}
    engine = LLMEngine.from_pretrained(str(tiny_chat_dir), method="none", max_num_seqs=4, max_model_len=256)
    out = tmp_path / "synth"
    run = synthesize(engine, prompt_files, out, num_prompts=5, max_new_tokens=8, shard_size=3, progress=False)
    first = records(out)
    assert run.responses == 5 and run.response_tokens == sum(len(r["response_token_ids"]) for r in first)
    log = [json.loads(line) for line in (out / "synth_runs.jsonl").read_text().splitlines()]
    assert len(log) == 1 and log[0]["responses"] == 5 and log[0]["tokens_per_s"] > 0 and log[0]["device"] == "cpu"
    assert len(first) == 5 and [f.name for f in sorted(out.iterdir()) if f.name.startswith("responses")] == \
        ["responses-00000.jsonl.gz", "responses-00001.jsonl"]  # full shards are gzipped
    rec = first[0]
    assert rec["prompt_token_ids"][:1] == [1] and 1 <= len(rec["response_token_ids"]) <= 8
    assert rec["response"] == engine.tokenizer.decode(rec["response_token_ids"], skip_special_tokens=True)
    # a kill mid-write leaves a torn line: it is cut, and that response is made again
    last = sorted(out.glob("responses-*.jsonl"))[-1]
    last.write_bytes(last.read_bytes() + b'{"id": "chat:c9", "resp')
    assert synthesize(engine, prompt_files, out, num_prompts=8, max_new_tokens=8, shard_size=3, progress=False).responses == 3
    ids = [r["id"] for r in records(out)]
    assert len(ids) == len(set(ids)) == 8
    assert ids[:5] == [r["id"] for r in first]
    assert synthesize(engine, prompt_files, out, num_prompts=8, max_new_tokens=8, shard_size=3, progress=False).responses == 0
    assert len((out / "synth_runs.jsonl").read_text().splitlines()) == 2  # a run that wrote nothing logs nothing
    # the same seed gives the same prompt order; greedy responses are the target's own
    again = tmp_path / "again"
    synthesize(engine, prompt_files, again, num_prompts=8, max_new_tokens=8, progress=False)
    assert sorted((r["id"], r["response_token_ids"]) for r in records(again)) == \
        sorted((r["id"], r["response_token_ids"]) for r in records(out))


def test_sampled_responses_are_the_same_whatever_the_engine_drafts(tiny_chat_dir, prompt_files, tmp_path):
    """Each response samples with a seed of its own (from its id and --seed), keyed by position: an
    engine that drafts (P-EAGLE at K=3, EAGLE-3 with K chosen by the engine) writes the responses
    plain decoding writes (float32, where the guarantee holds), with drafts accepted: the head drafts the
    plain run's responses (every 3rd position wrong), so a synthesis that seeded samples by anything but
    position, or a verifier that rejects every draft (planted, and caught: the same responses, none
    accepted), shows here; another --seed writes others."""
    plain_engine = LLMEngine.from_pretrained(str(tiny_chat_dir), method="none", dtype="float32", max_num_seqs=4,
                                             max_model_len=256)

    def run(name, engine, seed=3):
        synthesize(engine, prompt_files, tmp_path / name, num_prompts=6, temperature=1.0, max_new_tokens=10,
                   seed=seed, progress=False)
        return {r["id"]: r["response_token_ids"] for r in records(tmp_path / name)}

    plain = run("none", plain_engine)
    assert len(plain) == 6
    refs = references([r["prompt_token_ids"] for r in records(tmp_path / "none")],
                      [r["response_token_ids"] for r in records(tmp_path / "none")])
    head = OracleDrafter.of(plain_engine.target, refs, 3)

    def drafting(method, k, patch=lambda e: e):
        engine = fixed_costs(make_engine(plain_engine.target, head, method, k, max_num_seqs=4, max_model_len=256))
        engine.tokenizer = plain_engine.tokenizer
        return patch(head.bind(engine))

    for name, method, k in (("parallel", "parallel", 3), ("eagle3", "eagle3", "auto")):
        engine = drafting(method, k)
        assert run(name, engine) == plain, name
        assert engine.stats.num_accepted_tokens > 0, name
    rejecting = drafting("parallel", 3, lambda e: planted("reject_all", e))
    assert run("rejecting", rejecting) == plain and rejecting.stats.num_accepted_tokens == 0
    assert run("other-seed", plain_engine, seed=4) != plain


def test_bad_prompt_file(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps({"text": "no known field"}) + "\n")
    with pytest.raises(ValueError, match="no 'turns', 'question' or 'prompt'"):
        read_prompts([str(p)])


def test_later_turns_follow_the_targets_own_answers_and_resume(tiny_chat_dir, prompt_files, tmp_path):
    engine = LLMEngine.from_pretrained(str(tiny_chat_dir), method="none", max_num_seqs=4, max_model_len=256)
    chat = [prompt_files[0]]  # 5 conversations of two user turns
    out = tmp_path / "turns"
    kw = dict(max_new_tokens=6, progress=False, turns=2, samples=2, sample_temperature=1.0)
    assert synthesize(engine, chat, out, num_prompts=3, **kw).responses == 12  # 3 prompts x 2 samples x 2 turns
    recs = {r["id"]: r for r in records(out)}
    base = {r["id"] for r in recs.values() if r["turn"] == 1 and r["sample"] == 0}
    assert len(base) == 3 and set(recs) == {b + s + t for b in base for s in ("", "#s1") for t in ("", "#t2")}
    for rid, r in recs.items():
        if r["turn"] == 2:  # the whole conversation, with the first turn's answer as the target wrote it
            first = recs[rid.removesuffix("#t2")]
            msgs = [{"role": "user", "content": first["prompt"]}, {"role": "assistant", "content": first["response"]},
                    {"role": "user", "content": "And more?"}]
            assert r["prompt_token_ids"] == engine.encode_prompt(msgs) and r["prompt"] == "And more?"
    # greedy first sample, sampled second: the same prompt, different answers (seeded, so repeatable)
    assert any(recs[f"{i}#s1"]["response_token_ids"] != recs[i]["response_token_ids"]
               for i in recs if recs[i]["turn"] == 1 and "#s" not in i)
    # a kill that lost the second turns: a rerun makes exactly those, from the answers on disk
    shard = sorted(out.glob("responses-*.jsonl"))[-1]
    lines = shard.read_text().splitlines(keepends=True)
    shard.write_text("".join(line for line in lines if '#t2"' not in line))
    assert synthesize(engine, chat, out, num_prompts=3, **kw).responses == 6
    again = {r["id"]: r for r in records(out)}
    assert again == recs
    with pytest.raises(ValueError, match="sample temperature"):
        synthesize(engine, chat, out, samples=2, sample_temperature=0.0, progress=False)


def test_no_chat_gives_the_target_plain_text(tiny_chat_dir, prompt_files, tmp_path):
    """``chat=False`` (``peagle synth --no-chat``, for a base model such as Gemma 3 270M): each prompt is
    its plain text, as ``--skip-chat-template`` benchmarks send it; later turns join the conversation so
    far by blank lines. The default keeps the chat template, and the run log records which."""
    engine = LLMEngine.from_pretrained(str(tiny_chat_dir), method="none", max_num_seqs=4, max_model_len=256)
    tok = engine.tokenizer
    kw = dict(num_prompts=4, max_new_tokens=5, progress=False, turns=2)
    synthesize(engine, prompt_files, tmp_path / "plain", chat=False, **kw)
    synthesize(engine, prompt_files, tmp_path / "chat", **kw)
    plain = {r["id"]: r for r in records(tmp_path / "plain")}
    templated = {r["id"]: r for r in records(tmp_path / "chat")}
    assert set(plain) == set(templated) and any(r["turn"] == 2 for r in plain.values())
    for rid, r in plain.items():
        if r["turn"] == 1:
            assert r["prompt_token_ids"] == tok(r["prompt"])["input_ids"]
        else:
            first = plain[rid.removesuffix("#t2")]
            assert r["prompt_token_ids"] == tok(f"{first['prompt']}\n\n{first['response']}\n\n{r['prompt']}")["input_ids"]
        assert r["prompt_token_ids"] != templated[rid]["prompt_token_ids"]
        assert "<|im_start|>" not in tok.decode(r["prompt_token_ids"])
    assert "<|im_start|>" in tok.decode(templated[next(iter(templated))]["prompt_token_ids"])
    runs = [json.loads(line) for line in (tmp_path / "plain" / "synth_runs.jsonl").read_text().splitlines()]
    assert runs[0]["chat"] is False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_synth_cleanly_even_started_in_the_background(tiny_chat_dir, prompt_files, tmp_path, sig):
    """A shell's background job starts with SIGINT ignored; the CLI still stops on SIGINT or SIGTERM by
    running synthesize's ``finally``: the open shard is whole and the run is logged."""
    out = tmp_path / "synth"
    ignore_sigint = lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)  # noqa: E731 (what `cmd &` does)
    proc = subprocess.Popen([sys.executable, "-m", "peagle.cli", "synth", "--target", str(tiny_chat_dir),
                             "--prompts", *prompt_files, "--out", str(out), "--max-new-tokens", "200",
                             "--max-model-len", "256", "--batch-size", "1", "--dtype", "float32"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=ignore_sigint,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None and not (out.exists() and records(out)):
        time.sleep(0.05)
    proc.send_signal(sig)
    assert proc.wait(timeout=60) == 130, proc.stdout.read()
    assert "interrupted" in proc.stdout.read()
    done = records(out)
    log = [json.loads(line) for line in (out / "synth_runs.jsonl").read_text().splitlines()]
    # the signal may fall between a record's write and its count
    assert 1 <= len(done) < 12 and len(done) - 1 <= log[-1]["responses"] <= len(done)


def shard_record(i: int) -> dict:
    return {"id": f"p{i}", "response": f"answer {i}", "prompt_token_ids": [1, 5], "response_token_ids": [7, i]}


def test_a_torn_line_keeps_every_record_after_it(tmp_path):
    """A damaged line mid-shard (a torn write that a later run appended after) is set aside, whole, in
    ``.rejected``; the records before and after it stay, and the next record appended gets its own line."""
    from peagle.train.synth import done_responses

    shard = tmp_path / "responses-00000.jsonl"
    torn = b'{"id": "p2", "resp'
    shard.write_bytes(b"".join(json.dumps(shard_record(i)).encode() + b"\n" for i in range(2)) + torn + b"\n"
                      + b"".join(json.dumps(shard_record(i)).encode() + b"\n" for i in range(3, 5))
                      + b'{"id": "p5"')  # and a torn last line
    with pytest.raises(ValueError, match="line 3 is not a response record"):
        records(tmp_path)   # read before any repair: a clear error, nothing skipped silently
    assert sorted(done_responses(tmp_path)) == ["p0", "p1", "p3", "p4"]
    assert [r["id"] for r in records(tmp_path)] == ["p0", "p1", "p3", "p4"]
    assert (tmp_path / "responses-00000.jsonl.rejected").read_bytes() == torn + b"\n" + b'{"id": "p5"\n'
    with open(shard, "a") as fh:  # as synthesize appends the next response
        fh.write(json.dumps(shard_record(5)) + "\n")
    assert [r["id"] for r in records(tmp_path)] == ["p0", "p1", "p3", "p4", "p5"]


def test_a_shard_is_read_from_its_gzip_or_its_plain_file_never_both(tmp_path):
    """Killed between gzip and unlink: both files hold the shard; it is read once, and resuming removes the
    plain copy."""
    import gzip

    from peagle.train.synth import done_responses

    lines = "".join(json.dumps(shard_record(i)) + "\n" for i in range(3))
    (tmp_path / "responses-00000.jsonl").write_text(lines)
    with gzip.open(tmp_path / "responses-00000.jsonl.gz", "wt") as fh:
        fh.write(lines)
    (tmp_path / "responses-00001.jsonl").write_text(json.dumps(shard_record(3)) + "\n")
    assert [r["id"] for r in records(tmp_path)] == ["p0", "p1", "p2", "p3"]
    assert sorted(done_responses(tmp_path)) == ["p0", "p1", "p2", "p3"]
    assert sorted(f.name for f in tmp_path.iterdir()) == ["responses-00000.jsonl.gz", "responses-00001.jsonl"]
