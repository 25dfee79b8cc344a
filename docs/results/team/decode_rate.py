"""Plain decoding's rate and `generate`'s defaults' on the shipped GGUF, this process's kernels: 128 tokens after
each of the first 4 MT-Bench questions (chat template, greedy, EOS ignored), tok/s = 127 / (time after the first
token), as docs/results/int8/decode.py counts them; the two interleaved over 3 rounds, medians. Run under
docs/results/kv16/ab.sh to set two builds' kernels against each other.

    python docs/results/team/decode_rate.py
"""
import statistics
import time

from peagle.engine.llm_engine import EngineConfig, LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.prompts import dataset_path, read_prompt_file

prompts = read_prompt_file(dataset_path("mt-bench", None), "mt-bench")[:4]
base = LLMEngine.from_pretrained(None, method="parallel", k="auto", max_num_seqs=1)
ids = [base.encode_prompt(p.text) for p in prompts]
rates = {"none": [], "parallel": []}
for r in range(3):
    for method in (("none", "parallel") if r % 2 == 0 else ("parallel", "none")):
        for i in ids:
            cfg = EngineConfig(method=method, num_speculative_tokens="auto" if method == "parallel" else 1, max_num_seqs=1)
            engine = LLMEngine(base.target, base.drafter if method == "parallel" else None, cfg, base.tokenizer)
            seq = engine.add_request(i, SamplingParams(max_tokens=128, ignore_eos=True))
            while not seq.output_ids:
                engine.step()
            t = time.perf_counter()
            while not seq.finished:
                engine.step()
            rates[method].append((len(seq.output_ids) - 1) / (time.perf_counter() - t))
print(f"none {statistics.median(rates['none']):.1f} tok/s, generate defaults {statistics.median(rates['parallel']):.1f} tok/s")
