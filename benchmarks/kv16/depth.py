"""Plain decoding at depth, as `llama-bench -d D -n 128` measures it: the engine's `step()` for one request
(method `none`, the shipped GGUF) generating 128 tokens after a context of D tokens (MT-Bench text repeated,
prefilled first, not timed); tok/s over the 128 steps, the best of R runs.

    python benchmarks/kv16/depth.py 0,1024,3072 [R] [KV_CACHE_DTYPE]
"""
import sys
import time

from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.prompts import dataset_path, read_prompt_file

depths = [int(d) for d in sys.argv[1].split(",")]
runs = int(sys.argv[2]) if len(sys.argv) > 2 else 2
kv = sys.argv[3] if len(sys.argv) > 3 else "auto"
engine = LLMEngine.from_pretrained(None, method="none", max_num_seqs=1, quantization="gguf", max_model_len=4352,
                                   kv_cache_dtype=kv)
text = " ".join(p.text for p in read_prompt_file(dataset_path("mt-bench", None), "mt-bench"))
pool = engine.tokenizer.encode(text)
for depth in depths:
    best = 0.0
    for _ in range(runs):
        prompt = (pool * (depth // len(pool) + 1))[:max(depth, 1)]
        seq = engine.add_request(prompt, SamplingParams(max_tokens=129, ignore_eos=True))
        while not seq.output_ids:  # the prefill (in chunks) and the first token
            engine.step()
        t = time.perf_counter()
        while engine.has_unfinished():
            engine.step()
        best = max(best, 128 / (time.perf_counter() - t))
    print(f"KV {engine.runner.kv_dtype}, depth {depth}: {best:.1f} tok/s")
