"""The trainer's held-out estimate (the first 64 documents the id hash holds out of the default model's data,
which no GPU run trained on) of each head given, on this machine: `python benchmarks/gpu4/heldout_estimate.py HEAD...`."""
import sys
import tempfile

from peagle.train.trainer import Trainer, TrainConfig

for head in sys.argv[1:]:
    with tempfile.TemporaryDirectory() as out:
        t = Trainer(TrainConfig(data="data/synth/smollm2-135m-instruct", out=out, init_from=head, eval_docs=64,
                                progress=False, device="cpu"))
        t.evaluate()
        print(head, t.dtype, t.last_eval["al"], t.last_eval["acc"], t.last_eval["anchors"], flush=True)
