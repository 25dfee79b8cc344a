"""The target's layer stack (``peagle::decoder_layers``, one call a step: every matmul and the attention over the
paged KV cache) timed inside the engine's steps, by rows and by context: `none`, and P-EAGLE at fixed K=1 and 3
(prompt lookup off), after prompts of 20, 400 and 1,500 tokens, 60 tokens each (medians over the steps).

    python docs/results/attn-context/context.py            # context.txt
    PEAGLE_TORCH_THREADS=1 python docs/results/attn-context/context.py 0   # `none` only, one thread
"""
import collections
import statistics
import sys
import time

import peagle.models.llama as L
from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams

ks = [int(k) for k in sys.argv[1:]] or [0, 1, 3]
native, T = L.native_layers, collections.defaultdict(list)


def timed(x, weights, *a, **kw):
    t = time.perf_counter()
    out = native(x, weights, *a, **kw)
    T[x.shape[0]].append(time.perf_counter() - t)
    return out


L.native_layers = timed
engines = {k: LLMEngine.from_pretrained(None, method="parallel" if k else "none", k=max(k, 1), max_num_seqs=1,
                                        prompt_lookup_max=0) for k in ks}
for plen in (20, 400, 1500):
    for k, e in engines.items():
        e.add_request(list(range(1000, 1000 + plen)), SamplingParams(max_tokens=60, ignore_eos=True))
        e.step()   # the prompt
        T.clear()
        while e.has_unfinished():
            e.step()
        print(f"prompt {plen}, K={k}: " + ", ".join(f"{r} rows {statistics.median(v) * 1e3:.2f} ms (n={len(v)})"
                                                  for r, v in sorted(T.items()) if len(v) > 2), flush=True)
