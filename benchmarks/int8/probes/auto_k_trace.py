import json, time, statistics
from pathlib import Path
from peagle.engine.llm_engine import EngineConfig, LLMEngine
from peagle.engine.sampling import SamplingParams
items = [json.loads(l) for l in Path("benchmarks/int8/heldout.jsonl").read_text().splitlines()]
base = LLMEngine.from_pretrained(None, method="parallel", k="auto", max_num_seqs=1)
for idx in (0, 4, 10):
    ids = base.encode_prompt(items[idx]["prompt"])
    res = {}
    for rep in range(3):
      for method in ("none", "parallel"):
        e = LLMEngine(base.target, base.drafter if method == "parallel" else None,
                      EngineConfig(method=method, num_speculative_tokens="auto" if method == "parallel" else 1, max_num_seqs=1), base.tokenizer)
        seq = e.add_request(ids, SamplingParams(max_tokens=128))
        trace = []
        while e.has_unfinished():
            k = len(seq.drafts); t = time.perf_counter(); e.step(); trace.append((k, time.perf_counter() - t))
        res.setdefault(method, []).append(trace)
    for method, traces in res.items():
        tot = statistics.median(sum(t for _, t in tr) for tr in traces) * 1e3
        first = statistics.median(tr[0][1] for tr in traces) * 1e3
        spec = statistics.median(sum(t for k, t in tr if k) for tr in traces) * 1e3
        nspec = statistics.median(sum(1 for k, t in tr if k) for tr in traces)
        plain = statistics.median(statistics.median(t for k, t in tr[1:] if not k) for tr in traces) * 1e3
        print(idx, method, f"total {tot:.1f} ms, steps {len(traces[0])}, first {first:.1f}, verify steps {nspec} taking {spec:.1f} ms, plain step median {plain:.2f}")
