"""``peagle synth``: the target writes the responses that heads are trained on.

Prompts come from JSONL files in the shared formats (``turns``: the first user turn; ``question``;
``prompt``). Each finished response is appended to a shard at once and flushed, so a killed run
loses only the requests in flight; re-running with the same arguments skips what is done. A full
shard is gzipped (about 4x smaller), so the data a head was trained on can live in git.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
from pathlib import Path
from typing import Iterator

from peagle.prompts import read_prompts
from peagle.engine.sampling import SamplingParams

SHARD = "responses-{:05d}.jsonl"


def shards(out_dir: Path) -> list[Path]:
    """Response shards in order: finished ones (``.jsonl.gz``) and the open one (``.jsonl``)."""
    return sorted([*out_dir.glob("responses-*.jsonl.gz"), *out_dir.glob("responses-*.jsonl")],
                  key=lambda p: p.name.split(".")[0])


def _records(shard: Path) -> Iterator[dict]:
    with (gzip.open(shard, "rt") if shard.suffix == ".gz" else open(shard)) as fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)


def read_responses(out_dir: str | os.PathLike) -> Iterator[dict]:
    """Every record ``peagle synth`` wrote to ``out_dir``, in order."""
    for shard in shards(Path(out_dir)):
        yield from _records(shard)


def close_shard(path: Path) -> None:
    """Gzip a full shard (temp file, rename, then remove the plain one: a kill loses nothing)."""
    tmp = path.with_name(path.name + ".gz.tmp")
    with open(path, "rb") as src, gzip.open(tmp, "wb") as dst:
        dst.write(src.read())
    os.replace(tmp, path.with_name(path.name + ".gz"))
    path.unlink()


def done_ids(out_dir: Path) -> set[str]:
    """Ids already written; a torn last line of the open shard (a kill mid-write) is cut off."""
    done = {r["id"] for f in out_dir.glob("responses-*.jsonl.gz") for r in _records(f)}
    for shard in out_dir.glob("responses-*.jsonl"):
        if shard.with_name(shard.name + ".gz").exists():  # killed between gzip and unlink
            shard.unlink()
            continue
        good = 0
        with open(shard, "rb") as fh:
            for line in fh:
                try:
                    done.add(json.loads(line)["id"])
                    good += len(line)
                except (json.JSONDecodeError, KeyError, UnicodeDecodeError):
                    break
        if good < shard.stat().st_size:
            with open(shard, "r+b") as fh:
                fh.truncate(good)
    return done


def synthesize(engine, prompt_files: list[str], out_dir: str | os.PathLike, num_prompts: int | None = None,
               max_new_tokens: int = 512, temperature: float = 0.0, seed: int = 0, batch_size: int = 16,
               shard_size: int = 2000, progress: bool = True) -> int:
    """Generate responses for the first ``num_prompts`` of the (seeded) shuffled prompts; returns
    how many were written in this run."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    prompts = read_prompts(prompt_files)
    random.Random(seed).shuffle(prompts)
    prompts = prompts[:num_prompts] if num_prompts else prompts
    done = done_ids(out)
    todo = [p for p in prompts if p.id not in done]
    existing = shards(out)
    shard_no, in_shard = len(existing), 0
    if existing and existing[-1].suffix == ".jsonl":  # keep filling the open shard
        shard_no -= 1
        in_shard = sum(1 for _ in open(existing[-1]))
    meta = {"prompt_files": [str(f) for f in prompt_files], "num_prompts": len(prompts), "seed": seed,
            "max_new_tokens": max_new_tokens, "temperature": temperature}
    (out / "synth_config.json").write_text(json.dumps(meta, indent=2))
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(prompts), initial=len(prompts) - len(todo), desc="synth", unit="resp")
    written, queue, live = 0, list(reversed(todo)), {}
    fh = open(out / SHARD.format(shard_no), "a")
    try:
        while queue or live:
            while queue and len(live) < 2 * batch_size:
                p = queue.pop()
                ids = engine.encode_prompt(p.text)
                room = engine.max_model_len - len(ids)
                if room < 8:  # a prompt too long for the context is skipped (and skipped again on resume)
                    continue
                params = SamplingParams(temperature=temperature, max_tokens=min(max_new_tokens, room),
                                        seed=int(hashlib.sha1(p.id.encode()).hexdigest()[:8], 16) ^ seed)
                live[engine.add_request(ids, params, p.id).request_id] = (p, ids)
            for seq in engine.step().finished:
                p, ids = live.pop(seq.request_id)
                rec = {"id": p.id, "source": p.source, "prompt": p.text, "response": seq.text,
                       "prompt_token_ids": ids, "response_token_ids": seq.output_ids,
                       "finish_reason": seq.finish_reason}
                fh.write(json.dumps(rec) + "\n")
                fh.flush()
                written += 1
                in_shard += 1
                if bar is not None:
                    bar.update(1)
                if in_shard >= shard_size:
                    fh.close()
                    close_shard(out / SHARD.format(shard_no))
                    shard_no, in_shard = shard_no + 1, 0
                    fh = open(out / SHARD.format(shard_no), "a")
    finally:
        fh.close()
        if bar is not None:
            bar.close()
    return written
