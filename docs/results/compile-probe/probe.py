"""Would torch.compile speed up the CPU decode step? Plain decoding (`none`, bf16, one request) of
the default model through the engine, three ways, interleaved, in one run:

  eager-packed    what peagle runs: oneDNN-packed weights, eager (the production path)
  eager-plain     the same without packing (what compile starts from)
  compiled-mlp    the plain model with every layer's MLP (about 60% of a decode step's multiply-adds,
                  fixed [1, 576] shapes, so no recompiles) under torch.compile, inductor freezing on
                  (its oneDNN prepacking of linear weights)

Attention stays eager in every variant: its shapes change with the context every step.

    PEAGLE_TORCH_THREADS=2 .venv/bin/python docs/results/compile-probe/probe.py > docs/results/compile-probe/result.json
"""
from __future__ import annotations

import json
import statistics
import time

import torch
import torch._inductor.config as inductor_config

from peagle.engine.llm_engine import EngineConfig, LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.models.loader import load_target, load_tokenizer
from peagle.prompts import MT_BENCH, encode, read_prompt_file

NEW_TOKENS, REPS = 128, 3


def engine_for(variant: str) -> tuple[LLMEngine, float]:
    target, path = load_target(None, "bfloat16", device="cpu")
    compile_s = 0.0
    if variant != "eager-packed":
        target.pack_for_inference = lambda: None  # keep plain weights
    engine = LLMEngine(target, None, EngineConfig(method="none", max_num_seqs=1), load_tokenizer(path))
    if variant == "compiled-mlp":
        inductor_config.freezing = True
        torch._dynamo.config.recompile_limit = 256  # 30 MLPs share one code object: an entry per MLP and shape
        for layer in target.model.layers:
            layer.mlp = torch.compile(layer.mlp)
        t0 = time.perf_counter()
        engine.generate([[1, 2, 3]], SamplingParams(max_tokens=4, ignore_eos=True))  # compiles
        compile_s = time.perf_counter() - t0
    return engine, compile_s


def decode_tok_s(engine: LLMEngine, ids: list[int]) -> float:
    out = engine.generate([ids], SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True))[0]
    return (len(out.token_ids) - 1) / (out.elapsed_s - out.ttft_s)


def main() -> None:
    variants = ["eager-packed", "eager-plain", "compiled-mlp"]
    built = {v: engine_for(v) for v in variants}
    tok = built["eager-packed"][0].tokenizer
    ids = encode(tok, [{"role": "user", "content": read_prompt_file(MT_BENCH)[0].text}], True)
    for v in variants:  # warm-up
        decode_tok_s(built[v][0], ids)
    runs: dict[str, list[float]] = {v: [] for v in variants}
    for rep in range(REPS):
        for v in variants[rep % 3:] + variants[:rep % 3]:  # rotating order
            runs[v].append(decode_tok_s(built[v][0], ids))
    base = statistics.median(runs["eager-packed"])
    print(json.dumps({
        "threads": torch.get_num_threads(), "new_tokens": NEW_TOKENS, "reps": REPS,
        "variants": {v: {"decode_tok_s_median": round(statistics.median(r), 2), "runs": [round(x, 2) for x in r],
                         "vs_eager_packed": round(statistics.median(r) / base, 3),
                         "compile_s": round(built[v][1], 1)} for v, r in runs.items()},
    }, indent=1))


if __name__ == "__main__":
    main()
