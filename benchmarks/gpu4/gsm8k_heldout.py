"""The GSM8K questions among the first 48 documents the training id hash holds out of the default model's data
(``--eval-docs 48``, as every run of the shipped head's lineage held out at least these), as the JSONL prompts
``peagle bench offline --dataset-name custom`` reads."""
import json

from peagle.train.data import is_eval
from peagle.train.synth import read_responses

held = [r for r in read_responses("data/synth/smollm2-135m-instruct") if is_eval(r["id"], 0.02)
        and len(r["response_token_ids"]) >= 3][:48]
for r in held:
    if r["id"].startswith("gsm8k"):
        print(json.dumps({"prompt": r["prompt"]}))
