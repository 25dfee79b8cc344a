"""The attention op alone against a given build of the kernels (a copy of peagle_kernels.so): 9 query / 3 KV heads,
d 64, float16 pools, contexts 300 and 1,000, tiles of 1, 2 and 8 rows of one sequence, in cache, the 10th
percentile of 1,500 calls (microseconds); run alternately with several builds, a fresh process each.

    python docs/results/attn-tail/attention_ab.py path/to/peagle_kernels.so THREADS
"""
import sys, time, torch
from pathlib import Path
from peagle import kernels
kernels.LIBRARY = Path(sys.argv[1]); kernels._fingerprint = lambda: kernels.STAMP.read_text()
assert kernels.available()
torch.manual_seed(0)
H, Hkv, d, bs = 9, 3, 64, 16
torch.set_num_threads(int(sys.argv[2]))
res = []
for ctx in (300, 1000):
    nb = ctx // bs + 1
    k = torch.randn(nb * bs + 1, Hkv, d).half(); v = torch.randn(nb * bs + 1, Hkv, d).half()
    table = torch.randperm(nb).view(1, -1).long()
    for R in (1, 2, 8):
        q = torch.randn(R, H, d); seq = torch.zeros(R, dtype=torch.long); pos = torch.arange(ctx - R, ctx); rows = torch.arange(R)
        T = []
        for i in range(1500):
            t = time.perf_counter(); torch.ops.peagle.attention(q, k, v, table, seq, pos, rows, bs, 0, 0.125, None, ""); T.append(time.perf_counter() - t)
        T.sort()
        res.append(f"c{ctx}R{R} {T[len(T)//10]*1e6:.1f}")
print(Path(sys.argv[1]).name, " ".join(res))
