"""Why the engine left the server's process (BENCHMARKS.md §11): the same `LLMEngine.generate` on the
main thread, on a second thread with the model loaded on the main one (the old server), and with
load and generate on one non-main thread; then each thread's CPU time over one generation.

    python benchmarks/serving/threads.py main|thread|onethread     (try OMP_WAIT_POLICY=ACTIVE etc.)
"""
import os
import sys
import threading
import time

from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams


def load(res: dict) -> None:
    res["engine"] = LLMEngine.from_pretrained(None, method="none", max_num_seqs=1)


def thread_cpu() -> dict[str, float]:
    """CPU seconds of each thread of this process (utime + stime)."""
    out = {}
    for t in os.listdir(f"/proc/{os.getpid()}/task"):
        fields = open(f"/proc/{os.getpid()}/task/{t}/stat").read().rsplit(")", 1)[1].split()
        out[t] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def generate(res: dict) -> None:
    engine = res["engine"]
    ids = engine.encode_prompt("Explain speculative decoding to a new engineer in three sentences.")
    params = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
    engine.generate([ids], params)
    rates = []
    for _ in range(3):
        t = time.perf_counter()
        out = engine.generate([ids], params)[0]
        rates.append(len(out.token_ids) / (time.perf_counter() - t))
    before, t = thread_cpu(), time.perf_counter()
    engine.generate([ids], params)
    wall, after = time.perf_counter() - t, thread_cpu()
    busy = {k: round((after[k] - before.get(k, 0)) / wall, 2) for k in after if after[k] > before.get(k, 0)}
    print(f"{sys.argv[1]}: {sorted(rates)[1]:.1f} tok/s (median of 3); busy share of each thread: {busy}")


if __name__ == "__main__":
    res: dict = {}
    mode = sys.argv[1]
    if mode == "main":
        load(res)
        generate(res)
    elif mode == "thread":
        load(res)
        t = threading.Thread(target=generate, args=(res,))
        t.start()
        t.join()
    elif mode == "onethread":
        t = threading.Thread(target=lambda: (load(res), generate(res)))
        t.start()
        t.join()
    else:
        sys.exit("mode: main, thread or onethread")
