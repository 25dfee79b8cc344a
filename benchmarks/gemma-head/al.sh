#!/bin/sh
# AL of the shipped Gemma 3 270M head at K = 3, 5, 7 (greedy, plain-text prompts, 128 tokens, 4 requests in
# flight: AL does not depend on the batch, the kernels being batch-invariant); MT-Bench first turns and the 100
# GSM8K train questions left out of training (the file's last 100 rows; training read the first 7,373:
# `head -n 7373 data/prompts/gsm8k_train.jsonl > runs/gemma/prompts/gsm8k_train.jsonl`).
set -e
OUT=docs/results/gemma-head
mkdir -p runs/gemma/prompts
tail -n 100 data/prompts/gsm8k_train.jsonl | python -c "import json, sys
for l in sys.stdin: print(json.dumps({'prompt': json.loads(l)['question']}))" > runs/gemma/prompts/gsm8k_heldout_prompts.jsonl
nice -n 19 env PEAGLE_TORCH_THREADS=1 python -m peagle.cli bench offline --target gemma3 --methods parallel -k 3,5,7 \
    --dataset-name mt-bench --skip-chat-template --num-prompts 32 --output-len 128 --max-concurrency 4 --json \
    --disable-tqdm > $OUT/al_mt_bench.json
nice -n 19 env PEAGLE_TORCH_THREADS=1 python -m peagle.cli bench offline --target gemma3 --methods parallel -k 3,5,7 \
    --dataset-name custom --dataset-path runs/gemma/prompts/gsm8k_heldout_prompts.jsonl --skip-chat-template \
    --num-prompts 32 --output-len 128 --max-concurrency 4 --json --disable-tqdm > $OUT/al_gsm8k_heldout.json
