"""Acceptance of Gemma 3 270M's head quantized to Q8_0 and to Q4_1, 40 MT-Bench prompts as plain text, 64 tokens,
K=3, lookup off (`make gemma` first).

    python docs/results/fused-draft/gemma_head_al.py
"""
import time
from peagle.engine.llm_engine import LLMEngine, EngineConfig
from peagle.engine.sampling import SamplingParams
from peagle.prompts import dataset_path, read_prompt_file
from peagle.models import loader
from peagle.models.loader import load_drafter_for, gemma_gguf
texts = [p.text for p in read_prompt_file(dataset_path("mt-bench", None), "mt-bench")[:40]]
path = gemma_gguf()
base = LLMEngine.from_pretrained(str(path), method="none", max_num_seqs=8)
ids = [base.encode_prompt(t, chat=False) for t in texts]
for fmt in ("q8_0", "q4_1"):
    loader.head_format = lambda target, head, fmt=fmt: fmt
    h = load_drafter_for(base.target, loader.resolve_target(str(path), weights=False), None, base.tokenizer)
    e = LLMEngine(base.target, h, EngineConfig(method="parallel", num_speculative_tokens=3, max_num_seqs=8, prompt_lookup_max=0), base.tokenizer)
    t = time.perf_counter(); e.generate(ids, SamplingParams(max_tokens=64)); 
    print(fmt, h.fc.weight.format, f"AL {e.stats.acceptance_length:.3f}", f"{time.perf_counter()-t:.1f}s", flush=True)
