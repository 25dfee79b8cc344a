"""Acceptance of the shipped head quantized to Q8_0 and to Q4_1, 40 MT-Bench prompts, 96 tokens, K=7, lookup off.

    python docs/results/fused-draft/head_al.py
"""
import torch, time, statistics, sys
from peagle.engine.llm_engine import LLMEngine, EngineConfig
from peagle.engine.sampling import SamplingParams
from peagle.prompts import dataset_path, read_prompt_file
from peagle.models.loader import load_drafter_for, resolve_target
from peagle.models.drafter import load_drafter
from peagle.models.quant import quantize_linears, pack_model
import peagle.models.loader as L
texts = [p.text for p in read_prompt_file(dataset_path("mt-bench", None), "mt-bench")[:40]]
base = LLMEngine.from_pretrained(None, method="none", max_num_seqs=1)
ids = [base.encode_prompt(t) for t in texts]
heads = {}
for fmt in ("q8_0", "q4_1"):
    orig = L.quantize_linears
    L.quantize_linears = lambda m, f="q8_0", fmt=fmt: orig(m, fmt)
    heads[fmt] = load_drafter_for(base.target, resolve_target(None, weights=False), None, base.tokenizer)
    L.quantize_linears = orig
    print(fmt, heads[fmt].lm_head.weight.format, heads[fmt].fc.weight.format)
for k in (7,):
    for fmt, h in heads.items():
        e = LLMEngine(base.target, h, EngineConfig(method="parallel", num_speculative_tokens=k, max_num_seqs=8, prompt_lookup_max=0), base.tokenizer)
        r = e.generate(ids, SamplingParams(max_tokens=96))
        s = e.stats
        print(k, fmt, f"AL {s.acceptance_length:.3f}")
