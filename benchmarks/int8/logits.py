"""peagle's logits against llama.cpp's on the shipped file, over the 40 first MT-Bench questions (chat
template; every prompt position's logits, teacher-forced): `--compute fast` (8-bit activations, as
llama.cpp) and `--compute exact` (float32 arithmetic on the same blocks). Top-1 agreement over all
positions, the largest and the mean absolute logit difference (logits span about +-35).

    python benchmarks/int8/logits.py [PROMPTS]      # needs llama-cpp-python (LLAMA_CPP_LIB_PATH)
"""
import sys

import numpy as np
import torch
from llama_cpp import Llama

from peagle.models.attention import AttnMeta
from peagle.models.loader import default_gguf, load_target, load_tokenizer
from peagle.prompts import dataset_path, encode, read_prompt_file

n_prompts = int(sys.argv[1]) if len(sys.argv) > 1 else 40
models = {c: load_target(None, "float32", compute=c) for c in ("fast", "exact")}
tok = load_tokenizer(models["fast"][1])
prompts = read_prompt_file(dataset_path("mt-bench", None), "mt-bench")[:n_prompts]
ids = [encode(tok, [{"role": "user", "content": p.text}], True) for p in prompts]
llm = Llama(model_path=str(default_gguf()), logits_all=True, n_ctx=1024, n_threads=2, n_threads_batch=2, verbose=False)


def peagle_logits(model, x):
    pos = torch.arange(len(x))
    with torch.inference_mode():
        return model(torch.tensor(x), pos, model.make_caches(len(x)), AttnMeta.single(pos, 0, len(x)))[0]


stats = {c: {"agree": 0, "n": 0, "max": 0.0, "sum": 0.0} for c in models}
for x in ids:
    llm.reset()
    llm.eval(x)
    ref = torch.from_numpy(np.array(llm.scores[:len(x)], dtype=np.float32))
    for c, (model, _) in models.items():
        got = peagle_logits(model, x)
        s = stats[c]
        s["agree"] += int((got.argmax(-1) == ref.argmax(-1)).sum())
        s["n"] += len(x)
        s["max"] = max(s["max"], float((got - ref).abs().max()))
        s["sum"] += float((got - ref).abs().mean()) * len(x)
print(f"{len(ids)} MT-Bench prompts, {stats['fast']['n']} positions\n")
print("| peagle | top-1 agreement with llama.cpp | max abs difference | mean abs difference |\n|---|---|---|---|")
for c, (model, _) in models.items():
    s = stats[c]
    print(f"| `--compute {c}` ({model.precision}) | {100 * s['agree'] / s['n']:.1f}% | {s['max']:.2f} | "
          f"{s['sum'] / s['n']:.3f} |")
