"""OpenMP regions forked a step (libgomp's GOMP_parallel, counted by a perf uprobe): ``none`` (one row) and P-EAGLE at
K = 1 and 7 on MT-Bench prompt 1, 200 steps after 20. Needs root (perf probe):

    perf probe -x .venv/lib/python3.11/site-packages/torch/lib/libgomp.so.1 -a GOMP_parallel
    python docs/results/team/regions.py 0; python docs/results/team/regions.py 1; python docs/results/team/regions.py 7
"""
import os
import signal
import subprocess
import sys
import tempfile
import time

from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.prompts import dataset_path, read_prompt_file

k, n = int(sys.argv[1]), 200
text = read_prompt_file(dataset_path("mt-bench", None), "mt-bench")[0].text
engine = LLMEngine.from_pretrained(None, method="none" if k == 0 else "parallel", k=max(k, 1), max_num_seqs=1)
engine.add_request(engine.encode_prompt(text), SamplingParams(max_tokens=10 ** 6, ignore_eos=True))
for _ in range(20):
    engine.step()
with tempfile.NamedTemporaryFile("r") as out:
    perf = subprocess.Popen(["perf", "stat", "-x,", "-e", "probe_libgomp:GOMP_parallel", "-p", str(os.getpid()),
                             "-o", out.name])
    time.sleep(0.5)
    for _ in range(n):
        engine.step()
    perf.send_signal(signal.SIGINT)
    perf.wait()
    count = next(int(line.split(",")[0]) for line in out.read().splitlines() if "GOMP_parallel" in line)
print(f"K={k}: {count / n:.0f} regions a step")
