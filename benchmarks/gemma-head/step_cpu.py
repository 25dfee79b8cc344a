"""CPU time (time.thread_time, one thread) of Gemma 3 270M steps: plain decoding of one request (1 row), and
the target's pass over R rows at a 200-token context split into layers and LM head, medians of interleaved rounds."""
import statistics, sys, time, json
import torch
from peagle.models.attention import AttnMeta
from peagle.models.loader import load_target
torch.set_num_threads(1)
rounds = int(sys.argv[1])
target, _ = load_target("gemma3")
ctx, rows = 200, (1, 2, 4, 8)
res = {r: {"layers": [], "lm_head": []} for r in rows}
with torch.inference_mode():
    caches = target.make_caches(ctx + 16)
    ids = torch.randint(0, 200000, (ctx + 8,))
    slots = torch.arange(ctx + 16)
    target.hidden(ids[:ctx], torch.arange(ctx), caches, AttnMeta.single(slots, 0, ctx))
    for i in range(rounds + 2):
        for r in rows[i % 4:] + rows[:i % 4]:
            t0 = time.thread_time()
            normed, _ = target.hidden(ids[ctx:ctx + r], torch.arange(ctx, ctx + r), caches, AttnMeta.single(slots, ctx, ctx + r))
            t1 = time.thread_time(); target.logits(normed); t2 = time.thread_time()
            if i >= 2:
                res[r]["layers"].append((t1 - t0) * 1e3); res[r]["lm_head"].append((t2 - t1) * 1e3)
out = {r: {k: round(statistics.median(v), 3) for k, v in d.items()} for r, d in res.items()}
for r, d in out.items():
    print(f"rows={r}: layers {d['layers']:.2f} ms, LM head {d['lm_head']:.2f} ms (CPU time, medians)")
print(json.dumps(out))
