"""What Gemma 3 270M's plain decoding keeps resident, step by step (VmRSS and VmHWM after each, MB = kB / 1000):
the interpreter, torch, peagle's engine and transformers, the tokenizer, the weights, the engine, 128 tokens.

    python benchmarks/memory/floor.py [target]
"""
from __future__ import annotations

import sys


def status() -> tuple[int, int]:
    """(VmRSS, VmHWM) in MB."""
    got = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS", "VmHWM")):
                got[line[:5]] = int(line.split()[1]) // 1000
    return got["VmRSS"], got["VmHWM"]


def step(name: str, last: list[int]) -> None:
    rss, hwm = status()
    print(f"{name:48s} VmRSS {rss:5d} MB ({rss - last[0]:+5d})   VmHWM {hwm:5d} MB")
    last[0] = rss


def main(target: str) -> None:
    last = [0]
    step("python", last)
    import torch  # noqa: F401
    step("import torch", last)
    import transformers  # noqa: F401

    import peagle.cli  # noqa: F401
    from peagle.engine.config import EngineConfig
    from peagle.engine.llm_engine import LLMEngine
    from peagle.engine.sampling import SamplingParams
    from peagle.models.loader import load_target, load_tokenizer, resolve_target
    step("import peagle.cli, peagle.engine, transformers", last)
    tok = load_tokenizer(resolve_target(target, weights=False))
    step(f"load_tokenizer ({len(tok):,} tokens)", last)
    model, _ = load_target(target)
    weights = sum(getattr(p, "blocks", p).untyped_storage().nbytes() for p in model.parameters())
    step(f"load_target ({weights / 1e6:.0f} MB of weights as packed)", last)
    engine = LLMEngine(model, None, EngineConfig(method="none", max_num_seqs=1), tok)
    step("LLMEngine (its KV pool: 8,192 positions)", last)
    ids = engine.encode_prompt("The history of the Roman Empire", chat=False)
    engine.generate([ids], SamplingParams(max_tokens=128))
    step("generate 128 tokens", last)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "gemma3")
