#!/bin/sh
# Acceptance length at K=7 of two heads on the default model, each head's drafts alone (no prompt or response
# lookup), greedy, float32, 256 tokens, 16 requests in flight (AL does not depend on the batch): MT-Bench and
# HumanEval (never trained on) and the GSM8K questions among the 48 documents every run of the shipped head's
# lineage held out (`benchmarks/gpu4/gsm8k_heldout.py`). `sh benchmarks/gpu4/al.sh HEAD_A HEAD_B OUT_DIR`
set -e
OUT=$3
mkdir -p $OUT
python benchmarks/gpu4/gsm8k_heldout.py > $OUT/gsm8k_heldout_prompts.jsonl
for head in $1 $2; do
    name=$(basename $head)
    for ds in mt-bench humaneval "custom --dataset-path $OUT/gsm8k_heldout_prompts.jsonl"; do
        PEAGLE_TORCH_THREADS=2 python -m peagle.cli bench offline --drafter $head --methods parallel -k 7 \
            --dtype float32 --prompt-lookup-max 0 --response-lookup none --dataset-name $ds --num-prompts 32 \
            --output-len 256 --max-concurrency 16 --json --disable-tqdm > $OUT/al-k7-$name-${ds%% *}.json
        python -c "import json, sys; c = json.load(open(sys.argv[1]))['cells'][0]
print(sys.argv[2], sys.argv[3], c['completed'], c['total_output_tokens'], round(c['acceptance_length'], 4))" \
            $OUT/al-k7-$name-${ds%% *}.json $name "${ds%% *}"
    done
done
