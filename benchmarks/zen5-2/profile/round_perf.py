"""Where a step's time goes, the production path: the engine's `step()` on MT-Bench prompt 1, `none` (K=0) or
P-EAGLE at a fixed K, 20 steps of warm-up, then `perf record` (run on core 1) over N steps of this process (pinned
to core 0: one thread). Prints ms a step and writes /tmp/perfK.data (`perf report -i ... --sort dso,symbol`).

    taskset -c 0 python benchmarks/zen5-2/profile/round_perf.py K N
"""
import os
import signal
import subprocess
import sys
import time

from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.prompts import dataset_path, read_prompt_file

text = read_prompt_file(dataset_path("mt-bench", None), "mt-bench")[0].text
k, n = int(sys.argv[1]), int(sys.argv[2])
engine = LLMEngine.from_pretrained(None, method="none" if k == 0 else "parallel", k=max(k, 1), max_num_seqs=1,
                                   quantization="gguf")
engine.add_request(engine.encode_prompt(text), SamplingParams(max_tokens=10 ** 6, ignore_eos=True))
for _ in range(20):
    engine.step()
perf = subprocess.Popen(["taskset", "-c", "1", "perf", "record", "-q", "-F", "1999", "-o", f"/tmp/perf{k}.data",
                         "-p", str(os.getpid())])
time.sleep(0.5)
t = time.perf_counter()
for _ in range(n):
    engine.step()
print(f"K={k}: {(time.perf_counter() - t) / n * 1e3:.2f} ms a step")
perf.send_signal(signal.SIGINT)
perf.wait()
