"""Time to the first token with prompts cut into 64-row spans through peagle's attention kernel (`AttnMeta.cut`) against
SDPA (cut turned off in-process), the shipped GGUF, no chat template; ROUNDS rounds alternating, medians.

    python benchmarks/prefill_cut/prefill_ab.py ROUNDS 96,256,1024,4000
"""
import statistics, sys, time
from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.models.attention import AttnMeta
cut = AttnMeta.cut
e = LLMEngine.from_pretrained(None, method="none", max_num_seqs=1, max_model_len=4096 + 64)
base = (e.encode_prompt("Tell me everything you know about the history of the ocean. " * 400, chat=False) * 2)
R = int(sys.argv[1]); lens = [int(x) for x in sys.argv[2].split(",")]
res = {(n, v): [] for n in lens for v in ("sdpa", "kernel")}
for r in range(R):
    for n in lens:
        for v in (("sdpa", "kernel") if r % 2 == 0 else ("kernel", "sdpa")):
            AttnMeta.cut = cut if v == "kernel" else (lambda self, rows: self)
            res[(n, v)].append(e.generate([base[:n]], SamplingParams(max_tokens=1, ignore_eos=True))[0].ttft_s)
AttnMeta.cut = cut
for n in lens:
    a, b = statistics.median(res[(n, "sdpa")]), statistics.median(res[(n, "kernel")])
    print(f"{n:5d} tokens: SDPA {a * 1e3:8.1f} ms  kernel {b * 1e3:8.1f} ms  kernel/SDPA {b / a:.3f}", flush=True)
