"""The fair-prefill scenario of the issue: `peagle serve` (default settings but the ones named), a
6,000-token completion request, then 1 s later a chat "Name three primary colors." with max_tokens 8.
Prints when each finished (seconds from the long request's start), and the long request alone.

    python benchmarks/fair-prefill/long_short.py [SERVE FLAGS...]   e.g. --long-prefill-token-threshold 2048
"""
import json
import subprocess
import sys
import threading
import time
import urllib.request

PORT = 8790


def post(path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def long_prompt(tokens: int) -> list[int]:
    from peagle.models.loader import load_tokenizer, resolve_target

    tok = load_tokenizer(resolve_target(None))
    text = " ".join(f"Paragraph {i}: the quick brown fox jumps over the lazy dog while the river runs to the sea."
                    for i in range(2000))
    return tok(text)["input_ids"][:tokens]


def main(flags: list[str]) -> None:
    ids = long_prompt(6000)
    proc = subprocess.Popen([sys.executable, "-m", "peagle.cli", "serve", "--port", str(PORT), *flags],
                            stderr=subprocess.DEVNULL)
    try:
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        post("/v1/completions", {"prompt": "Hello", "max_tokens": 8})  # warm
        long_body = {"prompt": ids, "max_tokens": 16, "temperature": 0, "ignore_eos": True}
        t0 = time.perf_counter()
        post("/v1/completions", long_body)
        alone = time.perf_counter() - t0
        done = {}
        t0 = time.perf_counter()
        th = threading.Thread(target=lambda: (post("/v1/completions", long_body), done.setdefault("long", time.perf_counter() - t0)))
        th.start()
        time.sleep(1.0)
        post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Name three primary colors."}],
                                      "max_tokens": 8, "temperature": 0})
        done["short"] = time.perf_counter() - t0
        th.join()
        print(json.dumps({"flags": " ".join(flags) or "(defaults)", "long_alone_s": round(alone, 2),
                          "long_s": round(done["long"], 2), "short_s": round(done["short"], 2),
                          "long_slowdown": round(done["long"] / alone, 3)}))
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main(sys.argv[1:])
