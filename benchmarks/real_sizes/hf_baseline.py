"""HF transformers against peagle, plain decoding at a preset's real dimensions with random weights (vLLM's
``--load-format dummy``), both in DTYPE, in one process, alternating: HF's ``LlamaForCausalLM`` greedy
``generate`` from a 16-token prompt (the decode rate: new tokens after the first over their time) and peagle's
engine steps on the same prompt (method ``none``, lookups off). Medians of REPS runs after one.

    PEAGLE_TORCH_THREADS=2 python benchmarks/real_sizes/hf_baseline.py [PRESET [NEW [REPS [DTYPE]]]]
"""
import statistics
import sys
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from peagle.bench.steps import begin, step_times
from peagle.cpu import configure_cpu
from peagle.engine.llm_engine import LLMEngine
from peagle.models.dummy import PRESETS

preset = sys.argv[1] if len(sys.argv) > 1 else "llama-3.2-1b"
new = int(sys.argv[2]) if len(sys.argv) > 2 else 32
reps = int(sys.argv[3]) if len(sys.argv) > 3 else 3
dtype = sys.argv[4] if len(sys.argv) > 4 else "bfloat16"
configure_cpu()
fields = dict(PRESETS[preset])
config = AutoConfig.for_model(fields.pop("model_type"), **fields)
hf = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype)).eval()
ids = torch.randint(0, config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(0))
engine = LLMEngine.from_pretrained(preset, method="none", load_format="dummy", dtype=dtype, quantization="none",
                                   prompt_lookup_max=0, response_lookup="none", max_num_seqs=1)
begin({0: engine}, ids[0].tolist())


def hf_rate() -> float:
    def run(n: int) -> float:
        t = time.perf_counter()
        with torch.inference_mode():
            hf.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
        return time.perf_counter() - t
    first = run(1)
    return (new - 1) / (run(new) - first)


def peagle_rate() -> float:
    return (new - 1) / sum(step_times({0: engine}, 1, new - 1)[0])


rates: dict[str, list[float]] = {"HF transformers": [], "peagle": []}
for r in range(reps + 1):
    for name, rate in (("HF transformers", hf_rate), ("peagle", peagle_rate)):
        v = rate()
        if r:
            rates[name].append(v)
print(f"{preset} {dtype}, {torch.get_num_threads()} threads, {new} new tokens:")
for name, v in rates.items():
    print(f"  {name}: decoding {statistics.median(v):.2f} tok/s (runs {min(v):.2f}-{max(v):.2f})")
print(f"  peagle / HF: {statistics.median(rates['peagle']) / statistics.median(rates['HF transformers']):.2f}x")
