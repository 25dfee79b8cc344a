"""bf16 weights with ``--compute fast`` (the bf16 dot-product path: on an AVX2-only CPU vdpbf16ps's steps in FMAs,
since e6a9ce1) against ``exact`` (float32 arithmetic on the plain matrix: what ``fast`` ran there before), in one
process, alternating rounds; medians. Without FILE: the default model in bf16 (``--quantization none``), 128 tokens
after each of 4 MT-Bench prompts, with llama-bench's BF16 tg128 each round (``LLAMA_CPP_BIN``). With FILE (a BF16
GGUF): 32 plain steps after a 64-token prompt. Both print whether the two give the same greedy tokens (they
need not: fast rounds x to bf16; on random weights the top logits are near ties).

    PEAGLE_TORCH_THREADS=2 python benchmarks/zen3-default/bf16_ab.py [FILE] [ROUNDS]
"""
import statistics
import sys

from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams

args = sys.argv[1:]
path = args.pop(0) if args and not args[0].isdigit() else None
rounds = int(args[0]) if args else 3
how = dict(compute=None, dtype="bfloat16", quantization="none") if path is None else {}
eng = {c: LLMEngine.from_pretrained(path, method="none", max_num_seqs=1, enable_prefix_caching=False, **{**how, "compute": c})
       for c in ("fast", "exact")}
for c, e in eng.items():
    print(c, e.precision, e.kernels, flush=True)
if path is None:
    from peagle.bench.peers import llamacpp
    from peagle.prompts import dataset_path, read_prompt_file

    N, prompts = 128, [eng["fast"].encode_prompt(p.text) for p in read_prompt_file(dataset_path("mt-bench", None), "mt-bench")[:4]]
else:
    N, prompts = 33, [list(range(1000, 1064))]
greedy = [e.generate([prompts[0]], SamplingParams(max_tokens=32))[0].token_ids for e in eng.values()]
print("the same greedy tokens (32):", greedy[0] == greedy[1])


def rates(e: LLMEngine) -> list[float]:
    outs = [e.generate([i], SamplingParams(max_tokens=N, ignore_eos=True))[0] for i in prompts]
    return [(N - 1) / (o.elapsed_s - o.ttft_s) for o in outs]


got = {c: [] for c in eng} | ({} if path else {"llama-bench BF16": []})
for r in range(rounds):
    for c, e in eng.items():
        got[c] += rates(e)
    if path is None:
        got["llama-bench BF16"].append(llamacpp.llama_bench("BF16", 0, 128, reps=3, threads=2)["avg_ts"])
    print(r, {k: round(statistics.median(v), 2) for k, v in got.items()}, flush=True)
med = {k: statistics.median(v) for k, v in got.items()}
for k, v in med.items():
    print(f"{k}: {v:.2f} tok/s, {v / med['exact']:.2f}x exact" + (f", {v / med['llama-bench BF16']:.2f}x llama-bench BF16" if path is None else ""))
