"""Packed weights on 2 MB pages (as peagle loads them: quant.onto_huge_pages) against the same bytes moved back to
malloc's 4 KB pages, two engines in one process, steps interleaved 2 at a time (ROUNDS rounds), MT-Bench's first
prompt: step medians / fastest, ms (K 0: `none`).

    python docs/results/hugepages/pages_ab.py gguf|bf16 [K] [ROUNDS]
"""
import time, statistics, torch, sys
from peagle.engine.llm_engine import LLMEngine, EngineConfig
from peagle.engine.sampling import SamplingParams
from peagle.prompts import dataset_path, read_prompt_file
from peagle.models.quant import QuantTensor
kw = dict(quantization="none", dtype="bfloat16") if sys.argv[1]=="bf16" else {}
k = int(sys.argv[2]) if len(sys.argv) > 2 else 0
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 120
text = read_prompt_file(dataset_path("mt-bench", None), "mt-bench")[0].text
def small(model):
    for p in model.parameters():
        if isinstance(p, QuantTensor) and p.packed:
            c = p.blocks.clone(); p.blocks.set_(c.untyped_storage(), 0, c.shape, c.stride())
E = {}
for name in ("2M", "4k"):
    base = LLMEngine.from_pretrained(None, method="parallel" if k else "none", k=max(k, 1), max_num_seqs=1, **kw)
    if name == "4k":
        small(base.target); small(base.drafter) if base.drafter is not None else None
    e = base
    e.add_request(e.encode_prompt(text), SamplingParams(max_tokens=10 ** 6, ignore_eos=True)); e.step()
    E[name] = e
print(sys.argv[1], f"K={k}", [line for line in open("/proc/meminfo") if "AnonHuge" in line][0].strip())
S = {n: [] for n in E}
for _ in range(rounds):
    for n, e in E.items():
        for _ in range(2):
            t=time.perf_counter(); e.step(); S[n].append(time.perf_counter()-t)
for n, v in S.items(): print(n, f"{statistics.median(v)*1e3:.3f}/{min(v)*1e3:.3f}")
