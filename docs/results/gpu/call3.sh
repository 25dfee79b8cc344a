#!/bin/bash
# A lent GPU, third call, while the machine is warm (from the repo root, carry .dev3: a head to start from,
# e.g. `cp -r peagle/heads/SmolLM2-135M-Instruct .dev3/head`): two continuations of that head trained at once
# (a step is bound by launching kernels, so two processes share the GPU well), learning rates LRS, on call2.sh's
# model and data for BUDGET seconds (what the lease has left, less a margin): a 20-step probe of both sizes the
# runs; each is exported compact in float16, in parts under $OUT. `BUDGET=540 bash docs/results/gpu/call3.sh`.
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PEAGLE_NATIVE=0 OMP_NUM_THREADS=4
START=$(date +%s); BUDGET=${BUDGET:-530}; LRS=${LRS:-"3e-4 8e-4"}; BATCH=${BATCH:-32}
export PYTHONPATH=/tmp/site:$PWD
G=/tmp/model.gguf
INIT=${INIT:-.dev3/head}
train() {  # lr, out, extra flags
    timeout ${TMO:-100000} python3 docs/results/gpu/cli_lite.py train --target $G --data /tmp/synth --method peagle --layers 1 -k 8 \
        --batch-size $BATCH --micro-tokens 4096 --max-elements 16384 --lr $1 --min-lr $(python3 -c "print($1/10)") \
        --warmup-steps 20 --eval-docs 64 --seed 4 --no-progress --init-from $INIT --out $2 "${@:3}"
}
for lr in $LRS; do
    (train $lr /tmp/probe-$lr --max-steps 20 --log-every 5 --eval-every 1000 --save-every 1000 --eval-docs 4 > /tmp/probe-$lr.log 2>&1) &
done
wait
SPS=$(python3 -c "
import json
r=[json.loads(l) for l in open('/tmp/probe-${LRS%% *}/train_log.jsonl') if '\"loss\"' in l]
print((r[-1]['elapsed_s']-r[0]['elapsed_s'])/(r[-1]['step']-r[0]['step']))")
[ -n "$SPS" ] || { tail /tmp/probe-*.log; echo "the probe failed"; exit 1; }
LEFT=$((BUDGET - $(date +%s) + START - 75))   # 75 s: start-up, the last evaluation, export
STEPS=$(python3 -c "print(max(40, int($LEFT / ($SPS * 1.08))))")
echo "probe, two at once: $SPS s a step; $LEFT s left: $STEPS steps each"
for lr in $LRS; do
    (TMO=$((LEFT + 30)) train $lr /tmp/head-$lr --max-steps $STEPS --log-every 20 --eval-every 100000 \
        --save-every 100 > $OUT/train-$lr.log 2>&1; cp /tmp/head-$lr/train_log.jsonl $OUT/train_log-$lr.jsonl) &
done
wait
for lr in $LRS; do
    tail -1 $OUT/train-$lr.log | cut -c1-250
    python3 docs/results/gpu/cli_lite.py export --target $G --drafter /tmp/head-$lr --out /tmp/compact-$lr --compact \
        --dtype float16 2>&1 | tail -1
    split -b 15M /tmp/compact-$lr/model.safetensors $OUT/head-$lr.safetensors.part-
    cp /tmp/compact-$lr/config.json $OUT/head-$lr.config.json
done
