"""Decode speed on bfloat16 weights, `--compute fast` (the bf16 dot-product path: packed weights, vdpbf16ps)
against `--compute exact` (float32 arithmetic on the plain bf16 matrices), on ONE thread: `none` (one row a
step) and `generate`'s defaults (P-EAGLE, K chosen by the engine: verify passes of several rows). 128 tokens
after each of the first PROMPTS MT-Bench questions (chat template), greedy, EOS ignored; a rate is 127 / (the
time after the first token). Rounds interleave the systems; medians. Writes decode.md beside this file.

    taskset -c 0 env OMP_NUM_THREADS=1 python benchmarks/bf16/decode.py [ROUNDS] [PROMPTS]
"""
import os
import statistics
import subprocess
import sys
from pathlib import Path

os.environ["PEAGLE_TORCH_THREADS"] = "1"  # the engine's pool: one thread (configure_cpu)

from peagle import kernels  # noqa: E402
from peagle.engine.llm_engine import LLMEngine  # noqa: E402
from peagle.engine.sampling import SamplingParams  # noqa: E402
from peagle.prompts import dataset_path, read_prompt_file  # noqa: E402

N = 128
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
prompts = read_prompt_file(dataset_path("mt-bench", None), "mt-bench")[:int(sys.argv[2]) if len(sys.argv) > 2 else 4]


def system(method, compute):
    engine = LLMEngine.from_pretrained(None, method=method, k="auto", max_num_seqs=1, dtype="bfloat16",
                                       quantization="none", compute=compute)
    ids = [engine.encode_prompt(p.text) for p in prompts]
    outs = []

    def run():
        rates = []
        for i in ids:
            out = engine.generate([i], SamplingParams(max_tokens=N, ignore_eos=True))[0]
            rates.append((N - 1) / (out.elapsed_s - out.ttft_s))
            outs.append(out.token_ids)
        return rates
    return engine.precision, run, outs


systems = {f"`{m}`, `--compute {c}`": system(m, c) for m in ("none", "parallel") for c in ("fast", "exact")}
for _, run, _ in systems.values():
    run()  # warm-up
rates = {name: [] for name in systems}
for r in range(rounds):
    for name, (_, run, _) in systems.items():
        rates[name] += run()
med = {name: statistics.median(xs) for name, xs in rates.items()}
model = next(line.split(":", 1)[1].strip() for line in subprocess.run(["lscpu"], capture_output=True, text=True)
             .stdout.splitlines() if line.startswith("Model name"))
same = all(systems[f"`parallel`, `--compute {c}`"][2] == systems[f"`none`, `--compute {c}`"][2] for c in ("fast", "exact"))
lines = [f"One thread (taskset -c 0, OMP_NUM_THREADS=1, PEAGLE_TORCH_THREADS=1) on {model}, kernels {kernels.isa()}, "
         f"bf16 path {kernels.bf16_isa()}; the default model (SmolLM2-135M) in bfloat16; {rounds} rounds x "
         f"{len(prompts)} MT-Bench prompts x {N} tokens, medians. P-EAGLE's tokens equal `none`'s on each path: {same}.",
         "", "| system | precision | decode tok/s (median) | fast / exact |", "|---|---|---|---|"]
for name, (precision, _, _) in systems.items():
    exact = med[name.replace("fast", "exact")]
    lines.append(f"| {name} | {precision} | {med[name]:.1f} | {med[name] / exact:.2f}x |")
out = "\n".join(lines) + "\n"
print(out)
(Path(__file__).resolve().parents[2] / "docs" / "results" / "bf16" / "decode.md").write_text(out)
