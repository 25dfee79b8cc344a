#!/bin/bash
# Recipe sweep at equal compute: 250 steps x 4 documents, 1-layer P-EAGLE head, K=8, one thread each.
cd /work/main
for spec in "lr3e-4 3e-4 8192" "lr1e-3 1e-3 8192" "lr3e-3 3e-3 8192" "v4096 1e-3 4096" "v16384 1e-3 16384"; do
  set -- $spec
  [ -f runs/sweep/$1/model.safetensors ] && continue
  PEAGLE_TORCH_THREADS=1 .venv/bin/peagle train --data data/synth/smollm2-135m-instruct --hidden runs/hidden-smollm2 \
    --out runs/sweep/$1 --method peagle --layers 1 -k 8 --draft-vocab $3 --max-steps 250 --batch-size 4 \
    --lr $2 --min-lr $(python3 -c "print($2/10)") --warmup-steps 25 --eval-every 125 --eval-docs 48 \
    --save-every 50 --log-every 25 --seed 1 --no-progress --resume > runs/sweep/$1.log 2>&1
done
