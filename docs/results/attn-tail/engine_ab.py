"""Engine steps with a given build of the kernels (a copy of peagle_kernels.so): `none` and P-EAGLE at fixed K=1
and K=7 (prompt lookup off), one request after a prompt of 300 and of 1,000 tokens (a repeated MT-Bench text),
median ms of 60 steps; run alternately with two builds, a fresh process each.

    python docs/results/attn-tail/engine_ab.py path/to/peagle_kernels.so LABEL
"""
import statistics, sys, time
from pathlib import Path
from peagle import kernels
kernels.LIBRARY = Path(sys.argv[1]); kernels._fingerprint = lambda: kernels.STAMP.read_text()
assert kernels.available()
from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.prompts import dataset_path, read_prompt_file

texts = [p.text for p in read_prompt_file(dataset_path("mt-bench", None), "mt-bench")]
out = []
for name, method, k in (("none", "none", 1), ("K=1", "parallel", 1), ("K=7", "parallel", 7)):
    e = LLMEngine.from_pretrained(None, method=method, k=k, max_num_seqs=1, prompt_lookup_max=0)
    ids = [t for text in texts for t in e.encode_prompt(text)]
    for plen in (300, 1000):
        s = e.add_request(ids[:plen], SamplingParams(max_tokens=10 ** 6, ignore_eos=True), request_id=f"r{plen}")
        while not s.output_ids: e.step()
        T = []
        for _ in range(60):
            t = time.perf_counter(); e.step(); T.append(time.perf_counter() - t)
        e.abort(f"r{plen}")
        out.append(f"{name}@{plen} {statistics.median(T) * 1e3:.2f}")
    del e
print(sys.argv[2], " ".join(out), flush=True)
