"""The GSM8K questions among the first 48 documents the training id hash holds out of the default model's data
(``--eval-docs 48``, as every run of the shipped head's lineage held out at least these), as the JSONL prompts
``peagle bench offline --dataset-name custom`` reads."""
import json

from peagle.train.data import is_eval, load_records
from peagle.train.synth import read_responses

DATA = "data/synth/smollm2-135m-instruct"
held = {r.id for r in [r for r in load_records(DATA, 2048) if is_eval(r.id, 0.02)][:48]}  # as the trainer takes them
for r in read_responses(DATA):
    if r["id"] in held and r["id"].startswith("gsm8k"):
        print(json.dumps({"prompt": r["prompt"]}))
