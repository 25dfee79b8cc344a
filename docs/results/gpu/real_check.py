"""On a GPU, the default model (GGUF) with a head: does speculation give plain decoding's tokens there?
Greedy and seeded, float32 and bfloat16, CUDA graphs and eager, prompts alone and batched; plus whether
one matmul row has the same bits alone and beside 7 others (cuBLAS picks kernels by shape).
Usage: python real_check.py MODEL.gguf HEAD_DIR OUT.json"""
import json
import sys
import time

import torch

from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams

GGUF, HEAD, OUT = sys.argv[1:4]
PROMPTS = ["What is the capital of Australia, and why was it chosen over Sydney?",
           "Summarize in two sentences: The city council met on Tuesday to discuss the new bike lanes. "
           "Residents were divided; shop owners feared losing parking, cyclists wanted safer streets.",
           "Write a short list of tips for staying focused while working from home.",
           "Complete this Python function:\ndef is_palindrome(s: str) -> bool:\n",
           "Explain what a hash table is to a beginner.",
           "Give three reasons why the sky appears blue."]
res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": [], "runs": []}

# one matmul row alone and beside 7 others, the default model's shapes (576 -> 1536, 576 -> 49152)
g = torch.Generator(device="cuda").manual_seed(0)
for dtype in (torch.float32, torch.bfloat16):
    for n_out in (1536, 576, 49152):
        w = torch.randn(n_out, 576, device="cuda", dtype=dtype, generator=g)
        x = torch.randn(16, 576, device="cuda", dtype=dtype, generator=g)
        one = torch.nn.functional.linear(x[:1], w)
        res["rows"].append({"dtype": str(dtype), "out": n_out, **{f"rows{m}": bool(torch.equal(
            torch.nn.functional.linear(x[:m], w)[:1], one)) for m in (2, 8, 16)}})
print(json.dumps(res["rows"]), flush=True)

greedy = SamplingParams(max_tokens=128)
seeded = SamplingParams(max_tokens=128, temperature=0.8, top_p=0.95, seed=7)
for dtype in ("float32", "bfloat16"):
    plain = LLMEngine.from_pretrained(GGUF, None, method="none", dtype=dtype, device="cuda")
    ids = [plain.encode_prompt(p) for p in PROMPTS]
    engines = {"none-eager": LLMEngine.from_pretrained(GGUF, None, method="none", dtype=dtype, device="cuda",
                                                       enforce_eager=True),
               "parallel-k7": LLMEngine.from_pretrained(GGUF, HEAD, method="parallel", k=7, dtype=dtype, device="cuda"),
               "parallel-k7-eager": LLMEngine.from_pretrained(GGUF, HEAD, method="parallel", k=7, dtype=dtype,
                                                              device="cuda", enforce_eager=True),
               "parallel-k3": LLMEngine.from_pretrained(GGUF, HEAD, method="parallel", k=3, dtype=dtype, device="cuda")}
    for pname, params in (("greedy", greedy), ("seeded", seeded)):
        alone = [plain.generate([i], params)[0].token_ids for i in ids]   # the reference: plain, one at a time
        for name, engine in [("none", plain), *engines.items()]:
            for batched in (False, True):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                outs = engine.generate(ids, [params] * len(ids)) if batched else [engine.generate([i], params)[0] for i in ids]
                torch.cuda.synchronize()
                dt = time.perf_counter() - t0
                toks = [o.token_ids for o in outs]
                first = [next((j for j, (a, b) in enumerate(zip(t, r)) if a != b), None if len(t) == len(r) else min(len(t), len(r)))
                         for t, r in zip(toks, alone)]
                acc = sum(o.stats.num_accepted_tokens for o in outs)
                drafted = sum(o.stats.num_draft_tokens for o in outs)
                row = {"dtype": dtype, "params": pname, "engine": name, "batched": batched,
                       "equal": sum(f is None for f in first), "of": len(ids), "first_divergence": first,
                       "accepted": acc, "drafted": drafted, "tokens": sum(map(len, toks)),
                       "tok_s": round(sum(map(len, toks)) / dt, 1),
                       "al": round(1 + acc / max(1, sum(o.stats.num_drafts for o in outs)), 3)}
                res["runs"].append(row)
                print(json.dumps(row), flush=True)
    del plain, engines
    torch.cuda.empty_cache()
json.dump(res, open(OUT, "w"), indent=1)
