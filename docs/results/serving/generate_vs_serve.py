"""One request at a time, same prompt, greedy, 256 tokens: peagle's engine in this process (what
`peagle generate` runs) against `peagle serve` with a minimal blocking client (http.client; streamed
and not), alternating, 5 rounds; the server idles (blocked on its pipe) while the engine runs here.

    python docs/results/serving/generate_vs_serve.py none|parallel
"""
import json
import statistics
import subprocess
import sys
import time
import http.client

from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams

PORT, N = 8795, 256
method = sys.argv[1]
spec = {"method": "none"} if method == "none" else {"method": "eagle3", "parallel_drafting": True}
server = subprocess.Popen([sys.executable, "-m", "peagle.cli", "serve", "--port", str(PORT), "--max-num-seqs", "1",
                           "--speculative-config", json.dumps(spec)], stderr=subprocess.DEVNULL)
engine = LLMEngine.from_pretrained(None, method=method, k="auto", max_num_seqs=1)
ids = engine.encode_prompt("Tell me a story about a cat who learns to sail.")


def post(stream: bool) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=300)
    body = {"prompt": ids, "max_tokens": N, "ignore_eos": True, "temperature": 0, "stream": stream}
    t = time.perf_counter()
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = conn.getresponse()
    while r.read(4096):
        pass
    return N / (time.perf_counter() - t)


def offline() -> float:
    t = time.perf_counter()
    engine.generate([ids], SamplingParams(max_tokens=N, ignore_eos=True))
    return N / (time.perf_counter() - t)


try:
    while True:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                break
        except OSError:
            time.sleep(0.5)
    post(False), offline()
    rates = {"generate (in-process)": [], "serve, not streamed": [], "serve, streamed": []}
    for _ in range(5):
        rates["generate (in-process)"].append(offline())
        rates["serve, not streamed"].append(post(False))
        rates["serve, streamed"].append(post(True))
    base = statistics.median(rates["generate (in-process)"])
    for name, xs in rates.items():
        m = statistics.median(xs)
        print(f"| {method} | {name} | {m:.1f} | {m / base:.3f} |")
finally:
    server.terminate()
    server.wait()
