"""Compare same_tokens.py's outputs: OLD.json NEW.json [...] (pairs in order): tokens equal per prompt and
method, and the decode rates side by side.

    python docs/results/refactor/compare.py old1.json new1.json old2.json new2.json
"""
import json
import statistics
import sys

runs = [json.load(open(p)) for p in sys.argv[1:]]
old, new = runs[0::2], runs[1::2]
print("| method | prompts with the same tokens | old tok/s (median of runs) | new tok/s | new / old |\n|---|---|---|---|---|")
for m in ("none", "parallel"):
    same = sum(a == b for a, b in zip(old[0][m]["tokens"], new[0][m]["tokens"]))
    o, n = statistics.median(r[m]["rate"] for r in old), statistics.median(r[m]["rate"] for r in new)
    print(f"| {m} | {same}/{len(old[0][m]['tokens'])} | {o:.1f} | {n:.1f} | {n / o:.3f}x |")
