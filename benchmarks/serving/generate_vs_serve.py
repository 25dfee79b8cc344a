"""One request at a time, same prompt, greedy, 256 tokens: peagle's engine in this process (what
`peagle generate` runs) against `peagle serve` with a minimal blocking client (http.client; streamed
and not; streamed again from a second server with `--stream-interval 4`), alternating, 5 rounds (or ROUNDS); the
servers idle (blocked on their pipes) while the engine runs here.

    python benchmarks/serving/generate_vs_serve.py none|parallel [ROUNDS]
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
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 5
method = sys.argv[1]
spec = {"method": "none"} if method == "none" else {"method": "eagle3", "parallel_drafting": True}
INTERVAL = 4
servers = [subprocess.Popen([sys.executable, "-m", "peagle.cli", "serve", "--port", str(port), "--max-num-seqs", "1",
                             "--speculative-config", json.dumps(spec), "--stream-interval", str(interval)],
                            stderr=subprocess.DEVNULL) for port, interval in ((PORT, 1), (PORT + 1, INTERVAL))]
engine = LLMEngine.from_pretrained(None, method=method, k="auto", max_num_seqs=1)
ids = engine.encode_prompt("Tell me a story about a cat who learns to sail.")


def post(stream: bool, port: int = PORT) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
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
    for port in (PORT, PORT + 1):
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    break
            except OSError:
                time.sleep(0.5)
    post(False), post(True, PORT + 1), offline()
    streamed_n = f"serve, streamed, `--stream-interval {INTERVAL}`"
    rates = {"generate (in-process)": [], "serve, not streamed": [], "serve, streamed": [], streamed_n: []}
    for _ in range(ROUNDS):
        rates["generate (in-process)"].append(offline())
        rates["serve, not streamed"].append(post(False))
        rates["serve, streamed"].append(post(True))
        rates[streamed_n].append(post(True, PORT + 1))
    base = statistics.median(rates["generate (in-process)"])
    for name, xs in rates.items():
        m = statistics.median(xs)
        print(f"| {method} | {name} | {m:.1f} | {m / base:.3f} |")
finally:
    for server in servers:
        server.terminate()
        server.wait()
