"""A held-out prompt's prefill logits through peagle's attention kernel (cut spans) against SDPA (cut off), the default
model, `--compute exact` (float32 arithmetic) and `fast` (8-bit activations): max and mean |difference|, argmax agreement.

    python benchmarks/prefill_cut/paths_diff.py
"""
import json, torch
from pathlib import Path
from peagle.engine.llm_engine import LLMEngine
from peagle.models.attention import AttnMeta, Span
from peagle.models.loader import load_target
items = [json.loads(l) for l in Path(__file__).resolve().parents[1] / "int8" / "heldout.jsonl".read_text().splitlines()]
base = LLMEngine.from_pretrained(None, method="none", max_num_seqs=1)
cut = AttnMeta.cut
for compute in ("exact", "fast"):
    t, _ = load_target(None, "float32", compute=compute)
    for i in (3, 9, 0):
        seq = base.encode_prompt(items[i]["prompt"])
        res = {}
        for v in ("kernel", "sdpa"):
            AttnMeta.cut = cut if v == "kernel" else (lambda self, rows: self)
            caches = t.make_caches(len(seq) + 8)
            pos = torch.arange(len(seq)); meta = AttnMeta([Span(len(seq), len(seq), list(range(len(seq))), 0)], 1)
            with torch.inference_mode():
                res[v], _ = t(torch.tensor(seq), pos, caches, meta)
        AttnMeta.cut = cut
        d = (res["kernel"] - res["sdpa"]).abs()
        print(compute, i + 1, len(seq), "max |diff|", f"{float(d.max()):.2e}", "mean", f"{float(d.mean()):.2e}", "argmax agree", float((res["kernel"].argmax(-1) == res["sdpa"].argmax(-1)).float().mean()))
