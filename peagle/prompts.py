"""Prompt files, read in one place for benchmarks and for training-data synthesis.

Formats (one JSON object per line; ``.gz`` is read transparently; a ``.json`` file holding a list
of such objects works too):

* ``mt-bench``, ``spec_bench``: ``turns`` (user turns; MT-Bench has two), optional ``category``;
* ``humaneval``, ``custom``: ``prompt``;
* ``sharegpt``: ``turns``, or vLLM's ShareGPT ``conversations`` (``from``/``value``; human turns kept);
* ``auto`` (training prompt files): the first of ``turns``, ``question``, ``prompt``;
* a Hugging Face dataset (training prompts named by a dataset id): those, ShareGPT's ``conversations`` or
  chat datasets' ``messages`` (``role``/``content``; user turns kept).

Every record becomes a :class:`Prompt` holding all its user turns; single-turn users take the first.
"""
from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

# The two benchmark sets ship inside the package, each with its licence (MT-Bench: Apache-2.0, HumanEval: MIT),
# so a clone or a wheel measures with nothing beside it. Training prompts are never these: they are any file given.
DATA = Path(__file__).resolve().parent / "bench" / "data"
MT_BENCH = DATA / "mt_bench" / "question.jsonl"
HUMANEVAL = DATA / "humaneval" / "HumanEval.jsonl.gz"

# the fields that may hold the prompt, in order of preference
FORMATS: dict[str, tuple[str, ...]] = {
    "mt-bench": ("turns",),
    "humaneval": ("prompt",),
    "spec_bench": ("turns",),
    "sharegpt": ("turns", "conversations"),
    "custom": ("prompt",),
    "auto": ("turns", "question", "prompt"),
}
DATASETS = tuple(f for f in FORMATS if f != "auto")
DEFAULT_PATHS = {"mt-bench": MT_BENCH, "humaneval": HUMANEVAL}


@dataclass
class Prompt:
    id: str              # "<file stem>:<record id>": stable across runs (synthesis resumes by it)
    source: str          # the file stem
    turns: list[str]     # the user turns, in order (at least one, non-empty)
    category: str | None = None

    @property
    def text(self) -> str:
        return self.turns[0]


def dataset_path(name: str, path: str | os.PathLike | None) -> Path:
    """``path``, or the packaged copy of MT-Bench / HumanEval when none is given."""
    if name not in FORMATS:
        raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
    if path is not None:
        return Path(path)
    if name in DEFAULT_PATHS:
        return DEFAULT_PATHS[name]
    raise ValueError(f"the {name} dataset needs --dataset-path")


def _records(path: Path) -> Iterator[tuple[int, dict]]:
    """(0-based line number, record) for every non-blank line (or list item of a ``.json`` file)."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            if path.suffix == ".json":
                data = json.load(fh)
                if not isinstance(data, list):
                    raise ValueError(f"{path}: a .json dataset must hold a list of records")
                yield from enumerate(data)
                return
            for n, line in enumerate(fh):
                if line.strip():
                    try:
                        yield n, json.loads(line)
                    except json.JSONDecodeError as e:
                        raise ValueError(f"{path}:{n + 1}: not valid JSON ({e})") from None
    except FileNotFoundError:
        raise FileNotFoundError(f"no such dataset file: {path}") from None


def _user_turns(rec: dict, key: str) -> list[str]:
    value = rec[key]
    if key == "conversations":
        return [c.get("value") for c in value if isinstance(c, dict) and c.get("from") in ("human", "user")]
    if key == "messages":
        return [c.get("content") for c in value if isinstance(c, dict) and c.get("role") == "user"]
    return list(value) if isinstance(value, list) else [value]


def read_prompt_file(path: str | os.PathLike, fmt: str = "auto", category: str | None = None) -> list[Prompt]:
    """The prompts of one file in format ``fmt`` (see the module docstring), in file order; records
    whose first turn is empty are skipped, and ``category`` keeps only that category."""
    path = Path(path)
    fields = FORMATS.get(fmt)
    if fields is None:
        raise ValueError(f"unknown dataset {fmt!r}; choose one of {', '.join(DATASETS)}")
    return _prompts(_records(path), fields, Path(path.name.removesuffix(".gz")).stem, str(path), category)


def _prompts(rows, fields: tuple[str, ...], source: str, where: str, category: str | None = None) -> list[Prompt]:
    """:class:`Prompt` s of (row number, record) pairs, each from the first of ``fields`` it has."""
    out = []
    for n, rec in rows:
        key = next((f for f in fields if f in rec), None) if isinstance(rec, dict) else None
        if key is None:
            names = [f"'{f}'" for f in fields]
            wanted = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
            raise ValueError(f"{where}:{n + 1}: no {wanted} field")
        if category is not None and rec.get("category") != category:
            continue
        turns = []
        for t in _user_turns(rec, key):
            if not isinstance(t, str) or not t.strip():
                break
            turns.append(t)
        if turns:
            rid = rec.get("id", rec.get("question_id", rec.get("task_id", rec.get("prompt_id", n))))
            out.append(Prompt(f"{source}:{rid}", source, turns, rec.get("category")))
    return out


FILE_SUFFIXES = (".jsonl", ".json", ".gz")  # a missing file by these names is a typo, not a dataset id

# a Hugging Face dataset's prompt fields: the training files' own, ShareGPT's and the chat datasets' messages
HF_FIELDS = ("turns", "question", "prompt", "conversations", "messages")


def read_hf_prompts(name: str) -> list[Prompt]:
    """The prompts of a Hugging Face dataset, ``name``, ``name:split`` (default ``train``) or
    ``name:config:split`` (datasets with several configs, as GSM8K's ``openai/gsm8k:main:train``), through
    ``datasets`` (downloaded once into its cache). Offline, or for a name the hub does not have, a clear error
    that says to give a JSONL file instead."""
    parts = name.split(":")
    if len(parts) > 3:
        raise ValueError(f"{name}: a Hugging Face dataset is NAME, NAME:SPLIT or NAME:CONFIG:SPLIT")
    repo, config, split = parts[0], parts[1] if len(parts) == 3 else None, parts[-1] if len(parts) > 1 else ""
    try:
        import datasets
    except ImportError:
        raise ValueError(f"{name} is no prompt file, and reading Hugging Face datasets needs the `datasets` "
                         "package (pip install datasets)") from None
    try:
        rows = datasets.load_dataset(repo, config, split=split or "train")
    except Exception as e:  # noqa: BLE001  (offline, no such dataset or split: datasets raises many kinds)
        raise ValueError(f"{name} is no prompt file here, and loading it as a Hugging Face dataset failed "
                         f"({type(e).__name__}: {e}). A dataset with several configs is NAME:CONFIG:SPLIT. "
                         "Offline, give a JSONL file of prompts instead") from None
    source = "__".join([repo.replace("/", "__"), *([config] if config else []), *([split] if split else [])])
    return _prompts(enumerate(rows), HF_FIELDS, source, name)


def read_prompts(files: list[str]) -> list[Prompt]:
    """Training prompts (format ``auto``), concatenated: from files, or, for a name that is no file, from the
    Hugging Face dataset of that name or in that folder (:func:`read_hf_prompts`)."""
    return [p for f in files for p in (read_prompt_file(f) if Path(f).is_file() or Path(f).suffix in FILE_SUFFIXES
                                       else read_hf_prompts(f))]


def render(tokenizer, msgs: list[dict], chat: bool) -> str:
    """The prompt text: the chat template with the generation prompt, or (without a template)
    the turns joined by blank lines."""
    if chat and tokenizer.chat_template:
        return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    return "\n\n".join(m["content"] for m in msgs)


def encode(tokenizer, msgs: list[dict], chat: bool) -> list[int]:
    """Token ids of :func:`render`'s text (the chat template carries its own special tokens). The
    engine, the server and the benchmarks all encode prompts here."""
    templated = chat and bool(tokenizer.chat_template)
    return tokenizer(render(tokenizer, msgs, chat), add_special_tokens=not templated)["input_ids"]
