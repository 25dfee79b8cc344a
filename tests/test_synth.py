"""``peagle synth``: reads the shared prompt formats, writes shards, resumes without repeats."""
from __future__ import annotations

import json

import pytest

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
    assert synthesize(engine, prompt_files, out, num_prompts=5, max_new_tokens=8, shard_size=3, progress=False) == 5
    first = records(out)
    assert len(first) == 5 and [f.name for f in sorted(out.iterdir()) if f.name.startswith("responses")] == \
        ["responses-00000.jsonl.gz", "responses-00001.jsonl"]  # full shards are gzipped
    rec = first[0]
    assert rec["prompt_token_ids"][:1] == [1] and 1 <= len(rec["response_token_ids"]) <= 8
    assert rec["response"] == engine.tokenizer.decode(rec["response_token_ids"], skip_special_tokens=True)
    # a kill mid-write leaves a torn line: it is cut, and that response is made again
    last = sorted(out.glob("responses-*.jsonl"))[-1]
    last.write_bytes(last.read_bytes() + b'{"id": "chat:c9", "resp')
    assert synthesize(engine, prompt_files, out, num_prompts=8, max_new_tokens=8, shard_size=3, progress=False) == 3
    ids = [r["id"] for r in records(out)]
    assert len(ids) == len(set(ids)) == 8
    assert ids[:5] == [r["id"] for r in first]
    assert synthesize(engine, prompt_files, out, num_prompts=8, max_new_tokens=8, shard_size=3, progress=False) == 0
    # the same seed gives the same prompt order; greedy responses are the target's own
    again = tmp_path / "again"
    synthesize(engine, prompt_files, again, num_prompts=8, max_new_tokens=8, progress=False)
    assert sorted((r["id"], r["response_token_ids"]) for r in records(again)) == \
        sorted((r["id"], r["response_token_ids"]) for r in records(out))


def test_bad_prompt_file(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps({"text": "no known field"}) + "\n")
    with pytest.raises(ValueError, match="no 'turns', 'question' or 'prompt'"):
        read_prompts([str(p)])
