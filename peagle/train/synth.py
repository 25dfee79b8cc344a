"""``peagle synth``: the target writes the responses that heads are trained on.

Prompts come from JSONL files in the shared formats (``turns``: user turns; ``question``;
``prompt``). Each finished response is appended to a shard at once and flushed, so a killed run
loses only the requests in flight; re-running with the same arguments skips what is done. A full
shard is gzipped (about 4x smaller), so the data a head was trained on can live in git.

More data per prompt, as public EAGLE recipes regenerate it: ``turns`` > 1 continues ShareGPT
conversations (the user's next turn after the target's own answer; record id ``<id>#t2``...), and
``samples`` > 1 adds responses at ``sample_temperature`` (``<id>#s1``...). Every record is one
document: the whole conversation so far as its prompt, the newest answer as its response.

``peagle synth --server URL`` writes the same records through an OpenAI-compatible server
(:mod:`peagle.train.synth_server`).

Each run appends its settings and its throughput (response tokens per second of generation) to
``synth_runs.jsonl`` in the output folder: a folder extended by later runs keeps every run's record.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

from tqdm import tqdm

from peagle.files import written
from peagle.precision import dtype_name
from peagle.prompts import Prompt, read_prompts
from peagle.engine.sampling import SamplingParams

SHARD = "responses-{:05d}.jsonl"


REQUIRED = ("id", "response", "prompt_token_ids", "response_token_ids")  # what training and resuming read


def shards(out_dir: Path) -> list[Path]:
    """Response shards in order: finished ones (``.jsonl.gz``) and the open one (``.jsonl``). A shard
    whose ``.jsonl`` is still there beside its ``.jsonl.gz`` (a kill between gzip and unlink) is read from
    the ``.gz`` alone: its records once, not twice."""
    gz = {p.name.split(".")[0]: p for p in out_dir.glob("responses-*.jsonl.gz")}
    plain = {p.name.split(".")[0]: p for p in out_dir.glob("responses-*.jsonl")}
    return [gz.get(stem) or plain[stem] for stem in sorted({*gz, *plain})]


def response_token_ids(out_dir: Path) -> list[list[int]]:
    """Every response's token ids in a folder's shards (``peagle index-responses`` tables them)."""
    return [r["response_token_ids"] for shard in shards(out_dir) for r in _records(shard)]


def _parse(line: bytes | str) -> dict | None:
    """One shard line as a record, or None where it is not one (a write cut short, a damaged file)."""
    try:
        rec = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return rec if isinstance(rec, dict) and all(k in rec for k in REQUIRED) else None


def _records(shard: Path) -> Iterator[dict]:
    with (gzip.open(shard, "rb") if shard.suffix == ".gz" else open(shard, "rb")) as fh:
        for n, line in enumerate(fh, 1):
            if line.strip():
                rec = _parse(line)
                if rec is None:
                    raise ValueError(f"{shard} line {n} is not a response record (a write cut short?): re-run "
                                     "`peagle synth` with the same arguments, which sets such lines aside")
                yield rec


def read_responses(out_dir: str | os.PathLike) -> Iterator[dict]:
    """Every record ``peagle synth`` wrote to ``out_dir``, in order."""
    for shard in shards(Path(out_dir)):
        yield from _records(shard)


def close_shard(path: Path) -> None:
    """Gzip a full shard (temp file, rename, then remove the plain one: a kill loses nothing)."""
    with written(path.with_name(path.name + ".gz"), durable=True) as tmp:
        with open(path, "rb") as src, gzip.open(tmp, "wb") as dst:
            dst.write(src.read())
    path.unlink()


def repair_shard(shard: Path) -> list[dict]:
    """The records of an open shard; lines that are not records (a kill mid-write tears the last one) are
    moved to ``<shard>.rejected`` and the shard is rewritten without them, so every record around them is
    kept and the next one appended starts on a line of its own."""
    data = shard.read_bytes()
    lines = data.splitlines(keepends=True)
    recs = [_parse(line) for line in lines]
    bad = [line for line, r in zip(lines, recs) if r is None and line.strip()]
    if bad or not data.endswith(b"\n") and data:
        rejected = shard.with_name(shard.name + ".rejected")
        with open(rejected, "ab") as fh:
            fh.writelines(line if line.endswith(b"\n") else line + b"\n" for line in bad)
            fh.flush()
            os.fsync(fh.fileno())
        with written(shard, durable=True) as tmp, open(tmp, "wb") as fh:
            fh.writelines(line if line.endswith(b"\n") else line + b"\n"
                          for line, r in zip(lines, recs) if r is not None)
        if bad:
            print(f"peagle: {shard}: {len(bad)} line(s) that are not response records (a write cut short) moved "
                  f"to {rejected.name}; its {sum(r is not None for r in recs)} records are kept", file=sys.stderr)
    return [r for r in recs if r is not None]


def done_responses(out_dir: Path) -> dict[str, str]:
    """Response text by id of what is written (later turns continue from it), after :func:`repair_shard`
    on an open shard, and after removing an open shard whose gzipped copy is complete (a kill between
    gzip and unlink)."""
    done = {}
    for shard in shards(out_dir):
        if shard.suffix == ".gz":
            plain = shard.with_suffix("")
            if plain.exists():
                plain.unlink()
        for r in _records(shard) if shard.suffix == ".gz" else repair_shard(shard):
            done[r["id"]] = r["response"]
    return done


def record_id(prompt_id: str, sample: int, turn: int) -> str:
    """A document's id: the prompt's for its first sample's first turn (data written before
    samples and turns existed keeps its ids)."""
    return prompt_id + (f"#s{sample}" if sample else "") + (f"#t{turn}" if turn > 1 else "")


@dataclass
class Job:
    """One request: ``prompt``'s user turn ``turn`` (1-based) of sample ``sample``, after the
    target's earlier answers ``answers``."""

    prompt: Prompt
    sample: int
    turn: int
    answers: list[str]

    @property
    def id(self) -> str:
        return record_id(self.prompt.id, self.sample, self.turn)

    def messages(self) -> list[dict]:
        msgs = []
        for user, answer in zip(self.prompt.turns, self.answers):
            msgs += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
        return msgs + [{"role": "user", "content": self.prompt.turns[self.turn - 1]}]

    def seed(self, run_seed: int) -> int:
        """This request's sampling seed: its own, whatever else the run holds (a resumed run draws the same)."""
        return int(hashlib.sha1(self.id.encode()).hexdigest()[:8], 16) ^ run_seed

    def next(self, answer: str) -> "Job":
        """The conversation's next user turn, after ``answer``."""
        return Job(self.prompt, self.sample, self.turn + 1, self.answers + [answer])

    def record(self, response: str, prompt_ids: list[int], response_ids: list[int], finish_reason: str) -> dict:
        """The shard line for this request's response."""
        return {"id": self.id, "source": self.prompt.source, "prompt": self.prompt.turns[self.turn - 1],
                "response": response, "prompt_token_ids": prompt_ids, "response_token_ids": response_ids,
                "finish_reason": finish_reason, "turn": self.turn, "sample": self.sample}


@dataclass
class SynthRun:
    """What one run wrote, and how fast: response tokens over the seconds spent generating; and how many
    requests failed (a server's: ``peagle synth --server``)."""
    responses: int
    response_tokens: int
    seconds: float
    failed: int = 0

    @property
    def tokens_per_s(self) -> float:
        return self.response_tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Plan:
    """A run's work: the requests to make now (later turns follow their answers), and the documents in all."""
    todo: list[Job]
    total: int
    left: int
    num_prompts: int
    turns: int

    def more_turns(self, job: Job) -> bool:
        return job.turn < min(self.turns, len(job.prompt.turns))


def plan(prompt_files: list[str], out: Path, num_prompts: int | None, seed: int, turns: int, samples: int,
         sample_temperature: float) -> Plan:
    """The first ``num_prompts`` of the (seeded) shuffled prompts, less what ``out`` holds already."""
    if turns < 1 or samples < 1:
        raise ValueError(f"turns and samples must be >= 1, got {turns} and {samples}")
    if samples > 1 and sample_temperature <= 0:
        raise ValueError("extra samples need a sample temperature > 0 (greedy samples would repeat the first)")
    out.mkdir(parents=True, exist_ok=True)
    prompts = read_prompts(prompt_files)
    random.Random(seed).shuffle(prompts)
    prompts = prompts[:num_prompts] if num_prompts else prompts
    done = done_responses(out)
    todo, total, left = [], 0, 0
    for p in prompts:
        for s in range(samples):
            n = min(turns, len(p.turns))
            answers = []
            for turn in range(1, n + 1):
                answer = done.get(record_id(p.id, s, turn))
                if answer is None:
                    break
                answers.append(answer)
            if len(answers) < n:
                todo.append(Job(p, s, len(answers) + 1, answers))
            total, left = total + n, left + n - len(answers)
    return Plan(todo, total, left, len(prompts), turns)


class ShardWriter:
    """One run's output: each record appended to the open shard and flushed at once (a killed run loses only
    the requests in flight), full shards gzipped, a progress bar, and the run's line in ``synth_runs.jsonl``."""

    def __init__(self, out: Path, work: Plan, shard_size: int, progress: bool, settings: dict):
        self.out, self.shard_size, self.settings = out, shard_size, settings
        existing = shards(out)
        self.shard_no, self.in_shard = len(existing), 0
        if existing and existing[-1].suffix == ".jsonl":  # keep filling the open shard
            self.shard_no -= 1
            self.in_shard = sum(1 for _ in open(existing[-1]))
        self.bar = None
        if progress:
            self.bar = tqdm(total=work.total, initial=work.total - work.left, desc="synth", unit="resp")
        self.run = SynthRun(0, 0, 0.0)
        self.t0 = time.perf_counter()
        self.fh = open(out / SHARD.format(self.shard_no), "a")

    def write(self, rec: dict) -> None:
        self.fh.write(json.dumps(rec) + "\n")
        self.fh.flush()
        run = self.run
        run.responses += 1
        run.response_tokens += len(rec["response_token_ids"])
        run.seconds = time.perf_counter() - self.t0
        self.in_shard += 1
        if self.bar is not None:
            self.bar.set_postfix(tok_s=f"{run.tokens_per_s:.0f}", refresh=False)
            self.bar.update(1)
        if self.in_shard >= self.shard_size:
            self.fh.close()
            close_shard(self.out / SHARD.format(self.shard_no))
            self.shard_no, self.in_shard = self.shard_no + 1, 0
            self.fh = open(self.out / SHARD.format(self.shard_no), "a")

    def close(self) -> SynthRun:
        """Close the shard and the bar; log the run (one that wrote nothing and failed nothing logs nothing)."""
        self.fh.close()
        if self.bar is not None:
            self.bar.close()
        run = self.run
        if run.responses or run.failed:
            with open(self.out / "synth_runs.jsonl", "a") as log:
                log.write(json.dumps({**self.settings, **asdict(run), "tokens_per_s": round(run.tokens_per_s, 1),
                                      "finished": time.strftime("%Y-%m-%dT%H:%M:%S")}) + "\n")
        return run


def synthesize(engine, prompt_files: list[str], out_dir: str | os.PathLike, num_prompts: int | None = None,
               max_new_tokens: int = 512, temperature: float = 0.0, seed: int = 0, batch_size: int = 16,
               shard_size: int = 2000, progress: bool = True, turns: int = 1, samples: int = 1,
               sample_temperature: float = 0.7, chat: bool = True) -> SynthRun:
    """Generate responses for the first ``num_prompts`` of the (seeded) shuffled prompts: up to
    ``turns`` user turns of each, ``samples`` times (the first at ``temperature``, the others at
    ``sample_temperature``); returns what this run wrote (also appended to ``synth_runs.jsonl``).
    ``chat=False`` gives the target plain text (the turns joined by blank lines, no chat template),
    as a base model is prompted and as the benchmarks prompt it with ``--skip-chat-template``."""
    out = Path(out_dir)
    work = plan(prompt_files, out, num_prompts, seed, turns, samples, sample_temperature)
    settings = {"prompt_files": [str(f) for f in prompt_files], "num_prompts": work.num_prompts, "seed": seed,
                "max_new_tokens": max_new_tokens, "temperature": temperature, "turns": turns, "samples": samples,
                "sample_temperature": sample_temperature, "batch_size": batch_size, "chat": chat,
                "device": str(engine.device), "dtype": dtype_name(engine.dtype)}
    writer = ShardWriter(out, work, shard_size, progress, settings)
    queue, live = list(reversed(work.todo)), {}
    try:
        while queue or live:
            while queue and len(live) < 2 * batch_size:
                job = queue.pop()
                ids = engine.encode_prompt(job.messages(), chat=chat)
                room = engine.max_model_len - len(ids)
                if room < 8:  # a prompt too long for the context is skipped (and skipped again on resume)
                    continue
                temp = temperature if job.sample == 0 else sample_temperature
                params = SamplingParams(temperature=temp, max_tokens=min(max_new_tokens, room), seed=job.seed(seed))
                live[engine.add_request(ids, params, job.id).request_id] = (job, ids)
            for seq in engine.step().finished:
                job, ids = live.pop(seq.request_id)
                writer.write(job.record(seq.text, ids, seq.output_ids, seq.finish_reason))
                if work.more_turns(job):  # the conversation goes on next
                    queue.append(job.next(seq.text))
    finally:
        run = writer.close()
    return run
