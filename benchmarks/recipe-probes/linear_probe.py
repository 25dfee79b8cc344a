"""How much of depth 0's answer is a linear function of what the head reads (BENCHMARKS §9)?

The target's own confidence first, then least squares from the target's taps g[a] (and/or the
embedding of the next token; or, for the cheat probe, the taps one position later) to the target's
final state at a+1 (divided by the final norm's weight), scored as the head would score it: top-1
of the target's final norm and LM head against the target's greedy token at a+1 (x[a+2]), on
held-out documents. Fitted on hidden-state shards 0-1 (512 documents), scored on the first 64 of
shard 3; every position but the first (the attention sink). A bigram table over the same
documents' responses is the floor.

usage: python linear_probe.py runs/hidden-snap /tmp/snap
"""
import collections
import sys

import torch
from safetensors.torch import load_file

from peagle.models.loader import load_target
from peagle.train.data import load_records

hidden_dir, data_dir = sys.argv[1:3]
torch.set_num_threads(1)
target, _ = load_target(None, "float32", device="cpu")
W, E = target.model.norm.weight.float(), target.model.embed_tokens.weight.float()


def rows(shard: int, limit: int | None = None):
    d = load_file(f"{hidden_dir}/hidden-{shard:05d}.safetensors")
    off = d["offsets"].tolist()
    taps, emb, y, label, nxt = [], [], [], [], []
    for i in range(len(off) - 1)[:limit]:
        lo, hi = off[i], off[i + 1]
        am = d["argmax"][lo:hi].long()
        taps.append(d["taps"][lo + 1:hi - 1].float())
        nxt.append(d["taps"][lo + 2:hi].float())      # g[a+1]: what the cheat probe's depth 0 reads
        emb.append(E[am[1:-1]])                 # x[a+1] is the target's greedy token at a (response rows)
        y.append(d["final"][lo + 2:hi].float() / W)
        label.append(am[2:])
    return torch.cat(taps), torch.cat(emb), torch.cat(y), torch.cat(label), torch.cat(nxt)


@torch.no_grad()
def top1(h: torch.Tensor, label: torch.Tensor) -> float:
    return target.logits(target.model.norm(h)).argmax(-1).eq(label).float().mean().item()


tr = [torch.cat(x) for x in zip(rows(0), rows(1))]
te = rows(3, 64)
confidence = target.logits(te[2] * W).softmax(-1).amax(-1).mean().item()
print(f"the target's own probability of its greedy token at a+1 (mean, held-out rows): {confidence:.3f}")
for name, cols in (("taps g[a]", (0,)), ("embedding of x[a+1]", (1,)), ("taps and embedding", (0, 1)),
                   ("taps g[a+1] (the cheat probe's input)", (4,))):
    X = torch.cat([tr[c] for c in cols], 1)
    sol = torch.linalg.solve(X.T @ X + 10 * torch.eye(X.shape[1]), X.T @ tr[2])
    print(f"linear from {name}: held-out top-1 {top1(torch.cat([te[c] for c in cols], 1) @ sol, te[3]):.3f}")

records = load_records(data_dir, 2048)[:1024]
big = collections.defaultdict(collections.Counter)
for r in records[:512]:
    for a, b in zip(r.ids[r.prompt_len:], r.ids[r.prompt_len + 1:]):
        big[a][b] += 1
hit = n = 0
for r in records[768:832]:
    for a, b in zip(r.ids[r.prompt_len:], r.ids[r.prompt_len + 1:]):
        hit += bool(big.get(a)) and big[a].most_common(1)[0][0] == b
        n += 1
print(f"bigram on responses: held-out top-1 {hit / n:.3f}")
