"""What a benchmark sends: prompts from a dataset file (:mod:`peagle.prompts`), chosen as
``vllm bench serve`` chooses them (a seeded shuffle, then the first N), wrapped in the chat template
client-side (as vLLM does for its file datasets; without it acceptance collapses: docs/design.md, "The choices
peagle makes"), and
an output length per request.

With ``--multi-turn``, every user turn of a conversation is sent, each after the model's answer to
the one before (MT-Bench's second turn, ShareGPT); otherwise only the first turn.
"""
from __future__ import annotations

import argparse
import random
import sys
from dataclasses import dataclass
from pathlib import Path

from peagle.prompts import DATASETS, Prompt, dataset_path, read_prompt_file

DEFAULT_OUTPUT_LEN = 256
# vLLM's dataset-specific output-length flags (its MT-Bench and HumanEval go through its "hf" dataset)
OUTPUT_LEN_FLAGS = {"custom": "custom_output_len", "spec_bench": "spec_bench_output_len",
                    "sharegpt": "sharegpt_output_len", "mt-bench": "hf_output_len", "humaneval": "hf_output_len"}


@dataclass
class Workload:
    name: str
    prompts: list[Prompt]
    output_len: int
    chat: bool          # wrap in the chat template client-side
    multi_turn: bool

    def turns(self, prompt: Prompt) -> list[str]:
        return prompt.turns if self.multi_turn else prompt.turns[:1]

    @property
    def num_requests(self) -> int:
        return sum(len(self.turns(p)) for p in self.prompts)


def add_dataset_args(p: argparse.ArgumentParser, single: bool = True, vllm_output_flags: bool = False,
                     num_prompts: int = 1000, output_len: int | None = None) -> None:
    """Dataset flags as ``vllm bench serve`` names them. ``single``: one ``--dataset-name`` /
    ``--dataset-path`` (a sweep names its datasets itself)."""
    if single:
        p.add_argument("--dataset-name", choices=DATASETS, required=True)
        p.add_argument("--dataset-path", default=None,
                       help="the dataset file (default for mt-bench and humaneval: the packaged copy)")
    p.add_argument("--num-prompts", type=int, default=num_prompts,
                   help="conversations to send (all the dataset has, if fewer)")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompt shuffle (and of sampling)")
    p.add_argument("--disable-shuffle", action="store_true", help="take the first prompts in file order")
    p.add_argument("--spec-bench-category", default=None, help="spec_bench: only this category")
    p.add_argument("--skip-chat-template", action="store_true",
                   help="send the raw prompt text instead of wrapping it in the chat template")
    p.add_argument("--multi-turn", action="store_true",
                   help="send every user turn, each after the model's answer to the previous one")
    p.add_argument("--output-len", type=int, default=output_len,
                   help=f"output tokens per request (max_tokens; default {DEFAULT_OUTPUT_LEN})")
    if vllm_output_flags:
        for flag in sorted(set(OUTPUT_LEN_FLAGS.values())):
            p.add_argument("--" + flag.replace("_", "-"), type=int, default=None,
                           help="output length for that dataset (--output-len wins)")


def load_workload(args: argparse.Namespace, name: str, path: str | Path | None = None) -> Workload:
    """The prompts of dataset ``name`` that the flags in ``args`` select."""
    file = dataset_path(name, path)
    category = args.spec_bench_category if name == "spec_bench" else None
    prompts = read_prompt_file(file, name, category)
    if not prompts:
        raise ValueError(f"{file} has no prompts" + (f" in category {category!r}" if category else ""))
    if args.num_prompts < 1:
        raise ValueError("--num-prompts must be >= 1")
    if not args.disable_shuffle:
        random.Random(args.seed).shuffle(prompts)
    if args.num_prompts > len(prompts):
        print(f"peagle: {file} has {len(prompts)} prompts; using all of them", file=sys.stderr)
    out_len = next((n for n in (args.output_len, getattr(args, OUTPUT_LEN_FLAGS[name], None)) if n is not None),
                   DEFAULT_OUTPUT_LEN)
    if out_len < 1:
        raise ValueError("the output length must be >= 1")
    return Workload(name, prompts[:args.num_prompts], out_len, not args.skip_chat_template, args.multi_turn)


def messages(turns: list[str], answers: list[str]) -> list[dict]:
    """The chat so far: user turn, the model's answer, ... ending with the next user turn."""
    out = []
    for i, turn in enumerate(turns[:len(answers) + 1]):
        out.append({"role": "user", "content": turn})
        if i < len(answers):
            out.append({"role": "assistant", "content": answers[i]})
    return out


def load_tokenizer_for(name: str | None):
    """The tokenizer that renders prompts: a local folder, GGUF or the default model (``None`` or its
    name) through the loader, a GGUF's from its metadata alone (its weights are not converted); anything
    else is a hub id (tokenizer files only)."""
    from peagle.models.loader import DEFAULT_NAME, load_tokenizer, resolve_target

    if name is None or Path(name).expanduser().exists() or Path(name).name == DEFAULT_NAME:
        return load_tokenizer(resolve_target(name, weights=False))
    if name.count("/") != 1:
        raise ValueError(f"{name!r} is neither a local folder nor a hub id (org/name); pass --tokenizer PATH")
    from transformers import AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(name)
    except Exception as e:  # offline, unknown id: one line
        raise ValueError(f"cannot load the tokenizer {name!r} ({type(e).__name__}); pass --tokenizer PATH") from None
