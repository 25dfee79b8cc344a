"""`peagle generate`'s defaults against `--method none` after a long prompt: the first MT-Bench questions joined
into a ~1,900-token text to summarize, greedy, MAX new tokens, a fresh engine a request (weights loaded once),
the two alternating, R rounds. Output tok/s over the request (prefill included) and over its decoding alone
(after the first token), and what P-EAGLE drafted (rounds by position).

    python docs/results/autok/long_prompt.py [MAX] [R]
"""
import sys
import time

from peagle.engine.llm_engine import EngineConfig, LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.prompts import dataset_path, read_prompt_file

max_tokens = int(sys.argv[1]) if len(sys.argv) > 1 else 128
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
base = LLMEngine.from_pretrained(None, method="parallel", k="auto", max_num_seqs=1, max_model_len=4352)
text = " ".join(p.text for p in read_prompt_file(dataset_path("mt-bench", None), "mt-bench"))
ids = base.encode_prompt("Summarize the following questions in a few sentences:\n\n" + " ".join(text.split()[:1500]))
print(f"prompt {len(ids)} tokens, max_tokens {max_tokens}")
for r in range(rounds):
    for method in ("none", "parallel"):
        cfg = EngineConfig(method=method, num_speculative_tokens="auto" if method == "parallel" else 1, max_num_seqs=1,
                           max_model_len=4352)
        engine = LLMEngine(base.target, base.drafter if method == "parallel" else None, cfg, base.tokenizer)
        t = time.perf_counter()
        out = engine.generate([ids], SamplingParams(max_tokens=max_tokens))[0]
        dt, n = time.perf_counter() - t, len(out.token_ids)
        print(f"round {r + 1} {method:8s} {n} tokens: {n / dt:.1f} tok/s, decoding {(n - 1) / (dt - out.ttft_s):.1f} "
              f"tok/s, AL {out.stats.acceptance_length:.2f}, rounds by position {out.stats.drafted_per_pos[:3]}")
