"""Held-out estimated AL of a trained head before any step, by the trainer's own evaluation (the
same 48 held-out documents and code as the continuation runs' `eval` events; BENCHMARKS §9).

usage: python eval_head.py HEAD_DIR OUT_DIR   (writes OUT_DIR/train_log.jsonl, prints the figures)
"""
import sys

from peagle.train.trainer import TrainConfig, Trainer

cfg = TrainConfig(data="data/synth/smollm2-135m-instruct", out=sys.argv[2], k=8, batch_size=1, eval_docs=48,
                  seed=2, init_from=sys.argv[1], progress=False)
trainer = Trainer(cfg)
trainer.evaluate()
print(trainer.last_eval)
