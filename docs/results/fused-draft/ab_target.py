"""The target's pass in one native call (LlamaModel.decode) against forward() and greedy() (fuses() patched off),
interleaved every 2 steps, 150 rounds, MT-Bench's first prompt: step medians per K (0: `none`).

    python docs/results/fused-draft/ab_target.py 0,1 [bf16]
"""
import sys, time, statistics
from peagle.engine.llm_engine import LLMEngine, EngineConfig
from peagle.engine.sampling import SamplingParams
from peagle.prompts import dataset_path, read_prompt_file
from peagle.models.llama import LlamaModel
text = read_prompt_file(dataset_path("mt-bench", None), "mt-bench")[0].text
kw = dict(quantization="none", dtype="bfloat16") if len(sys.argv) > 2 and sys.argv[2] == "bf16" else {}
base = LLMEngine.from_pretrained(None, method="parallel", max_num_seqs=1, **kw)
KS = [int(k) for k in sys.argv[1].split(",")]
own = LlamaModel.fuses
eng = {}
for k in KS:
    for fused in (False, True):
        e = LLMEngine(base.target, base.drafter if k else None, EngineConfig(method="parallel" if k else "none", num_speculative_tokens=max(k, 1), max_num_seqs=1), base.tokenizer)
        e.add_request(e.encode_prompt(text), SamplingParams(max_tokens=10 ** 6, ignore_eos=True)); e.step()
        eng[k, fused] = e
res = {key: [] for key in eng}
for _ in range(150):
    for (k, fused), e in eng.items():
        LlamaModel.fuses = own if fused else (lambda self: False)
        for _ in range(2):
            t = time.perf_counter(); e.step(); res[k, fused].append(time.perf_counter() - t)
for key, v in res.items():
    print(key, f"{statistics.median(v) * 1e3:.3f} ms")
