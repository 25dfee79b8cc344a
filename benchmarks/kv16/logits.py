"""What the 16-bit KV cache costs in accuracy: the shipped file's logits at every position of the 40 first
MT-Bench questions (chat template, teacher-forced, prompts in chunks of 48 rows so every chunk reads the earlier
ones' keys and values from the pools, as decoding does), `--compute fast` with float32 and with float16 pools,
against `--compute exact` with float32 pools (the de-quantized model's arithmetic). Top-1 agreement, the largest
and the mean absolute logit difference (logits span about +-35).

    python benchmarks/kv16/logits.py [PROMPTS] [TARGET]      # TARGET: the default model, or e.g. gemma3
"""
import sys

import torch

from peagle.models.attention import AttnMeta, Span
from peagle.models.loader import load_target, load_tokenizer
from peagle.prompts import dataset_path, encode, read_prompt_file

n_prompts = int(sys.argv[1]) if len(sys.argv) > 1 else 40
target = sys.argv[2] if len(sys.argv) > 2 else None
CHUNK, BS = 48, 16
fast, path = load_target(target, "float32", compute="fast")
exact, _ = load_target(target, "float32", compute="exact")
tok = load_tokenizer(path)
prompts = read_prompt_file(dataset_path("mt-bench", None), "mt-bench")[:n_prompts]
ids = [encode(tok, [{"role": "user", "content": p.text}], True) for p in prompts]


def logits(model, x, kv_dtype):
    caches = model.make_caches(-(-len(x) // BS) * BS, kv_dtype)
    table = list(range(-(-len(x) // BS)))
    out = []
    with torch.inference_mode():
        for s in range(0, len(x), CHUNK):
            e = min(s + CHUNK, len(x))
            meta = AttnMeta([Span(e - s, e, table, s)], BS)
            out.append(model(torch.tensor(x[s:e]), torch.arange(s, e), caches, meta)[0])
    return torch.cat(out)


runs = {"fast, float32 KV": (fast, torch.float32), "fast, float16 KV (the default)": (fast, torch.float16),
        "exact, float16 KV": (exact, torch.float16)}
stats = {name: {"agree": 0, "n": 0, "max": 0.0, "sum": 0.0} for name in runs}
for x in ids:
    ref = logits(exact, x, torch.float32)
    for name, (model, kv) in runs.items():
        got, s = logits(model, x, kv), stats[name]
        s["agree"] += int((got.argmax(-1) == ref.argmax(-1)).sum())
        s["n"] += len(x)
        s["max"] = max(s["max"], float((got - ref).abs().max()))
        s["sum"] += float((got - ref).abs().mean()) * len(x)
print(f"{target or 'the default model'}: {len(ids)} MT-Bench prompts, {stats[next(iter(runs))]['n']} positions, "
      "against `--compute exact` with float32 KV\n")
print("| peagle | top-1 agreement | max abs difference | mean abs difference |\n|---|---|---|---|")
for name, s in stats.items():
    print(f"| {name} | {100 * s['agree'] / s['n']:.1f}% | {s['max']:.2f} | {s['sum'] / s['n']:.3f} |")
