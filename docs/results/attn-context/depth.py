"""Plain decoding after a 1,024- and a 3,072-token prompt (random ids, the prompt prefilled first), 64 tokens,
tok/s: the A/B of §45 ran it alternately with two builds of the kernels copied into peagle/kernels/build
(`depth_ab.txt`; A: the next block's keys prefetched, B: its values too).

    python docs/results/attn-context/depth.py LABEL
"""
import time, sys
from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams
e = LLMEngine.from_pretrained(None, method="none", max_num_seqs=1)
out = []
for plen in (1024, 3072):
    s = e.add_request(list(range(1000, 1000 + plen)), SamplingParams(max_tokens=65, ignore_eos=True))
    while not s.output_ids: e.step()
    t = time.perf_counter(); n = 0
    while e.has_unfinished(): e.step(); n += 1
    out.append(f"d{plen} {n / (time.perf_counter() - t):.1f} tok/s")
print(sys.argv[1], " | ".join(out), flush=True)
