"""The tiles' shape chosen at start-up (kernels.tune_streaming) against the default (only weights over 16 MiB one
packed group wide), one engine, the two settings alternating per prompt: `none` and `generate`'s defaults (auto K),
128 tokens after each of the first PROMPTS MT-Bench questions (EOS ignored), ROUNDS rounds; tok/s medians, with
`llama-bench` tg128 on the file of the same precision once a round (the same run).

    python benchmarks/zen4/stream_ab.py [ROUNDS] [PROMPTS] [gguf|bf16]
"""
import statistics
import sys

import torch

from peagle import kernels
from peagle.bench.peers import llamacpp
from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.prompts import dataset_path, read_prompt_file

N = 128
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
prompts = read_prompt_file(dataset_path("mt-bench", None), "mt-bench")[:int(sys.argv[2]) if len(sys.argv) > 2 else 4]
bf16 = len(sys.argv) > 3 and sys.argv[3] == "bf16"
how = dict(dtype="bfloat16", quantization="none") if bf16 else {}
engines = {m: LLMEngine.from_pretrained(None, method=m, k="auto", max_num_seqs=1, **how) for m in ("none", "parallel")}
tuned = tuple(torch.ops.peagle.stream_bytes())
settings = {f"tuned {tuned}": tuned, "default (16 MiB, 16 MiB)": (16 << 20, 16 << 20)}
rates = {(m, s): [] for m in engines for s in settings}
peer = []
outs = {}
for _ in range(rounds):
    for p in prompts:
        for m, e in engines.items():
            ids = e.encode_prompt(p.text)
            for s, limits in settings.items():
                with kernels.streaming(*limits):
                    out = e.generate([ids], SamplingParams(max_tokens=N, ignore_eos=True))[0]
                rates[(m, s)].append((N - 1) / (out.elapsed_s - out.ttft_s))
                assert outs.setdefault((m, p.text), out.token_ids) == out.token_ids  # the same tokens
    peer.append(llamacpp.llama_bench("BF16" if bf16 else "Q4_1", gen=N, reps=3)["avg_ts"])
lb = statistics.median(peer)
print(f"{engines['none'].precision}; llama-bench {'BF16' if bf16 else 'Q4_1'} tg128 {lb:.1f} tok/s (median of {peer})\n")
print(f"| method | {' | '.join(settings)} | tuned / default | tuned / llama-bench |\n|---|---|---|---|---|")
for m in engines:
    a, b = (statistics.median(rates[(m, s)]) for s in settings)
    print(f"| {m} | {a:.1f} | {b:.1f} | {a / b:.3f}x | {a / lb:.2f}x |")
