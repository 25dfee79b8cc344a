"""The layer stack's median ms a step (`peagle::decoder_layers`) after 400 and 1,500 tokens, `none` and K=3 (prompt lookup
off), for the A/B of §45 (`stack_ab.txt`): python docs/results/attn-context/stack_ab.py LABEL"""
import collections, statistics, time, sys
import peagle.models.llama as L
from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams
native, T = L.native_layers, collections.defaultdict(list)
def timed(x, w, *a, **kw):
    t = time.perf_counter(); o = native(x, w, *a, **kw); T[x.shape[0]].append(time.perf_counter() - t); return o
L.native_layers = timed
out = []
for k in (0, 3):
    e = LLMEngine.from_pretrained(None, method="parallel" if k else "none", k=max(k, 1), max_num_seqs=1, prompt_lookup_max=0)
    for plen in (400, 1500):
        e.add_request(list(range(1000, 1000 + plen)), SamplingParams(max_tokens=60, ignore_eos=True)); e.step(); T.clear()
        while e.has_unfinished(): e.step()
        out.append(f"ctx{plen} K{k} {statistics.median(T[k + 1]) * 1e3:.2f}")
print(sys.argv[1], " | ".join(out), flush=True)
