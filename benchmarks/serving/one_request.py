"""One request, 128 tokens, greedy, EOS ignored, `none`: `peagle serve` (not streamed, HTTP included)
against the engine's `generate` in this process, interleaved, six rounds, medians.

    python benchmarks/serving/one_request.py
"""
import json, subprocess, sys, time, http.client, statistics
from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams
PROMPT = "Explain speculative decoding to a new engineer in three sentences."
port = 8765
srv = subprocess.Popen([".venv/bin/peagle", "serve", "--port", str(port)], stderr=open("/tmp/srv.err", "w"))

def ask():
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    body = {"prompt": PROMPT, "max_tokens": 128, "min_tokens": 128, "ignore_eos": True, "temperature": 0}
    t = time.perf_counter(); c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = json.loads(c.getresponse().read()); n = r["usage"]["completion_tokens"]
    return n / (time.perf_counter() - t)
for _ in range(60):
    try: ask(); break
    except Exception: time.sleep(1)
eng = LLMEngine.from_pretrained(None, method="none", max_num_seqs=1)
ids = eng.encode_prompt(PROMPT, chat=False)
def gen():
    t = time.perf_counter(); o = eng.generate([ids], SamplingParams(max_tokens=128, ignore_eos=True))[0]
    return len(o.token_ids) / (time.perf_counter() - t)
gen()
s, g = [], []
for _ in range(6):
    time.sleep(1); s.append(ask()); time.sleep(1); g.append(gen())
print(f"serve {statistics.median(s):.1f} tok/s, generate {statistics.median(g):.1f} tok/s, ratio {statistics.median(s)/statistics.median(g):.2f}")
srv.terminate(); srv.wait()
