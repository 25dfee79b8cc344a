"""The residual stream the head's fc reads (BENCHMARKS §9, the `precond` probe): per tap, the
largest |value| of each dimension at the first position (the attention sink) and elsewhere, and the
median over dimensions of the per-dimension standard deviation; 20 synthesized documents, float32.

usage: python tap_stats.py   (from the repository root)
"""
import torch

from peagle.models.loader import load_target
from peagle.train.data import load_records, target_view

target, _ = load_target(None, "float32", device="cpu")
records = load_records("data/synth/smollm2-135m-instruct", 2048)[:20]
with torch.no_grad():
    views = [target_view(target, r.ids)[0] for r in records]
sink = torch.stack([v[0] for v in views])
rest = torch.cat([v[1:] for v in views])
hidden = target.cfg.hidden_size
for i in range(sink.shape[1] // hidden):
    cols = slice(i * hidden, (i + 1) * hidden)
    s_max, s_dim = sink[:, cols].abs().max(0).values.max(0)
    r_max, r_dim = rest[:, cols].abs().max(0).values.max(0)
    print(f"tap {i}: largest |value| at the sink {s_max:.0f} (dim {s_dim}), elsewhere {r_max:.0f} (dim {r_dim}); "
          f"median per-dimension std elsewhere {rest[:, cols].std(0).median():.2f}")
