"""One thread: CPU time of the calling thread; two threads: wall time. One thread: CPU time of the calling thread (time.thread_time: a shared machine's descheduled periods left out; one
thread, so the kernel runs on it). The Gemma 3 270M LM head alone (262,144 x 640 Q8_0, packed, integer path): ms per call by rows, rows
interleaved (each round visits every row count, in rotating order), median and min over rounds; the weights
stream from memory each call (170 MB, far beyond any cache)."""
import json, statistics, sys, time
import torch
from peagle.models.layers import linear
from peagle.models.loader import load_target
from peagle.engine.sampling import greedy

threads, rounds = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(threads)
target, _ = load_target("gemma3")
w = target.head_weight()
rows = [1, 2, 4, 8]
xs = {r: torch.randn(r, 640) * 3 for r in rows}
t = {r: [] for r in rows}
am = {r: [] for r in rows}
with torch.inference_mode():
    for i in range(rounds + 2):
        order = rows[i % 4:] + rows[:i % 4]
        for r in order:
            clock = time.thread_time if threads == 1 else time.perf_counter
            t0 = clock(); y = linear(xs[r], w); t1 = clock(); greedy(y); t2 = clock()
            if i >= 2:
                t[r].append((t1 - t0) * 1e3); am[r].append((t2 - t1) * 1e3)
res = {r: {"median_ms": statistics.median(t[r]), "min_ms": min(t[r]), "argmax_median_ms": statistics.median(am[r])} for r in rows}
for r in rows:
    print(f"threads={threads} rows={r}: LM head median {res[r]['median_ms']:.2f} ms, min {res[r]['min_ms']:.2f} ms "
          f"({res[r]['median_ms']/r:.2f} ms a row); argmax {res[r]['argmax_median_ms']:.3f} ms; "
          f"{170e-3*1e3/res[r]['min_ms']:.1f} GB/s at the min")
print(json.dumps({"threads": threads, "rounds": rounds, "results": res}))
