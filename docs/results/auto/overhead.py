"""What exploring costs `auto` on short outputs: for held-out prompts (0-based indices, comma-separated), `none`,
`auto` as shipped, `nodraft` (margin 100: it drafts only at its probes) and `noprobe` (no probes either: a drafter
loaded but never run), a fresh engine a request, ROUNDS rounds interleaved, median tok/s (prefill included).

    python docs/results/auto/overhead.py 3,4,5,1 ROUNDS
"""
import json, statistics, sys, time
from pathlib import Path
from peagle.engine.llm_engine import EngineConfig, LLMEngine
from peagle.engine.sampling import SamplingParams
here = Path(__file__).resolve().parents[1] / "int8"
items = [json.loads(l) for l in (here / "heldout.jsonl").read_text().splitlines()]
base = LLMEngine.from_pretrained(None, method="parallel", k="auto", max_num_seqs=1)
params = SamplingParams(max_tokens=128)
sel = [int(x) for x in sys.argv[1].split(",")]
ids = {i: base.encode_prompt(items[i]["prompt"]) for i in sel}
def run(v, i):
    m = "none" if v == "none" else "parallel"
    cfg = EngineConfig(method=m, num_speculative_tokens="auto" if m == "parallel" else 1, max_num_seqs=1)
    e = LLMEngine(base.target, base.drafter if m == "parallel" else None, cfg, base.tokenizer)
    a = e.scheduler.auto
    if v in ("nodraft", "noprobe"):
        a.margin = 100.0
    if v == "noprobe":
        a.next_probe = 10**9
    trees = []
    nt = e.scheduler.next_tree
    def spy(work):
        t = nt(work); trees.append(len(t)); return t
    e.scheduler.next_tree = spy
    out = e.generate([ids[i]], params)[0]
    return len(out.token_ids), out.elapsed_s, trees
V = ["none", "auto", "nodraft", "noprobe"]
res = {v: {i: [] for i in sel} for v in V}
for r in range(int(sys.argv[2])):
    for i in sel:
        for v in (V if r % 2 == 0 else V[::-1]):
            n, s, trees = run(v, i)
            res[v][i].append(n / s)
            if r == 0: print(v, i, n, "trees", trees[:40], flush=True)
for i in sel:
    base_rate = statistics.median(res["none"][i])
    print(i + 1, " ".join(f"{v} {statistics.median(res[v][i]):.1f} ({statistics.median(res[v][i]) / base_rate:.3f}x)" for v in V))
