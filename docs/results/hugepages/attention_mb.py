"""The attention op alone against a given build of the kernels (a copy of peagle_kernels.so): one row, 9 query / 3 KV
heads, d 64, float16 pools, contexts 100 / 300 / 1,000, 1 and 2 threads, median of 200 calls; `cold` streams 64 MB
between calls.

    python docs/results/hugepages/attention_mb.py path/to/peagle_kernels.so warm|cold
"""
import sys, time, statistics, torch
from pathlib import Path
from peagle import kernels
kernels.LIBRARY = Path(sys.argv[1]); kernels._fingerprint = lambda: kernels.STAMP.read_text()
assert kernels.available()
torch.manual_seed(0)
H, Hkv, d, bs = 9, 3, 64, 16
flush = torch.empty(64 << 20, dtype=torch.uint8)
res = []
for threads in (1, 2):
    torch.set_num_threads(threads)
    for ctx in (100, 300, 1000):
        nb = ctx // bs + 1
        k = torch.randn(nb * bs + 1, Hkv, d).half(); v = torch.randn(nb * bs + 1, Hkv, d).half()
        table = torch.randperm(nb).view(1, -1).long()
        q = torch.randn(1, H, d); seq = torch.zeros(1, dtype=torch.long); pos = torch.tensor([ctx - 1])
        rows = torch.tensor([0])
        T = []
        for i in range(200):
            flush.add_(1) if sys.argv[2] == "cold" else None
            t = time.perf_counter(); torch.ops.peagle.attention(q, k, v, table, seq, pos, rows, bs, 0, 0.125, None, ""); T.append(time.perf_counter() - t)
        res.append(f"t{threads} ctx{ctx} {statistics.median(T)*1e6:.1f}us")
print(Path(sys.argv[1]).name, " ".join(res))
