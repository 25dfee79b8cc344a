"""Steps of one request (MT-Bench prompt 1, EOS ignored) for SECONDS, ``none`` (K=0) or P-EAGLE at K, and the mean
step time. With serial_timing.patch applied to team.cpp (and the kernels built), the team prints, every 200 calls,
a stack call's time, the part of it outside every posted range (the calling thread alone) and the other
thread's wait (BENCHMARKS.md §34):

    git apply docs/results/team/serial_timing.patch && python -m peagle.kernels
    python docs/results/team/loop.py 0 3
    git apply -R docs/results/team/serial_timing.patch && python -m peagle.kernels
"""
import sys, time
from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.prompts import dataset_path, read_prompt_file
text = read_prompt_file(dataset_path("mt-bench", None), "mt-bench")[0].text
k = int(sys.argv[1]); secs = float(sys.argv[2])
e = LLMEngine.from_pretrained(None, method="none" if k == 0 else "parallel", k=max(k, 1), max_num_seqs=1)
e.add_request(e.encode_prompt(text), SamplingParams(max_tokens=10 ** 7, ignore_eos=True))
for _ in range(20): e.step()
t = time.perf_counter(); n = 0
while time.perf_counter() - t < secs:
    e.step(); n += 1
print(f"K={k}: {(time.perf_counter() - t) / n * 1e3:.3f} ms a step")
