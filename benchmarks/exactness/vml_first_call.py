"""oneMKL's VML first-call race (pytorch/pytorch#188792) on the default model's RoPE table: N fresh processes
each compute the table with two torch threads as their first VML call (the cos splits at 2,048 elements, a thread
a half), without and with ``peagle.cpu.settle_vml`` before it, alternating; each table is compared with one
computed on one thread. Prints the count of wrong tables each way, and the rows and ulps of the first wrong one.

    python benchmarks/exactness/vml_first_call.py 40
"""
import json
import os
import subprocess
import sys

import torch

CHILD = """
import json, sys, torch
from peagle.cpu import settle_vml
from peagle.models.layers import Rotary
if sys.argv[1] == "settled":
    settle_vml()
torch.set_num_threads(2)
cos, sin = Rotary(64, 100000.0, None).compute(torch.arange(256), torch.float32)
torch.save((cos, sin), sys.argv[2])
"""


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    from peagle.cpu import cpuinfo
    from peagle.models.layers import Rotary
    torch.set_num_threads(1)   # the reference: the default model's head_dim and rope_theta, on one thread
    ref = Rotary(64, 100000.0, None).compute(torch.arange(256), torch.float32)
    out = f"/tmp/vml-table-{os.getpid()}.pt"
    wrong, first = {"cold": 0, "settled": 0}, {}
    for _ in range(n):
        for mode in wrong:
            subprocess.run([sys.executable, "-c", CHILD, mode, out], check=True)
            got = torch.load(out)
            bad = [(name, (g != r).flatten(1).any(1).nonzero().flatten().tolist(),
                    int((g.view(torch.int32) - r.view(torch.int32)).abs().max()))
                   for name, g, r in zip(("cos", "sin"), got, ref) if not torch.equal(g, r)]
            if bad:
                wrong[mode] += 1
                first.setdefault(mode, [(name, f"rows {rows[0]}-{rows[-1]} ({len(rows)})", f"{ulps} ulps")
                                        for name, rows, ulps in bad])
    os.unlink(out)
    print(json.dumps({"processes each": n, "wrong tables": wrong, "first wrong": first,
                      "torch": torch.__version__, "cpu": cpuinfo("model name")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
