#!/bin/bash
# Soft against hard labels at equal compute: 250 steps x 4 documents, 1-layer P-EAGLE head, K=8,
# lr 1e-3 (the recipe sweep's best), one thread each, side by side. Data: the first two committed
# shards (2,958 documents); hidden states (bf16 target) of their first 1,024 documents (four shards
# of 256; `peagle hidden` was stopped there); 5% of those held out by id hash (39 documents).
cd /work/main
mkdir -p /tmp/snap runs/labels
cp data/synth/smollm2-135m-instruct/responses-0000[01].jsonl.gz /tmp/snap/
.venv/bin/peagle hidden --data /tmp/snap --out runs/hidden-snap &
until [ -f runs/hidden-snap/hidden-00003.safetensors ]; do sleep 10; done
kill %1; wait
for labels in soft hard; do
  PEAGLE_TORCH_THREADS=1 .venv/bin/peagle train --data /tmp/snap --hidden runs/hidden-snap \
    --out runs/labels/$labels --method peagle --layers 1 -k 8 --labels $labels --max-steps 250 --batch-size 4 \
    --lr 1e-3 --min-lr 1e-4 --warmup-steps 25 --eval-every 125 --eval-docs 64 --eval-fraction 0.05 \
    --save-every 50 --log-every 25 --seed 1 --no-progress --resume > runs/labels/$labels.log 2>&1 &
done
wait
cp runs/labels/soft/train_log.jsonl docs/results/labels/soft.jsonl
cp runs/labels/hard/train_log.jsonl docs/results/labels/hard.jsonl
# A 2-layer head on the same data and schedule (soft labels), for the layers curve at equal tokens
PEAGLE_TORCH_THREADS=1 .venv/bin/peagle train --data /tmp/snap --hidden runs/hidden-snap \
  --out runs/labels/soft-2layers --method peagle --layers 2 -k 8 --labels soft --max-steps 250 --batch-size 4 \
  --lr 1e-3 --min-lr 1e-4 --warmup-steps 25 --eval-every 125 --eval-docs 64 --eval-fraction 0.05 \
  --save-every 50 --log-every 25 --seed 1 --no-progress --resume > runs/labels/soft-2layers.log 2>&1
cp runs/labels/soft-2layers/train_log.jsonl docs/results/labels/soft-2layers.jsonl
